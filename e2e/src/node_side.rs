//! The node side of a simulated node: a real CSI driver process on a unix
//! socket, and kubelet's plugin watcher talking to a registration socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csiops_proto::client;
use csiops_proto::pluginregistration::registration_client::RegistrationClient;
use csiops_proto::pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus};

use crate::process::ManagedProcess;
use crate::{Error, Result};

/// Starts `csi-mock-driver` (Kubernetes' e2e CSI driver) on `socket`.
pub fn start_mock_driver(
    bin_dir: &Path,
    socket: &Path,
    driver: &str,
    node_id: &str,
    log: &Path,
) -> Result<ManagedProcess> {
    let args = vec![
        format!("--endpoint={}", socket.display()),
        format!("--drivername={driver}"),
        format!("--nodeid={node_id}"),
        "--attach-limit=10".to_string(),
        "--enable-topology".to_string(),
    ];
    ManagedProcess::spawn(
        "csi-mock-driver",
        &bin_dir.join("csi-mock-driver"),
        &args,
        log,
    )
}

/// Starts `csiops-sidecar registrar` for `node`: the driver on `socket`,
/// its registration socket in `registry`, CSINode maintenance through
/// `kubeconfig`.
pub fn start_registrar(
    sidecar: &Path,
    kubeconfig: &Path,
    socket: &Path,
    registry: &Path,
    driver: &str,
    node: &str,
    log: &Path,
) -> Result<ManagedProcess> {
    let args = vec![
        "registrar".to_string(),
        format!("--csi-address={}", socket.display()),
        format!("--kubelet-registration-path=/var/lib/kubelet/plugins/{driver}/csi.sock"),
        format!("--plugin-registration-path={}", registry.display()),
        format!("--node-name={node}"),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--node-info-interval=2s".to_string(),
    ];
    ManagedProcess::spawn("registrar", sidecar, &args, log)
}

/// The registration socket of `driver` in a plugins_registry directory.
pub fn registration_socket(registry: &Path, driver: &str) -> PathBuf {
    registry.join(format!("{driver}-reg.sock"))
}

async fn registration_client(socket: &Path) -> Result<RegistrationClient<client::CsiChannel>> {
    let channel = client::connect(&socket.to_string_lossy(), Duration::from_secs(5))
        .await
        .map_err(|e| Error::Other(e.to_string()))?;
    Ok(RegistrationClient::new(channel))
}

/// What kubelet's plugin watcher does with a new socket: GetInfo, then
/// NotifyRegistrationStatus with the outcome (`Ok` registers).
pub async fn kubelet_register(
    socket: &Path,
    outcome: std::result::Result<(), String>,
) -> Result<PluginInfo> {
    let mut c = registration_client(socket).await?;
    let info = c
        .get_info(InfoRequest {})
        .await
        .map_err(|s| Error::Other(format!("GetInfo: {s}")))?
        .into_inner();
    let status = match outcome {
        Ok(()) => RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        },
        Err(e) => RegistrationStatus {
            plugin_registered: false,
            error: e,
        },
    };
    c.notify_registration_status(status)
        .await
        .map_err(|s| Error::Other(format!("NotifyRegistrationStatus: {s}")))?;
    Ok(info)
}

/// Registers a registrar's socket the way kubelet's plugin watcher does,
/// once it appears (within 30 s).
pub async fn register_when_ready(socket: &Path) -> std::result::Result<(), crate::WaitTimeout> {
    crate::wait_for(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            if !socket.exists() {
                return None;
            }
            kubelet_register(socket, Ok(())).await.ok()
        },
    )
    .await
    .map(|_| ())
}

/// One simulated node's processes.
struct NodeProcesses {
    _driver: ManagedProcess,
    _registrar: ManagedProcess,
}

/// Plays the node side of a driver's DaemonSet on kwok nodes: once a node
/// runs a Ready node pod, a real CSI driver process and the csiops registrar
/// are started for that node, and kubelet's plugin watcher registers them.
/// The registrar then writes the node's CSINode, so REGISTERED in
/// `kubectl get csidd` comes from the real sidecar.
pub struct NodeSideSim {
    task: tokio::task::JoinHandle<()>,
    nodes: std::sync::Arc<tokio::sync::Mutex<std::collections::BTreeMap<String, NodeProcesses>>>,
}

impl Drop for NodeSideSim {
    fn drop(&mut self) {
        self.task.abort();
        // Processes stop on drop (SIGTERM, then SIGKILL).
        if let Ok(mut nodes) = self.nodes.try_lock() {
            nodes.clear();
        }
    }
}

/// What NodeSideSim needs to start a node.
#[derive(Clone, Debug)]
pub struct NodeSideConfig {
    pub kubeconfig: PathBuf,
    pub bin_dir: PathBuf,
    pub sidecar: PathBuf,
    /// Where each node's sockets and logs go (`<dir>/<node>/…`).
    pub dir: PathBuf,
    pub namespace: String,
    /// Label selector of the driver's node pods.
    pub pod_selector: String,
    pub driver: String,
}

fn start_node(cfg: &NodeSideConfig, node: &str) -> Result<NodeProcesses> {
    let dir = cfg.dir.join(node);
    let registry = dir.join("reg");
    std::fs::create_dir_all(&registry)
        .map_err(|e| Error::Other(format!("creating {}: {e}", registry.display())))?;
    let socket = dir.join("csi.sock");
    let driver = start_mock_driver(
        &cfg.bin_dir,
        &socket,
        &cfg.driver,
        node,
        &dir.join("driver.log"),
    )?;
    let registrar = start_registrar(
        &cfg.sidecar,
        &cfg.kubeconfig,
        &socket,
        &registry,
        &cfg.driver,
        node,
        &dir.join("registrar.log"),
    )?;
    Ok(NodeProcesses {
        _driver: driver,
        _registrar: registrar,
    })
}

impl NodeSideSim {
    /// Starts watching the driver's node pods (polling every 300ms).
    pub fn spawn(client: kube::Client, cfg: NodeSideConfig) -> Self {
        use k8s_openapi::api::core::v1::Pod;
        use kube::api::{Api, ListParams};
        let nodes = std::sync::Arc::new(tokio::sync::Mutex::new(std::collections::BTreeMap::new()));
        let state = nodes.clone();
        let task = tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client, &cfg.namespace);
            loop {
                if let Ok(list) = pods
                    .list(&ListParams::default().labels(&cfg.pod_selector))
                    .await
                {
                    for pod in &list.items {
                        let ready = pod.metadata.deletion_timestamp.is_none()
                            && pod
                                .status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|cs| {
                                    cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                                });
                        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                            continue;
                        };
                        // The real node's pods run for real, registered by kubelet.
                        if node == crate::realnode::NODE_NAME {
                            continue;
                        }
                        if !ready || state.lock().await.contains_key(&node) {
                            continue;
                        }
                        match start_node(&cfg, &node) {
                            Ok(procs) => {
                                state.lock().await.insert(node.clone(), procs);
                                let socket = registration_socket(
                                    &cfg.dir.join(&node).join("reg"),
                                    &cfg.driver,
                                );
                                let registered = crate::wait_for(
                                    Duration::from_secs(30),
                                    Duration::from_millis(100),
                                    || async {
                                        if !socket.exists() {
                                            return None;
                                        }
                                        kubelet_register(&socket, Ok(())).await.ok()
                                    },
                                )
                                .await;
                                if registered.is_err() {
                                    tracing::warn!(%node, "plugin watcher could not register the driver");
                                }
                            }
                            Err(e) => {
                                tracing::warn!(%node, error = %e, "cannot start the node side")
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Self { task, nodes }
    }
}
