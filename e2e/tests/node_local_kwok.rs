//! A node-local driver (`spec.topology: NodeLocal`) on kwok nodes:
//! provisioning lands on the selected node only.
//!
//! The operator deploys csi-test-driver `--node-local` with capacity on
//! three kwok nodes. kwok pods run nothing, so each node's pod is played by
//! local processes (`NodeLocalSideSim`): a `csi-test-driver --node-local`
//! with the node's own state dir, the registrar, and the provisioner with
//! exactly the arguments and environment the operator rendered into the pod
//! (`--node-deployment`, `NODE_NAME`, …; only its socket, HTTP port and
//! kubeconfig are local). Claims of a WaitForFirstConsumer class, each
//! scheduled to another node, get a PV whose node affinity is their node,
//! made by that node's driver and no other; each node publishes its own
//! CSIStorageCapacity, owned by its pod; deleting the claims deletes each
//! volume on its node, and deleting the object leaves nothing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use csiops_e2e::node_local::{NodeLocalSideConfig, NodeLocalSideSim};
use csiops_e2e::testdriver::config::DEFAULT_TOPOLOGY_KEY;
use csiops_e2e::testdriver::harness::test_driver_bin;
use csiops_e2e::testdriver::load_state;
use csiops_e2e::testkit::DriverCr;
use csiops_e2e::{
    operator_bin, sidecar_bin, testkit, wait_for, Cluster, ClusterOptions, OperatorProcess,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::json;

const NS: &str = "csi-nodelocal";
const NAME: &str = "nodelocal";
const DRIVER: &str = "nodelocal.csiops.dev";
const CLASS: &str = "nodelocal";
const NODES: usize = 3;
const DEADLINE: Duration = Duration::from_secs(120);

fn object() -> String {
    DriverCr::new(NS, NAME, DRIVER, "v0.1.0")
        .topology("NodeLocal")
        // kwok runs no container; the node side plays it (see the module docs).
        .image("example.invalid/csi-test-driver:v0")
        .driver_args([
            format!("--drivername={DRIVER}"),
            "--endpoint=$(CSI_ENDPOINT)".into(),
            "--nodeid=$(KUBE_NODE_NAME)".into(),
            "--node-local".into(),
            "--state-dir=/csi-data/state".into(),
        ])
        .with(
            "sidecars.provisioner.extraArgs",
            json!([
                "--retry-interval-start=200ms",
                "--capacity-poll-interval=2s"
            ]),
        )
        .with("csiDriver.attachRequired", false)
        .with("csiDriver.storageCapacity", true)
        .with(
            "storageClasses",
            json!([{"name": CLASS, "volumeBindingMode": "WaitForFirstConsumer"}]),
        )
        .yaml()
}

fn claim(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": CLASS,
            "resources": {"requests": {"storage": "1Gi"}}
        }
    }))
    .expect("claim")
}

/// What the phases work on: the cluster, an admin client, the node side's
/// processes, the node names, and the APIs of claims, PVs and capacities.
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    sim: NodeLocalSideSim,
    nodes: Vec<String>,
    pvcs: Api<PersistentVolumeClaim>,
    pv_api: Api<PersistentVolume>,
    capacities: Api<CSIStorageCapacity>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_lands_on_the_selected_node_only() {
    let started = Instant::now();
    let cluster = Cluster::start(ClusterOptions::kwok(NODES))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    testkit::install_crd(&cluster).await.expect("CRD installs");
    let mut operator = cluster
        .run_operator(&operator_bin().expect("operator built"))
        .expect("operator starts");
    let sim = NodeLocalSideSim::spawn(
        client.clone(),
        NodeLocalSideConfig {
            kubeconfig: cluster.kubeconfig_path().to_path_buf(),
            sidecar: sidecar_bin().expect("csiops-sidecar built"),
            test_driver: test_driver_bin().expect("csi-test-driver built"),
            dir: cluster.work_dir().join("nl"),
            namespace: NS.into(),
            pod_selector: testkit::node_pod_selector(NAME),
            driver: DRIVER.into(),
            driver_args: vec!["--capacity=10Gi".into()],
        },
    );
    let nodes: Vec<String> = cluster.node_names().iter().map(|n| n.to_string()).collect();
    assert_eq!(nodes.len(), NODES);

    let bed = Bed {
        pvcs: Api::namespaced(client.clone(), NS),
        pv_api: Api::all(client.clone()),
        capacities: Api::namespaced(client.clone(), NS),
        cluster,
        client,
        sim,
        nodes,
    };

    it_runs_without_a_controller(&bed, &operator).await;
    each_node_publishes_its_own_capacity(&bed).await;
    let (wanted, bound) = claims_scheduled_to_different_nodes_bind(&bed).await;
    each_volume_is_made_by_its_nodes_driver_only(&bed, &wanted, &bound).await;
    deleting_the_claims_deletes_each_volume_on_its_node(&bed, &wanted).await;
    deleting_the_object_leaves_nothing(&bed).await;
    operator.check_running().expect("operator still running");
    let Bed { cluster, sim, .. } = bed;
    sim.stop().await;
    drop(sim);
    cluster.stop().await.expect("cluster stops");
    println!(
        "node-local on kwok nodes: {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

/// The object runs with no controller (none exists) and a DaemonSet whose
/// provisioner has `--node-deployment`; `-o wide` says NodeLocal.
async fn it_runs_without_a_controller(bed: &Bed, operator: &OperatorProcess) {
    let Bed {
        cluster, client, ..
    } = bed;
    testkit::apply_ok(cluster, "nodelocal", &object()).await;
    let row = testkit::wait_running(cluster, NS, NAME, "v0.1.0", NODES, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(40)));
    // No controller: `kubectl get csidd` says so, and none exists.
    assert_eq!(row["CONTROLLER"], "-", "{row:?}");
    assert!(Api::<StatefulSet>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty());
    assert!(Api::<Deployment>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty());
    let ds = Api::<DaemonSet>::namespaced(client.clone(), NS)
        .get(&format!("{NAME}-node"))
        .await
        .expect("DaemonSet");
    let template = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod template");
    assert!(template
        .containers
        .iter()
        .any(|c| c.name == "csi-provisioner"
            && c.args.iter().flatten().any(|a| a == "--node-deployment")));
    let wide = cluster
        .kubectl_ok(["-n", NS, "get", "csidd", "-o", "wide"])
        .await
        .expect("wide");
    println!("{wide}");
    assert!(wide.contains("NodeLocal"), "{wide}");
}

/// Each node publishes its own capacity, owned by its pod.
async fn each_node_publishes_its_own_capacity(bed: &Bed) {
    let Bed {
        cluster,
        client,
        sim,
        nodes,
        capacities,
        ..
    } = bed;
    // Each node publishes its own capacity, owned by its pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let node_pods: BTreeMap<String, String> = pods
        .list(&ListParams::default().labels(&testkit::node_pod_selector(NAME)))
        .await
        .expect("node pods")
        .items
        .iter()
        .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p.name_any())))
        .collect();
    assert_eq!(node_pods.len(), NODES);
    let published = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let list = capacities.list(&ListParams::default()).await.ok()?;
        let mut by_node = BTreeMap::new();
        for c in &list.items {
            let node = c
                .node_topology
                .as_ref()?
                .match_labels
                .as_ref()?
                .get(DEFAULT_TOPOLOGY_KEY)?
                .clone();
            let owner = c.owner_references().first()?;
            by_node.insert(node, (owner.kind.clone(), owner.name.clone()));
        }
        (by_node.len() == NODES).then_some(by_node)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "not one CSIStorageCapacity per node:\n{}\n{}",
            testkit::kubectl_text(
                cluster,
                &["-n", NS, "get", "csistoragecapacities", "-o", "yaml"]
            ),
            provisioner_logs(sim, nodes)
        )
    });
    for (node, (kind, owner)) in &published {
        assert_eq!(kind, "Pod", "{node}");
        assert_eq!(Some(owner), node_pods.get(node), "{node}");
    }
}

/// Two claims per node, each with its node selected, bind; returns each
/// claim's node and its PV.
async fn claims_scheduled_to_different_nodes_bind(
    bed: &Bed,
) -> (BTreeMap<String, String>, BTreeMap<String, PersistentVolume>) {
    let Bed {
        cluster,
        sim,
        nodes,
        pvcs,
        pv_api,
        ..
    } = bed;
    // --- claims scheduled to different nodes ----------------------------------
    let mut wanted = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for j in 0..2 {
            let name = format!("claim-{i}-{j}");
            pvcs.create(&PostParams::default(), &claim(&name))
                .await
                .expect("claim created");
            // What the scheduler writes when it places the claim's pod.
            let patch = serde_json::json!({"metadata": {"annotations": {
                "volume.kubernetes.io/selected-node": node
            }}});
            pvcs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("selected-node set");
            wanted.insert(name, node.clone());
        }
    }
    let bound = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let mut out = BTreeMap::new();
        for name in wanted.keys() {
            let pv = pvcs.get(name).await.ok()?.spec?.volume_name?;
            out.insert(name.clone(), pv_api.get(&pv).await.ok()?);
        }
        Some(out)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "claims not all bound:\n{}\n{}",
            testkit::kubectl_text(cluster, &["-n", NS, "describe", "pvc"]),
            provisioner_logs(sim, nodes)
        )
    });
    (wanted, bound)
}

/// Each PV's node affinity is its claim's node, its volume was made by that
/// node's driver and no other, and each node has its own intent journal.
async fn each_volume_is_made_by_its_nodes_driver_only(
    bed: &Bed,
    wanted: &BTreeMap<String, String>,
    bound: &BTreeMap<String, PersistentVolume>,
) {
    let Bed {
        cluster,
        sim,
        nodes,
        ..
    } = bed;
    let states: BTreeMap<String, _> = nodes
        .iter()
        .map(|n| {
            let s = load_state(&sim.config().state_dir(n)).expect("node state");
            (n.clone(), s)
        })
        .collect();
    for (claim_name, pv) in bound {
        let node = &wanted[claim_name];
        let spec = pv.spec.as_ref().expect("PV spec");
        let handle = spec
            .csi
            .as_ref()
            .map(|c| c.volume_handle.clone())
            .expect("CSI PV");
        // Node affinity: exactly its node's segment.
        let terms = spec
            .node_affinity
            .as_ref()
            .and_then(|a| a.required.as_ref())
            .map(|r| r.node_selector_terms.clone())
            .unwrap_or_default();
        let affinity: Vec<(String, Vec<String>)> = terms
            .iter()
            .flat_map(|t| t.match_expressions.iter().flatten())
            .map(|e| (e.key.clone(), e.values.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            affinity,
            [(DEFAULT_TOPOLOGY_KEY.to_string(), vec![node.clone()])],
            "{claim_name}"
        );
        // Made by its node's driver, known to no other.
        for (n, state) in &states {
            assert_eq!(
                state.volumes.contains_key(&handle),
                n == node,
                "{claim_name}: volume {handle} in the state of {n}"
            );
        }
    }
    for (n, state) in &states {
        let mine = wanted.values().filter(|w| *w == n).count();
        assert_eq!(state.volumes.len(), mine, "volumes of {n}: {state:?}");
    }
    // Each node's intent journal is its own.
    let journals = cluster
        .kubectl_ok([
            "-n",
            NS,
            "get",
            "configmaps",
            "-l",
            "csiops.dev/provisioning-journal",
            "-o",
            "name",
        ])
        .await
        .expect("journals");
    for n in nodes {
        assert!(
            journals.contains(n.as_str()),
            "no journal of {n}: {journals}"
        );
    }
}

/// Deleting the claims deletes each volume on its own node, and every PV.
async fn deleting_the_claims_deletes_each_volume_on_its_node(
    bed: &Bed,
    wanted: &BTreeMap<String, String>,
) {
    let Bed {
        cluster,
        sim,
        nodes,
        pvcs,
        pv_api,
        ..
    } = bed;
    // --- deleting the claims deletes each volume on its own node ---------------
    for name in wanted.keys() {
        pvcs.delete(name, &Default::default())
            .await
            .expect("claim deleted");
    }
    let gone = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let left = pv_api.list(&ListParams::default()).await.ok()?.items.len();
        let volumes: usize = nodes
            .iter()
            .map(|n| {
                load_state(&sim.config().state_dir(n))
                    .map(|s| s.volumes.len())
                    .unwrap_or(usize::MAX)
            })
            .sum();
        (left == 0 && volumes == 0).then_some(())
    })
    .await;
    assert!(
        gone.is_ok(),
        "PVs or volumes left:\n{}\n{}",
        testkit::kubectl_text(cluster, &["get", "pv"]),
        provisioner_logs(sim, nodes)
    );
}

/// Deleting the object leaves nothing of the driver, in its namespace or
/// cluster-wide.
async fn deleting_the_object_leaves_nothing(bed: &Bed) {
    let Bed {
        cluster,
        client,
        capacities,
        ..
    } = bed;
    // --- delete: nothing of the driver is left -------------------------------
    cluster
        .kubectl_ok(["-n", NS, "delete", "csidd", NAME, "--timeout=120s"])
        .await
        .expect("delete");
    let clean = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let ds = Api::<DaemonSet>::namespaced(client.clone(), NS)
            .list(&ListParams::default())
            .await
            .ok()?;
        let caps = capacities.list(&ListParams::default()).await.ok()?;
        let roles = cluster
            .kubectl([
                "-n",
                NS,
                "get",
                "roles,rolebindings,serviceaccounts",
                "-o",
                "name",
            ])
            .await
            .ok()?;
        let names = String::from_utf8_lossy(&roles.stdout).to_string();
        (ds.items.is_empty() && caps.items.is_empty() && !names.contains(NAME)).then_some(())
    })
    .await;
    assert!(
        clean.is_ok(),
        "left after delete:\n{}",
        testkit::kubectl_text(
            cluster,
            &[
                "-n",
                NS,
                "get",
                "all,csistoragecapacities,roles,rolebindings,serviceaccounts"
            ]
        )
    );
    let cluster_roles = cluster
        .kubectl_ok([
            "get",
            "clusterroles,clusterrolebindings,csidrivers,storageclasses",
            "-o",
            "name",
        ])
        .await
        .expect("cluster objects");
    assert!(
        !cluster_roles.contains(DRIVER) && !cluster_roles.contains(CLASS),
        "{cluster_roles}"
    );
}

fn provisioner_logs(sim: &NodeLocalSideSim, nodes: &[String]) -> String {
    nodes
        .iter()
        .map(|n| {
            let log = std::fs::read_to_string(sim.config().provisioner_log(n)).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            format!(
                "--- provisioner of {n}:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
