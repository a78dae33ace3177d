//! What every reconciliation shares: the client, the recorder, the caches
//! and the per-object bookkeeping.

use std::sync::Arc;

use csiops_crds::CSIDriverDeployment;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use super::events;
use super::pacing::{fresh, pace, retry};
use super::scope;
use super::watch::caches;
use crate::metrics::Metrics;
use crate::render::RenderConfig;

/// Shared state of every reconciliation.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub render_cfg: RenderConfig,
    /// Pods, workloads, nodes, CSINodes, mount failures and the objects
    /// applied, kept by watches (see [`caches`]).
    pub caches: caches::Caches,
    pub deployments: Store<CSIDriverDeployment>,
    /// Consecutive failed writes per object, for backoff and reporting.
    pub failures: retry::Failures,
    /// At most one reconcile per object every quarter second.
    pub pacer: pace::Pacer,
    /// `--watch-namespaces`: where objects are acted on.
    pub scope: scope::Namespaces,
    /// Which cached copies are current (see [`fresh`]).
    pub fresh: fresh::Freshness,
    /// At most one status write a second that only moves counts.
    pub progress_writes: pace::Pacer,
    /// Standing warnings already published (see [`events::Told`]).
    pub told: events::Told,
}

/// `namespace/name`: how the per-object bookkeeping (pacing, freshness,
/// failures, progress writes) keys an object.
pub(crate) fn object_key(obj: &CSIDriverDeployment) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}
