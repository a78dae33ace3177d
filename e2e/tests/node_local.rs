//! A node-local driver (`spec.topology: NodeLocal`) on the real node, every
//! step by real components: `manifests/install.yaml` runs the operator, the
//! node pod runs `csi-test-driver --node-local` (one process is controller
//! and node service of the node, as upstream hostpathplugin), our
//! provisioner with `--node-deployment`, the registrar and the liveness
//! probe; kubelet stages and publishes through the driver.
//!
//! - Deployed node-locally: a filesystem claim and a block claim are
//!   provisioned on the node and mount; the pods write and read back their
//!   data (the bytes land in the node's data dir; the block pod sees a
//!   block device); the node publishes its capacity, owned by its pod; the
//!   claims' deletion and the object's leave no volume, PV, mount or loop
//!   device.
//! - Deployed centrally (a controller pod and node pods): a filesystem
//!   claim's pod never mounts, with kubelet's `NotFound … does not exist in
//!   the volumes list`, and a block claim is never provisioned (`losetup`
//!   fails in the controller, which has no `/dev`) — the failure of
//!   tracker issue 24. Switching the object to NodeLocal stops and removes
//!   the controller, rolls the node pod, and the pending block claim and a
//!   new claim then mount.
//!
//! Needs root and `make node-prereqs`, like `real_node.rs`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use csiops_e2e::node_local::{
    self as nl, ClaimApp, LoopGuard, TestDriverNodeLocal, APP_DEVICE, APP_FILE,
};
use csiops_e2e::realnode::{images, NODE_NAME};
use csiops_e2e::testdriver::leftovers::{leftovers_under, LeftoverGuard};
use csiops_e2e::testdriver::load_state;
use csiops_e2e::timeline::Timeline;
use csiops_e2e::walkthrough::{self, Use};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, DeleteParams, ListParams};
use kube::ResourceExt;

const DEADLINE: Duration = Duration::from_secs(180);
const NS: &str = "csi-nodelocal";
const NAME: &str = "nodelocal";
const DRIVER: &str = "nodelocal.csiops.dev";
const CLASS: &str = "nodelocal";

/// The cluster with a real node, the operator from install.yaml, and what
/// a test needs of the node.
struct Bed {
    cluster: Cluster,
    image: String,
    kubelet_dir: PathBuf,
    data_dir: PathBuf,
}

impl Bed {
    fn driver(
        &self,
        topology: &'static str,
        capacity: Option<&'static str>,
    ) -> TestDriverNodeLocal<'_> {
        TestDriverNodeLocal {
            namespace: NS,
            name: NAME,
            driver: DRIVER,
            image: &self.image,
            version: "v0.1.0",
            topology,
            kubelet_dir: &self.kubelet_dir,
            data_dir: &self.data_dir,
            capacity,
            class: CLASS,
        }
    }

    fn app<'a>(&'a self, name: &'a str, usage: Use, text: &'a str) -> ClaimApp<'a> {
        ClaimApp {
            namespace: NS,
            name,
            class: CLASS,
            image: &self.image,
            text,
            usage,
            node: NODE_NAME,
        }
    }
}

async fn bed() -> Bed {
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with a real node starts: {e}"));
    let node = cluster.real_node().expect("a real node");
    let bed = Bed {
        image: node
            .images()
            .reference(images::TEST_DRIVER)
            .expect("driver image")
            .to_string(),
        kubelet_dir: node.layout().kubelet_dir(),
        data_dir: node.layout().root.join("csi-nodelocal"),
        cluster,
    };
    walkthrough::install_operator(&bed.cluster)
        .await
        .unwrap_or_else(|e| panic!("operator installs: {e}\n{}", bed.cluster.log_tails(30)));
    bed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_local_driver_mounts_filesystem_and_block_volumes() {
    let started = Instant::now();
    let bed = bed().await;
    // Loop devices outlive a failed test; these release ours however it ends.
    let _mounts = LeftoverGuard::new(&bed.data_dir);
    let loops = LoopGuard::default();
    let cluster = &bed.cluster;
    let client = cluster.client().expect("client");
    let driver = bed.driver("NodeLocal", Some("1Gi"));
    testkit::apply_ok(cluster, "driver", &driver.yaml()).await;
    let row = testkit::wait_running(cluster, NS, NAME, "v0.1.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", testkit::operator_log(cluster)));
    assert_eq!(row["CONTROLLER"], "-", "{row:?}");
    assert_eq!(row["REGISTERED"], "1/1");
    let installed = started.elapsed();

    // One pod on the node runs it all; there is no controller.
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    assert!(sts
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty());
    let node_pod = node_pod(&client).await;
    let names: Vec<&str> = node_pod
        .spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        names,
        [
            "csi-driver",
            "csi-provisioner",
            "node-driver-registrar",
            "liveness-probe"
        ]
    );
    // Its capacity, published by its provisioner and owned by its pod.
    let caps: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), NS);
    let owner = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let list = caps.list(&ListParams::default()).await.ok()?;
        let c = list.items.first()?;
        let r = c.owner_references().first()?;
        Some((r.kind.clone(), r.name.clone(), c.capacity.clone()))
    })
    .await
    .unwrap_or_else(|_| panic!("no CSIStorageCapacity\n{}", logs(cluster)));
    assert_eq!(
        (owner.0.as_str(), owner.1.as_str()),
        ("Pod", node_pod.name_any().as_str())
    );
    println!("capacity of {NODE_NAME}: {:?}", owner.2);

    // --- a filesystem volume --------------------------------------------------
    let fs = bed.app("fs", Use::Filesystem, "hello-node-local");
    let fs_vol = run_app(cluster, &fs).await;
    loops.track(&fs_vol);
    let pv = pv_of(&client, "fs").await;
    let affinity = serde_json::to_string(&pv.spec.as_ref().and_then(|s| s.node_affinity.clone()))
        .expect("json");
    assert!(affinity.contains(NODE_NAME), "PV node affinity {affinity}");
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
    let on_host = driver.volumes_dir().join(&fs_vol).join(APP_FILE);
    assert_eq!(
        std::fs::read_to_string(&on_host).expect("the file is on the host"),
        fs.text
    );

    // --- a block volume: its loop device was made by CreateVolume -------------
    let block = bed.app("block", Use::Block, "raw-node-local-bytes");
    let block_vol = run_app(cluster, &block).await;
    loops.track(&block_vol);
    let img = driver.volumes_dir().join(format!("{block_vol}.img"));
    let head = std::fs::read(&img).expect("block image");
    assert!(
        head.starts_with(block.text.as_bytes()),
        "the image does not start with what the pod wrote"
    );
    let log = cluster
        .kubectl_ok(["-n", NS, "logs", "block"])
        .await
        .expect("app log");
    assert!(log.contains("wrote and read back"), "{log}");
    let loops = nl::loops_of(std::slice::from_ref(&block_vol));
    assert_eq!(loops.len(), 1, "the loop device of {block_vol}: {loops:?}");
    println!("block volume {block_vol}: {:?}", loops[0]);
    // The pod's container gets a block device at APP_DEVICE.
    let pod = Api::<Pod>::namespaced(client.clone(), NS)
        .get("block")
        .await
        .expect("block pod");
    let id = testkit::container_id(&pod, "app").expect("container ID");
    let info: serde_json::Value = serde_json::from_str(
        &cluster
            .real_node()
            .expect("node")
            .ctr(&["containers", "info", &id])
            .expect("ctr containers info"),
    )
    .expect("JSON");
    assert!(
        nl::has_block_device(&info, APP_DEVICE),
        "{APP_DEVICE} is not a block device of the container: {}",
        info["Spec"]["linux"]["devices"]
    );

    // The driver's state knows both, on this node.
    let state = load_state(&driver.state_dir()).expect("driver state");
    assert_eq!(state.volumes.len(), 2, "{:?}", state.volumes.keys());

    // --- the way back -----------------------------------------------------------
    give_back(cluster, &driver, &["fs", "block"], &[fs_vol, block_vol]).await;
    let total = the_driver_goes_and_the_cluster_stops_clean(bed, started).await;
    println!(
        "node-local on the real node: Running after {:.1}s, whole test {:.1}s",
        installed.as_secs_f64(),
        total.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployed_centrally_it_fails_to_mount_until_it_becomes_node_local() {
    let started = Instant::now();
    let bed = bed().await;
    let _mounts = LeftoverGuard::new(&bed.data_dir);
    let loops = LoopGuard::default();
    let cluster = &bed.cluster;
    let client = cluster.client().expect("client");
    deployed_centrally_it_runs_with_a_controller(&bed).await;
    a_filesystem_claims_pod_never_mounts(&bed).await;
    let block = bed.app("block", Use::Block, "after-the-switch");
    a_block_claim_is_never_provisioned(&bed, &block).await;
    the_switch_stops_the_controller_rolls_the_nodes_then_removes_it(&bed, &client).await;
    what_only_the_controller_used_is_gone(&client).await;
    let node_local = bed.driver("NodeLocal", None);
    let volumes =
        the_pending_block_claim_and_a_new_claim_mount(&bed, &client, &node_local, &loops, &block)
            .await;
    give_back(cluster, &node_local, &["stuck", "block", "fs"], &volumes).await;
    let total = the_driver_goes_and_the_cluster_stops_clean(bed, started).await;
    println!("central failure and switch: {:.1}s", total.as_secs_f64());
}

/// The object deleted, nothing is left under the data dir, and the cluster
/// stops leaving nothing behind. The time since `started` (before the stop).
async fn the_driver_goes_and_the_cluster_stops_clean(bed: Bed, started: Instant) -> Duration {
    let cluster = &bed.cluster;
    delete_driver(cluster).await;
    let left = leftovers_under(&bed.data_dir);
    assert!(left.is_empty(), "left under the data dir: {left:?}");
    let total = started.elapsed();
    let Bed { cluster, .. } = bed;
    let left = cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
    total
}

/// Deployed centrally: a controller pod and node pods, Running.
async fn deployed_centrally_it_runs_with_a_controller(bed: &Bed) {
    let cluster = &bed.cluster;
    let central = bed.driver("Central", None);
    testkit::apply_ok(cluster, "driver", &central.yaml()).await;
    let row = testkit::wait_running(cluster, NS, NAME, "v0.1.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", testkit::operator_log(cluster)));
    assert_eq!(row["CONTROLLER"], "1/1");
}

/// A filesystem claim gets a PV (the controller's driver made the volume),
/// and its pod never mounts: the node's driver never saw it.
async fn a_filesystem_claims_pod_never_mounts(bed: &Bed) {
    let cluster = &bed.cluster;
    let fs = bed.app("stuck", Use::Filesystem, "never-written");
    testkit::apply_ok(cluster, "stuck", &fs.yaml()).await;
    let event = wait_for(DEADLINE, Duration::from_secs(1), || async {
        testkit::event_lines(cluster, NS, "stuck")
            .await
            .into_iter()
            .find(|l| {
                l.starts_with("FailedMount|") && l.contains("does not exist in the volumes list")
            })
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "no FailedMount NotFound event\n{}",
            describe(cluster, "stuck")
        )
    });
    assert!(event.contains("NotFound"), "{event}");
    println!("central: {event}");
}

/// A block claim is never provisioned: the controller has no /dev.
async fn a_block_claim_is_never_provisioned(bed: &Bed, block: &ClaimApp<'_>) {
    let cluster = &bed.cluster;
    testkit::apply_ok(cluster, "block", &block.yaml()).await;
    let refused = wait_for(DEADLINE, Duration::from_secs(1), || async {
        testkit::event_lines(cluster, NS, "block")
            .await
            .into_iter()
            .find(|l| l.starts_with("ProvisioningFailed|") && l.contains("losetup"))
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "no ProvisioningFailed losetup event\n{}",
            describe(cluster, "block")
        )
    });
    println!("central: {refused}");
}

/// The switch to NodeLocal: the controller stopped, the nodes rolled, then
/// the controller removed.
async fn the_switch_stops_the_controller_rolls_the_nodes_then_removes_it(
    bed: &Bed,
    client: &kube::Client,
) {
    let cluster = &bed.cluster;
    let timeline = Timeline::start(client, NS);
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "patch",
            "csidd",
            NAME,
            "--type=merge",
            "-p",
            r#"{"spec":{"topology":"NodeLocal","controller":null}}"#,
        ])
        .await
        .expect("switch to NodeLocal");
    let row = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let row = testkit::csidd_row(cluster, NS, NAME).await.ok()?;
        (row["PHASE"] == "Running" && row["CONTROLLER"] == "-" && row["REGISTERED"] == "1/1")
            .then_some(row)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "never Running node-locally\n{}",
            testkit::operator_log(cluster)
        )
    });
    println!("switched: {row:?}");
    let entries = timeline.entries();
    let dump = Timeline::render(&entries);
    let sts = |e: &csiops_e2e::timeline::Entry| e.kind == "StatefulSet";
    let ds = |e: &csiops_e2e::timeline::Entry| e.kind == "DaemonSet";
    let down = Timeline::first(&entries, |e| sts(e) && e.desired == 0)
        .unwrap_or_else(|| panic!("controller never scaled down:\n{dump}"));
    let rolled = Timeline::first(&entries, |e| ds(e) && e.generation > 1)
        .unwrap_or_else(|| panic!("DaemonSet never rolled:\n{dump}"));
    let removed = Timeline::first(&entries, |e| sts(e) && e.deleted)
        .unwrap_or_else(|| panic!("controller never removed:\n{dump}"));
    assert!(
        down < rolled && rolled < removed,
        "the controller stops, the nodes roll, then the controller goes:\n{dump}"
    );
    drop(timeline);
}

/// What only the controller used is gone too; the journal's binding now
/// names the node ServiceAccount.
async fn what_only_the_controller_used_is_gone(client: &kube::Client) {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), NS);
    assert!(sas
        .get_opt(&format!("{NAME}-controller"))
        .await
        .expect("get")
        .is_none());
    assert!(bindings
        .get_opt(&format!("{NAME}-leases"))
        .await
        .expect("get")
        .is_none());
    // The journal's binding now names the node ServiceAccount.
    let journal = bindings
        .get(&format!("{NAME}-journal"))
        .await
        .expect("journal RoleBinding");
    let subjects: Vec<_> = journal
        .subjects
        .iter()
        .flatten()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(subjects, [format!("{NAME}-node")]);
}

/// The pending block claim is now the node's to provision, and mounts; a
/// new filesystem claim mounts too. Their volumes.
async fn the_pending_block_claim_and_a_new_claim_mount(
    bed: &Bed,
    client: &kube::Client,
    node_local: &TestDriverNodeLocal<'_>,
    loops: &LoopGuard,
    block: &ClaimApp<'_>,
) -> [String; 2] {
    let cluster = &bed.cluster;
    wait_pod_running(cluster, "block").await;
    let block_vol = nl::volume_handle(&pv_of(client, "block").await).expect("CSI PV");
    loops.track(&block_vol);
    let img = node_local.volumes_dir().join(format!("{block_vol}.img"));
    // Running is not yet written: the app writes once it has started.
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async {
            let head = std::fs::read(&img).ok()?;
            head.starts_with(block.text.as_bytes()).then_some(())
        },
    )
    .await
    .unwrap_or_else(|_| panic!("{} never started with what the pod wrote", img.display()));
    // A new filesystem claim mounts; the stuck one stays stuck (its volume
    // lived in the controller) and is given back.
    let fs2 = bed.app("fs", Use::Filesystem, "node-local-now");
    let fs2_vol = run_app(cluster, &fs2).await;
    [block_vol, fs2_vol]
}

async fn node_pod(client: &kube::Client) -> Pod {
    let list = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&testkit::node_pod_selector(NAME)))
        .await
        .expect("node pods");
    assert_eq!(list.items.len(), 1, "node pods");
    list.items.into_iter().next().expect("one node pod")
}

async fn wait_pod_running(cluster: &Cluster, name: &str) -> Pod {
    nl::wait_pod_running(cluster, NS, name, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", describe(cluster, name)))
}

/// Creates the app's claim and pod, waits until it runs; its volume ID.
async fn run_app(cluster: &Cluster, app: &ClaimApp<'_>) -> String {
    testkit::apply_ok(cluster, app.name, &app.yaml()).await;
    wait_pod_running(cluster, app.name).await;
    let client = cluster.client().expect("client");
    nl::volume_handle(&pv_of(&client, app.name).await).expect("CSI volume handle")
}

async fn pv_of(client: &kube::Client, claim: &str) -> PersistentVolume {
    nl::pv_of(client, NS, claim)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Deletes the pods, then all claims; no PV, volume, data, CSI mount or
/// loop device may be left.
async fn give_back(
    cluster: &Cluster,
    driver: &TestDriverNodeLocal<'_>,
    pods: &[&str],
    volumes: &[String],
) {
    let client = cluster.client().expect("client");
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    for name in pods {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    for name in pods {
        let gone = wait_for(DEADLINE, Duration::from_millis(500), || async {
            matches!(api.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
        assert!(
            gone.is_ok(),
            "pod {name} never went\n{}",
            describe(cluster, name)
        );
    }
    let csi_mounts = nl::csi_mounts_under(driver.kubelet_dir);
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
    assert!(
        gone.is_ok(),
        "PVs left\n{}",
        testkit::kubectl_text(cluster, &["get", "pv", "-o", "wide"])
    );
    let state = load_state(&driver.state_dir()).expect("driver state");
    assert!(
        state.volumes.is_empty(),
        "volumes left: {:?}",
        state.volumes
    );
    let files: Vec<_> = std::fs::read_dir(driver.volumes_dir())
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.file_name())).collect())
        .unwrap_or_default();
    assert!(files.is_empty(), "volume data left: {files:?}");
    let mut loops = nl::loops_of(volumes);
    loops.extend(nl::loops_under(driver.kubelet_dir));
    assert!(loops.is_empty(), "loop devices left: {loops:?}");
}

/// Deletes the CSIDriverDeployment and waits until it and its pods are gone.
async fn delete_driver(cluster: &Cluster) {
    cluster
        .kubectl_ok(["-n", NS, "delete", "csidd", NAME, "--timeout=150s"])
        .await
        .expect("delete the driver");
    let client = cluster.client().expect("client");
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let gone = wait_for(DEADLINE, Duration::from_millis(500), || async {
        pods.list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(
        gone.is_ok(),
        "pods left\n{}",
        testkit::kubectl_text(cluster, &["-n", NS, "get", "pods"])
    );
}

fn logs(cluster: &Cluster) -> String {
    [
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

/// What a failing step prints: the pod, the claims, the events and logs.
fn describe(cluster: &Cluster, pod: &str) -> String {
    [
        testkit::kubectl_text(cluster, &["-n", NS, "describe", "pod", pod]),
        testkit::kubectl_text(cluster, &["-n", NS, "get", "pvc,pods", "-o", "wide"]),
        testkit::kubectl_text(cluster, &["-n", NS, "get", "events"]),
        logs(cluster),
    ]
    .join("\n")
}
