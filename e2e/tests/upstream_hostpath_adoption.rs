//! Upstream csi-driver-host-path as its own `deploy/kubernetes-distributed`
//! deploys it, taken over in place by a CSIDriverDeployment
//! (`spec.adoption`, docs/adoption.md) on the real node: the proof of
//! `tests/adoption.rs` with upstream's driver, sidecars and manifests
//! instead of ours.
//!
//! Upstream's DaemonSet (hostpathplugin, csi-provisioner with
//! `--node-deployment`, node-driver-registrar, livenessprobe), CSIDriver,
//! fast StorageClass and the provisioner RBAC that its `deploy.sh` applies
//! (external-provisioner's `deploy/kubernetes/rbac.yaml`) are applied as
//! upstream ships them but for the bed's host paths: kubelet's root dir
//! (what `deploy.sh` does with `KUBELET_DATA_DIR`) and the data dir (under
//! the node's directory, not /var/lib), and the hostpathplugin image, which
//! the v1.18.0 tag's manifest still names v1.17.1. A pod writes a counter
//! line every 100 ms to a volume upstream's provisioner made. Then
//! `kubectl csiops import --from-cluster --adopt` (through the library, as
//! `tests/adoption.rs` does) turns the live objects into a CR, which is
//! applied, and:
//! - a claim made while the node's plugin is being replaced (the node labelled
//!   `leaving`) is Bound and mounted by a pod;
//! - the writer never stops for more than two seconds and never restarts
//!   (an I/O error ends its process);
//! - the CSIDriver is the same object (same UID), now the operator's;
//! - nothing of the old deployment is left: the DaemonSet and its pods, the
//!   ServiceAccount and bindings `spec.adoption.remove` names, the node
//!   label `adopt.csiops.dev/hostpath.csi.k8s.io`;
//! - hostpathplugin's `state.json` holds exactly one volume per claim;
//! - csiops' sidecars serve afterwards: a claim made after the takeover
//!   mounts, and deleting the claims deletes the volumes.
//!
//! Not part of `make test` (ignored): nothing upstream is in this
//! repository. Build the inputs as `e2e/README.md` says ("Upstream
//! hostpathplugin" for the driver image, "Taking over upstream's own
//! deployment" for the sidecar images), extract the two upstream trees at
//! their tags, and run, as root after `make node-prereqs`:
//!
//! ```sh
//! CSIOPS_HOSTPATH_DEPLOY=/path/to/csi-driver-host-path-v1.18.0/deploy/kubernetes-distributed \
//! CSIOPS_PROVISIONER_RBAC=/path/to/external-provisioner-v6.3.0/deploy/kubernetes/rbac.yaml \
//! CSIOPS_HOSTPATHPLUGIN_IMAGE=/tmp/hostpathplugin-v1.18.0.tar \
//! CSIOPS_UPSTREAM_SIDECAR_IMAGES=/tmp/csi-provisioner-v6.3.0.tar:/tmp/csi-node-driver-registrar-v2.17.0.tar:/tmp/livenessprobe-v2.19.0.tar \
//!   cargo test -p csiops-e2e --test upstream_hostpath_adoption -- --ignored --nocapture
//! ```
//!
//! Without any of the four variables the test fails naming them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csiops_e2e::conformance::drivers;
use csiops_e2e::node_local::{self as nl, ClaimApp};
use csiops_e2e::realnode::{images, NODE_NAME};
use csiops_e2e::testdriver::leftovers::{leftovers_under, LeftoverGuard};
use csiops_e2e::walkthrough::{self, longest_gap, now_ms, Use};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::{Api, DeleteParams, ListParams};
use kube::ResourceExt;

const DEPLOY_ENV: &str = "CSIOPS_HOSTPATH_DEPLOY";
const RBAC_ENV: &str = "CSIOPS_PROVISIONER_RBAC";
const DRIVER_IMAGE_ENV: &str = "CSIOPS_HOSTPATHPLUGIN_IMAGE";
const SIDECAR_IMAGES_ENV: &str = "CSIOPS_UPSTREAM_SIDECAR_IMAGES";
/// The hostpathplugin image the archive carries (the README's recipe).
const DRIVER_IMAGE: &str = "registry.k8s.io/sig-storage/hostpathplugin:v1.18.0";
/// The files of `deploy/kubernetes-distributed/hostpath/` applied here; the
/// slow class, and the socat Service of csi-hostpath-testing.yaml (upstream's
/// own test runner's), are left out.
const UPSTREAM_FILES: [&str; 3] = [
    "hostpath/csi-hostpath-driverinfo.yaml",
    "hostpath/csi-hostpath-plugin.yaml",
    "hostpath/csi-hostpath-storageclass-fast.yaml",
];
const DRIVER: &str = "hostpath.csi.k8s.io";
/// Where `deploy.sh` deploys: no namespace in upstream's files, `default`
/// in the RBAC's.
const NS: &str = "default";
const OLD_DAEMONSET: &str = "csi-hostpathplugin";
const CLASS: &str = "csi-hostpath-fast";
const NAME: &str = "hostpath";
const APPS: &str = "hostpath-apps";
const ADOPT_LABEL: &str = "adopt.csiops.dev/hostpath.csi.k8s.io";
const DEADLINE: Duration = Duration::from_secs(240);
const POLL: Duration = Duration::from_millis(500);

/// What the user built and extracted.
struct Inputs {
    deploy_dir: PathBuf,
    rbac: PathBuf,
    images: Vec<PathBuf>,
}

fn inputs() -> Inputs {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let missing: Vec<&str> = [DEPLOY_ENV, RBAC_ENV, DRIVER_IMAGE_ENV, SIDECAR_IMAGES_ENV]
        .into_iter()
        .filter(|v| var(v).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "not set: {}. This test needs upstream's deploy/kubernetes-distributed of csi-driver-host-path v1.18.0 \
         ({DEPLOY_ENV}), external-provisioner v6.3.0's deploy/kubernetes/rbac.yaml ({RBAC_ENV}), the \
         hostpathplugin v1.18.0 image archive ({DRIVER_IMAGE_ENV}) and the archives of the sidecar images \
         the DaemonSet names, ':'-separated ({SIDECAR_IMAGES_ENV}); build them as e2e/README.md says",
        missing.join(", ")
    );
    let path = |name: &str| PathBuf::from(var(name).unwrap_or_default());
    let mut images = vec![path(DRIVER_IMAGE_ENV)];
    images.extend(std::env::split_paths(&path(SIDECAR_IMAGES_ENV)));
    let inputs = Inputs {
        deploy_dir: path(DEPLOY_ENV),
        rbac: path(RBAC_ENV),
        images,
    };
    for f in UPSTREAM_FILES {
        let p = inputs.deploy_dir.join(f);
        assert!(p.is_file(), "{DEPLOY_ENV}: no {}", p.display());
    }
    assert!(
        inputs.rbac.is_file(),
        "{RBAC_ENV}={} is no file",
        inputs.rbac.display()
    );
    for i in &inputs.images {
        assert!(i.is_file(), "image archive {} is no file", i.display());
    }
    inputs
}

/// Upstream's files as one stream, adapted to the bed the way the
/// conformance bed's `--deploy-with` files are: kubelet's root dir and the
/// data dir become the bed's (`conformance::drivers::substitute`), as
/// `deploy.sh`'s `KUBELET_DATA_DIR` moves kubelet's; and the driver image is
/// the v1.18.0 one.
fn upstream_yaml(inputs: &Inputs, kubelet_dir: &Path, data_dir: &Path) -> String {
    let read =
        |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut docs: Vec<String> = UPSTREAM_FILES
        .iter()
        .map(|f| read(&inputs.deploy_dir.join(f)))
        .collect();
    docs.push(read(&inputs.rbac));
    let text = docs.join("\n---\n");
    for upstream in [
        "/var/lib/kubelet/",
        "/var/lib/csi-hostpath-data/",
        "sig-storage/hostpathplugin:",
    ] {
        assert!(
            text.contains(upstream),
            "upstream's files no longer name {upstream}"
        );
    }
    assert!(
        !text.contains("${"),
        "upstream's files use ${{…}} themselves"
    );
    let template = text
        .replace("/var/lib/kubelet/", "${KUBELET_DIR}/")
        .replace("/var/lib/csi-hostpath-data/", "${DATA_DIR}/");
    let vars = drivers::vars("", "", kubelet_dir, data_dir);
    let adapted = drivers::substitute(&template, &vars).expect("placeholders filled");
    adapted
        .lines()
        .map(
            |l| match l.split_once("image: registry.k8s.io/sig-storage/hostpathplugin:") {
                Some((indent, _)) => format!("{indent}image: {DRIVER_IMAGE}"),
                None => l.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("\n")
}

/// The images `yaml` names, each checked in the node's containerd.
fn check_images(cluster: &Cluster, yaml: &str) {
    let node = cluster.real_node().expect("a real node");
    let listed = node.ctr(&["images", "ls", "-q"]).expect("ctr images ls");
    for image in yaml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
    {
        assert!(
            listed.lines().any(|l| l == image.trim()),
            "no archive of {DRIVER_IMAGE_ENV} or {SIDECAR_IMAGES_ENV} carries {image}; the node has:\n{listed}"
        );
    }
}

/// Applies upstream's deployment and waits until kubelet lists the driver.
async fn deploy_upstream(cluster: &Cluster, yaml: &str) {
    check_images(cluster, yaml);
    testkit::apply_ok(cluster, "upstream", yaml).await;
    walkthrough::wait_registered(cluster, DRIVER, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("upstream's node plugin: {e}\n{}", story(cluster)));
}

/// Creates the app's claim and pod and waits until it runs; its volume ID.
async fn run_app(cluster: &Cluster, app: &ClaimApp<'_>) -> String {
    testkit::apply_ok(cluster, app.name, &app.yaml()).await;
    nl::wait_pod_running(cluster, APPS, app.name, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", story(cluster)));
    let client = cluster.client().expect("client");
    let pv = nl::pv_of(&client, APPS, app.name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    nl::volume_handle(&pv).expect("CSI volume handle")
}

fn story(cluster: &Cluster) -> String {
    let k = |args: &[&str]| testkit::kubectl_text(cluster, args);
    format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        k(&["get", "pods,ds,csidd,pvc", "-A", "-o", "wide"]),
        k(&["-n", NS, "get", "events", "--sort-by=.lastTimestamp"]),
        k(&["-n", APPS, "get", "events", "--sort-by=.lastTimestamp"]),
        k(&["get", "nodes", "--show-labels"]),
        k(&[
            "-n",
            NS,
            "logs",
            "-l",
            "app.kubernetes.io/name=csi-hostpathplugin",
            "--all-containers",
            "--tail=20"
        ]),
        testkit::operator_log(cluster)
    )
}

/// `(volume ID, volume name)` of every volume in hostpathplugin's state file.
fn hostpath_volumes(data_dir: &Path) -> Vec<(String, String)> {
    let path = data_dir.join("state.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let state: serde_json::Value = serde_json::from_str(&text).expect("state.json is JSON");
    state["Volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            (s("VolID"), s("VolName"))
        })
        .collect()
}

/// Waits until the takeover moves the node (its label `leaving`, or already
/// `done`); the stage seen.
async fn node_leaving(cluster: &Cluster) -> String {
    let nodes: Api<Node> = Api::all(cluster.client().expect("client"));
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async {
            let n = nodes.get_opt(NODE_NAME).await.ok()??;
            let stage = n.labels().get(ADOPT_LABEL)?.clone();
            ["leaving", "done"]
                .contains(&stage.as_str())
                .then_some(stage)
        },
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the node was never labelled leaving or done\n{}",
            story(cluster)
        )
    })
}

/// What the takeover showed.
struct Takeover {
    started: u128,
    done: u128,
    during_volume: String,
}

/// `import --from-cluster --adopt` through the library, printed; the CR
/// applied, a claim made meanwhile, until the object is Running.
async fn take_over(cluster: &Cluster, app_image: &str) -> Takeover {
    let client = cluster.client().expect("client");
    let objects = kubectl_csiops::cluster::read_with(client, DRIVER)
        .await
        .unwrap_or_else(|e| panic!("import --from-cluster: {e}"));
    let ids: Vec<String> = objects.iter().map(|o| o.id()).collect();
    println!("read from the cluster: {ids:?}");
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
    println!("import's counts: {:?}", imported.report.counts());
    let cr_yaml = kubectl_csiops::import::cr_yaml(&imported.cr).expect("CR YAML");
    println!("the imported CR:\n{cr_yaml}");
    let adoption = imported.cr.spec.adoption.as_ref().expect("spec.adoption");
    assert_eq!(adoption.node_daemon_set.as_deref(), Some(OLD_DAEMONSET));
    assert_eq!(imported.cr.metadata.namespace.as_deref(), Some(NS));

    let started = now_ms();
    testkit::apply_ok(cluster, "adopting", &cr_yaml).await;
    // Claimed while the node's plugin is being replaced: upstream's pod is
    // told to go, csiops' not yet started or registered.
    let stage = node_leaving(cluster).await;
    let claimed = now_ms();
    println!(
        "node label {ADOPT_LABEL}={stage} {} ms after the apply: the claim \"during\" is made now",
        claimed - started
    );
    let during = ClaimApp {
        namespace: APPS,
        name: "during",
        class: CLASS,
        image: app_image,
        text: "claimed-during-the-takeover",
        usage: Use::Filesystem,
        node: NODE_NAME,
    };
    let during_volume = run_app(cluster, &during).await;
    println!(
        "the claim made during the takeover: pod Running {} ms after the claim",
        now_ms() - claimed
    );
    testkit::wait_running(cluster, NS, NAME, "v1.18.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", story(cluster)));
    let done = now_ms();
    println!("takeover: {} ms from the apply to Running", done - started);
    Takeover {
        started,
        done,
        during_volume,
    }
}

/// Nothing of upstream's deployment is left, and the CSIDriver was kept.
async fn assert_old_deployment_gone(cluster: &Cluster, csidriver_uid: Option<String>) {
    let client = cluster.client().expect("client");
    let gone = |what: &str, exists: bool| {
        assert!(!exists, "{what} is still there\n{}", story(cluster));
    };
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let old_left = wait_for(Duration::from_secs(60), POLL, || async {
        let d = ds.get_opt(OLD_DAEMONSET).await.ok()?;
        let p = pods.list(&ListParams::default()).await.ok()?;
        let old_pods = p
            .items
            .iter()
            .any(|p| p.name_any().starts_with(OLD_DAEMONSET));
        (d.is_none() && !old_pods).then_some(())
    })
    .await;
    gone("the old DaemonSet or its pods", old_left.is_err());
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    gone(
        "ServiceAccount csi-provisioner",
        sas.get_opt("csi-provisioner")
            .await
            .expect("get SA")
            .is_some(),
    );
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    gone(
        "ClusterRoleBinding csi-provisioner-role",
        crbs.get_opt("csi-provisioner-role")
            .await
            .expect("get CRB")
            .is_some(),
    );
    let rbs: Api<RoleBinding> = Api::namespaced(client.clone(), NS);
    gone(
        "RoleBinding csi-provisioner-role-cfg",
        rbs.get_opt("csi-provisioner-role-cfg")
            .await
            .expect("get RB")
            .is_some(),
    );
    let node = Api::<Node>::all(client.clone())
        .get(NODE_NAME)
        .await
        .expect("node");
    gone(
        "the node's takeover label",
        node.labels().contains_key(ADOPT_LABEL),
    );

    let kept = Api::<CSIDriver>::all(client.clone())
        .get(DRIVER)
        .await
        .expect("CSIDriver");
    assert_eq!(kept.uid(), csidriver_uid, "the CSIDriver was re-created");
    assert!(
        kept.labels().contains_key("csiops.dev/owner-uid"),
        "the CSIDriver is not the operator's: {:?}",
        kept.labels()
    );
    // Every container of the driver's pods is now hostpathplugin or csiops'.
    let sidecar = cluster
        .real_node()
        .expect("a real node")
        .images()
        .reference(images::SIDECAR)
        .expect("sidecar image")
        .to_string();
    for p in pods.list(&ListParams::default()).await.expect("pods").items {
        for c in p.spec.map(|s| s.containers).unwrap_or_default() {
            let image = c.image.unwrap_or_default();
            assert!(
                image == DRIVER_IMAGE || image == sidecar,
                "pod {} still runs {image} in {}",
                p.metadata.name.unwrap_or_default(),
                c.name
            );
        }
    }
}

/// The writer never stopped for long and never restarted.
async fn assert_writer_kept_writing(
    cluster: &Cluster,
    data_dir: &Path,
    volume: &str,
    t: &Takeover,
) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let path = data_dir.join(volume).join("counter");
    let counter =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let gap = longest_gap(&counter, t.started, t.done).unwrap_or_else(|e| panic!("{e}\n{counter}"));
    println!("longest gap in the writer's counter during the takeover: {gap} ms");
    assert!(
        gap <= 2000,
        "the writer stopped for {gap} ms during the takeover"
    );
    let pod = Api::<Pod>::namespaced(cluster.client().expect("client"), APPS)
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

/// hostpathplugin holds exactly `expected` volumes, each once.
fn assert_volumes(data_dir: &Path, expected: &[&String]) {
    let volumes = hostpath_volumes(data_dir);
    let names: BTreeSet<&String> = volumes.iter().map(|(_, n)| n).collect();
    assert_eq!(
        names.len(),
        volumes.len(),
        "a volume name twice: {volumes:?}"
    );
    let ids: BTreeSet<&String> = volumes.iter().map(|(id, _)| id).collect();
    let want: BTreeSet<&String> = expected.iter().copied().collect();
    assert_eq!(
        ids, want,
        "hostpathplugin's volumes are not exactly the claims': {volumes:?}"
    );
    assert_eq!(volumes.len(), expected.len(), "{volumes:?}");
}

/// Deletes the apps and their claims; hostpathplugin deletes the volumes.
async fn delete_claims(cluster: &Cluster, data_dir: &Path) {
    let client = cluster.client().expect("client");
    for name in ["after", "during", "writer"] {
        cluster
            .kubectl_ok(["-n", APPS, "delete", "pod", name, "--wait=true"])
            .await
            .expect("delete pod");
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), APPS)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete claim");
    }
    testkit::wait_no_volumes(cluster, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", story(cluster)));
    assert_volumes(data_dir, &[]);
    let entries: Vec<String> = std::fs::read_dir(data_dir)
        .expect("data dir")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n != "state.json")
        .collect();
    assert!(
        entries.is_empty(),
        "volumes left in the data dir: {entries:?}"
    );
}

/// Deletes the object and what the takeover leaves to the user (the roles,
/// the class), then stops the cluster; fails on anything left.
async fn tear_down(cluster: Cluster, kubelet_dir: &Path, data_dir: &Path) {
    let csi_mounts = nl::csi_mounts_under(kubelet_dir);
    assert!(csi_mounts.is_empty(), "CSI mounts left: {csi_mounts:?}");
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "delete",
            "csidd",
            NAME,
            "--wait=true",
            "--timeout=180s",
        ])
        .await
        .expect("delete the object");
    for (kind, name) in [
        ("clusterrole", "external-provisioner-runner"),
        ("storageclass", CLASS),
    ] {
        cluster
            .kubectl_ok(["delete", kind, name, "--ignore-not-found"])
            .await
            .expect("delete what the takeover leaves");
    }
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "delete",
            "role",
            "external-provisioner-cfg",
            "--ignore-not-found",
        ])
        .await
        .expect("delete the old Role");
    let left = leftovers_under(data_dir);
    assert!(left.is_empty(), "left under the data dir: {left:?}");
    let left = cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs upstream's manifests and images (CSIOPS_HOSTPATH_DEPLOY, CSIOPS_PROVISIONER_RBAC, CSIOPS_HOSTPATHPLUGIN_IMAGE, CSIOPS_UPSTREAM_SIDECAR_IMAGES; e2e/README.md); not part of make test"]
async fn upstreams_own_hostpath_deployment_is_taken_over_without_a_volume_outage() {
    let inputs = inputs();
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        extra_images: inputs.images.clone(),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with a real node starts: {e}"));
    let node = cluster.real_node().expect("a real node");
    let kubelet_dir = node.layout().kubelet_dir();
    let data_dir = node.layout().root.join("csi-hostpath-data");
    let _mounts = LeftoverGuard::new(&data_dir);
    let app_image = node
        .images()
        .reference(images::TEST_DRIVER)
        .expect("test driver image")
        .to_string();
    walkthrough::install_operator(&cluster)
        .await
        .unwrap_or_else(|e| panic!("operator installs: {e}\n{}", cluster.log_tails(30)));

    // --- upstream's deployment, as deploy.sh leaves it ------------------------
    deploy_upstream(&cluster, &upstream_yaml(&inputs, &kubelet_dir, &data_dir)).await;
    cluster
        .kubectl_ok(["create", "namespace", APPS])
        .await
        .expect("apps namespace");
    let app = |name, text| ClaimApp {
        namespace: APPS,
        name,
        class: CLASS,
        image: &app_image,
        text,
        usage: Use::Filesystem,
        node: NODE_NAME,
    };
    let writer_volume = run_app(&cluster, &app("writer", "written-before-the-takeover")).await;
    let client = cluster.client().expect("client");
    let csidriver_uid = Api::<CSIDriver>::all(client.clone())
        .get(DRIVER)
        .await
        .expect("CSIDriver")
        .uid();

    // --- the takeover -------------------------------------------------------------
    let t = take_over(&cluster, &app_image).await;
    assert_old_deployment_gone(&cluster, csidriver_uid).await;
    assert_writer_kept_writing(&cluster, &data_dir, &writer_volume, &t).await;

    // --- no volume twice; csiops serves from now on -------------------------------
    let after_volume = run_app(&cluster, &app("after", "claimed-after-the-takeover")).await;
    assert_volumes(
        &data_dir,
        &[&writer_volume, &t.during_volume, &after_volume],
    );
    println!(
        "hostpathplugin's volumes: writer {writer_volume}, during {}, after {after_volume}",
        t.during_volume
    );
    delete_claims(&cluster, &data_dir).await;
    tear_down(cluster, &kubelet_dir, &data_dir).await;
}
