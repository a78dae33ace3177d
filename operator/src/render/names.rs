//! Names of the objects rendered for one `CSIDriverDeployment`.
//!
//! The reconciler uses the same functions to find, wait for and delete the
//! objects, so a name is defined in exactly one place.

use csiops_crds::CSIDriverDeployment;

/// Longest StatefulSet name whose pods can be created: the StatefulSet
/// controller writes `controller-revision-hash=<name>-<hash>` (hash up to 10
/// characters) onto every pod, and label values are limited to 63 characters.
pub const MAX_STATEFULSET_NAME_LEN: usize = 52;
/// Suffix of the controller StatefulSet and its ServiceAccount.
pub const CONTROLLER_SUFFIX: &str = "-controller";
/// Suffix of the node DaemonSet and its ServiceAccount.
pub const NODE_SUFFIX: &str = "-node";
/// Longest `CSIDriverDeployment` name that still fits [`MAX_STATEFULSET_NAME_LEN`].
pub const MAX_CR_NAME_LEN: usize = MAX_STATEFULSET_NAME_LEN - CONTROLLER_SUFFIX.len();

/// API group of the marker resource of the shipped admission policies
/// (`crate::policy`).
pub const MARKER_GROUP: &str = "csiops.dev";
/// The virtual resource whose verbs mark node-scoped accounts (no such
/// resource is served; RBAC and the authorizer do not need one).
pub const MARKER_RESOURCE: &str = "nodescope";
/// Held by the registrar role: "my Node and CSINode writes are limited to my node".
pub const OWN_NODE_VERB: &str = "own-node";
/// Held by no shipped role: exempts an account that also holds [`OWN_NODE_VERB`].
pub const ANY_NODE_VERB: &str = "any-node";

/// Container running the vendor's CSI driver (controller and node pods).
pub const CONTAINER_DRIVER: &str = "csi-driver";
/// Provisioner sidecar container (controller pods).
pub const CONTAINER_PROVISIONER: &str = "csi-provisioner";
/// Attacher sidecar container (controller pods).
pub const CONTAINER_ATTACHER: &str = "csi-attacher";
/// Registrar sidecar container (node pods).
pub const CONTAINER_REGISTRAR: &str = "node-driver-registrar";
/// Liveness-probe sidecar container (controller and node pods).
pub const CONTAINER_LIVENESS_PROBE: &str = "liveness-probe";
/// Upstream external-resizer helper container (controller pods).
pub const CONTAINER_RESIZER: &str = "csi-resizer";
/// Upstream external-snapshotter helper container (controller pods).
pub const CONTAINER_SNAPSHOTTER: &str = "csi-snapshotter";
/// Upstream external-health-monitor controller container (controller pods).
pub const CONTAINER_HEALTH_MONITOR: &str = "csi-external-health-monitor-controller";

/// Every container name the operator renders, with what it is; names of
/// `spec.sidecars.extra` containers must avoid all of them (in either pod,
/// so moving a container between pods never creates a clash).
pub const MANAGED_CONTAINERS: &[(&str, &str)] = &[
    (CONTAINER_DRIVER, "the CSI driver"),
    (CONTAINER_PROVISIONER, "the provisioner sidecar"),
    (CONTAINER_ATTACHER, "the attacher sidecar"),
    (CONTAINER_REGISTRAR, "the registrar sidecar"),
    (CONTAINER_LIVENESS_PROBE, "the liveness-probe sidecar"),
    (CONTAINER_RESIZER, "the resizer helper"),
    (CONTAINER_SNAPSHOTTER, "the snapshotter helper"),
    (CONTAINER_HEALTH_MONITOR, "the health-monitor helper"),
];

/// Volume holding the CSI socket, mounted at [`SOCKET_DIR_MOUNT`].
pub const VOLUME_SOCKET_DIR: &str = "socket-dir";
/// Node-only: kubelet's plugin registration directory (registrar only).
pub const VOLUME_REGISTRATION_DIR: &str = "registration-dir";
/// Node-only: kubelet's root directory (driver only, bidirectional).
pub const VOLUME_KUBELET_DIR: &str = "kubelet-dir";
/// The projected ServiceAccount token, CA and namespace, mounted only into
/// the containers that call the API (see `render::api_access`).
pub const VOLUME_API_ACCESS: &str = "kube-api-access";
/// Where every container sees the socket directory.
pub const SOCKET_DIR_MOUNT: &str = "/csi";
/// Where the registrar sees kubelet's plugin registration directory.
pub const REGISTRATION_DIR_MOUNT: &str = "/registration";

fn cr_name(obj: &CSIDriverDeployment) -> &str {
    obj.metadata.name.as_deref().unwrap_or_default()
}

/// `<cr-name>-controller`: the controller StatefulSet and its ServiceAccount.
pub fn controller_name(obj: &CSIDriverDeployment) -> String {
    format!("{}{CONTROLLER_SUFFIX}", cr_name(obj))
}

/// `<cr-name>-node`: the node DaemonSet and its ServiceAccount.
pub fn node_name(obj: &CSIDriverDeployment) -> String {
    format!("{}{NODE_SUFFIX}", cr_name(obj))
}

/// `<cr-name>-metrics`: the metrics Service and PodMonitor
/// (`spec.monitoring`).
pub fn metrics_name(obj: &CSIDriverDeployment) -> String {
    metrics_name_of(cr_name(obj))
}

/// [`metrics_name`] of the object named `cr_name`.
pub fn metrics_name_of(cr_name: &str) -> String {
    format!("{cr_name}-metrics")
}

/// `<cr-name>-<role>`: the RoleBinding, in the CR's namespace, of the
/// shipped namespaced role `csiops:<role>` (leases, the journal, capacity).
pub fn role_binding_name(obj: &CSIDriverDeployment, role: &str) -> String {
    format!("{}-{role}", cr_name(obj))
}

/// `csiops:<driverName>:<role>`: the ClusterRoleBinding of the shipped
/// cluster-wide role `csiops:<role>` to the driver's ServiceAccounts.
///
/// Keyed by driver name, not CR name, because cluster-scoped objects are
/// shared by the whole cluster and one driver name has one owner.
pub fn cluster_role_binding_name(obj: &CSIDriverDeployment, role: &str) -> String {
    format!("csiops:{}:{role}", obj.spec.driver_name)
}

/// The `CSIDriver` object is named after the driver, as Kubernetes requires.
pub fn csi_driver_name(obj: &CSIDriverDeployment) -> String {
    obj.spec.driver_name.clone()
}

/// The shipped ClusterRole of Secret reads (`rbac::SECRET_READER_ROLE`),
/// which the operator's fence (`crate::policy`) lets it bind by a
/// label-owned RoleBinding in another namespace.
pub const SECRET_READER_ROLE_NAME: &str = "csiops:secret-reader";
