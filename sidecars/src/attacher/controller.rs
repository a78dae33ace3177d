//! The attacher's controller: reflector caches of VolumeAttachments, PVs,
//! CSINodes and Node metadata feed three work queues; workers carry out what
//! [`decide`](super::decide) says.
//!
//! - Attach and detach have separate queues with `--worker-threads` workers
//!   each, so a burst of slow detaches never holds up attaches (upstream
//!   serves both from one queue and one pool). Their CSI calls share
//!   `--worker-threads` permits of a first-come-first-served semaphore:
//!   the driver never sees more calls at once than the flag says, and an
//!   attach waits at most for the calls queued before it. A key is in at most one
//!   queue's hands at a time: a worker that finds the key busy in the other
//!   queue puts it back shortly, so an attach and a detach of the same
//!   VolumeAttachment never run concurrently (an unpublish overtaken by a
//!   late publish would leave the volume attached).
//! - The PV queue removes our PV finalizer; it starts only once every cache
//!   has listed, so "no VolumeAttachment refers to this PV" is never
//!   concluded from an empty cache.
//! - Writes per attach: the PV finalizer (once per PV, skipped when present),
//!   the VolumeAttachment finalizer together with the node-ID annotation
//!   (one patch), the status (one patch). Finalizers are only on the main
//!   resource and status only on `/status`, and the finalizer must precede
//!   the publish, so two writes per attachment is the floor. A detach is one
//!   write (the finalizer; the object then disappears, so its status is left
//!   alone unless another finalizer keeps it).

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use tonic::Status;

use super::cache::Cached;
use super::decide::{self, Mode, PvAction, Refusal, VaAction, Volume};
use super::metrics::{Write, Writes};
use super::node::{self, NodeIdError};
use super::request::{self, PublishCaps, RequestError, SecretRef};
use super::{csi, status};
use crate::common::driver::{code_name, Driver};
use crate::common::workqueue::{Backoff, QueueMetrics, WorkQueue};
use csiops_runtime::shutdown::CancellationToken;

/// Event reasons (close to the kubelet/attach-detach controller's wording).
pub const REASON_ATTACH_FAILED: &str = "AttachFailed";
pub const REASON_DETACH_FAILED: &str = "DetachFailed";

/// How soon a key busy in the other queue is looked at again.
const BUSY_RETRY: Duration = Duration::from_millis(50);

/// Everything a sync needs.
pub struct Config {
    pub driver_name: String,
    pub mode: Mode,
    pub caps: PublishCaps,
    pub default_fs_type: String,
    pub timeout: Duration,
    pub workers: usize,
    /// Re-queue every attachment this often (0: never), like upstream's `--resync`.
    pub resync: Duration,
}

/// Why one sync failed. The ones before the CSI call's answer are recorded
/// in `attachError`/`detachError`, like upstream.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    NodeId(#[from] NodeIdError),
    #[error("failed to load secret \"{namespace}/{name}\": {source}")]
    Secret {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("could not add PersistentVolume finalizer: {0}")]
    PvFinalizer(kube::Error),
    #[error("could not save VolumeAttachment: {0}")]
    SaveVa(kube::Error),
    #[error("rpc error: code = {} desc = {}", code_name(.0.code()), .0.message())]
    Csi(Status),
    #[error("could not mark as attached: {0}")]
    MarkAttached(kube::Error),
    #[error("could not mark as detached: {0}")]
    MarkDetached(kube::Error),
    #[error("could not remove PersistentVolume finalizer: {0}")]
    PvFinalizerRemove(kube::Error),
}

impl SyncError {
    /// Whether the error belongs in `attachError`/`detachError`.
    fn recorded(&self) -> bool {
        !matches!(
            self,
            SyncError::MarkAttached(_)
                | SyncError::MarkDetached(_)
                | SyncError::PvFinalizerRemove(_)
        )
    }
}

/// Which queue a key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Attach,
    Detach,
}

/// The three work queues, made before the controller so the metrics
/// registry can hold them.
pub struct Queues {
    pub attach: Arc<WorkQueue<String>>,
    pub detach: Arc<WorkQueue<String>>,
    pub pv: Arc<WorkQueue<String>>,
}

impl Queues {
    pub fn new(backoff: Backoff) -> Self {
        let queue = || Arc::new(WorkQueue::new(backoff));
        Queues {
            attach: queue(),
            detach: queue(),
            pv: queue(),
        }
    }

    /// Their gauges, named `attach`, `detach` and `pv`.
    pub fn metrics(&self) -> QueueMetrics {
        let mut m = QueueMetrics::default();
        m.add("attach", self.attach.clone());
        m.add("detach", self.detach.clone());
        m.add("pv", self.pv.clone());
        m
    }
}

pub struct Controller {
    cfg: Config,
    finalizer: String,
    client: kube::Client,
    driver: Driver,
    vas: Cached<VolumeAttachment>,
    pvs: Cached<PersistentVolume>,
    csinodes: Store<CSINode>,
    nodes: Store<PartialObjectMeta<Node>>,
    pub attach_q: Arc<WorkQueue<String>>,
    pub detach_q: Arc<WorkQueue<String>>,
    pub pv_q: Arc<WorkQueue<String>>,
    /// VolumeAttachment keys a worker holds, across both VA queues.
    busy: Mutex<HashSet<String>>,
    /// `--worker-threads` permits for ControllerPublish/Unpublish (tokio's
    /// semaphore is fair: permits go out in the order they were asked).
    calls: tokio::sync::Semaphore,
    recorder: Recorder,
    metrics: Writes,
}

/// The reflector streams, to be driven by [`Controller::run`].
pub struct Watches {
    va_writer: reflector::store::Writer<VolumeAttachment>,
    pv_writer: reflector::store::Writer<PersistentVolume>,
    csinode_writer: reflector::store::Writer<CSINode>,
    node_writer: reflector::store::Writer<PartialObjectMeta<Node>>,
}

/// Managed fields are most of an object's size and never read here.
fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

impl Controller {
    pub fn new(
        cfg: Config,
        client: kube::Client,
        driver: Driver,
        queues: Queues,
        metrics: Writes,
    ) -> (Arc<Self>, Watches) {
        let (va_store, va_writer) = reflector::store();
        let (pv_store, pv_writer) = reflector::store();
        let (csinode_store, csinode_writer) = reflector::store();
        let (node_store, node_writer) = reflector::store();
        let Queues {
            attach: attach_q,
            detach: detach_q,
            pv: pv_q,
        } = queues;
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "csiops-attacher".into(),
                instance: std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()),
            },
        );
        let permits = cfg.workers.max(1);
        let c = Controller {
            finalizer: super::finalizer::finalizer_name(&cfg.driver_name),
            cfg,
            client,
            driver,
            vas: Cached::new(va_store),
            pvs: Cached::new(pv_store),
            csinodes: csinode_store,
            nodes: node_store,
            attach_q,
            detach_q,
            pv_q,
            busy: Mutex::new(HashSet::new()),
            calls: tokio::sync::Semaphore::new(permits),
            recorder,
            metrics,
        };
        (
            Arc::new(c),
            Watches {
                va_writer,
                pv_writer,
                csinode_writer,
                node_writer,
            },
        )
    }

    /// The finalizer this attacher puts on VolumeAttachments and PVs.
    pub fn finalizer(&self) -> &str {
        &self.finalizer
    }

    fn is_ours(&self, va: &VolumeAttachment) -> bool {
        va.spec.attacher == self.cfg.driver_name
    }

    /// Routes a VolumeAttachment to the queue its state calls for.
    fn enqueue_va(&self, va: &VolumeAttachment) {
        if !self.is_ours(va) {
            return;
        }
        let name = va.name_any();
        if va.metadata.deletion_timestamp.is_some() {
            self.detach_q.add(name);
        } else {
            self.attach_q.add(name);
        }
    }

    /// `old` is the cached copy from before the event, if there was one.
    fn on_va_event(&self, ev: watcher::Event<VolumeAttachment>, old: Option<&VolumeAttachment>) {
        match ev {
            watcher::Event::Apply(va) | watcher::Event::InitApply(va) => {
                if old.is_none_or(|old| decide::is_relevant_change(old, &va)) {
                    self.enqueue_va(&va);
                } else {
                    tracing::trace!(va = %va.name_any(), "only our error record changed; not queued");
                }
            }
            watcher::Event::Delete(va) => {
                self.vas.forget(&va.name_any());
                if let Some(pv) = va.spec.source.persistent_volume_name.as_ref() {
                    // The PV may be waiting for its last attachment to go.
                    self.pv_q.add(pv.clone());
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    fn on_pv_event(&self, ev: watcher::Event<PersistentVolume>) {
        match ev {
            watcher::Event::Apply(pv) | watcher::Event::InitApply(pv) => {
                if pv.metadata.deletion_timestamp.is_some()
                    && super::finalizer::has(pv.metadata.finalizers.as_ref(), &self.finalizer)
                {
                    self.pv_q.add(pv.name_any());
                }
            }
            watcher::Event::Delete(pv) => self.pvs.forget(&pv.name_any()),
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// Watches, workers and resync until `shutdown`; an error if the
    /// controller stopped on its own (the process must then exit non-zero).
    pub async fn run(
        self: Arc<Self>,
        watches: Watches,
        shutdown: CancellationToken,
    ) -> Result<(), ControllerError> {
        let cfg = watcher::Config::default();
        // VolumeAttachments go into their store here rather than through
        // `reflector`, so that the handler also gets the copy the event
        // replaces (an informer's "old" object) and can tell our own error
        // records from real changes.
        let va_stream = watcher(
            Api::<VolumeAttachment>::all(self.client.clone()),
            cfg.clone(),
        )
        .default_backoff()
        .modify(slim);
        let mut va_writer = watches.va_writer;
        let pv_stream = reflector::reflector(
            watches.pv_writer,
            watcher(
                Api::<PersistentVolume>::all(self.client.clone()),
                cfg.clone(),
            )
            .default_backoff()
            .modify(slim),
        );
        let csinode_stream = reflector::reflector(
            watches.csinode_writer,
            watcher(Api::<CSINode>::all(self.client.clone()), cfg.clone())
                .default_backoff()
                .modify(slim),
        );
        // Only the node-ID annotation is read from Nodes: metadata suffices.
        let node_stream = reflector::reflector(
            watches.node_writer,
            watcher(
                Api::<PartialObjectMeta<Node>>::all(self.client.clone()),
                cfg,
            )
            .default_backoff()
            .modify(slim),
        );

        let me = self.clone();
        let va_task = drive(va_stream, "VolumeAttachment", move |ev| {
            let old = match &ev {
                watcher::Event::Apply(va) | watcher::Event::InitApply(va) => {
                    me.vas.store().get(&ObjectRef::from_obj(va))
                }
                _ => None,
            };
            va_writer.apply_watcher_event(&ev);
            me.on_va_event(ev, old.as_deref());
        });
        let me = self.clone();
        let pv_task = drive(pv_stream, "PersistentVolume", move |ev| me.on_pv_event(ev));
        let csinode_task = drive(csinode_stream, "CSINode", |_| {});
        let node_task = drive(node_stream, "Node", |_| {});
        // A watch never ends by itself (it re-lists after every error), so
        // one that does leaves its cache stale for good: the first to end
        // stops the controller.
        let watches = async {
            tokio::select! {
                () = va_task => "VolumeAttachment",
                () = pv_task => "PersistentVolume",
                () = csinode_task => "CSINode",
                () = node_task => "Node",
            }
        };

        let workers = async {
            // Every cache must have listed before any decision is taken. A
            // store is never ready once its watch is gone.
            let ready = async {
                self.vas.store().wait_until_ready().await.is_ok()
                    && self.pvs.store().wait_until_ready().await.is_ok()
                    && self.csinodes.wait_until_ready().await.is_ok()
                    && self.nodes.wait_until_ready().await.is_ok()
            };
            tokio::select! {
                synced = ready => if !synced {
                    return Err(ControllerError::NotSynced);
                },
                () = shutdown.cancelled() => return Ok(()),
            }
            tracing::info!(
                volume_attachments = self.vas.store().len(),
                persistent_volumes = self.pvs.store().len(),
                "caches synced; starting workers"
            );
            let mut tasks = Vec::new();
            for _ in 0..self.cfg.workers.max(1) {
                tasks.push(self.clone().va_worker(Kind::Attach));
                tasks.push(self.clone().va_worker(Kind::Detach));
            }
            let pv_workers = futures::future::join_all(
                (0..self.cfg.workers.max(1)).map(|_| self.clone().pv_worker()),
            );
            tokio::join!(
                futures::future::join_all(tasks),
                pv_workers,
                self.clone().resync(shutdown.clone())
            );
            Ok(())
        };

        let outcome = supervise(watches, workers, &shutdown).await;
        self.attach_q.shut_down();
        self.detach_q.shut_down();
        self.pv_q.shut_down();
        outcome
    }

    /// Every `--resync`, queue every attachment of ours again (a safety net
    /// for anything missed; processing an attached one costs no API call).
    async fn resync(self: Arc<Self>, shutdown: CancellationToken) {
        if self.cfg.resync.is_zero() {
            return shutdown.cancelled().await;
        }
        let mut tick = tokio::time::interval(self.cfg.resync);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            for va in self.vas.store().state() {
                self.enqueue_va(&va);
            }
        }
    }

    fn queue(&self, kind: Kind) -> &WorkQueue<String> {
        match kind {
            Kind::Attach => &self.attach_q,
            Kind::Detach => &self.detach_q,
        }
    }

    async fn va_worker(self: Arc<Self>, kind: Kind) {
        let q = self.queue(kind);
        while let Some(key) = q.next().await {
            let claimed = self
                .busy
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.clone());
            if !claimed {
                q.add_after(key.clone(), BUSY_RETRY);
                q.done(&key);
                continue;
            }
            let res = self.sync_va(&key, kind).await;
            self.busy
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
            match res {
                Ok(()) => q.forget(&key),
                Err(e) => {
                    tracing::warn!(va = %key, error = %e, "sync failed; retrying with backoff");
                    q.add_rate_limited(key.clone());
                }
            }
            q.done(&key);
        }
    }

    async fn pv_worker(self: Arc<Self>) {
        while let Some(key) = self.pv_q.next().await {
            match self.sync_pv(&key).await {
                Ok(()) => self.pv_q.forget(&key),
                Err(e) => {
                    tracing::warn!(pv = %key, error = %e, "PV sync failed; retrying with backoff");
                    self.pv_q.add_rate_limited(key.clone());
                }
            }
            self.pv_q.done(&key);
        }
    }

    /// One VolumeAttachment, from the queue `kind`.
    async fn sync_va(&self, name: &str, kind: Kind) -> Result<(), SyncError> {
        let Some(va) = self.vas.get(name) else {
            return Ok(());
        };
        // The object may have moved on since it was queued: hand it over.
        let deleting = va.metadata.deletion_timestamp.is_some();
        if deleting != (kind == Kind::Detach) {
            self.enqueue_va(&va);
            return Ok(());
        }
        let pv_name = va.spec.source.persistent_volume_name.clone();
        let pv = pv_name.as_deref().and_then(|n| self.pvs.get(n));
        let volume = Volume::of(&va, |_| pv.as_deref());
        let action = decide::va_action(
            &va,
            volume,
            &self.cfg.driver_name,
            &self.finalizer,
            self.cfg.mode,
        );
        tracing::debug!(va = %name, ?action, "sync");
        match action {
            VaAction::NotOurs | VaAction::Done => Ok(()),
            VaAction::MarkAttached => self.mark_attached(&va, &Default::default()).await,
            VaAction::DropFinalizer => self.remove_va_finalizer(&va).await,
            VaAction::Refuse(r) => {
                let err = SyncError::from(r);
                self.record_attach_error(&va, &err).await;
                Err(err)
            }
            VaAction::Attach {
                add_pv_finalizer,
                add_va_finalizer,
            } => {
                let res = self
                    .attach(&va, volume, add_pv_finalizer, add_va_finalizer)
                    .await;
                if let Err(e) = &res {
                    if e.recorded() {
                        self.record_attach_error(&va, e).await;
                    }
                }
                res
            }
            VaAction::Detach { clear_status } => {
                let res = self.detach(&va, volume, clear_status).await;
                if let Err(e) = &res {
                    if e.recorded() {
                        self.record_detach_error(&va, e).await;
                    }
                }
                res
            }
        }
    }

    fn node_id(&self, va: &VolumeAttachment, for_detach: bool) -> Result<String, NodeIdError> {
        let node = &va.spec.node_name;
        let csinode = self.csinodes.get(&ObjectRef::new(node));
        let meta = self.nodes.get(&ObjectRef::new(node));
        node::node_id(
            &self.cfg.driver_name,
            node,
            csinode.as_deref(),
            meta.as_ref().and_then(|m| m.metadata.annotations.as_ref()),
            for_detach.then_some(va),
        )
    }

    /// One GET; secrets are not cached (they are not ours to hold).
    async fn secrets(
        &self,
        r: Option<SecretRef>,
    ) -> Result<std::collections::HashMap<String, String>, SyncError> {
        let Some(r) = r else {
            return Ok(Default::default());
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &r.namespace);
        let secret = api.get(&r.name).await.map_err(|source| SyncError::Secret {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            source,
        })?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }

    async fn attach(
        &self,
        va: &VolumeAttachment,
        volume: Volume<'_>,
        add_pv_finalizer: bool,
        add_va_finalizer: bool,
    ) -> Result<(), SyncError> {
        let name = va.name_any();
        // Everything that can fail without a write is checked first: a
        // finalizer added for an attach that cannot happen would only hold
        // up the object's deletion.
        let spec = volume.spec().ok_or(RequestError::NotCsi)?;
        let node_id = self.node_id(va, false)?;
        let mut req =
            request::publish_request(spec, &node_id, self.cfg.caps, &self.cfg.default_fs_type)?;
        req.secrets = self.secrets(request::publish_secret_ref(spec)?).await?;

        if add_pv_finalizer {
            if let Volume::Pv(pv) = volume {
                let pv_name = pv.name_any();
                let api: Api<PersistentVolume> = Api::all(self.client.clone());
                let patched = api
                    .patch(
                        &pv_name,
                        &PatchParams::default(),
                        &Patch::Strategic(status::add_finalizer(&self.finalizer, None)),
                    )
                    .await
                    .map_err(SyncError::PvFinalizer)?;
                self.metrics.wrote(Write::PvFinalizer);
                // The API server refuses new finalizers on an object being
                // deleted, so a PV that got its deletionTimestamp meanwhile
                // fails above; one that already had ours is checked here.
                if patched.metadata.deletion_timestamp.is_some() {
                    self.pvs.wrote(patched);
                    return Err(Refusal::PvDeleting(pv_name).into());
                }
                self.pvs.wrote(patched);
            }
        }
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let mut current = va.clone();
        if add_va_finalizer {
            current = api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Strategic(status::add_finalizer(&self.finalizer, Some(&node_id))),
                )
                .await
                .map_err(SyncError::SaveVa)?;
            self.metrics.wrote(Write::VaFinalizer);
            self.vas.wrote(current.clone());
        }

        tracing::info!(va = %name, volume = %req.volume_id, node = %node_id, "attaching");
        let publish_context = {
            let _permit = self.calls.acquire().await;
            csi::publish(&self.driver, req, self.cfg.timeout).await
        }
        .map_err(SyncError::Csi)?;
        self.mark_attached(&current, &publish_context).await?;
        tracing::info!(va = %name, "attached");
        Ok(())
    }

    async fn mark_attached(
        &self,
        va: &VolumeAttachment,
        publish_context: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), SyncError> {
        let old = va
            .status
            .as_ref()
            .and_then(|s| s.attachment_metadata.as_ref());
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let patched = api
            .patch_status(
                &va.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status::attached(old, publish_context)),
            )
            .await
            .map_err(SyncError::MarkAttached)?;
        self.metrics.wrote(Write::VaStatus);
        self.vas.wrote(patched);
        Ok(())
    }

    async fn detach(
        &self,
        va: &VolumeAttachment,
        volume: Volume<'_>,
        clear_status: bool,
    ) -> Result<(), SyncError> {
        let name = va.name_any();
        let spec = match volume {
            Volume::MissingPv(pv) => return Err(Refusal::PvMissing(pv.to_string()).into()),
            Volume::Invalid => return Err(Refusal::BadSource.into()),
            v => v.spec().ok_or(RequestError::NotCsi)?,
        };
        let node_id = self.node_id(va, true)?;
        let mut req = request::unpublish_request(spec, &node_id)?;
        req.secrets = self.secrets(request::publish_secret_ref(spec)?).await?;
        tracing::info!(va = %name, volume = %req.volume_id, node = %node_id, "detaching");
        {
            let _permit = self.calls.acquire().await;
            csi::unpublish(&self.driver, req, self.cfg.timeout).await
        }
        .map_err(SyncError::Csi)?;
        if clear_status {
            let api: Api<VolumeAttachment> = Api::all(self.client.clone());
            let patched = api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(status::detached()),
                )
                .await
                .map_err(SyncError::MarkDetached)?;
            self.metrics.wrote(Write::VaStatus);
            self.vas.wrote(patched);
        }
        self.remove_va_finalizer(va).await?;
        tracing::info!(va = %name, "detached");
        Ok(())
    }

    async fn remove_va_finalizer(&self, va: &VolumeAttachment) -> Result<(), SyncError> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        match api
            .patch(
                &va.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(status::remove_finalizer(&self.finalizer)),
            )
            .await
        {
            Ok(patched) => {
                self.metrics.wrote(Write::VaFinalizer);
                self.vas.wrote(patched);
                Ok(())
            }
            // Gone already: nothing left to release.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(SyncError::MarkDetached(e)),
        }
    }

    async fn record_attach_error(&self, va: &VolumeAttachment, err: &SyncError) {
        self.record_error(va, err, false).await;
    }

    async fn record_detach_error(&self, va: &VolumeAttachment, err: &SyncError) {
        self.record_error(va, err, true).await;
    }

    /// `attachError` (or `detachError`) and an Event, unless the same message
    /// is already on record: another identical write and Event on every
    /// retry would only load the API server.
    async fn record_error(&self, va: &VolumeAttachment, err: &SyncError, detach: bool) {
        let message = err.to_string();
        let recorded = va
            .status
            .as_ref()
            .and_then(|s| {
                if detach {
                    s.detach_error.as_ref()
                } else {
                    s.attach_error.as_ref()
                }
            })
            .and_then(|e| e.message.as_deref());
        if recorded == Some(status::truncate(&message, status::MAX_ERROR_MESSAGE)) {
            return;
        }
        let (patch, reason, action) = if detach {
            (
                status::detach_error(&message, now()),
                REASON_DETACH_FAILED,
                "Detach",
            )
        } else {
            (
                status::attach_error(&message, now()),
                REASON_ATTACH_FAILED,
                "Attach",
            )
        };
        self.record(va, patch, reason, action, &message).await;
    }

    /// The error into the status and an Event; failures to record are only
    /// logged (the sync's own error is what drives the retry).
    async fn record(
        &self,
        va: &VolumeAttachment,
        patch: serde_json::Value,
        reason: &str,
        action: &str,
        message: &str,
    ) {
        let name = va.name_any();
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(patched) => {
                self.metrics.wrote(Write::VaStatus);
                self.vas.wrote(patched);
            }
            Err(e) => {
                tracing::warn!(va = %name, error = %e, "could not save the error to the status")
            }
        }
        let reference = ObjectReference {
            api_version: Some("storage.k8s.io/v1".into()),
            kind: Some("VolumeAttachment".into()),
            name: Some(name.clone()),
            uid: va.metadata.uid.clone(),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(status::truncate(message, status::MAX_ERROR_MESSAGE).to_string()),
            action: action.into(),
            secondary: None,
        };
        match self.recorder.publish(&event, &reference).await {
            Ok(()) => self.metrics.wrote(Write::Event),
            Err(e) => tracing::warn!(va = %name, error = %e, "could not record an Event"),
        }
    }

    /// One PersistentVolume: drop our finalizer once it is being deleted and
    /// no VolumeAttachment refers to it.
    async fn sync_pv(&self, name: &str) -> Result<(), SyncError> {
        let Some(pv) = self.pvs.get(name) else {
            return Ok(());
        };
        if pv.metadata.deletion_timestamp.is_none() {
            return Ok(());
        }
        let referenced = self
            .vas
            .store()
            .find(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name))
            .is_some();
        if decide::pv_action(&pv, &self.finalizer, referenced) != PvAction::RemoveFinalizer {
            return Ok(());
        }
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Strategic(status::remove_finalizer(&self.finalizer)),
            )
            .await
        {
            Ok(patched) => {
                self.metrics.wrote(Write::PvFinalizer);
                tracing::info!(pv = %name, "removed the finalizer from the PersistentVolume");
                self.pvs.wrote(patched);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(SyncError::PvFinalizerRemove(e)),
        }
    }
}

/// Why the controller stopped before it was told to.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("the {0} watch ended; its cache would go stale")]
    WatchEnded(&'static str),
    #[error("the caches never synced: a watch ended first")]
    NotSynced,
}

/// Runs the watches and the workers until `shutdown`. A watch that ends is
/// a failure (they run for the life of the process); the workers end only
/// with an error of their own, or once `shutdown` has fired.
async fn supervise(
    watches: impl Future<Output = &'static str>,
    workers: impl Future<Output = Result<(), ControllerError>>,
    shutdown: &CancellationToken,
) -> Result<(), ControllerError> {
    tokio::select! {
        kind = watches => Err(ControllerError::WatchEnded(kind)),
        res = workers => res,
        () = shutdown.cancelled() => Ok(()),
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Drives a reflector stream, handing each event to `on_event`; watch errors
/// are logged (the stream backs off and re-lists by itself).
async fn drive<K, S>(stream: S, what: &'static str, mut on_event: impl FnMut(watcher::Event<K>))
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => on_event(ev),
            Err(e) => tracing::warn!(kind = what, error = %e, "watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_ends_is_an_error() {
        let shutdown = CancellationToken::new();
        let res = supervise(
            async { "VolumeAttachment" },
            std::future::pending(),
            &shutdown,
        )
        .await;
        assert!(
            matches!(res, Err(ControllerError::WatchEnded("VolumeAttachment"))),
            "{res:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_is_a_clean_stop() {
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let res = supervise(std::future::pending(), std::future::pending(), &shutdown).await;
        assert!(res.is_ok(), "{res:?}");
    }
}
