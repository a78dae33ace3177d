//! CSIStorageCapacity publishing (`provisioner --enable-capacity`) on a real
//! control plane: kwok nodes registered for the driver (topology label and
//! CSINode entry, as the registrar leaves them), `csi-test-driver` whose
//! GetCapacity answers per node segment, and the provisioner as a process
//! with POD_NAME/NAMESPACE, finding its owner two levels up.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use csiops_e2e::process::ManagedProcess;
use csiops_e2e::provisioning::{register_nodes, DRIVER, TOPOLOGY_KEY};
use csiops_e2e::testdriver::harness::{test_driver_bin, TestDriverProcess};
use csiops_e2e::{free_port, sidecar_bin, testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod,
    PodSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::ResourceExt;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);
const MANAGED: &str = "csi.storage.k8s.io/managed-by=external-provisioner";

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        ..Default::default()
    }
}

fn controlled_by(kind: &str, api_version: &str, name: &str, uid: &str) -> Vec<OwnerReference> {
    vec![OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]
}

fn class(name: &str, binding: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: DRIVER.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some(binding.into()),
        parameters: Some(BTreeMap::from([
            ("type".to_string(), name.to_string()),
            ("csi.storage.k8s.io/fstype".to_string(), "ext4".to_string()),
        ])),
        ..Default::default()
    }
}

fn capacity_object(
    name: &str,
    labels: &[(&str, &str)],
    class: &str,
    node: &str,
    size: &str,
) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        storage_class_name: class.into(),
        node_topology: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                TOPOLOGY_KEY.to_string(),
                node.to_string(),
            )])),
            match_expressions: None,
        }),
        capacity: Some(Quantity(size.into())),
        maximum_volume_size: None,
    }
}

/// (class, node) → (name, capacity, maximumVolumeSize, owner uids) of the
/// managed objects.
type Published = BTreeMap<(String, String), Vec<(String, String, String, Vec<String>)>>;

async fn published(api: &Api<CSIStorageCapacity>) -> Published {
    let list = api
        .list(
            &ListParams::default()
                .labels(&format!("csi.storage.k8s.io/drivername={DRIVER},{MANAGED}")),
        )
        .await
        .expect("list CSIStorageCapacity");
    let mut out = Published::new();
    for o in list {
        let node = o
            .node_topology
            .as_ref()
            .and_then(|t| t.match_labels.as_ref())
            .and_then(|l| l.get(TOPOLOGY_KEY))
            .cloned()
            .unwrap_or_default();
        out.entry((o.storage_class_name.clone(), node))
            .or_default()
            .push((
                o.name_any(),
                o.capacity.clone().map(|q| q.0).unwrap_or_default(),
                o.maximum_volume_size
                    .clone()
                    .map(|q| q.0)
                    .unwrap_or_default(),
                o.owner_references().iter().map(|r| r.uid.clone()).collect(),
            ));
    }
    out
}

/// Whether every (class, node) has exactly one object with `capacity`.
fn all_at(p: &Published, classes: &[&str], nodes: &[String], capacity: &str) -> bool {
    p.len() == classes.len() * nodes.len()
        && classes.iter().all(|c| {
            nodes.iter().all(|n| {
                p.get(&(c.to_string(), n.clone()))
                    .is_some_and(|v| v.len() == 1 && v[0].1 == capacity)
            })
        })
}

/// The driver (10Gi per segment) and the provisioner with capacity on.
struct Bed {
    _driver: TestDriverProcess,
    sidecar: ManagedProcess,
    /// Of /metrics.
    port: u16,
    log: std::path::PathBuf,
}

async fn start_bed(cluster: &Cluster, extra: &[&str], env: &[(&str, &str)]) -> Bed {
    let dir = cluster.work_dir();
    let socket = dir.join("cap-drv.sock");
    let state = dir.join("cap-drv-state");
    std::fs::create_dir_all(&state).expect("state dir");
    let driver = TestDriverProcess::start(
        &test_driver_bin().expect("driver bin"),
        &socket,
        &state,
        &["--nodeid=controller", "--capacity=10Gi"],
        &cluster.log_dir().join("capacity-driver.log"),
    )
    .await
    .expect("driver");
    let port = free_port().expect("port");
    let mut args: Vec<String> = vec![
        "provisioner".to_string(),
        format!("--csi-address=unix://{}", socket.display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--http-endpoint=127.0.0.1:{port}"),
        "--leader-election".into(),
        "--leader-election-namespace=default".into(),
        "--enable-capacity".into(),
        "--capacity-poll-interval=2s".into(),
        "--kube-api-capacity-qps=50".into(),
        "--kube-api-capacity-burst=100".into(),
        "--retry-interval-start=200ms".into(),
        "--retry-interval-max=2s".into(),
        "--v=5".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let log = cluster.log_dir().join("capacity-provisioner.log");
    let sidecar = ManagedProcess::spawn_with_env(
        "provisioner",
        &sidecar_bin().expect("sidecar bin"),
        &args,
        env,
        &log,
    )
    .expect("provisioner");
    Bed {
        _driver: driver,
        sidecar,
        port,
        log,
    }
}

/// The provisioner's log, for a failed wait.
fn log_text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// What the phases work on: an admin client, the node names, and the APIs
/// of capacities, classes, claims and PVs.
struct Objects {
    client: kube::Client,
    nodes: Vec<String>,
    capacities: Api<CSIStorageCapacity>,
    classes: Api<StorageClass>,
    claims: Api<PersistentVolumeClaim>,
    volumes: Api<PersistentVolume>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_updates_and_deletes_capacity_per_segment() {
    let cluster = Cluster::start(ClusterOptions::kwok(2))
        .await
        .expect("cluster");
    register_nodes(&cluster).await.expect("nodes registered");
    let nodes: Vec<String> = cluster.node_names().to_vec();
    let client = cluster.client().expect("client");
    let o = Objects {
        capacities: Api::namespaced(client.clone(), NS),
        classes: Api::all(client.clone()),
        claims: Api::namespaced(client.clone(), NS),
        volumes: Api::all(client.clone()),
        client,
        nodes,
    };

    let top_uid = an_owner_chain_leads_from_the_pod_to_the_top(&o).await;
    classes_and_capacities_exist_before_the_provisioner(&o).await;
    let Bed {
        _driver,
        mut sidecar,
        port,
        log,
    } = start_bed(
        &cluster,
        &["--capacity-ownerref-level=2"],
        &[("NAMESPACE", NS), ("POD_NAME", "provisioner-pod")],
    )
    .await;

    each_segment_and_late_class_has_one_object_owned_by_the_top(&o, &log, &top_uid).await;
    a_volume_lowers_the_capacity_of_its_segment_only(&o, &log).await;
    a_removed_class_loses_its_objects(&o, &log).await;
    the_gauges_and_the_queues_metrics_are_served(port).await;
    sidecar.check_running().expect("provisioner still running");
    sidecar.terminate(Duration::from_secs(10));
}

/// The owner chain: pod → ConfigMap "mid" → ConfigMap "top"; returns the
/// top's UID.
async fn an_owner_chain_leads_from_the_pod_to_the_top(o: &Objects) -> String {
    let Objects { client, .. } = o;
    let pp = PostParams::default();
    // The owner chain: pod → ConfigMap "mid" → ConfigMap "top" (nothing
    // reconciles ConfigMaps, so the references stay as written). Level 2
    // makes the provisioner read the pod and "mid", and own by "top".
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let top = config_maps
        .create(
            &pp,
            &ConfigMap {
                metadata: meta("capacity-top"),
                ..Default::default()
            },
        )
        .await
        .expect("top");
    let top_uid = top.uid().expect("uid");
    let mut mid_meta = meta("capacity-mid");
    mid_meta.owner_references = Some(controlled_by("ConfigMap", "v1", "capacity-top", &top_uid));
    let mid = config_maps
        .create(
            &pp,
            &ConfigMap {
                metadata: mid_meta,
                ..Default::default()
            },
        )
        .await
        .expect("mid");
    let mut pod_meta = meta("provisioner-pod");
    pod_meta.owner_references = Some(controlled_by(
        "ConfigMap",
        "v1",
        "capacity-mid",
        &mid.uid().expect("uid"),
    ));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &pp,
        &Pod {
            metadata: pod_meta,
            spec: Some(PodSpec {
                // Never scheduled: only the object is needed.
                node_selector: Some(BTreeMap::from([("nowhere".into(), "true".into())])),
                containers: vec![Container {
                    name: "c".into(),
                    image: Some("none".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
    .expect("pod");
    top_uid
}

/// The classes exist, and before the provisioner starts so do someone else's
/// object, one of ours to adopt and one of ours for a gone class.
async fn classes_and_capacities_exist_before_the_provisioner(o: &Objects) {
    let Objects {
        nodes,
        capacities,
        classes,
        ..
    } = o;
    let pp = PostParams::default();
    for c in [
        class("late", "WaitForFirstConsumer"),
        class("late-too", "WaitForFirstConsumer"),
        class("now", "Immediate"),
    ] {
        classes.create(&pp, &c).await.expect("class");
    }
    // Before the provisioner starts: someone else's object (other labels),
    // one of ours to adopt, one of ours for a class that does not exist.
    let mine = [
        ("csi.storage.k8s.io/drivername", DRIVER),
        ("csi.storage.k8s.io/managed-by", "external-provisioner"),
    ];
    capacities
        .create(
            &pp,
            &capacity_object(
                "foreign",
                &[("csi.storage.k8s.io/drivername", "other.csi.example.com")],
                "late",
                &nodes[0],
                "1",
            ),
        )
        .await
        .expect("foreign object");
    capacities
        .create(
            &pp,
            &capacity_object("adopt-me", &mine, "late", &nodes[0], "1"),
        )
        .await
        .expect("object to adopt");
    capacities
        .create(
            &pp,
            &capacity_object("stale", &mine, "gone", &nodes[0], "1"),
        )
        .await
        .expect("stale object");
}

/// One object per node segment and late-binding class, with the driver's
/// capacity, owned by the top; the adopted one kept its name; the stale one
/// is gone.
async fn each_segment_and_late_class_has_one_object_owned_by_the_top(
    o: &Objects,
    log: &Path,
    top_uid: &str,
) {
    let Objects {
        nodes, capacities, ..
    } = o;
    // One object per node segment and late-binding class, with the
    // driver's capacity, owned by the top of the chain; the adopted one
    // kept its name; the stale one is gone; no object for "now".
    let got = wait_for(DEADLINE, POLL, || async {
        let p = published(capacities).await;
        all_at(&p, &["late", "late-too"], nodes, "10Gi").then_some(p)
    })
    .await;
    let Ok(p) = got else {
        let now = published(capacities).await;
        panic!("capacity not published: {:?}\n{}", now, log_text(log));
    };
    for objs in p.values() {
        let (name, _, max, owners) = &objs[0];
        assert_eq!(max, "10Gi", "{name}");
        assert_eq!(owners, &vec![top_uid.to_string()], "{name}");
        assert!(name == "adopt-me" || name.starts_with("csisc-"), "{name}");
    }
    assert_eq!(p[&("late".to_string(), nodes[0].clone())][0].0, "adopt-me");
    wait_for(DEADLINE, POLL, || async {
        capacities
            .get_opt("stale")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await
    .expect("the stale object of a gone class is deleted");
}

/// A volume on one node lowers that segment's objects by its size; the
/// other's stay.
async fn a_volume_lowers_the_capacity_of_its_segment_only(o: &Objects, log: &Path) {
    let Objects {
        nodes,
        capacities,
        claims,
        volumes,
        ..
    } = o;
    let pp = PostParams::default();
    // A volume lands on one node: that segment's objects go down by its
    // size (the refresh on a new PV, or the 2s poll), the other's stay.
    claims
        .create(
            &pp,
            &PersistentVolumeClaim {
                metadata: meta("c1"),
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: Some("now".into()),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "storage".into(),
                            Quantity("1Gi".into()),
                        )])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("claim");
    let pv = wait_for(DEADLINE, POLL, || async {
        let c = claims.get_opt("c1").await.ok()??;
        let name = c.spec?.volume_name?;
        volumes.get_opt(&name).await.ok()?
    })
    .await
    .unwrap_or_else(|_| panic!("claim not provisioned\n{}", log_text(log)));
    let used_node = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .and_then(|r| r.node_selector_terms.first())
        .and_then(|t| t.match_expressions.as_ref())
        .and_then(|e| e.first())
        .and_then(|e| e.values.as_ref())
        .and_then(|v| v.first())
        .cloned()
        .expect("PV node affinity");
    let other_node = nodes
        .iter()
        .find(|n| **n != used_node)
        .expect("two nodes")
        .clone();
    let got = wait_for(DEADLINE, POLL, || async {
        let p = published(capacities).await;
        let at = |c: &str, n: &str| {
            p.get(&(c.to_string(), n.to_string()))
                .and_then(|v| v.first())
                .map(|o| o.1.clone())
        };
        (at("late", &used_node).as_deref() == Some("9Gi")
            && at("late-too", &used_node).as_deref() == Some("9Gi")
            && at("late", &other_node).as_deref() == Some("10Gi"))
        .then_some(())
    })
    .await;
    let Ok(()) = got else {
        let now = published(capacities).await;
        panic!(
            "capacity of {used_node} not lowered: {:?}\n{}",
            now,
            log_text(log)
        );
    };
}

/// A class removed: its objects go; someone else's object stays.
async fn a_removed_class_loses_its_objects(o: &Objects, log: &Path) {
    let Objects {
        nodes,
        capacities,
        classes,
        ..
    } = o;
    // A class removed: its objects go; someone else's object stays.
    classes
        .delete("late-too", &DeleteParams::default())
        .await
        .expect("delete class");
    let got = wait_for(DEADLINE, POLL, || async {
        let p = published(capacities).await;
        (p.keys().all(|(c, _)| c == "late") && p.len() == nodes.len()).then_some(())
    })
    .await;
    let Ok(()) = got else {
        let now = published(capacities).await;
        panic!(
            "objects of the removed class remain: {:?}\n{}",
            now,
            log_text(log)
        );
    };
    assert!(
        capacities.get_opt("foreign").await.expect("get").is_some(),
        "an object with other labels is never touched"
    );
}

/// Upstream's gauges (the planner's next pass sees the deletions) and the
/// queue's metrics are served.
async fn the_gauges_and_the_queues_metrics_are_served(port: u16) {
    // Upstream's gauges (the planner's next pass sees the deletions) and
    // the queue's metrics.
    let needles = [
        "csistoragecapacities_desired_goal 2\n",
        "csistoragecapacities_desired_current 2\n",
        "csistoragecapacities_obsolete 0\n",
        "workqueue_depth{name=\"csistoragecapacity\"}",
        "method_name=\"/csi.v1.Controller/GetCapacity\",grpc_status_code=\"OK\"",
    ];
    let scrape = || async {
        testkit::http_get_async(([127, 0, 0, 1], port).into(), "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    let got = wait_for(DEADLINE, POLL, || async {
        let m = scrape().await;
        needles.iter().all(|n| m.contains(n)).then_some(())
    })
    .await;
    if got.is_err() {
        let m = scrape().await;
        let missing: Vec<_> = needles.iter().filter(|n| !m.contains(**n)).collect();
        panic!("metrics miss {missing:?} in\n{m}");
    }
}

/// Without topology (here the provisioner's `Topology=false` gate; a driver
/// without VOLUME_ACCESSIBILITY_CONSTRAINTS is the same) the storage is one
/// pool for every node: one object per class with an empty node topology
/// (every node; an unset one would mean none), GetCapacity without a
/// segment, and no owner with `--capacity-ownerref-level=-1` (no POD_NAME).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_topology_one_object_per_class_for_every_node() {
    let cluster = Cluster::start(ClusterOptions::kwok(2))
        .await
        .expect("cluster");
    register_nodes(&cluster).await.expect("nodes registered");
    let client = cluster.client().expect("client");
    let capacities: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), NS);
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &class("late", "WaitForFirstConsumer"),
        )
        .await
        .expect("class");
    let Bed {
        _driver,
        mut sidecar,
        log,
        ..
    } = start_bed(
        &cluster,
        &[
            "--capacity-ownerref-level=-1",
            "--feature-gates=Topology=false",
        ],
        &[("NAMESPACE", NS)],
    )
    .await;
    let selector = format!("csi.storage.k8s.io/drivername={DRIVER},{MANAGED}");
    let got = wait_for(DEADLINE, POLL, || async {
        let list = capacities
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        (list.items.len() == 1).then(|| list.items[0].clone())
    })
    .await;
    let Ok(obj) = got else {
        panic!(
            "no single object for the class\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    assert_eq!(obj.storage_class_name, "late");
    assert_eq!(obj.capacity, Some(Quantity("10Gi".into())));
    let topology = obj.node_topology.expect("a node topology: every node");
    assert!(
        topology.match_labels.unwrap_or_default().is_empty()
            && topology.match_expressions.unwrap_or_default().is_empty(),
        "the empty selector"
    );
    assert!(obj.metadata.owner_references.unwrap_or_default().is_empty());
    sidecar.check_running().expect("provisioner still running");
    sidecar.terminate(Duration::from_secs(10));
}
