//! The provisioner's test bed on a running [`Cluster`]: a controller
//! instance of `csi-test-driver` on a local socket, `csiops-sidecar
//! provisioner` against it, and the cluster's nodes made to look as the
//! registrar leaves them (topology label and a CSINode entry per node), so
//! topology is computed from real Node and CSINode objects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use crate::process::ManagedProcess;
use crate::testdriver::config::{DEFAULT_DRIVER_NAME, DEFAULT_TOPOLOGY_KEY};
use crate::testdriver::harness::{test_driver_bin, TestDriverProcess};
use crate::{free_port, sidecar_bin, Cluster, Error, Result};

/// The driver name of the bed.
pub const DRIVER: &str = DEFAULT_DRIVER_NAME;
/// The driver's topology key; each node's value is its name.
pub const TOPOLOGY_KEY: &str = DEFAULT_TOPOLOGY_KEY;

/// Labels every node with [`TOPOLOGY_KEY`] and gives it a CSINode entry for
/// [`DRIVER`], as our registrar does on a real node.
pub async fn register_nodes(cluster: &Cluster) -> Result<()> {
    let client = cluster.client()?;
    let nodes: Api<Node> = Api::all(client.clone());
    for name in cluster.node_names() {
        let labels = serde_json::json!({"metadata": {"labels": {TOPOLOGY_KEY: name}}});
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&labels))
            .await
            .map_err(|e| Error::Other(format!("labelling node {name}: {e}")))?;
        crate::attach::register_driver(&client, name, DRIVER, name, &[TOPOLOGY_KEY]).await?;
    }
    Ok(())
}

/// A driver and the provisioner in front of it.
pub struct ProvisionerBed {
    pub driver: TestDriverProcess,
    sidecar: Option<ManagedProcess>,
    sidecar_bin: PathBuf,
    sidecar_args: Vec<String>,
    sidecar_log: PathBuf,
    /// Port of the provisioner's /metrics.
    pub http_port: u16,
}

impl ProvisionerBed {
    /// Registers the nodes, starts `csi-test-driver <driver_args>` and the
    /// provisioner with test-friendly defaults plus `sidecar_args` (later
    /// flags win).
    pub async fn start(
        cluster: &Cluster,
        driver_args: &[&str],
        sidecar_args: &[&str],
    ) -> Result<ProvisionerBed> {
        register_nodes(cluster).await?;
        let dir = cluster.work_dir();
        let socket = dir.join("drv.sock");
        let state = dir.join("drv-state");
        std::fs::create_dir_all(&state)
            .map_err(|e| Error::Other(format!("creating {}: {e}", state.display())))?;
        let mut args = vec!["--nodeid=controller"];
        args.extend_from_slice(driver_args);
        let driver = TestDriverProcess::start(
            &test_driver_bin()?,
            &socket,
            &state,
            &args,
            &cluster.log_dir().join("csi-test-driver.log"),
        )
        .await?;
        let http_port = free_port()?;
        let mut all = vec![
            "provisioner".to_string(),
            format!("--csi-address=unix://{}", socket.display()),
            format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            format!("--http-endpoint=127.0.0.1:{http_port}"),
            "--kube-api-qps=200".into(),
            "--kube-api-burst=400".into(),
            "--retry-interval-start=200ms".into(),
            "--retry-interval-max=2s".into(),
            "--timeout=10s".into(),
            "--extra-create-metadata".into(),
            "--v=4".into(),
        ];
        all.extend(sidecar_args.iter().map(|s| s.to_string()));
        let mut bed = ProvisionerBed {
            driver,
            sidecar: None,
            sidecar_bin: sidecar_bin()?,
            sidecar_args: all,
            sidecar_log: cluster.log_dir().join("provisioner.log"),
            http_port,
        };
        bed.start_sidecar()?;
        Ok(bed)
    }

    /// Starts the provisioner (again), its output appended to the same log.
    pub fn start_sidecar(&mut self) -> Result<()> {
        self.sidecar = Some(ManagedProcess::spawn(
            "provisioner",
            &self.sidecar_bin,
            &self.sidecar_args,
            &self.sidecar_log,
        )?);
        Ok(())
    }

    /// `kill -9` of the provisioner, no grace.
    pub fn kill9_sidecar(&mut self) {
        if let Some(mut p) = self.sidecar.take() {
            p.kill9();
        }
    }

    /// SIGTERM and wait.
    pub fn stop_sidecar(&mut self) {
        if let Some(mut p) = self.sidecar.take() {
            p.terminate(Duration::from_secs(10));
        }
    }

    pub fn sidecar_pid(&self) -> Option<u32> {
        self.sidecar.as_ref().map(ManagedProcess::pid)
    }

    /// Fails when the provisioner exited.
    pub fn check_sidecar(&mut self) -> Result<()> {
        match self.sidecar.as_mut() {
            Some(p) => p.check_running(),
            None => Ok(()),
        }
    }

    pub fn sidecar_log(&self) -> String {
        std::fs::read_to_string(&self.sidecar_log).unwrap_or_default()
    }

    pub fn sidecar_log_path(&self) -> &Path {
        &self.sidecar_log
    }

    /// The value of counter `name` (all its label sets summed) in the
    /// provisioner's metrics now; 0 when it does not answer (not serving
    /// yet) or has none.
    pub async fn metric_sum(&self, name: &str) -> u64 {
        let Some((200, text)) =
            crate::testkit::http_get_async(([127, 0, 0, 1], self.http_port).into(), "/metrics")
                .await
        else {
            return 0;
        };
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }

    /// Volume name → volume ID of the driver's live volumes.
    pub fn driver_volumes(&self) -> Result<BTreeMap<String, String>> {
        let state = self
            .driver
            .state()
            .map_err(|e| Error::Other(format!("reading the driver state: {e}")))?;
        Ok(state
            .volumes
            .values()
            .map(|v| (v.name.clone(), v.id.clone()))
            .collect())
    }
}
