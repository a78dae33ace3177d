//! The driver-readiness taint on the real node (`spec.node.readinessTaint`).
//!
//! kubelet registers the node with `csiops.dev/driver-not-ready.<driver>:NoSchedule`,
//! as a new node of a real cluster would be. A pod that tolerates nothing
//! stays Pending while the driver is not registered on the node, and
//! schedules once our registrar has removed the taint (after kubelet
//! accepted the driver and the CSINode entry exists). The same holds when the
//! node pod is replaced. Other taints are never touched, and status counts
//! the nodes still tainted.
//!
//! The node pod is held back and let go by a node label (the DaemonSet's
//! nodeSelector), so "still Pending before the driver registers" is observed
//! deterministically, not raced.
//!
//! Needs root and `make node-prereqs`, like `real_node.rs`.

use std::path::PathBuf;
use std::time::Duration;

use csiops_e2e::realnode::{images, NODE_NAME};
use csiops_e2e::walkthrough::{self, VolumeDriver, DRIVER, NAME, NS};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;

const DEADLINE: Duration = Duration::from_secs(180);
/// The node label the driver's node pods select: set, the node pod runs.
const GATE_LABEL: &str = "csiops.dev/e2e-driver";
/// A taint of someone else's, which the registrar must leave alone.
const OTHER_TAINT: &str = "example.com/keep-me";

fn taint_key() -> String {
    csiops_crds::readiness_taint_key(DRIVER)
}

/// What the phases work on: the cluster with its tainted real node, an admin
/// client, the Node API, the readiness taint's key, the images and the
/// driver's host directories.
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    nodes: Api<Node>,
    key: String,
    pause: String,
    driver_image: String,
    kubelet_dir: PathBuf,
    data_dir: PathBuf,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_wait_for_the_driver_on_a_node_registered_with_the_readiness_taint() {
    let key = taint_key();
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        real_node_taints: vec![format!("{key}:NoSchedule")],
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with a tainted real node starts: {e}"));
    let client = cluster.client().expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    let node = cluster.real_node().expect("a real node");
    let pause = node
        .images()
        .reference(images::PAUSE)
        .expect("pause image")
        .to_string();
    let driver_image = node
        .images()
        .reference(images::TEST_DRIVER)
        .expect("driver image")
        .to_string();
    let (kubelet_dir, data_dir) = (
        node.layout().kubelet_dir(),
        node.layout().root.join("csi-data"),
    );
    let bed = Bed {
        cluster,
        client,
        nodes,
        key,
        pause,
        driver_image,
        kubelet_dir,
        data_dir,
    };

    the_node_is_tainted_and_the_operator_tolerates_it(&bed).await;
    a_pod_that_tolerates_nothing_cannot_land(&bed).await;
    the_driver_counts_the_tainted_node_while_its_node_pod_is_held(&bed).await;
    the_node_pod_registers_then_removes_the_taint(&bed).await;
    a_re_added_taint_goes_again_while_registered(&bed).await;
    a_replaced_node_pod_does_the_same(&bed).await;
    clean_up_through_the_operator(&bed).await;
    let left = bed.cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left on the host: {left:?}");
}

/// kubelet registered the node with the readiness taint, and the operator,
/// tolerating it, becomes ready.
async fn the_node_is_tainted_and_the_operator_tolerates_it(bed: &Bed) {
    let Bed {
        cluster,
        nodes,
        key,
        ..
    } = bed;
    assert_eq!(
        taint_keys(nodes).await,
        vec![key.clone()],
        "kubelet registered the node with the readiness taint"
    );

    // The operator tolerates the taint, as a user sets it through the Helm
    // chart's `tolerations`: otherwise nothing could run on a cluster whose
    // only node waits for the driver.
    walkthrough::install_operator_tolerating(cluster, Some(key))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "operator ready: {e}\n--- pods\n{}\n--- operator (previous)\n{}",
                testkit::kubectl_text(cluster, &["get", "pods", "-A", "-o", "wide"]),
                testkit::kubectl_text(
                    cluster,
                    &[
                        "-n",
                        "csiops-system",
                        "logs",
                        "deployment/csiops-operator",
                        "--previous",
                        "--tail=30"
                    ]
                ),
            )
        });
}

/// A pod that tolerates nothing cannot land on the node; someone else's
/// taint is added beside the readiness taint.
async fn a_pod_that_tolerates_nothing_cannot_land(bed: &Bed) {
    let Bed {
        cluster,
        key,
        pause,
        ..
    } = bed;
    testkit::apply_ok(
        cluster,
        "ns",
        &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"),
    )
    .await;
    testkit::apply_ok(cluster, "bystander-1", &bystander("bystander-1", pause)).await;
    wait_unschedulable_for(cluster, "bystander-1", key).await;

    // Someone else's taint that schedules anyway, to see it survive.
    cluster
        .kubectl_ok([
            "taint",
            "node",
            NODE_NAME,
            &format!("{OTHER_TAINT}=yes:PreferNoSchedule"),
        ])
        .await
        .expect("kubectl taint");
}

/// The driver, its node pods held back by the gate label: status counts
/// the tainted node; the pod still waits.
async fn the_driver_counts_the_tainted_node_while_its_node_pod_is_held(bed: &Bed) {
    let Bed {
        cluster,
        nodes,
        key,
        driver_image,
        kubelet_dir,
        data_dir,
        ..
    } = bed;
    let node_fields = [
        ("readinessTaint", serde_json::json!(true)),
        ("nodeSelector", serde_json::json!({ GATE_LABEL: "yes" })),
    ];
    let driver = VolumeDriver {
        image: driver_image,
        version: "v0.1.0",
        kubelet_dir,
        data_dir,
        on_simulated_nodes: false,
        controller_args: &[],
        node_args: &[],
        node_fields: &node_fields,
    };
    testkit::apply_ok(cluster, "driver", &driver.yaml()).await;
    // Status counts the tainted node; the pod still waits.
    wait_tainted_count(cluster, "1").await;
    assert!(
        pod_pending(cluster, "bystander-1").await,
        "nothing removed the taint yet"
    );
    assert!(taint_keys(nodes).await.contains(key));
}

/// The node pod starts: it registers, then removes the taint (and only it);
/// the pod schedules.
async fn the_node_pod_registers_then_removes_the_taint(bed: &Bed) {
    let Bed {
        cluster,
        client,
        nodes,
        key,
        ..
    } = bed;
    set_gate(cluster, true).await;
    walkthrough::wait_pod_running(cluster, "bystander-1", DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(cluster)));
    assert!(
        csinode_lists_driver(client).await,
        "the taint went only after the CSINode entry existed"
    );
    let left = taint_keys(nodes).await;
    assert!(!left.contains(key), "readiness taint removed: {left:?}");
    assert!(
        left.iter().any(|k| k == OTHER_TAINT),
        "other taint kept: {left:?}"
    );
    testkit::wait_running(cluster, NS, NAME, "v0.1.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(cluster)));
    wait_tainted_count(cluster, "").await;
    let log = testkit::kubectl_text(
        cluster,
        &[
            "-n",
            NS,
            "logs",
            "daemonset/hostpath-node",
            "-c",
            "node-driver-registrar",
        ],
    );
    assert!(
        log.contains("removed the readiness taint"),
        "registrar log:\n{log}"
    );
}

/// While registered, a re-added readiness taint goes again.
async fn a_re_added_taint_goes_again_while_registered(bed: &Bed) {
    let Bed {
        cluster,
        nodes,
        key,
        ..
    } = bed;
    cluster
        .kubectl_ok(["taint", "node", NODE_NAME, &format!("{key}:NoSchedule")])
        .await
        .expect("kubectl taint");
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async { (!taint_keys(nodes).await.contains(key)).then_some(()) },
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the running registrar did not remove a re-added taint\n{}",
            diagnostics(cluster)
        )
    });
}

/// The node pod is replaced: the same holds.
async fn a_replaced_node_pod_does_the_same(bed: &Bed) {
    let Bed {
        cluster,
        client,
        nodes,
        key,
        pause,
        ..
    } = bed;
    set_gate(cluster, false).await;
    let node_pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let selector = testkit::node_pod_selector(NAME);
    wait_for(DEADLINE, Duration::from_millis(500), || async {
        let pods = node_pods
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .ok()?;
        pods.items.is_empty().then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("the node pod did not go\n{}", diagnostics(cluster)));
    // The registrar leaving removed the driver's CSINode entry; the node
    // gets the taint again, as after a node re-registration.
    assert!(
        !csinode_lists_driver(client).await,
        "the driver left the node"
    );
    cluster
        .kubectl_ok(["taint", "node", NODE_NAME, &format!("{key}:NoSchedule")])
        .await
        .expect("kubectl taint");
    testkit::apply_ok(cluster, "bystander-2", &bystander("bystander-2", pause)).await;
    wait_unschedulable_for(cluster, "bystander-2", key).await;
    wait_tainted_count(cluster, "1").await;

    set_gate(cluster, true).await;
    walkthrough::wait_pod_running(cluster, "bystander-2", DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(cluster)));
    assert!(csinode_lists_driver(client).await);
    let left = taint_keys(nodes).await;
    assert!(
        !left.contains(key) && left.iter().any(|k| k == OTHER_TAINT),
        "{left:?}"
    );
    wait_tainted_count(cluster, "").await;
}

/// Clean up through the operator, so the cluster then stops clean.
async fn clean_up_through_the_operator(bed: &Bed) {
    let cluster = &bed.cluster;
    for pod in ["bystander-1", "bystander-2"] {
        let _ = cluster
            .kubectl(["-n", NS, "delete", "pod", pod, "--wait=true"])
            .await;
    }
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "delete",
            "csidriverdeployment",
            NAME,
            "--timeout=120s",
        ])
        .await
        .unwrap_or_else(|e| panic!("teardown: {e}\n{}", diagnostics(cluster)));
}

/// A pod on the real node that tolerates nothing and uses no volume.
fn bystander(name: &str, image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NS}
spec:
  nodeSelector:
    kubernetes.io/hostname: {NODE_NAME}
  terminationGracePeriodSeconds: 1
  containers:
  - name: pause
    image: {image}
"#
    )
}

/// Labels (`true`) or unlabels the node with the gate the node pods select.
async fn set_gate(cluster: &Cluster, on: bool) {
    let label = if on {
        format!("{GATE_LABEL}=yes")
    } else {
        format!("{GATE_LABEL}-")
    };
    cluster
        .kubectl_ok(["label", "node", NODE_NAME, &label, "--overwrite"])
        .await
        .expect("kubectl label");
}

/// The keys of the real node's taints.
async fn taint_keys(nodes: &Api<Node>) -> Vec<String> {
    let node = nodes.get(NODE_NAME).await.expect("the real node");
    node.spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect()
}

async fn csinode_lists_driver(client: &kube::Client) -> bool {
    let csinodes: Api<CSINode> = Api::all(client.clone());
    csinodes
        .get_opt(NODE_NAME)
        .await
        .ok()
        .flatten()
        .is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == DRIVER))
}

async fn pod_pending(cluster: &Cluster, name: &str) -> bool {
    let pods: Api<Pod> = Api::namespaced(cluster.client().expect("client"), NS);
    let pod = pods.get(name).await.expect("pod");
    pod.status.and_then(|s| s.phase).as_deref() == Some("Pending")
        && pod.spec.and_then(|s| s.node_name).is_none()
}

/// Waits until the scheduler reports `name` unschedulable for a taint
/// (kube-scheduler 1.34 names no key: "had untolerated taint(s)"), then
/// checks that `key` is the node's only NoSchedule taint, so it is the one
/// that refused the pod.
async fn wait_unschedulable_for(cluster: &Cluster, name: &str, key: &str) {
    let client = cluster.client().expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let pod = pods.get_opt(name).await.ok()??;
            let unschedulable = pod.status?.conditions?.into_iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.message.is_some_and(|m| m.contains("untolerated taint"))
            });
            unschedulable.then_some(())
        },
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{name} was not refused for a taint\n{}",
            testkit::kubectl_text(cluster, &["-n", NS, "get", "pod", name, "-o", "yaml"])
        )
    });
    let node = Api::<Node>::all(client).get(NODE_NAME).await.expect("node");
    let no_schedule: Vec<String> = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.effect == "NoSchedule")
        .map(|t| t.key)
        .collect();
    assert_eq!(
        no_schedule,
        [key],
        "the readiness taint is what refused {name}"
    );
}

/// Waits until `status.taintedNodes` reads `want` (`""`: absent, i.e. none).
async fn wait_tainted_count(cluster: &Cluster, want: &str) {
    let last = std::sync::Mutex::new(String::new());
    let res = wait_for(
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let got = testkit::jsonpath(
                cluster,
                &["-n", NS, "get", "csidriverdeployment", NAME],
                "{.status.taintedNodes}",
            )
            .await
            .ok()?;
            if let Ok(mut l) = last.lock() {
                l.clone_from(&got);
            }
            (got.trim() == want).then_some(())
        },
    )
    .await;
    if res.is_err() {
        let got = last.lock().map(|l| l.clone()).unwrap_or_default();
        panic!(
            "status.taintedNodes is {got:?}, wanted {want:?}\n{}",
            diagnostics(cluster)
        );
    }
}

fn diagnostics(cluster: &Cluster) -> String {
    format!(
        "--- status\n{}\n--- pods\n{}\n--- node taints\n{}\n--- operator\n{}",
        testkit::kubectl_text(
            cluster,
            &[
                "-n",
                NS,
                "get",
                "csidriverdeployment",
                NAME,
                "-o",
                "jsonpath={.status}"
            ]
        ),
        testkit::kubectl_text(cluster, &["get", "pods", "-A", "-o", "wide"]),
        testkit::kubectl_text(
            cluster,
            &["get", "node", NODE_NAME, "-o", "jsonpath={.spec.taints}"]
        ),
        testkit::operator_log(cluster),
    )
}
