//! The driver container of both workloads: what they share goes into
//! `spec.driver`, what differs into `spec.controller` / `spec.node`
//! overrides. The operator wires the socket itself (`CSI_ENDPOINT`,
//! `KUBE_NODE_NAME`, `socket-dir` at `/csi`), so the driver's own socket
//! paths are rewritten to `/csi/<socketName>`.

use csiops_operator::render::{ENV_CSI_ENDPOINT, ENV_KUBE_NODE_NAME, HEALTHZ_PORT};
use k8s_openapi::api::core::v1::{Container, EnvVar, SecurityContext};
use serde_json::Value;

use super::classify::Socket;
use super::pod::{map_mounts, PodPlan};
use super::{Ctx, Workload};
use crate::report::{At, Gap, Outcome, Report, What};

/// Rewrites the driver's socket path to where the operator puts it:
/// `/csi/<file>`, `file` being the one socket name of the CR.
pub fn rewrite(text: &str, socket: Option<&Socket>, file: &str) -> String {
    match socket {
        Some(s) if s.dir != "/csi" || s.file != file => {
            text.replace(&format!("{}/{}", s.dir, s.file), &format!("/csi/{file}"))
        }
        _ => text.to_string(),
    }
}

/// What becomes of one env var of the driver.
enum EnvFate {
    Operator(&'static str),
    Carry(Box<EnvVar>),
}

fn env_fate(var: &EnvVar, socket: Option<&Socket>, file: &str) -> EnvFate {
    let field = var
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    if var.name == ENV_KUBE_NODE_NAME && field == Some("spec.nodeName") {
        return EnvFate::Operator("the operator sets KUBE_NODE_NAME from spec.nodeName");
    }
    let mut var = var.clone();
    if let Some(v) = &var.value {
        var.value = Some(rewrite(v, socket, file));
    }
    if var.name == ENV_CSI_ENDPOINT && var.value.as_deref() == Some(&format!("unix:///csi/{file}"))
    {
        return EnvFate::Operator("the operator sets CSI_ENDPOINT=unix:///csi/<socketName>");
    }
    EnvFate::Carry(Box::new(var))
}

struct Side<'a> {
    plan: &'a PodPlan,
    c: Container,
    args: Vec<String>,
    env: Vec<EnvFate>,
}

fn side<'a>(plan: &'a PodPlan, file: &str) -> Option<Side<'a>> {
    let c = plan.driver.clone()?;
    let socket = plan.socket.as_ref();
    let args = c
        .args
        .iter()
        .flatten()
        .map(|a| rewrite(a, socket, file))
        .collect();
    let env = c
        .env
        .iter()
        .flatten()
        .map(|e| env_fate(e, socket, file))
        .collect();
    Some(Side { plan, c, args, env })
}

fn carried(side: &Side<'_>) -> Vec<EnvVar> {
    side.env
        .iter()
        .filter_map(|f| match f {
            EnvFate::Carry(v) => Some((**v).clone()),
            EnvFate::Operator(_) => None,
        })
        .collect()
}

/// Merges the driver containers of the controller (if any) and the node
/// pods into `spec.driver` and the overrides, and accounts every part.
pub fn merge(ctx: &mut Ctx, ctl: Option<&PodPlan>, node: &PodPlan) {
    let file = node
        .socket
        .as_ref()
        .map_or(csiops_crds::DEFAULT_SOCKET_NAME, |s| s.file.as_str())
        .to_string();
    if file != csiops_crds::DEFAULT_SOCKET_NAME {
        ctx.spec.driver.socket_name = file.clone();
    }
    let Some(node_side) = side(node, &file) else {
        return;
    };
    let ctl_side = ctl.and_then(|c| side(c, &file));

    // Args: shared when equal, else the node's in spec.driver and the
    // controller's as its override.
    let same_args = ctl_side.as_ref().is_none_or(|c| c.args == node_side.args);
    ctx.spec.driver.args = node_side.args.clone();
    if let (false, Some(c)) = (same_args, &ctl_side) {
        ctx.spec.controller.driver.args = Some(c.args.clone());
    }
    // Env: variables equal in both are shared.
    let node_env = carried(&node_side);
    let ctl_env = ctl_side.as_ref().map(carried);
    let shared: Vec<EnvVar> = match &ctl_env {
        None => node_env.clone(),
        Some(c) => node_env.iter().filter(|v| c.contains(v)).cloned().collect(),
    };
    ctx.spec.driver.env = shared.clone();
    ctx.spec.node.driver.env = node_env
        .iter()
        .filter(|v| !shared.contains(v))
        .cloned()
        .collect();
    if let Some(c) = &ctl_env {
        ctx.spec.controller.driver.env =
            c.iter().filter(|v| !shared.contains(v)).cloned().collect();
    }
    // Resources: shared when equal, else per workload.
    let same_resources = ctl_side
        .as_ref()
        .is_none_or(|c| c.c.resources == node_side.c.resources);
    if same_resources {
        ctx.spec.driver.resources = node_side.c.resources.clone();
    } else {
        ctx.spec.node.driver.resources = node_side.c.resources.clone();
        if let Some(c) = &ctl_side {
            ctx.spec.controller.driver.resources = c.c.resources.clone();
        }
    }
    ctx.spec.driver.image_pull_policy = pull_policy(node_side.c.image_pull_policy.as_deref());

    for (s, w) in ctl_side
        .iter()
        .map(|s| (s, Workload::Controller))
        .chain([(&node_side, Workload::Node)])
    {
        let base_args = w == Workload::Node || same_args;
        account(ctx, s, w, base_args, same_resources, &shared, &node_side.c);
    }
}

pub fn pull_policy(p: Option<&str>) -> Option<csiops_crds::PullPolicy> {
    match p {
        Some("Always") => Some(csiops_crds::PullPolicy::Always),
        Some("IfNotPresent") => Some(csiops_crds::PullPolicy::IfNotPresent),
        Some("Never") => Some(csiops_crds::PullPolicy::Never),
        _ => None,
    }
}

/// The items of one side's driver container.
fn account(
    ctx: &mut Ctx,
    s: &Side<'_>,
    w: Workload,
    base_args: bool,
    same_resources: bool,
    shared_env: &[EnvVar],
    node: &Container,
) {
    let field = w.field();
    let c = &s.c;
    let at = s.plan.at(Some(&c.name));
    let image = c.image.clone().unwrap_or_default();
    let image_to = if w == Workload::Node || c.image == node.image {
        "spec.driver.image".to_string()
    } else {
        ctx.spec.controller.driver.image = Some(image.clone());
        "spec.controller.image".to_string()
    };
    ctx.push(
        &at,
        What::Container,
        c.name.clone(),
        Some(image),
        Outcome::mapped_note(
            image_to,
            "the driver container, named csi-driver by the operator",
        ),
    );
    let args_field = if base_args {
        "spec.driver.args"
    } else {
        "spec.controller.args"
    };
    for (i, (orig, new)) in c.args.iter().flatten().zip(&s.args).enumerate() {
        let outcome = if orig == new {
            Outcome::mapped(format!("{args_field}[{i}]"))
        } else {
            Outcome::mapped_note(
                format!("{args_field}[{i}]"),
                format!("socket path rewritten: {new}"),
            )
        };
        ctx.push(
            &at,
            What::Arg,
            format!("args[{i}]"),
            Some(orig.clone()),
            outcome,
        );
    }
    for (var, fate) in c.env.iter().flatten().zip(&s.env) {
        let outcome = match fate {
            EnvFate::Operator(why) => Outcome::replaced("the operator's driver env", *why),
            EnvFate::Carry(v) if shared_env.contains(v.as_ref()) => {
                Outcome::mapped("spec.driver.env")
            }
            EnvFate::Carry(_) => Outcome::mapped(format!("{field}.env")),
        };
        ctx.push(&at, What::Env, var.name.clone(), var.value.clone(), outcome);
    }
    for (i, e) in c.env_from.iter().flatten().enumerate() {
        let shown = serde_json::to_string(e).ok();
        ctx.push(
            &at,
            What::EnvFrom,
            format!("envFrom[{i}]"),
            shown,
            Outcome::gap(Gap::EnvFrom, ""),
        );
    }
    if c.resources.is_some() {
        let to = if same_resources {
            "spec.driver.resources".to_string()
        } else {
            format!("{field}.resources")
        };
        ctx.push(&at, What::Resources, "resources", None, Outcome::mapped(to));
    }
    if let Some(p) = &c.image_pull_policy {
        let outcome = if w == Workload::Controller && c.image_pull_policy != node.image_pull_policy
        {
            Outcome::gap(Gap::PullPolicyPerWorkload, "")
        } else {
            Outcome::mapped("spec.driver.imagePullPolicy")
        };
        ctx.push(
            &at,
            What::Field,
            "imagePullPolicy",
            Some(p.clone()),
            outcome,
        );
    }
    if let Some(cmd) = &c.command {
        ctx.push(
            &at,
            What::Field,
            "command",
            Some(cmd.join(" ")),
            Outcome::gap(Gap::DriverCommand, ""),
        );
    }
    security_context(ctx, &at, c, w);
    ports_and_probes(ctx, &at, c, s.plan.host_network, w);
    let (mounts, token) = map_mounts(
        &mut ctx.report,
        s.plan,
        c,
        &format!("{field}.volumeMounts"),
        false,
    );
    match w {
        Workload::Controller => ctx.spec.controller.driver.volume_mounts = mounts,
        Workload::Node => ctx.spec.node.driver.volume_mounts = mounts,
    }
    if token {
        ctx.spec.driver.mount_service_account_token = true;
    }
    leftover_fields(&mut ctx.report, &at, c, Gap::PodField);
}

/// The operator's default securityContext of node drivers.
fn is_node_default(sc: &SecurityContext) -> bool {
    let bare = SecurityContext {
        privileged: Some(true),
        allow_privilege_escalation: sc.allow_privilege_escalation,
        ..Default::default()
    };
    *sc == bare && sc.allow_privilege_escalation != Some(false)
}

fn security_context(ctx: &mut Ctx, at: &At<'_>, c: &Container, w: Workload) {
    let Some(mut sc) = c.security_context.clone() else {
        return;
    };
    // A driver run as a non-root user owns its socket, which csiops'
    // sidecars (uid 0, every capability dropped) cannot connect to: left
    // out, as the same keys of the pod's securityContext are.
    for (key, value) in [
        (
            "runAsUser",
            sc.run_as_user.filter(|u| *u != 0).map(|u| u.to_string()),
        ),
        (
            "runAsNonRoot",
            sc.run_as_non_root.filter(|n| *n).map(|n| n.to_string()),
        ),
    ] {
        if let Some(value) = value {
            match key {
                "runAsUser" => sc.run_as_user = None,
                _ => sc.run_as_non_root = None,
            }
            ctx.push(
                at,
                What::SecurityContext,
                format!("securityContext.{key}"),
                Some(value),
                Outcome::gap(Gap::NonRootDriver, format!("securityContext.{key}")),
            );
        }
    }
    if sc == SecurityContext::default() {
        return;
    }
    let shown = serde_json::to_string(&sc).ok();
    let outcome = match w {
        Workload::Node if is_node_default(&sc) => Outcome::replaced(
            "the operator's default for node drivers",
            "node drivers run privileged (the kubelet directory is mounted Bidirectional)",
        ),
        Workload::Node if sc.privileged != Some(true) => {
            let mut sc = sc;
            sc.privileged = Some(true);
            ctx.spec.node.driver.security_context = Some(sc);
            Outcome::mapped_note(
                "spec.node.securityContext",
                "with privileged: true added: the operator mounts the kubelet directory Bidirectional",
            )
        }
        Workload::Node => {
            ctx.spec.node.driver.security_context = Some(sc);
            Outcome::mapped("spec.node.securityContext")
        }
        Workload::Controller => {
            ctx.spec.controller.driver.security_context = Some(sc);
            Outcome::mapped("spec.controller.securityContext")
        }
    };
    ctx.push(at, What::SecurityContext, "securityContext", shown, outcome);
}

fn ports_and_probes(ctx: &mut Ctx, at: &At<'_>, c: &Container, host_network: bool, w: Workload) {
    let liveness = ctx.spec.sidecars.liveness_probe.enabled;
    let field = w.field();
    for p in c.ports.iter().flatten() {
        let key = p
            .name
            .clone()
            .unwrap_or_else(|| p.container_port.to_string());
        let health = p.container_port == HEALTHZ_PORT
            || p.name.as_deref().is_some_and(|n| n.contains("health"));
        let outcome = if health && liveness && !(host_network && p.container_port != HEALTHZ_PORT) {
            Outcome::replaced(
                "the operator's healthz port",
                format!("the liveness-probe sidecar serves the driver's health on {HEALTHZ_PORT}, declared by the operator"),
            )
        } else if health && host_network {
            // The liveness probe's own port on the host network: the
            // sidecars' ports move together from it (portBase).
            set_port_base(ctx, p.container_port)
        } else {
            let driver = match w {
                Workload::Controller => &mut ctx.spec.controller.driver,
                Workload::Node => &mut ctx.spec.node.driver,
            };
            let i = driver.ports.len();
            driver.ports.push(p.clone());
            Outcome::mapped(format!("{field}.ports[{i}]"))
        };
        ctx.push(
            at,
            What::Port,
            key,
            Some(p.container_port.to_string()),
            outcome,
        );
    }
    for (key, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if probe.is_none() {
            continue;
        }
        let outcome = if key == "livenessProbe" && liveness {
            Outcome::replaced(
                "the operator's liveness probe",
                "the driver is probed through the liveness-probe sidecar's /healthz",
            )
        } else {
            Outcome::gap(Gap::DriverProbes, key)
        };
        let shown = serde_json::to_string(probe).ok();
        ctx.push(at, What::Probe, key, shown, outcome);
    }
    if let Some(l) = &c.lifecycle {
        let shown = serde_json::to_string(l).ok();
        match w {
            Workload::Controller => ctx.spec.controller.driver.lifecycle = Some(l.clone()),
            Workload::Node => ctx.spec.node.driver.lifecycle = Some(l.clone()),
        }
        ctx.push(
            at,
            What::Field,
            "lifecycle",
            shown,
            Outcome::mapped(format!("{field}.lifecycle")),
        );
    }
}

/// A custom sidecar port of a hostNetwork driver: the sidecars' ports will
/// move together from `spec.sidecars.portBase`, chosen once every port is
/// known ([`choose_port_base`]).
pub(crate) fn set_port_base(ctx: &mut Ctx, port: i32) -> Outcome {
    ctx.port_candidates.push(port);
    Outcome::mapped_note(
        "spec.sidecars.portBase",
        "on the host network the sidecars' eight ports move together from portBase (the report's notes say which range); upstream's numbers are not kept",
    )
}

/// `spec.sidecars.portBase` from the custom sidecar ports seen: the lowest
/// of them, moved up past any port of the driver's own, so the range
/// `portBase..=portBase + 7` stays within what the upstream manifests
/// claimed as far as possible and never takes a driver port. Without any
/// (upstream kept the defaults), a hostNetwork driver gets a note: the
/// default range is shared by every such driver on a node.
pub(crate) fn choose_port_base(ctx: &mut Ctx) {
    let Some(mut base) = ctx.port_candidates.iter().copied().min() else {
        if ctx.spec.controller.pod.host_network || ctx.spec.node.pod.host_network {
            ctx.report.note(
                "hostNetwork: the sidecars listen on the nodes' ports 9808-9815 (spec.sidecars.portBase unset: upstream's defaults); every other hostNetwork driver on these nodes needs another free range of eight (its spec.sidecars.portBase)",
            );
        }
        return;
    };
    let own: Vec<i32> = ctx
        .spec
        .controller
        .driver
        .ports
        .iter()
        .chain(&ctx.spec.node.driver.ports)
        .map(|p| p.container_port)
        .collect();
    while let Some(&taken) = own.iter().filter(|p| (base..=base + 7).contains(*p)).max() {
        base = taken + 1;
    }
    if !(1024..=65520).contains(&base) {
        ctx.report.note(format!(
            "the sidecars' custom ports ({:?}) leave no range of eight free ports: set spec.sidecars.portBase yourself",
            ctx.port_candidates
        ));
        return;
    }
    ctx.spec.sidecars.port_base = Some(base);
    ctx.report.note(format!(
        "hostNetwork: the sidecars listen on {base}-{} (spec.sidecars.portBase: {base}, from upstream's {:?}); check that no other driver on the nodes uses these ports",
        base + 7,
        ctx.port_candidates
    ));
}

/// Container fields every mapping handles; the rest is accounted here.
const HANDLED: &[&str] = &[
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "env",
    "envFrom",
    "resources",
    "volumeMounts",
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "securityContext",
    "lifecycle",
];

/// Container fields no mapping handles: Kubernetes' defaults are not
/// needed, the rest is not representable (`gap`).
pub fn leftover_fields(report: &mut Report, at: &At<'_>, c: &Container, gap: Gap) {
    let Ok(Value::Object(map)) = serde_json::to_value(c) else {
        return;
    };
    for (key, value) in map {
        if HANDLED.contains(&key.as_str()) {
            continue;
        }
        let default = matches!(
            (key.as_str(), value.as_str()),
            ("terminationMessagePath", Some("/dev/termination-log"))
                | ("terminationMessagePolicy", Some("File"))
        );
        let outcome = if default {
            Outcome::not_needed("Kubernetes' default")
        } else {
            Outcome::gap(gap, format!("container field {key}"))
        };
        report.push(at, What::Field, key, Some(value.to_string()), outcome);
    }
}
