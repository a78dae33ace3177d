//! What the rollout state machine reads off the live workloads: the
//! StatefulSet, Deployment and DaemonSet reduced to the few numbers and the
//! template hash that `rollout::next_step` decides on. Kept beside the state
//! machine (not in `health`) because these observations answer "where is the
//! roll", while `health` answers "is what runs well".

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{ControllerObs, NodeObs};
use crate::pods::{PodView, REVISION_LABEL};
use crate::render::labels::COMPONENT;

/// The live StatefulSet as the rollout state machine sees it.
pub fn controller_obs(sts: &StatefulSet, hash_annotation: &str) -> ControllerObs {
    let status = sts.status.as_ref();
    ControllerObs {
        hash: annotation(&sts.metadata, hash_annotation),
        generation: sts.metadata.generation.unwrap_or(0),
        observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
        spec_replicas: sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        replicas: status.map_or(0, |s| s.replicas),
        ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        updated: status.and_then(|s| s.updated_replicas).unwrap_or(0),
        partition: sts
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|u| u.rolling_update.as_ref())
            .and_then(|r| r.partition)
            .unwrap_or(0),
        updated_ready: 0,
    }
}

/// How many of `pods` (the controller's) run the StatefulSet's update
/// revision and are Ready: the surge replica's progress, which the
/// StatefulSet's own counters do not give (readyReplicas mixes revisions).
pub fn statefulset_updated_ready(sts: &StatefulSet, pods: &[PodView]) -> i32 {
    let Some(revision) = sts
        .status
        .as_ref()
        .and_then(|s| s.update_revision.as_deref())
    else {
        return 0;
    };
    pods.iter()
        .filter(|p| p.label(COMPONENT) == Some("controller") && !p.deleting())
        .filter(|p| p.label(REVISION_LABEL) == Some(revision) && p.is_ready())
        .count() as i32
}

/// The live controller Deployment as the rollout state machine sees it.
pub fn deployment_obs(d: &Deployment, hash_annotation: &str) -> ControllerObs {
    let status = d.status.as_ref();
    ControllerObs {
        hash: annotation(&d.metadata, hash_annotation),
        generation: d.metadata.generation.unwrap_or(0),
        observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
        spec_replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        replicas: status.and_then(|s| s.replicas).unwrap_or(0),
        ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        updated: status.and_then(|s| s.updated_replicas).unwrap_or(0),
        partition: 0,
        updated_ready: 0,
    }
}

/// The live DaemonSet as the rollout state machine sees it.
pub fn node_obs(ds: &DaemonSet, hash_annotation: &str) -> NodeObs {
    let status = ds.status.as_ref();
    NodeObs {
        hash: annotation(&ds.metadata, hash_annotation),
        generation: ds.metadata.generation.unwrap_or(0),
        observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
    }
}

fn annotation(meta: &ObjectMeta, key: &str) -> Option<String> {
    meta.annotations.as_ref().and_then(|a| a.get(key)).cloned()
}

#[cfg(test)]
mod tests;
