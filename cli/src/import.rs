//! `kubectl csiops import`: a driver's manifests → one CSIDriverDeployment
//! and the [`Report`] of every element of the input. Pure: the objects come
//! in (from files, stdin or the cluster), the CR and the report go out.
//!
//! - `classify`: which object and which container is what;
//! - `pod`: volumes, mounts, pod and workload settings, labels;
//! - `driver`: the driver container of both workloads, merged into
//!   `spec.driver` and per-workload overrides;
//! - `sidecars`: upstream sidecars replaced, helpers and extras mapped;
//! - `objects`: CSIDriver, classes, ServiceAccounts, RBAC and the rest;
//! - `flags`: sidecar flags against the operator's and the sidecars' parser.

mod adopt;
pub mod classify;
pub(crate) mod driver;
pub mod flags;
mod objects;
pub(crate) mod pod;
mod sidecars;

use std::collections::BTreeMap;

use csiops_crds::{CSIDriverDeployment, CSIDriverDeploymentSpec, Topology};
use csiops_operator::render::{RenderConfig, RenderError};
use kube::api::ObjectMeta;

use crate::input::Object;
use crate::report::{At, Gap, Outcome, Report, What};
use classify::{Inventory, Pod, Role};

/// Why an import could not produce a CR at all.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{object}: cannot read it as a Kubernetes object of its kind: {source}")]
    Invalid {
        object: String,
        source: serde_json::Error,
    },
    #[error("{object}: has no pod template spec")]
    NoPodSpec { object: String },
    #[error("no node DaemonSet in the input: a DaemonSet whose pods run node-driver-registrar (or, node-locally, csi-provisioner) is what a CSI driver's node plugin looks like")]
    NoNodeDaemonSet,
    #[error("{object}: no container looks like the CSI driver (one that listens on the socket the sidecars dial, e.g. --endpoint=unix:///csi/csi.sock)")]
    NoDriverContainer { object: String },
    #[error("cannot tell the driver's name: the input has no CSIDriver object, no --kubelet-registration-path and no --drivername; pass it with --driver")]
    NoDriverName,
    #[error("{object} runs in namespace {namespace}, the CR in {cr}: a takeover needs them in one namespace (the sidecars' leader-election Leases are); pass --namespace {namespace}")]
    AdoptionNamespace {
        object: String,
        namespace: String,
        cr: String,
    },
    #[error("cannot render the operator's sample to learn its sidecar flags: {0}")]
    Sample(#[from] RenderError),
}

/// What the user chose on the command line.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `metadata.name` of the CR; default: from the driver name.
    pub name: Option<String>,
    /// `metadata.namespace`; default: the workloads' namespace.
    pub namespace: Option<String>,
    /// The driver name when the input does not say it.
    pub driver_name: Option<String>,
    /// Take the input's running deployment over (`spec.adoption`).
    pub adopt: bool,
}

/// The CR and the report.
#[derive(Clone, Debug)]
pub struct Imported {
    pub cr: CSIDriverDeployment,
    pub report: Report,
}

/// Which workload of the CR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Controller,
    Node,
}

impl Workload {
    pub fn field(self) -> &'static str {
        match self {
            Workload::Controller => "spec.controller",
            Workload::Node => "spec.node",
        }
    }
}

/// The state of one import, shared by the mapping steps.
pub(crate) struct Ctx {
    pub spec: CSIDriverDeploymentSpec,
    pub report: Report,
    pub driver_name: String,
    pub cr_name: String,
    pub kubelet_dir: String,
    pub node_local: bool,
    pub ops: flags::OperatorArgs,
    /// `-v` of every upstream sidecar, with where it was seen.
    pub log_levels: Vec<(i32, String)>,
    /// Custom sidecar ports of a hostNetwork driver (see
    /// `driver::choose_port_base`).
    pub port_candidates: Vec<i32>,
}

impl Ctx {
    pub fn push(
        &mut self,
        at: &At<'_>,
        what: What,
        key: impl Into<String>,
        value: Option<String>,
        outcome: Outcome,
    ) {
        self.report.push(at, what, key, value, outcome);
    }
}

/// The render configuration `import` and `render` use, as the operator's
/// `main` builds it (its default sidecar image unless told otherwise).
pub fn render_config(sidecar_image: Option<&str>) -> RenderConfig {
    RenderConfig {
        sidecar_image: sidecar_image
            .map(str::to_string)
            .unwrap_or_else(csiops_operator::cli::default_sidecar_image),
        operator_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// The driver's name: the CSIDriver object's, else the registrar's
/// registration path's, else the driver's `--drivername`.
fn driver_name(inv: &Inventory<'_>, opts: &Options) -> Result<String, ImportError> {
    if let Some(name) = &opts.driver_name {
        return Ok(name.clone());
    }
    if let Some(o) = inv.objects.iter().find(|o| o.kind == "CSIDriver") {
        return Ok(o.name.clone());
    }
    let pods = inv.node.iter().chain(inv.controller.iter());
    for pod in pods {
        for (role, c) in pod.containers() {
            let args = c.args.clone().unwrap_or_default();
            let env = c.env.clone().unwrap_or_default();
            let found = match role {
                Role::Registrar => classify::flag_value(&args, &["kubelet-registration-path"])
                    .map(|p| classify::expand(p, &env))
                    .and_then(|p| {
                        let (_, rest) = p.split_once("/plugins/")?;
                        rest.split('/').next().map(str::to_string)
                    }),
                Role::Driver => {
                    classify::flag_value(&args, &["drivername", "driver-name", "drivername"])
                        .map(|v| classify::expand(v, &env))
                }
                _ => None,
            };
            if let Some(name) = found.filter(|n| !n.is_empty() && !n.contains('$')) {
                return Ok(name);
            }
        }
    }
    Err(ImportError::NoDriverName)
}

/// kubelet's root directory on the nodes, from the registrar's registration
/// path or the registration directory's hostPath.
fn kubelet_dir(node: &Pod<'_>, driver_name: &str) -> String {
    for (role, c) in node.containers() {
        if role != Role::Registrar {
            continue;
        }
        let args = c.args.clone().unwrap_or_default();
        let env = c.env.clone().unwrap_or_default();
        if let Some(p) = classify::flag_value(&args, &["kubelet-registration-path"]) {
            let p = classify::expand(p, &env);
            if let Some((dir, _)) = p.split_once(&format!("/plugins/{driver_name}/")) {
                if dir.starts_with('/') && !dir.contains('$') {
                    return dir.to_string();
                }
            }
        }
    }
    for v in node.spec.volumes.iter().flatten() {
        if let Some(hp) = &v.host_path {
            if let Some(dir) = hp
                .path
                .trim_end_matches('/')
                .strip_suffix("/plugins_registry")
            {
                return dir.to_string();
            }
        }
    }
    csiops_crds::DEFAULT_KUBELET_DIR.to_string()
}

/// A CR name from the driver name: DNS labels joined by `-`, at most
/// [`csiops_crds::MAX_NAME_LEN`] characters.
/// Kubernetes mounts the pod's ServiceAccount token into every container
/// unless the pod or its ServiceAccount says `automountServiceAccountToken:
/// false`; the operator mounts it only into containers that ask. When the
/// input grants its ServiceAccounts rules that csiops' sidecars do not use
/// (the driver's own RBAC, reported as not representable), the driver and
/// the extra containers of such a pod call the API with that token: they
/// keep it (`mountServiceAccountToken: true`), and a note says so.
fn driver_token(ctx: &mut Ctx, inv: &Inventory<'_>) {
    let driver_rbac = Gap::DriverRbac.info().why;
    let has_driver_rbac = ctx.report.items.iter().any(|i| {
        matches!(&i.outcome, Outcome::NotRepresentable { why, .. } if why.starts_with(driver_rbac))
    });
    if !has_driver_rbac {
        return;
    }
    let account_off = |pod: &Pod<'_>| {
        let name = pod
            .spec
            .service_account_name
            .as_deref()
            .unwrap_or("default");
        inv.objects.iter().any(|o| {
            o.kind == "ServiceAccount"
                && o.name == name
                && o.value["automountServiceAccountToken"] == serde_json::Value::Bool(false)
        })
    };
    let automounts = |pod: Option<&Pod<'_>>| {
        pod.filter(|p| p.spec.automount_service_account_token != Some(false) && !account_off(p))
            .map(|p| p.object.id())
    };
    let controller = automounts(inv.controller.as_ref());
    let node = automounts(inv.node.as_ref());
    let pods: Vec<String> = controller.iter().chain(node.iter()).cloned().collect();
    if pods.is_empty() {
        return;
    }
    let mut set = Vec::new();
    if !ctx.spec.driver.mount_service_account_token {
        ctx.spec.driver.mount_service_account_token = true;
        set.push("spec.driver.mountServiceAccountToken".to_string());
    }
    for (i, e) in ctx.spec.sidecars.extra.iter_mut().enumerate() {
        let automounted = match e.pod {
            csiops_crds::ExtraContainerPod::Controller => controller.is_some(),
            csiops_crds::ExtraContainerPod::Node => node.is_some(),
        };
        if automounted && !e.mount_service_account_token {
            e.mount_service_account_token = true;
            set.push(format!("spec.sidecars.extra[{i}].mountServiceAccountToken"));
        }
    }
    if !set.is_empty() {
        ctx.report.note(format!(
            "{}: true: Kubernetes mounts the ServiceAccount token into every container of {} (automountServiceAccountToken is not false), and the input grants rules csiops' sidecars do not use (the driver's own RBAC, listed as not representable), so the driver calls the API; bind those roles to the operator's ServiceAccounts, or set it false if only the sidecars need the API",
            set.join(", "),
            pods.join(" and ")
        ));
    }
}

fn cr_name(driver_name: &str) -> String {
    let mut name: String = driver_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    name.truncate(csiops_crds::MAX_NAME_LEN);
    name.trim_matches('-').to_string()
}

/// The minimal spec every import starts from: the CRD's defaults.
fn base_spec(
    driver_name: &str,
    image: &str,
    version: &str,
) -> Result<CSIDriverDeploymentSpec, ImportError> {
    serde_json::from_value(serde_json::json!({
        "driverName": driver_name,
        "version": version,
        "driver": {"image": image},
    }))
    .map_err(|source| ImportError::Invalid {
        object: "the CR's defaults".into(),
        source,
    })
}

/// Maps the objects to a CR and a report.
pub fn import(
    objects: &[Object],
    opts: &Options,
    cfg: &RenderConfig,
) -> Result<Imported, ImportError> {
    let inv = classify::inventory(objects)?;
    let driver_name = driver_name(&inv, opts)?;
    let node = inv.node.as_ref().ok_or(ImportError::NoNodeDaemonSet)?;
    let node_driver = node
        .driver()
        .ok_or_else(|| ImportError::NoDriverContainer {
            object: node.object.id(),
        })?;
    let image = node_driver.image.clone().unwrap_or_default();
    let version = classify::image_tag(&image).unwrap_or("unknown").to_string();
    let node_local = inv.controller.is_none() && node.has(Role::Provisioner);
    let namespace = opts
        .namespace
        .clone()
        .or_else(|| node.object.namespace.clone())
        .unwrap_or_else(|| "default".to_string());
    let name = opts.name.clone().unwrap_or_else(|| cr_name(&driver_name));

    let mut ctx = Ctx {
        spec: base_spec(&driver_name, &image, &version)?,
        report: Report::default(),
        kubelet_dir: kubelet_dir(node, &driver_name),
        driver_name,
        cr_name: name.clone(),
        node_local,
        ops: flags::OperatorArgs::from_operator(cfg)?,
        log_levels: Vec::new(),
        port_candidates: Vec::new(),
    };
    if version == "unknown" {
        ctx.report.note(format!(
            "the driver image {image} has no tag: spec.version is \"unknown\"; set the driver's version"
        ));
    }
    if node_local {
        ctx.spec.topology = Topology::NodeLocal;
        ctx.report.note("no controller workload and a provisioner in the node DaemonSet: topology NodeLocal (distributed provisioning)");
    }
    if inv.controller.is_none() && !node_local {
        ctx.spec.controller.replicas = 0;
        ctx.report.note("no controller workload and no provisioner in the node pods: a node-only driver, spec.controller.replicas: 0");
    }
    if ctx.kubelet_dir != csiops_crds::DEFAULT_KUBELET_DIR {
        ctx.spec.node.kubelet_dir = ctx.kubelet_dir.clone();
    }

    // The sidecars the input runs; the others are disabled.
    let runs = |role: Role| {
        inv.controller
            .iter()
            .chain(inv.node.iter())
            .any(|p| p.has(role))
    };
    for (role, on) in [
        (Role::Provisioner, runs(Role::Provisioner)),
        (Role::Attacher, runs(Role::Attacher)),
        (Role::Registrar, runs(Role::Registrar)),
        (Role::LivenessProbe, runs(Role::LivenessProbe)),
    ] {
        if !on {
            sidecars::spec_of(&mut ctx.spec.sidecars, role).enabled = false;
            ctx.report.note(format!(
                "the input runs no {}: spec.sidecars.{}.enabled: false",
                role.upstream_name(),
                role.key()
            ));
        }
    }

    let controller_side = inv
        .controller
        .as_ref()
        .map(|pod| pod::map_pod(&mut ctx, pod, Workload::Controller));
    let node_side = pod::map_pod(&mut ctx, node, Workload::Node);
    driver::merge(&mut ctx, controller_side.as_ref(), &node_side);
    for (pod, plan, w) in controller_side
        .iter()
        .map(|s| (inv.controller.as_ref(), s, Workload::Controller))
        .chain([(Some(node), &node_side, Workload::Node)])
    {
        if let Some(pod) = pod {
            sidecars::map_containers(&mut ctx, pod, plan, w);
        }
    }
    sidecars::log_level(&mut ctx);
    driver::choose_port_base(&mut ctx);
    for (object, why) in &inv.other_workloads {
        pod::other_workload(&mut ctx, object, *why);
    }
    objects::map_objects(&mut ctx, &inv.objects, &inv);
    driver_token(&mut ctx, &inv);

    // The report in the input's order, each object's items together.
    let order: BTreeMap<String, usize> = objects
        .iter()
        .enumerate()
        .map(|(i, o)| (o.id(), i))
        .rev()
        .collect();
    ctx.report
        .items
        .sort_by_key(|item| order.get(&item.object).copied().unwrap_or(usize::MAX));

    if opts.adopt {
        let (adoption, notes) = adopt::adoption(&inv, &namespace)?;
        for n in notes {
            ctx.report.note(n);
        }
        if !ctx.spec.storage_classes.is_empty() {
            ctx.report.note(format!(
                "--adopt: spec.storageClasses left out ({}): the running classes stay as they are and keep provisioning through the new deployment; the operator does not take classes over",
                ctx.spec
                    .storage_classes
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            ctx.spec.storage_classes.clear();
        }
        ctx.report.note(
            "--adopt: spec.adoption names the running workloads; applying the CR takes them over without a volume outage (docs/adoption.md)",
        );
        ctx.spec.adoption = Some(adoption);
    }

    let cr = CSIDriverDeployment {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            ..Default::default()
        },
        spec: ctx.spec,
        status: None,
    };
    Ok(Imported {
        cr,
        report: ctx.report,
    })
}

/// Fields that stay even when they equal the default: the CRD requires them.
const REQUIRED: &[&str] = &["driverName", "version", "driver", "image"];

/// Removes from `value` what equals `default` (recursively), so the CR
/// says only what differs from the CRD's defaults. YAML values keep the
/// fields in the types' order.
fn prune(value: &mut serde_yaml::Value, default: &serde_yaml::Value) {
    let (Some(map), Some(def)) = (value.as_mapping_mut(), default.as_mapping()) else {
        return;
    };
    let required = |k: &serde_yaml::Value| k.as_str().is_some_and(|k| REQUIRED.contains(&k));
    map.retain(|k, v| required(k) || def.get(k) != Some(v));
    for (k, v) in map.iter_mut() {
        if let Some(d) = def.get(k) {
            prune(v, d);
        }
    }
    map.retain(|k, v| required(k) || !v.as_mapping().is_some_and(|m| m.is_empty()));
}

/// The CR as YAML for stdout: without status, and without the fields that
/// equal the CRD's defaults.
pub fn cr_yaml(cr: &CSIDriverDeployment) -> Result<String, serde_yaml::Error> {
    let mut value = serde_yaml::to_value(cr)?;
    let default = base_spec(
        &cr.spec.driver_name,
        &cr.spec.driver.image,
        &cr.spec.version,
    )
    .ok()
    .and_then(|d| serde_yaml::to_value(d).ok());
    if let Some(map) = value.as_mapping_mut() {
        map.remove("status");
        if let (Some(spec), Some(default)) = (map.get_mut("spec"), default) {
            prune(spec, &default);
        }
    }
    serde_yaml::to_string(&value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cr_names_fit() {
        assert_eq!(cr_name("ebs.csi.aws.com"), "ebs-csi-aws-com");
        let long = "a".repeat(60) + ".example.com";
        assert_eq!(cr_name(&long).len(), csiops_crds::MAX_NAME_LEN);
    }
}
