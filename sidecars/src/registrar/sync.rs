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

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::Client;
use tokio::sync::watch;

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
}

/// What a pass did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Installed {
        wrote: bool,
    },
    Uninstalled {
        wrote: bool,
    },
    /// kubelet has not accepted the registration: nothing was done.
    AwaitingKubelet,
}

/// The maintainer of one node's registration of one driver.
#[derive(Clone)]
pub struct NodeInfoSync {
    pub nodes: Api<Node>,
    pub csinodes: Api<CSINode>,
    pub node_name: String,
    pub driver_name: String,
    pub driver: Driver,
    /// How often NodeGetInfo is asked even when nothing changed: a driver that
    /// stops answering is noticed within this time.
    pub interval: Duration,
    /// kubelet's verdict on the registration.
    pub kubelet: watch::Receiver<Verdict>,
    /// The readiness taint key to remove from this node once registered
    /// (see `taint`); `None`: taints are not touched.
    pub readiness_taint: Option<String>,
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
        Self {
            nodes: Api::all(client.clone()),
            csinodes: Api::all(client),
            node_name,
            driver_name,
            driver,
            interval,
            kubelet,
            readiness_taint: None,
        }
    }

    /// Removes `key` from this node's taints once the driver is registered.
    pub fn with_readiness_taint(mut self, key: Option<String>) -> Self {
        self.readiness_taint = key.filter(|k| !k.is_empty());
        self
    }

    /// One pass: once kubelet accepted the registration, NodeGetInfo, then
    /// install or (if the driver fails) uninstall.
    pub async fn reconcile(&self) -> Result<Outcome, SyncError> {
        if *self.kubelet.borrow() != Verdict::Registered {
            return Ok(Outcome::AwaitingKubelet);
        }
        match self.driver.node_get_info().await {
            Ok(resp) => {
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
            Err(status) => {
                tracing::warn!(code = ?status.code(), message = %status.message(), "NodeGetInfo failed; removing this driver from the node");
                let wrote = self.uninstall().await?;
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
        let change = nodeinfo::node_install(&node, &self.driver_name, info);
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
    /// CSINode, and every `interval`; failed passes retry with backoff (1s → 30s).
    pub async fn run(&self, shutdown: &CancellationToken) {
        let by_name =
            watcher::Config::default().fields(&format!("metadata.name={}", self.node_name));
        let node_events = watcher::watcher(self.nodes.clone(), by_name.clone()).map(|_| ());
        let csinode_events = watcher::watcher(self.csinodes.clone(), by_name).map(|_| ());
        let mut changes = stream::select(node_events, csinode_events).boxed();
        let mut kubelet = self.kubelet.clone();
        let mut backoff = Duration::from_secs(1);
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
            match self.reconcile().await {
                Ok(_) => {
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

    use super::*;
    use crate::common::metrics::Metrics;

    /// A sync whose API server answers every request with `code` and counts
    /// them, and whose driver accepts connections but never answers.
    async fn sync_counting_requests(
        dir: &std::path::Path,
        code: u16,
    ) -> (
        NodeInfoSync,
        watch::Sender<Verdict>,
        Arc<AtomicUsize>,
        std::os::unix::net::UnixListener,
    ) {
        let socket = dir.join("csi.sock");
        // Never accepted: connecting succeeds, calls time out.
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let driver = Driver::connect(
            &socket.to_string_lossy(),
            Duration::from_millis(200),
            Arc::new(Metrics::new()),
        )
        .await
        .expect("driver socket connects");
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let api = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            counted.fetch_add(1, Ordering::SeqCst);
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                "status": "Failure", "code": code, "message": "refused"});
            async move {
                http::Response::builder()
                    .status(code)
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&status).unwrap_or_default(),
                    ))
            }
        });
        let (verdict, kubelet) = watch::channel(Verdict::Pending);
        let sync = NodeInfoSync::new(
            Client::new(api, "default"),
            "node-a".into(),
            "csi.example.com".into(),
            driver,
            Duration::from_secs(10),
            kubelet,
        );
        (sync, verdict, requests, listener)
    }

    #[tokio::test]
    async fn nothing_is_written_before_kubelet_accepts_nor_after_it_refuses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sync, verdict, requests, _driver) = sync_counting_requests(dir.path(), 500).await;

        assert_eq!(sync.reconcile().await.ok(), Some(Outcome::AwaitingKubelet));
        verdict.send_replace(Verdict::Refused("incompatible version".into()));
        assert_eq!(sync.reconcile().await.ok(), Some(Outcome::AwaitingKubelet));
        assert_eq!(requests.load(Ordering::SeqCst), 0, "no API request at all");

        // Accepted: the pass goes to the driver (which times out) and then to
        // the API server (which fails), so the gate was what held it back.
        verdict.send_replace(Verdict::Registered);
        assert!(matches!(sync.reconcile().await, Err(SyncError::Kube(_))));
        assert!(requests.load(Ordering::SeqCst) > 0);
    }

    #[tokio::test]
    async fn a_forbidden_answer_stops_the_maintenance_instead_of_retrying() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sync, verdict, requests, _driver) = sync_counting_requests(dir.path(), 403).await;
        verdict.send_replace(Verdict::Registered);
        let stop = CancellationToken::new();
        // A 500 would be retried with backoff until shutdown; a 403 ends it.
        tokio::time::timeout(Duration::from_secs(10), sync.run(&stop))
            .await
            .expect("run returns on 403 without a shutdown");
        assert!(requests.load(Ordering::SeqCst) > 0);
    }
}
