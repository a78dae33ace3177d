//! The Kubernetes CSI design's example walkthrough, every step done by real
//! components on the real node: our sidecars in their containers,
//! kube-controller-manager's attach/detach controller, kubelet, containerd.
//!
//! One cluster, in order: the happy path (provision with the node's
//! topology, attach, stage, publish, a pod writes and reads a file that
//! lands in the driver's data dir on the host); the variants (fsGroup, a
//! raw block volume, ReadWriteOncePod); an upgrade of the driver while a pod
//! writes a counter every 100 ms to its mounted volume; and the way back
//! (unpublish, unstage, detach, DeleteVolume), leaving no volume, PV,
//! VolumeAttachment or mount.
//!
//! Needs root and `make node-prereqs`, like `real_node.rs`.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use csiops_e2e::realnode::{images, NODE_NAME};
use csiops_e2e::testdriver::{load_state, mounts};
use csiops_e2e::walkthrough::{
    self, longest_gap, now_ms, App, Use, VolumeDriver, APP_FILE, DRIVER, NAME, NS,
};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams};
use kube::ResourceExt;

const DEADLINE: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_writes_to_a_volume_csiops_provisioned_attached_and_mounted() {
    let (cluster, bed) = deploy(&[], &[]).await;
    let client = cluster.client().expect("client");
    let driver = bed.driver();

    // --- 1. the happy path ------------------------------------------------------
    let app = App {
        name: "app",
        image: &bed.image,
        text: "hello-from-csiops",
        access_mode: "ReadWriteOnce",
        usage: Use::Filesystem,
        fs_group: None,
    };
    let vol =
        the_happy_path_provisions_attaches_stages_and_publishes(&cluster, &client, &bed, app).await;
    fs_group_gives_the_volume_to_the_pods_group(&cluster, &bed, app).await;
    a_raw_block_volume_holds_what_the_pod_wrote(&cluster, &bed, app).await;
    read_write_once_pod_refuses_a_second_pod(&cluster, &client, app).await;
    an_upgrade_keeps_a_mounted_volume_writing(&cluster, &client, &bed, app, &vol).await;

    // --- the way back: unpublish, unstage, detach, delete ---------------------------
    give_back(
        &cluster,
        &driver,
        &["app", "fsgroup", "block", "rwop", "after-upgrade"],
    )
    .await;

    let left = cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// Provisioned with the selected node's topology, attached by our attacher,
/// staged and published for real; the pod reads back what it wrote, and
/// the bytes are in the driver's data dir. The volume's ID.
async fn the_happy_path_provisions_attaches_stages_and_publishes(
    cluster: &Cluster,
    client: &kube::Client,
    bed: &Bed,
    app: App<'_>,
) -> String {
    let kubelet_dir = &bed.kubelet_dir;
    let driver = bed.driver();
    let vol = run_app(cluster, &app).await;
    // Provisioned with the selected node's topology.
    let pv = pv_of(client, "app").await;
    let csi = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.clone())
        .expect("CSI PV");
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(csi.volume_handle, vol);
    let affinity = serde_json::to_string(&pv.spec.as_ref().and_then(|s| s.node_affinity.clone()))
        .expect("json");
    assert!(affinity.contains(NODE_NAME), "PV node affinity {affinity}");
    // kube-controller-manager asked for the attachment; our attacher made it.
    let va = attachment_of(client, &pv.name_any())
        .await
        .expect("a VolumeAttachment for the PV");
    assert_eq!(va.spec.attacher, DRIVER);
    assert_eq!(va.spec.node_name, NODE_NAME);
    assert_eq!(va.status.as_ref().map(|s| s.attached), Some(true));
    // The pod read back what it wrote; the bytes are in the driver's data dir.
    let shown = cluster
        .kubectl_ok([
            "-n",
            NS,
            "exec",
            "app",
            "--",
            "/csi-test-driver",
            "cat",
            &format!("/data/{APP_FILE}"),
        ])
        .await
        .expect("kubectl exec");
    assert_eq!(shown, app.text);
    let on_host = driver.volumes_dir().join(&vol).join(APP_FILE);
    assert_eq!(
        std::fs::read_to_string(&on_host).expect("the file is on the host"),
        app.text
    );
    // Staged and published for real: both paths are mount points on the host.
    let state = load_state(&driver.state_dir()).expect("driver state");
    let v = &state.volumes[&vol];
    assert!(v.published_nodes.contains_key(NODE_NAME), "{v:?}");
    let targets: Vec<&String> = v.node_publications.keys().collect();
    assert_eq!(targets.len(), 1, "{v:?}");
    let host_mounts = host_mount_points();
    assert!(
        host_mounts.contains(&PathBuf::from(targets[0])),
        "the publish target {} is not a mount point on the host",
        targets[0]
    );
    assert!(
        host_mounts
            .iter()
            .any(|m| m.starts_with(kubelet_dir) && m.ends_with("globalmount")),
        "no staging mount under {}",
        kubelet_dir.display()
    );
    vol
}

/// fsGroup: kubelet gives the volume to the pod's group (policy File).
async fn fs_group_gives_the_volume_to_the_pods_group(cluster: &Cluster, bed: &Bed, app: App<'_>) {
    let driver = bed.driver();
    let fs = App {
        name: "fsgroup",
        fs_group: Some(2345),
        text: "group-owned",
        ..app
    };
    let fs_vol = run_app(cluster, &fs).await;
    let meta = std::fs::metadata(driver.volumes_dir().join(&fs_vol)).expect("volume dir");
    assert_eq!(meta.gid(), 2345, "fsGroup not applied to the volume");
    let file_meta =
        std::fs::metadata(driver.volumes_dir().join(&fs_vol).join(APP_FILE)).expect("fsgroup file");
    assert_eq!(file_meta.gid(), 2345, "new files do not inherit the group");
}

/// A raw block volume: the pod writes the device, the image file has it.
async fn a_raw_block_volume_holds_what_the_pod_wrote(cluster: &Cluster, bed: &Bed, app: App<'_>) {
    let driver = bed.driver();
    let block = App {
        name: "block",
        usage: Use::Block,
        text: "raw-block-bytes",
        ..app
    };
    let block_vol = run_app(cluster, &block).await;
    let img = driver.volumes_dir().join(format!("{block_vol}.img"));
    let head = std::fs::read(&img).expect("block image");
    assert!(
        head.starts_with(block.text.as_bytes()),
        "the image does not start with what the pod wrote: {:?}",
        String::from_utf8_lossy(&head[..block.text.len().min(head.len())])
    );
}

/// ReadWriteOncePod: a second pod of the same claim is not scheduled.
async fn read_write_once_pod_refuses_a_second_pod(
    cluster: &Cluster,
    client: &kube::Client,
    app: App<'_>,
) {
    let rwop = App {
        name: "rwop",
        access_mode: "ReadWriteOncePod",
        text: "only-me",
        ..app
    };
    run_app(cluster, &rwop).await;
    testkit::apply_ok(cluster, "rwop-2", &rwop.pod_yaml("rwop-2")).await;
    let refused = wait_for(Duration::from_secs(60), Duration::from_secs(1), || async {
        let p = Api::<Pod>::namespaced(client.clone(), NS)
            .get_opt("rwop-2")
            .await
            .ok()??;
        let cond = p
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
        cond.message.filter(|m| m.contains("ReadWriteOncePod"))
    })
    .await
    .unwrap_or_else(|_| panic!("the second pod of a ReadWriteOncePod claim was not refused"));
    println!("second ReadWriteOncePod pod: {refused}");
    delete_pod(cluster, "rwop-2").await;
}

/// An upgrade of the driver while the app writes a counter every 100 ms to
/// its mounted volume `vol`: the node pod is replaced, the counter never
/// stops for more than two seconds, and a new volume mounts afterwards.
async fn an_upgrade_keeps_a_mounted_volume_writing(
    cluster: &Cluster,
    client: &kube::Client,
    bed: &Bed,
    app: App<'_>,
    vol: &str,
) {
    let node = cluster.real_node().expect("a real node");
    let image = &bed.image;
    let driver = bed.driver();
    let next_image = format!("{image}-next");
    node.ctr(&["images", "tag", image, &next_image])
        .expect("ctr images tag");
    let node_pod_before = node_pod_uid(client).await;
    let upgrade_started = now_ms();
    let patch = format!(r#"{{"spec":{{"version":"v0.1.1","driver":{{"image":"{next_image}"}}}}}}"#);
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "patch",
            "csidd",
            NAME,
            "--type=merge",
            "-p",
            &patch,
        ])
        .await
        .expect("patch");
    testkit::wait_running(cluster, NS, NAME, "v0.1.1", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", testkit::operator_log(cluster)));
    let upgrade_done = now_ms();
    assert_ne!(
        node_pod_uid(client).await,
        node_pod_before,
        "the node pod was not replaced"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let counter = std::fs::read_to_string(driver.volumes_dir().join(vol).join("counter"))
        .expect("counter file");
    let gap = longest_gap(&counter, upgrade_started, upgrade_done)
        .unwrap_or_else(|e| panic!("{e}\n{counter}"));
    println!(
        "upgrade took {} ms; longest gap in the counter {gap} ms",
        upgrade_done - upgrade_started
    );
    assert!(
        gap <= 2000,
        "the counter stopped for {gap} ms during the upgrade"
    );
    let after = App {
        name: "after-upgrade",
        text: "new-volume-after-upgrade",
        ..app
    };
    run_app(cluster, &after).await;
}

/// Faults on the real node: the controller pod killed while CreateVolume's
/// answer is on its way, the node's driver container killed while
/// NodePublishVolume's answer is on its way (the work is done and persisted
/// both times: `--delay-after`), and kubelet restarted under a running pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_driver_pods_and_a_kubelet_restart_lose_and_double_nothing() {
    let (mut cluster, bed) = deploy(
        &["--delay-after=CreateVolume=5s"],
        &["--delay-after=NodePublishVolume=5s"],
    )
    .await;
    let client = cluster.client().expect("client");
    let driver = bed.driver();

    let app = App {
        name: "survivor",
        image: &bed.image,
        text: "still-here",
        access_mode: "ReadWriteOnce",
        usage: Use::Filesystem,
        fs_group: None,
    };
    testkit::apply_ok(&cluster, app.name, &app.yaml()).await;

    the_controller_pod_killed_during_create_volume(&cluster, &bed, &app).await;
    let mounted =
        the_node_driver_killed_during_node_publish_volume(&cluster, &client, &bed, &app).await;
    let vol =
        the_pod_runs_with_one_volume_mounted_once(&cluster, &client, &bed, &app, &mounted).await;
    a_kubelet_restart_registers_again_and_keeps_the_mount(&mut cluster, &bed, &app, &vol).await;

    give_back(&cluster, &driver, &[app.name]).await;
    let left = cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The controller pod dies once the volume exists but before the
/// provisioner hears so.
async fn the_controller_pod_killed_during_create_volume(
    cluster: &Cluster,
    bed: &Bed,
    app: &App<'_>,
) {
    let driver = bed.driver();
    let created = wait_for(DEADLINE, Duration::from_millis(200), || async {
        let s = load_state(&driver.state_dir()).ok()?;
        (!s.volumes.is_empty()).then_some(())
    })
    .await;
    assert!(
        created.is_ok(),
        "CreateVolume never ran\n{}",
        describe(cluster, app.name)
    );
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "delete",
            "pod",
            &format!("{NAME}-controller-0"),
            "--grace-period=0",
            "--force",
        ])
        .await
        .expect("controller pod deleted");
}

/// The node's driver dies once the target is mounted but before kubelet
/// hears so. The publish target.
async fn the_node_driver_killed_during_node_publish_volume(
    cluster: &Cluster,
    client: &kube::Client,
    bed: &Bed,
    app: &App<'_>,
) -> PathBuf {
    let kubelet_dir = &bed.kubelet_dir;
    let mounted = wait_for(DEADLINE, Duration::from_millis(200), || async {
        publish_targets(kubelet_dir).into_iter().next()
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "NodePublishVolume never mounted\n{}",
            describe(cluster, app.name)
        )
    });
    let node_pod = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&kube::api::ListParams::default().labels(&testkit::node_pod_selector(NAME)))
        .await
        .expect("node pods")
        .items
        .into_iter()
        .next()
        .expect("a node pod");
    let driver_container =
        testkit::container_id(&node_pod, "csi-driver").expect("driver container ID");
    cluster
        .real_node()
        .expect("a real node")
        .ctr(&["tasks", "kill", "--signal", "SIGKILL", &driver_container])
        .expect("ctr tasks kill");
    mounted
}

/// The pod runs: the driver's volumes are exactly the PV's, the target
/// `mounted` is mounted once, and there is one staging mount. The volume's
/// ID.
async fn the_pod_runs_with_one_volume_mounted_once(
    cluster: &Cluster,
    client: &kube::Client,
    bed: &Bed,
    app: &App<'_>,
    mounted: &PathBuf,
) -> String {
    let kubelet_dir = &bed.kubelet_dir;
    let driver = bed.driver();
    walkthrough::wait_pod_running(cluster, app.name, Duration::from_secs(300))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", describe(cluster, app.name)));
    let state = load_state(&driver.state_dir()).expect("driver state");
    let pv = pv_of(client, app.name).await;
    let handle = pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle);
    let ids: Vec<&String> = state.volumes.keys().collect();
    assert_eq!(
        ids,
        handle.iter().collect::<Vec<_>>(),
        "the driver's volumes and the PV disagree: a leak or a duplicate"
    );
    let mounts = host_mount_points();
    let times = |p: &PathBuf| mounts.iter().filter(|m| *m == p).count();
    assert_eq!(
        times(mounted),
        1,
        "{} mounted {} times",
        mounted.display(),
        times(mounted)
    );
    let staged: Vec<&PathBuf> = mounts
        .iter()
        .filter(|m| m.starts_with(kubelet_dir) && m.ends_with("globalmount"))
        .collect();
    assert_eq!(staged.len(), 1, "staging mounts: {staged:?}");
    ids.first().map(|s| s.to_string()).unwrap_or_default()
}

/// kubelet restarts: our registrar is registered again, the mount stays and
/// the volume `vol` does not stall.
async fn a_kubelet_restart_registers_again_and_keeps_the_mount(
    cluster: &mut Cluster,
    bed: &Bed,
    app: &App<'_>,
    vol: &str,
) {
    let driver = bed.driver();
    let registered = format!("Register new plugin with name: {DRIVER}");
    let kubelet_log_path = cluster.log_dir().join("kubelet.log");
    let kubelet_log = || std::fs::read_to_string(&kubelet_log_path).unwrap_or_default();
    let before = kubelet_log().matches(&registered).count();
    let restart_at = now_ms();
    let restarted = Instant::now();
    cluster
        .real_node_mut()
        .expect("a real node")
        .restart_kubelet()
        .expect("kubelet restarts");
    let again = wait_for(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { (kubelet_log().matches(&registered).count() > before).then_some(()) },
    )
    .await;
    assert!(
        again.is_ok(),
        "the registrar was not registered again within 10 s of kubelet's restart"
    );
    println!(
        "registered again {} ms after kubelet's restart",
        restarted.elapsed().as_millis()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let shown = cluster
        .kubectl_ok([
            "-n",
            NS,
            "exec",
            app.name,
            "--",
            "/csi-test-driver",
            "cat",
            &format!("/data/{APP_FILE}"),
        ])
        .await
        .expect("kubectl exec after kubelet's restart");
    assert_eq!(shown, app.text);
    let counter = std::fs::read_to_string(driver.volumes_dir().join(vol).join("counter"))
        .expect("counter file");
    let gap = longest_gap(&counter, restart_at, now_ms() - 500)
        .unwrap_or_else(|e| panic!("{e}\n{counter}"));
    assert!(
        gap <= 2000,
        "the volume stalled for {gap} ms across kubelet's restart"
    );
}

/// What [`deploy`] set up: the driver's image and host paths.
struct Bed {
    image: String,
    kubelet_dir: PathBuf,
    data_dir: PathBuf,
    controller_args: &'static [&'static str],
    node_args: &'static [&'static str],
}

impl Bed {
    fn driver(&self) -> VolumeDriver<'_> {
        VolumeDriver {
            image: &self.image,
            version: "v0.1.0",
            kubelet_dir: &self.kubelet_dir,
            data_dir: &self.data_dir,
            on_simulated_nodes: false,
            controller_args: self.controller_args,
            node_args: self.node_args,
            node_fields: &[],
        }
    }
}

/// A cluster with a real node, the operator from install.yaml, and
/// csi-test-driver with real volumes Running (driver flags added in the
/// controller and node pods).
async fn deploy(
    controller_args: &'static [&'static str],
    node_args: &'static [&'static str],
) -> (Cluster, Bed) {
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
        data_dir: node.layout().root.join("csi-data"),
        controller_args,
        node_args,
    };
    walkthrough::install_operator(&cluster)
        .await
        .unwrap_or_else(|e| panic!("operator installs: {e}\n{}", cluster.log_tails(30)));
    testkit::apply_ok(&cluster, "driver", &bed.driver().yaml()).await;
    testkit::wait_running(&cluster, NS, NAME, "v0.1.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", testkit::operator_log(&cluster)));
    (cluster, bed)
}

/// Publish targets of CSI volumes mounted on the host under `kubelet_dir`.
fn publish_targets(kubelet_dir: &std::path::Path) -> Vec<PathBuf> {
    host_mount_points()
        .into_iter()
        .filter(|m| {
            m.starts_with(kubelet_dir)
                && m.to_string_lossy().contains("/volumes/kubernetes.io~csi/")
                && m.ends_with("mount")
        })
        .collect()
}

/// Deletes the pods, then their claims, and checks that unpublish, unstage,
/// detach and DeleteVolume left no volume, PV, VolumeAttachment or mount.
async fn give_back(cluster: &Cluster, driver: &VolumeDriver<'_>, pods: &[&str]) {
    let client = cluster.client().expect("client");
    let kubelet_dir = driver.kubelet_dir;
    let pvs: Vec<String> = pv_names(&client).await;
    for name in pods {
        delete_pod(cluster, name).await;
    }
    let detached = wait_for(DEADLINE, Duration::from_secs(1), || async {
        let vas = Api::<VolumeAttachment>::all(client.clone())
            .list(&Default::default())
            .await
            .ok()?;
        vas.items.is_empty().then_some(())
    })
    .await;
    assert!(
        detached.is_ok(),
        "VolumeAttachments left after the pods went"
    );
    let state = load_state(&driver.state_dir()).expect("driver state");
    for v in state.volumes.values() {
        assert!(
            v.node_publications.is_empty() && v.published_nodes.is_empty(),
            "volume {} still published: {v:?}",
            v.id
        );
    }
    let left: Vec<PathBuf> = host_mount_points()
        .into_iter()
        .filter(|m| {
            m.starts_with(kubelet_dir)
                && (m.to_string_lossy().contains("kubernetes.io~csi")
                    || m.to_string_lossy().contains("globalmount"))
        })
        .collect();
    assert!(left.is_empty(), "CSI mounts left on the host: {left:?}");

    cluster
        .kubectl_ok(["-n", NS, "delete", "pvc", "--all", "--timeout=120s"])
        .await
        .expect("delete claims");
    let pv_api = Api::<PersistentVolume>::all(client.clone());
    let gone = wait_for(DEADLINE, Duration::from_secs(1), || async {
        let list = pv_api.list(&Default::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
    assert!(gone.is_ok(), "PVs left: {pvs:?}");
    let state = load_state(&driver.state_dir()).expect("driver state");
    assert!(
        state.volumes.is_empty(),
        "volumes left: {:?}",
        state.volumes
    );
    let files: Vec<_> = std::fs::read_dir(driver.volumes_dir())
        .expect("volumes dir")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    assert!(files.is_empty(), "volume data left: {files:?}");
}

/// Creates the app's claim and pod, waits until it runs; its volume ID.
async fn run_app(cluster: &Cluster, app: &App<'_>) -> String {
    testkit::apply_ok(cluster, app.name, &app.yaml()).await;
    walkthrough::wait_pod_running(cluster, app.name, DEADLINE)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}\n{}",
                describe(cluster, app.name),
                testkit::operator_log(cluster)
            )
        });
    let client = cluster.client().expect("client");
    let pv = pv_of(&client, app.name).await;
    pv.spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .expect("CSI volume handle")
}

async fn pv_of(client: &kube::Client, claim: &str) -> PersistentVolume {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .get(claim)
        .await
        .expect("claim");
    let pv = pvc
        .spec
        .and_then(|s| s.volume_name)
        .unwrap_or_else(|| panic!("claim {claim} not bound"));
    Api::<PersistentVolume>::all(client.clone())
        .get(&pv)
        .await
        .expect("PV")
}

async fn pv_names(client: &kube::Client) -> Vec<String> {
    Api::<PersistentVolume>::all(client.clone())
        .list(&Default::default())
        .await
        .map(|l| l.items.iter().map(|p| p.name_any()).collect())
        .unwrap_or_default()
}

async fn attachment_of(client: &kube::Client, pv: &str) -> Option<VolumeAttachment> {
    Api::<VolumeAttachment>::all(client.clone())
        .list(&Default::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
}

async fn node_pod_uid(client: &kube::Client) -> Option<String> {
    let pods = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&kube::api::ListParams::default().labels(&testkit::node_pod_selector(NAME)))
        .await
        .ok()?;
    pods.items.first().and_then(|p| p.uid())
}

async fn delete_pod(cluster: &Cluster, name: &str) {
    let pods: Api<Pod> = Api::namespaced(cluster.client().expect("client"), NS);
    let _ = pods.delete(name, &DeleteParams::default()).await;
    let gone = wait_for(DEADLINE, Duration::from_millis(500), || async {
        matches!(pods.get_opt(name).await, Ok(None)).then_some(())
    })
    .await;
    assert!(
        gone.is_ok(),
        "pod {name} never went\n{}",
        describe(cluster, name)
    );
}

/// Mount points of the test process's (the host's) mount namespace.
fn host_mount_points() -> Vec<PathBuf> {
    mounts::mount_points(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// What a failing step prints: the pod, the claims and the events.
fn describe(cluster: &Cluster, pod: &str) -> String {
    [
        testkit::kubectl_text(cluster, &["-n", NS, "describe", "pod", pod]),
        testkit::kubectl_text(cluster, &["-n", NS, "get", "pvc,pods", "-o", "wide"]),
        testkit::kubectl_text(cluster, &["get", "pv,volumeattachments"]),
        testkit::kubectl_text(
            cluster,
            &[
                "-n",
                NS,
                "logs",
                &format!("{NAME}-controller-0"),
                "--all-containers",
                "--tail=30",
            ],
        ),
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
    ]
    .join("\n")
}

#[test]
fn the_longest_gap_is_measured_over_the_upgrade_window() {
    let counter = "1 1000\n2 1100\n3 3500\n4 3600\n5 9000\n";
    assert_eq!(longest_gap(counter, 1050, 3550), Ok(2400));
    assert!(longest_gap(counter, 1050, 9500).is_err());
    assert!(longest_gap(counter, 9500, 9600).is_err());
}
