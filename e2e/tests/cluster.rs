//! Smoke test of the test bed itself: one real cluster, checked step by step
//! (one test function, so there is exactly one cluster per test binary and
//! its teardown can be asserted).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use csiops_e2e::{k8s_version, pid_alive, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;

const NODES: usize = 3;
const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(250);

#[tokio::test(flavor = "multi_thread")]
async fn cluster_runs_workloads_on_kwok_nodes_and_stops_cleanly() {
    let t0 = Instant::now();
    let cluster = Cluster::start(ClusterOptions::kwok(NODES))
        .await
        .expect("cluster start");
    eprintln!(
        "cluster ready in {:?} at {}",
        cluster.startup_time(),
        cluster.api_url()
    );
    let client = cluster.client().unwrap();

    server_version_is_pinned(&cluster).await;
    nodes_are_ready(&client, &cluster).await;
    daemonset_runs_on_every_node(&client, &cluster).await;
    statefulset_scales_to_zero(&client).await;

    let pids = cluster.pids();
    assert_eq!(
        pids.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok"
        ]
    );
    let dir = cluster.work_dir().to_path_buf();
    let t_stop = Instant::now();
    cluster.stop().await.expect("stop");
    eprintln!("cluster stopped in {:?}", t_stop.elapsed());
    for (name, pid) in pids {
        assert!(!pid_alive(pid), "{name} (pid {pid}) outlived stop()");
    }
    if std::env::var_os("CSIOPS_E2E_KEEP").is_none() {
        assert!(!dir.exists(), "{} not removed", dir.display());
    }
    eprintln!("test wall time {:?}", t0.elapsed());
}

async fn server_version_is_pinned(cluster: &Cluster) {
    let out = cluster
        .kubectl_ok(["version", "-o", "json"])
        .await
        .expect("kubectl version");
    let v: serde_json::Value = serde_json::from_str(&out).expect("kubectl version json");
    let server = v["serverVersion"]["gitVersion"]
        .as_str()
        .expect("serverVersion");
    assert_eq!(server, k8s_version().unwrap());
}

async fn nodes_are_ready(client: &Client, cluster: &Cluster) {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default().labels("type=kwok"))
        .await
        .unwrap();
    let names: Vec<_> = list
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert_eq!(names, cluster.node_names());
    assert_eq!(names.len(), NODES);
    assert!(list.items.iter().all(csiops_e2e::kwok::node_ready));
}

fn running_and_ready(p: &Pod) -> bool {
    let Some(s) = &p.status else { return false };
    s.phase.as_deref() == Some("Running")
        && s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Proves the DaemonSet controller (kube-controller-manager), the scheduler
/// (which binds DaemonSet pods via their node affinity) and kwok's pod-ready
/// stage on every node.
async fn daemonset_runs_on_every_node(client: &Client, cluster: &Cluster) {
    let ds: DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "smoke"},
        "spec": {
            "selector": {"matchLabels": {"app": "smoke"}},
            "template": {
                "metadata": {"labels": {"app": "smoke"}},
                "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}
            }
        }
    }))
    .unwrap();
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &ds).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let want: BTreeSet<String> = cluster.node_names().iter().cloned().collect();
    let lp = ListParams::default().labels("app=smoke");
    let on_nodes = wait_for(WAIT, POLL, || async {
        let list = pods.list(&lp).await.ok()?;
        let nodes: BTreeSet<String> = list
            .items
            .iter()
            .filter(|p| running_and_ready(p))
            .filter_map(|p| p.spec.as_ref()?.node_name.clone())
            .collect();
        (list.items.len() == NODES && nodes == want).then_some(nodes)
    })
    .await
    .unwrap_or_else(|_| panic!("DaemonSet pods not Running+Ready on {want:?}"));
    assert_eq!(on_nodes, want);

    wait_for(WAIT, POLL, || async {
        let s = api.get_status("smoke").await.ok()?.status?;
        (s.number_ready == NODES as i32).then_some(())
    })
    .await
    .expect("DaemonSet status numberReady");
}

/// Proves the scheduler (StatefulSet pods have no nodeName until bound), the
/// StatefulSet controller, and kwok's pod-delete stage (no kubelet to finish
/// the graceful deletion).
async fn statefulset_scales_to_zero(client: &Client) {
    let sts: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}
            }
        }
    }))
    .unwrap();
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &sts).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().labels("app=web");
    wait_for(WAIT, POLL, || async {
        let list = pods.list(&lp).await.ok()?;
        let ready = list
            .items
            .iter()
            .filter(|p| {
                running_and_ready(p) && p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
            })
            .count();
        (ready == 2).then_some(())
    })
    .await
    .expect("StatefulSet pods web-0, web-1 Running+Ready");

    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    wait_for(WAIT, POLL, || async {
        let list = pods.list(&lp).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await
    .expect("StatefulSet pods gone after scaling to 0");

    // Foreground deletion exercises the garbage collector.
    api.delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    wait_for(WAIT, POLL, || async {
        api.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await
    .expect("StatefulSet deleted (garbage collector)");
}
