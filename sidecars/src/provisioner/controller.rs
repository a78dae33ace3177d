//! The provisioner's controller: builds the [`Context`] (shared caches of
//! claims, classes, PVs, CSINodes, Nodes, VolumeAttachments and
//! VolumeAttributesClasses, so no per-claim GET of a Node or CSINode; a
//! claim queue and a volume queue with per-key backoff) and runs the
//! workers that hand each key to its handler: [`super::claim`],
//! [`super::volume`], [`super::sweep`]. CSI calls of both queues share
//! `--worker-threads` permits.
//!
//! In node deployment Nodes and CSINodes are not watched: their caches
//! hold the one Node and CSINode made from the driver's NodeGetInfo (see
//! [`super::node_deployment`]), which is all the topology code needs there
//! and spares every node a watch of every Node.

use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::capabilities::DriverCapabilities;
use super::claim::{self, error::ClaimError};
use super::cloning::release;
use super::context::{Caches, Context, Queues};
use super::decide::{claim_is_for, pv_is_ours, ClaimKey};
use super::journal::{Holds, Journal};
use super::metrics::OperationMetrics;
use super::node_deployment::{self, ThisNode};
use super::plan::ProvisionerConfig;
use super::{snapshot_protection, sweep, volume};
use crate::common::cache::Cached;
use crate::common::compact::{attached_volume, Compact};
use crate::common::driver::Driver;
use crate::common::kube::Clients;
use crate::common::watch::drive;
use csiops_runtime::chain;
use csiops_runtime::leader::LeaseGuard;
use csiops_runtime::shutdown::CancellationToken;
use tracing::Instrument;

/// Workers of the journal sweep: it is rare work (leader start, deleted
/// claims, failed attempts).
const INTENT_WORKERS: usize = 2;
/// How often every intent is swept again (the first sweep is at start).
const RESWEEP_INTERVAL: Duration = Duration::from_secs(300);

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What [`build`] needs besides the client.
pub struct Setup {
    pub driver: Driver,
    pub config: ProvisionerConfig,
    pub caps: DriverCapabilities,
    pub timeout: Duration,
    pub workers: usize,
    pub queues: Queues,
    pub metrics: Arc<OperationMetrics>,
    /// Node deployment (`--node-deployment`); `None` centrally.
    pub node: Option<Arc<ThisNode>>,
    /// See [`Context::lease`].
    pub lease: LeaseGuard,
}

/// A reflector whose events also go to `route`; managed fields are dropped
/// from the cache (they are most of an object's size and never read).
fn reflect<K>(api: Api<K>, route: impl Fn(&watcher::Event<K>) + Send + 'static) -> (Store<K>, Task)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|o| o.managed_fields_mut().clear())
        .reflect(writer);
    let task = drive(stream, kind, move |event| route(&event));
    (reader, Box::pin(task))
}

/// A watch into a [`Compact`] cache wrapped in a [`Cached`], which sees
/// every event after the cache and before `route`; managed fields are
/// dropped (never read).
fn reflect_cached<K>(
    api: Api<K>,
    route: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> (Arc<Cached<K>>, Task)
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let cached = Arc::new(Cached::new(Compact::new()));
    let (task, _) = reflect_compact(api, cached.store().clone(), {
        let cached = cached.clone();
        move |event| {
            cached.observe(event);
            route(event);
        }
    });
    (cached, task)
}

/// A watch into `cache`, whose events then go to `route`; managed fields
/// are dropped.
fn reflect_compact<K>(
    api: Api<K>,
    cache: Compact<K>,
    route: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> (Task, Compact<K>)
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|o| o.managed_fields_mut().clear());
    let reader = cache.clone();
    let task = drive(stream, kind, move |event| {
        cache.apply(&event);
        route(&event);
    });
    (Box::pin(task), reader)
}

/// A cache that never changes, holding `objects`: node deployment's Node
/// and CSINode.
pub fn fixed_store<K>(objects: Vec<K>) -> Store<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    reader
}

fn applied<K>(event: &watcher::Event<K>) -> Option<&K> {
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => Some(o),
        _ => None,
    }
}

/// The caches, queues and watch tasks (not started).
pub fn build(
    clients: Clients,
    setup: Setup,
    journal: Option<Arc<Journal>>,
) -> (Arc<Context>, Vec<Task>) {
    let client = clients.normal;
    let driver_name = setup.config.driver_name.clone();
    let Queues {
        claims,
        volumes,
        intents,
        cloning,
        infeasible,
    } = setup.queues;
    let mut tasks = Vec::new();

    let (claims_store, task) = {
        let (queue, iq, driver) = (claims.clone(), intents.clone(), driver_name.clone());
        let (namer, journaled) = (setup.config.namer.clone(), journal.is_some());
        let clones = cloning.clone();
        let node = setup.node.clone();
        reflect_cached(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            move |e| {
                for key in super::cloning::keys_to_check(e) {
                    clones.queue.add(key);
                }
                match e {
                    watcher::Event::Apply(c) | watcher::Event::InitApply(c)
                        if claim_is_for(c, &driver) =>
                    {
                        queue.add(ObjectRef::from_obj(c));
                    }
                    // A claim gone while its volume may exist: the
                    // sweep looks at its intent, if there is one. On a
                    // node, no race for it goes on.
                    watcher::Event::Delete(c) if claim_is_for(c, &driver) => {
                        if let (Some(node), Some(uid)) = (&node, c.uid()) {
                            node.races.forget(&uid);
                        }
                        if let Some(name) = c
                            .uid()
                            .filter(|_| journaled)
                            .and_then(|u| namer.pv_name(&u).ok())
                        {
                            iq.add(name);
                        }
                    }
                    _ => {}
                }
            },
        )
    };
    tasks.push(task);
    let (volumes_store, task) = {
        let (vq, cq, driver) = (volumes.clone(), claims.clone(), driver_name.clone());
        reflect_cached(Api::<PersistentVolume>::all(client.clone()), move |e| {
            if let Some(pv) = applied(e) {
                if pv_is_ours(pv, &driver) {
                    vq.add(pv.name_any());
                    // A claim still holding our finalizer lets go once
                    // its PV is seen.
                    if let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
                        if let (Some(ns), Some(name)) = (&r.namespace, &r.name) {
                            cq.add(ObjectRef::new(name).within(ns));
                        }
                    }
                }
            }
        })
    };
    tasks.push(task);
    let attachments = if !node_deployment::watches_attachments(setup.node.is_some(), setup.caps) {
        Compact::of([])
    } else {
        let vq = volumes.clone();
        let (task, attachments) = reflect_compact(
            Api::<VolumeAttachment>::all(client.clone()),
            Compact::indexed(attached_volume),
            move |e| {
                // A deletion waiting for a detach can go on now.
                if let watcher::Event::Delete(va) = e {
                    if let Some(pv) = &va.spec.source.persistent_volume_name {
                        vq.add(pv.clone());
                    }
                }
            },
        );
        tasks.push(task);
        attachments
    };
    let (classes, task) = reflect(Api::<StorageClass>::all(client.clone()), |_| {});
    tasks.push(task);
    let attributes_classes = if setup.config.volume_attributes_class {
        // A class that appears wakes the claims waiting for it, at
        // once rather than at their next backoff.
        let (queue, waiting, driver) = (claims.clone(), claims_store.clone(), driver_name.clone());
        let (store, task) = reflect(
            Api::<VolumeAttributesClass>::all(client.clone()),
            move |e| {
                let Some(name) = applied(e).and_then(|c| c.metadata.name.as_deref()) else {
                    return;
                };
                for claim in waiting.store().iter() {
                    if claim_is_for(&claim, &driver)
                        && super::attributes_class::waits_for(&claim, name, true)
                    {
                        queue.add(ObjectRef::from_obj(&claim));
                    }
                }
            },
        );
        tasks.push(task);
        store
    } else {
        fixed_store(Vec::new())
    };
    let (csi_nodes, nodes) = match &setup.node {
        Some(node) => {
            let (n, c) = node.local.objects(&driver_name);
            (fixed_store(vec![c]), fixed_store(vec![n]))
        }
        None => {
            let (csi_nodes, task) = reflect(Api::<CSINode>::all(client.clone()), |_| {});
            tasks.push(task);
            let (nodes, task) = reflect(Api::<Node>::all(client.clone()), |_| {});
            tasks.push(task);
            (csi_nodes, nodes)
        }
    };

    let recorder = Recorder::new(
        clients.events,
        Reporter {
            controller: "external-provisioner".into(),
            instance: setup.config.identity.clone(),
        },
    );
    let cx = Context {
        client,
        critical: clients.critical,
        bookkeeping: clients.bookkeeping,
        driver: setup.driver,
        config: setup.config,
        caps: setup.caps,
        timeout: setup.timeout,
        caches: Caches {
            claims: claims_store,
            classes,
            volumes: volumes_store,
            csi_nodes,
            nodes,
            attachments,
            attributes_classes,
        },
        claims,
        volumes,
        intents,
        journal,
        holds: Holds::default(),
        cloning,
        infeasible,
        calls: Semaphore::new(setup.workers),
        recorder,
        metrics: setup.metrics,
        node: setup.node,
        lease: setup.lease,
    };
    (Arc::new(cx), tasks)
}

/// Starts the watches, waits for every cache, then runs `workers`
/// workers per queue until `shutdown`. Every task is owned by this
/// future: dropping it (the Lease lost, see `common::role::lead`) aborts
/// them all at once, a CSI call in flight included.
pub async fn run(
    cx: Arc<Context>,
    watches: Vec<Task>,
    workers: usize,
    shutdown: CancellationToken,
) {
    let mut background = JoinSet::new();
    for w in watches {
        background.spawn(w);
    }
    // One waiter per store: a store's readiness wakes a single waiter.
    let caches = &cx.caches;
    let synced = async {
        caches.claims.store().ready().await;
        caches.volumes.store().ready().await;
        let _ = caches.classes.wait_until_ready().await;
        let _ = caches.csi_nodes.wait_until_ready().await;
        let _ = caches.nodes.wait_until_ready().await;
        caches.attachments.ready().await;
    };
    tokio::select! {
        () = synced => {}
        () = shutdown.cancelled() => {
            background.abort_all();
            return;
        }
    }
    tracing::info!(
        claims = caches.claims.store().len(),
        volumes = caches.volumes.store().len(),
        "caches synced; provisioning"
    );
    // The journal's writer outlives the workers: a worker finishing its
    // claim at shutdown may still wait for an intent or leave a trim.
    let writer_stop = CancellationToken::new();
    if let Some(journal) = &cx.journal {
        background.spawn(journal.clone().run_writer(writer_stop.clone()));
        background.spawn(resweep_periodically(cx.clone()));
    }
    let mut worker_tasks = JoinSet::new();
    for _ in 0..workers {
        worker_tasks.spawn(claim_worker(cx.clone()));
        worker_tasks.spawn(volume_worker(cx.clone()));
    }
    for _ in 0..INTENT_WORKERS {
        worker_tasks.spawn(intent_worker(cx.clone()));
    }
    let sweep = cx.config.snapshot_orphan_sweep_interval;
    if cx.caps.create_delete_snapshot && !sweep.is_zero() {
        background.spawn(snapshot_protection::sweep_snapshot_finalizers(
            cx.clone(),
            sweep,
        ));
    }
    for _ in 0..cx.config.cloning_protection_threads {
        worker_tasks.spawn(release::cloning_worker(cx.clone()));
    }
    shutdown.cancelled().await;
    // Workers finish the object in hand (a CSI call ends within
    // --timeout), then see the closed queues.
    cx.claims.shut_down();
    cx.volumes.shut_down();
    cx.intents.shut_down();
    cx.cloning.queue.shut_down();
    while worker_tasks.join_next().await.is_some() {}
    // Trims not written yet are harmless: the next leader's sweep finds
    // their PVs and trims them.
    writer_stop.cancel();
    background.abort_all();
}

async fn claim_worker(cx: Arc<Context>) {
    while let Some(key) = cx.claims.next().await {
        let span = tracing::info_span!("sync", claim = %super::decide::display(&key));
        claim_pass(&cx, &key).instrument(span).await;
        cx.claims.done(&key);
    }
}

/// One sync of a claim, its failure logged, reported and retried.
async fn claim_pass(cx: &Context, key: &ClaimKey) {
    {
        match claim::sync_claim(cx, key).await {
            Ok(()) => cx.claims.forget(key),
            Err(e) if e.quiet() => {
                tracing::debug!(why = %e, "not this node's claim yet; will look again");
                cx.claims.add_rate_limited(key.clone());
            }
            Err(ClaimError::RecentlyInfeasible { left }) => {
                tracing::debug!(retry_in = ?left, "the driver refused this claim's request as infeasible; waiting");
                cx.claims.add_after(key.clone(), left);
            }
            Err(e @ ClaimError::Create { .. }) if e.infeasible() => {
                let claim = cx.caches.claims.get(key);
                let wait = cx.infeasible.wait();
                tracing::warn!(error = %chain(&e), retry_in = ?wait, "provisioning failed with an infeasible request; retries are delayed");
                if let Some(claim) = claim {
                    let class = super::decide::class_name(&claim).unwrap_or_default();
                    let class_uid = cx
                        .caches
                        .classes
                        .get(&ObjectRef::new(class))
                        .and_then(|c| c.uid())
                        .unwrap_or_default();
                    cx.infeasible.refused(
                        claim.uid().as_deref().unwrap_or_default(),
                        &class_uid,
                        tokio::time::Instant::now(),
                    );
                    cx.metrics
                        .failed(super::metrics::Operation::Provision, class);
                    // Upstream's words, which admins grep for.
                    let note = format!(
                        "Volume provisioning failed with infeasible error. Retries will be delayed. {}",
                        chain(&e)
                    );
                    cx.warn(claim.as_ref(), e.reason(), note).await;
                }
                cx.claims.add_after(key.clone(), wait);
            }
            Err(e) => {
                let claim = cx.caches.claims.get(key);
                tracing::warn!(error = %chain(&e), "provisioning failed; will retry");
                if let Some(claim) = claim {
                    let class = super::decide::class_name(&claim).unwrap_or_default();
                    cx.metrics
                        .failed(super::metrics::Operation::Provision, class);
                    let note = chain(&e).to_string();
                    cx.warn(claim.as_ref(), e.reason(), note).await;
                }
                cx.claims.add_rate_limited(key.clone());
            }
        }
    }
}

async fn intent_worker(cx: Arc<Context>) {
    while let Some(name) = cx.intents.next().await {
        let span = tracing::info_span!("sweep", volume = %name);
        intent_pass(&cx, &name).instrument(span).await;
        cx.intents.done(&name);
    }
}

/// One sweep of an intent, its failure logged and retried (there may be
/// no object left to carry an Event).
pub(super) async fn intent_pass(cx: &Context, name: &str) {
    let result = sweep::sync_intent(cx, name).await;
    let blocked = result.as_ref().is_err_and(|e| e.is_blocked());
    cx.metrics.journal.set_blocked(name, blocked);
    match result {
        Ok(()) => cx.intents.forget(&name.to_string()),
        Err(e) => {
            tracing::warn!(error = %chain(&e), "cleaning up after an abandoned volume failed; will retry");
            if blocked {
                // The claim is gone: the journal is what an admin looks at.
                if let Some(journal) = &cx.journal {
                    let note = chain(&e).to_string();
                    cx.warn(&journal.object_ref(), "VolumeCleanupBlocked", note)
                        .await;
                }
            }
            cx.intents.add_rate_limited(name.to_string());
        }
    }
}

/// Every intent of the journal, swept again now and then: a claim
/// deletion missed by the watch (a relist drops Delete events) is found
/// this way.
async fn resweep_periodically(cx: Arc<Context>) {
    let Some(journal) = cx.journal.clone() else {
        return;
    };
    loop {
        for name in journal.names() {
            cx.intents.add(name);
        }
        tokio::time::sleep(RESWEEP_INTERVAL).await;
    }
}

async fn volume_worker(cx: Arc<Context>) {
    while let Some(name) = cx.volumes.next().await {
        let span = tracing::info_span!("sync", pv = %name);
        volume_pass(&cx, &name).instrument(span).await;
        cx.volumes.done(&name);
    }
}

/// One sync of a PV, its failure logged, reported and retried.
async fn volume_pass(cx: &Context, name: &str) {
    {
        match volume::sync_volume(cx, name).await {
            Ok(()) => cx.volumes.forget(&name.to_string()),
            Err(e) => {
                tracing::warn!(error = %chain(&e), "volume deletion failed; will retry");
                if let Some(pv) = cx.caches.volumes.get(&ObjectRef::new(name)) {
                    cx.metrics
                        .failed(super::metrics::Operation::Delete, super::pv::class_of(&pv));
                    let note = chain(&e).to_string();
                    cx.warn(pv.as_ref(), "VolumeFailedDelete", note).await;
                }
                cx.volumes.add_rate_limited(name.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests;
