//! `kubectl csiops diff`: the differences that matter between a driver's
//! manifests and what a CSIDriverDeployment renders.
//!
//! Both sides are classified by the same code as `import` (which container
//! is the driver, which a sidecar) and reduced to a view of what matters:
//! per workload, each container's args, env, mounts, ports and security
//! context, and the pod's volumes, tolerations, affinity, nodeSelector,
//! priority class and host namespaces; the CSIDriver spec; the
//! StorageClasses; the RBAC rules. What the operator sets itself is left
//! out of both views: the sidecars' images, the flags it manages or sets
//! to the same value, its socket wiring, its volumes and the documented
//! defaults (priority classes, the liveness probe in both pods).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use csiops_crds::{CSIDriverDeployment, CsiDriverObjectSpec};
use csiops_operator::render::rbac::shipped_role;
use csiops_operator::render::{RenderConfig, HEALTHZ_PORT};
use k8s_openapi::api::core::v1::{Container, EnvVar};
use serde_json::{json, Value};

use crate::import::classify::{self, Inventory, Pod, Role};
use crate::import::driver::rewrite as socket_rewrite;
use crate::import::flags::{self, Check, OperatorArgs};
use crate::import::pod::{plan_volumes, Fate};
use crate::import::{ImportError, Workload};
use crate::input::{InputError, Object, Origin};
use crate::render_cmd::{render_values, RenderCmdError};

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("the manifests: {0}")]
    Input(#[source] ImportError),
    #[error("what the CR renders: {0}")]
    Rendered(#[source] ImportError),
    #[error(transparent)]
    Render(#[from] RenderCmdError),
    #[error(transparent)]
    Object(#[from] InputError),
}

/// One difference: where, and the values on each side (`-` input, `+`
/// what csiops renders).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub section: String,
    pub field: String,
    pub input: Vec<String>,
    pub rendered: Vec<String>,
}

/// A container reduced to what matters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ContainerView {
    args: Vec<String>,
    env: BTreeMap<String, String>,
    mounts: BTreeMap<String, String>,
    ports: BTreeSet<String>,
    security_context: Option<String>,
}

/// A pod reduced to what matters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct PodView {
    containers: BTreeMap<String, ContainerView>,
    init_containers: BTreeSet<String>,
    volumes: BTreeSet<String>,
    tolerations: BTreeSet<String>,
    affinity: Option<String>,
    node_selector: BTreeMap<String, String>,
    priority_class: Option<String>,
    host_network: bool,
    host_pid: bool,
}

struct Env<'a> {
    ops: &'a OperatorArgs,
    /// The CR's socket file name.
    socket_file: String,
    kubelet_dir: String,
    driver_name: String,
    node_local: bool,
}

fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn literal_env(c: &Container) -> Vec<EnvVar> {
    c.env.clone().unwrap_or_default()
}

/// The operator's own env of the driver and sidecars.
fn operator_env(var: &EnvVar, socket_file: &str) -> bool {
    let field = var
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    match var.name.as_str() {
        "CSI_ENDPOINT" => var.value.as_deref() == Some(&format!("unix:///csi/{socket_file}")),
        "KUBE_NODE_NAME" | "NODE_NAME" => field == Some("spec.nodeName"),
        "NAMESPACE" => field == Some("metadata.namespace"),
        "CSIOPS_DRIVER_NAME" => true,
        "POD_NAME" => field == Some("metadata.name"),
        _ => false,
    }
}

fn sidecar_args(env: &Env<'_>, role: Role, c: &Container) -> (Vec<String>, BTreeSet<String>) {
    let args = c.args.clone().unwrap_or_default();
    let groups = flags::split(role, &args);
    let managed = role.managed_flags();
    let mut kept = Vec::new();
    let mut dropped_refs = BTreeSet::new();
    let keep: Vec<&flags::FlagGroup> = groups
        .iter()
        .filter(|g| {
            let Some(name) = g.name.as_deref() else {
                return false;
            };
            let same = env
                .ops
                .value_of(role, env.node_local, name)
                .is_some_and(|v| flags::same_value(g.value.as_deref(), v.as_deref()));
            let drop = name == "v" || managed.contains(&name) || same;
            if drop {
                for t in &g.tokens {
                    if let Some(start) = t.find("$(") {
                        if let Some(end) = t[start..].find(')') {
                            dropped_refs.insert(t[start + 2..start + end].to_string());
                        }
                    }
                }
            }
            !drop
        })
        .collect();
    let owned: Vec<flags::FlagGroup> = keep.iter().map(|g| (*g).clone()).collect();
    let checks = flags::check(role, env.ops.of(role, env.node_local), &owned);
    for (g, check) in owned.iter().zip(checks) {
        if check != Check::Ignored {
            let value = g
                .value
                .as_deref()
                .map(|v| format!("={v}"))
                .unwrap_or_default();
            kept.push(format!(
                "--{}{value}",
                g.name.as_deref().unwrap_or_default()
            ));
        }
    }
    kept.sort();
    (kept, dropped_refs)
}

fn container_view(
    env: &Env<'_>,
    pod: &Pod<'_>,
    fates: &BTreeMap<String, Fate>,
    role: Role,
    c: &Container,
) -> ContainerView {
    let socket = pod.socket.as_ref();
    let file = env.socket_file.as_str();
    let literal = literal_env(c);
    let (args, dropped_refs) = match role {
        Role::Driver | Role::Extra => (
            c.args
                .iter()
                .flatten()
                .map(|a| socket_rewrite(&classify::expand(a, &literal), socket, file))
                .collect(),
            BTreeSet::new(),
        ),
        _ => sidecar_args(env, role, c),
    };
    let sidecar = !matches!(role, Role::Driver | Role::Extra);
    let env_view = literal
        .iter()
        .map(|v| {
            let mut v = v.clone();
            v.value = v.value.map(|x| socket_rewrite(&x, socket, file));
            v
        })
        .filter(|v| role == Role::Extra || !operator_env(v, file))
        .filter(|v| !(sidecar && dropped_refs.contains(&v.name)))
        .map(|v| (v.name.clone(), json(&v)))
        .chain(
            c.env_from
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, e)| (format!("envFrom[{i}]"), json(e))),
        )
        .collect();
    let volumes: BTreeMap<String, Value> = pod
        .spec
        .volumes
        .iter()
        .flatten()
        .map(|v| {
            let mut source = serde_json::to_value(v).unwrap_or_default();
            if let Some(o) = source.as_object_mut() {
                o.remove("name");
            }
            (v.name.clone(), source)
        })
        .collect();
    let mounts = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| {
            matches!(fates.get(&m.name), Some(Fate::User { .. }))
                || role == Role::Extra && m.mount_path != "/csi"
        })
        .filter(|m| !matches!(fates.get(&m.name), Some(Fate::Token)))
        .map(|m| {
            let source = match fates.get(&m.name) {
                Some(Fate::Managed { name, .. }) => json!(name),
                _ => volumes.get(&m.name).cloned().unwrap_or_default(),
            };
            let detail = json!({"source": source, "readOnly": m.read_only.unwrap_or(false),
                "propagation": m.mount_propagation, "subPath": m.sub_path});
            (
                m.mount_path.trim_end_matches('/').to_string(),
                detail.to_string(),
            )
        })
        .collect();
    let ports = if role == Role::Driver {
        c.ports
            .iter()
            .flatten()
            // The driver's health port is the liveness-probe sidecar's, the
            // operator's (9808, or moved by spec.sidecars.portBase).
            .filter(|p| {
                let health = p.container_port == HEALTHZ_PORT
                    || p.name.as_deref().is_some_and(|n| n.contains("health"));
                !health
            })
            .map(|p| {
                format!(
                    "{}/{}",
                    p.container_port,
                    p.protocol.as_deref().unwrap_or("TCP")
                )
            })
            .collect()
    } else {
        BTreeSet::new()
    };
    let security_context = match role {
        Role::Driver | Role::Extra => c.security_context.clone().map(|mut sc| {
            if sc.privileged == Some(true) && sc.allow_privilege_escalation.is_none() {
                sc.allow_privilege_escalation = Some(true);
            }
            json(&sc)
        }),
        _ => None,
    };
    ContainerView {
        args,
        env: env_view,
        mounts,
        ports,
        security_context,
    }
}

fn pod_view(env: &Env<'_>, pod: &Pod<'_>, w: Workload) -> PodView {
    let fates = plan_volumes(pod, w, &env.kubelet_dir, &env.driver_name);
    let mut containers = BTreeMap::new();
    for (role, c) in pod.containers() {
        let key = match role {
            Role::Extra => format!("extra {}", c.name.trim_end_matches("-extra")),
            r => r.key().to_string(),
        };
        containers.insert(key, container_view(env, pod, &fates, role, c));
    }
    let default_class = match w {
        Workload::Controller => csiops_crds::DEFAULT_CONTROLLER_PRIORITY_CLASS,
        Workload::Node => csiops_crds::DEFAULT_NODE_PRIORITY_CLASS,
    };
    let s = &pod.spec;
    PodView {
        containers,
        init_containers: s.init_containers.iter().flatten().map(json).collect(),
        volumes: pod
            .spec
            .volumes
            .iter()
            .flatten()
            .filter(|v| matches!(fates.get(&v.name), Some(Fate::User { .. })))
            .map(|v| {
                let mut source = serde_json::to_value(v).unwrap_or_default();
                if let Some(o) = source.as_object_mut() {
                    o.remove("name");
                }
                source.to_string()
            })
            .collect(),
        tolerations: s
            .tolerations
            .iter()
            .flatten()
            .filter(|t| {
                !t.key
                    .as_deref()
                    .is_some_and(|k| k.starts_with("csiops.dev/"))
            })
            .map(json)
            .collect(),
        affinity: s.affinity.as_ref().map(json),
        node_selector: s.node_selector.clone().unwrap_or_default(),
        priority_class: Some(
            s.priority_class_name
                .clone()
                .unwrap_or_else(|| default_class.to_string()),
        ),
        host_network: s.host_network == Some(true),
        host_pid: s.host_pid == Some(true),
    }
}

fn lines<T: std::fmt::Debug>(v: &T) -> Vec<String> {
    vec![format!("{v:?}")]
}

fn compare_pods(out: &mut Vec<Difference>, section: &str, a: &PodView, b: &PodView) {
    let mut push = |field: String, input: Vec<String>, rendered: Vec<String>| {
        out.push(Difference {
            section: section.to_string(),
            field,
            input,
            rendered,
        })
    };
    let keys: BTreeSet<&String> = a.containers.keys().chain(b.containers.keys()).collect();
    for key in keys {
        match (a.containers.get(key), b.containers.get(key)) {
            (Some(x), Some(y)) => {
                let c = format!("container {key}");
                if x.args != y.args {
                    push(format!("{c} args"), x.args.clone(), y.args.clone());
                }
                for (name, (l, r)) in pairs(&x.env, &y.env) {
                    push(format!("{c} env {name}"), l, r);
                }
                for (path, (l, r)) in pairs(&x.mounts, &y.mounts) {
                    push(format!("{c} mount {path}"), l, r);
                }
                if x.ports != y.ports {
                    push(
                        format!("{c} ports"),
                        x.ports.iter().cloned().collect(),
                        y.ports.iter().cloned().collect(),
                    );
                }
                if x.security_context != y.security_context {
                    push(
                        format!("{c} securityContext"),
                        x.security_context.iter().cloned().collect(),
                        y.security_context.iter().cloned().collect(),
                    );
                }
            }
            // The liveness probe runs in both pods (documented).
            _ if key == "livenessProbe" => {}
            (x, y) => push(
                format!("container {key}"),
                x.map(|_| vec!["present".to_string()]).unwrap_or_default(),
                y.map(|_| vec!["present".to_string()]).unwrap_or_default(),
            ),
        }
    }
    if a.init_containers != b.init_containers {
        push(
            "initContainers".into(),
            a.init_containers.iter().cloned().collect(),
            b.init_containers.iter().cloned().collect(),
        );
    }
    if a.volumes != b.volumes {
        push(
            "volumes".into(),
            a.volumes.difference(&b.volumes).cloned().collect(),
            b.volumes.difference(&a.volumes).cloned().collect(),
        );
    }
    if a.tolerations != b.tolerations {
        push(
            "tolerations".into(),
            a.tolerations.difference(&b.tolerations).cloned().collect(),
            b.tolerations.difference(&a.tolerations).cloned().collect(),
        );
    }
    if a.affinity != b.affinity {
        push(
            "affinity".into(),
            a.affinity.iter().cloned().collect(),
            b.affinity.iter().cloned().collect(),
        );
    }
    for (k, (l, r)) in pairs(&a.node_selector, &b.node_selector) {
        push(format!("nodeSelector {k}"), l, r);
    }
    if a.priority_class != b.priority_class {
        push(
            "priorityClassName".into(),
            a.priority_class.iter().cloned().collect(),
            b.priority_class.iter().cloned().collect(),
        );
    }
    if (a.host_network, a.host_pid) != (b.host_network, b.host_pid) {
        push(
            "hostNetwork, hostPID".into(),
            lines(&(a.host_network, a.host_pid)),
            lines(&(b.host_network, b.host_pid)),
        );
    }
}

/// One key whose values differ: each side's value (absent: empty).
type Pair = (String, (Vec<String>, Vec<String>));

/// A rule as `(apiGroup, resource, verb)`.
type Rule = (String, String, String);

/// Keys whose values differ, with each side's value (absent: empty).
fn pairs(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<Pair> {
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            (
                (*k).clone(),
                (
                    a.get(k).cloned().into_iter().collect(),
                    b.get(k).cloned().into_iter().collect(),
                ),
            )
        })
        .collect()
}

fn csi_driver_view(objects: &[Object]) -> Option<String> {
    let o = objects.iter().find(|o| o.kind == "CSIDriver")?;
    let mut spec: CsiDriverObjectSpec = serde_json::from_value(o.value["spec"].clone()).ok()?;
    if spec.volume_lifecycle_modes.is_empty() {
        spec.volume_lifecycle_modes = vec![csiops_crds::VolumeLifecycleMode::Persistent];
    }
    if spec.fs_group_policy.is_none() {
        spec.fs_group_policy = Some(csiops_crds::FsGroupPolicy::ReadWriteOnceWithFSType);
    }
    Some(json(&spec))
}

fn class_views(objects: &[Object], driver: &str) -> BTreeMap<String, String> {
    objects
        .iter()
        .filter(|o| o.kind == "StorageClass" && o.value["provisioner"] == driver)
        .map(|o| {
            let v = &o.value;
            let view = json!({
                "parameters": v["parameters"].as_object().cloned().unwrap_or_default(),
                "reclaimPolicy": v["reclaimPolicy"].as_str().unwrap_or("Delete"),
                "volumeBindingMode": v["volumeBindingMode"].as_str().unwrap_or("Immediate"),
                "allowVolumeExpansion": v["allowVolumeExpansion"].as_bool().unwrap_or(false),
                "mountOptions": v["mountOptions"].as_array().cloned().unwrap_or_default(),
                "allowedTopologies": v["allowedTopologies"],
                "default": v["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true",
            });
            (o.name.clone(), view.to_string())
        })
        .collect()
}

/// RBAC as a set of `group/resource verb`, of the input's roles and of the
/// shipped roles the rendered bindings name.
fn rbac_input(objects: &[Object]) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for o in objects
        .iter()
        .filter(|o| o.kind == "ClusterRole" || o.kind == "Role")
    {
        for rule in o.value["rules"].as_array().into_iter().flatten() {
            let strs = |k: &str| -> Vec<String> {
                rule[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            };
            for g in strs("apiGroups") {
                for r in strs("resources") {
                    for v in strs("verbs") {
                        out.insert((g.clone(), r.clone(), v));
                    }
                }
            }
        }
    }
    out
}

fn rbac_rendered(objects: &[Object]) -> (BTreeSet<Rule>, BTreeSet<(String, String)>) {
    let mut granted = BTreeSet::new();
    let mut domain = BTreeSet::new();
    for role in csiops_operator::render::rbac::SHIPPED_ROLES {
        for g in role.grants {
            domain.insert((g.api_group.to_string(), g.resource.to_string()));
        }
    }
    for o in objects.iter().filter(|o| o.kind.ends_with("RoleBinding")) {
        if let Some(role) = o.value["roleRef"]["name"].as_str().and_then(shipped_role) {
            for g in role.grants {
                for v in g.verbs {
                    granted.insert((
                        g.api_group.to_string(),
                        g.resource.to_string(),
                        v.to_string(),
                    ));
                }
            }
        }
    }
    (granted, domain)
}

/// Compares the manifests with what `cr` renders.
pub fn diff(
    input: &[Object],
    cr: &CSIDriverDeployment,
    cfg: &RenderConfig,
) -> Result<Vec<Difference>, DiffError> {
    let rendered: Vec<Object> = render_values(cr, cfg)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            Object::from_value(
                v,
                Origin {
                    source: "rendered".into(),
                    doc: i + 1,
                },
            )
        })
        .collect::<Result<_, _>>()?;
    let inv_in = classify::inventory(input).map_err(DiffError::Input)?;
    let inv_out = classify::inventory(&rendered).map_err(DiffError::Rendered)?;
    let ops = OperatorArgs::from_operator(cfg).map_err(DiffError::Rendered)?;
    let node_local = cr.spec.topology == csiops_crds::Topology::NodeLocal;
    let env = Env {
        ops: &ops,
        socket_file: cr.spec.driver.socket_name.clone(),
        kubelet_dir: cr.spec.node.kubelet_dir.clone(),
        driver_name: cr.spec.driver_name.clone(),
        node_local,
    };
    let mut out = Vec::new();
    let view = |inv: &Inventory<'_>, w: Workload| match w {
        Workload::Controller => inv.controller.as_ref().map(|p| pod_view(&env, p, w)),
        Workload::Node => inv.node.as_ref().map(|p| pod_view(&env, p, w)),
    };
    for (w, section) in [
        (Workload::Controller, "controller"),
        (Workload::Node, "node"),
    ] {
        match (view(&inv_in, w), view(&inv_out, w)) {
            (Some(a), Some(b)) => compare_pods(&mut out, section, &a, &b),
            (None, None) => {}
            (a, b) => out.push(Difference {
                section: section.into(),
                field: "workload".into(),
                input: a.map(|_| vec!["present".into()]).unwrap_or_default(),
                rendered: b.map(|_| vec!["present".into()]).unwrap_or_default(),
            }),
        }
    }
    if let (Some(a), Some(b)) = (csi_driver_view(input), csi_driver_view(&rendered)) {
        if a != b {
            out.push(Difference {
                section: "CSIDriver".into(),
                field: "spec".into(),
                input: vec![a],
                rendered: vec![b],
            });
        }
    }
    let (ca, cb) = (
        class_views(input, &cr.spec.driver_name),
        class_views(&rendered, &cr.spec.driver_name),
    );
    for (name, (l, r)) in pairs(&ca, &cb) {
        out.push(Difference {
            section: "StorageClass".into(),
            field: name,
            input: l,
            rendered: r,
        });
    }
    let (granted, domain) = rbac_rendered(&rendered);
    let missing: Vec<String> = rbac_input(input)
        .into_iter()
        .filter(|(g, r, v)| {
            !granted.contains(&(g.clone(), r.clone(), v.clone()))
                && !domain.contains(&(g.clone(), r.clone()))
        })
        .map(|(g, r, v)| {
            format!(
                "{}{r} {v}",
                if g.is_empty() {
                    String::new()
                } else {
                    format!("{g}/")
                }
            )
        })
        .collect();
    if !missing.is_empty() {
        out.push(Difference {
            section: "RBAC".into(),
            field: "rules the driver's own roles grant".into(),
            input: missing,
            rendered: Vec::new(),
        });
    }
    Ok(out)
}

/// The differences for a reader, `-` input and `+` csiops, grouped by section.
pub fn to_text(diffs: &[Difference]) -> String {
    if diffs.is_empty() {
        return "No differences that matter.\n".to_string();
    }
    let mut out = String::from("--- input manifests\n+++ what csiops renders\n");
    let mut section = "";
    for d in diffs {
        if d.section != section {
            let _ = writeln!(out, "{}:", d.section);
            section = &d.section;
        }
        let _ = writeln!(out, "  {}:", d.field);
        for l in &d.input {
            let _ = writeln!(out, "    - {l}");
        }
        for r in &d.rendered {
            let _ = writeln!(out, "    + {r}");
        }
    }
    let _ = writeln!(out, "{} difference(s).", diffs.len());
    out
}
