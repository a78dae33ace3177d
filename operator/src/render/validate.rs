//! Checks on a `CSIDriverDeployment` that the CRD schema cannot express (or
//! that must hold even if the schema was bypassed), done before anything is
//! rendered so a bad object changes nothing in the cluster.

use std::collections::BTreeMap;

use csiops_crds::{CSIDriverDeployment, DriverOverride, ExtraContainerPod, PodSettings, Topology};
use k8s_openapi::api::core::v1::VolumeMount;

use super::api_access::API_ACCESS_MOUNT;
use super::containers::Helper;
use super::error::RenderError;
use super::labels::{
    COMPONENT, DEFAULT_CONTAINER, INSTANCE, MANAGED_BY, NAME, VERSION, VERSION_LABEL,
};
use super::names::{
    MANAGED_CONTAINERS, MAX_CR_NAME_LEN, MAX_STATEFULSET_NAME_LEN, REGISTRATION_DIR_MOUNT,
    SOCKET_DIR_MOUNT, VOLUME_API_ACCESS, VOLUME_KUBELET_DIR, VOLUME_REGISTRATION_DIR,
    VOLUME_SOCKET_DIR,
};
use super::ports;

/// Flags of the provisioner and attacher that the operator sets itself.
/// `--metrics-address` too: like upstream, the sidecar refuses to start
/// when it is set next to `--http-endpoint`.
pub const CONTROLLER_SIDECAR_MANAGED_FLAGS: &[&str] = &[
    "csi-address",
    "leader-election",
    "leader-election-namespace",
    "http-endpoint",
    "metrics-address",
    "v",
    "metrics-auth",
    "metrics-tls-cert-file",
    "metrics-tls-key-file",
];
/// Flags the operator sets on the provisioner only, beside the controller
/// sidecars' ([`CONTROLLER_SIDECAR_MANAGED_FLAGS`]): the capacity switch and
/// owner level, which follow `csiDriver.storageCapacity` and the topology
/// and controller kind, and `--node-deployment`, which follows
/// `spec.topology` (each refused whatever the topology and capacity, so
/// switching either never breaks an accepted object).
pub const PROVISIONER_ONLY_MANAGED_FLAGS: &[&str] = &[
    "enable-capacity",
    "capacity-ownerref-level",
    "node-deployment",
];
/// Flags of the registrar that the operator sets itself (`--health-port`:
/// refused next to `--http-endpoint`, as upstream).
pub const REGISTRAR_MANAGED_FLAGS: &[&str] = &[
    "csi-address",
    "kubelet-registration-path",
    "plugin-registration-path",
    "http-endpoint",
    "metrics-auth",
    "metrics-tls-cert-file",
    "metrics-tls-key-file",
    // Set from `spec.node.readinessTaint`.
    "readiness-taint-key",
    "health-port",
    // The node whose Node and CSINode the registrar writes: always its own
    // (`spec.nodeName`), never one the spec names.
    "node-name",
];
/// Environment variables of the registrar that name its node (read when
/// `--node-name` is unset, and by the node provisioner): the operator sets
/// them from `spec.nodeName` and refuses them in `env`.
pub const NODE_NAME_ENV: &[&str] = &["NODE_NAME", "KUBE_NODE_NAME"];
/// Flags of the liveness probe that the operator sets itself
/// (`--health-port`, `--metrics-address`: refused next to
/// `--http-endpoint`, as upstream).
pub const LIVENESS_PROBE_MANAGED_FLAGS: &[&str] = &[
    "csi-address",
    "http-endpoint",
    "health-port",
    "metrics-address",
    "metrics-auth",
    "metrics-tls-cert-file",
    "metrics-tls-key-file",
];
/// Flags of the upstream helpers that the operator sets itself.
/// `--metrics-address` too: upstream refuses to start when it is set next to
/// `--http-endpoint`.
pub const HELPER_MANAGED_FLAGS: &[&str] = &[
    "csi-address",
    "leader-election",
    "leader-election-namespace",
    "http-endpoint",
    "metrics-address",
    "v",
];

/// Metadata the renderer needs, checked present.
pub(crate) struct Meta<'a> {
    pub namespace: &'a str,
}

/// Validates everything `render` relies on; see [`RenderError`] for the cases.
///
/// The extraArgs of every sidecar are checked, enabled or not, so enabling a
/// sidecar later never turns a previously accepted object into an error.
pub(crate) fn validate(obj: &CSIDriverDeployment) -> Result<Meta<'_>, RenderError> {
    let name = obj
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(RenderError::MissingMetadata { field: "name" })?;
    let namespace = obj
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(RenderError::MissingMetadata { field: "namespace" })?;
    obj.metadata
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(RenderError::MissingMetadata { field: "uid" })?;
    if name.len() > MAX_CR_NAME_LEN {
        return Err(RenderError::NameTooLong {
            name: name.to_string(),
            len: name.len(),
            max: MAX_CR_NAME_LEN,
            sts_max: MAX_STATEFULSET_NAME_LEN,
        });
    }

    let spec = &obj.spec;
    if let Some(conflict) = spec.node_local_conflicts().into_iter().next() {
        return Err(RenderError::NodeLocal {
            field: conflict.field,
            why: conflict.why,
        });
    }
    if spec.driver.image.trim().is_empty() {
        return Err(RenderError::EmptyImage {
            field: "spec.driver.image",
        });
    }
    if matches!(spec.controller.driver.image.as_deref(), Some(i) if i.trim().is_empty()) {
        return Err(RenderError::EmptyImage {
            field: "spec.controller.image",
        });
    }
    if matches!(spec.node.driver.image.as_deref(), Some(i) if i.trim().is_empty()) {
        return Err(RenderError::EmptyImage {
            field: "spec.node.image",
        });
    }
    let sock = &spec.driver.socket_name;
    if sock.is_empty() || sock.contains('/') || sock == "." || sock == ".." {
        return Err(RenderError::InvalidSocketName { name: sock.clone() });
    }

    let sidecars = &spec.sidecars;
    for managed in [
        CONTROLLER_SIDECAR_MANAGED_FLAGS,
        PROVISIONER_ONLY_MANAGED_FLAGS,
    ] {
        check_extra_args("provisioner", &sidecars.provisioner.extra_args, managed)?;
    }
    check_extra_args(
        "attacher",
        &sidecars.attacher.extra_args,
        CONTROLLER_SIDECAR_MANAGED_FLAGS,
    )?;
    check_extra_args(
        "registrar",
        &sidecars.registrar.extra_args,
        REGISTRAR_MANAGED_FLAGS,
    )?;
    for (sidecar, env) in [
        ("registrar", &sidecars.registrar.env),
        ("provisioner", &sidecars.provisioner.env),
    ] {
        if let Some(var) = env
            .iter()
            .find(|e| NODE_NAME_ENV.contains(&e.name.as_str()))
        {
            return Err(RenderError::ManagedEnv {
                sidecar,
                name: var.name.clone(),
            });
        }
    }
    check_extra_args(
        "livenessProbe",
        &sidecars.liveness_probe.extra_args,
        LIVENESS_PROBE_MANAGED_FLAGS,
    )?;
    for helper in Helper::ALL {
        let spec = helper.spec(sidecars);
        check_extra_args(helper.key(), &spec.extra_args, HELPER_MANAGED_FLAGS)?;
        if matches!(spec.image.as_deref(), Some(i) if i.trim().is_empty()) {
            return Err(RenderError::EmptyImage {
                field: match helper {
                    Helper::Resizer => "spec.sidecars.resizer.image",
                    Helper::Snapshotter => "spec.sidecars.snapshotter.image",
                    Helper::HealthMonitor => "spec.sidecars.healthMonitor.image",
                },
            });
        }
    }
    check_extra_containers(obj)?;
    check_secret_access(spec)?;

    let kubelet_dir = normalize_kubelet_dir(&spec.node.kubelet_dir)?;
    for pod in managed_pods(obj, &kubelet_dir) {
        check_pod(&pod)?;
    }

    Ok(Meta { namespace })
}

/// Pod labels the operator sets (and selects pods by).
const MANAGED_POD_LABELS: &[&str] = &[MANAGED_BY, INSTANCE, COMPONENT, NAME, VERSION_LABEL];
/// Pod annotations the operator sets.
const MANAGED_POD_ANNOTATIONS: &[&str] = &[VERSION, DEFAULT_CONTAINER];

/// One container's mounts: those the operator makes and the user's.
struct ContainerMounts<'a> {
    /// Where the user's mounts are, e.g. `spec.sidecars.registrar.volumeMounts`.
    field: String,
    /// (mount path, what it is for).
    managed: Vec<(String, &'static str)>,
    user: &'a [VolumeMount],
}

/// What the operator and the user put into one workload's pods.
struct ManagedPod<'a> {
    /// `controller` or `node`, as in `spec.<workload>`.
    workload: &'static str,
    settings: &'a PodSettings,
    driver: &'a DriverOverride,
    /// Whether the driver's default securityContext is privileged.
    driver_privileged_by_default: bool,
    /// Mounts of the driver container the operator makes: (mount path, propagation).
    driver_managed_mounts: Vec<(String, Option<&'static str>)>,
    /// (volume name, what it is for).
    volumes: Vec<(&'static str, &'static str)>,
    containers: Vec<ContainerMounts<'a>>,
    /// `spec.sidecars.portBase`.
    port_base: Option<i32>,
}

fn sidecar_mounts<'a>(
    key: &str,
    user: &'a [VolumeMount],
    managed: Vec<(String, &'static str)>,
) -> ContainerMounts<'a> {
    ContainerMounts {
        field: format!("spec.sidecars.{key}.volumeMounts"),
        managed,
        user,
    }
}

/// Mounts of the `spec.sidecars.extra` containers of one workload's pods.
fn extra_mounts(obj: &CSIDriverDeployment, pod: ExtraContainerPod) -> Vec<ContainerMounts<'_>> {
    obj.spec
        .sidecars
        .extra
        .iter()
        .enumerate()
        .filter(|(_, c)| c.pod == pod)
        .map(|(i, c)| ContainerMounts {
            field: format!("spec.sidecars.extra[{i}].volumeMounts"),
            managed: vec![socket_mount()],
            user: &c.volume_mounts,
        })
        .collect()
}

/// Extra containers: a name must be a usable container name, must not be one
/// the operator renders (in either pod: the API server would refuse the
/// duplicate, or the user's container would silently stand in for ours), and
/// must be unique within its pod.
fn check_extra_containers(obj: &CSIDriverDeployment) -> Result<(), RenderError> {
    let mut seen: BTreeMap<(&str, bool), usize> = BTreeMap::new();
    for (i, c) in obj.spec.sidecars.extra.iter().enumerate() {
        let field = format!("spec.sidecars.extra[{i}].name");
        if !is_dns_label(&c.name) {
            return Err(RenderError::InvalidContainerName {
                field,
                name: c.name.clone(),
            });
        }
        if c.image.trim().is_empty() {
            return Err(RenderError::EmptyContainerImage {
                field: format!("spec.sidecars.extra[{i}].image"),
            });
        }
        if let Some((_, what)) = MANAGED_CONTAINERS.iter().find(|(n, _)| *n == c.name) {
            return Err(RenderError::Collision {
                field,
                value: c.name.clone(),
                what: format!("the container the operator manages for {what}"),
                noun: "name",
            });
        }
        let in_node = c.pod == ExtraContainerPod::Node;
        if let Some(j) = seen.insert((c.name.as_str(), in_node), i) {
            return Err(RenderError::Collision {
                field,
                value: c.name.clone(),
                what: format!("spec.sidecars.extra[{j}] in the same pods"),
                noun: "name",
            });
        }
    }
    Ok(())
}

/// The Secrets the driver may read are named (`rbac::secret_scope`): its
/// extra namespaces are namespace names, and a class names its Secrets'
/// namespace literally unless every namespace is granted.
fn check_secret_access(spec: &csiops_crds::CSIDriverDeploymentSpec) -> Result<(), RenderError> {
    if let Some(bad) = spec
        .secret_access
        .namespaces
        .iter()
        .find(|n| !is_dns_label(n))
    {
        return Err(RenderError::SecretNamespace { name: bad.clone() });
    }
    // A literal namespace from a class is checked as Kubernetes would a
    // RoleBinding's: refused there, it would fail every reconcile.
    if let Some((_, bad)) = spec
        .storage_classes
        .iter()
        .flat_map(super::rbac::class_secret_namespaces)
        .find(|(_, v)| !super::rbac::is_template(v) && !is_dns_label(v))
    {
        return Err(RenderError::SecretNamespace {
            name: bad.to_string(),
        });
    }
    super::rbac::secret_scope(spec)
        .map(drop)
        .map_err(|t| RenderError::TemplatedSecretNamespace {
            class: t.class,
            key: t.key,
            value: t.value,
        })
}

/// A DNS-1123 label, what Kubernetes requires of a container name (the
/// schema says so too; checked here in case it was bypassed).
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}

/// What the token volume is, in messages.
const API_ACCESS_WHAT: &str =
    "the ServiceAccount token the operator mounts only into the containers that call the API";

fn socket_mount() -> (String, &'static str) {
    (SOCKET_DIR_MOUNT.to_string(), "the CSI socket directory")
}

/// The controller and node pods as far as collisions are concerned. Every
/// sidecar is listed, enabled or not, so enabling one later never turns an
/// accepted object into an error.
fn managed_pods<'a>(obj: &'a CSIDriverDeployment, kubelet_dir: &str) -> Vec<ManagedPod<'a>> {
    let spec = &obj.spec;
    let sidecars = &spec.sidecars;
    let mut controller = ManagedPod {
        workload: "controller",
        settings: &spec.controller.pod,
        driver: &spec.controller.driver,
        port_base: sidecars.port_base,
        driver_privileged_by_default: false,
        driver_managed_mounts: vec![(SOCKET_DIR_MOUNT.to_string(), None)],
        volumes: vec![
            (VOLUME_SOCKET_DIR, "the CSI socket directory"),
            (VOLUME_API_ACCESS, API_ACCESS_WHAT),
        ],
        containers: vec![
            ContainerMounts {
                field: "spec.controller.volumeMounts".into(),
                managed: vec![socket_mount()],
                user: &spec.controller.driver.volume_mounts,
            },
            sidecar_mounts(
                "attacher",
                &sidecars.attacher.volume_mounts,
                vec![socket_mount()],
            ),
            sidecar_mounts(
                "livenessProbe",
                &sidecars.liveness_probe.volume_mounts,
                vec![socket_mount()],
            ),
        ],
    };
    controller
        .containers
        .extend(Helper::ALL.into_iter().map(|helper| {
            sidecar_mounts(
                helper.key(),
                &helper.spec(sidecars).volume_mounts,
                vec![socket_mount()],
            )
        }));
    controller
        .containers
        .extend(extra_mounts(obj, ExtraContainerPod::Controller));
    let mut node = ManagedPod {
        workload: "node",
        settings: &spec.node.pod,
        driver: &spec.node.driver,
        port_base: sidecars.port_base,
        driver_privileged_by_default: true,
        driver_managed_mounts: vec![
            (SOCKET_DIR_MOUNT.to_string(), None),
            (kubelet_dir.to_string(), Some("Bidirectional")),
        ],
        volumes: vec![
            (VOLUME_SOCKET_DIR, "the CSI socket directory"),
            (
                VOLUME_REGISTRATION_DIR,
                "kubelet's plugin registration directory",
            ),
            (VOLUME_KUBELET_DIR, "the kubelet directory"),
            (VOLUME_API_ACCESS, API_ACCESS_WHAT),
        ],
        containers: vec![
            ContainerMounts {
                field: "spec.node.volumeMounts".into(),
                managed: vec![
                    socket_mount(),
                    (
                        kubelet_dir.to_string(),
                        "the kubelet directory (spec.node.kubeletDir)",
                    ),
                ],
                user: &spec.node.driver.volume_mounts,
            },
            sidecar_mounts(
                "registrar",
                &sidecars.registrar.volume_mounts,
                vec![
                    socket_mount(),
                    (
                        REGISTRATION_DIR_MOUNT.to_string(),
                        "kubelet's plugin registration directory",
                    ),
                ],
            ),
            sidecar_mounts(
                "livenessProbe",
                &sidecars.liveness_probe.volume_mounts,
                vec![socket_mount()],
            ),
        ],
    };
    node.containers
        .extend(extra_mounts(obj, ExtraContainerPod::Node));
    // The provisioner runs where the topology puts it.
    let provisioner = sidecar_mounts(
        "provisioner",
        &sidecars.provisioner.volume_mounts,
        vec![socket_mount()],
    );
    match spec.topology {
        Topology::Central => controller.containers.insert(1, provisioner),
        Topology::NodeLocal => node.containers.insert(1, provisioner),
    }
    vec![controller, node]
}

/// Refuses names, paths and keys that collide with the operator's, mounts of
/// volumes the pod lacks, and Bidirectional mounts in an unprivileged driver.
/// Each of these would otherwise be refused by the API server on apply (or,
/// worse, silently replace the operator's wiring).
fn check_pod(pod: &ManagedPod<'_>) -> Result<(), RenderError> {
    let w = pod.workload;
    let collision = |field: String, value: &str, what: String, noun| RenderError::Collision {
        field,
        value: value.to_string(),
        what,
        noun,
    };

    let mut user_volumes: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, v) in pod.settings.volumes.iter().enumerate() {
        let field = format!("spec.{w}.volumes[{i}].name");
        if let Some((_, what)) = pod.volumes.iter().find(|(name, _)| *name == v.name) {
            return Err(collision(
                field,
                &v.name,
                format!("the volume the operator manages for {what}"),
                "name",
            ));
        }
        if let Some(j) = user_volumes.insert(&v.name, i) {
            return Err(collision(
                field,
                &v.name,
                format!("spec.{w}.volumes[{j}]"),
                "name",
            ));
        }
    }

    // The pod's containers share one network namespace: a driver port
    // must not be one the sidecars listen on (any of them, whichever pod).
    for (i, p) in pod.driver.ports.iter().enumerate() {
        let taken = |(n, _): &&(i32, &str)| ports::shifted(*n, pod.port_base) == p.container_port;
        if let Some((_, what)) = ports::ALL.iter().find(taken) {
            return Err(collision(
                format!("spec.{w}.ports[{i}].containerPort"),
                &p.container_port.to_string(),
                format!("the port of {what}"),
                "port",
            ));
        }
        if let Some(name) = p.name.as_deref().filter(|n| ports::NAMES.contains(n)) {
            return Err(collision(
                format!("spec.{w}.ports[{i}].name"),
                name,
                "a port name the operator gives its containers".to_string(),
                "name",
            ));
        }
    }

    for c in &pod.containers {
        let mut paths: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, m) in c.user.iter().enumerate() {
            // The token goes only where mountServiceAccountToken says: not
            // by a mount of its volume, nor by another at its path.
            if m.name == VOLUME_API_ACCESS {
                return Err(collision(
                    format!("{}[{i}].name", c.field),
                    &m.name,
                    format!("{API_ACCESS_WHAT} (set mountServiceAccountToken instead)"),
                    "volume",
                ));
            }
            if m.mount_path.trim_end_matches('/') == API_ACCESS_MOUNT {
                return Err(collision(
                    format!("{}[{i}].mountPath", c.field),
                    &m.mount_path,
                    format!("the path of {API_ACCESS_WHAT} (set mountServiceAccountToken instead)"),
                    "path",
                ));
            }
            let known = user_volumes.contains_key(m.name.as_str())
                || pod.volumes.iter().any(|(name, _)| *name == m.name);
            if !known {
                return Err(RenderError::UnknownVolume {
                    field: format!("{}[{i}]", c.field),
                    volume: m.name.clone(),
                    volumes_field: if w == "node" {
                        "spec.node.volumes"
                    } else {
                        "spec.controller.volumes"
                    },
                    managed: pod
                        .volumes
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            let path = m.mount_path.trim_end_matches('/');
            let field = format!("{}[{i}].mountPath", c.field);
            if let Some((_, what)) = c
                .managed
                .iter()
                .find(|(p, _)| p.trim_end_matches('/') == path)
            {
                return Err(collision(
                    field,
                    &m.mount_path,
                    format!("the operator's mount of {what}"),
                    "path",
                ));
            }
            if let Some(j) = paths.insert(path, i) {
                return Err(collision(
                    field,
                    &m.mount_path,
                    format!("{}[{j}]", c.field),
                    "path",
                ));
            }
        }
    }

    for key in pod.settings.pod_labels.keys() {
        if MANAGED_POD_LABELS.contains(&key.as_str()) {
            return Err(collision(
                format!("spec.{w}.podLabels"),
                key,
                "a label the operator sets on every pod and selects its pods by".into(),
                "key",
            ));
        }
    }
    for key in pod.settings.pod_annotations.keys() {
        if MANAGED_POD_ANNOTATIONS.contains(&key.as_str()) {
            return Err(collision(
                format!("spec.{w}.podAnnotations"),
                key,
                "an annotation the operator sets on every pod".into(),
                "key",
            ));
        }
    }

    let privileged = match &pod.driver.security_context {
        Some(sc) => sc.privileged == Some(true),
        None => pod.driver_privileged_by_default,
    };
    if !privileged {
        let managed = pod
            .driver_managed_mounts
            .iter()
            .filter(|(_, prop)| *prop == Some("Bidirectional"))
            .map(|(path, _)| path.clone());
        let user = pod
            .driver
            .volume_mounts
            .iter()
            .filter(|m| m.mount_propagation.as_deref() == Some("Bidirectional"))
            .map(|m| m.mount_path.clone());
        if let Some(mount) = managed.chain(user).next() {
            return Err(RenderError::BidirectionalNotPrivileged {
                field: format!("spec.{w}.securityContext"),
                workload: w,
                mount,
            });
        }
    }
    Ok(())
}

/// `kubeletDir` without a trailing slash, refused unless a clean absolute path
/// (it becomes hostPath volumes and the registration path kubelet dials).
pub(crate) fn normalize_kubelet_dir(dir: &str) -> Result<String, RenderError> {
    let invalid = |reason| RenderError::InvalidKubeletDir {
        dir: dir.to_string(),
        reason,
    };
    if !dir.starts_with('/') {
        return Err(invalid("it must be an absolute path"));
    }
    let trimmed = dir.trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(invalid("it must not be the root directory"));
    }
    if trimmed.contains("//") {
        return Err(invalid("it must not contain empty path segments ('//')"));
    }
    if trimmed.split('/').any(|seg| seg == ".." || seg == ".") {
        return Err(invalid("it must not contain '.' or '..' segments"));
    }
    Ok(trimmed.to_string())
}

/// Refuses an extraArgs entry that sets one of `managed` (`--flag`, `-flag`,
/// `--flag=value`, `-flag=value`). Entries not starting with `-` are values of
/// a preceding flag and are left alone.
fn check_extra_args(
    sidecar: &'static str,
    extra_args: &[String],
    managed: &[&str],
) -> Result<(), RenderError> {
    for arg in extra_args {
        let Some(flag) = flag_name(arg) else { continue };
        if managed.contains(&flag) {
            return Err(RenderError::ManagedFlag {
                sidecar,
                flag: flag.to_string(),
                arg: arg.clone(),
            });
        }
    }
    Ok(())
}

/// The flag name an argument sets, without dashes and value.
fn flag_name(arg: &str) -> Option<&str> {
    let arg = arg.trim();
    let rest = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    let name = rest.split_once('=').map_or(rest, |(name, _)| name);
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_refuses_exactly_the_names_rendering_cannot_use() {
        assert_eq!(MAX_CR_NAME_LEN, csiops_crds::MAX_NAME_LEN);
    }

    #[test]
    fn flag_names() {
        assert_eq!(flag_name("--v=5"), Some("v"));
        assert_eq!(flag_name("-v"), Some("v"));
        assert_eq!(
            flag_name("--leader-election-lease-duration=1s"),
            Some("leader-election-lease-duration")
        );
        assert_eq!(flag_name("5"), None);
        assert_eq!(flag_name("--"), None);
    }

    #[test]
    fn kubelet_dir() {
        assert_eq!(
            normalize_kubelet_dir("/var/lib/kubelet/").unwrap(),
            "/var/lib/kubelet"
        );
        assert_eq!(
            normalize_kubelet_dir("/var/lib/kubelet").unwrap(),
            "/var/lib/kubelet"
        );
        assert!(normalize_kubelet_dir("var/lib/kubelet").is_err());
        assert!(normalize_kubelet_dir("/").is_err());
        assert!(normalize_kubelet_dir("/var/../etc").is_err());
        assert!(normalize_kubelet_dir("/var//lib").is_err());
    }
}
