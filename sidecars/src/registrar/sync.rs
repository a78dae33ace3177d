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
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use csiops_proto::csi::v1::{NodeGetInfoResponse, Topology};
    use csiops_runtime::testing::{self, Log, Objects};
    use serde_json::json;

    use super::*;
    use crate::common::fake_csi::{FakeNode, NodeInfoAnswer};

    const NODE: &str = "/api/v1/nodes/node-a";
    const CSINODE: &str = "/apis/storage.k8s.io/v1/csinodes/node-a";
    const DRIVER: &str = "csi.example.com";

    fn answer(info: Result<NodeGetInfoResponse, Status>) -> NodeInfoAnswer {
        Arc::new(std::sync::Mutex::new(info))
    }

    fn info(max_volumes: i64) -> NodeGetInfoResponse {
        NodeGetInfoResponse {
            node_id: "id-a".into(),
            max_volumes_per_node: max_volumes,
            accessible_topology: Some(Topology {
                segments: [("example.com/zone".to_string(), "z1".to_string())].into(),
            }),
        }
    }

    /// A sync of `node-a` against a fake driver answering `info` on
    /// `dir/csi.sock` and an API server answering `api`, kubelet's verdict
    /// given.
    async fn sync_with(
        dir: &Path,
        log: &Log,
        info: NodeInfoAnswer,
        api: impl Fn(&testing::Call) -> testing::Reply + Send + Sync + 'static,
        verdict: Verdict,
    ) -> (NodeInfoSync, watch::Sender<Verdict>) {
        let driver = FakeNode {
            log: log.clone(),
            info,
        }
        .serve(dir, Duration::from_secs(2))
        .await;
        let (tx, kubelet) = watch::channel(verdict);
        let sync = NodeInfoSync::new(
            testing::client(log, api),
            "node-a".into(),
            DRIVER.into(),
            driver,
            Duration::from_secs(10),
            kubelet,
        )
        .with_driver_socket(Some(dir.join("csi.sock")));
        (sync, tx)
    }

    /// `node-a` as kubelet left it: our entry in CSINode (allocatable 5),
    /// our node ID in the annotation, beside another driver's.
    fn registered_node() -> Objects {
        Objects::new([
            (
                NODE,
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {
                    "name": "node-a", "uid": "u-a", "resourceVersion": "1",
                    "labels": {"example.com/zone": "z1"},
                    "annotations": {nodeinfo::NODE_ID_ANNOTATION:
                        format!(r#"{{"{DRIVER}":"id-a","other.csi":"x"}}"#)}}}),
            ),
            (
                CSINODE,
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                    "metadata": {"name": "node-a", "resourceVersion": "1"},
                    "spec": {"drivers": [
                        {"name": "other.csi", "nodeID": "x"},
                        {"name": DRIVER, "nodeID": "id-a",
                         "topologyKeys": ["example.com/zone"],
                         "allocatable": {"count": 5}}]}}),
            ),
        ])
    }

    fn has_entry(objects: &Objects) -> bool {
        objects.get(CSINODE).expect("CSINode")["spec"]["drivers"]
            .as_array()
            .is_some_and(|d| d.iter().any(|e| e["name"] == DRIVER))
    }

    fn has_node_id(objects: &Objects) -> bool {
        let node = objects.get(NODE).expect("Node");
        let ids = node["metadata"]["annotations"][nodeinfo::NODE_ID_ANNOTATION]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ids.contains(DRIVER)
    }

    /// The API writes (not the driver calls noted in the same log).
    fn api_writes(log: &Log) -> Vec<String> {
        log.writes()
            .into_iter()
            .filter(|w| !w.starts_with("CSI "))
            .collect()
    }

    fn calls_of(log: &Log, method: &str) -> usize {
        log.lines()
            .iter()
            .filter(|l| *l == &format!("CSI {method}"))
            .count()
    }

    #[tokio::test]
    async fn nothing_is_written_before_kubelet_accepts_nor_after_it_refuses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::default();
        let (sync, verdict) = sync_with(
            dir.path(),
            &log,
            answer(Ok(info(0))),
            |_| testing::status(500, "InternalError", "refused"),
            Verdict::Pending,
        )
        .await;
        let mut streak = FailureStreak::default();
        let now = Instant::now();
        assert_eq!(
            sync.pass(&mut streak, now).await.ok(),
            Some(Outcome::AwaitingKubelet)
        );
        verdict.send_replace(Verdict::Refused("incompatible version".into()));
        assert_eq!(
            sync.pass(&mut streak, now).await.ok(),
            Some(Outcome::AwaitingKubelet)
        );
        assert!(log.lines().is_empty(), "no call at all: {:?}", log.lines());

        // Accepted: the pass asks the driver and then the API server (which
        // fails), so the gate was what held it back.
        verdict.send_replace(Verdict::Registered);
        assert!(matches!(
            sync.pass(&mut streak, now).await,
            Err(SyncError::Kube(_))
        ));
        assert_eq!(calls_of(&log, "NodeGetInfo"), 1);
        assert!(
            log.lines().iter().any(|l| l.starts_with("GET ")),
            "{:?}",
            log.lines()
        );
    }

    #[tokio::test]
    async fn a_forbidden_answer_stops_the_maintenance_instead_of_retrying() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::default();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let (sync, _verdict) = sync_with(
            dir.path(),
            &log,
            answer(Ok(info(0))),
            move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                testing::status(403, "Forbidden", "refused")
            },
            Verdict::Registered,
        )
        .await;
        let stop = CancellationToken::new();
        // A 500 would be retried with backoff until shutdown; a 403 ends it.
        tokio::time::timeout(Duration::from_secs(10), sync.run(&stop))
            .await
            .expect("run returns on 403 without a shutdown");
        assert!(requests.load(Ordering::SeqCst) > 0);
    }

    #[tokio::test]
    async fn a_failing_driver_keeps_its_entry_and_is_asked_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::default();
        let objects = registered_node();
        let api = objects.clone();
        let failing = answer(Err(Status::unavailable("driver restarting")));
        let (mut sync, _verdict) = sync_with(
            dir.path(),
            &log,
            failing.clone(),
            move |c| api.answer(c),
            Verdict::Registered,
        )
        .await;
        sync.interval = Duration::from_millis(200);
        let stop = CancellationToken::new();
        let run = {
            let (sync, stop) = (sync.clone(), stop.clone());
            tokio::spawn(async move { sync.run(&stop).await })
        };
        // Passes retried with backoff while the driver fails: a second,
        // a third… NodeGetInfo, and nothing removed meanwhile.
        let deadline = Instant::now() + Duration::from_secs(10);
        while calls_of(&log, "NodeGetInfo") < 3 {
            assert!(
                Instant::now() < deadline,
                "NodeGetInfo not retried: {:?}",
                log.lines()
            );
            assert!(
                has_entry(&objects) && has_node_id(&objects),
                "removed after {:?}",
                log.lines()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(api_writes(&log).is_empty(), "wrote {:?}", api_writes(&log));
        assert!(
            has_entry(&objects),
            "the entry stays while the driver's socket is there"
        );
        assert!(has_node_id(&objects), "the node ID stays too");
        // The driver answers again (with kubelet's count): still nothing to write.
        *failing.lock().expect("lock") = Ok(info(5));
        let answered = calls_of(&log, "NodeGetInfo");
        while calls_of(&log, "NodeGetInfo") == answered {
            assert!(
                Instant::now() < deadline,
                "not asked again: {:?}",
                log.lines()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        run.await.expect("run ends");
        assert!(api_writes(&log).is_empty(), "wrote {:?}", api_writes(&log));
    }

    #[tokio::test]
    async fn the_entry_goes_once_the_drivers_socket_has_been_gone_long_enough() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::default();
        let objects = registered_node();
        let api = objects.clone();
        let (sync, _verdict) = sync_with(
            dir.path(),
            &log,
            answer(Err(Status::deadline_exceeded("slow"))),
            move |c| api.answer(c),
            Verdict::Registered,
        )
        .await;
        let mut streak = FailureStreak::default();
        let t0 = Instant::now();
        let gone_after = sync.gone_after();
        // Failing for longer than the grace, socket there: kept.
        for at in [t0, t0 + gone_after, t0 + gone_after * 2] {
            assert_eq!(
                sync.pass(&mut streak, at).await.ok(),
                Some(Outcome::DriverFailed {
                    code: tonic::Code::DeadlineExceeded
                })
            );
        }
        assert!(api_writes(&log).is_empty() && has_entry(&objects));
        // The socket goes (the connection made before stays up and fails).
        std::fs::remove_file(dir.path().join("csi.sock")).expect("remove the socket");
        let t1 = t0 + gone_after * 3;
        for at in [t1, t1 + gone_after - Duration::from_millis(1)] {
            assert_eq!(
                sync.pass(&mut streak, at).await.ok(),
                Some(Outcome::DriverFailed {
                    code: tonic::Code::DeadlineExceeded
                })
            );
        }
        assert!(api_writes(&log).is_empty() && has_entry(&objects));
        assert_eq!(
            sync.pass(&mut streak, t1 + gone_after).await.ok(),
            Some(Outcome::Uninstalled { wrote: true })
        );
        assert!(!has_entry(&objects), "the entry of a gone driver goes");
        assert!(!has_node_id(&objects), "and its node ID");
        let csinode = objects.get(CSINODE).expect("CSINode");
        assert_eq!(csinode["spec"]["drivers"][0]["name"], "other.csi");
        // Still gone: nothing more to remove.
        let writes = api_writes(&log).len();
        assert_eq!(
            sync.pass(&mut streak, t1 + gone_after * 2).await.ok(),
            Some(Outcome::Uninstalled { wrote: false })
        );
        assert_eq!(api_writes(&log).len(), writes);
    }

    #[tokio::test]
    async fn kubelets_allocatable_is_never_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::default();
        let objects = registered_node();
        let api = objects.clone();
        // kubelet wrote 5 (KEP-4876); the driver answers 7 now.
        let (sync, _verdict) = sync_with(
            dir.path(),
            &log,
            answer(Ok(info(7))),
            move |c| api.answer(c),
            Verdict::Registered,
        )
        .await;
        let mut streak = FailureStreak::default();
        assert_eq!(
            sync.pass(&mut streak, Instant::now()).await.ok(),
            Some(Outcome::Installed { wrote: false })
        );
        assert!(api_writes(&log).is_empty(), "wrote {:?}", api_writes(&log));
        let csinode = objects.get(CSINODE).expect("CSINode");
        assert_eq!(csinode["spec"]["drivers"][1]["allocatable"]["count"], 5);
    }

    #[test]
    fn only_a_socket_absent_for_the_whole_grace_removes_the_entry() {
        use AfterFailure::{Keep, Remove};
        use SocketState::{Absent, Present, Unknown};
        let grace = Duration::from_secs(30);
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        // (socket state and time of each failure, decision at the last)
        let cases: &[(&[(SocketState, u64)], AfterFailure)] = &[
            (&[(Present, 0)], Keep),
            (&[(Present, 0), (Present, 100)], Keep),
            (&[(Unknown, 0), (Unknown, 100)], Keep),
            (&[(Absent, 0)], Keep),
            (&[(Absent, 0), (Absent, 29)], Keep),
            (&[(Absent, 0), (Absent, 30)], Remove),
            (&[(Absent, 0), (Absent, 10), (Absent, 31)], Remove),
            // Seen again in between: the count starts again.
            (
                &[(Absent, 0), (Present, 10), (Absent, 20), (Absent, 45)],
                Keep,
            ),
            (
                &[(Absent, 0), (Unknown, 10), (Absent, 20), (Absent, 50)],
                Remove,
            ),
            (&[(Present, 0), (Absent, 5), (Absent, 35)], Remove),
        ];
        for (failures, want) in cases {
            let mut streak = FailureStreak::default();
            let mut got = Keep;
            for (state, at) in failures.iter() {
                got = streak.failed(*state, s(*at), grace);
            }
            assert_eq!(got, *want, "{failures:?}");
            assert_eq!(streak.failures as usize, failures.len());
        }
    }

    #[test]
    fn the_socket_state_is_read_from_the_file_system() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("csi.sock");
        assert_eq!(socket_state(Some(&path)), SocketState::Absent);
        std::fs::write(&path, "").expect("write");
        assert_eq!(socket_state(Some(&path)), SocketState::Present);
        assert_eq!(socket_state(None), SocketState::Unknown);
    }

    #[tokio::test]
    async fn a_topology_that_would_relabel_the_node_is_refused_with_one_event() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::default();
        // The Node is in zone z9; the driver says z1.
        let objects = registered_node();
        let mut node = objects.get(NODE).expect("Node");
        node["metadata"]["labels"]["example.com/zone"] = json!("z9");
        objects.put(NODE, node);
        let api = objects.clone();
        let (sync, _verdict) = sync_with(
            dir.path(),
            &log,
            answer(Ok(info(0))),
            move |c| {
                if c.path.contains("/events") {
                    return (201, c.body.clone());
                }
                api.answer(c)
            },
            Verdict::Registered,
        )
        .await;
        let before = objects.get(CSINODE).expect("CSINode");
        let mut streak = FailureStreak::default();
        for _ in 0..2 {
            let err = sync
                .pass(&mut streak, Instant::now())
                .await
                .expect_err("refused");
            assert!(
                matches!(&err, SyncError::Collision(c) if c.key == "example.com/zone" && c.existing == "z9"),
                "{err:?}"
            );
        }
        // Nothing of the Node or the CSINode was written, as kubelet would.
        let writes = api_writes(&log);
        assert!(writes.iter().all(|w| w.contains("/events")), "{writes:?}");
        assert_eq!(objects.get(CSINODE), Some(before));
        // One Warning Event on the Node, in kubelet's words, for both passes.
        let events: Vec<_> = log
            .calls()
            .into_iter()
            .filter(|c| c.method == "POST" && c.path.contains("/events"))
            .collect();
        assert_eq!(events.len(), 1, "{:?}", log.lines());
        let event = &events[0].body;
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["reason"], "TopologyLabelCollision");
        assert_eq!(event["regarding"]["kind"], "Node");
        assert_eq!(event["regarding"]["name"], "node-a");
        let note = event["note"].as_str().unwrap_or_default();
        assert!(
            note.contains("detected topology value collision")
                && note.contains("\"example.com/zone\":\"z9\""),
            "{note}"
        );
    }

    #[tokio::test]
    async fn failing_watches_back_off_instead_of_looping() {
        // An API outage: every request fails. kubelet has not accepted the
        // driver yet, so passes make no request: what is counted is the
        // watches' retries.
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::default();
        let (sync, _verdict) = sync_with(
            dir.path(),
            &log,
            answer(Ok(info(0))),
            |_| testing::status(500, "InternalError", "down"),
            Verdict::Pending,
        )
        .await;
        let stop = CancellationToken::new();
        let run = {
            let (sync, stop) = (sync.clone(), stop.clone());
            tokio::spawn(async move { sync.run(&stop).await })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.cancel();
        run.await.expect("run ends");
        let lists = log
            .calls()
            .iter()
            .filter(|c| {
                c.method == "GET" && (c.path.ends_with("/nodes") || c.path.ends_with("/csinodes"))
            })
            .count();
        // Unthrottled, two watches retried every ~100 ms: about 60 in 3 s.
        // Backed off (800 ms doubling, jittered): a handful.
        assert!(lists >= 2, "the watches ran: {:?}", log.lines());
        assert!(
            lists <= 12,
            "{lists} watch requests in 3 s: {:?}",
            log.lines()
        );
    }
}
