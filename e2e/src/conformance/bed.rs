//! The cluster the suite runs against: the control plane, two real nodes
//! (no kwok node: the suite's pods must only land on real ones), the
//! operator from `manifests/install.yaml`, the VolumeSnapshot CRDs and
//! upstream's snapshot-controller (a cluster add-on, run here as a local
//! process like kube-controller-manager), and the drivers' CSIDriverDeployments
//! Running and registered on both nodes.

use std::path::PathBuf;
use std::time::Duration;

use super::drivers::{self, DriverSetup};
use super::run::{self, RunFiles, RunPlan, RunReport};
use super::suite::Suite;
use crate::error::{Error, Result};
use crate::process::ManagedProcess;
use crate::realnode::images;
use crate::testdriver::leftovers::leftovers_under;
use crate::testkit;
use crate::{walkthrough, Cluster, ClusterOptions};

/// Real nodes of the bed: the multi-node specs need two.
pub const NODES: usize = 2;

/// The VolumeSnapshot CRDs of the bin dir (`crds/snapshot/`).
const SNAPSHOT_CRDS: [&str; 3] = [
    "volumesnapshotclasses",
    "volumesnapshotcontents",
    "volumesnapshots",
];

/// How the bed deploys its drivers.
#[derive(Debug, Clone)]
pub enum Deploy {
    /// Each driver's CSIDriverDeployment (`csidriverdeployment.yaml`),
    /// Running at v1 with both nodes registered.
    Operator,
    /// Another deployment of the one driver, to compare with csiops' (say,
    /// upstream's own manifests, adapted to the bed and kept outside this
    /// repository): this file, with the same placeholders filled in, is
    /// applied instead, and the driver counts as up once both nodes'
    /// CSINode list it. `images` are the OCI archives of the images it
    /// names that the bed does not have, loaded into both nodes.
    Manifest { file: PathBuf, images: Vec<PathBuf> },
}

/// A running bed; [`Bed::stop`] tears it down.
pub struct Bed {
    pub cluster: Cluster,
    pub suite: Suite,
    pub drivers: Vec<DriverSetup>,
    deploy: Deploy,
    snapshot_controller: Option<ManagedProcess>,
}

/// The name the bed applies driver `d`'s manifest under
/// ([`testkit::apply_yaml`]), and deletes it by at the end.
fn applied_name(d: &DriverSetup) -> String {
    format!("driver-{}", d.name)
}

impl Bed {
    /// Brings everything up; fails (naming what) if a driver does not reach
    /// Running with both nodes registered.
    pub async fn start(suite: Suite, drivers: &[DriverSetup], deploy: Deploy) -> Result<Bed> {
        if matches!(deploy, Deploy::Manifest { .. }) && drivers.len() != 1 {
            return Err(Error::Other(
                "a driver deployed from a manifest runs alone: name one driver".into(),
            ));
        }
        let mut extra_images = suite.image_archives();
        for d in drivers {
            extra_images.extend(d.image_archive()?);
        }
        if let Deploy::Manifest { images, .. } = &deploy {
            for image in images {
                if !image.is_file() {
                    return Err(Error::Other(format!("{} is no file", image.display())));
                }
            }
            extra_images.extend(images.iter().cloned());
        }
        let cluster = Cluster::start(ClusterOptions {
            nodes: 0,
            real_node: true,
            real_node_count: NODES,
            extra_images,
            ..ClusterOptions::default()
        })
        .await?;
        let mut bed = Bed {
            cluster,
            suite,
            drivers: drivers.to_vec(),
            deploy,
            snapshot_controller: None,
        };
        walkthrough::install_operator(&bed.cluster).await?;
        if drivers.iter().any(|d| d.snapshots) {
            bed.start_snapshots().await?;
        }
        let node = bed
            .cluster
            .real_node()
            .ok_or_else(|| Error::Other("the bed has no real node".into()))?;
        let image = node.images().reference(images::TEST_DRIVER)?.to_string();
        let kubelet_dir = node.layout().kubelet_dir();
        let snapshotter = bed.suite.image("csi-snapshotter")?.to_string();
        for d in drivers {
            let vars = drivers::vars(&image, &snapshotter, &kubelet_dir, &bed.data_dir(d));
            let manifest = match &bed.deploy {
                Deploy::Operator => d.manifest(&vars)?,
                Deploy::Manifest { file, .. } => drivers::fill(file, &vars)?,
            };
            let out = testkit::apply_yaml(&bed.cluster, &applied_name(d), &manifest).await?;
            if !out.status.success() {
                return Err(Error::Other(format!(
                    "applying the {} driver: {}",
                    d.name,
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
        }
        for d in drivers {
            let up = match &bed.deploy {
                Deploy::Operator => testkit::wait_running(
                    &bed.cluster,
                    d.namespace,
                    d.object,
                    "v1",
                    NODES,
                    Duration::from_secs(300),
                )
                .await
                .map(drop),
                Deploy::Manifest { .. } => bed.wait_registered(d).await,
            };
            up.map_err(|e| {
                Error::Other(format!(
                    "{e}\n{}",
                    testkit::kubectl_text(&bed.cluster, &["get", "pods", "-A", "-o", "wide"])
                ))
            })?;
        }
        Ok(bed)
    }

    /// Waits until every node's CSINode lists `d`'s driver.
    async fn wait_registered(&self, d: &DriverSetup) -> Result<()> {
        crate::wait_for(Duration::from_secs(300), Duration::from_secs(2), || async {
            let out = self
                .cluster
                .kubectl_ok([
                    "get",
                    "csinodes",
                    "-o",
                    "jsonpath={range .items[*]}{.spec.drivers[*].name}{\"\\n\"}{end}",
                ])
                .await
                .ok()?;
            let registered = out
                .lines()
                .filter(|l| l.split_whitespace().any(|n| n == d.driver))
                .count();
            (registered == NODES).then_some(())
        })
        .await
        .map_err(|_| {
            Error::Other(format!(
                "{} was not registered on {NODES} nodes within 5 minutes",
                d.driver
            ))
        })
    }

    /// The host directory of a driver's state and volumes.
    pub fn data_dir(&self, d: &DriverSetup) -> PathBuf {
        self.cluster.work_dir().join(format!("data-{}", d.name))
    }

    async fn start_snapshots(&mut self) -> Result<()> {
        let bin = self.cluster.bin_dir().to_path_buf();
        for crd in SNAPSHOT_CRDS {
            let file = bin
                .join("crds/snapshot")
                .join(format!("snapshot.storage.k8s.io_{crd}.yaml"));
            self.cluster
                .kubectl_ok(["apply", "--server-side", "-f", &file.to_string_lossy()])
                .await?;
        }
        for crd in SNAPSHOT_CRDS {
            self.cluster
                .kubectl_ok([
                    "wait",
                    "--for=condition=established",
                    "--timeout=60s",
                    &format!("crd/{crd}.snapshot.storage.k8s.io"),
                ])
                .await?;
        }
        // No group snapshots: their CRDs are not installed.
        self.snapshot_controller = Some(ManagedProcess::spawn(
            "snapshot-controller",
            &bin.join("snapshot-controller"),
            &[
                format!("--kubeconfig={}", self.cluster.kubeconfig_path().display()),
                "--feature-gates=CSIVolumeGroupSnapshot=false".into(),
                "--v=3".into(),
            ],
            &self.cluster.log_dir().join("snapshot-controller.log"),
        )?);
        Ok(())
    }

    /// Runs `plan` against every driver of the bed; reports in `out_dir`.
    pub async fn run(&self, plan: &RunPlan, out_dir: &std::path::Path) -> Result<RunReport> {
        std::fs::create_dir_all(out_dir)
            .map_err(|e| Error::Other(format!("creating {}: {e}", out_dir.display())))?;
        let files = RunFiles::new(out_dir, &plan.name);
        let (suite, plan, drivers) = (self.suite.clone(), plan.clone(), self.drivers.clone());
        let kubeconfig = self.cluster.kubeconfig_path().to_path_buf();
        let root = testkit::workspace_root();
        tokio::task::spawn_blocking(move || {
            run::run(&suite, &plan, &drivers, &kubeconfig, &root, &files)
        })
        .await
        .map_err(|e| Error::Other(format!("ginkgo task: {e}")))?
    }

    /// Waits (bounded) until the suite's volumes are gone, deletes the
    /// drivers (the operator tears them down), stops everything and returns
    /// what was left behind: PersistentVolumes, CSI mounts in either node's
    /// mount namespace, loop devices of the drivers' volumes, and what the
    /// nodes left on the host.
    pub async fn stop(mut self) -> Result<Vec<String>> {
        let mut left = Vec::new();
        // The framework deletes its namespaces without waiting; their
        // claims' volumes are deleted by the drivers, which must still run.
        let pvs = crate::wait_for(Duration::from_secs(300), Duration::from_secs(2), || async {
            let out = self
                .cluster
                .kubectl_ok(["get", "pv", "-o", "name"])
                .await
                .ok()?;
            out.trim().is_empty().then_some(())
        })
        .await;
        if pvs.is_err() {
            left.push(format!(
                "PersistentVolumes not deleted within 5 minutes:\n{}",
                testkit::kubectl_text(&self.cluster, &["get", "pv"])
            ));
        }
        for d in &self.drivers {
            let file = testkit::applied_path(&self.cluster, &applied_name(d));
            let file = file.to_string_lossy();
            let out = match &self.deploy {
                Deploy::Operator => {
                    self.cluster
                        .kubectl([
                            "-n",
                            d.namespace,
                            "delete",
                            "csidriverdeployment",
                            d.object,
                            "--timeout=120s",
                        ])
                        .await?
                }
                Deploy::Manifest { .. } => {
                    self.cluster
                        .kubectl(["delete", "-f", &file, "--timeout=120s"])
                        .await?
                }
            };
            if !out.status.success() {
                left.push(format!(
                    "deleting the {} driver: {}",
                    d.name,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        drop(self.snapshot_controller.take());
        if let Some(nodes) = self.cluster.real_nodes() {
            for n in nodes.nodes() {
                let csi = n.layout().kubelet_dir();
                // CSI volumes: published in a pod's `volumes/kubernetes.io~csi`
                // or `volumeDevices/kubernetes.io~csi`, staged under
                // `plugins/kubernetes.io/csi` (the operator's own pods still
                // run, with their projected token mounts).
                let volume_mounts = n.mount_points()?.into_iter().filter(|m| {
                    (m.starts_with(csi.join("pods"))
                        && m.to_string_lossy().contains("kubernetes.io~csi"))
                        || m.starts_with(csi.join("plugins/kubernetes.io/csi"))
                });
                left.extend(
                    volume_mounts.map(|m| format!("mount on {}: {}", n.name(), m.display())),
                );
            }
        }
        for d in &self.drivers {
            let l = leftovers_under(&self.data_dir(d));
            left.extend(l.mounts.iter().map(|m| format!("mount {}", m.display())));
            left.extend(
                l.loops.iter().map(|(dev, file)| {
                    format!("loop device {} of {}", dev.display(), file.display())
                }),
            );
        }
        left.extend(self.cluster.stop_and_report().await?);
        Ok(left)
    }
}
