//! Kubernetes Events for rollout steps and failures, so `kubectl describe csidd`
//! tells the story of a rollout. Publishing is best effort: a lost Event never
//! fails a reconciliation.

use csiops_crds::{CSIDriverDeployment, RolloutKind, RolloutStep};
use csiops_runtime::chain;
use csiops_runtime::error::ellipsize;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::Resource;

use crate::rollout::Transition;

/// One Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: String,
    pub action: String,
    pub note: String,
}

impl Note {
    pub fn warning(reason: &str, note: String) -> Self {
        Self {
            warning: true,
            reason: reason.to_string(),
            action: "Reconcile".to_string(),
            note,
        }
    }
}

/// What a step does, in an admin's words.
pub fn describe_step(step: RolloutStep) -> &'static str {
    match step {
        RolloutStep::NodeInstall => {
            "apply the node DaemonSet and wait until it is available and registered"
        }
        RolloutStep::ControllerScaleDown => {
            "scale the controller to 0 and wait until its pods are gone"
        }
        RolloutStep::NodeRoll => {
            "roll the node DaemonSet and wait until every pod is updated, available and registered"
        }
        RolloutStep::ControllerRoll => "apply the controller workload and wait until it is ready",
        RolloutStep::ControllerDelete => {
            "delete the controller workload and wait until its pods are gone"
        }
        RolloutStep::NodeDelete => "delete the node DaemonSet and wait until its pods are gone",
        RolloutStep::ClusterCleanup => "delete the CSIDriver, cluster RBAC and StorageClasses",
    }
}

fn describe_kind(kind: RolloutKind) -> &'static str {
    match kind {
        RolloutKind::Install => "install (node DaemonSet, then controller)",
        RolloutKind::Upgrade => "upgrade (controller down, node DaemonSet rolled, controller up)",
        RolloutKind::ControllerUpdate => "controller update (only the controller is rolled)",
        RolloutKind::Delete => {
            "teardown (controller, then node DaemonSet, then cluster-scoped objects)"
        }
    }
}

/// The Event of a state-machine transition.
///
/// The recorder folds Events with the same reason and action into one series
/// and keeps the first note, so the action names the step or rollout kind and
/// the version: every step of every rollout stays visible in `kubectl describe`.
pub fn for_transition(t: &Transition, version: &str) -> Note {
    let action = match t {
        Transition::RolloutStarted(kind)
        | Transition::RolloutCompleted(kind)
        | Transition::RolloutRetargeted { kind, .. } => format!("{kind:?} {version}"),
        Transition::StepStarted(step) | Transition::StepCompleted(step) => {
            format!("{step} {version}")
        }
    };
    let (reason, note) = match t {
        Transition::RolloutStarted(kind) => (
            "RolloutStarted",
            format!("{} of version {version} started", describe_kind(*kind)),
        ),
        Transition::RolloutRetargeted { kind, step } => (
            "RolloutRetargeted",
            format!(
                "spec changed during the {}; continuing with version {version} at step {step}",
                describe_kind(*kind)
            ),
        ),
        Transition::StepStarted(step) => {
            ("StepStarted", format!("{step}: {}", describe_step(*step)))
        }
        Transition::StepCompleted(step) => ("StepCompleted", format!("{step} completed")),
        Transition::RolloutCompleted(kind) => (
            "RolloutCompleted",
            match kind {
                RolloutKind::Delete => {
                    "teardown completed; nothing of the driver is left".to_string()
                }
                _ => format!("version {version} is rolled out"),
            },
        ),
    };
    Note {
        warning: false,
        reason: reason.to_string(),
        action,
        note,
    }
}

/// Publishes, logging (not failing) when the API refuses the Event.
pub async fn publish(recorder: &Recorder, obj: &CSIDriverDeployment, note: &Note) {
    let event = Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason.clone(),
        note: Some(ellipsize(&note.note, NOTE_MAX)),
        action: note.action.clone(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &obj.object_ref(&())).await {
        tracing::warn!(reason = %note.reason, error = %chain(&e), "cannot publish event");
    }
}

/// Events carry at most 1 KiB of note.
const NOTE_MAX: usize = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_read_as_an_admin_expects() {
        let n = for_transition(&Transition::RolloutStarted(RolloutKind::Upgrade), "v2");
        assert_eq!(n.reason, "RolloutStarted");
        assert!(n
            .note
            .contains("controller down, node DaemonSet rolled, controller up"));
        assert!(n.note.contains("v2"));
        let n = for_transition(
            &Transition::StepStarted(RolloutStep::ControllerScaleDown),
            "v2",
        );
        assert_eq!(
            n.note,
            "ControllerScaleDown: scale the controller to 0 and wait until its pods are gone"
        );
        assert!(!n.warning);
        assert_eq!(n.action, "ControllerScaleDown v2");
        let again = for_transition(&Transition::StepStarted(RolloutStep::NodeRoll), "v2");
        assert_ne!(
            again.action, n.action,
            "distinct steps must not fold into one series"
        );
    }

    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        let s = "é".repeat(600);
        let t = ellipsize(&s, NOTE_MAX);
        assert!(t.len() <= NOTE_MAX + '…'.len_utf8());
        assert!(t.ends_with('…'));
    }
}
