//! The attacher's controller: reflector caches of VolumeAttachments, PVs,
//! CSINodes and Node metadata feed three work queues; workers carry out what
//! [`decide`](super::decide) says, through the syncs of [`sync`](super::sync).
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

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};

use super::decide::{self, Mode};
use super::metrics::Writes;
use super::request::PublishCaps;
use crate::common::cache::Cached;
use crate::common::compact::{attached_volume, Compact};
use crate::common::driver::Driver;
use crate::common::watch::drive;
use crate::common::workqueue::{Backoff, QueueMetrics, WorkQueue};
use csiops_runtime::chain;
use csiops_runtime::shutdown::CancellationToken;
use tracing::Instrument;

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
    /// `--reconcile-sync`: how often ListVolumes is compared with the
    /// attachments (0: never; see `published_sync`).
    pub reconcile_sync: Duration,
    /// The driver has LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES (and
    /// PUBLISH_UNPUBLISH_VOLUME): the published sync can run.
    pub list_published: bool,
    /// `--max-entries`: ListVolumes page size (0: the driver's).
    pub max_entries: i32,
}

/// Which queue a key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
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
    pub(super) cfg: Config,
    pub(super) finalizer: String,
    pub(super) client: kube::Client,
    pub(super) driver: Driver,
    pub(super) vas: Cached<VolumeAttachment>,
    pub(super) pvs: Cached<PersistentVolume>,
    pub(super) csinodes: Store<CSINode>,
    pub(super) nodes: Store<PartialObjectMeta<Node>>,
    pub attach_q: Arc<WorkQueue<String>>,
    pub detach_q: Arc<WorkQueue<String>>,
    pub pv_q: Arc<WorkQueue<String>>,
    /// VolumeAttachment keys a worker holds, across both VA queues.
    busy: Mutex<HashSet<String>>,
    /// `--worker-threads` permits for ControllerPublish/Unpublish (tokio's
    /// semaphore is fair: permits go out in the order they were asked).
    pub(super) calls: tokio::sync::Semaphore,
    pub(super) recorder: Recorder,
    pub(super) metrics: Writes,
}

/// The reflector streams, to be driven by [`Controller::run`].
pub struct Watches {
    pub(super) csinode_writer: reflector::store::Writer<CSINode>,
    pub(super) node_writer: reflector::store::Writer<PartialObjectMeta<Node>>,
}

/// Managed fields are most of an object's size and never read here.
fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

impl Controller {
    pub fn new(
        cfg: Config,
        client: kube::Client,
        events: kube::Client,
        driver: Driver,
        queues: Queues,
        metrics: Writes,
    ) -> (Arc<Self>, Watches) {
        let (csinode_store, csinode_writer) = reflector::store();
        let (node_store, node_writer) = reflector::store();
        let Queues {
            attach: attach_q,
            detach: detach_q,
            pv: pv_q,
        } = queues;
        let recorder = Recorder::new(
            events,
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
            vas: Cached::new(Compact::indexed(attached_volume)),
            pvs: Cached::new(Compact::new()),
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
    pub(super) fn enqueue_va(&self, va: &VolumeAttachment) {
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
    pub(super) fn on_va_event(
        &self,
        ev: watcher::Event<VolumeAttachment>,
        old: Option<&VolumeAttachment>,
    ) {
        self.vas.observe(&ev);
        match ev {
            watcher::Event::Apply(va) | watcher::Event::InitApply(va) => {
                if old.is_none_or(|old| decide::is_relevant_change(old, &va)) {
                    self.enqueue_va(&va);
                } else {
                    tracing::trace!(va = %va.name_any(), "only our error record changed; not queued");
                }
            }
            watcher::Event::Delete(va) => {
                if let Some(pv) = va.spec.source.persistent_volume_name.as_ref() {
                    // The PV may be waiting for its last attachment to go.
                    self.pv_q.add(pv.clone());
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    fn on_pv_event(&self, ev: watcher::Event<PersistentVolume>) {
        self.pvs.observe(&ev);
        match ev {
            watcher::Event::Apply(pv) | watcher::Event::InitApply(pv) => {
                if pv.metadata.deletion_timestamp.is_some()
                    && super::finalizer::has(pv.metadata.finalizers.as_ref(), &self.finalizer)
                {
                    self.pv_q.add(pv.name_any());
                }
            }
            watcher::Event::Delete(_) | watcher::Event::Init | watcher::Event::InitDone => {}
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
        let pv_stream = watcher(
            Api::<PersistentVolume>::all(self.client.clone()),
            cfg.clone(),
        )
        .default_backoff()
        .modify(slim);
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
            me.vas.store().apply(&ev);
            me.on_va_event(ev, old.as_deref());
        });
        let me = self.clone();
        let pv_task = drive(pv_stream, "PersistentVolume", move |ev| {
            me.pvs.store().apply(&ev);
            me.on_pv_event(ev)
        });
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
                self.vas.store().ready().await;
                self.pvs.store().ready().await;
                self.csinodes.wait_until_ready().await.is_ok()
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
                self.clone().resync(shutdown.clone()),
                self.clone().published_sync_loop(shutdown.clone())
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
            for va in self.vas.store().iter() {
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

    pub(super) async fn va_worker(self: Arc<Self>, kind: Kind) {
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
            // Every line logged for this key carries its name.
            let span = tracing::info_span!("sync", va = %key, queue = ?kind);
            async {
                let res = self.sync_va(&key, kind).await;
                self.busy
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key);
                match res {
                    Ok(()) => q.forget(&key),
                    Err(e) => {
                        tracing::warn!(error = %chain(&e), "sync failed; retrying with backoff");
                        q.add_rate_limited(key.clone());
                    }
                }
            }
            .instrument(span)
            .await;
            q.done(&key);
        }
    }

    async fn pv_worker(self: Arc<Self>) {
        while let Some(key) = self.pv_q.next().await {
            async {
                match self.sync_pv(&key).await {
                    Ok(()) => self.pv_q.forget(&key),
                    Err(e) => {
                        tracing::warn!(error = %chain(&e), "PV sync failed; retrying with backoff");
                        self.pv_q.add_rate_limited(key.clone());
                    }
                }
            }
            .instrument(tracing::info_span!("sync_pv", pv = %key))
            .await;
            self.pv_q.done(&key);
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
