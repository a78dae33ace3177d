//! Which object of the input is what: the controller workload, the node
//! DaemonSet, other workloads and the supporting objects; and in each pod,
//! which container is the driver, which an upstream sidecar or helper, and
//! which an extra. `diff` classifies the operator's rendered objects with
//! the same functions, so both sides are read alike.

use csiops_operator::render::names::{
    CONTAINER_ATTACHER, CONTAINER_DRIVER, CONTAINER_LIVENESS_PROBE, CONTAINER_PROVISIONER,
    CONTAINER_REGISTRAR,
};
use csiops_operator::render::validate::{
    CONTROLLER_SIDECAR_MANAGED_FLAGS, HELPER_MANAGED_FLAGS, LIVENESS_PROBE_MANAGED_FLAGS,
    PROVISIONER_ONLY_MANAGED_FLAGS, REGISTRAR_MANAGED_FLAGS,
};
use csiops_operator::render::Helper;
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodTemplateSpec};

use super::ImportError;
use crate::input::Object;

/// What a container of a driver's pod is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The vendor's CSI driver.
    Driver,
    Provisioner,
    Attacher,
    Registrar,
    LivenessProbe,
    /// csi-resizer, csi-snapshotter, csi-external-health-monitor-controller.
    Helper(Helper),
    /// Anything else: an extra container.
    Extra,
}

impl Role {
    /// The field under `spec.sidecars`, for sidecars and helpers.
    pub fn key(self) -> &'static str {
        match self {
            Role::Provisioner => "provisioner",
            Role::Attacher => "attacher",
            Role::Registrar => "registrar",
            Role::LivenessProbe => "livenessProbe",
            Role::Helper(h) => h.key(),
            Role::Driver => "driver",
            Role::Extra => "extra",
        }
    }

    /// The csiops-sidecar role that replaces this upstream sidecar.
    pub fn sidecar_role(self) -> Option<&'static str> {
        match self {
            Role::Provisioner => Some("provisioner"),
            Role::Attacher => Some("attacher"),
            Role::Registrar => Some("registrar"),
            Role::LivenessProbe => Some("liveness-probe"),
            _ => None,
        }
    }

    /// The upstream container this role stands for, for messages.
    pub fn upstream_name(self) -> &'static str {
        match self {
            Role::Provisioner => "csi-provisioner",
            Role::Attacher => "csi-attacher",
            Role::Registrar => "node-driver-registrar",
            Role::LivenessProbe => "livenessprobe",
            Role::Helper(h) => h.container_name(),
            Role::Driver => "the driver",
            Role::Extra => "an extra container",
        }
    }

    /// The flags the operator sets on this sidecar and refuses in its
    /// `extraArgs`: the operator's own lists (`render::validate`).
    pub fn managed_flags(self) -> Vec<&'static str> {
        match self {
            Role::Provisioner => CONTROLLER_SIDECAR_MANAGED_FLAGS
                .iter()
                .chain(PROVISIONER_ONLY_MANAGED_FLAGS)
                .copied()
                .collect(),
            Role::Attacher => CONTROLLER_SIDECAR_MANAGED_FLAGS.to_vec(),
            Role::Registrar => REGISTRAR_MANAGED_FLAGS.to_vec(),
            Role::LivenessProbe => LIVENESS_PROBE_MANAGED_FLAGS.to_vec(),
            Role::Helper(_) => HELPER_MANAGED_FLAGS.to_vec(),
            Role::Driver | Role::Extra => Vec::new(),
        }
    }
}

/// The image's repository name without registry, path and tag:
/// `registry.k8s.io/sig-storage/csi-provisioner:v5.0.1` → `csi-provisioner`.
pub fn image_base(image: &str) -> &str {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    last.split(':').next().unwrap_or(last)
}

/// The image's tag, if it has one.
pub fn image_tag(image: &str) -> Option<&str> {
    let no_digest = image.split('@').next().unwrap_or(image);
    let last = no_digest.rsplit('/').next().unwrap_or(no_digest);
    last.split_once(':')
        .map(|(_, t)| t)
        .filter(|t| !t.is_empty())
}

/// The upstream kubernetes-csi program a name stands for: an image's
/// repository name or a command's file name (`csi-provisioner`,
/// `/csi-node-driver-registrar`, …).
fn upstream_role(program: &str) -> Option<Role> {
    match program {
        "csi-provisioner" => Some(Role::Provisioner),
        "csi-attacher" => Some(Role::Attacher),
        "csi-node-driver-registrar" => Some(Role::Registrar),
        "livenessprobe" => Some(Role::LivenessProbe),
        "csi-resizer" => Some(Role::Helper(Helper::Resizer)),
        "csi-snapshotter" => Some(Role::Helper(Helper::Snapshotter)),
        "csi-external-health-monitor-controller" => Some(Role::Helper(Helper::HealthMonitor)),
        _ => None,
    }
}

/// The role of a container by its image alone: an upstream kubernetes-csi
/// image, whose entrypoint is the sidecar (what `spec.sidecars.<helper>.image`
/// must be, since the operator runs a helper image's entrypoint).
pub fn role_by_image(c: &Container) -> Option<Role> {
    upstream_role(image_base(c.image.as_deref().unwrap_or_default()))
}

/// The upstream sidecar a container's `command` runs, when an image that
/// bundles several programs (TopoLVM's `topolvm-with-sidecar`, for one) is
/// started with the sidecar's binary as its command.
pub fn role_by_command(c: &Container) -> Option<Role> {
    let program = c.command.as_ref()?.first()?;
    upstream_role(program.rsplit('/').next().unwrap_or(program))
}

/// The role of a container by its image (upstream kubernetes-csi images,
/// or csiops' own sidecar image with its role argument), else by the
/// upstream sidecar its command runs, else by the container name the
/// operator gives it.
fn sidecar_role_of(c: &Container) -> Option<Role> {
    let image = c.image.as_deref().unwrap_or_default();
    let by_image = match image_base(image) {
        "csiops-sidecar" | "csiops-node-sidecar" => {
            match c.args.as_ref().and_then(|a| a.first()).map(String::as_str) {
                Some("provisioner") => Some(Role::Provisioner),
                Some("attacher") => Some(Role::Attacher),
                Some("registrar") => Some(Role::Registrar),
                Some("liveness-probe") => Some(Role::LivenessProbe),
                _ => None,
            }
        }
        other => upstream_role(other),
    };
    by_image.or_else(|| role_by_command(c)).or_else(|| {
        let name = c.name.as_str();
        [
            (CONTAINER_PROVISIONER, Role::Provisioner),
            (CONTAINER_ATTACHER, Role::Attacher),
            (CONTAINER_REGISTRAR, Role::Registrar),
            (CONTAINER_LIVENESS_PROBE, Role::LivenessProbe),
        ]
        .into_iter()
        .chain(Helper::ALL.map(|h| (h.container_name(), Role::Helper(h))))
        .find(|(n, _)| *n == name)
        .map(|(_, r)| r)
    })
}

/// `$(VAR)` references in `text` expanded from `env` (literal values only),
/// as kubelet does.
pub fn expand(text: &str, env: &[EnvVar]) -> String {
    let mut out = text.to_string();
    for var in env {
        if let Some(value) = &var.value {
            out = out.replace(&format!("$({})", var.name), value);
        }
    }
    out
}

/// The value of the flag `name` in `args` (`--name=v`, `-name=v`, or
/// `--name v`).
pub fn flag_value<'a>(args: &'a [String], names: &[&str]) -> Option<&'a str> {
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        if names.contains(&name) {
            return match value {
                Some(v) => Some(v),
                None => it.next().map(String::as_str),
            };
        }
    }
    None
}

/// A socket path as a path: without `unix://` (or `unix:`).
pub fn socket_path(address: &str) -> &str {
    address
        .strip_prefix("unix://")
        .or_else(|| address.strip_prefix("unix:"))
        .unwrap_or(address)
}

/// Where a socket is: its directory (no trailing slash) and file name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Socket {
    pub dir: String,
    pub file: String,
}

impl Socket {
    pub fn parse(address: &str) -> Option<Socket> {
        let path = socket_path(address);
        // `unix:///csi/csi.sock` has three slashes: the path is absolute.
        let path = if path.starts_with("//") {
            &path[1..]
        } else {
            path
        };
        let (dir, file) = path.rsplit_once('/')?;
        (!file.is_empty() && !file.contains('$')).then(|| Socket {
            dir: if dir.is_empty() {
                "/".into()
            } else {
                dir.into()
            },
            file: file.to_string(),
        })
    }
}

/// The CSI address a sidecar dials, expanded.
pub fn sidecar_address(c: &Container) -> Option<Socket> {
    let args = c.args.clone().unwrap_or_default();
    let env = c.env.clone().unwrap_or_default();
    let raw = flag_value(&args, &["csi-address"])?;
    Socket::parse(&expand(raw, &env))
}

/// The endpoint a driver container listens on: `--endpoint` (or a
/// similar flag) or `CSI_ENDPOINT`, expanded.
pub fn driver_endpoint(c: &Container) -> Option<Socket> {
    let mut args = c.command.clone().unwrap_or_default();
    args.extend(c.args.clone().unwrap_or_default());
    let env = c.env.clone().unwrap_or_default();
    let from_flag = flag_value(
        &args,
        &["endpoint", "csi-endpoint", "csi-address", "csiEndpoint"],
    )
    .map(|v| expand(v, &env));
    let from_env = env
        .iter()
        .find(|e| e.name == "CSI_ENDPOINT")
        .and_then(|e| e.value.clone());
    from_flag
        .and_then(|v| Socket::parse(&v))
        .or_else(|| from_env.and_then(|v| Socket::parse(&v)))
}

/// The volume a container mounts at `dir`.
pub fn volume_at(c: &Container, dir: &str) -> Option<String> {
    let dir = dir.trim_end_matches('/');
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path.trim_end_matches('/') == dir)
        .map(|m| m.name.clone())
}

/// One pod template of the input, its containers classified.
#[derive(Clone, Debug)]
pub struct Pod<'a> {
    pub object: &'a Object,
    pub template: PodTemplateSpec,
    pub spec: PodSpec,
    /// The role of each of `spec.containers`, same order.
    pub roles: Vec<Role>,
    /// The socket the sidecars (or the driver) use, as the driver sees it.
    pub socket: Option<Socket>,
    /// The pod volume holding the socket.
    pub socket_volume: Option<String>,
}

impl Pod<'_> {
    pub fn containers(&self) -> impl Iterator<Item = (Role, &Container)> {
        self.roles.iter().copied().zip(self.spec.containers.iter())
    }

    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    pub fn driver(&self) -> Option<&Container> {
        self.containers()
            .find(|(r, _)| *r == Role::Driver)
            .map(|(_, c)| c)
    }
}

/// A sidecar started by its command from an image that bundles several
/// programs, its flags written after the program in `command`: the flags
/// move to the front of `args`, so they are read (and accounted for, as
/// `args[i]`) like any sidecar's, and `command` keeps the program alone.
fn command_flags_to_args(c: &mut Container) {
    if role_by_image(c).is_some() || role_by_command(c).is_none() {
        return;
    }
    let Some(command) = c.command.as_mut() else {
        return;
    };
    if command.len() < 2 {
        return;
    }
    let mut args: Vec<String> = command.drain(1..).collect();
    args.extend(c.args.take().unwrap_or_default());
    c.args = Some(args);
}

/// Classifies the containers of a workload object's pod template.
pub fn pod(object: &Object) -> Result<Pod<'_>, ImportError> {
    let template: PodTemplateSpec =
        serde_json::from_value(object.value["spec"]["template"].clone()).map_err(|source| {
            ImportError::Invalid {
                object: object.id(),
                source,
            }
        })?;
    let mut spec = template
        .spec
        .clone()
        .ok_or_else(|| ImportError::NoPodSpec {
            object: object.id(),
        })?;
    for c in &mut spec.containers {
        command_flags_to_args(c);
    }
    let mut roles: Vec<Role> = spec
        .containers
        .iter()
        .map(|c| sidecar_role_of(c).unwrap_or(Role::Extra))
        .collect();

    // The socket as the sidecars see it, and the volume that holds it.
    let sidecar_socket = spec
        .containers
        .iter()
        .zip(&roles)
        .filter(|(_, r)| r.key() != "extra")
        .find_map(|(c, _)| {
            let s = sidecar_address(c)?;
            Some((volume_at(c, &s.dir), s))
        });
    let socket_volume = sidecar_socket.as_ref().and_then(|(v, _)| v.clone());

    // The driver: the candidate that mounts the sidecars' socket volume and
    // listens on a CSI endpoint; the rest are extra containers.
    let score = |c: &Container| {
        let mut s = 0;
        if let Some(v) = &socket_volume {
            if c.volume_mounts.iter().flatten().any(|m| &m.name == v) {
                s += 4;
            }
        }
        if let Some(ep) = driver_endpoint(c) {
            s += 2;
            if sidecar_socket
                .as_ref()
                .is_some_and(|(_, s)| s.file == ep.file)
            {
                s += 1;
            }
        }
        if c.name == CONTAINER_DRIVER {
            s += 8;
        }
        s
    };
    let best = spec
        .containers
        .iter()
        .enumerate()
        .filter(|(i, _)| roles[*i] == Role::Extra)
        .map(|(i, c)| (score(c), i))
        .filter(|(s, _)| *s > 0)
        // max_by_key keeps the last of equals; prefer the first.
        .fold(None::<(i32, usize)>, |best, (s, i)| match best {
            Some((bs, _)) if bs >= s => best,
            _ => Some((s, i)),
        });
    if let Some((_, i)) = best {
        roles[i] = Role::Driver;
    }

    // The socket as the driver sees it (its endpoint), else the sidecars'.
    let driver = best.map(|(_, i)| &spec.containers[i]);
    let socket = driver
        .and_then(driver_endpoint)
        .or_else(|| sidecar_socket.as_ref().map(|(_, s)| s.clone()));
    let socket_volume = socket_volume.or_else(|| {
        let s = socket.as_ref()?;
        volume_at(driver?, &s.dir)
    });
    Ok(Pod {
        object,
        template,
        spec,
        roles,
        socket,
        socket_volume,
    })
}

/// The input sorted by what each object is to the driver.
#[derive(Debug, Default)]
pub struct Inventory<'a> {
    pub controller: Option<Pod<'a>>,
    pub node: Option<Pod<'a>>,
    /// Workloads that are neither, with why.
    pub other_workloads: Vec<(&'a Object, OtherWorkload)>,
    /// Everything that is not a workload.
    pub objects: Vec<&'a Object>,
}

/// Why a workload is not the driver's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtherWorkload {
    /// A DaemonSet for Windows nodes.
    Windows,
    /// A second controller or node workload, or one without CSI containers.
    Unrelated,
}

const WORKLOAD_KINDS: &[&str] = &["Deployment", "StatefulSet", "DaemonSet"];
/// Kinds that run pods but are no driver workload.
const OTHER_POD_KINDS: &[&str] = &[
    "Job",
    "CronJob",
    "Pod",
    "ReplicaSet",
    "ReplicationController",
];

fn is_windows(pod: &Pod<'_>) -> bool {
    let selector = pod.spec.node_selector.clone().unwrap_or_default();
    selector
        .get("kubernetes.io/os")
        .or_else(|| selector.get("beta.kubernetes.io/os"))
        .is_some_and(|os| os == "windows")
}

/// Sorts the objects: the node DaemonSet runs the registrar (or, node-
/// locally, the provisioner); the controller is the Deployment or
/// StatefulSet that runs the provisioner, the attacher or a helper.
pub fn inventory(objects: &[Object]) -> Result<Inventory<'_>, ImportError> {
    let mut inv = Inventory::default();
    for object in objects {
        if OTHER_POD_KINDS.contains(&object.kind.as_str()) {
            inv.other_workloads.push((object, OtherWorkload::Unrelated));
            continue;
        }
        if !WORKLOAD_KINDS.contains(&object.kind.as_str()) {
            inv.objects.push(object);
            continue;
        }
        let pod = pod(object)?;
        let controllerish = pod.has(Role::Provisioner)
            || pod.has(Role::Attacher)
            || pod.roles.iter().any(|r| matches!(r, Role::Helper(_)));
        if object.kind == "DaemonSet" {
            let nodeish = pod.has(Role::Registrar) || pod.has(Role::Provisioner);
            if nodeish && is_windows(&pod) {
                inv.other_workloads.push((object, OtherWorkload::Windows));
            } else if nodeish && inv.node.is_none() {
                inv.node = Some(pod);
            } else {
                inv.other_workloads.push((object, OtherWorkload::Unrelated));
            }
        } else if controllerish && inv.controller.is_none() {
            inv.controller = Some(pod);
        } else {
            inv.other_workloads.push((object, OtherWorkload::Unrelated));
        }
    }
    let node = inv.node.as_ref().ok_or(ImportError::NoNodeDaemonSet)?;
    if node.driver().is_none() {
        return Err(ImportError::NoDriverContainer {
            object: node.object.id(),
        });
    }
    if let Some(c) = &inv.controller {
        if c.driver().is_none() {
            return Err(ImportError::NoDriverContainer {
                object: c.object.id(),
            });
        }
    }
    Ok(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_and_sockets() {
        assert_eq!(
            image_base("registry.k8s.io/sig-storage/csi-provisioner:v5.0.1"),
            "csi-provisioner"
        );
        assert_eq!(
            image_base("localhost:5000/x/livenessprobe@sha256:ab"),
            "livenessprobe"
        );
        assert_eq!(image_tag("localhost:5000/x/plugin:v1.2.3"), Some("v1.2.3"));
        assert_eq!(image_tag("localhost:5000/x/plugin"), None);
        assert_eq!(
            Socket::parse("unix:///csi/csi.sock"),
            Some(Socket {
                dir: "/csi".into(),
                file: "csi.sock".into()
            })
        );
        assert_eq!(
            Socket::parse("/var/lib/kubelet/plugins/x/csi.sock").map(|s| s.dir),
            Some("/var/lib/kubelet/plugins/x".into())
        );
        assert_eq!(Socket::parse("$(ADDRESS)"), None);
        let args: Vec<String> = ["-v", "5", "--csi-address=/a/b.sock"]
            .map(String::from)
            .to_vec();
        assert_eq!(flag_value(&args, &["v"]), Some("5"));
        assert_eq!(flag_value(&args, &["csi-address"]), Some("/a/b.sock"));
    }
}
