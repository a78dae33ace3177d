//! Node-local drivers in the e2e (`spec.topology: NodeLocal`): a
//! CSIDriverDeployment of `csi-test-driver --node-local` for the real node,
//! claims and pods that use its volumes in any namespace, and the node side
//! of a node-local driver on kwok nodes ([`NodeLocalSideSim`]), where each
//! simulated node's node pod is played by local processes: the driver, the
//! registrar and the provisioner run with the arguments and environment
//! the operator rendered into the pod.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use serde_json::json;
use tokio::sync::Mutex;

use crate::node_side::{kubelet_register, registration_socket, start_registrar};
use crate::process::ManagedProcess;
use crate::testdriver::mounts;
use crate::testkit::DriverCr;
use crate::walkthrough::Use;
use crate::{Cluster, Error, Result};

/// Where the node pods of [`TestDriverNodeLocal`] see their per-node host
/// directory (state and volumes).
pub const DATA_MOUNT: &str = "/csi-data";

/// A CSIDriverDeployment of `csi-test-driver --node-local` for the real
/// node: the driver owns a per-node state dir and makes real volumes (bind
/// mounts, loop devices) in a host directory, with `/dev` from the host.
/// With `topology: "Central"` the same driver is deployed as a controller
/// plus node pods, which is how a node-local driver must not be deployed.
pub struct TestDriverNodeLocal<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub driver: &'a str,
    pub image: &'a str,
    pub version: &'a str,
    /// `NodeLocal` or `Central`.
    pub topology: &'a str,
    pub kubelet_dir: &'a Path,
    /// Host directory of the node's state and volumes (`<dir>/state`,
    /// `<dir>/volumes`).
    pub data_dir: &'a Path,
    /// `csiDriver.storageCapacity`, with `--capacity` for the driver.
    pub capacity: Option<&'a str>,
    /// The StorageClass (WaitForFirstConsumer).
    pub class: &'a str,
}

impl TestDriverNodeLocal<'_> {
    /// The node's state dir on the host (see `testdriver::load_state`).
    pub fn state_dir(&self) -> PathBuf {
        self.data_dir.join("state")
    }

    /// The node's volumes on the host: `<id>` (a directory) or `<id>.img`.
    pub fn volumes_dir(&self) -> PathBuf {
        self.data_dir.join("volumes")
    }

    /// The Namespace and the CSIDriverDeployment as YAML. Centrally the
    /// controller keeps its state and volumes in its socket directory (an
    /// emptyDir: it has no host path and no `/dev`), the node pods theirs in
    /// the data dir: two processes, two states, as a mistaken deployment of
    /// hostpathplugin has.
    pub fn yaml(&self) -> String {
        let args = |state: &str, volumes: &str| -> Vec<String> {
            vec![
                format!("--drivername={}", self.driver),
                "--endpoint=$(CSI_ENDPOINT)".into(),
                "--nodeid=$(KUBE_NODE_NAME)".into(),
                "--node-local".into(),
                format!("--state-dir={state}"),
                format!("--data-dir={volumes}"),
            ]
        };
        let mut driver_args = args(
            &format!("{DATA_MOUNT}/state"),
            &format!("{DATA_MOUNT}/volumes"),
        );
        driver_args.extend(self.capacity.map(|c| format!("--capacity={c}")));
        let mut cr = DriverCr::new(self.namespace, self.name, self.driver, self.version)
            .topology(self.topology)
            .image(self.image)
            .driver_args(driver_args)
            .with("node.kubeletDir", self.kubelet_dir.display().to_string())
            .with(
                "node.volumes",
                json!([
                    {
                        "name": "csi-data",
                        "hostPath": {"path": self.data_dir.display().to_string(), "type": "DirectoryOrCreate"},
                    },
                    {"name": "dev-dir", "hostPath": {"path": "/dev", "type": "Directory"}},
                ]),
            )
            .with(
                "node.volumeMounts",
                json!([
                    {"name": "csi-data", "mountPath": DATA_MOUNT},
                    {"name": "dev-dir", "mountPath": "/dev"},
                ]),
            )
            .with("csiDriver.attachRequired", false)
            .with("csiDriver.storageCapacity", self.capacity.is_some())
            .with(
                "storageClasses",
                json!([{"name": self.class, "volumeBindingMode": "WaitForFirstConsumer"}]),
            );
        if self.topology == "Central" {
            cr = cr.with("controller.args", args("/csi/state", "/csi/volumes"));
        }
        cr.yaml()
    }
}

/// A claim of a StorageClass and a pod on a node that uses it, running
/// `csi-test-driver app` (write, read back, then a counter).
#[derive(Clone, Copy, Debug)]
pub struct ClaimApp<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub class: &'a str,
    pub image: &'a str,
    pub text: &'a str,
    pub usage: Use,
    /// `kubernetes.io/hostname` of the pod's node.
    pub node: &'a str,
}

/// The file the app writes in a filesystem volume.
pub const APP_FILE: &str = "hello.txt";
/// Where a block volume appears in the app's container.
pub const APP_DEVICE: &str = "/dev/xvda";

impl ClaimApp<'_> {
    /// The claim and the pod as YAML.
    pub fn yaml(&self) -> String {
        let (mode, attach, args) = match self.usage {
            Use::Filesystem => (
                "Filesystem",
                "volumeMounts:\n    - {name: data, mountPath: /data}".to_string(),
                format!(
                    "[\"app\", \"--dir=/data\", \"--file={APP_FILE}\", \"--text={}\"]",
                    self.text
                ),
            ),
            Use::Block => (
                "Block",
                format!("volumeDevices:\n    - {{name: data, devicePath: {APP_DEVICE}}}"),
                format!(
                    "[\"app\", \"--device={APP_DEVICE}\", \"--text={}\"]",
                    self.text
                ),
            ),
        };
        format!(
            r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: {ns}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: {mode}
  storageClassName: {class}
  resources:
    requests:
      storage: 8Mi
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  terminationGracePeriodSeconds: 5
  containers:
  - name: app
    image: {image}
    args: {args}
    {attach}
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: {name}
"#,
            name = self.name,
            ns = self.namespace,
            class = self.class,
            node = self.node,
            image = self.image,
        )
    }
}

/// Waits until pod `name` of `namespace` is Running.
pub async fn wait_pod_running(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client()?, namespace);
    crate::wait_for(timeout, Duration::from_millis(500), || async {
        let p = pods.get_opt(name).await.ok()??;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await
    .map_err(|_| Error::Other(format!("pod {namespace}/{name} never Running")))
}

/// The PV bound to claim `name` of `namespace`.
pub async fn pv_of(
    client: &kube::Client,
    namespace: &str,
    claim: &str,
) -> Result<PersistentVolume> {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .get(claim)
        .await?;
    let pv = pvc
        .spec
        .and_then(|s| s.volume_name)
        .ok_or_else(|| Error::Other(format!("claim {namespace}/{claim} is not bound")))?;
    Ok(Api::<PersistentVolume>::all(client.clone())
        .get(&pv)
        .await?)
}

/// The CSI volume handle of a PV.
pub fn volume_handle(pv: &PersistentVolume) -> Option<String> {
    pv.spec
        .as_ref()?
        .csi
        .as_ref()
        .map(|c| c.volume_handle.clone())
}

/// Mount points of this process's (the host's) mount namespace under
/// `kubelet_dir` that a CSI volume leaves: publish targets, staging mounts
/// and block volume maps.
pub fn csi_mounts_under(kubelet_dir: &Path) -> Vec<PathBuf> {
    mounts::mount_points(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
        .into_iter()
        .filter(|m| {
            let text = m.to_string_lossy();
            m.starts_with(kubelet_dir)
                && (text.contains("kubernetes.io~csi")
                    || text.contains("globalmount")
                    || text.contains("volumeDevices"))
        })
        .collect()
}

/// Loop devices whose backing file is a volume of `ids`: `…/<id>` or
/// `…/<id>.img`. The kernel names the backing file as the process that set
/// the device up saw it — a driver container's path, not the host's — so
/// volumes are matched by their (unique) IDs.
pub fn loops_of(ids: &[String]) -> Vec<(PathBuf, PathBuf)> {
    mounts::loop_devices()
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, backing)| {
            let name = backing
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            ids.iter()
                .any(|id| name == *id || name == format!("{id}.img"))
        })
        .collect()
}

/// Loop devices backed by a file under `dir` as the host sees it (kubelet's
/// own, of a mapped block volume).
pub fn loops_under(dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    mounts::loop_devices()
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, backing)| backing.starts_with(dir))
        .collect()
}

/// Releases, on drop, the loop devices of the volumes it was told about
/// ([`LoopGuard::track`]): they outlive the driver and the node when a test
/// fails before its volumes are deleted.
#[derive(Debug, Default)]
pub struct LoopGuard {
    ids: std::sync::Mutex<Vec<String>>,
}

impl LoopGuard {
    pub fn track(&self, id: &str) {
        if let Ok(mut ids) = self.ids.lock() {
            ids.push(id.to_string());
        }
    }
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        let ids = self.ids.lock().map(|i| i.clone()).unwrap_or_default();
        for (dev, backing) in loops_of(&ids) {
            eprintln!(
                "LoopGuard: releasing {} (backed by {})",
                dev.display(),
                backing.display()
            );
            if let Err(e) = mounts::detach_device(&dev) {
                eprintln!("LoopGuard: {}: {e}", dev.display());
            }
        }
    }
}

/// Whether the OCI spec of a container (`ctr containers info`) gives it a
/// block device at `path`.
pub fn has_block_device(container_info: &serde_json::Value, path: &str) -> bool {
    container_info["Spec"]["linux"]["devices"]
        .as_array()
        .is_some_and(|d| d.iter().any(|d| d["path"] == path && d["type"] == "b"))
}

/// One simulated node's processes: what its node pod would run.
struct NodeProcesses {
    _driver: ManagedProcess,
    _registrar: ManagedProcess,
    _provisioner: Option<ManagedProcess>,
}

/// What [`NodeLocalSideSim`] needs.
#[derive(Clone, Debug)]
pub struct NodeLocalSideConfig {
    pub kubeconfig: PathBuf,
    pub sidecar: PathBuf,
    pub test_driver: PathBuf,
    /// Where each node's sockets, state and logs go (`<dir>/<node>/…`).
    pub dir: PathBuf,
    pub namespace: String,
    /// Label selector of the driver's node pods.
    pub pod_selector: String,
    pub driver: String,
    /// More flags of every node's `csi-test-driver --node-local`.
    pub driver_args: Vec<String>,
}

impl NodeLocalSideConfig {
    /// A node's directory.
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join(node)
    }

    /// A node's driver state dir.
    pub fn state_dir(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("state")
    }

    /// A node's provisioner log.
    pub fn provisioner_log(&self, node: &str) -> PathBuf {
        self.node_dir(node).join("provisioner.log")
    }
}

/// The node side of a node-local driver on kwok nodes: once a node runs a
/// Ready node pod, a `csi-test-driver --node-local` with that node's own
/// state dir, the csiops registrar (registered by a plugin-watcher client)
/// and — as the operator rendered it into the pod — `csiops-sidecar
/// provisioner --node-deployment` are started for the node.
pub struct NodeLocalSideSim {
    task: tokio::task::JoinHandle<()>,
    nodes: Arc<Mutex<BTreeMap<String, NodeProcesses>>>,
    cfg: NodeLocalSideConfig,
}

impl Drop for NodeLocalSideSim {
    fn drop(&mut self) {
        self.task.abort();
        if let Ok(mut nodes) = self.nodes.try_lock() {
            nodes.clear();
        }
    }
}

/// The value of an env var of the pod's container as kubelet resolves it:
/// a literal, or one of the downward-API fields the operator renders.
fn resolve_env(pod: &Pod, node: &str, c: &Container) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("spec.nodeName") => node.to_string(),
                Some("metadata.namespace") => pod.namespace().unwrap_or_default(),
                Some("metadata.name") => pod.name_any(),
                other => {
                    return Err(Error::Other(format!(
                        "env {} of {}: field {other:?} is not played on kwok nodes",
                        e.name, c.name
                    )))
                }
            },
            (None, None) => String::new(),
        };
        out.push((e.name.clone(), value));
    }
    Ok(out)
}

/// The rendered provisioner's arguments for a process on this machine:
/// the socket is the node's local one, the HTTP endpoint a free loopback
/// port (the nodes share this machine's network), plus the kubeconfig and
/// the namespace a pod's ServiceAccount would have given it.
pub fn provisioner_args(
    rendered: &[String],
    socket: &Path,
    http_port: u16,
    kubeconfig: &Path,
    namespace: &str,
) -> Vec<String> {
    let mut out: Vec<String> = rendered
        .iter()
        .map(|a| {
            if a.starts_with("--csi-address=") {
                format!("--csi-address={}", socket.display())
            } else if a.starts_with("--http-endpoint=") {
                format!("--http-endpoint=127.0.0.1:{http_port}")
            } else {
                a.clone()
            }
        })
        .collect();
    out.push(format!("--kubeconfig={}", kubeconfig.display()));
    // A pod reads its namespace from its ServiceAccount token mount, which
    // a process here lacks; the journal lives there.
    out.push(format!("--leader-election-namespace={namespace}"));
    out
}

async fn start_node(cfg: &NodeLocalSideConfig, pod: &Pod, node: &str) -> Result<NodeProcesses> {
    let dir = cfg.node_dir(node);
    let registry = dir.join("reg");
    let state = cfg.state_dir(node);
    for d in [&registry, &state] {
        std::fs::create_dir_all(d)
            .map_err(|e| Error::Other(format!("creating {}: {e}", d.display())))?;
    }
    let socket = dir.join("csi.sock");
    let mut args = vec![
        format!("--endpoint={}", socket.display()),
        format!("--drivername={}", cfg.driver),
        format!("--nodeid={node}"),
        "--node-local".to_string(),
        format!("--state-dir={}", state.display()),
    ];
    args.extend(cfg.driver_args.iter().cloned());
    let driver = ManagedProcess::spawn(
        "csi-test-driver",
        &cfg.test_driver,
        &args,
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
    let rendered = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == "csi-provisioner"));
    let provisioner = match rendered {
        Some(c) => {
            let args = provisioner_args(
                c.args.as_deref().unwrap_or_default(),
                &socket,
                crate::free_port()?,
                &cfg.kubeconfig,
                &cfg.namespace,
            );
            let env = resolve_env(pod, node, c)?;
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Some(ManagedProcess::spawn_with_env(
                "provisioner",
                &cfg.sidecar,
                &args,
                &env,
                &cfg.provisioner_log(node),
            )?)
        }
        None => None,
    };
    Ok(NodeProcesses {
        _driver: driver,
        _registrar: registrar,
        _provisioner: provisioner,
    })
}

impl NodeLocalSideSim {
    /// Starts watching the driver's node pods (polling every 300ms).
    pub fn spawn(client: kube::Client, cfg: NodeLocalSideConfig) -> Self {
        let nodes = Arc::new(Mutex::new(BTreeMap::new()));
        let state = nodes.clone();
        let watch_cfg = cfg.clone();
        let task = tokio::spawn(async move {
            let cfg = watch_cfg;
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
                        if node == crate::realnode::NODE_NAME
                            || !ready
                            || state.lock().await.contains_key(&node)
                        {
                            continue;
                        }
                        match start_node(&cfg, pod, &node).await {
                            Ok(procs) => {
                                state.lock().await.insert(node.clone(), procs);
                                let socket = registration_socket(
                                    &cfg.node_dir(&node).join("reg"),
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
        Self { task, nodes, cfg }
    }

    /// The configuration (each node's directories).
    pub fn config(&self) -> &NodeLocalSideConfig {
        &self.cfg
    }

    /// The nodes whose processes run.
    pub async fn nodes(&self) -> Vec<String> {
        self.nodes.lock().await.keys().cloned().collect()
    }

    /// Stops every node's processes (SIGTERM, then SIGKILL).
    pub async fn stop(&self) {
        self.nodes.lock().await.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rendered_provisioner_runs_on_the_local_socket_and_a_free_port() {
        let rendered: Vec<String> = [
            "provisioner",
            "--csi-address=/csi/csi.sock",
            "--http-endpoint=:9815",
            "--node-deployment",
            "--worker-threads=5",
        ]
        .map(String::from)
        .to_vec();
        let args = provisioner_args(
            &rendered,
            Path::new("/tmp/n/csi.sock"),
            4711,
            Path::new("/tmp/kubeconfig"),
            "ns",
        );
        assert_eq!(
            args,
            [
                "provisioner",
                "--csi-address=/tmp/n/csi.sock",
                "--http-endpoint=127.0.0.1:4711",
                "--node-deployment",
                "--worker-threads=5",
                "--kubeconfig=/tmp/kubeconfig",
                "--leader-election-namespace=ns",
            ]
        );
    }

    #[test]
    fn a_block_device_is_found_in_the_oci_spec() {
        let info = serde_json::json!({"Spec": {"linux": {"devices": [
            {"path": "/dev/null", "type": "c"},
            {"path": "/dev/xvda", "type": "b", "major": 7, "minor": 3}
        ]}}});
        assert!(has_block_device(&info, "/dev/xvda"));
        assert!(!has_block_device(&info, "/dev/null"));
        assert!(!has_block_device(&serde_json::json!({}), "/dev/xvda"));
    }

    #[test]
    fn the_yaml_parses_for_both_topologies() {
        for topology in ["NodeLocal", "Central"] {
            let d = TestDriverNodeLocal {
                namespace: "ns",
                name: "nl",
                driver: "nl.csiops.dev",
                image: "img:1",
                version: "v1",
                topology,
                kubelet_dir: Path::new("/k"),
                data_dir: Path::new("/d"),
                capacity: Some("1Gi"),
                class: "nl",
            };
            let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&d.yaml())
                .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML document"))
                .collect();
            let spec = &docs[1]["spec"];
            assert_eq!(spec["topology"], topology);
            assert_eq!(spec["csiDriver"]["storageCapacity"], true);
            assert_eq!(
                spec["controller"]["args"].is_array(),
                topology == "Central",
                "{spec}"
            );
        }
        let app = ClaimApp {
            namespace: "ns",
            name: "b",
            class: "nl",
            image: "img:1",
            text: "t",
            usage: Use::Block,
            node: "n",
        };
        let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&app.yaml())
            .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML document"))
            .collect();
        assert_eq!(docs[0]["spec"]["volumeMode"], "Block");
        assert_eq!(
            docs[1]["spec"]["containers"][0]["volumeDevices"][0]["devicePath"],
            APP_DEVICE
        );
    }
}
