//! Upgrading a running cluster in place, as an admin upgrades Kubernetes:
//! the control plane first, kube-apiserver before kube-controller-manager
//! and kube-scheduler (kubeadm's order, and the version-skew policy's:
//! neither may be newer than the API server they talk to), then each real
//! node's kubelet, one at a time (the caller drains the node around it).
//! etcd keeps running as it is: an upgrade of the control plane does not
//! restart it, and every supported minor's API server works with it.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use super::{health_ok, Cluster};
use crate::bins;
use crate::error::{Error, Result};
use crate::kwok;
use crate::process::{ManagedProcess, DEFAULT_GRACE};

/// The components [`Cluster::upgrade_control_plane`] replaces, in order.
pub const CONTROL_PLANE_ORDER: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// How long a replaced component, or an upgraded kubelet's Node, may take
/// to answer: a cold API server start takes about ten seconds here, and
/// the same machine may run another test.
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);

/// One component replaced by an upgrade.
#[derive(Debug, Clone)]
pub struct Replaced {
    /// `kube-apiserver`, …, or `kubelet of <node>`.
    pub component: String,
    /// From the old process's SIGTERM until the new one answered.
    pub took: Duration,
}

impl Cluster {
    /// Replaces kube-apiserver, kube-controller-manager and kube-scheduler,
    /// in that order, by the binaries of `new_bin_dir` with the same
    /// arguments, each once the one before answers (the API server's
    /// `/readyz`, the others' `/healthz`). Requests fail while the API
    /// server is down, as they do during a real single-master upgrade.
    pub async fn upgrade_control_plane(&mut self, new_bin_dir: &Path) -> Result<Vec<Replaced>> {
        let dir = bins::checked_bin_dir(new_bin_dir.to_path_buf())?;
        let mut done = Vec::new();
        for name in CONTROL_PLANE_ORDER {
            done.push(self.upgrade_component(name, &dir).await?);
        }
        Ok(done)
    }

    /// Stops the control-plane process `name` (SIGTERM, as systemd or the
    /// kubelet of a static pod would) and starts `<bin_dir>/<name>` with its
    /// arguments and log; waits until it answers.
    async fn upgrade_component(&mut self, name: &str, bin_dir: &Path) -> Result<Replaced> {
        let started = Instant::now();
        let i = self
            .procs
            .iter()
            .position(|p| p.name() == name)
            .ok_or_else(|| Error::Other(format!("the cluster runs no {name}")))?;
        let args = self
            .args
            .get(name)
            .cloned()
            .ok_or_else(|| Error::Other(format!("no arguments recorded for {name}")))?;
        self.procs[i].terminate(DEFAULT_GRACE);
        let log = self.procs[i].log_path().to_path_buf();
        // In the same slot: the teardown stops processes by their start
        // order (controllers, then the API server, then etcd).
        self.procs[i] = ManagedProcess::spawn(name, &bin_dir.join(name), &args, &log)?;
        self.wait_answers(name, started + RESTART_TIMEOUT).await?;
        tracing::info!(name, took = ?started.elapsed(), bin_dir = %bin_dir.display(), "upgraded");
        Ok(Replaced {
            component: name.to_string(),
            took: started.elapsed(),
        })
    }

    /// Waits until the component `name` answers its health endpoint.
    async fn wait_answers(&mut self, name: &str, deadline: Instant) -> Result<()> {
        let (client, path) = match name {
            "kube-apiserver" => (self.client()?, "/readyz"),
            "kube-controller-manager" => (
                self.local_client(self.ports.controller_manager)?,
                "/healthz",
            ),
            "kube-scheduler" => (self.local_client(self.ports.scheduler)?, "/healthz"),
            other => {
                return Err(Error::Other(format!(
                    "{other} is no control-plane component"
                )))
            }
        };
        self.poll_until(&format!("{name} {path}"), deadline, || {
            health_ok(&client, path)
        })
        .await
    }

    /// A client for a component's own secure port on 127.0.0.1, whose
    /// certificate is self-signed (`--cert-dir`): it is not verified, the
    /// health endpoints are open to anyone.
    fn local_client(&self, port: u16) -> Result<kube::Client> {
        let mut config = self.config.clone();
        config.cluster_url = format!("https://127.0.0.1:{port}")
            .parse()
            .map_err(|e| Error::Other(format!("port {port}: {e}")))?;
        config.root_cert = None;
        config.accept_invalid_certs = true;
        Ok(kube::Client::try_from(config)?)
    }

    /// Restarts real node `index`'s kubelet from `new_bin_dir` (same flags,
    /// config and root dir; containers and mounts stay) and waits until its
    /// Node reports that kubelet's version and is Ready. The caller drains
    /// and uncordons the node.
    pub async fn upgrade_kubelet(&mut self, index: usize, new_bin_dir: &Path) -> Result<Replaced> {
        let started = Instant::now();
        let dir = bins::checked_bin_dir(new_bin_dir.to_path_buf())?;
        let want = {
            let kubelet = dir.join("kubelet");
            tokio::task::spawn_blocking(move || bins::kube_version(&kubelet))
                .await
                .map_err(|e| Error::Other(format!("kubelet --version: {e}")))??
        };
        let node = self
            .real_node_at_mut(index)
            .ok_or_else(|| Error::Other(format!("the cluster has no real node {index}")))?;
        let name = node.name();
        node.restart_kubelet_from(&dir)?;
        let nodes: Api<Node> = Api::all(self.client()?);
        self.poll_until(
            &format!("{name} Ready with kubelet {want}"),
            started + RESTART_TIMEOUT,
            || async {
                let n = nodes
                    .get_opt(&name)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("the Node is gone")?;
                let has = kubelet_version(&n).unwrap_or_default();
                match (has == want, kwok::node_ready(&n)) {
                    (true, true) => Ok(()),
                    (true, false) => Err(format!("kubelet {has}, not Ready")),
                    (false, _) => Err(format!("kubelet {has} still")),
                }
            },
        )
        .await?;
        Ok(Replaced {
            component: format!("kubelet of {name}"),
            took: started.elapsed(),
        })
    }
}

/// `status.nodeInfo.kubeletVersion` of a Node.
pub fn kubelet_version(node: &Node) -> Option<String> {
    Some(
        node.status
            .as_ref()?
            .node_info
            .as_ref()?
            .kubelet_version
            .clone(),
    )
}
