//! What each rollout step still waits for, read off the live objects: a
//! step is done when the workloads say so (template hash, observed
//! generation, counts), never because this operator believes it applied
//! something. The StatefulSet surge lives here too, since each of its three
//! phases is chosen by what the live object shows.

use csiops_crds::ControllerKind;

use super::{Action, Desired, Observed};

pub(super) fn node_rolled(observed: &Observed) -> Option<String> {
    if observed.node.is_none() {
        return Some("node DaemonSet not created yet".to_string());
    }
    observed.fleet.waiting_for()
}

/// The controller step: a plain apply where nothing serves (install, after
/// a scale-down, a Deployment which surges by itself), else the three
/// phases of a StatefulSet surge, each read back from the live object so a
/// restart resumes the right one.
pub(super) fn controller_roll(
    desired: &Desired,
    observed: &Observed,
) -> (Vec<Action>, Option<String>) {
    let replicas = desired.controller_replicas;
    let plain = || {
        (
            vec![Action::ApplyController],
            controller_ready(desired, observed),
        )
    };
    let Some(live) = observed.controller.as_ref() else {
        return plain();
    };
    if desired.controller_kind != ControllerKind::StatefulSet || replicas < 1 {
        return plain();
    }
    let surge = replicas + 1;
    let template_current = live.hash.as_deref() == Some(desired.controller_hash.as_str());
    let observed_now = live.observed_generation >= live.generation;
    if !template_current {
        if live.ready == 0 {
            // Nothing serves: nothing to keep serving.
            return plain();
        }
        // Phase 1: one more replica at the new template; `partition` keeps
        // the serving ones as they are.
        return (
            vec![Action::ApplyControllerSurge {
                replicas: surge,
                partition: replicas,
            }],
            Some("controller: starting a surge replica at the new template".to_string()),
        );
    }
    if live.partition > 0 {
        if observed_now && live.updated_ready >= 1 {
            // Phase 2: the surge replica serves; roll the old ones.
            return (
                vec![Action::ApplyControllerSurge {
                    replicas: surge,
                    partition: 0,
                }],
                Some("controller: rolling the previous replicas".to_string()),
            );
        }
        return (
            vec![Action::ApplyControllerSurge {
                replicas: surge,
                partition: replicas,
            }],
            Some(format!(
                "controller: surge replica at the new template not Ready yet ({} of {} ready at the previous one)",
                live.ready.min(replicas),
                replicas
            )),
        );
    }
    if live.spec_replicas == surge {
        let rolled = observed_now
            && live.updated == surge
            && live.updated_ready >= surge
            && live.replicas == surge;
        if !rolled {
            return (
                vec![Action::ApplyControllerSurge {
                    replicas: surge,
                    partition: 0,
                }],
                Some(format!(
                    "controller: rolling the previous replicas ({} of {} at the new template and Ready)",
                    live.updated_ready.min(surge),
                    surge
                )),
            );
        }
        // Phase 3: back to the asked number (the highest ordinal goes).
    }
    plain()
}

pub(super) fn controller_scaled_down(observed: &Observed) -> Option<String> {
    // The StatefulSet controller must have seen replicas=0 (observedGeneration),
    // or a pod it is about to create could outlive our look at the pod list.
    if let Some(c) = &observed.controller {
        if c.spec_replicas != 0 || c.observed_generation < c.generation {
            return Some(
                "controller scaling down: the workload has not observed replicas=0".into(),
            );
        }
    }
    let replicas = observed.controller.as_ref().map_or(0, |c| c.replicas);
    if observed.stale_controller {
        return Some("controller of the previous kind is being removed".to_string());
    }
    if replicas > 0 || observed.controller_pods > 0 {
        return Some(format!(
            "controller scaling down: {} pod(s) left",
            observed.controller_pods.max(replicas.max(0) as usize)
        ));
    }
    None
}

pub(super) fn controller_ready(desired: &Desired, observed: &Observed) -> Option<String> {
    let Some(c) = &observed.controller else {
        return Some("controller workload not created yet".to_string());
    };
    if c.hash.as_deref() != Some(desired.controller_hash.as_str()) {
        return Some("controller workload not updated yet".to_string());
    }
    if c.observed_generation < c.generation {
        return Some("controller workload: new generation not observed yet".to_string());
    }
    let replicas = desired.controller_replicas;
    if c.spec_replicas != replicas {
        return Some(format!(
            "controller workload: {} replicas, {} asked",
            c.spec_replicas, replicas
        ));
    }
    if c.ready < replicas || c.updated < replicas || c.replicas != replicas {
        return Some(format!(
            "controller pods: {} ready, {} updated of {} desired",
            c.ready, c.updated, replicas
        ));
    }
    None
}

pub(super) fn controller_gone(observed: &Observed) -> Option<String> {
    let exists =
        observed.controller.is_some() || observed.stale_controller || observed.controller_pods > 0;
    exists.then(|| {
        format!(
            "controller workload deleting: {} pod(s) left",
            observed.controller_pods
        )
    })
}

pub(super) fn node_gone(observed: &Observed) -> Option<String> {
    (observed.node.is_some() || observed.node_pods > 0).then(|| {
        format!(
            "node DaemonSet deleting: {} pod(s) left",
            observed.node_pods
        )
    })
}
