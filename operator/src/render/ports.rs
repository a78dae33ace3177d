//! The ports of the sidecars and helpers, and their names: the containers
//! declare them, kubelet probes them, the metrics Service and PodMonitor
//! address them. One place, so two containers of a pod never collide.
//!
//! The numbers below are the defaults (`spec.sidecars.portBase` unset);
//! every use goes through [`shifted`], which moves them all by the same
//! amount when a base is set.

/// Port of the liveness-probe sidecar; declared on the driver container
/// (named [`HEALTHZ_PORT_NAME`]) because kubelet probes the driver's health
/// through it.
pub const HEALTHZ_PORT: i32 = 9808;
/// Name of [`HEALTHZ_PORT`] on the driver container.
pub const HEALTHZ_PORT_NAME: &str = "healthz";
/// HTTP endpoint (metrics, healthz) of the provisioner in controller pods.
pub const PROVISIONER_HTTP_PORT: i32 = 9809;
/// HTTP endpoint (metrics, healthz) of the provisioner in node pods
/// (topology NodeLocal): the registrar has 9809 there, and the pod's
/// containers share one network namespace.
pub const NODE_PROVISIONER_HTTP_PORT: i32 = 9815;
/// HTTP endpoint (metrics, healthz) of the attacher in controller pods.
pub const ATTACHER_HTTP_PORT: i32 = 9810;
/// HTTP endpoint (metrics, leader-election health) of the resizer helper.
pub const RESIZER_HTTP_PORT: i32 = 9811;
/// HTTP endpoint of the snapshotter helper.
pub const SNAPSHOTTER_HTTP_PORT: i32 = 9812;
/// HTTP endpoint of the health-monitor helper.
pub const HEALTH_MONITOR_HTTP_PORT: i32 = 9813;

/// HTTP endpoint of the registrar in node pods; kubelet probes its `/healthz`.
pub const REGISTRAR_HTTP_PORT: i32 = 9809;
/// Name of [`REGISTRAR_HTTP_PORT`] on the registrar container.
pub const REGISTRAR_PORT_NAME: &str = "registrar-http";

/// Name of the provisioner's metrics port (PodMonitor and Service address
/// ports by name: a named port exists only in the pods that run it).
pub const PROVISIONER_PORT_NAME: &str = "provisioner";
/// Name of the attacher's metrics port.
pub const ATTACHER_PORT_NAME: &str = "attacher";
/// Service port of the registrar. The registrar listens on 9809 like the
/// provisioner, in other pods; one Service needs distinct port numbers,
/// and the Service is headless, so this number is never dialled.
pub const REGISTRAR_SERVICE_PORT: i32 = 9814;

/// [`HEALTHZ_PORT`], the first of the default ports.
pub const DEFAULT_BASE: i32 = HEALTHZ_PORT;

/// Port `default` (one of the constants here) under `base`
/// (`spec.sidecars.portBase`, unset: [`DEFAULT_BASE`]).
pub fn shifted(default: i32, base: Option<i32>) -> i32 {
    default - DEFAULT_BASE + base.unwrap_or(DEFAULT_BASE)
}

/// Every port a csiops container listens on (defaults), with whose it is: a
/// driver's own ports must keep off them (they share the pod's network
/// namespace).
pub const ALL: &[(i32, &str)] = &[
    (HEALTHZ_PORT, "the liveness probe"),
    (
        PROVISIONER_HTTP_PORT,
        "the provisioner (the registrar in node pods)",
    ),
    (ATTACHER_HTTP_PORT, "the attacher"),
    (RESIZER_HTTP_PORT, "the resizer"),
    (SNAPSHOTTER_HTTP_PORT, "the snapshotter"),
    (HEALTH_MONITOR_HTTP_PORT, "the health monitor"),
    (
        REGISTRAR_SERVICE_PORT,
        "the metrics Service's registrar port",
    ),
    (NODE_PROVISIONER_HTTP_PORT, "the node-local provisioner"),
];

/// Every port name csiops gives its containers.
pub const NAMES: &[&str] = &[
    HEALTHZ_PORT_NAME,
    REGISTRAR_PORT_NAME,
    PROVISIONER_PORT_NAME,
    ATTACHER_PORT_NAME,
];
