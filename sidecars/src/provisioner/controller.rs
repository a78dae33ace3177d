//! The provisioner's controller: shared caches of claims, classes, PVs,
//! CSINodes, Nodes, VolumeAttachments and VolumeAttributesClasses (no
//! per-claim GET of a Node or CSINode), a claim queue and a volume queue with per-key backoff, and
//! workers that run [`super::claim`] and [`super::volume`] syncs. CSI calls
//! of both queues share `--worker-threads` permits.
//!
//! In node deployment Nodes and CSINodes are not watched: their caches
//! hold the one Node and CSINode made from the driver's NodeGetInfo (see
//! [`super::node_deployment`]), which is all the topology code needs there
//! and spares every node a watch of every Node.

use std::collections::HashMap;
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
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::common::kube::Clients;
use crate::common::ratelimit;
use csiops_proto::csi::v1::{CreateVolumeRequest, Volume};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tonic::Status;

use super::claim::ClaimError;
use super::cloning::Cloning;
use super::decide::{claim_is_for, pv_is_ours};
use super::infeasible::Infeasible;
use super::journal::{Holds, Journal};
use super::metrics::OperationMetrics;
use super::node_deployment::{self, ThisNode};
use super::plan::{DriverCapabilities, ProvisionerConfig};
use crate::common::cache::Cached;
use crate::common::driver::Driver;
use crate::common::watch::drive;
use crate::common::workqueue::{Backoff, WorkQueue};
use csiops_runtime::chain;
use csiops_runtime::error::ellipsize;
use csiops_runtime::leader::LeaseGuard;
use csiops_runtime::shutdown::CancellationToken;
use tracing::Instrument;

pub type ClaimKey = ObjectRef<PersistentVolumeClaim>;

/// Workers of the journal sweep: it is rare work (leader start, deleted
/// claims, failed attempts).
const INTENT_WORKERS: usize = 2;
/// How often every intent is swept again (the first sweep is at start).
const RESWEEP_INTERVAL: Duration = Duration::from_secs(300);

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The informer caches.
/// Claims and PVs are read through [`Cached`]: what this process wrote or
/// deleted wins until the watch shows it, so a sync right after our own
/// write neither provisions nor deletes a second time.
pub struct Caches {
    pub claims: Arc<Cached<PersistentVolumeClaim>>,
    pub classes: Store<StorageClass>,
    pub volumes: Arc<Cached<PersistentVolume>>,
    pub csi_nodes: Store<CSINode>,
    pub nodes: Store<Node>,
    pub attachments: Store<VolumeAttachment>,
    /// Watched with the `VolumeAttributesClass` gate on (else always
    /// empty). Not waited for at start: without RBAC to list them the
    /// provisioner still works, reading a claim's class on its own as
    /// upstream does (see `claim`).
    pub attributes_classes: Store<VolumeAttributesClass>,
}

/// The queues, made before the metrics registry is shared.
pub struct Queues {
    pub claims: Arc<WorkQueue<ClaimKey>>,
    pub volumes: Arc<WorkQueue<String>>,
    /// Volume names whose journal intent the sweep looks at.
    pub intents: Arc<WorkQueue<String>>,
    /// Clone sources whose cloning-protection finalizer may come off.
    pub cloning: Arc<Cloning>,
    /// Claims the driver refused as infeasible, waiting the maximum interval.
    pub infeasible: Arc<Infeasible>,
}

impl Queues {
    pub fn new(backoff: Backoff) -> Self {
        Queues {
            infeasible: Arc::new(Infeasible::new(backoff.max)),
            claims: Arc::new(WorkQueue::new(backoff)),
            volumes: Arc::new(WorkQueue::new(backoff)),
            intents: Arc::new(WorkQueue::new(backoff)),
            cloning: Arc::new(Cloning::new(backoff)),
        }
    }
}

/// Everything a sync needs.
pub struct Provisioner {
    /// Reads, watches, and writes on the way to a volume.
    pub client: kube::Client,
    /// PV create and delete (and the PV finalizer that holds a delete):
    /// served first by the rate limiter (see `common::ratelimit`).
    pub critical: kube::Client,
    /// Claim finalizers and journal trims, after the fact: served last but
    /// Events.
    pub bookkeeping: kube::Client,
    pub driver: Driver,
    pub config: ProvisionerConfig,
    pub caps: DriverCapabilities,
    /// `--timeout` of each CreateVolume/DeleteVolume.
    pub timeout: Duration,
    pub caches: Caches,
    pub claims: Arc<WorkQueue<ClaimKey>>,
    pub volumes: Arc<WorkQueue<String>>,
    pub intents: Arc<WorkQueue<String>>,
    /// The intent journal; `None` when the provisioner may not write it
    /// (then each claim carries a finalizer instead, see `super::journal`).
    pub journal: Option<Arc<Journal>>,
    /// Volume names a claim sync or the sweep works on right now.
    pub holds: Holds,
    /// See [`super::cloning`].
    pub cloning: Arc<Cloning>,
    /// See [`super::infeasible`].
    pub infeasible: Arc<Infeasible>,
    /// `--worker-threads` permits for CSI calls.
    pub calls: Semaphore,
    pub recorder: Recorder,
    pub metrics: Arc<OperationMetrics>,
    /// Node deployment: this node and its races; `None` centrally.
    pub node: Option<Arc<ThisNode>>,
    /// Held while this replica leads (always on a node): consulted before
    /// every CreateVolume and DeleteVolume (the clients consult it before
    /// every write).
    pub lease: LeaseGuard,
}

/// What [`Provisioner::new`] needs besides the client.
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
    /// See [`Provisioner::lease`].
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

/// [`reflect`] into a [`Cached`], which sees every event first (see
/// [`Cached::observe`]).
fn reflect_cached<K>(
    api: Api<K>,
    route: impl Fn(&watcher::Event<K>) + Send + 'static,
) -> (Arc<Cached<K>>, Task)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let slot: Arc<std::sync::OnceLock<Arc<Cached<K>>>> = Arc::default();
    let cached = slot.clone();
    let (store, task) = reflect(api, move |event| {
        if let Some(cached) = cached.get() {
            cached.observe(event);
        }
        route(event);
    });
    let cached = Arc::new(Cached::new(store));
    let _ = slot.set(cached.clone());
    (cached, task)
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

impl Provisioner {
    /// The caches, queues and watch tasks (not started).
    pub fn new(
        clients: Clients,
        setup: Setup,
        journal: Option<Arc<Journal>>,
    ) -> (Arc<Provisioner>, Vec<Task>) {
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
        let attachments = if !node_deployment::watches_attachments(setup.node.is_some(), setup.caps)
        {
            fixed_store(Vec::new())
        } else {
            let vq = volumes.clone();
            let (attachments, task) =
                reflect(Api::<VolumeAttachment>::all(client.clone()), move |e| {
                    // A deletion waiting for a detach can go on now.
                    if let watcher::Event::Delete(va) = e {
                        if let Some(pv) = &va.spec.source.persistent_volume_name {
                            vq.add(pv.clone());
                        }
                    }
                });
            tasks.push(task);
            attachments
        };
        let (classes, task) = reflect(Api::<StorageClass>::all(client.clone()), |_| {});
        tasks.push(task);
        let attributes_classes = if setup.config.volume_attributes_class {
            // A class that appears wakes the claims waiting for it, at
            // once rather than at their next backoff.
            let (queue, waiting, driver) =
                (claims.clone(), claims_store.clone(), driver_name.clone());
            let (store, task) = reflect(
                Api::<VolumeAttributesClass>::all(client.clone()),
                move |e| {
                    let Some(name) = applied(e).and_then(|c| c.metadata.name.as_deref()) else {
                        return;
                    };
                    for claim in waiting.store().state() {
                        if claim_is_for(&claim, &driver)
                            && super::attributes_class::waits_for(&claim, name, true)
                        {
                            queue.add(ObjectRef::from_obj(claim.as_ref()));
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
        let provisioner = Provisioner {
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
        (Arc::new(provisioner), tasks)
    }

    /// Starts the watches, waits for every cache, then runs `workers`
    /// workers per queue until `shutdown`. Every task is owned by this
    /// future: dropping it (the Lease lost, see `common::role::lead`) aborts
    /// them all at once, a CSI call in flight included.
    pub async fn run(
        self: Arc<Self>,
        watches: Vec<Task>,
        workers: usize,
        shutdown: CancellationToken,
    ) {
        let mut background = JoinSet::new();
        for w in watches {
            background.spawn(w);
        }
        // One waiter per store: a store's readiness wakes a single waiter.
        let caches = &self.caches;
        let synced = async {
            let _ = caches.claims.store().wait_until_ready().await;
            let _ = caches.volumes.store().wait_until_ready().await;
            let _ = caches.classes.wait_until_ready().await;
            let _ = caches.csi_nodes.wait_until_ready().await;
            let _ = caches.nodes.wait_until_ready().await;
            let _ = caches.attachments.wait_until_ready().await;
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
        if let Some(journal) = &self.journal {
            background.spawn(journal.clone().run_writer(writer_stop.clone()));
            background.spawn(self.clone().resweep_periodically());
        }
        let mut worker_tasks = JoinSet::new();
        for _ in 0..workers {
            worker_tasks.spawn(self.clone().claim_worker());
            worker_tasks.spawn(self.clone().volume_worker());
        }
        for _ in 0..INTENT_WORKERS {
            worker_tasks.spawn(self.clone().intent_worker());
        }
        let sweep = self.config.snapshot_orphan_sweep_interval;
        if self.caps.create_delete_snapshot && !sweep.is_zero() {
            background.spawn(self.clone().sweep_snapshot_finalizers(sweep));
        }
        for _ in 0..self.config.cloning_protection_threads {
            worker_tasks.spawn(self.clone().cloning_worker());
        }
        shutdown.cancelled().await;
        // Workers finish the object in hand (a CSI call ends within
        // --timeout), then see the closed queues.
        self.claims.shut_down();
        self.volumes.shut_down();
        self.intents.shut_down();
        self.cloning.queue.shut_down();
        while worker_tasks.join_next().await.is_some() {}
        // Trims not written yet are harmless: the next leader's sweep finds
        // their PVs and trims them.
        writer_stop.cancel();
        background.abort_all();
    }

    async fn claim_worker(self: Arc<Self>) {
        while let Some(key) = self.claims.next().await {
            let span = tracing::info_span!("sync", claim = %super::claim::display(&key));
            self.claim_pass(&key).instrument(span).await;
            self.claims.done(&key);
        }
    }

    /// One sync of a claim, its failure logged, reported and retried.
    async fn claim_pass(&self, key: &ClaimKey) {
        {
            match self.sync_claim(key).await {
                Ok(()) => self.claims.forget(key),
                Err(e) if e.quiet() => {
                    tracing::debug!(why = %e, "not this node's claim yet; will look again");
                    self.claims.add_rate_limited(key.clone());
                }
                Err(ClaimError::RecentlyInfeasible { left }) => {
                    tracing::debug!(retry_in = ?left, "the driver refused this claim's request as infeasible; waiting");
                    self.claims.add_after(key.clone(), left);
                }
                Err(e @ ClaimError::Create { .. }) if e.infeasible() => {
                    let claim = self.caches.claims.get(key);
                    let wait = self.infeasible.wait();
                    tracing::warn!(error = %chain(&e), retry_in = ?wait, "provisioning failed with an infeasible request; retries are delayed");
                    if let Some(claim) = claim {
                        let class = super::decide::class_name(&claim).unwrap_or_default();
                        let class_uid = self
                            .caches
                            .classes
                            .get(&ObjectRef::new(class))
                            .and_then(|c| c.uid())
                            .unwrap_or_default();
                        self.infeasible.refused(
                            claim.uid().as_deref().unwrap_or_default(),
                            &class_uid,
                            tokio::time::Instant::now(),
                        );
                        self.metrics
                            .failed(super::metrics::Operation::Provision, class);
                        // Upstream's words, which admins grep for.
                        let note = format!(
                            "Volume provisioning failed with infeasible error. Retries will be delayed. {}",
                            chain(&e)
                        );
                        self.warn(claim.as_ref(), e.reason(), note).await;
                    }
                    self.claims.add_after(key.clone(), wait);
                }
                Err(e) => {
                    let claim = self.caches.claims.get(key);
                    tracing::warn!(error = %chain(&e), "provisioning failed; will retry");
                    if let Some(claim) = claim {
                        let class = super::decide::class_name(&claim).unwrap_or_default();
                        self.metrics
                            .failed(super::metrics::Operation::Provision, class);
                        let note = chain(&e).to_string();
                        self.warn(claim.as_ref(), e.reason(), note).await;
                    }
                    self.claims.add_rate_limited(key.clone());
                }
            }
        }
    }

    async fn intent_worker(self: Arc<Self>) {
        while let Some(name) = self.intents.next().await {
            let span = tracing::info_span!("sweep", volume = %name);
            self.intent_pass(&name).instrument(span).await;
            self.intents.done(&name);
        }
    }

    /// One sweep of an intent, its failure logged and retried (there may be
    /// no object left to carry an Event).
    pub(super) async fn intent_pass(&self, name: &str) {
        let result = self.sync_intent(name).await;
        let blocked = result.as_ref().is_err_and(|e| e.is_blocked());
        self.metrics.journal.set_blocked(name, blocked);
        match result {
            Ok(()) => self.intents.forget(&name.to_string()),
            Err(e) => {
                tracing::warn!(error = %chain(&e), "cleaning up after an abandoned volume failed; will retry");
                if blocked {
                    // The claim is gone: the journal is what an admin looks at.
                    if let Some(journal) = &self.journal {
                        let note = chain(&e).to_string();
                        self.warn(&journal.object_ref(), "VolumeCleanupBlocked", note)
                            .await;
                    }
                }
                self.intents.add_rate_limited(name.to_string());
            }
        }
    }

    /// Every intent of the journal, swept again now and then: a claim
    /// deletion missed by the watch (a relist drops Delete events) is found
    /// this way.
    async fn resweep_periodically(self: Arc<Self>) {
        let Some(journal) = self.journal.clone() else {
            return;
        };
        loop {
            for name in journal.names() {
                self.intents.add(name);
            }
            tokio::time::sleep(RESWEEP_INTERVAL).await;
        }
    }

    async fn volume_worker(self: Arc<Self>) {
        while let Some(name) = self.volumes.next().await {
            let span = tracing::info_span!("sync", pv = %name);
            self.volume_pass(&name).instrument(span).await;
            self.volumes.done(&name);
        }
    }

    /// One sync of a PV, its failure logged, reported and retried.
    async fn volume_pass(&self, name: &str) {
        {
            match self.sync_volume(name).await {
                Ok(()) => self.volumes.forget(&name.to_string()),
                Err(e) => {
                    tracing::warn!(error = %chain(&e), "volume deletion failed; will retry");
                    if let Some(pv) = self.caches.volumes.get(&ObjectRef::new(name)) {
                        self.metrics
                            .failed(super::metrics::Operation::Delete, super::pv::class_of(&pv));
                        let note = chain(&e).to_string();
                        self.warn(pv.as_ref(), "VolumeFailedDelete", note).await;
                    }
                    self.volumes.add_rate_limited(name.to_string());
                }
            }
        }
    }

    /// Publishes an Event; a refused Event is logged, never fatal.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(ellipsize(&note, 1000)),
            action: reason.to_string(),
            secondary: None,
        };
        // Sent on its own: nobody waits on an Event, and under pressure it
        // waits for a token behind every other write, or is dropped.
        let (recorder, reference, reason) = (
            self.recorder.clone(),
            obj.object_ref(&()),
            reason.to_string(),
        );
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                if ratelimit::was_shed(&e) {
                    tracing::debug!(%reason, "Event dropped by the API rate limit");
                } else {
                    tracing::warn!(%reason, error = %chain(&e), "cannot publish event");
                }
            }
        });
    }

    pub async fn warn<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: String) {
        self.event(obj, EventType::Warning, reason, note).await;
    }

    /// CreateVolume with `--timeout`, only while this replica leads: a
    /// refusal is `Aborted` (never sent, so nothing is known of the volume:
    /// the journal keeps its intent).
    pub async fn create_volume(&self, request: CreateVolumeRequest) -> Result<Volume, Status> {
        self.leading()?;
        super::csi::create_volume(&self.driver, request, self.timeout).await
    }

    /// DeleteVolume with `--timeout`, only while this replica leads.
    pub async fn delete_volume(
        &self,
        volume_id: &str,
        secrets: HashMap<String, String>,
    ) -> Result<(), Status> {
        self.leading()?;
        super::csi::delete_volume(&self.driver, volume_id, secrets, self.timeout).await
    }

    fn leading(&self) -> Result<(), Status> {
        self.lease
            .check()
            .map_err(|e| Status::aborted(format!("not sent: {e}")))
    }
}

#[cfg(test)]
mod tests;
