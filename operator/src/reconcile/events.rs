//! Kubernetes Events for rollout steps and failures, so `kubectl describe csidd`
//! tells the story of a rollout. Publishing is best effort: a lost Event never
//! fails a reconciliation.
//!
//! A pass collects its Events in [`Notes`] where they arise (the writes and
//! the decisions only say what happened) and publishes them in that order
//! at its end; when it writes status, just before that write (see
//! `write::status::write_status`), and, where a write is watched for before
//! the pass ends, before it goes on.

use std::sync::Mutex;

use csiops_crds::{CSIDriverDeployment, RolloutKind, RolloutStep, Topology};
use csiops_runtime::chain;
use csiops_runtime::error::ellipsize;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};

use tracing::info;

use crate::metrics::Metrics;
use crate::report;
use crate::rollout::{self, Plan, Transition};

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

/// The standing warnings already told of one object, by reason, so a
/// condition that holds across reconciles (a CSIDriver field the API server
/// does not store) gives one Event when it starts or changes, not one per
/// reconcile (kept with the object's other state).
#[derive(Debug, Default)]
pub struct Told(std::collections::HashMap<&'static str, String>);

impl Told {
    /// Whether `note` is news under `reason`: true the first time and
    /// whenever it differs from the last one told.
    pub fn is_news(&mut self, reason: &'static str, note: &str) -> bool {
        if self.0.get(reason).map(String::as_str) == Some(note) {
            return false;
        }
        self.0.insert(reason, note.to_string());
        true
    }

    /// The condition behind `reason` ended: tell it again if it comes back.
    pub fn ended(&mut self, reason: &'static str) {
        self.0.remove(reason);
    }
}

/// What a step does, in an admin's words. Without a controller workload
/// (topology NodeLocal) the controller step removes one left from a
/// central past.
pub fn describe_step(step: RolloutStep, topology: Topology) -> &'static str {
    match step {
        RolloutStep::ControllerRoll if !topology.has_controller() => {
            "delete the controller workload (topology NodeLocal runs none) and wait until its pods are gone"
        }
        RolloutStep::NodeInstall => {
            "apply the node DaemonSet and wait until it is available and registered"
        }
        RolloutStep::ControllerScaleDown => {
            "scale the controller to 0 and wait until its pods are gone"
        }
        RolloutStep::NodeRoll => {
            "roll the node DaemonSet and wait until every node that can run it runs the new pod, Ready and registered (lost nodes are named, not waited for)"
        }
        RolloutStep::ControllerRoll => {
            "roll the controller workload (a surge replica first while one serves) and wait until it is ready"
        }
        RolloutStep::ControllerDelete => {
            "delete the controller workload and wait until its pods are gone"
        }
        RolloutStep::NodeDelete => "delete the node DaemonSet and wait until its pods are gone",
        RolloutStep::ClusterCleanup => "delete the CSIDriver, cluster RBAC and StorageClasses",
    }
}

fn describe_kind(kind: RolloutKind, topology: Topology) -> &'static str {
    if !topology.has_controller() {
        return match kind {
            RolloutKind::Install => "install (node DaemonSet; node-local, no controller)",
            RolloutKind::Upgrade => {
                "upgrade (node DaemonSet rolled; node-local: a controller left from topology Central is stopped before the roll and removed after it)"
            }
            RolloutKind::ControllerUpdate => {
                "controller removal (topology NodeLocal runs no controller)"
            }
            RolloutKind::Delete => "teardown (node DaemonSet, then cluster-scoped objects)",
        };
    }
    match kind {
        RolloutKind::Install => "install (node DaemonSet, then controller)",
        RolloutKind::Upgrade => {
            "upgrade (node DaemonSet rolled, then the controller; with rollout.strategy StopController the controller is stopped for the node roll)"
        }
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
pub fn for_transition(t: &Transition, version: &str, topology: Topology) -> Note {
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
            format!(
                "{} of version {version} started",
                describe_kind(*kind, topology)
            ),
        ),
        Transition::RolloutRetargeted { kind, step } => (
            "RolloutRetargeted",
            format!(
                "spec changed during the {}; continuing with version {version} at step {step}",
                describe_kind(*kind, topology)
            ),
        ),
        Transition::StepStarted(step) => (
            "StepStarted",
            format!("{step}: {}", describe_step(*step, topology)),
        ),
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

/// The Events of one pass about one object, in the order they arose,
/// until published.
#[derive(Debug)]
pub struct Notes {
    regarding: ObjectReference,
    pending: Mutex<Vec<Note>>,
}

impl Notes {
    /// The Events about `obj` (the copy the pass acts on).
    pub fn about(obj: &CSIDriverDeployment) -> Self {
        Notes {
            regarding: obj.object_ref(&()),
            pending: Mutex::default(),
        }
    }

    /// `note`, to publish with the others.
    pub fn push(&self, note: Note) {
        // A poisoned lock only means a write running beside this one
        // panicked; the notes are still usable.
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.push(note);
    }

    /// Publishes what was collected and not published yet, in order.
    pub async fn publish(&self, recorder: &Recorder) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        for note in &pending {
            publish(recorder, &self.regarding, note).await;
        }
    }
}

/// Publishes, logging (not failing) when the API refuses the Event.
async fn publish(recorder: &Recorder, regarding: &ObjectReference, note: &Note) {
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
    if let Err(e) = recorder.publish(&event, regarding).await {
        tracing::warn!(reason = %note.reason, error = %chain(&e), "cannot publish event");
    }
}

/// Events carry at most 1 KiB of note.
const NOTE_MAX: usize = 1000;

/// Events (and metrics) for the plan's transitions.
pub(crate) fn announce<A>(
    obj: &CSIDriverDeployment,
    metrics: &Metrics,
    plan: &Plan<A>,
    notes: &Notes,
) {
    for t in &plan.transitions {
        if let rollout::Transition::StepStarted(step) = t {
            metrics.rollout_step(step.as_str());
        }
        let note = for_transition(t, &obj.spec.version, obj.spec.topology);
        info!(object = %obj.name_any(), reason = %note.reason, "{}", note.note);
        notes.push(note);
    }
    if let Some(why) = &plan.overdue {
        let already = obj
            .status
            .as_ref()
            .and_then(|s| s.condition(report::DEGRADED))
            .is_some_and(|c| c.reason == "RolloutStepTimeout" && c.status == "True");
        if !already {
            notes.push(Note::warning("RolloutStepTimeout", why.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_read_as_an_admin_expects() {
        let n = for_transition(
            &Transition::RolloutStarted(RolloutKind::Upgrade),
            "v2",
            Topology::Central,
        );
        assert_eq!(n.reason, "RolloutStarted");
        assert!(
            n.note
                .contains("node DaemonSet rolled, then the controller"),
            "{}",
            n.note
        );
        assert!(n.note.contains("v2"));
        let n = for_transition(
            &Transition::StepStarted(RolloutStep::ControllerScaleDown),
            "v2",
            Topology::Central,
        );
        assert_eq!(
            n.note,
            "ControllerScaleDown: scale the controller to 0 and wait until its pods are gone"
        );
        assert!(!n.warning);
        assert_eq!(n.action, "ControllerScaleDown v2");
        let again = for_transition(
            &Transition::StepStarted(RolloutStep::NodeRoll),
            "v2",
            Topology::Central,
        );
        assert_ne!(
            again.action, n.action,
            "distinct steps must not fold into one series"
        );
    }

    #[test]
    fn node_local_transitions_say_there_is_no_controller() {
        let n = for_transition(
            &Transition::RolloutStarted(RolloutKind::Install),
            "v1",
            Topology::NodeLocal,
        );
        assert!(n.note.contains("no controller"), "{}", n.note);
        let n = for_transition(
            &Transition::StepStarted(RolloutStep::ControllerRoll),
            "v1",
            Topology::NodeLocal,
        );
        assert!(
            n.note
                .starts_with("ControllerRoll: delete the controller workload"),
            "{}",
            n.note
        );
        let central = for_transition(
            &Transition::StepStarted(RolloutStep::ControllerRoll),
            "v1",
            Topology::Central,
        );
        assert!(
            central.note.contains("roll the controller workload"),
            "{}",
            central.note
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
