//! Builds the status a user reads in `kubectl get csidd` and `kubectl describe`:
//! phase, conditions, counts and the one-line message. Pure.

use chrono::{DateTime, Utc};
use csiops_crds::{
    CSIDriverDeploymentStatus, Condition, Phase, RolloutKind, RolloutStatus, Summary,
};

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

    let controller_ok = h.controller.desired == h.controller.ready;
    let nodes_ok = h.node.desired > 0 && h.node.available == h.node.desired;
    let deployed = current_version.is_some();
    let available = (
        if deployed && controller_ok && nodes_ok {
            "True"
        } else {
            "False"
        },
        if !deployed {
            "NotDeployed"
        } else if !nodes_ok {
            "NodesNotAvailable"
        } else if !controller_ok {
            "ControllerNotReady"
        } else {
            "AllReady"
        },
        format!(
            "controller {}/{} ready, node pods {}/{} available",
            h.controller.ready, h.controller.desired, h.node.available, h.node.desired
        ),
    );

    let step_text = input.rollout.map(|r| {
        let waiting = input.waiting_for.unwrap_or("working");
        format!("{:?} step {}: {}", r.kind, r.step, waiting)
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
            controller: format!("{}/{}", h.controller.ready, h.controller.desired),
            nodes: format!("{}/{}", h.node.ready, h.node.desired),
            registered: format!("{}/{}", h.registered_nodes, h.node.desired),
        },
        unhealthy_pods: h.unhealthy.clone(),
    }
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
