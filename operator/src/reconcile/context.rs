//! What every reconciliation shares: the client, the recorder, the caches
//! and what is kept of each object between its passes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use csiops_crds::CSIDriverDeployment;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use super::events;
use super::pacing::{fresh, pace, retry};
use super::scope;
use super::watch::{admission, caches};
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
    /// At most one reconcile per object every quarter second.
    pub pacer: pace::Pacer,
    /// `--watch-namespaces`: where objects are acted on.
    pub scope: scope::Namespaces,
    /// At most one status write a second that only moves counts.
    pub progress_writes: pace::Pacer,
    /// What is kept of each object between its passes.
    pub objects: Objects,
    /// Whether the shipped admission policies are in force.
    pub admission: admission::Admission,
}

/// What is kept of one object between its passes.
#[derive(Debug, Default)]
pub struct ObjectState {
    /// Its last pass let through [`Context::pacer`].
    pub paced: pace::Last,
    /// Its last status write let through [`Context::progress_writes`].
    pub progress_written: pace::Last,
    /// Which copy of it is current (see `pacing::fresh`).
    pub fresh: fresh::Freshness,
    /// Consecutive failed writes, for backoff and reporting.
    pub failures: retry::Failures,
    /// Standing warnings already published (see [`events::Told`]).
    pub told: events::Told,
}

/// One [`ObjectState`] per object (by [`object_key`]), under one lock,
/// dropped in one place when the object is gone or torn down.
#[derive(Debug, Default)]
pub struct Objects(Mutex<HashMap<String, ObjectState>>);

impl Objects {
    /// `f` on the state of object `key` (a new one if none is kept).
    pub fn with<R>(&self, key: &str, f: impl FnOnce(&mut ObjectState) -> R) -> R {
        // A poisoned lock only means another reconciliation panicked while
        // holding it; the records are still usable.
        let mut objects = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(state) = objects.get_mut(key) {
            return f(state);
        }
        f(objects.entry(key.to_string()).or_default())
    }

    /// Whether a record of object `key` is kept.
    #[cfg(test)]
    pub fn holds(&self, key: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(key)
    }

    /// Object `key` is gone or torn down.
    pub fn forget(&self, key: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

/// `namespace/name`: how [`Objects`] keys an object.
pub(crate) fn object_key(obj: &CSIDriverDeployment) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}
