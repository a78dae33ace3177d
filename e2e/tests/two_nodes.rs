//! Two real nodes joined to one control plane: node 0 in the host's network
//! namespace, node 1 (`csiops-node-1`) in its own, with its own containerd,
//! kubelet root dir, CNI bridge and pod subnet (see `realnode::config`).
//!
//! - Both Nodes register and are Ready with their own InternalIP, no kwok
//!   Node exists, and each node's pods get addresses from its own subnet.
//! - A pod on node 1 reaches the apiserver through the `kubernetes` Service
//!   with its ServiceAccount (agnhost `inclusterclient`: TLS, token, the
//!   Service's DNAT by node 1's kube-proxy), and a server pod on node 0;
//!   a pod on node 0 reaches a server pod on node 1.
//! - `kubectl logs` reaches node 1's kubelet.
//! - Stopping the cluster leaves nothing of either node on the host: no
//!   process, mount, network namespace, veth, bridge or iptables chain.
//!
//! Needs root, `make node-prereqs` and the storage e2e suite's images
//! (`e2e/cluster-bins/e2e-suite.sh`, `CSIOPS_E2E_SUITE`).

use std::time::Duration;

use csiops_e2e::conformance::Suite;
use csiops_e2e::realnode::{node_name, NODE_NAME};
use csiops_e2e::{wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

const DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_real_node_joins_and_routes_to_the_apiserver_and_the_first() {
    let suite = Suite::resolve().expect("the storage e2e suite (e2e-suite.sh)");
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        real_node_count: 2,
        extra_images: suite.image_archives(),
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with two real nodes starts: {e}"));
    let client = cluster.client().expect("client");
    let second = node_name(1);
    both_nodes_register_with_their_own_address(&client, &second).await;

    let agnhost = suite.image("agnhost").expect("agnhost image").to_string();
    let (ip0, ip1) = server_pods_get_addresses_of_their_nodes(&cluster, &agnhost, &second).await;
    pods_reach_the_apiserver_and_each_other_across_nodes(&cluster, &agnhost, &second, &ip0, &ip1)
        .await;
    in_cluster_config_works_through_the_kubernetes_service(&cluster, &agnhost, &second).await;

    let left = cluster.stop_and_report().await.expect("stop");
    assert!(left.is_empty(), "the two nodes left behind: {left:#?}");
}

/// Two Nodes, both ours, each with its own address.
async fn both_nodes_register_with_their_own_address(client: &kube::Client, second: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default()).await.expect("nodes");
    let mut ips: Vec<(String, String)> = list
        .items
        .iter()
        .map(|n| {
            let ip = n
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
                .map(|a| a.address.clone())
                .unwrap_or_default();
            (n.metadata.name.clone().unwrap_or_default(), ip)
        })
        .collect();
    ips.sort();
    assert_eq!(
        ips,
        [
            (NODE_NAME.to_string(), "10.213.0.1".to_string()),
            (second.to_string(), "10.213.101.2".to_string()),
        ],
        "the Nodes and their InternalIPs"
    );
}

/// A server pod on each node, addressed from that node's pod subnet. Their
/// IPs.
async fn server_pods_get_addresses_of_their_nodes(
    cluster: &Cluster,
    agnhost: &str,
    second: &str,
) -> (String, String) {
    let server = |name: &str, node: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: netexec
    image: {agnhost}
    args: ["netexec", "--http-port=8080"]
    readinessProbe:
      httpGet: {{path: /healthz, port: 8080}}
      periodSeconds: 1
"#
        )
    };
    apply(cluster, &server("server-0", NODE_NAME)).await;
    apply(cluster, &server("server-1", second)).await;
    let s0 = ready_pod(cluster, "server-0").await;
    let s1 = ready_pod(cluster, "server-1").await;
    let ip0 = pod_ip(&s0);
    let ip1 = pod_ip(&s1);
    assert!(ip0.starts_with("10.213.0."), "node 0's pod IP {ip0}");
    assert!(ip1.starts_with("10.213.1."), "node 1's pod IP {ip1}");
    (ip0, ip1)
}

/// node 1 → the apiserver (Service, TLS, token) and node 0's pod; node 0 →
/// node 1's pod; `kubectl logs` reaches node 1's kubelet.
async fn pods_reach_the_apiserver_and_each_other_across_nodes(
    cluster: &Cluster,
    agnhost: &str,
    second: &str,
    ip0: &str,
    ip1: &str,
) {
    // node 1 → the apiserver (Service, TLS, token) and node 0's pod;
    // node 0 → node 1's pod. `agnhost connect` fails on a refused or
    // timed-out connection.
    let client_pod = |name: &str, node: &str, script: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeName: {node}
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {agnhost}
    command: ["sh", "-c", {script:?}]
"#
        )
    };
    apply(
        cluster,
        &client_pod(
            "from-1",
            second,
            &format!(
                "/agnhost connect --timeout=5s 10.96.0.1:443 && \
                 /agnhost connect --timeout=5s {ip0}:8080 && echo reached-both"
            ),
        ),
    )
    .await;
    apply(
        cluster,
        &client_pod(
            "from-0",
            NODE_NAME,
            &format!("/agnhost connect --timeout=5s {ip1}:8080 && echo reached-node-1"),
        ),
    )
    .await;
    succeeded(cluster, "from-1").await;
    succeeded(cluster, "from-0").await;
    // `kubectl logs` goes apiserver → node 1's kubelet → its containerd.
    let logs = cluster
        .kubectl_ok(["logs", "from-1"])
        .await
        .expect("logs of a node-1 pod");
    assert!(logs.contains("reached-both"), "{logs}");
}

/// In-cluster config through the `kubernetes` Service: /healthz polled
/// every second with the pod's token, never failing.
async fn in_cluster_config_works_through_the_kubernetes_service(
    cluster: &Cluster,
    agnhost: &str,
    second: &str,
) {
    apply(
        cluster,
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: incluster
spec:
  nodeName: {second}
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {agnhost}
    args: ["inclusterclient", "--poll-interval=1"]
"#
        ),
    )
    .await;
    let logs = wait_for(DEADLINE, Duration::from_secs(1), || async {
        let out = cluster.kubectl(["logs", "incluster"]).await.ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (text.matches("calling /healthz").count() >= 3).then_some(text)
    })
    .await
    .expect("inclusterclient polled /healthz three times");
    assert!(
        !logs.contains("status=failed") && logs.contains("authz_header="),
        "{logs}"
    );
}

async fn apply(cluster: &Cluster, yaml: &str) {
    let file = cluster
        .work_dir()
        .join(format!("manifest-{}.yaml", rand_suffix()));
    std::fs::write(&file, yaml).expect("write manifest");
    cluster
        .kubectl_ok(["apply", "-f", &file.to_string_lossy()])
        .await
        .unwrap_or_else(|e| panic!("apply {yaml}: {e}"));
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

async fn ready_pod(cluster: &Cluster, name: &str) -> Pod {
    let pods: Api<Pod> = Api::default_namespaced(cluster.client().expect("client"));
    let found = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let p = pods.get_opt(name).await.ok()??;
        let ready = p
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(p)
    })
    .await;
    match found {
        Ok(p) => p,
        Err(_) => panic!("pod {name} never Ready: {}", describe(cluster, name).await),
    }
}

async fn succeeded(cluster: &Cluster, name: &str) {
    let pods: Api<Pod> = Api::default_namespaced(cluster.client().expect("client"));
    let phase = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let p = pods.get_opt(name).await.ok()??;
        let phase = p.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await;
    let logs = cluster
        .kubectl(["logs", name])
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert_eq!(
        phase.as_deref().ok(),
        Some("Succeeded"),
        "pod {name}: {logs}\n{}",
        describe(cluster, name).await
    );
}

fn pod_ip(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

async fn describe(cluster: &Cluster, name: &str) -> String {
    cluster
        .kubectl(["describe", "pod", name])
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The test process is SIGKILLed with a pod running on each node: no
/// destructor runs, every node process dies with it (PR_SET_PDEATHSIG), and
/// the one watchdog reaper removes the rest of both nodes: shims and
/// containers, the pods' network namespaces, node 1's network and mount
/// namespaces and veth pair, mounts, chains, the bridge, the cluster dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_test_leaves_nothing_of_either_node() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let mut helper = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "helper_two_nodes_with_a_pod_each",
            "--nocapture",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("helper starts");
    let stdout = helper.stdout.take().expect("stdout");
    let reported = tokio::task::spawn_blocking(move || {
        let (mut roots, mut netns, mut var_lib_kubelet) = (Vec::new(), None, None);
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            if let Some(r) = line.strip_prefix("HELPER_NODE ") {
                roots.push(std::path::PathBuf::from(r));
            } else if let Some(b) = line.strip_prefix("HELPER_NETNS ") {
                netns = Some(
                    b.split(',')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect(),
                );
            } else if let Some(b) = line.strip_prefix("HELPER_VAR_LIB_KUBELET ") {
                var_lib_kubelet = Some(b == "true");
            } else if line == "HELPER_READY" {
                let before = netns.zip(var_lib_kubelet).map(|(netns, var_lib_kubelet)| {
                    csiops_e2e::realnode::HostBefore {
                        netns,
                        var_lib_kubelet,
                    }
                });
                return before.map(|b| (roots, b));
            }
        }
        None
    })
    .await
    .expect("reader");
    let _ = helper.kill();
    let _ = helper.wait();
    let (roots, before) = reported.expect("the helper ran a pod on each of its nodes");
    assert_eq!(roots.len(), 2, "{roots:?}");

    // The reaper holds the machine lock until it is done.
    let _lock = tokio::task::spawn_blocking(csiops_e2e::realnode::host::NodeLock::acquire)
        .await
        .expect("lock task")
        .expect("machine lock");
    let left = csiops_e2e::realnode::leftovers(&roots, &before);
    assert!(
        left.is_empty(),
        "left behind by a SIGKILLed test: {left:#?}"
    );
    let cluster_dir = roots[0].parent().expect("cluster dir");
    assert!(
        !cluster_dir.exists(),
        "{} not removed",
        cluster_dir.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "helper process of a_killed_test_leaves_nothing_of_either_node"]
async fn helper_two_nodes_with_a_pod_each() {
    let suite = Suite::resolve().expect("the storage e2e suite (e2e-suite.sh)");
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        real_node_count: 2,
        extra_images: suite.image_archives(),
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with two real nodes starts: {e}"));
    let nodes = cluster.real_nodes().expect("real nodes");
    for n in nodes.nodes() {
        println!("HELPER_NODE {}", n.layout().root.display());
    }
    let before = nodes.host_before();
    let netns: Vec<&str> = before.netns.iter().map(String::as_str).collect();
    println!("HELPER_NETNS {}", netns.join(","));
    println!("HELPER_VAR_LIB_KUBELET {}", before.var_lib_kubelet);
    let busybox = suite.image("busybox").expect("busybox").to_string();
    for (i, name) in [NODE_NAME.to_string(), node_name(1)].iter().enumerate() {
        apply(
            &cluster,
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\nspec:\n  nodeName: {name}\n  containers:\n  - name: p\n    image: {busybox}\n    command: [sleep, '3600']\n"
            ),
        )
        .await;
        ready_pod(&cluster, &format!("p{i}")).await;
    }
    println!("HELPER_READY");
    futures::future::pending::<()>().await;
}
