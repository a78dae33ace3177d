//! The containers beside the driver: upstream kubernetes-csi sidecars
//! (csi-provisioner, csi-attacher, node-driver-registrar, livenessprobe)
//! are replaced by csiops' own, their flags carried into `extraArgs` unless
//! the operator manages them or sets the same itself; the upstream helpers
//! (resizer, snapshotter, health monitor) map to `spec.sidecars.<helper>`
//! with their image; anything else becomes `spec.sidecars.extra`.

use std::collections::BTreeSet;

use csiops_crds::{ExtraContainer, ExtraContainerPod, HelperSpec, SidecarSpec, SidecarsSpec};
use csiops_operator::render::names::MANAGED_CONTAINERS;
use csiops_operator::render::validate::NODE_NAME_ENV;
use csiops_operator::render::Helper;
use k8s_openapi::api::core::v1::{Container, EnvVar, VolumeMount};

use super::classify::{Pod, Role};
use super::driver::{leftover_fields, pull_policy, rewrite};
use super::flags::{self, Check, FlagGroup};
use super::pod::{map_mounts, PodPlan};
use super::{Ctx, Workload};
use crate::report::{At, Gap, Outcome, What};

/// `spec.sidecars.<role>` of a bundled sidecar.
pub fn spec_of(sidecars: &mut SidecarsSpec, role: Role) -> &mut SidecarSpec {
    match role {
        Role::Attacher => &mut sidecars.attacher,
        Role::Registrar => &mut sidecars.registrar,
        Role::LivenessProbe => &mut sidecars.liveness_probe,
        _ => &mut sidecars.provisioner,
    }
}

fn helper_of(sidecars: &mut SidecarsSpec, helper: Helper) -> &mut HelperSpec {
    match helper {
        Helper::Resizer => &mut sidecars.resizer,
        Helper::Snapshotter => &mut sidecars.snapshotter,
        Helper::HealthMonitor => &mut sidecars.health_monitor,
    }
}

/// Maps every container of the pod but the driver (see `driver`).
pub fn map_containers(ctx: &mut Ctx, pod: &Pod<'_>, plan: &PodPlan, w: Workload) {
    for (role, c) in pod.containers() {
        match role {
            Role::Driver => {}
            Role::Extra => extra(ctx, plan, c, w),
            Role::Helper(h) => helper(ctx, plan, c, h),
            _ => bundled(ctx, plan, c, role),
        }
    }
}

/// `spec.logLevel` from the sidecars' `-v`.
pub fn log_level(ctx: &mut Ctx) {
    let levels: BTreeSet<i32> = ctx.log_levels.iter().map(|(l, _)| *l).collect();
    if let Some(max) = levels.iter().max() {
        ctx.spec.log_level = (*max).clamp(0, 10);
        if levels.len() > 1 {
            let seen: Vec<String> = ctx
                .log_levels
                .iter()
                .map(|(l, w)| format!("{w}: {l}"))
                .collect();
            ctx.report.note(format!(
                "the sidecars' -v differ ({}): spec.logLevel {} applies to all of them",
                seen.join(", "),
                ctx.spec.log_level
            ));
        }
    }
}

/// What becomes of one flag group.
enum Decision {
    Managed,
    LogLevel,
    Same(String),
    Port(String),
    Carry,
    Positional,
}

fn port_of(value: &str) -> Option<&str> {
    value.rsplit(':').next().filter(|p| !p.is_empty())
}

fn decide(ctx: &Ctx, role: Role, group: &FlagGroup, host_network: bool) -> Decision {
    let Some(name) = group.name.as_deref() else {
        return Decision::Positional;
    };
    if name == "v" {
        return Decision::LogLevel;
    }
    let port_flag = matches!(name, "http-endpoint" | "health-port" | "metrics-address");
    if port_flag && host_network {
        let ours = ctx
            .ops
            .value_of(role, ctx.node_local, "http-endpoint")
            .flatten()
            .unwrap_or_default();
        let theirs = group.value.as_deref().and_then(port_of);
        if theirs.is_some() && theirs != port_of(&ours) {
            return Decision::Port(ours);
        }
    }
    if role.managed_flags().contains(&name) {
        return Decision::Managed;
    }
    match ctx.ops.value_of(role, ctx.node_local, name) {
        Some(v) if flags::same_value(group.value.as_deref(), v.as_deref()) => {
            Decision::Same(group.tokens.join(" "))
        }
        _ => Decision::Carry,
    }
}

/// Variables a set of groups references as `$(VAR)`.
fn refs(groups: &[&FlagGroup]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for token in groups.iter().flat_map(|g| g.tokens.iter()) {
        let mut rest = token.as_str();
        while let Some(start) = rest.find("$(") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            out.insert(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// Maps the args of a sidecar or helper; returns the carried tokens and
/// the variables only dropped flags use.
fn map_args(
    ctx: &mut Ctx,
    plan: &PodPlan,
    c: &Container,
    role: Role,
) -> (Vec<String>, BTreeSet<String>) {
    let at = plan.at(Some(&c.name));
    let args = c.args.clone().unwrap_or_default();
    let groups = flags::split(role, &args);
    let decisions: Vec<Decision> = groups
        .iter()
        .map(|g| decide(ctx, role, g, plan.host_network))
        .collect();
    let carried: Vec<FlagGroup> = groups
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| matches!(d, Decision::Carry))
        .map(|(g, _)| g.clone())
        .collect();
    let mut checks = flags::check(role, ctx.ops.of(role, ctx.node_local), &carried).into_iter();
    let key = role.key();
    let existing = match role {
        Role::Helper(h) => helper_of(&mut ctx.spec.sidecars, h).extra_args.clone(),
        _ => spec_of(&mut ctx.spec.sidecars, role).extra_args.clone(),
    };
    let mut extra_args = existing.clone();
    let mut dropped: Vec<&FlagGroup> = Vec::new();
    let mut kept: Vec<&FlagGroup> = Vec::new();
    let sidecar = role.sidecar_role().map_or_else(
        || role.upstream_name().to_string(),
        |r| format!("csiops-sidecar {r}"),
    );
    for (group, decision) in groups.iter().zip(&decisions) {
        let outcome = match decision {
            Decision::Positional if c.image.as_deref().is_some_and(|i| i.contains("csiops")) => {
                Outcome::replaced(sidecar.clone(), "the role, set by the operator")
            }
            Decision::Positional => Outcome::replaced(
                sidecar.clone(),
                "a positional argument, which the sidecar does not take",
            ),
            Decision::LogLevel => {
                let level = group
                    .value
                    .as_deref()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(2);
                ctx.log_levels.push((level, c.name.clone()));
                Outcome::mapped_note("spec.logLevel", "the sidecars' -v")
            }
            Decision::Managed => Outcome::replaced(
                sidecar.clone(),
                "a flag the operator manages (it sets it itself and refuses it in extraArgs)",
            ),
            Decision::Same(t) => {
                Outcome::replaced(sidecar.clone(), format!("the operator sets the same ({t})"))
            }
            Decision::Port(ours) => {
                let theirs = group
                    .value
                    .as_deref()
                    .and_then(|v| v.rsplit(':').next())
                    .and_then(|p| p.parse::<i32>().ok());
                match theirs {
                    Some(port) => super::driver::set_port_base(ctx, port),
                    None => Outcome::gap(
                        Gap::SidecarPorts,
                        format!("with hostNetwork, {} would serve on {ours}", c.name),
                    ),
                }
            }
            Decision::Carry => match checks.next().unwrap_or(Check::Accepted) {
                Check::Accepted => {
                    let to = if let Some(pos) = find_tokens(&existing, &group.tokens) {
                        pos
                    } else {
                        extra_args.extend(group.tokens.iter().cloned());
                        extra_args.len() - group.tokens.len()
                    };
                    kept.push(group);
                    Outcome::mapped(format!("spec.sidecars.{key}.extraArgs[{to}]"))
                }
                Check::Ignored => Outcome::replaced(
                    sidecar.clone(),
                    "accepted and ignored by csiops-sidecar (no effect)",
                ),
                Check::Refused(msg) => Outcome::gap(Gap::SidecarFlag, msg),
            },
        };
        if !matches!(decision, Decision::Carry) {
            dropped.push(group);
        }
        for (n, i) in group.indices.iter().enumerate() {
            let key = if n == 0 {
                format!("args[{i}]")
            } else {
                format!("args[{i}] (value)")
            };
            ctx.push(&at, What::Arg, key, args.get(*i).cloned(), outcome.clone());
        }
    }
    let only_dropped: BTreeSet<String> = refs(&dropped).difference(&refs(&kept)).cloned().collect();
    (extra_args, only_dropped)
}

/// Where `tokens` already are in `args` (a sidecar in both pods).
fn find_tokens(args: &[String], tokens: &[String]) -> Option<usize> {
    (0..args.len()).find(|&i| args[i..].starts_with(tokens))
}

/// Env of a sidecar or helper: what the operator sets is replaced, the
/// rest goes to `env`.
fn map_env(
    ctx: &mut Ctx,
    at: &At<'_>,
    c: &Container,
    role: Role,
    only_dropped: &BTreeSet<String>,
) -> Vec<EnvVar> {
    let mut out = Vec::new();
    let key = role.key();
    for var in c.env.iter().flatten() {
        let field = var
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        let outcome = if only_dropped.contains(&var.name) {
            Outcome::replaced(
                "the operator's flags",
                "used only by flags the operator manages",
            )
        } else if NODE_NAME_ENV.contains(&var.name.as_str())
            && matches!(role, Role::Registrar | Role::Provisioner)
        {
            Outcome::replaced(
                "the operator's env",
                "the operator sets the node's name from spec.nodeName",
            )
        } else if var.name == "NAMESPACE" && field == Some("metadata.namespace") {
            Outcome::replaced(
                "the operator's env",
                "the operator sets NAMESPACE from the pod",
            )
        } else {
            out.push(var.clone());
            Outcome::mapped(format!("spec.sidecars.{key}.env"))
        };
        ctx.push(at, What::Env, var.name.clone(), var.value.clone(), outcome);
    }
    out
}

/// Ports, probes, security context, pull policy and command of a sidecar
/// or helper: the operator's.
fn operator_parts(ctx: &mut Ctx, at: &At<'_>, c: &Container, bundled: bool) {
    let by = "the operator's sidecar container";
    ports_and_probes(
        ctx,
        at,
        c,
        |_| Outcome::replaced(by, "the operator declares the ports of its sidecars"),
        |_| {
            Outcome::replaced(
                by,
                "the operator probes its sidecars where it matters (the registrar's /healthz)",
            )
        },
    );
    if let Some(sc) = &c.security_context {
        ctx.push(at, What::SecurityContext, "securityContext", serde_json::to_string(sc).ok(),
            Outcome::replaced(by, "sidecars run as uid 0 with no capabilities, no privilege escalation and a read-only root filesystem"));
    }
    if bundled {
        if let Some(p) = &c.image_pull_policy {
            ctx.push(at, What::Field, "imagePullPolicy", Some(p.clone()), Outcome::replaced(by, "the upstream image's policy; spec.sidecars.imagePullPolicy is the bundled image's"));
        }
    }
    if let Some(cmd) = &c.command {
        ctx.push(
            at,
            What::Field,
            "command",
            Some(cmd.join(" ")),
            Outcome::replaced(by, "the image's entrypoint runs"),
        );
    }
    lifecycle_gap(ctx, at, c);
    env_from_gaps(ctx, at, c);
    leftover_fields(&mut ctx.report, at, c, Gap::PodField);
}

/// Reports each port and probe `c` declares, with the outcome `port` (of
/// its number) and `probe` (of its field) give it; the probe itself is not
/// shown.
fn ports_and_probes(
    ctx: &mut Ctx,
    at: &At<'_>,
    c: &Container,
    port: impl Fn(i32) -> Outcome,
    probe: impl Fn(&'static str) -> Outcome,
) {
    for p in c.ports.iter().flatten() {
        let key = p
            .name
            .clone()
            .unwrap_or_else(|| p.container_port.to_string());
        ctx.push(
            at,
            What::Port,
            key,
            Some(p.container_port.to_string()),
            port(p.container_port),
        );
    }
    for (key, declared) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if declared.is_some() {
            ctx.push(at, What::Probe, key, None, probe(key));
        }
    }
}

/// Only the driver container takes lifecycle hooks.
fn lifecycle_gap(ctx: &mut Ctx, at: &At<'_>, c: &Container) {
    if c.lifecycle.is_some() {
        ctx.push(
            at,
            What::Field,
            "lifecycle",
            None,
            Outcome::gap(Gap::Lifecycle, ""),
        );
    }
}

/// The CR's env takes single variables, never `envFrom`.
fn env_from_gaps(ctx: &mut Ctx, at: &At<'_>, c: &Container) {
    for (i, e) in c.env_from.iter().flatten().enumerate() {
        ctx.push(
            at,
            What::EnvFrom,
            format!("envFrom[{i}]"),
            serde_json::to_string(e).ok(),
            Outcome::gap(Gap::EnvFrom, ""),
        );
    }
}

/// The row of the container itself, shown by its image.
fn container(ctx: &mut Ctx, at: &At<'_>, c: &Container, outcome: Outcome) {
    ctx.push(
        at,
        What::Container,
        c.name.clone(),
        c.image.clone(),
        outcome,
    );
}

fn bundled(ctx: &mut Ctx, plan: &PodPlan, c: &Container, role: Role) {
    let at = plan.at(Some(&c.name));
    let key = role.key();
    let sidecar = role.sidecar_role().unwrap_or_default();
    container(
        ctx,
        &at,
        c,
        Outcome::replaced(
            format!("csiops-sidecar {sidecar} (spec.sidecars.{key})"),
            format!(
                "the bundled sidecar replaces upstream {}",
                role.upstream_name()
            ),
        ),
    );
    let carried = carry(ctx, plan, &at, c, role);
    let spec = spec_of(&mut ctx.spec.sidecars, role);
    if let Some(r) = &c.resources {
        spec.resources.get_or_insert_with(|| r.clone());
    }
    spec.enabled = true;
    spec.extra_args = carried.extra_args;
    merge_env(&mut spec.env, carried.env);
    merge_mounts(&mut spec.volume_mounts, carried.mounts);
    operator_parts(ctx, &at, c, true);
}

/// What a bundled sidecar or a helper carries into `spec.sidecars.<key>`.
struct Carried {
    extra_args: Vec<String>,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
}

/// Maps the args, env and mounts of a bundled sidecar or a helper, and
/// reports its resources; which resources stand is the caller's.
fn carry(ctx: &mut Ctx, plan: &PodPlan, at: &At<'_>, c: &Container, role: Role) -> Carried {
    let key = role.key();
    let (extra_args, only_dropped) = map_args(ctx, plan, c, role);
    let env = map_env(ctx, at, c, role, &only_dropped);
    let field = format!("spec.sidecars.{key}.volumeMounts");
    let (mounts, _) = map_mounts(&mut ctx.report, plan, c, &field, false);
    if c.resources.is_some() {
        ctx.push(
            at,
            What::Resources,
            "resources",
            None,
            Outcome::mapped(format!("spec.sidecars.{key}.resources")),
        );
    }
    Carried {
        extra_args,
        env,
        mounts,
    }
}

fn merge_env(into: &mut Vec<EnvVar>, vars: Vec<EnvVar>) {
    for v in vars {
        if !into.contains(&v) {
            into.push(v);
        }
    }
}

fn merge_mounts(into: &mut Vec<VolumeMount>, mounts: Vec<VolumeMount>) {
    for m in mounts {
        if !into.iter().any(|x| x.mount_path == m.mount_path) {
            into.push(m);
        }
    }
}

fn helper(ctx: &mut Ctx, plan: &PodPlan, c: &Container, h: Helper) {
    let role = Role::Helper(h);
    let at = plan.at(Some(&c.name));
    let key = h.key();
    // The operator runs a helper image's entrypoint. An image that is not
    // the upstream helper's (one that bundles several programs and is
    // started with the helper's binary as its command) would run something
    // else, so the helper gets the operator's default image instead.
    let own_image = super::classify::role_by_image(c) == Some(role);
    if own_image {
        container(
            ctx,
            &at,
            c,
            Outcome::mapped_note(
                format!("spec.sidecars.{key}"),
                "the upstream helper, enabled with this image",
            ),
        );
    } else {
        container(
            ctx,
            &at,
            c,
            Outcome::replaced(
                format!("the upstream helper {} (spec.sidecars.{key}, the operator's default image {})", h.container_name(), h.default_image()),
                format!(
                    "this image is not the helper's own: it runs {} by its command, and the operator runs a helper image's entrypoint; set spec.sidecars.{key}.image to another release of the helper's image if you need one",
                    h.container_name()
                ),
            ),
        );
    }
    let carried = carry(ctx, plan, &at, c, role);
    if let Some(p) = &c.image_pull_policy {
        let outcome = if own_image {
            Outcome::mapped(format!("spec.sidecars.{key}.imagePullPolicy"))
        } else {
            Outcome::replaced(
                format!("the operator's default image {}", h.default_image()),
                "the policy of an image that is not used",
            )
        };
        ctx.push(
            &at,
            What::Field,
            "imagePullPolicy",
            Some(p.clone()),
            outcome,
        );
    }
    let spec = helper_of(&mut ctx.spec.sidecars, h);
    spec.enabled = true;
    if own_image {
        spec.image = c.image.clone();
        spec.image_pull_policy = pull_policy(c.image_pull_policy.as_deref());
    }
    spec.extra_args = carried.extra_args;
    spec.resources = c.resources.clone();
    merge_env(&mut spec.env, carried.env);
    merge_mounts(&mut spec.volume_mounts, carried.mounts);
    operator_parts(ctx, &at, c, false);
}

fn extra(ctx: &mut Ctx, plan: &PodPlan, c: &Container, w: Workload) {
    let at = plan.at(Some(&c.name));
    let pod = match w {
        Workload::Controller => ExtraContainerPod::Controller,
        Workload::Node => ExtraContainerPod::Node,
    };
    let taken = |name: &str, extras: &[ExtraContainer]| {
        MANAGED_CONTAINERS.iter().any(|(n, _)| *n == name)
            || extras.iter().any(|e| e.name == name && e.pod == pod)
    };
    let mut name = c.name.clone();
    while taken(&name, &ctx.spec.sidecars.extra) {
        name.push_str("-extra");
    }
    let i = ctx.spec.sidecars.extra.len();
    let field = format!("spec.sidecars.extra[{i}]");
    let note = if name == c.name {
        format!("pod: {pod:?}")
    } else {
        format!(
            "pod: {pod:?}, renamed to {name}: the operator uses {}",
            c.name
        )
    };
    container(ctx, &at, c, Outcome::mapped_note(field.clone(), note));
    // The socket moves to /csi/<socketName>, as the driver's does.
    let file = ctx.spec.driver.socket_name.clone();
    let socket = plan.socket.as_ref();
    let mut args = Vec::new();
    for (j, a) in c.args.iter().flatten().enumerate() {
        let new = rewrite(a, socket, &file);
        let outcome = if new == *a {
            Outcome::mapped(format!("{field}.args[{j}]"))
        } else {
            Outcome::mapped_note(
                format!("{field}.args[{j}]"),
                format!("socket path rewritten: {new}"),
            )
        };
        args.push(new);
        ctx.push(
            &at,
            What::Arg,
            format!("args[{j}]"),
            Some(a.clone()),
            outcome,
        );
    }
    let mut env = Vec::new();
    for v in c.env.iter().flatten() {
        let mut new = v.clone();
        new.value = v.value.as_deref().map(|x| rewrite(x, socket, &file));
        env.push(new);
        ctx.push(
            &at,
            What::Env,
            v.name.clone(),
            v.value.clone(),
            Outcome::mapped(format!("{field}.env")),
        );
    }
    env_from_gaps(ctx, &at, c);
    let (mounts, token) = map_mounts(
        &mut ctx.report,
        plan,
        c,
        &format!("{field}.volumeMounts"),
        true,
    );
    for (what_key, present, to) in [
        ("resources", c.resources.is_some(), "resources"),
        (
            "securityContext",
            c.security_context.is_some(),
            "securityContext",
        ),
        (
            "imagePullPolicy",
            c.image_pull_policy.is_some(),
            "imagePullPolicy",
        ),
        ("command", c.command.is_some(), "command"),
    ] {
        if present {
            let what = match what_key {
                "resources" => What::Resources,
                "securityContext" => What::SecurityContext,
                _ => What::Field,
            };
            ctx.push(
                &at,
                what,
                what_key,
                None,
                Outcome::mapped(format!("{field}.{to}")),
            );
        }
    }
    ports_and_probes(
        ctx,
        &at,
        c,
        |port| Outcome::gap(Gap::ExtraContainerPorts, format!("port {port}")),
        |key| Outcome::gap(Gap::ExtraContainerPorts, key),
    );
    lifecycle_gap(ctx, &at, c);
    leftover_fields(&mut ctx.report, &at, c, Gap::PodField);
    ctx.spec.sidecars.extra.push(ExtraContainer {
        name,
        pod,
        image: c.image.clone().unwrap_or_default(),
        image_pull_policy: pull_policy(c.image_pull_policy.as_deref()),
        command: c.command.clone().unwrap_or_default(),
        args,
        env,
        resources: c.resources.clone(),
        volume_mounts: mounts,
        security_context: c.security_context.clone(),
        mount_service_account_token: token,
    });
}
