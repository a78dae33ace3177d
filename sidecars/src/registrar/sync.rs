//! Keeps this node's CSINode entry, topology labels and node-ID annotation in
//! step with the driver's NodeGetInfo, the way kubelet's node-info manager does
//! (see `nodeinfo`). Runs at start, on every change of this Node or CSINode,
//! on every verdict of kubelet, and every `--node-info-interval`; API errors
//! back off and retry.
//!
//! Nothing is written until kubelet has accepted the registration
//! (NotifyRegistrationStatus with `plugin_registered`): the entry is what
//! REGISTERED counts, so it must not claim a driver kubelet cannot use. While
//! kubelet has not (yet) accepted, an entry already there is left alone too:
//! it may be kubelet's own, or kept by `--keep-registration-on-exit`.
//!
//! **A failing driver keeps its entry.** kubelet owns the registration: it
//! removes the entry itself when it deregisters the driver (our registration
//! socket gone, which we notice and answer with a new socket, and nothing is
//! written until kubelet registers it again), and upstream's
//! node-driver-registrar never removes it. A NodeGetInfo that fails or times
//! out — a slow driver, one restarting, one rolling out — is retried with
//! backoff and nothing is removed: dropping the entry on one failed call
//! would make CSINode flap on every node at once, fail attaches to the node
//! meanwhile and stall rollouts that wait for REGISTERED. The entry and the
//! annotation key go only when the driver is gone: its socket file absent at
//! every failed pass for [`GONE_AFTER_INTERVALS`] intervals (a driver that
//! is shut down removes its socket; one that restarts binds it again within
//! moments, and a crashed one leaves it behind). SIGTERM removes them too
//! (see the module above), unless `--keep-registration-on-exit`.
//!
//! **allocatable.** An existing entry's `allocatable` is never changed here
//! (see `nodeinfo::with_driver`): kubelet keeps it (KEP-4876, and it is
//! immutable without that feature), so only an entry this registrar creates
//! carries the driver's `max_volumes_per_node`, as kubelet's would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;

use super::nodeinfo::{self, DriverNodeInfo};
use super::server::Verdict;
use super::taint;
use crate::common::driver::Driver;
use csiops_runtime::chain;
use csiops_runtime::shutdown::CancellationToken;

/// Why one pass failed.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
    #[error("Node {0} does not exist")]
    NoNode(String),
    /// The driver's topology would relabel the Node: nothing is written
    /// (kubelet refuses the registration for the same reason).
    #[error("refusing the driver's topology")]
    Collision(#[from] nodeinfo::TopologyCollision),
}

/// For how many `--node-info-interval`s the driver's socket must be seen
/// absent (at every failed pass) before its entry is removed.
pub const GONE_AFTER_INTERVALS: u32 = 3;

/// What a pass did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Installed {
        wrote: bool,
    },
    /// The driver is gone (see [`FailureStreak`]): its entry and key were
    /// removed (`wrote`: there was something to remove).
    Uninstalled {
        wrote: bool,
    },
    /// NodeGetInfo failed and the driver is not known to be gone: nothing
    /// was written; the pass is retried with backoff.
    DriverFailed {
        code: tonic::Code,
    },
    /// kubelet has not accepted the registration: nothing was done.
    AwaitingKubelet,
}

/// Whether the driver's socket file exists, as the registrar sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketState {
    Present,
    Absent,
    /// It cannot be told (no path, or an error other than "not found"):
    /// never taken as proof that the driver is gone.
    Unknown,
}

/// The state of the socket at `path` (`None`: the address is not a path).
pub fn socket_state(path: Option<&Path>) -> SocketState {
    let Some(path) = path else {
        return SocketState::Unknown;
    };
    match std::fs::symlink_metadata(path) {
        Ok(_) => SocketState::Present,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => SocketState::Absent,
        Err(_) => SocketState::Unknown,
    }
}

/// What to do after a failed NodeGetInfo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Keep the entry and ask again (with backoff).
    Keep,
    /// The driver is gone: remove its entry and annotation key.
    Remove,
}

/// The failed NodeGetInfo calls since the last answer: how many, and since
/// when the driver's socket has been absent at every one of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailureStreak {
    pub failures: u32,
    pub socket_absent_since: Option<Instant>,
    /// The driver was found gone and removed (said once per streak).
    pub removed: bool,
}

impl FailureStreak {
    /// Notes a failed call at `now` with the socket in state `socket`, and
    /// decides: the entry goes only once the socket has been absent at every
    /// failure for `gone_after`. A socket seen present (a driver restarting,
    /// slow, or crashed with its socket left behind) starts the count again.
    pub fn failed(
        &mut self,
        socket: SocketState,
        now: Instant,
        gone_after: Duration,
    ) -> AfterFailure {
        self.failures = self.failures.saturating_add(1);
        match socket {
            SocketState::Absent => {
                let since = *self.socket_absent_since.get_or_insert(now);
                if now.saturating_duration_since(since) >= gone_after {
                    AfterFailure::Remove
                } else {
                    AfterFailure::Keep
                }
            }
            SocketState::Present | SocketState::Unknown => {
                self.socket_absent_since = None;
                AfterFailure::Keep
            }
        }
    }
}

/// The maintainer of one node's registration of one driver.
#[derive(Clone)]
pub struct NodeInfoSync {
    pub nodes: Api<Node>,
    pub csinodes: Api<CSINode>,
    pub node_name: String,
    pub driver_name: String,
    pub driver: Driver,
    /// How often NodeGetInfo is asked even when nothing changed: a changed
    /// answer (node ID, topology) is written within this time.
    pub interval: Duration,
    /// The driver's socket (`--csi-address`), whose absence tells that the
    /// driver is gone; `None`: never removed for a failing driver.
    pub driver_socket: Option<PathBuf>,
    /// kubelet's verdict on the registration.
    pub kubelet: watch::Receiver<Verdict>,
    /// The readiness taint key to remove from this node once registered
    /// (see `taint`); `None`: taints are not touched.
    pub readiness_taint: Option<String>,
    /// Events about this Node (a refused topology).
    recorder: Recorder,
    /// The collision last reported, so a refusal that stays is told once.
    reported: std::sync::Arc<std::sync::Mutex<Option<nodeinfo::TopologyCollision>>>,
}

impl NodeInfoSync {
    pub fn new(
        client: Client,
        node_name: String,
        driver_name: String,
        driver: Driver,
        interval: Duration,
        kubelet: watch::Receiver<Verdict>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "csiops-registrar".into(),
                instance: Some(node_name.clone()),
            },
        );
        Self {
            nodes: Api::all(client.clone()),
            csinodes: Api::all(client),
            recorder,
            reported: Default::default(),
            node_name,
            driver_name,
            driver,
            interval,
            driver_socket: None,
            kubelet,
            readiness_taint: None,
        }
    }

    /// The driver's socket, whose absence means the driver is gone.
    pub fn with_driver_socket(mut self, path: Option<PathBuf>) -> Self {
        self.driver_socket = path;
        self
    }

    /// How long the driver's socket must stay absent before the entry goes.
    pub fn gone_after(&self) -> Duration {
        self.interval.saturating_mul(GONE_AFTER_INTERVALS)
    }

    /// Removes `key` from this node's taints once the driver is registered.
    pub fn with_readiness_taint(mut self, key: Option<String>) -> Self {
        self.readiness_taint = key.filter(|k| !k.is_empty());
        self
    }

    /// One pass at `now`: once kubelet accepted the registration,
    /// NodeGetInfo, then install; a failure is noted in `streak`, and only a
    /// driver that is gone (see [`FailureStreak::failed`]) is uninstalled.
    pub async fn pass(
        &self,
        streak: &mut FailureStreak,
        now: Instant,
    ) -> Result<Outcome, SyncError> {
        if *self.kubelet.borrow() != Verdict::Registered {
            return Ok(Outcome::AwaitingKubelet);
        }
        match self.driver.node_get_info().await {
            Ok(resp) => {
                if streak.failures > 0 {
                    tracing::info!(failures = streak.failures, "NodeGetInfo answers again");
                }
                *streak = FailureStreak::default();
                let info = DriverNodeInfo {
                    node_id: resp.node_id,
                    max_volumes_per_node: resp.max_volumes_per_node,
                    topology: resp
                        .accessible_topology
                        .map(|t| t.segments.into_iter().collect::<BTreeMap<_, _>>())
                        .unwrap_or_default(),
                };
                let (mut wrote, node) = self.install_with(&info).await?;
                // Only now: kubelet accepted the driver and its CSINode
                // entry is written, so a pod scheduled here can mount.
                wrote |= self.remove_readiness_taint(&node).await?;
                Ok(Outcome::Installed { wrote })
            }
            Err(status) => self.driver_failed(status, streak, now).await,
        }
    }

    /// A failed NodeGetInfo: kept and retried, unless the driver is gone.
    async fn driver_failed(
        &self,
        status: Status,
        streak: &mut FailureStreak,
        now: Instant,
    ) -> Result<Outcome, SyncError> {
        let socket = socket_state(self.driver_socket.as_deref());
        let code = status.code();
        match streak.failed(socket, now, self.gone_after()) {
            AfterFailure::Keep if streak.removed => {
                tracing::debug!(?code, message = %status.message(), "NodeGetInfo still fails; the driver stays removed");
                Ok(Outcome::DriverFailed { code })
            }
            AfterFailure::Keep => {
                tracing::warn!(?code, message = %status.message(), failures = streak.failures, ?socket,
                    "NodeGetInfo failed; the driver's CSINode entry stays (kubelet owns the registration) and the call is retried");
                Ok(Outcome::DriverFailed { code })
            }
            AfterFailure::Remove => {
                if !streak.removed {
                    tracing::warn!(?code, message = %status.message(), socket = ?self.driver_socket, gone_for = ?self.gone_after(),
                        "the driver is gone (its socket is absent and NodeGetInfo fails); removing it from this node");
                }
                let wrote = self.uninstall().await?;
                streak.removed = true;
                Ok(Outcome::Uninstalled { wrote })
            }
        }
    }

    /// Applies a Node change as a merge patch guarded by the resourceVersion
    /// read (a concurrent writer makes it fail and the pass retry); `false`
    /// when there is nothing to change.
    async fn patch_node(
        &self,
        node: &Node,
        change: &nodeinfo::NodeChange,
    ) -> Result<bool, SyncError> {
        if change.is_empty() {
            return Ok(false);
        }
        let patch = change.merge_patch(node.metadata.resource_version.as_deref());
        self.nodes
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(true)
    }

    /// Writes the driver's entry, labels and annotation; `true` if anything was written.
    pub async fn install(&self, info: &DriverNodeInfo) -> Result<bool, SyncError> {
        Ok(self.install_with(info).await?.0)
    }

    /// [`install`](Self::install), also returning the Node as read before
    /// the writes.
    async fn install_with(&self, info: &DriverNodeInfo) -> Result<(bool, Node), SyncError> {
        let node = self.node().await?;
        let mut wrote = false;
        let change = match nodeinfo::node_install(&node, &self.driver_name, info) {
            Ok(change) => change,
            Err(collision) => {
                self.report_collision(&node, &collision).await;
                return Err(collision.into());
            }
        };
        if let Ok(mut last) = self.reported.lock() {
            *last = None;
        }
        wrote |= self.patch_node(&node, &change).await?;
        let entry = nodeinfo::driver_entry(&self.driver_name, info);
        match self.csinodes.get_opt(&self.node_name).await? {
            None => {
                self.csinodes
                    .create(&PostParams::default(), &nodeinfo::new_csinode(&node, entry))
                    .await?;
                wrote = true;
            }
            Some(current) => {
                if let Some(updated) = nodeinfo::with_driver(&current, &entry) {
                    // replace carries the resourceVersion read: a concurrent
                    // writer (kubelet) makes this fail and the pass retry.
                    self.csinodes
                        .replace(&self.node_name, &PostParams::default(), &updated)
                        .await?;
                    wrote = true;
                }
            }
        }
        if wrote {
            tracing::info!(node = %self.node_name, node_id = %info.node_id, "driver registered in CSINode");
        }
        Ok((wrote, node))
    }

    /// Tells, once per distinct collision, that the driver's topology was
    /// refused: a warning and a Warning Event on the Node, in kubelet's
    /// words. The Event is best effort (a registrar without `events.k8s.io`
    /// create still refuses, and logs).
    async fn report_collision(&self, node: &Node, collision: &nodeinfo::TopologyCollision) {
        let first = match self.reported.lock() {
            Ok(mut last) if last.as_ref() != Some(collision) => {
                *last = Some(collision.clone());
                true
            }
            _ => false,
        };
        if !first {
            return;
        }
        tracing::warn!(node = %self.node_name, driver = %self.driver_name, %collision,
            "not registering the driver in CSINode: its topology would overwrite a label of this Node (kubelet refuses it too); fix the driver's topology or the label");
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node_name.clone()),
            uid: node.metadata.uid.clone(),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "TopologyLabelCollision".into(),
            note: Some(format!(
                "CSI driver {}: {collision}; the driver is not registered in CSINode",
                self.driver_name
            )),
            action: "RegisterDriver".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &reference).await {
            tracing::debug!(error = %chain(&e), "could not record the collision Event");
        }
    }

    /// This Node, fresh from the API server.
    async fn node(&self) -> Result<Node, SyncError> {
        self.nodes
            .get_opt(&self.node_name)
            .await?
            .ok_or_else(|| SyncError::NoNode(self.node_name.clone()))
    }

    /// Removes the readiness taint from this node, if configured and
    /// present; `true` if the Node was written. `read` is the Node as this
    /// pass read it: without the key there is nothing to do and no second
    /// GET; with it, the Node is read again, since the pass may have just
    /// patched its labels (and the taint patch is guarded by the version).
    async fn remove_readiness_taint(&self, read: &Node) -> Result<bool, SyncError> {
        let Some(key) = &self.readiness_taint else {
            return Ok(false);
        };
        if taint::without_taint(read, key).is_none() {
            return Ok(false);
        }
        let node = self.node().await?;
        let Some(left) = taint::without_taint(&node, key) else {
            return Ok(false);
        };
        let patch = taint::taints_patch(&left, node.metadata.resource_version.as_deref());
        self.nodes
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        tracing::info!(node = %self.node_name, taint = %key, "driver ready: removed the readiness taint");
        Ok(true)
    }

    /// Removes the driver's entry and annotation key; `true` if anything was written.
    pub async fn uninstall(&self) -> Result<bool, SyncError> {
        let mut wrote = false;
        if let Some(current) = self.csinodes.get_opt(&self.node_name).await? {
            if let Some(updated) = nodeinfo::without_driver(&current, &self.driver_name) {
                self.csinodes
                    .replace(&self.node_name, &PostParams::default(), &updated)
                    .await?;
                wrote = true;
            }
        }
        if let Some(node) = self.nodes.get_opt(&self.node_name).await? {
            let change = nodeinfo::node_uninstall(&node, &self.driver_name);
            wrote |= self.patch_node(&node, &change).await?;
        }
        if wrote {
            tracing::info!(node = %self.node_name, "driver removed from CSINode");
        }
        Ok(wrote)
    }

    /// Runs until `shutdown`: a pass at start, on each change of this Node or
    /// CSINode, and every `interval`; passes whose API requests failed retry
    /// with backoff (1s → 30s), those whose NodeGetInfo failed too (1s →
    /// `interval`).
    pub async fn run(&self, shutdown: &CancellationToken) {
        let by_name =
            watcher::Config::default().fields(&format!("metadata.name={}", self.node_name));
        // Backed off (kube's default: from 800 ms up to 30 s) and only
        // successful events wake a pass: in an API outage a failing watch
        // must not turn every node's registrar into a 10-per-second loop.
        let node_events = watcher::watcher(self.nodes.clone(), by_name.clone())
            .default_backoff()
            .filter_map(|r| futures::future::ready(r.ok().map(|_| ())));
        let csinode_events = watcher::watcher(self.csinodes.clone(), by_name)
            .default_backoff()
            .filter_map(|r| futures::future::ready(r.ok().map(|_| ())));
        let mut changes = stream::select(node_events, csinode_events).boxed();
        let mut kubelet = self.kubelet.clone();
        let mut backoff = Duration::from_secs(1);
        let first_retry = Duration::from_secs(1).min(self.interval);
        let mut driver_backoff = first_retry;
        let mut streak = FailureStreak::default();
        let mut next = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
                Ok(()) = kubelet.changed() => {}
                Some(()) = changes.next() => {
                    // Coalesce a burst of events (including our own writes) into one pass.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            match self.pass(&mut streak, Instant::now()).await {
                Ok(Outcome::DriverFailed { .. } | Outcome::Uninstalled { .. }) => {
                    backoff = Duration::from_secs(1);
                    next = tokio::time::Instant::now() + driver_backoff;
                    driver_backoff = (driver_backoff * 2).min(self.interval).max(first_retry);
                }
                Ok(Outcome::Installed { .. } | Outcome::AwaitingKubelet) => {
                    backoff = Duration::from_secs(1);
                    driver_backoff = first_retry;
                    next = tokio::time::Instant::now() + self.interval;
                }
                // A refused topology needs a person: asked again at the
                // interval (told once, see `report_collision`).
                Err(SyncError::Collision(_)) => {
                    backoff = Duration::from_secs(1);
                    next = tokio::time::Instant::now() + self.interval;
                }
                // Permission revoked while running (it was there at start,
                // see `access`): say so once and stop; the registration
                // with kubelet goes on, and kubelet keeps CSINode itself.
                Err(SyncError::Kube(e)) if super::access::is_forbidden(&e) => {
                    tracing::warn!(error = %chain(&e), "CSINode maintenance is off: the API server now forbids it; registering with kubelet is unaffected");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %chain(&e), retry_in = ?backoff, "CSINode update failed");
                    next = tokio::time::Instant::now() + backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
