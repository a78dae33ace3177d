//! The Kubernetes CSI design's example walkthrough on the real node, as
//! pieces the e2e test and `make demo` share: install the operator from
//! `manifests/install.yaml`, deploy csi-test-driver with real volumes
//! (`--data-dir` on a host directory, attach required, a
//! WaitForFirstConsumer StorageClass), and claims and pods that use them.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver};
use kube::api::Api;

use serde_json::json;

use crate::error::{Error, Result};
use crate::realnode::NODE_NAME;
use crate::testkit::DriverCr;
use crate::{testkit, wait_for, Cluster};

/// Namespace of the walkthrough's driver, claims and pods.
pub const NS: &str = "csi-walkthrough";
/// The CSIDriverDeployment's name.
pub const NAME: &str = "hostpath";
/// The CSI driver name.
pub const DRIVER: &str = "hostpath.csiops.dev";
/// The StorageClass the CSIDriverDeployment creates.
pub const STORAGE_CLASS: &str = "csiops-hostpath";
/// Where the host's data dir appears in the driver containers.
pub const DATA_MOUNT: &str = "/csi-data";

/// Applies `manifests/install.yaml` unmodified and waits until the
/// operator's Deployment is ready.
pub async fn install_operator(cluster: &Cluster) -> Result<()> {
    install_operator_tolerating(cluster, None).await
}

/// [`install_operator`], the operator's pod also tolerating the NoSchedule
/// taint `key` (as a user sets it through the Helm chart's `tolerations`).
pub async fn install_operator_tolerating(cluster: &Cluster, key: Option<&str>) -> Result<()> {
    let install = testkit::workspace_root().join("manifests/install.yaml");
    cluster
        .kubectl_ok(["apply", "--server-side", "-f", &install.to_string_lossy()])
        .await?;
    if let Some(key) = key {
        let patch = serde_json::json!([{
            "op": "add",
            "path": "/spec/template/spec/tolerations",
            "value": [{"key": key, "operator": "Exists", "effect": "NoSchedule"}],
        }]);
        cluster
            .kubectl_ok([
                "-n",
                "csiops-system",
                "patch",
                "deployment/csiops-operator",
                "--type=json",
                "-p",
                &patch.to_string(),
            ])
            .await?;
    }
    cluster
        .kubectl_ok([
            "-n",
            "csiops-system",
            "rollout",
            "status",
            "deployment/csiops-operator",
            "--timeout=180s",
        ])
        .await?;
    Ok(())
}

/// csi-test-driver deployed with real volumes.
pub struct VolumeDriver<'a> {
    pub image: &'a str,
    pub version: &'a str,
    pub kubelet_dir: &'a Path,
    /// Host directory of the volumes and the driver's shared state.
    pub data_dir: &'a Path,
    /// Tolerate kwok's taint too (the demo's simulated nodes).
    pub on_simulated_nodes: bool,
    /// Driver flags added in controller pods only (fault injection).
    pub controller_args: &'a [&'a str],
    /// Driver flags added in node pods only (fault injection).
    pub node_args: &'a [&'a str],
    /// More fields of `spec.node` (e.g. `("readinessTaint", json!(true))`).
    pub node_fields: &'a [(&'a str, serde_json::Value)],
}

impl VolumeDriver<'_> {
    /// Where the volumes live on the host: `<data_dir>/volumes/<id>` (a
    /// directory) or `<data_dir>/volumes/<id>.img` (a block volume).
    pub fn volumes_dir(&self) -> PathBuf {
        self.data_dir.join("volumes")
    }

    /// The driver's state dir on the host (see `testdriver::load_state`).
    pub fn state_dir(&self) -> PathBuf {
        self.data_dir.join("state")
    }

    /// The Namespace and the CSIDriverDeployment as YAML.
    pub fn yaml(&self) -> String {
        self.cr().yaml()
    }

    /// The CSIDriverDeployment. Controller and node pods share one state
    /// file (flock'ed), as a real backend is shared; the node pod mounts
    /// into kubelet's directory, which the operator mounts Bidirectional.
    pub fn cr(&self) -> DriverCr {
        let data = self.data_dir.display().to_string();
        let base = [
            format!("--drivername={DRIVER}"),
            "--endpoint=$(CSI_ENDPOINT)".to_string(),
            "--nodeid=$(KUBE_NODE_NAME)".to_string(),
            "--enable-attach".to_string(),
            format!("--state-dir={DATA_MOUNT}/state"),
            format!("--data-dir={DATA_MOUNT}/volumes"),
        ];
        // `args` of a workload replaces the driver's: the base flags plus extras.
        let args = |extra: &[&str]| -> Vec<String> {
            base.iter()
                .cloned()
                .chain(extra.iter().map(|a| a.to_string()))
                .collect()
        };
        let mut cr = DriverCr::new(NS, NAME, DRIVER, self.version)
            .image(self.image)
            .driver_args(base.clone())
            .shared_host_dir("csi-data", &data, DATA_MOUNT)
            .with("node.kubeletDir", self.kubelet_dir.display().to_string())
            .with("csiDriver.attachRequired", true)
            .with("csiDriver.fsGroupPolicy", "File")
            .with(
                "storageClasses",
                json!([{"name": STORAGE_CLASS, "volumeBindingMode": "WaitForFirstConsumer"}]),
            );
        if self.on_simulated_nodes {
            cr = cr.with("node.tolerations", testkit::simulated_toleration());
        }
        if !self.controller_args.is_empty() {
            cr = cr.with("controller.args", args(self.controller_args));
        }
        if !self.node_args.is_empty() {
            cr = cr.with("node.args", args(self.node_args));
        }
        for (field, value) in self.node_fields {
            cr = cr.with(&format!("node.{field}"), value.clone());
        }
        cr
    }
}

/// How a claim's volume reaches the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// A filesystem volume at `/data`: the app writes `/data/<file>` and a
    /// counter line every 100 ms to `/data/counter`.
    Filesystem,
    /// A raw block device at `/dev/xvda`: the app writes its text at offset 0.
    Block,
}

/// A PersistentVolumeClaim and a Pod on the real node that uses it.
#[derive(Clone, Copy, Debug)]
pub struct App<'a> {
    pub name: &'a str,
    pub image: &'a str,
    pub text: &'a str,
    pub access_mode: &'a str,
    pub usage: Use,
    /// `securityContext.fsGroup` of the pod.
    pub fs_group: Option<i64>,
}

/// The file the app writes in a filesystem volume.
pub const APP_FILE: &str = "hello.txt";

impl App<'_> {
    /// The claim and the pod as YAML.
    pub fn yaml(&self) -> String {
        format!(
            r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: {NS}
spec:
  accessModes: [{access}]
  volumeMode: {mode}
  storageClassName: {STORAGE_CLASS}
  resources:
    requests:
      storage: 8Mi
---
{pod}"#,
            name = self.name,
            access = self.access_mode,
            mode = match self.usage {
                Use::Filesystem => "Filesystem",
                Use::Block => "Block",
            },
            pod = self.pod_yaml(self.name),
        )
    }

    /// A pod named `pod` that uses the app's claim, as YAML.
    pub fn pod_yaml(&self, pod: &str) -> String {
        let (attach, app_args) = match self.usage {
            Use::Filesystem => (
                "volumeMounts:\n    - {name: data, mountPath: /data}",
                format!(
                    "[\"app\", \"--dir=/data\", \"--file={APP_FILE}\", \"--text={}\"]",
                    self.text
                ),
            ),
            Use::Block => (
                "volumeDevices:\n    - {name: data, devicePath: /dev/xvda}",
                format!(
                    "[\"app\", \"--device=/dev/xvda\", \"--text={}\"]",
                    self.text
                ),
            ),
        };
        let security = self
            .fs_group
            .map(|g| format!("\n  securityContext: {{fsGroup: {g}}}"))
            .unwrap_or_default();
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {pod}
  namespace: {NS}
spec:
  nodeSelector:
    kubernetes.io/hostname: {NODE_NAME}
  terminationGracePeriodSeconds: 5{security}
  containers:
  - name: app
    image: {image}
    args: {app_args}
    {attach}
  volumes:
  - name: data
    persistentVolumeClaim:
      claimName: {claim}
"#,
            claim = self.name,
            image = self.image,
        )
    }
}

/// What a driver on the real node needs from it: csi-test-driver's image
/// reference, the node's kubelet directory, and the host directory
/// `<node root>/<data>` for the driver's volumes (created).
pub fn real_node_bed(cluster: &Cluster, data: &str) -> Result<(String, PathBuf, PathBuf)> {
    let node = cluster
        .real_node()
        .ok_or_else(|| Error::Other("the cluster has no real node".into()))?;
    let image = node
        .images()
        .reference(crate::realnode::images::TEST_DRIVER)?
        .to_string();
    let data_dir = node.layout().root.join(data);
    std::fs::create_dir_all(&data_dir)
        .map_err(|e| Error::Other(format!("creating {}: {e}", data_dir.display())))?;
    Ok((image, node.layout().kubelet_dir(), data_dir))
}

/// Waits until the pod `name` of [`NS`] is Running.
pub async fn wait_pod_running(cluster: &Cluster, name: &str, timeout: Duration) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client()?, NS);
    wait_for(timeout, Duration::from_millis(500), || async {
        let p = pods.get_opt(name).await.ok()??;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await
    .map_err(|_| Error::Other(format!("pod {NS}/{name} never Running")))
}

/// Waits until kubelet lists `driver` in the real node's CSINode (its
/// registrar registered), and returns that entry.
pub async fn wait_registered(
    cluster: &Cluster,
    driver: &str,
    timeout: Duration,
) -> Result<CSINodeDriver> {
    let csinodes: Api<CSINode> = Api::all(cluster.client()?);
    wait_for(timeout, Duration::from_millis(500), || async {
        let c = csinodes.get_opt(NODE_NAME).await.ok()??;
        c.spec.drivers.into_iter().find(|d| d.name == driver)
    })
    .await
    .map_err(|_| {
        Error::Other(format!(
            "kubelet never listed {driver} in CSINode {NODE_NAME}"
        ))
    })
}

/// The longest pause, in ms, between counter lines (`<n> <unix ms>`) written
/// from `from` to `to`; an error if the counter did not run through it.
pub fn longest_gap(counter: &str, from: u128, to: u128) -> Result<u128, String> {
    let stamps: Vec<u128> = counter
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    let first = stamps
        .iter()
        .position(|&t| t >= from)
        .ok_or("no counter line after the upgrade began")?;
    let last = stamps
        .iter()
        .position(|&t| t >= to)
        .ok_or("the counter stopped before the upgrade ended")?;
    let window = &stamps[first.saturating_sub(1)..=last];
    Ok(window
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .max()
        .unwrap_or(0))
}

pub fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}
