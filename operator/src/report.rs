//! Builds the status a user reads in `kubectl get csidd` and `kubectl describe`:
//! phase, conditions, counts and the one-line message. Pure.

use chrono::{DateTime, Utc};
use csiops_crds::{
    CSIDriverDeploymentStatus, Condition, LostNode, Phase, RolloutKind, RolloutStatus, Summary,
    MAX_LOST_NODES_LISTED,
};

use crate::fleet::Lost;
use crate::health::Health;

pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";

/// A problem that makes the object Degraded regardless of its workloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// CamelCase reason: `Conflict`, `RenderFailed`, `ApplyFailed`, `RolloutStepTimeout`.
    pub reason: &'static str,
    pub message: String,
}

/// Everything the status is made of.
pub struct ReportInput<'a> {
    pub previous: Option<&'a CSIDriverDeploymentStatus>,
    pub generation: i64,
    pub spec_version: &'a str,
    /// Whether the object asks for a controller workload (topology
    /// Central); node-local drivers serve without one.
    pub controller: bool,
    pub rollout: Option<&'a RolloutStatus>,
    /// What the current rollout step waits for.
    pub waiting_for: Option<&'a str>,
    /// A rollout completed in this pass.
    pub completed: bool,
    pub health: &'a Health,
    pub problem: Option<&'a Problem>,
    pub paused: bool,
    pub deleting: bool,
    pub now: DateTime<Utc>,
}

/// The new status.
pub fn build(input: &ReportInput<'_>) -> CSIDriverDeploymentStatus {
    let h = input.health;
    let previous = input.previous.cloned().unwrap_or_default();
    let current_version = if input.completed {
        Some(input.spec_version.to_string())
    } else {
        previous.current_version.clone()
    };

    // Available means the driver serves: a Ready controller replica (when
    // the object asks for one), and node pods up on the healthy nodes within
    // the node roll's budget. Lost nodes are named, not counted against it.
    // A node-local driver serves from its node pods alone (a controller
    // left from a central past is being removed, not waited for).
    let controller_ok = !input.controller || h.controller.ready > 0 || h.controller.desired == 0;
    // What there is of a controller, or `-` for a node-local driver once
    // nothing of it is left.
    let controller_summary =
        if !input.controller && h.controller.desired == 0 && h.controller.ready == 0 {
            "-".to_string()
        } else {
            format!("{}/{}", h.controller.ready, h.controller.desired)
        };
    let nodes_ok = h.nodes_serving;
    let deployed = current_version.is_some();
    let lost = lost_nodes(&h.fleet.lost, input.previous, input.now);
    let lost_text = format!(
        "{}{}",
        lost_suffix(&lost, h.fleet.lost.len()),
        cordoned_suffix(&h.fleet.cordoned)
    );
    let available = (
        if deployed && controller_ok && nodes_ok {
            "True"
        } else {
            "False"
        },
        if !deployed {
            "NotDeployed"
        } else if !controller_ok && input.paused {
            "Paused"
        } else if !controller_ok {
            "ControllerNotReady"
        } else if !nodes_ok {
            "NodesNotAvailable"
        } else {
            "AllReady"
        },
        if input.controller {
            format!(
                "controller {}/{} ready, node pods {}/{} available{lost_text}",
                h.controller.ready, h.controller.desired, h.node.available, h.node.desired
            )
        } else {
            format!(
                "node-local: node pods {}/{} available{lost_text}",
                h.node.available, h.node.desired
            )
        },
    );

    let step_text = input.rollout.map(|r| {
        let waiting = input.waiting_for.unwrap_or("working");
        format!("{:?} step {}: {}{lost_text}", r.kind, r.step, waiting)
    });
    let progressing = if input.paused {
        ("False", "Paused", "spec.paused is true".to_string())
    } else if let Some(text) = &step_text {
        let overdue = input
            .problem
            .is_some_and(|p| p.reason == "RolloutStepTimeout");
        if overdue {
            ("False", "ProgressDeadlineExceeded", text.clone())
        } else {
            ("True", "RolloutInProgress", text.clone())
        }
    } else {
        (
            "False",
            "RolloutComplete",
            "no rollout in progress".to_string(),
        )
    };

    let unhealthy = !input.deleting && !h.unhealthy.is_empty();
    let degraded = if let Some(p) = input.problem {
        ("True", p.reason, p.message.clone())
    } else if unhealthy {
        let first = &h.unhealthy[0];
        let reason = if h.unhealthy.iter().all(|u| u.reason == "NotRegistered") {
            "NotRegistered"
        } else {
            "UnhealthyPods"
        };
        (
            "True",
            reason,
            format!(
                "{} unhealthy pod(s); {}: {}: {}",
                h.unhealthy.len(),
                first.name,
                first.reason,
                first.message
            ),
        )
    } else if deployed && input.rollout.is_none() && !input.deleting && !(controller_ok && nodes_ok)
    {
        ("True", "NotReady", available.2.clone())
    } else {
        ("False", "AsExpected", "no problem found".to_string())
    };

    let phase = if input.deleting {
        Phase::Deleting
    } else if degraded.0 == "True" {
        Phase::Degraded
    } else if let Some(r) = input.rollout {
        match r.kind {
            RolloutKind::Install => Phase::Deploying,
            _ => Phase::Upgrading,
        }
    } else if input.paused && !deployed {
        Phase::Pending
    } else if available.0 == "True" {
        Phase::Running
    } else {
        Phase::Pending
    };

    let message = match phase {
        Phase::Degraded => degraded.2.clone(),
        Phase::Deploying | Phase::Upgrading | Phase::Deleting => step_text
            .clone()
            .unwrap_or_else(|| phase.as_str().to_string()),
        Phase::Running => available.2.clone(),
        Phase::Pending if input.paused => "paused".to_string(),
        Phase::Pending => "waiting for the first rollout".to_string(),
    };

    let mut conditions = Vec::with_capacity(3);
    for (type_, (status, reason, message)) in [
        (AVAILABLE, (available.0, available.1, available.2.clone())),
        (PROGRESSING, progressing),
        (DEGRADED, degraded),
    ] {
        conditions.push(condition(
            previous.condition(type_),
            type_,
            status,
            reason,
            message,
            input.generation,
            input.now,
        ));
    }

    CSIDriverDeploymentStatus {
        phase,
        message,
        conditions,
        observed_generation: input.generation,
        current_version,
        target_version: Some(input.spec_version.to_string()),
        rollout: input.rollout.cloned(),
        controller: h.controller.clone(),
        node: h.node.clone(),
        registered_nodes: h.registered_nodes,
        tainted_nodes: h.tainted_nodes,
        summary: Summary {
            controller: controller_summary,
            nodes: format!("{}/{}", h.node.ready, h.node.desired),
            registered: format!("{}/{}", h.registered_nodes, h.node.desired),
        },
        unhealthy_pods: h.unhealthy.clone(),
        lost_nodes: lost,
        cordoned_nodes: h
            .fleet
            .cordoned
            .iter()
            .take(MAX_LOST_NODES_LISTED)
            .cloned()
            .collect(),
    }
}

/// `; 2 node(s) cordoned: a, b` (the first five named), or nothing.
fn cordoned_suffix(cordoned: &[String]) -> String {
    nodes_suffix("cordoned", cordoned.iter().cloned(), cordoned.len())
}

/// Whether `new` differs from `old` only in what moves as pods come and go:
/// counts, the summary, messages, unhealthy pods. Phase, conditions (type,
/// status, reason), generation, versions, the rollout step and the lost
/// nodes are what a user or the state machine acts on. Such a status may
/// wait a moment to be written (see `reconcile::write::status`).
pub fn progress_only(old: &CSIDriverDeploymentStatus, new: &CSIDriverDeploymentStatus) -> bool {
    let conditions = |s: &CSIDriverDeploymentStatus| -> Vec<(String, String, String)> {
        s.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    };
    let lost = |s: &CSIDriverDeploymentStatus| -> Vec<String> {
        s.lost_nodes.iter().map(|n| n.name.clone()).collect()
    };
    old.phase == new.phase
        && old.observed_generation == new.observed_generation
        && old.current_version == new.current_version
        && old.target_version == new.target_version
        && old.rollout == new.rollout
        && conditions(old) == conditions(new)
        && lost(old) == lost(new)
}

/// The lost nodes as status lists them (at most [`MAX_LOST_NODES_LISTED`]):
/// a node listed before keeps its `since` when its Node gives none (a
/// cordoned or deleted node: since when this operator first saw it lost).
pub fn lost_nodes(
    lost: &[Lost],
    previous: Option<&CSIDriverDeploymentStatus>,
    now: DateTime<Utc>,
) -> Vec<LostNode> {
    lost.iter()
        .take(MAX_LOST_NODES_LISTED)
        .map(|l| {
            let before = previous
                .and_then(|p| p.lost_nodes.iter().find(|n| n.name == l.node))
                .filter(|n| n.reason == l.reason.as_str());
            LostNode {
                name: l.node.clone(),
                reason: l.reason.as_str().to_string(),
                since: l
                    .since
                    .clone()
                    .or_else(|| before.and_then(|n| n.since.clone()))
                    .or_else(|| Some(crate::rollout::rfc3339(now))),
                pod: l.pod.clone(),
                current: l.current,
            }
        })
        .collect()
}

/// `; 3 node(s) lost: a (NotReady), b (Unreachable), …` for the message.
fn lost_suffix(listed: &[LostNode], total: usize) -> String {
    let names = listed.iter().map(|n| format!("{} ({})", n.name, n.reason));
    nodes_suffix("lost", names, total)
}

/// `; <total> node(s) <what>: a, b, …` with the first five named, or
/// nothing when `total` is 0.
fn nodes_suffix(what: &str, names: impl Iterator<Item = String>, total: usize) -> String {
    if total == 0 {
        return String::new();
    }
    const NAMED: usize = 5;
    let names: Vec<String> = names.take(NAMED).collect();
    let more = if total > names.len() {
        format!(" and {} more", total - names.len())
    } else {
        String::new()
    };
    format!("; {total} node(s) {what}: {}{more}", names.join(", "))
}

/// The lost nodes of `status` lost for longer than `timeout`, for the
/// Degraded condition.
pub fn lost_too_long(
    nodes: &[LostNode],
    timeout: chrono::Duration,
    now: DateTime<Utc>,
) -> Vec<&LostNode> {
    nodes
        .iter()
        .filter(|n| {
            n.since
                .as_deref()
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .is_some_and(|t| now - t.with_timezone(&Utc) > timeout)
        })
        .collect()
}

/// How long until the next of `nodes` not yet lost for longer than
/// `timeout` is: the operator looks again then, so the Degraded message
/// counts each node from its own deadline, not from whatever event comes
/// next (a settled object is otherwise resynced only every few minutes).
pub fn next_lost_deadline(
    nodes: &[LostNode],
    timeout: chrono::Duration,
    now: DateTime<Utc>,
) -> Option<chrono::Duration> {
    nodes
        .iter()
        .filter_map(|n| {
            let since = DateTime::parse_from_rfc3339(n.since.as_deref()?).ok()?;
            let left = since.with_timezone(&Utc) + timeout - now;
            // `lost_too_long` needs strictly more than the timeout, and
            // `since` has whole seconds: one second past it, it counts.
            (left >= chrono::Duration::zero()).then(|| left + chrono::Duration::seconds(1))
        })
        .min()
}

/// A condition whose lastTransitionTime only moves when its status does.
fn condition(
    previous: Option<&Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: i64,
    now: DateTime<Utc>,
) -> Condition {
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => crate::rollout::rfc3339(now),
    };
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests;
