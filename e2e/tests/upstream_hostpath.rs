//! Upstream csi-driver-host-path's hostpathplugin v1.18.0 deployed by
//! `manifests/examples/hostpath.yaml` on the real node: a filesystem and a
//! block claim mount, the pods write and read back their data, and nothing
//! is left after the claims and the object are deleted.
//!
//! Not part of `make test` (ignored): the hostpathplugin image is built
//! from upstream's own repository, never by this one. Build it as
//! `e2e/README.md` says ("Upstream hostpathplugin"), then
//!
//! ```sh
//! CSIOPS_HOSTPATHPLUGIN_IMAGE=/tmp/hostpathplugin-v1.18.0.tar \
//!   cargo test -p csiops-e2e --test upstream_hostpath -- --ignored --nocapture
//! ```
//!
//! Without the variable the test fails saying so. The example is applied as
//! it is but for the two host paths a test must not take from the machine:
//! `node.kubeletDir` (the real node's kubelet runs in the test's directory)
//! and the data dir (under the node's directory, not /var/lib).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csiops_e2e::node_local::{self as nl, ClaimApp, LoopGuard, APP_DEVICE, APP_FILE};
use csiops_e2e::realnode::{images, NODE_NAME};
use csiops_e2e::testdriver::leftovers::{leftovers_under, LeftoverGuard};
use csiops_e2e::walkthrough::{self, Use};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, DeleteParams, ListParams};
use kube::ResourceExt;

const IMAGE_ENV: &str = "CSIOPS_HOSTPATHPLUGIN_IMAGE";
/// The image the example names; the archive must carry this name.
const IMAGE: &str = "registry.k8s.io/sig-storage/hostpathplugin:v1.18.0";
const NS: &str = "csi-hostpath";
const NAME: &str = "hostpath";
const CLASS: &str = "csi-hostpath-sc";
const DEADLINE: Duration = Duration::from_secs(240);

/// The example's documents as JSON, the CSIDriverDeployment with the real
/// node's kubelet dir and `data_dir` as hostPath of `csi-data-dir`.
fn example_for(kubelet_dir: &Path, data_dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(testkit::example_path()).expect("example readable");
    let mut docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("example YAML"))
        .collect();
    let cr = docs
        .iter_mut()
        .find(|d| d["kind"] == "CSIDriverDeployment")
        .expect("a CSIDriverDeployment");
    assert_eq!(cr["spec"]["driver"]["image"], IMAGE);
    assert_eq!(cr["spec"]["topology"], "NodeLocal");
    cr["spec"]["node"]["kubeletDir"] = kubelet_dir.display().to_string().into();
    let volumes = cr["spec"]["node"]["volumes"]
        .as_array_mut()
        .expect("node volumes");
    let data = volumes
        .iter_mut()
        .find(|v| v["name"] == "csi-data-dir")
        .expect("csi-data-dir volume");
    assert_eq!(data["hostPath"]["path"], "/var/lib/csi-hostpath-data/");
    data["hostPath"]["path"] = data_dir.display().to_string().into();
    docs
}

/// What the phases work on: the cluster with its real node, an admin client,
/// the node's kubelet dir, hostpathplugin's data dir and the app image.
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    kubelet_dir: PathBuf,
    data_dir: PathBuf,
    app_image: String,
}

impl Bed {
    fn node(&self) -> &csiops_e2e::realnode::RealNode {
        self.cluster.real_node().expect("a real node")
    }

    /// An app of `name` on the real node, using a claim of the example's
    /// class as `usage` and writing `text`.
    fn app<'a>(&'a self, name: &'a str, usage: Use, text: &'a str) -> ClaimApp<'a> {
        ClaimApp {
            namespace: NS,
            name,
            class: CLASS,
            image: &self.app_image,
            text,
            usage,
            node: NODE_NAME,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs CSIOPS_HOSTPATHPLUGIN_IMAGE (upstream hostpathplugin, built as e2e/README.md says); not part of make test"]
async fn upstream_hostpathplugin_mounts_filesystem_and_block_node_locally() {
    let Some(archive) = std::env::var_os(IMAGE_ENV).map(PathBuf::from) else {
        panic!("{IMAGE_ENV} is not set: build upstream hostpathplugin v1.18.0 into an OCI archive as e2e/README.md (\"Upstream hostpathplugin\") says and point {IMAGE_ENV} at it");
    };
    assert!(
        archive.is_file(),
        "{IMAGE_ENV}={} is no file",
        archive.display()
    );
    let started = Instant::now();
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with a real node starts: {e}"));
    let node = cluster.real_node().expect("a real node");
    let kubelet_dir = node.layout().kubelet_dir();
    let data_dir = node.layout().root.join("csi-hostpath-data");
    let _mounts = LeftoverGuard::new(&data_dir);
    let loops = LoopGuard::default();
    let app_image = node
        .images()
        .reference(images::TEST_DRIVER)
        .expect("test driver image")
        .to_string();
    let client = cluster.client().expect("client");
    let bed = Bed {
        cluster,
        client,
        kubelet_dir,
        data_dir,
        app_image,
    };

    the_archive_carries_the_examples_image(&bed, &archive);
    let installed = the_example_runs_node_locally(&bed, started).await;
    the_node_publishes_its_capacity(&bed).await;
    let fs_vol = a_filesystem_claim_is_written_and_read_back(&bed, &loops).await;
    let block_vol = a_block_claim_is_written_and_read_back(&bed, &loops).await;
    the_apps_and_claims_go_leaving_no_mount_volume_or_loop(&bed, &fs_vol, &block_vol).await;
    the_driver_goes_leaving_nothing_in_its_data_dir(&bed).await;

    let total = started.elapsed();
    let left = bed.cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
    println!(
        "upstream hostpathplugin v1.18.0 node-locally: Running after {:.1}s, whole test {:.1}s",
        installed.as_secs_f64(),
        total.as_secs_f64()
    );
}

/// The archive imports into the node's containerd under the name the
/// example uses.
fn the_archive_carries_the_examples_image(bed: &Bed, archive: &Path) {
    let node = bed.node();
    node.ctr(&["images", "import", &archive.to_string_lossy()])
        .expect("ctr images import");
    let listed = node.ctr(&["images", "ls", "-q"]).expect("ctr images ls");
    assert!(
        listed.lines().any(|l| l == IMAGE),
        "the archive does not carry {IMAGE}: {listed}"
    );
}

/// The operator installs and the example, as it is but for the two host
/// paths, reaches Running node-locally (no controller); how long that took
/// from `started`.
async fn the_example_runs_node_locally(bed: &Bed, started: Instant) -> Duration {
    let Bed {
        cluster,
        kubelet_dir,
        data_dir,
        ..
    } = bed;
    walkthrough::install_operator(cluster)
        .await
        .unwrap_or_else(|e| panic!("operator installs: {e}\n{}", cluster.log_tails(30)));
    let docs = example_for(kubelet_dir, data_dir);
    let yaml: String = docs
        .iter()
        .map(|d| serde_yaml::to_string(d).expect("YAML"))
        .collect::<Vec<_>>()
        .join("---\n");
    testkit::apply_ok(cluster, "hostpath-example", &yaml).await;
    let row = testkit::wait_running(cluster, NS, NAME, "v1.18.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", describe(cluster, "-")));
    assert_eq!(row["CONTROLLER"], "-");
    let installed = started.elapsed();
    let wide = cluster
        .kubectl_ok(["get", "csidd", "-A", "-o", "wide"])
        .await
        .expect("wide");
    println!("{wide}");
    let driver_log = cluster
        .kubectl_ok([
            "-n",
            NS,
            "logs",
            "-l",
            &testkit::node_pod_selector(NAME),
            "-c",
            "csi-driver",
            "--tail=5",
        ])
        .await
        .unwrap_or_default();
    println!("hostpathplugin log tail:\n{driver_log}");
    installed
}

/// Its capacity, published by the node's provisioner.
async fn the_node_publishes_its_capacity(bed: &Bed) {
    let Bed {
        cluster, client, ..
    } = bed;
    let caps: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), NS);
    let cap = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let list = caps.list(&ListParams::default()).await.ok()?;
        let c = list.items.into_iter().next()?;
        let owner = c.owner_references().first()?.kind.clone();
        Some((owner, c.capacity, c.maximum_volume_size))
    })
    .await
    .unwrap_or_else(|_| panic!("no CSIStorageCapacity\n{}", describe(cluster, "-")));
    assert_eq!(cap.0, "Pod");
    println!(
        "CSIStorageCapacity: capacity {:?}, maximumVolumeSize {:?}",
        cap.1, cap.2
    );
}

/// A filesystem claim mounts; the pod reads back what it wrote, and so does
/// the host in hostpathplugin's data dir. Its volume ID.
async fn a_filesystem_claim_is_written_and_read_back(bed: &Bed, loops: &LoopGuard) -> String {
    let Bed {
        cluster, data_dir, ..
    } = bed;
    let fs = bed.app("fs", Use::Filesystem, "hello-from-hostpathplugin");
    let fs_vol = run_app(cluster, &fs).await;
    loops.track(&fs_vol);
    let shown = cluster
        .kubectl_ok([
            "-n",
            NS,
            "exec",
            "fs",
            "--",
            "/csi-test-driver",
            "cat",
            &format!("/data/{APP_FILE}"),
        ])
        .await
        .expect("kubectl exec");
    assert_eq!(shown, fs.text);
    // hostpathplugin keeps a filesystem volume at <statedir>/<volume id>.
    let on_host = data_dir.join(&fs_vol).join(APP_FILE);
    assert_eq!(
        std::fs::read_to_string(&on_host).expect("the file is in hostpath's data dir"),
        fs.text
    );
    println!("filesystem volume {fs_vol}: read back through the pod and on the host");
    fs_vol
}

/// A block claim reaches the pod as a block device backed by a loop device
/// over hostpathplugin's file; the pod writes and reads it back. Its
/// volume ID.
async fn a_block_claim_is_written_and_read_back(bed: &Bed, loops: &LoopGuard) -> String {
    let Bed {
        cluster,
        client,
        data_dir,
        ..
    } = bed;
    let node = bed.node();
    let block = bed.app("block", Use::Block, "raw-bytes-through-hostpathplugin");
    let block_vol = run_app(cluster, &block).await;
    loops.track(&block_vol);
    let log = cluster
        .kubectl_ok(["-n", NS, "logs", "block"])
        .await
        .expect("app log");
    assert!(log.contains("wrote and read back"), "{log}");
    let pod = Api::<Pod>::namespaced(client.clone(), NS)
        .get("block")
        .await
        .expect("block pod");
    let id = testkit::container_id(&pod, "app").expect("container ID");
    let info: serde_json::Value =
        serde_json::from_str(&node.ctr(&["containers", "info", &id]).expect("ctr info"))
            .expect("JSON");
    assert!(
        nl::has_block_device(&info, APP_DEVICE),
        "{APP_DEVICE} is not a block device: {}",
        info["Spec"]["linux"]["devices"]
    );
    // hostpathplugin's block volume is the file <statedir>/<id> behind a loop device.
    let backing = data_dir.join(&block_vol);
    let head = std::fs::read(&backing).expect("block file");
    assert!(head.starts_with(block.text.as_bytes()));
    let volume_loops = nl::loops_of(std::slice::from_ref(&block_vol));
    assert_eq!(
        volume_loops.len(),
        1,
        "the loop device of {block_vol}: {volume_loops:?}"
    );
    println!(
        "block volume {block_vol}: {} (backed by {} in the driver container), {} on the host; the pod wrote and read it back",
        volume_loops[0].0.display(),
        volume_loops[0].1.display(),
        backing.display()
    );
    block_vol
}

/// Deleting the apps and the claims leaves no CSI mount, no PV, no volume in
/// the data dir and no loop device.
async fn the_apps_and_claims_go_leaving_no_mount_volume_or_loop(
    bed: &Bed,
    fs_vol: &str,
    block_vol: &str,
) {
    let Bed {
        cluster,
        client,
        kubelet_dir,
        data_dir,
        ..
    } = bed;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for name in ["fs", "block"] {
        let _ = pods.delete(name, &DeleteParams::default()).await;
    }
    let gone = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let left = pods
            .list(&ListParams::default().labels("!app.kubernetes.io/managed-by"))
            .await
            .ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    assert!(
        gone.is_ok(),
        "app pods never went\n{}",
        describe(cluster, "fs")
    );
    let csi_mounts = nl::csi_mounts_under(kubelet_dir);
    assert!(csi_mounts.is_empty(), "CSI mounts left: {csi_mounts:?}");
    cluster
        .kubectl_ok(["-n", NS, "delete", "pvc", "--all", "--timeout=120s"])
        .await
        .expect("delete claims");
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let gone = wait_for(DEADLINE, Duration::from_secs(1), || async {
        pvs.list(&Default::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(gone.is_ok(), "PVs left\n{}", describe(cluster, "-"));
    // Only hostpathplugin's state file stays in its data dir.
    let entries: Vec<String> = std::fs::read_dir(data_dir)
        .expect("data dir")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n != "state.json")
        .collect();
    assert!(
        entries.is_empty(),
        "volumes left in the data dir: {entries:?}"
    );
    let mut left_loops = nl::loops_of(&[fs_vol.to_string(), block_vol.to_string()]);
    left_loops.extend(nl::loops_under(kubelet_dir));
    assert!(left_loops.is_empty(), "loop devices left: {left_loops:?}");
}

/// Deleting the object removes the driver pods and leaves nothing under the
/// data dir.
async fn the_driver_goes_leaving_nothing_in_its_data_dir(bed: &Bed) {
    let Bed {
        cluster,
        client,
        data_dir,
        ..
    } = bed;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    cluster
        .kubectl_ok(["-n", NS, "delete", "csidd", NAME, "--timeout=150s"])
        .await
        .expect("delete the driver");
    let gone = wait_for(DEADLINE, Duration::from_millis(500), || async {
        pods.list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(gone.is_ok(), "driver pods left\n{}", describe(cluster, "-"));
    let left = leftovers_under(data_dir);
    assert!(left.is_empty(), "left under the data dir: {left:?}");
}

/// Creates the app's claim and pod, waits until it runs; its volume ID.
async fn run_app(cluster: &Cluster, app: &ClaimApp<'_>) -> String {
    testkit::apply_ok(cluster, app.name, &app.yaml()).await;
    nl::wait_pod_running(cluster, NS, app.name, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", describe(cluster, app.name)));
    let client = cluster.client().expect("client");
    let pv = nl::pv_of(&client, NS, app.name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    nl::volume_handle(&pv).expect("CSI volume handle")
}

fn describe(cluster: &Cluster, pod: &str) -> String {
    [
        testkit::kubectl_text(cluster, &["-n", NS, "describe", "pod", pod]),
        testkit::kubectl_text(cluster, &["-n", NS, "get", "csidd,pvc,pods", "-o", "wide"]),
        testkit::kubectl_text(cluster, &["-n", NS, "get", "events"]),
        testkit::kubectl_text(
            cluster,
            &[
                "-n",
                NS,
                "logs",
                "-l",
                &testkit::node_pod_selector(NAME),
                "--all-containers",
                "--tail=30",
            ],
        ),
        testkit::operator_log(cluster),
    ]
    .join("\n")
}
