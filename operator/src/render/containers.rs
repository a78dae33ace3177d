//! The containers of controller and node pods.
//!
//! Every container talks to the driver over the socket in the `socket-dir`
//! volume mounted at `/csi`; the flags that wire this (and leader election,
//! HTTP endpoints, registration paths) are set here and refused in
//! `extraArgs`, so a user cannot silently break the wiring.

use csiops_crds::{ControllerKind, DriverOverride, ExtraContainer, HelperSpec, SidecarSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Probe, SecurityContext, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::error::RenderError;
use super::names::{
    CONTAINER_ATTACHER, CONTAINER_DRIVER, CONTAINER_HEALTH_MONITOR, CONTAINER_LIVENESS_PROBE,
    CONTAINER_PROVISIONER, CONTAINER_REGISTRAR, CONTAINER_RESIZER, CONTAINER_SNAPSHOTTER,
    REGISTRATION_DIR_MOUNT, SOCKET_DIR_MOUNT, VOLUME_REGISTRATION_DIR, VOLUME_SOCKET_DIR,
};
use super::ports::{
    ATTACHER_HTTP_PORT, ATTACHER_PORT_NAME, HEALTHZ_PORT, HEALTHZ_PORT_NAME,
    HEALTH_MONITOR_HTTP_PORT, NODE_PROVISIONER_HTTP_PORT, PROVISIONER_HTTP_PORT,
    PROVISIONER_PORT_NAME, REGISTRAR_HTTP_PORT, REGISTRAR_PORT_NAME, RESIZER_HTTP_PORT,
    SNAPSHOTTER_HTTP_PORT,
};
use super::{monitoring, sizing};
use super::{none_if_empty, Ctx};

/// Default image of the resizer helper. The tags are those upstream
/// csi-driver-host-path deploys for Kubernetes 1.34 and 1.35
/// (`deploy/kubernetes-1.34`, which `kubernetes-1.35` links to).
pub const DEFAULT_RESIZER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-resizer:v2.2.1";
/// Default image of the snapshotter helper.
pub const DEFAULT_SNAPSHOTTER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-snapshotter:v8.6.0";
/// Default image of the health-monitor helper.
pub const DEFAULT_HEALTH_MONITOR_IMAGE: &str =
    "registry.k8s.io/sig-storage/csi-external-health-monitor-controller:v0.18.0";

/// Env var holding the CSI endpoint in every driver container.
pub const ENV_CSI_ENDPOINT: &str = "CSI_ENDPOINT";
/// Env var holding the node name in every driver container.
pub const ENV_KUBE_NODE_NAME: &str = "KUBE_NODE_NAME";

/// Merges env layers: a later variable with the same name replaces the
/// earlier one in place (keeping its position, which matters for `$(VAR)`
/// references), so the result never contains a name twice.
/// Env var of the bundled sidecars holding `spec.driverName` (the
/// sidecars' `common::driver::EXPECTED_NAME_ENV`).
pub const ENV_EXPECTED_DRIVER_NAME: &str = "CSIOPS_DRIVER_NAME";

pub(crate) fn merge_env(layers: &[&[EnvVar]]) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = Vec::new();
    for var in layers.iter().flat_map(|layer| layer.iter()) {
        match out.iter_mut().find(|existing| existing.name == var.name) {
            Some(existing) => *existing = var.clone(),
            None => out.push(var.clone()),
        }
    }
    out
}

/// An env var taken from the pod's own object (downward API).
fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".to_string()),
                field_path: field_path.to_string(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `socket-dir` at `/csi`, mounted in every container that speaks CSI.
pub(crate) fn socket_dir_mount() -> VolumeMount {
    VolumeMount {
        name: VOLUME_SOCKET_DIR.to_string(),
        mount_path: SOCKET_DIR_MOUNT.to_string(),
        ..Default::default()
    }
}

/// `scheme`: HTTPS when the sidecar behind `port` serves `--metrics-auth`.
fn http_get(path: &str, port: IntOrString, scheme: Option<String>) -> Option<HTTPGetAction> {
    Some(HTTPGetAction {
        path: Some(path.to_string()),
        port,
        scheme,
        ..Default::default()
    })
}

/// Where the driver container sits and what it needs there.
pub(crate) struct DriverPlacement<'a> {
    /// The workload's overrides (`spec.controller` / `spec.node`).
    pub overrides: &'a DriverOverride,
    /// Mounts after `socket-dir`.
    pub extra_mounts: Vec<VolumeMount>,
    /// Node pods mount with bidirectional propagation, which needs privilege.
    pub privileged: bool,
}

/// The vendor's driver container. `CSI_ENDPOINT` and `KUBE_NODE_NAME` come
/// first so `driver.args` can reference them; then `driver.env`, then the
/// workload's override env. Override image/args/resources replace the base.
pub(crate) fn driver_container(ctx: &Ctx<'_>, placement: DriverPlacement<'_>) -> Container {
    let driver = &ctx.spec().driver;
    let ov = placement.overrides;
    let operator_env = [
        EnvVar {
            name: ENV_CSI_ENDPOINT.to_string(),
            value: Some(format!("unix://{}", ctx.csi_address())),
            ..Default::default()
        },
        field_env(ENV_KUBE_NODE_NAME, "spec.nodeName"),
    ];
    let env = merge_env(&[&operator_env, &driver.env, &ov.env]);
    let args = ov.args.clone().unwrap_or_else(|| driver.args.clone());
    let image = ov.image.clone().unwrap_or_else(|| driver.image.clone());
    let resources = ov.resources.clone().or_else(|| driver.resources.clone());

    let mut mounts = vec![socket_dir_mount()];
    mounts.extend(placement.extra_mounts);
    mounts.extend(ov.volume_mounts.iter().cloned());

    let liveness = ctx.liveness_probe_enabled();
    Container {
        name: CONTAINER_DRIVER.to_string(),
        image: Some(image),
        image_pull_policy: driver.image_pull_policy.map(|p| p.as_str().to_string()),
        args: none_if_empty(args),
        env: none_if_empty(env),
        resources,
        ports: none_if_empty(
            liveness
                .then(|| ContainerPort {
                    name: Some(HEALTHZ_PORT_NAME.to_string()),
                    container_port: ctx.port(HEALTHZ_PORT),
                    protocol: Some("TCP".to_string()),
                    ..Default::default()
                })
                .into_iter()
                .chain(ov.ports.iter().cloned())
                .collect(),
        ),
        lifecycle: ov.lifecycle.clone(),
        // The upstream recommendation: the liveness-probe sidecar answers for
        // the driver, kubelet restarts the driver when its Probe fails.
        liveness_probe: liveness.then(|| Probe {
            http_get: http_get(
                "/healthz",
                IntOrString::String(HEALTHZ_PORT_NAME.to_string()),
                monitoring::probe_scheme(ctx),
            ),
            failure_threshold: Some(5),
            initial_delay_seconds: Some(10),
            timeout_seconds: Some(3),
            period_seconds: Some(2),
            ..Default::default()
        }),
        // An override replaces the default whole; validation made sure a node
        // override stays privileged.
        security_context: ov.security_context.clone().or_else(|| {
            placement.privileged.then(|| SecurityContext {
                privileged: Some(true),
                allow_privilege_escalation: Some(true),
                ..Default::default()
            })
        }),
        volume_mounts: Some(mounts),
        ..Default::default()
    }
}

/// How every sidecar container runs: as uid 0 with no capabilities at all,
/// no privilege escalation and a read-only root filesystem.
///
/// Why uid 0 and not a non-root user: a sidecar must connect to the driver's
/// socket, and connecting to a unix socket needs write permission on it.
/// Drivers (csi-test-driver, hostpath, vendors') run as root and create it
/// `srwxr-xr-x root root`, so only its owner, uid 0, may connect without
/// CAP_DAC_OVERRIDE; the registrar also writes into kubelet's root-owned
/// plugin registration directory. Being the owner needs no capability, so
/// every capability is dropped.
fn sidecar_security_context() -> SecurityContext {
    SecurityContext {
        run_as_user: Some(0),
        run_as_non_root: Some(false),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Fields shared by every sidecar container.
fn sidecar_container(
    ctx: &Ctx<'_>,
    name: &str,
    key: &'static str,
    spec: &SidecarSpec,
    mut args: Vec<String>,
    operator_env: &[EnvVar],
    mut mounts: Vec<VolumeMount>,
) -> Result<Container, RenderError> {
    args.extend(monitoring::sidecar_args(ctx));
    args.extend(spec.extra_args.iter().cloned());
    mounts.extend(monitoring::sidecar_mounts(ctx));
    mounts.extend(spec.volume_mounts.iter().cloned());
    // The name the driver must report: a sidecar refuses (and says why in
    // its termination message) a driver answering GetPluginInfo otherwise.
    let expected = [EnvVar {
        name: ENV_EXPECTED_DRIVER_NAME.to_string(),
        value: Some(ctx.spec().driver_name.clone()),
        ..Default::default()
    }];
    let operator_env = merge_env(&[&expected, operator_env]);
    Ok(Container {
        name: name.to_string(),
        image: Some(ctx.sidecar_image(key)?),
        image_pull_policy: ctx
            .spec()
            .sidecars
            .image_pull_policy
            .map(|p| p.as_str().to_string()),
        args: Some(args),
        env: none_if_empty(merge_env(&[&operator_env, &spec.env])),
        resources: Some(
            spec.resources
                .clone()
                .unwrap_or_else(|| sizing::for_sidecar(key).requirements()),
        ),
        volume_mounts: Some(mounts),
        security_context: Some(sidecar_security_context()),
        ..Default::default()
    })
}

/// What one controller sidecar gets from the operator beyond the common
/// flags and `NAMESPACE` (before the user's `extraArgs` and `env`).
#[derive(Clone, Copy, Default)]
struct OperatorExtra<'a> {
    args: &'a [String],
    env: &'a [EnvVar],
}

/// Provisioner and attacher differ only in role, port and a few flags.
fn controller_sidecar(
    ctx: &Ctx<'_>,
    name: &str,
    key: &'static str,
    role: &str,
    spec: &SidecarSpec,
    http_port: i32,
    extra: OperatorExtra<'_>,
) -> Result<Container, RenderError> {
    let mut args = vec![
        role.to_string(),
        format!("--csi-address={}", ctx.csi_address()),
        format!("--v={}", ctx.spec().log_level),
        "--timeout=60s".to_string(),
        // Always on: with more than one replica only the leader may act, and
        // with one replica it costs one Lease.
        "--leader-election".to_string(),
        "--leader-election-namespace=$(NAMESPACE)".to_string(),
        format!("--http-endpoint=:{http_port}"),
    ];
    args.extend(extra.args.iter().cloned());
    let mut env = vec![field_env("NAMESPACE", "metadata.namespace")];
    env.extend(extra.env.iter().cloned());
    sidecar_container(ctx, name, key, spec, args, &env, vec![socket_dir_mount()])
}

/// The provisioner's capacity flags and environment: with
/// `csiDriver.storageCapacity`, `--enable-capacity` and the owner of the
/// CSIStorageCapacity objects. Centrally that is the controller workload —
/// one level up from the pod for a StatefulSet, two for a Deployment (pod →
/// ReplicaSet → Deployment) — so they outlive a pod and are collected with
/// the driver. Node-locally it is the pod itself (level 0, as upstream's
/// `deploy/kubernetes-distributed`): a node's objects describe that node's
/// storage and go with its pod, also when the node leaves the cluster (the
/// DaemonSet would keep a gone node's objects forever). POD_NAME is where
/// the walk starts (NAMESPACE is always set).
pub(crate) fn capacity_args_and_env(ctx: &Ctx<'_>) -> (Vec<String>, Vec<EnvVar>) {
    if !ctx.capacity_enabled() {
        return (Vec::new(), Vec::new());
    }
    let level = if ctx.node_local() {
        0
    } else {
        match ctx.spec().controller.kind {
            ControllerKind::StatefulSet => 1,
            ControllerKind::Deployment => 2,
        }
    };
    (
        vec![
            "--enable-capacity".to_string(),
            format!("--capacity-ownerref-level={level}"),
        ],
        vec![field_env("POD_NAME", "metadata.name")],
    )
}

/// `csi-provisioner`: creates and deletes volumes for PVCs. Adds the PVC/PV
/// names to CreateVolume parameters (`--extra-create-metadata`), as most
/// drivers expect; publishes capacity when the CSIDriver says so.
pub(crate) fn provisioner_container(ctx: &Ctx<'_>) -> Result<Container, RenderError> {
    let (capacity_args, capacity_env) = capacity_args_and_env(ctx);
    let mut args = vec!["--extra-create-metadata".to_string()];
    args.extend(capacity_args);
    let mut container = controller_sidecar(
        ctx,
        CONTAINER_PROVISIONER,
        "provisioner",
        "provisioner",
        &ctx.spec().sidecars.provisioner,
        ctx.port(PROVISIONER_HTTP_PORT),
        OperatorExtra {
            args: &args,
            env: &capacity_env,
        },
    )?;
    container.ports =
        monitoring::metrics_port(ctx, PROVISIONER_PORT_NAME, ctx.port(PROVISIONER_HTTP_PORT));
    Ok(container)
}

/// `csi-provisioner` in the node pods (topology NodeLocal), as upstream's
/// `deploy/kubernetes-distributed` runs it: `--node-deployment` with
/// `NODE_NAME` from the pod's node, so it provisions only the claims
/// scheduled to its node through the driver beside it and deletes only the
/// volumes that driver holds; no leader election (every node's instance
/// works at once). `--strict-topology=true --immediate-topology=false`,
/// upstream's recommendation for node deployment, come before the user's
/// `extraArgs` and may be overridden there; `--node-deployment` itself is
/// managed. Its intent journal is a ConfigMap per node in the pod's
/// namespace (its ServiceAccount's: no `--leader-election-namespace`).
pub(crate) fn node_provisioner_container(ctx: &Ctx<'_>) -> Result<Container, RenderError> {
    let (capacity_args, capacity_env) = capacity_args_and_env(ctx);
    let mut args = vec![
        "provisioner".to_string(),
        format!("--csi-address={}", ctx.csi_address()),
        format!("--v={}", ctx.spec().log_level),
        "--timeout=60s".to_string(),
        format!("--http-endpoint=:{}", ctx.port(NODE_PROVISIONER_HTTP_PORT)),
        "--node-deployment".to_string(),
        "--extra-create-metadata".to_string(),
        "--strict-topology=true".to_string(),
        "--immediate-topology=false".to_string(),
    ];
    args.extend(capacity_args);
    let mut env = vec![
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("NAMESPACE", "metadata.namespace"),
    ];
    env.extend(capacity_env);
    let mut container = sidecar_container(
        ctx,
        CONTAINER_PROVISIONER,
        "provisioner",
        &ctx.spec().sidecars.provisioner,
        args,
        &env,
        vec![socket_dir_mount()],
    )?;
    container.ports = monitoring::metrics_port(
        ctx,
        PROVISIONER_PORT_NAME,
        ctx.port(NODE_PROVISIONER_HTTP_PORT),
    );
    Ok(container)
}

/// `csi-attacher`: handles VolumeAttachments (ControllerPublish/Unpublish).
pub(crate) fn attacher_container(ctx: &Ctx<'_>) -> Result<Container, RenderError> {
    let mut container = controller_sidecar(
        ctx,
        CONTAINER_ATTACHER,
        "attacher",
        "attacher",
        &ctx.spec().sidecars.attacher,
        ctx.port(ATTACHER_HTTP_PORT),
        OperatorExtra::default(),
    )?;
    container.ports =
        monitoring::metrics_port(ctx, ATTACHER_PORT_NAME, ctx.port(ATTACHER_HTTP_PORT));
    Ok(container)
}

/// Which upstream helper: its container name, `spec.sidecars` key, default
/// image and HTTP port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Helper {
    Resizer,
    Snapshotter,
    HealthMonitor,
}

impl Helper {
    pub const ALL: [Helper; 3] = [Helper::Resizer, Helper::Snapshotter, Helper::HealthMonitor];

    pub fn container_name(self) -> &'static str {
        match self {
            Helper::Resizer => CONTAINER_RESIZER,
            Helper::Snapshotter => CONTAINER_SNAPSHOTTER,
            Helper::HealthMonitor => CONTAINER_HEALTH_MONITOR,
        }
    }

    /// The field under `spec.sidecars`.
    pub fn key(self) -> &'static str {
        match self {
            Helper::Resizer => "resizer",
            Helper::Snapshotter => "snapshotter",
            Helper::HealthMonitor => "healthMonitor",
        }
    }

    pub fn default_image(self) -> &'static str {
        match self {
            Helper::Resizer => DEFAULT_RESIZER_IMAGE,
            Helper::Snapshotter => DEFAULT_SNAPSHOTTER_IMAGE,
            Helper::HealthMonitor => DEFAULT_HEALTH_MONITOR_IMAGE,
        }
    }

    pub fn http_port(self) -> i32 {
        match self {
            Helper::Resizer => RESIZER_HTTP_PORT,
            Helper::Snapshotter => SNAPSHOTTER_HTTP_PORT,
            Helper::HealthMonitor => HEALTH_MONITOR_HTTP_PORT,
        }
    }

    pub fn spec(self, sidecars: &csiops_crds::SidecarsSpec) -> &HelperSpec {
        match self {
            Helper::Resizer => &sidecars.resizer,
            Helper::Snapshotter => &sidecars.snapshotter,
            Helper::HealthMonitor => &sidecars.health_monitor,
        }
    }
}

/// An upstream kubernetes-csi helper (csi-resizer, csi-snapshotter,
/// csi-external-health-monitor-controller) with the flags every one of them
/// takes from csi-lib-utils' standard set. Runs like our sidecars (uid 0, no
/// capabilities) because it connects to the same root-owned socket.
pub(crate) fn helper_container(ctx: &Ctx<'_>, helper: Helper) -> Container {
    let spec = helper.spec(&ctx.spec().sidecars);
    let mut args = vec![
        format!("--csi-address={}", ctx.csi_address()),
        format!("--v={}", ctx.spec().log_level),
        "--timeout=60s".to_string(),
        // Always on, as for our controller sidecars: replicas > 1 (or a
        // Deployment's rolling update) must not run two active helpers.
        "--leader-election".to_string(),
        "--leader-election-namespace=$(NAMESPACE)".to_string(),
        format!("--http-endpoint=:{}", ctx.port(helper.http_port())),
    ];
    args.extend(spec.extra_args.iter().cloned());
    let mut mounts = vec![socket_dir_mount()];
    mounts.extend(spec.volume_mounts.iter().cloned());
    let operator_env = [field_env("NAMESPACE", "metadata.namespace")];
    let image = spec
        .image
        .as_deref()
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .unwrap_or(helper.default_image());
    Container {
        name: helper.container_name().to_string(),
        image: Some(image.to_string()),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_string()),
        args: Some(args),
        env: none_if_empty(merge_env(&[&operator_env, &spec.env])),
        resources: spec.resources.clone(),
        volume_mounts: Some(mounts),
        security_context: Some(sidecar_security_context()),
        ..Default::default()
    }
}

/// A user's extra container: exactly what they wrote, plus the socket
/// directory at `/csi` first so it can reach the driver like every sidecar.
pub(crate) fn extra_container(extra: &ExtraContainer) -> Container {
    let mut mounts = vec![socket_dir_mount()];
    mounts.extend(extra.volume_mounts.iter().cloned());
    Container {
        name: extra.name.clone(),
        image: Some(extra.image.clone()),
        image_pull_policy: extra.image_pull_policy.map(|p| p.as_str().to_string()),
        command: none_if_empty(extra.command.clone()),
        args: none_if_empty(extra.args.clone()),
        env: none_if_empty(extra.env.clone()),
        resources: extra.resources.clone(),
        volume_mounts: Some(mounts),
        security_context: extra.security_context.clone(),
        ..Default::default()
    }
}

/// `node-driver-registrar`: registers the driver socket with kubelet through
/// `/registration` (the only container that mounts it) and maintains CSINode.
pub(crate) fn registrar_container(ctx: &Ctx<'_>) -> Result<Container, RenderError> {
    let spec = &ctx.spec().sidecars.registrar;
    let mut args = vec![
        "registrar".to_string(),
        format!("--csi-address={}", ctx.csi_address()),
        // The path kubelet dials, i.e. the socket as seen on the host.
        format!("--kubelet-registration-path={}", ctx.host_socket_path()),
        format!("--plugin-registration-path={REGISTRATION_DIR_MOUNT}"),
        format!("--http-endpoint=:{}", ctx.port(REGISTRAR_HTTP_PORT)),
        format!("--v={}", ctx.spec().log_level),
        // Its own node, from the pod (kubelet expands the variable): the
        // only Node and CSINode it may write.
        "--node-name=$(NODE_NAME)".to_string(),
    ];
    if ctx.spec().node.readiness_taint {
        args.push(format!(
            "--readiness-taint-key={}",
            csiops_crds::readiness_taint_key(&ctx.spec().driver_name)
        ));
    }
    let env = [field_env("NODE_NAME", "spec.nodeName")];
    let mounts = vec![
        socket_dir_mount(),
        VolumeMount {
            name: VOLUME_REGISTRATION_DIR.to_string(),
            mount_path: REGISTRATION_DIR_MOUNT.to_string(),
            ..Default::default()
        },
    ];
    // Root, explicitly (the image's default user is non-root): the registrar
    // creates its registration socket in kubelet's plugin watcher directory
    // (`<kubeletDir>/plugins_registry`), which kubelet creates root-owned and
    // not writable by anyone else.
    let mut container = sidecar_container(
        ctx,
        CONTAINER_REGISTRAR,
        "registrar",
        spec,
        args,
        &env,
        mounts,
    )?;
    container.ports = Some(vec![ContainerPort {
        name: Some(REGISTRAR_PORT_NAME.to_string()),
        container_port: ctx.port(REGISTRAR_HTTP_PORT),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    }]);
    // As upstream recommends: kubelet restarts a registrar whose /healthz
    // fails (e.g. its registration socket was removed), instead of leaving
    // the node silently without the driver.
    container.liveness_probe = Some(Probe {
        http_get: http_get(
            "/healthz",
            IntOrString::String(REGISTRAR_PORT_NAME.to_string()),
            monitoring::probe_scheme(ctx),
        ),
        initial_delay_seconds: Some(5),
        timeout_seconds: Some(5),
        ..Default::default()
    });
    Ok(container)
}

/// `liveness-probe`: serves `/healthz` on [`HEALTHZ_PORT`] by calling the
/// driver's Probe; the driver container's livenessProbe points at it.
pub(crate) fn liveness_probe_container(ctx: &Ctx<'_>) -> Result<Container, RenderError> {
    let args = vec![
        "liveness-probe".to_string(),
        format!("--csi-address={}", ctx.csi_address()),
        format!("--http-endpoint=:{}", ctx.port(HEALTHZ_PORT)),
        "--probe-timeout=3s".to_string(),
        format!("--v={}", ctx.spec().log_level),
    ];
    sidecar_container(
        ctx,
        CONTAINER_LIVENESS_PROBE,
        "livenessProbe",
        &ctx.spec().sidecars.liveness_probe,
        args,
        &[],
        vec![socket_dir_mount()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        }
    }

    #[test]
    fn merge_env_later_wins_in_place() {
        let merged = merge_env(&[
            &[var("A", "1"), var("B", "1")],
            &[var("C", "2"), var("A", "2"), var("C", "3")],
        ]);
        assert_eq!(merged, vec![var("A", "2"), var("B", "1"), var("C", "3")]);
    }
}
