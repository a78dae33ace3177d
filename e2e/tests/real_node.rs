//! csiops on a real node: kubelet, containerd and runc run our images.
//!
//! - A pod runs for real on the node, and stopping the cluster leaves
//!   nothing on the host (no process, mount, network namespace, bridge or
//!   iptables chain).
//! - `manifests/install.yaml`, unmodified, runs the operator in containers
//!   with in-cluster config and leader election; a CSIDriverDeployment of
//!   csi-test-driver puts its pods on the node, our registrar registers with
//!   the real kubelet, the node stays quiet, a wrong `kubeletDir` shows in
//!   status, an upgrade restarts the containers in the documented order, and
//!   deleting the object removes its containers from containerd.
//!
//! These tests need root and `make node-prereqs`; without them they fail
//! saying what is missing. One real node runs at a time (a machine-wide
//! lock), so the tests take turns.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use csiops_e2e::realnode::{self, images, NODE_NAME};
use csiops_e2e::timeline::Timeline;
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, ListParams};
use kube::ResourceExt;

const DEADLINE: Duration = Duration::from_secs(180);
const NS: &str = "csi-test";
const NAME: &str = "testdriver";
const DRIVER: &str = "csi-test.csiops.dev";

fn with_real_node(kwok_nodes: usize) -> ClusterOptions {
    ClusterOptions {
        nodes: kwok_nodes,
        real_node: true,
        ..Default::default()
    }
}

async fn start(kwok_nodes: usize) -> Cluster {
    Cluster::start(with_real_node(kwok_nodes))
        .await
        .unwrap_or_else(|e| panic!("cluster with a real node starts: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_for_real_and_teardown_leaves_nothing() {
    let cluster = start(1).await;
    let node = cluster.real_node().expect("a real node");
    let image = node
        .images()
        .reference(images::TEST_DRIVER)
        .expect("driver image")
        .to_string();

    // The real node registered next to the kwok one.
    let nodes = cluster.kubectl_ok(["get", "nodes"]).await.expect("nodes");
    assert!(
        nodes.contains(NODE_NAME) && nodes.contains("kwok-node-0"),
        "{nodes}"
    );

    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: smoke
spec:
  nodeName: {NODE_NAME}
  containers:
  - name: driver
    image: {image}
    args: ["--endpoint=/csi/csi.sock", "--nodeid=smoke", "--state-dir=/csi/state"]
    volumeMounts:
    - {{name: csi, mountPath: /csi}}
  volumes:
  - {{name: csi, emptyDir: {{}}}}
"#
    );
    let running = run_pod(&cluster, "smoke", &pod).await;

    // A pod IP from the node's bridge, and a container containerd runs.
    let ip = running
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    assert!(ip.starts_with("10.213.0."), "pod IP {ip}");
    let id = testkit::container_id(&running, "driver").expect("container ID");
    let containers = node.container_ids().expect("ctr containers ls");
    assert!(containers.contains(&id), "{id} not in {containers:?}");

    // kubectl logs reaches the kubelet through the apiserver.
    let logs = cluster
        .kubectl_ok(["logs", "smoke"])
        .await
        .expect("kubectl logs");
    assert!(!logs.trim().is_empty(), "the driver logged nothing");

    let left = cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// What the phases of `install_yaml_and_a_driver_run_for_real` work on: the
/// cluster, an admin client, the driver image and the node's kubelet
/// directory.
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    image: String,
    kubelet_dir: std::path::PathBuf,
}

impl Bed {
    fn node(&self) -> &realnode::RealNode {
        self.cluster.real_node().expect("a real node")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_yaml_and_a_driver_run_for_real() {
    let cluster = start(0).await;
    let node = cluster.real_node().expect("a real node");
    let root = node.layout().root.clone();
    let kubelet_dir = node.layout().kubelet_dir();
    let client = cluster.client().expect("client");
    let image = node
        .images()
        .reference(images::TEST_DRIVER)
        .expect("driver image")
        .to_string();
    let bed = Bed {
        cluster,
        client,
        image,
        kubelet_dir,
    };

    install_yaml_runs_the_operator_with_in_cluster_config(&bed).await;
    let (timeline, node_pod) = a_driver_runs_on_the_real_node(&bed).await;
    the_containers_run_the_rendered_arguments(&bed, &node_pod);
    let registered = the_registrar_registers_and_maintains_csinode(&bed, &node_pod).await;
    a_quiet_minute_writes_neither_csinode_nor_node(&bed).await;
    a_wrong_kubelet_dir_shows_in_status(&bed, &root).await;
    an_upgrade_restarts_the_containers_in_order(&bed, &node_pod, timeline, &registered).await;
    deleting_removes_the_containers_from_containerd(&bed).await;

    let left = bed.cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// `manifests/install.yaml`, unmodified, runs the operator; in-cluster
/// config works: one replica holds the Lease.
async fn install_yaml_runs_the_operator_with_in_cluster_config(bed: &Bed) {
    let cluster = &bed.cluster;
    let install = testkit::workspace_root().join("manifests/install.yaml");
    cluster
        .kubectl_ok(["apply", "--server-side", "-f", &install.to_string_lossy()])
        .await
        .expect("install.yaml applies");
    let rollout = cluster
        .kubectl([
            "-n",
            "csiops-system",
            "rollout",
            "status",
            "deployment/csiops-operator",
            "--timeout=180s",
        ])
        .await
        .expect("kubectl");
    assert!(
        rollout.status.success(),
        "operator Deployment never became ready (its readinessProbe is /readyz): {}\n{}",
        String::from_utf8_lossy(&rollout.stderr),
        cluster.log_tails(40)
    );
    // In-cluster config worked: one replica holds the Lease.
    let holder = testkit::jsonpath(
        cluster,
        &["-n", "csiops-system", "get", "lease", "csiops-operator"],
        "{.spec.holderIdentity}",
    )
    .await
    .expect("operator Lease");
    assert!(holder.starts_with("csiops-operator-"), "holder {holder:?}");
}

/// A CSIDriverDeployment of csi-test-driver reaches Running on the real
/// node, registered; returns the rollout timeline (begun before its install)
/// and the node pod.
async fn a_driver_runs_on_the_real_node(bed: &Bed) -> (Timeline, Pod) {
    let Bed {
        cluster,
        client,
        image,
        kubelet_dir,
    } = bed;
    let timeline = Timeline::start(client, NS);
    testkit::apply_ok(
        cluster,
        "testdriver",
        &driver_yaml(NAME, DRIVER, image, "v0.1.0", kubelet_dir),
    )
    .await;
    let row = testkit::wait_running(cluster, NS, NAME, "v0.1.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", operator_logs_and_tails(cluster)));
    assert_eq!(row["REGISTERED"], "1/1");
    assert_eq!(row["CONTROLLER"], "1/1");

    let node_pod = one_pod(client, &testkit::node_pod_selector(NAME)).await;
    (timeline, node_pod)
}

/// The containers run with exactly the arguments the operator rendered, and
/// only the registrar sees a ServiceAccount token.
fn the_containers_run_the_rendered_arguments(bed: &Bed, node_pod: &Pod) {
    let node = bed.node();
    for c in &node_pod.spec.as_ref().expect("spec").containers {
        let id = testkit::container_id(node_pod, &c.name).expect("container ID");
        let info: serde_json::Value =
            serde_json::from_str(&node.ctr(&["containers", "info", &id]).expect("ctr info"))
                .expect("ctr info is JSON");
        let argv: Vec<String> = info["Spec"]["process"]["args"]
            .as_array()
            .expect("process args")
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        let want = expand_args(c);
        assert!(
            argv.ends_with(&want),
            "container {}: runs {argv:?}, rendered {want:?}",
            c.name
        );
        // Only the registrar sees a ServiceAccount token (read from the
        // OCI spec runc started): the driver gets none.
        let token_mounted = info["Spec"]["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["destination"] == csiops_operator_token_path());
        assert_eq!(
            token_mounted,
            c.name == "node-driver-registrar",
            "container {}: token mounted {token_mounted}",
            c.name
        );
    }
}

/// Our registrar registered with the real kubelet's plugin watcher and,
/// given a node name and RBAC by the operator, maintains CSINode; returns
/// the kubelet log line of the registration.
async fn the_registrar_registers_and_maintains_csinode(bed: &Bed, node_pod: &Pod) -> String {
    let cluster = &bed.cluster;
    let kubelet_log =
        std::fs::read_to_string(cluster.log_dir().join("kubelet.log")).expect("kubelet log");
    let registered = format!("Register new plugin with name: {DRIVER}");
    assert!(
        kubelet_log.contains(&registered),
        "kubelet never registered {DRIVER}"
    );
    // The operator gives it a node name and RBAC: its SelfSubjectAccessReviews
    // pass and it maintains CSINode (upstream-style manifests without RBAC
    // are e2e/tests/registrar_dropin.rs).
    let registrar_log = cluster
        .kubectl_ok([
            "-n",
            NS,
            "logs",
            &node_pod.name_any(),
            "-c",
            "node-driver-registrar",
        ])
        .await
        .expect("registrar log");
    assert!(
        registrar_log.contains("CSINode maintenance is on")
            && !registrar_log.contains("CSINode maintenance is off"),
        "the operator's registrar does not maintain CSINode:\n{registrar_log}"
    );
    registered
}

/// kubelet and the registrar agree on CSINode and the Node: a quiet minute
/// writes neither.
async fn a_quiet_minute_writes_neither_csinode_nor_node(bed: &Bed) {
    let client = &bed.client;
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let rv = |o: Option<String>| o.unwrap_or_default();
    let csinode_before = rv(csinodes
        .get(NODE_NAME)
        .await
        .expect("CSINode")
        .resource_version());
    let node_before = nodes.get(NODE_NAME).await.expect("Node");
    tokio::time::sleep(Duration::from_secs(60)).await;
    let csinode_after = rv(csinodes
        .get(NODE_NAME)
        .await
        .expect("CSINode")
        .resource_version());
    let node_after = nodes.get(NODE_NAME).await.expect("Node");
    assert_eq!(
        csinode_before, csinode_after,
        "CSINode written during a quiet minute"
    );
    assert_eq!(
        node_before.resource_version(),
        node_after.resource_version(),
        "Node written during a quiet minute: {}",
        changed_fields(&node_before, &node_after)
    );
}

/// A driver pointed at a wrong `kubeletDir` shows it in status, and is
/// deleted again.
async fn a_wrong_kubelet_dir_shows_in_status(bed: &Bed, root: &Path) {
    let Bed { cluster, image, .. } = bed;
    let wrong_dir = root.join("wrong-kubelet");
    testkit::apply_ok(
        cluster,
        "wrongdir",
        &driver_yaml(
            "wrongdir",
            "csi-wrong.csiops.dev",
            image,
            "v0.1.0",
            &wrong_dir,
        ),
    )
    .await;
    let unhealthy = wait_for(Duration::from_secs(150), Duration::from_secs(1), || async {
        let v = testkit::jsonpath(
            cluster,
            &["-n", NS, "get", "csidd", "wrongdir"],
            "{.status.unhealthyPods}",
        )
        .await
        .ok()?;
        (v.contains(NODE_NAME) && v.contains("kubeletDir")).then_some(v)
    })
    .await
    .unwrap_or_else(|_| {
        let kubectl = |args: &[&str]| {
            let mut all = vec!["-n", NS];
            all.extend_from_slice(args);
            testkit::kubectl_text(cluster, &all)
        };
        let seen = [
            kubectl(&["get", "csidd", "wrongdir", "-o", "jsonpath={.status}"]),
            kubectl(&["get", "pods", "-o", "wide"]),
            kubectl(&["get", "events"]),
        ]
        .join("\n");
        panic!("wrong kubeletDir never reported\n{seen}")
    });
    println!("wrong kubeletDir: {unhealthy}");
    cluster
        .kubectl_ok(["-n", NS, "delete", "csidd", "wrongdir", "--timeout=120s"])
        .await
        .expect("wrongdir deleted");
}

/// An upgrade restarts the real containers in order: nodes first under the
/// serving controller, then the controller with a surge replica; the
/// upgraded registrar registers again with kubelet.
async fn an_upgrade_restarts_the_containers_in_order(
    bed: &Bed,
    node_pod: &Pod,
    timeline: Timeline,
    registered: &str,
) {
    let Bed {
        cluster,
        client,
        image,
        ..
    } = bed;
    let node = bed.node();
    let next_image = format!("{image}-next");
    // A second tag of the same image (made only now: a new image changes
    // the Node's status, which the quiet minute above must not see).
    node.ctr(&["images", "tag", image, &next_image])
        .expect("ctr images tag");
    let old_uid = node_pod.uid().expect("uid");
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
        .unwrap_or_else(|e| panic!("{e}\n{}", operator_logs_and_tails(cluster)));
    let new_pod = one_pod(client, &testkit::node_pod_selector(NAME)).await;
    assert_ne!(
        new_pod.uid().as_deref(),
        Some(old_uid.as_str()),
        "node pod not replaced"
    );
    let entries = timeline.entries();
    let dump = Timeline::render(&entries);
    let sts = |e: &csiops_e2e::timeline::Entry| e.kind == "StatefulSet";
    let ds = |e: &csiops_e2e::timeline::Entry| e.kind == "DaemonSet";
    // Nodes first, under the serving controller; then the controller with
    // a surge replica: it never stops serving.
    let rolled = Timeline::first(&entries, |e| ds(e) && e.generation > 1)
        .unwrap_or_else(|| panic!("DaemonSet never rolled:\n{dump}"));
    let surged = Timeline::first(&entries, |e| sts(e) && e.desired == 2)
        .unwrap_or_else(|| panic!("controller never got its surge replica:\n{dump}"));
    assert!(
        rolled < surged,
        "the node side rolls before the controller:\n{dump}"
    );
    // From the serving controller before the node roll on (the timeline
    // began before the install, when it had no Ready replica yet).
    let serving = entries[..rolled]
        .iter()
        .rposition(|e| sts(e) && e.ready >= 1)
        .unwrap_or_else(|| panic!("no Ready controller before the upgrade:\n{dump}"));
    assert!(
        entries[serving..]
            .iter()
            .filter(|e| sts(e))
            .all(|e| e.desired >= 1 && e.ready >= 1),
        "the controller stopped serving during the upgrade:\n{dump}"
    );
    let kubelet_log =
        std::fs::read_to_string(cluster.log_dir().join("kubelet.log")).expect("kubelet log");
    assert!(
        kubelet_log.matches(&registered).count() >= 2,
        "the upgraded registrar did not register again with kubelet"
    );
    drop(timeline);
}

/// Deleting the object removes its containers from containerd.
async fn deleting_removes_the_containers_from_containerd(bed: &Bed) {
    let Bed { cluster, image, .. } = bed;
    let node = bed.node();
    cluster
        .kubectl_ok(["-n", NS, "delete", "csidd", NAME, "--timeout=120s"])
        .await
        .expect("delete");
    let sidecar = node
        .images()
        .reference(images::SIDECAR)
        .expect("sidecar image")
        .to_string();
    let gone = wait_for(Duration::from_secs(90), Duration::from_secs(1), || async {
        let listed = node.ctr(&["containers", "ls"]).ok()?;
        let ours = listed
            .lines()
            .filter(|l| l.contains(image.as_str()) || l.contains(&sidecar))
            .count();
        (ours == 0).then_some(())
    })
    .await;
    assert!(
        gone.is_ok(),
        "driver containers still in containerd:\n{}",
        node.ctr(&["containers", "ls"]).unwrap_or_default()
    );
}

/// Where in-cluster clients find the ServiceAccount token.
fn csiops_operator_token_path() -> &'static str {
    "/var/run/secrets/kubernetes.io/serviceaccount"
}

fn driver_yaml(name: &str, driver: &str, image: &str, version: &str, kubelet_dir: &Path) -> String {
    testkit::TestDriverDeployment {
        namespace: NS,
        name,
        driver,
        image,
        version,
        kubelet_dir,
        on_simulated_nodes: false,
    }
    .yaml()
}

/// The top-level JSON paths (two levels deep) whose values differ.
fn changed_fields(a: &Node, b: &Node) -> String {
    let (a, b) = (
        serde_json::to_value(a).unwrap_or_default(),
        serde_json::to_value(b).unwrap_or_default(),
    );
    let mut out = Vec::new();
    for top in ["metadata", "spec", "status"] {
        let (x, y) = (&a[top], &b[top]);
        if let (Some(xo), Some(yo)) = (x.as_object(), y.as_object()) {
            for (k, v) in yo {
                if xo.get(k) != Some(v) {
                    out.push(format!(
                        "{top}.{k}: {} -> {}",
                        xo.get(k).map(|v| v.to_string()).unwrap_or_default(),
                        v
                    ));
                }
            }
        }
    }
    out.join("\n")
}

/// Applies the Pod `yaml` (named `name`, in `default`) and waits until it runs.
async fn run_pod(cluster: &Cluster, name: &str, yaml: &str) -> Pod {
    testkit::apply_ok(cluster, name, yaml).await;
    let pods: Api<Pod> = Api::default_namespaced(cluster.client().expect("client"));
    wait_for(DEADLINE, Duration::from_millis(500), || async {
        let p = pods.get_opt(name).await.ok()??;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await
    .unwrap_or_else(|_| panic!("pod {name} never Running\n{}", cluster.log_tails(30)))
}

/// The one pod matching `selector` in [`NS`].
async fn one_pod(client: &kube::Client, selector: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list pods");
    assert_eq!(list.items.len(), 1, "pods matching {selector}");
    list.items.into_iter().next().expect("one pod")
}

/// A container's args with kubelet's `$(VAR)` expansion of its literal
/// env values and of `spec.nodeName` (the only field reference we render).
fn expand_args(c: &Container) -> Vec<String> {
    let mut vars = BTreeMap::new();
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("spec.nodeName") => NODE_NAME.to_string(),
                _ => continue,
            },
            _ => continue,
        };
        vars.insert(format!("$({})", e.name), value);
    }
    c.args
        .iter()
        .flatten()
        .map(|a| {
            vars.iter()
                .fold(a.clone(), |acc, (k, v)| acc.replace(k.as_str(), v))
        })
        .collect()
}

fn operator_logs_and_tails(cluster: &Cluster) -> String {
    format!(
        "operator log:\n{}\n{}",
        testkit::operator_log(cluster),
        cluster.log_tails(30)
    )
}

/// The test process is SIGKILLed with a pod running on its real node: no
/// destructor runs, the node's processes die with it (PR_SET_PDEATHSIG) and
/// the reaper removes the rest (shim, container, network namespace, mounts,
/// chains, bridge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_test_leaves_nothing_behind() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let mut helper = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "helper_real_node_with_a_pod_and_block",
            "--nocapture",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("helper starts");
    let stdout = helper.stdout.take().expect("stdout");
    let reported = tokio::task::spawn_blocking(move || {
        let (mut root, mut netns, mut kubelet_dir) = (None, None, None);
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            if let Some(r) = line.strip_prefix("HELPER_NODE ") {
                root = Some(std::path::PathBuf::from(r));
            } else if let Some(b) = line.strip_prefix("HELPER_NETNS ") {
                netns = Some(
                    b.split(',')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect(),
                );
            } else if let Some(b) = line.strip_prefix("HELPER_VAR_LIB_KUBELET ") {
                kubelet_dir = Some(b == "true");
            } else if line == "HELPER_READY" {
                let before =
                    netns
                        .zip(kubelet_dir)
                        .map(|(netns, var_lib_kubelet)| realnode::HostBefore {
                            netns,
                            var_lib_kubelet,
                        });
                return root.zip(before);
            }
        }
        None
    })
    .await
    .expect("reader");
    let _ = helper.kill();
    let _ = helper.wait();
    let (root, before) = reported.expect("the helper ran a pod on its real node");

    // The reaper holds the machine lock until it is done; taking it waits
    // for that, and keeps other nodes from starting while we look.
    let _lock = tokio::task::spawn_blocking(realnode::host::NodeLock::acquire)
        .await
        .expect("lock task")
        .expect("machine lock");
    let left = realnode::leftovers(std::slice::from_ref(&root), &before);
    assert!(
        left.is_empty(),
        "left behind by a SIGKILLed test: {left:#?}"
    );
    let cluster_dir = root.parent().expect("cluster dir");
    assert!(
        !cluster_dir.exists(),
        "{} not removed",
        cluster_dir.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of a_killed_test_leaves_nothing_behind"]
async fn helper_real_node_with_a_pod_and_block() {
    let cluster = start(0).await;
    let node = cluster.real_node().expect("a real node");
    println!("HELPER_NODE {}", node.layout().root.display());
    let before = cluster.real_nodes().expect("real nodes").host_before();
    let netns: Vec<&str> = before.netns.iter().map(String::as_str).collect();
    println!("HELPER_NETNS {}", netns.join(","));
    println!("HELPER_VAR_LIB_KUBELET {}", before.var_lib_kubelet);
    let pause = node
        .images()
        .reference(images::PAUSE)
        .expect("pause")
        .to_string();
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  nodeName: {NODE_NAME}\n  containers:\n  - name: p\n    image: {pause}\n"
    );
    run_pod(&cluster, "p", &pod).await;
    println!("HELPER_READY");
    futures::future::pending::<()>().await;
}
