//! A driver someone already runs, taken over by a CSIDriverDeployment
//! (`spec.adoption`) on the real node, without a volume outage.
//!
//! The running deployment is `e2e/fixtures/adoption/legacy.yaml`: plain
//! manifests in the layout of kubernetes-csi's `deploy/` directories
//! (RBAC, CSIDriver, controller StatefulSet, node DaemonSet, StorageClass),
//! csi-test-driver as the plugin. A pod writes a counter line every 100 ms
//! to a volume that deployment provisioned, attached and mounted. Then
//! `kubectl csiops import --from-cluster --adopt` turns its live objects
//! into a
//! CSIDriverDeployment naming the running workloads (`spec.adoption`); it
//! is applied, and:
//! - a claim made during the takeover is Bound and mounted by a pod;
//! - the writer never stops for more than two seconds and never restarts
//!   (an I/O error ends its process);
//! - the CSIDriver is the same object (same UID), now the operator's;
//! - nothing of the old deployment is left (workloads, the named accounts
//!   and bindings, the node label), and no volume was created twice;
//! - the operator's own provisioner and attacher serve afterwards: a claim
//!   made after the takeover mounts, and deleting the claims deletes the
//!   volumes.
//!
//! Needs root and `make node-prereqs`, like `real_node.rs`.

use std::path::PathBuf;
use std::time::Duration;

use csiops_e2e::realnode::{images, NODE_NAME};
use csiops_e2e::testdriver::load_state;
use csiops_e2e::walkthrough::{
    self, longest_gap, now_ms, App, Use, VolumeDriver, DRIVER, NAME, NS,
};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::{Api, DeleteParams};
use kube::ResourceExt;

const DEADLINE: Duration = Duration::from_secs(240);
const POLL: Duration = Duration::from_millis(500);
const LEGACY_CLASS: &str = "csi-testdriver-legacy";
const ADOPT_LABEL: &str = "adopt.csiops.dev/hostpath.csiops.dev";

fn legacy_yaml(
    driver_image: &str,
    sidecar_image: &str,
    kubelet_dir: &str,
    data_dir: &str,
) -> String {
    let path = testkit::workspace_root().join("e2e/fixtures/adoption/legacy.yaml");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace("@NS@", NS)
        .replace("@DRIVER@", DRIVER)
        .replace("@DRIVER_IMAGE@", driver_image)
        .replace("@SIDECAR_IMAGE@", sidecar_image)
        .replace("@KUBELET_DIR@", kubelet_dir)
        .replace("@DATA_DIR@", data_dir)
}

/// A claim on the legacy StorageClass and a pod of `app` that uses it.
fn claim_and_pod(app: &App<'_>) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: {NS}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: {LEGACY_CLASS}
  resources:
    requests:
      storage: 8Mi
---
{pod}"#,
        name = app.name,
        pod = app.pod_yaml(app.name)
    )
}

async fn run(cluster: &Cluster, app: &App<'_>) -> String {
    testkit::apply_ok(cluster, app.name, &claim_and_pod(app)).await;
    walkthrough::wait_pod_running(cluster, app.name, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", story(cluster)));
    let client = cluster.client().expect("client");
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .get(app.name)
        .await
        .expect("claim");
    let pv = claim
        .spec
        .and_then(|s| s.volume_name)
        .unwrap_or_else(|| panic!("claim {} not bound", app.name));
    Api::<PersistentVolume>::all(client)
        .get(&pv)
        .await
        .expect("PV")
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .expect("CSI volume handle")
}

fn story(cluster: &Cluster) -> String {
    let k = |args: &[&str]| testkit::kubectl_text(cluster, args);
    format!(
        "{}\n{}\n{}\n{}",
        k(&["get", "pods,sts,ds,csidd", "-A", "-o", "wide"]),
        k(&["-n", NS, "get", "events", "--sort-by=.lastTimestamp"]),
        k(&["get", "nodes", "--show-labels"]),
        testkit::operator_log(cluster)
    )
}

/// What the phases work on: the cluster with its real node, an admin client,
/// the images and the host directories of the driver.
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    driver_image: String,
    sidecar_image: String,
    kubelet_dir: PathBuf,
    data_dir: PathBuf,
}

impl Bed {
    /// csi-test-driver as the legacy deployment and the CR run it.
    fn driver(&self) -> VolumeDriver<'_> {
        VolumeDriver {
            image: &self.driver_image,
            version: "v0.1.0",
            kubelet_dir: &self.kubelet_dir,
            data_dir: &self.data_dir,
            on_simulated_nodes: false,
            controller_args: &[],
            node_args: &[],
            node_fields: &[],
        }
    }

    /// The pod that writes a counter line every 100 ms through the takeover.
    fn writer(&self) -> App<'_> {
        App {
            name: "writer",
            image: &self.driver_image,
            text: "written-before-the-takeover",
            access_mode: "ReadWriteOnce",
            usage: Use::Filesystem,
            fs_group: None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_deployment_is_taken_over_without_a_volume_outage() {
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with a real node starts: {e}"));
    let node = cluster.real_node().expect("a real node");
    let reference = |image| {
        node.images()
            .reference(image)
            .unwrap_or_else(|e| panic!("image {image:?}: {e}"))
            .to_string()
    };
    let (driver_image, sidecar_image) =
        (reference(images::TEST_DRIVER), reference(images::SIDECAR));
    let kubelet_dir = node.layout().kubelet_dir();
    let data_dir = node.layout().root.join("csi-data");
    let client = cluster.client().expect("client");
    let bed = Bed {
        cluster,
        client,
        driver_image,
        sidecar_image,
        kubelet_dir,
        data_dir,
    };
    walkthrough::install_operator(&bed.cluster)
        .await
        .unwrap_or_else(|e| panic!("operator installs: {e}\n{}", bed.cluster.log_tails(30)));

    let (writer_volume, csidriver_uid) = the_legacy_deployment_runs_a_writer(&bed).await;
    let cr_yaml = import_reads_the_live_objects_into_an_adopting_cr(&bed.client).await;
    let (during_volume, started, done) =
        the_takeover_serves_a_claim_made_during_it(&bed, &cr_yaml).await;
    nothing_of_the_old_deployment_is_left(&bed).await;
    the_csidriver_was_kept(&bed, csidriver_uid).await;
    the_writer_never_stopped(&bed, &writer_volume, started, done).await;
    csiops_serves_from_now_on_and_no_volume_was_made_twice(&bed, &writer_volume, &during_volume)
        .await;

    testkit::delete_cr(&bed.cluster, NS, NAME, Duration::from_secs(180))
        .await
        .expect("delete the object");
    let left = bed.cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The deployment as it runs today: the legacy manifests register with
/// kubelet and a writer's claim mounts. The writer's volume and the
/// CSIDriver's UID.
async fn the_legacy_deployment_runs_a_writer(bed: &Bed) -> (String, Option<String>) {
    let Bed {
        cluster, client, ..
    } = bed;
    let legacy = legacy_yaml(
        &bed.driver_image,
        &bed.sidecar_image,
        &bed.kubelet_dir.to_string_lossy(),
        &bed.data_dir.to_string_lossy(),
    );
    testkit::apply_ok(cluster, "legacy", &legacy).await;
    walkthrough::wait_registered(cluster, DRIVER, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("the legacy node plugin: {e}\n{}", story(cluster)));
    let writer = bed.writer();
    let writer_volume = run(cluster, &writer).await;
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    let csidriver_uid = drivers.get(DRIVER).await.expect("CSIDriver").uid();
    (writer_volume, csidriver_uid)
}

/// The takeover's first half, `kubectl csiops import --from-cluster
/// --adopt`: the live objects, as a user who kept no manifests would read
/// them, become a CR naming the running workloads. The CR as YAML.
async fn import_reads_the_live_objects_into_an_adopting_cr(client: &kube::Client) -> String {
    let objects = kubectl_csiops::cluster::read_with(client.clone(), DRIVER)
        .await
        .unwrap_or_else(|e| panic!("import --from-cluster: {e}"));
    let kinds: Vec<String> = objects.iter().map(|o| o.id()).collect();
    for want in [
        "StatefulSet/csi-testdriver-controller",
        "DaemonSet/csi-testdriver-node",
        "CSIDriver/hostpath.csiops.dev",
        "ServiceAccount/csi-testdriver-controller-sa",
        "ClusterRoleBinding/csi-testdriver-provisioner-binding",
    ] {
        assert!(
            kinds.iter().any(|k| k == want),
            "{want} not read: {kinds:?}"
        );
    }
    let opts = kubectl_csiops::import::Options {
        name: Some(NAME.to_string()),
        adopt: true,
        ..Default::default()
    };
    let imported = kubectl_csiops::import::import(
        &objects,
        &opts,
        &kubectl_csiops::import::render_config(None),
    )
    .expect("import");
    println!("import's report:\n{}", imported.report.to_text());
    let cr_yaml = kubectl_csiops::import::cr_yaml(&imported.cr).expect("CR YAML");
    println!("the imported CR:\n{cr_yaml}");
    cr_yaml
}

/// The CR applied: a claim made while the takeover runs is Bound and
/// mounted, and the object reaches Running. The claim's volume and when
/// the takeover started and was done (ms).
async fn the_takeover_serves_a_claim_made_during_it(
    bed: &Bed,
    cr_yaml: &str,
) -> (String, u128, u128) {
    let cluster = &bed.cluster;
    let started = now_ms();
    testkit::apply_ok(cluster, "adopting", cr_yaml).await;
    // Claimed while the takeover runs: some provisioner and attacher serve it.
    let during = App {
        name: "during",
        text: "claimed-during-the-takeover",
        ..bed.writer()
    };
    let during_volume = run(cluster, &during).await;
    testkit::wait_running(cluster, NS, NAME, "v0.1.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", story(cluster)));
    let done = now_ms();
    println!("takeover: {} ms", done - started);
    (during_volume, started, done)
}

/// Nothing of the old deployment is left: workloads, the named accounts and
/// bindings, the node label, the old pods.
async fn nothing_of_the_old_deployment_is_left(bed: &Bed) {
    let Bed {
        cluster, client, ..
    } = bed;
    let gone = |what: &str, exists: bool| {
        assert!(!exists, "{what} is still there\n{}", story(cluster));
    };
    let ns_api = |c: &kube::Client| -> (Api<StatefulSet>, Api<DaemonSet>) {
        (
            Api::namespaced(c.clone(), NS),
            Api::namespaced(c.clone(), NS),
        )
    };
    let (sts, ds) = ns_api(client);
    let old_left = wait_for(Duration::from_secs(60), POLL, || async {
        let s = sts.get_opt("csi-testdriver-controller").await.ok()?;
        let d = ds.get_opt("csi-testdriver-node").await.ok()?;
        (s.is_none() && d.is_none()).then_some(())
    })
    .await;
    gone("the old controller or node workload", old_left.is_err());
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    for sa in ["csi-testdriver-controller-sa", "csi-testdriver-node-sa"] {
        gone(sa, sas.get_opt(sa).await.expect("get SA").is_some());
    }
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    for b in [
        "csi-testdriver-provisioner-binding",
        "csi-testdriver-attacher-binding",
    ] {
        gone(b, crbs.get_opt(b).await.expect("get CRB").is_some());
    }
    let rbs: Api<RoleBinding> = Api::namespaced(client.clone(), NS);
    for b in ["csi-testdriver-leader-election", "csi-testdriver-journal"] {
        gone(b, rbs.get_opt(b).await.expect("get RB").is_some());
    }
    let labelled = Api::<Node>::all(client.clone())
        .get(NODE_NAME)
        .await
        .expect("node")
        .labels()
        .contains_key(ADOPT_LABEL);
    gone("the node's takeover label", labelled);
    // By name: the imported CR carries the old pods' labels over
    // (spec.*.podLabels), so a label would also select the new pods.
    let old_pods: Vec<String> = Api::<Pod>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("pods")
        .items
        .iter()
        .map(|p| p.name_any())
        .filter(|n| n.starts_with("csi-testdriver-"))
        .collect();
    gone(&format!("old pods {old_pods:?}"), !old_pods.is_empty());
}

/// The CSIDriver was kept: the same object, now the operator's.
async fn the_csidriver_was_kept(bed: &Bed, csidriver_uid: Option<String>) {
    let drivers: Api<CSIDriver> = Api::all(bed.client.clone());
    let kept = drivers.get(DRIVER).await.expect("CSIDriver");
    assert_eq!(kept.uid(), csidriver_uid, "the CSIDriver was re-created");
    assert!(
        kept.labels().contains_key("csiops.dev/owner-uid"),
        "the CSIDriver is not the operator's: {:?}",
        kept.labels()
    );
}

/// The writer never stopped for more than two seconds between `started` and
/// `done`, and never restarted.
async fn the_writer_never_stopped(bed: &Bed, writer_volume: &str, started: u128, done: u128) {
    let client = &bed.client;
    let driver = bed.driver();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let counter = std::fs::read_to_string(driver.volumes_dir().join(writer_volume).join("counter"))
        .expect("counter file");
    let gap = longest_gap(&counter, started, done).unwrap_or_else(|e| panic!("{e}\n{counter}"));
    println!("longest gap in the writer's counter during the takeover: {gap} ms");
    assert!(
        gap <= 2000,
        "the writer stopped for {gap} ms during the takeover"
    );
    let pod = Api::<Pod>::namespaced(client.clone(), NS)
        .get("writer")
        .await
        .expect("writer pod");
    let restarts: i32 = pod
        .status
        .and_then(|s| s.container_statuses)
        .map(|c| c.iter().map(|c| c.restart_count).sum())
        .unwrap_or(-1);
    assert_eq!(restarts, 0, "the writer restarted: an I/O error ends it");
}

/// No volume twice; csiops serves from now on: a claim made after the
/// takeover mounts, and deleting the claims deletes the volumes.
async fn csiops_serves_from_now_on_and_no_volume_was_made_twice(
    bed: &Bed,
    writer_volume: &str,
    during_volume: &str,
) {
    let Bed {
        cluster, client, ..
    } = bed;
    let driver = bed.driver();
    let after = App {
        name: "after",
        text: "claimed-after-the-takeover",
        ..bed.writer()
    };
    let after_volume = run(cluster, &after).await;
    let state = load_state(&driver.state_dir()).expect("driver state");
    let mut ids: Vec<&String> = state.volumes.keys().collect();
    ids.sort();
    let mut expected = vec![writer_volume, during_volume, after_volume.as_str()];
    expected.sort();
    assert_eq!(
        ids, expected,
        "the driver's volumes are exactly the three claims'"
    );
    for name in ["after", "during", "writer"] {
        cluster
            .kubectl_ok(["-n", NS, "delete", "pod", name, "--wait=true"])
            .await
            .expect("delete pod");
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete claim");
    }
    testkit::wait_no_volumes(cluster, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", story(cluster)));
    let state = load_state(&driver.state_dir()).expect("driver state");
    assert!(
        state.volumes.is_empty(),
        "volumes left: {:?}",
        state.volumes.keys()
    );
}
