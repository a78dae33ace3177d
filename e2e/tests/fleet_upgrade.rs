//! An upgrade on a 201-node cluster (200 kwok nodes and the real node)
//! that loses 10% of its nodes in the middle of the node roll.
//!
//! The operator runs from `manifests/install.yaml`; csi-test-driver runs
//! for real on the real node (its controller StatefulSet and its node pod)
//! and is played by kwok on the simulated nodes, whose CSINodes the test
//! writes as their kubelets would. The CR is edited to a new version; once
//! the node roll is under way, 20 simulated nodes stop reporting (their
//! Leases are taken, see `kwok::lose_node`). Proved:
//!
//! - the upgrade completes: lost nodes hold nothing back;
//! - sampled every second, the controller StatefulSet never has 0 Ready
//!   replicas (the default `NonDisruptive` strategy);
//! - a claim created during the node roll is Bound (the old controller
//!   provisions meanwhile);
//! - the lost nodes are named in status (and `kubectl get csidd -o wide`),
//!   and turn the object Degraded (`NodesLost`) after `stepTimeoutSeconds`;
//! - no count exceeds what it counts;
//! - when the nodes come back, they get the new node pod, and the object is
//!   Running again.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csiops_e2e::realnode::images;
use csiops_e2e::walkthrough::{self, App, Use, VolumeDriver, DRIVER, NAME, NS};
use csiops_e2e::{kwok, testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

const SIMULATED: usize = 200;
const LOST: usize = SIMULATED / 10;
const STEP_TIMEOUT: u64 = 90;
const DEADLINE: Duration = Duration::from_secs(600);

/// What the sampler saw of the controller, once a second.
#[derive(Default)]
struct Samples {
    ready: Vec<(Duration, i32)>,
}

/// The object as the API server has it.
async fn csidd(cluster: &Cluster) -> Value {
    let out = cluster
        .kubectl_ok(["-n", NS, "get", "csidd", NAME, "-o", "json"])
        .await
        .expect("kubectl get csidd");
    serde_json::from_str(&out).expect("JSON")
}

fn status_str<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut v = &obj["status"];
    for p in path {
        v = &v[*p];
    }
    v.as_str()
}

/// The CSINode each simulated node's kubelet would write once our
/// registrar registered there (kwok runs no kubelet).
fn simulated_csinode(node: &str) -> CSINode {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": node}]},
    }))
    .expect("a CSINode")
}

/// What the phases work on: the cluster, an admin client, the driver's
/// image and host directories on the real node, and the node DaemonSets.
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    image: String,
    kubelet_dir: std::path::PathBuf,
    data_dir: std::path::PathBuf,
    node_fields: [(&'static str, Value); 1],
    ds_api: Api<DaemonSet>,
}

impl Bed {
    /// The driver object at `version`.
    fn driver(&self, version: &'static str) -> VolumeDriver<'_> {
        VolumeDriver {
            image: &self.image,
            version,
            kubelet_dir: &self.kubelet_dir,
            data_dir: &self.data_dir,
            on_simulated_nodes: true,
            controller_args: &[],
            node_args: &[],
            node_fields: &self.node_fields,
        }
    }
}

/// What the sampler saw, the flag that stops it, and the sampler.
type Sampler = (
    Arc<Mutex<Samples>>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<()>,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_losing_a_tenth_of_its_nodes_completes_and_storage_keeps_serving() {
    let cluster = Cluster::start(ClusterOptions {
        nodes: SIMULATED,
        real_node: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with 200 kwok nodes and a real node starts: {e}"));
    let client = cluster.client().expect("client");
    let node = cluster.real_node().expect("a real node");
    let image = node
        .images()
        .reference(images::TEST_DRIVER)
        .expect("driver image")
        .to_string();
    let kubelet_dir = node.layout().kubelet_dir();
    let data_dir = node.layout().root.join("fleet-data");

    walkthrough::install_operator(&cluster)
        .await
        .expect("operator installs");
    let bed = Bed {
        ds_api: Api::namespaced(client.clone(), NS),
        cluster,
        client,
        image,
        kubelet_dir,
        data_dir,
        // One node pod at a time: the roll of 201 nodes lasts minutes, long
        // enough to lose nodes in the middle of it.
        node_fields: [("maxUnavailable", json!(1))],
    };

    the_simulated_kubelets_csinodes_exist(&bed).await;
    v1_runs_on_every_node_with_a_short_step_deadline(&bed).await;
    let sampler = the_controller_is_sampled_once_a_second(&bed.client);
    let (edited, lost) = nodes_are_lost_during_the_node_roll(&bed).await;
    a_claim_made_during_the_node_roll_is_bound(&bed).await;
    let upgrade_took = the_upgrade_completes_with_the_lost_nodes_lost(&bed, edited).await;
    the_lost_nodes_are_named_and_degrade_the_object(&bed, &lost).await;
    the_controller_always_had_a_ready_replica(sampler, upgrade_took).await;
    the_returned_nodes_get_the_new_node_pod(&bed, &lost).await;
    the_app_and_the_driver_are_deleted(&bed).await;
    let Bed { cluster, .. } = bed;
    let left = cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left behind: {left:#?}");
}

/// The simulated kubelets' CSINodes exist.
async fn the_simulated_kubelets_csinodes_exist(bed: &Bed) {
    let Bed {
        cluster, client, ..
    } = bed;
    // The simulated kubelets' CSINodes.
    let csinodes: Api<CSINode> = Api::all(client.clone());
    for name in cluster.node_names() {
        csinodes
            .create(&PostParams::default(), &simulated_csinode(name))
            .await
            .unwrap_or_else(|e| panic!("CSINode {name}: {e}"));
    }
}

/// v1 runs and registers on all 201 nodes; then a short step deadline is
/// set.
async fn v1_runs_on_every_node_with_a_short_step_deadline(bed: &Bed) {
    let Bed {
        cluster, client, ..
    } = bed;
    // --- v1 on 201 nodes -----------------------------------------------------
    testkit::apply_ok(cluster, "fleet-v1", &bed.driver("v1").yaml()).await;
    let all = SIMULATED + 1;
    let row = testkit::wait_running(cluster, NS, NAME, "v1", all, DEADLINE)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "v1 Running on {all} nodes: {e}\n{}",
                testkit::operator_log(cluster)
            )
        });
    assert_eq!(row["NODES"], format!("{all}/{all}"));
    assert_eq!(row["REGISTERED"], format!("{all}/{all}"));
    // A short step deadline, so lost nodes turn the object Degraded within
    // the test (no change of the workloads: no rollout).
    let csidds: Api<csiops_crds::CSIDriverDeployment> = Api::namespaced(client.clone(), NS);
    csidds
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rollout": {"stepTimeoutSeconds": STEP_TIMEOUT}}})),
        )
        .await
        .expect("step deadline set");
}

/// The controller StatefulSet's Ready replicas, sampled once a second until
/// stopped.
fn the_controller_is_sampled_once_a_second(client: &kube::Client) -> Sampler {
    // --- the controller sampled once a second --------------------------------
    let samples = Arc::new(Mutex::new(Samples::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (samples, stop) = (samples.clone(), stop.clone());
        let sts: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
        let start = Instant::now();
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(s) = sts.get(&format!("{NAME}-controller")).await {
                    let ready = s.status.and_then(|st| st.ready_replicas).unwrap_or(0);
                    if let Ok(mut samples) = samples.lock() {
                        samples.ready.push((start.elapsed(), ready));
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    (samples, stop, sampler)
}

/// The upgrade to v2 starts, and once the node roll is under way a tenth
/// of the simulated nodes are lost; returns when the edit was made and the
/// lost nodes.
async fn nodes_are_lost_during_the_node_roll(bed: &Bed) -> (Instant, BTreeSet<String>) {
    let Bed {
        cluster,
        client,
        ds_api,
        ..
    } = bed;
    // --- the upgrade, and nodes lost during its node roll -----------------------
    let edited = Instant::now();
    testkit::apply_ok(cluster, "fleet-v2", &bed.driver("v2").yaml()).await;
    wait_for(
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let obj = csidd(cluster).await;
            let rolling = status_str(&obj, &["rollout", "step"]) == Some("NodeRoll");
            let ds = ds_api.get(&format!("{NAME}-node")).await.ok()?;
            let updated = ds
                .status
                .and_then(|s| s.updated_number_scheduled)
                .unwrap_or(0);
            (rolling && updated >= 3).then_some(())
        },
    )
    .await
    .expect("the node roll is under way");
    let lost: BTreeSet<String> = (SIMULATED - LOST..SIMULATED).map(kwok::node_name).collect();
    for name in &lost {
        kwok::lose_node(client, name).await.expect("node lost");
    }
    (edited, lost)
}

/// A claim made while the nodes roll, used on the real node, is Bound.
async fn a_claim_made_during_the_node_roll_is_bound(bed: &Bed) {
    let Bed {
        cluster,
        client,
        image,
        ..
    } = bed;
    // A claim made while the nodes roll, used on the real node.
    let obj = csidd(cluster).await;
    assert_eq!(
        status_str(&obj, &["rollout", "step"]),
        Some("NodeRoll"),
        "the claim is made during the node roll"
    );
    let app = App {
        name: "during-roll",
        image,
        text: "written during the node roll",
        access_mode: "ReadWriteOnce",
        usage: Use::Filesystem,
        fs_group: None,
    };
    testkit::apply_ok(cluster, "during-roll", &app.yaml()).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    wait_for(
        Duration::from_secs(180),
        Duration::from_millis(500),
        || async {
            let c = claims.get("during-roll").await.ok()?;
            (c.status?.phase.as_deref() == Some("Bound")).then_some(())
        },
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the claim made during the node roll is never Bound\n{}",
            testkit::operator_log(cluster)
        )
    });
}

/// The upgrade completes with the lost nodes still lost; returns how long
/// it took from the edit.
async fn the_upgrade_completes_with_the_lost_nodes_lost(bed: &Bed, edited: Instant) -> Duration {
    let Bed { cluster, .. } = bed;
    // The upgrade completes with the lost nodes still lost.
    wait_for(DEADLINE, Duration::from_secs(1), || async {
        let obj = csidd(cluster).await;
        let done = status_str(&obj, &["currentVersion"]) == Some("v2")
            && obj["status"]["rollout"].is_null();
        done.then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the upgrade never completed: {}\n{}",
            csidd_brief(cluster),
            testkit::operator_log(cluster)
        )
    });

    edited.elapsed()
}

/// The lost nodes are named, counted once, and make the object Degraded;
/// no count exceeds what it counts, and the driver stays Available.
async fn the_lost_nodes_are_named_and_degrade_the_object(bed: &Bed, lost: &BTreeSet<String>) {
    let Bed { cluster, .. } = bed;
    let all = SIMULATED + 1;
    // The lost nodes are named, counted once, and make the object Degraded
    // once lost for longer than the step deadline. The node lifecycle
    // controller notices each lost node on its own pass, seconds apart, so
    // the message counts all of them only once the last has passed the
    // deadline too: wait for that, not just for the first.
    let all_past_deadline = format!("{LOST} node(s) lost for more than {STEP_TIMEOUT}s");
    let obj = wait_for(Duration::from_secs(240), Duration::from_secs(1), || async {
        let obj = csidd(cluster).await;
        let lost_count = obj["status"]["node"]["lost"].as_i64().unwrap_or(0);
        let degraded = status_str(&obj, &["phase"]) == Some("Degraded");
        let all_named = obj["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Degraded"))
            .and_then(|c| c["message"].as_str())
            .is_some_and(|m| m.starts_with(&all_past_deadline));
        (lost_count == LOST as i64 && degraded && all_named).then_some(obj)
    })
    .await
    .unwrap_or_else(|_| panic!("lost nodes never reported: {}", csidd_brief(cluster)));
    let named: BTreeSet<String> = obj["status"]["lostNodes"]
        .as_array()
        .expect("lostNodes")
        .iter()
        .filter_map(|n| n["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(&named, lost, "status names exactly the lost nodes");
    let degraded = obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Degraded"))
        .cloned()
        .expect("Degraded condition");
    assert_eq!(degraded["reason"], "NodesLost", "{degraded}");
    let counts = &obj["status"]["node"];
    let desired = counts["desired"].as_i64().expect("desired");
    assert_eq!(desired, all as i64, "{counts}");
    for field in ["ready", "updated", "available"] {
        let n = counts[field].as_i64().unwrap_or(0);
        assert_eq!(
            n,
            (all - LOST) as i64,
            "{field} counts the healthy nodes only: {counts}"
        );
    }
    assert_eq!(
        status_str(&obj, &["summary", "registered"]),
        Some(format!("{}/{all}", all - LOST).as_str()),
        "registered never exceeds desired"
    );
    let available = obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
        .cloned()
        .expect("Available condition");
    assert_eq!(
        available["status"], "True",
        "the driver serves: {available}"
    );
    let wide = cluster
        .kubectl_ok(["-n", NS, "get", "csidd", NAME, "-o", "wide"])
        .await
        .expect("kubectl get -o wide");
    assert!(wide.contains(&format!("{LOST} node(s) lost")), "{wide}");
}

/// The sampler ran through the upgrade and the controller never had 0 Ready
/// replicas.
async fn the_controller_always_had_a_ready_replica(sampler: Sampler, upgrade_took: Duration) {
    let all = SIMULATED + 1;
    let (samples, stop, sampler) = sampler;
    stop.store(true, Ordering::SeqCst);
    sampler.await.expect("sampler");
    let samples = std::mem::take(&mut *samples.lock().expect("samples"));
    let never_down = samples.ready.iter().all(|(_, r)| *r >= 1);
    println!(
        "upgrade of {all} nodes with {LOST} lost: {upgrade_took:?}; {} controller samples, fewest Ready replicas {}",
        samples.ready.len(),
        samples.ready.iter().map(|(_, r)| *r).min().unwrap_or(0)
    );
    assert!(
        samples.ready.len() as u64 >= upgrade_took.as_secs() / 2,
        "the sampler ran: {} samples over {upgrade_took:?}",
        samples.ready.len()
    );
    assert!(
        never_down,
        "the controller had no Ready replica at {:?}",
        samples
            .ready
            .iter()
            .filter(|(_, r)| *r < 1)
            .map(|(t, _)| t)
            .collect::<Vec<_>>()
    );
}

/// The lost nodes come back, get the new node pod, and the object is
/// Running again.
async fn the_returned_nodes_get_the_new_node_pod(bed: &Bed, lost: &BTreeSet<String>) {
    let Bed {
        cluster,
        client,
        ds_api,
        ..
    } = bed;
    // --- the nodes come back and get the new node pod -------------------------
    for name in lost {
        kwok::return_node(client, name).await.expect("node back");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // Twenty nodes' heartbeats, their new pods and kwok's pod stages: minutes
    // on a loaded two-core machine (240 s once ran out with 3 pods left).
    wait_for(Duration::from_secs(480), Duration::from_secs(1), || async {
        let obj = csidd(cluster).await;
        let running = status_str(&obj, &["phase"]) == Some("Running")
            && obj["status"]["node"]["lost"].as_i64().unwrap_or(0) == 0;
        if !running {
            return None;
        }
        let ds = ds_api.get(&format!("{NAME}-node")).await.ok()?;
        let generation = ds
            .annotations()
            .get("deprecated.daemonset.template.generation")?
            .clone();
        let list = pods
            .list(&ListParams::default().labels(&testkit::node_pod_selector(NAME)))
            .await
            .ok()?;
        let current_on_returned = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some_and(|n| lost.contains(n))
            })
            .filter(|p| p.labels().get("pod-template-generation") == Some(&generation))
            .count();
        (current_on_returned == LOST).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "returned nodes never got the new pod: {}",
            csidd_brief(cluster)
        )
    });
}

/// The app, its claim and the driver are deleted.
async fn the_app_and_the_driver_are_deleted(bed: &Bed) {
    let Bed { cluster, .. } = bed;
    // --- clean up --------------------------------------------------------------
    cluster
        .kubectl_ok(["-n", NS, "delete", "pod", "during-roll", "--wait=true"])
        .await
        .expect("pod deleted");
    cluster
        .kubectl_ok(["-n", NS, "delete", "pvc", "during-roll", "--wait=true"])
        .await
        .expect("claim deleted");
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "delete",
            "csidd",
            NAME,
            "--wait=true",
            "--timeout=300s",
        ])
        .await
        .expect("driver torn down");
}

/// Phase, message and counts, for failure messages.
fn csidd_brief(cluster: &Cluster) -> String {
    testkit::kubectl_text(
        cluster,
        &[
            "-n",
            NS,
            "get",
            "csidd",
            NAME,
            "-o",
            "jsonpath={.status.phase} {.status.message} {.status.node} {.status.rollout} {.status.lostNodes} {.status.unhealthyPods} {.status.conditions}",
        ],
    )
}
