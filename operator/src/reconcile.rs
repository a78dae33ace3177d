//! The controller: one reconciliation turns a `CSIDriverDeployment` into its
//! children, drives the ordered rollout one step further and writes status.
//!
//! The loop itself is [`run`] (the watches that wake an object) and
//! `pass` (one reconciliation); around it, by concern:
//! - `watch`: the caches the watches keep (pods, workloads, nodes,
//!   CSINodes, mount failures, the objects applied) and when they synced;
//! - `write`: every write to the API server (ownership-checked apply,
//!   supporting objects, workloads, pruning, status, the finalizer and the
//!   ordered teardown);
//! - `pacing`: how often an object is reconciled and retried.
//!
//! A pass reads `context::Context` and the caches, decides with the pure
//! `render`, `health`, `rollout` and `report` modules, and writes; nothing
//! under `watch`, `write` or `pacing` calls back into the loop.

mod conflict;
mod context;
mod error;
mod events;
mod pacing;
mod pass;
mod scope;
mod watch;
mod write;

use std::sync::Arc;
use std::time::Duration as StdDuration;

use csiops_crds::CSIDriverDeployment;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::Client;
use tracing::{info, warn};

use self::context::Context;
use self::pacing::{pace, throttle};
use self::pass::{error_policy, reconcile};
pub use self::scope::Namespaces;
use self::watch::{admission, caches, csinodes};
use self::write::status;
use crate::metrics::Metrics;
use crate::pods::PodView;
use crate::render::labels::INSTANCE;
use crate::render::RenderConfig;
use csiops_runtime::chain;

/// Options of [`run`].
pub struct RunConfig {
    pub render: RenderConfig,
    /// Reconciliations in parallel.
    pub concurrency: u16,
    /// Reporter instance in Events (the pod name).
    pub instance: Option<String>,
    /// `--watch-namespaces`.
    pub scope: scope::Namespaces,
    /// `--admission-check-seconds`, or `None` with `--admission-check=false`.
    pub admission_check: Option<StdDuration>,
}

/// Runs the controller until `shutdown` resolves. `on_ready` is called once
/// the caches have synced.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    cfg: RunConfig,
    on_ready: impl FnOnce() + Send + 'static,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (caches, triggers) = caches::Caches::start(&client, &cfg.scope);
    let (admission, admission_changed) = admission::start(&client, cfg.admission_check);
    let controller = Controller::new(
        Api::<CSIDriverDeployment>::all(client.clone()),
        watcher::Config::default(),
    );
    let deployments = controller.store();
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "csiops-operator".into(),
                instance: cfg.instance,
            },
        ),
        metrics,
        render_cfg: cfg.render,
        caches: caches.clone(),
        deployments: deployments.clone(),
        pacer: pace::Pacer::default(),
        scope: cfg.scope,
        progress_writes: pace::Pacer::new(status::PROGRESS_WRITE_INTERVAL),
        objects: Default::default(),
        admission,
    });

    // Readiness once every cache has its first full list.
    let gate = caches.synced.clone();
    tokio::spawn(async move {
        while !gate.ready() {
            tokio::time::sleep(StdDuration::from_millis(100)).await;
        }
        info!("caches synced");
        on_ready();
    });

    let all = |store: Store<CSIDriverDeployment>| {
        move || {
            store
                .state()
                .iter()
                .map(|d| ObjectRef::from_obj(d.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    let every = all(deployments.clone());
    let by_driver = deployments.clone();
    let pod_owners = caches.clone();
    // Drivers whose CSINode entries came or went (all after a relist).
    let csinode_refs = triggers
        .csinodes
        .filter_map(|r| futures::future::ready(r.ok()))
        .flat_map(move |changed| {
            let refs: Vec<_> = by_driver
                .state()
                .iter()
                .filter(|d| match &changed {
                    csinodes::Changed::All => true,
                    csinodes::Changed::Drivers(names) => names.contains(&d.spec.driver_name),
                })
                .map(|d| ObjectRef::from_obj(d.as_ref()))
                .collect();
            futures::stream::iter(refs)
        });
    // A pod whose mount failure is new: its owner.
    let failure_refs = triggers.mount_failures.filter_map(move |r| {
        let owner = r
            .ok()
            .and_then(|(ns, name)| pod_owners.owner_of_pod(&ns, &name));
        futures::future::ready(owner)
    });
    // A pod that changed or went: its owner, at most once per pacing
    // interval (a node roll changes pods far faster than that; see
    // `throttle`).
    let pod_refs = throttle::throttle(
        triggers
            .pods
            .filter_map(|r| futures::future::ready(r.ok().and_then(|p| pod_owner(&p))))
            .boxed(),
        pace::MIN_INTERVAL,
    );
    let supporting_refs = triggers
        .supporting
        .map(|(ns, name)| ObjectRef::new(&name).within(&ns));
    let node_targets = every;
    controller
        .owns_stream(triggers.statefulsets)
        .owns_stream(triggers.deployments)
        .owns_stream(triggers.daemonsets)
        .reconcile_on(pod_refs)
        // Only changes of what is kept of a node come through (readiness,
        // cordon, taints; see `watch::nodes`), never heartbeats: a node lost or
        // back can concern any driver.
        .watches_stream(triggers.nodes, move |_node: Node| node_targets())
        .reconcile_on(csinode_refs)
        .reconcile_on(failure_refs)
        .reconcile_on(supporting_refs)
        // Every object's status says whether the policies are in force.
        .reconcile_all_on(admission_changed)
        .with_config(kube::runtime::controller::Config::default().concurrency(cfg.concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                warn!(error = %chain(&e), "reconcile loop");
            }
        })
        .await;
}

/// The CSIDriverDeployment a pod belongs to, from its instance label.
fn pod_owner(pod: &PodView) -> Option<ObjectRef<CSIDriverDeployment>> {
    let name = pod.label(INSTANCE)?;
    Some(ObjectRef::new(name).within(&pod.namespace))
}
