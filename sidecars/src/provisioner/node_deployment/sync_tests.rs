//! A node's provisioner against a mocked API server and a fake driver: the
//! requests it makes (and those it must not make) for claims, PVs and
//! intents that are, or are not, its node's.

use std::sync::Arc;

use csiops_proto::csi::v1::GetCapacityResponse;
use csiops_runtime::shutdown::CancellationToken;
use csiops_runtime::testing::{self, Log};
use kube::runtime::reflector::ObjectRef;
use serde_json::{json, Value};

use crate::common::fake_csi::FakeController;
use crate::provisioner::capabilities::DriverCapabilities;
use crate::provisioner::context::Context;
use crate::provisioner::decide::ClaimKey;
use crate::provisioner::decide::STORAGE_PROVISIONER_ANNOTATION;
use crate::provisioner::fixture::{self, on_node, Fixture};
use crate::provisioner::journal::{test_limiter, Journal, Record};
use crate::provisioner::plan::ProvisionerConfig;
use crate::provisioner::topology::SELECTED_NODE_ANNOTATION;
use crate::provisioner::{claim, sweep, volume};

const DRIVER: &str = "fake.csi.csiops.dev";
const KEY: &str = "topology.fake.csi/node";
const CLAIM: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/c1";
const PVS: &str = "/api/v1/persistentvolumes";
const UID: &str = "claim-uid";
const PV: &str = "pvc-claim-uid";

fn claim(edit: impl FnOnce(&mut Value)) -> Value {
    let mut c = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "c1", "namespace": "ns", "uid": UID, "resourceVersion": "1",
            "annotations": {STORAGE_PROVISIONER_ANNOTATION: DRIVER},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    });
    edit(&mut c);
    c
}

fn selected(node: &str) -> impl FnOnce(&mut Value) + '_ {
    move |c| c["metadata"]["annotations"][SELECTED_NODE_ANNOTATION] = json!(node)
}

fn class(edit: impl FnOnce(&mut Value)) -> Value {
    let mut c = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "fast", "resourceVersion": "1"},
        "provisioner": DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
    });
    edit(&mut c);
    c
}

fn key() -> ClaimKey {
    ObjectRef::new("c1").within("ns")
}

/// What a test sets up: the server's claim, the cached one, the class.
struct Setup {
    server_claim: Value,
    cached_claim: Value,
    class: Value,
    driver: FakeController,
    topology: bool,
}

impl Setup {
    fn new(log: &Log) -> Setup {
        Setup {
            server_claim: claim(|_| {}),
            cached_claim: claim(|_| {}),
            class: class(|_| {}),
            driver: FakeController::new(log.clone()),
            topology: false,
        }
    }

    /// Node `n1`'s provisioner (driver topology `KEY=n1`), without a
    /// journal unless `journal` is given, and the server it talks to.
    async fn on_n1(
        self,
        log: &Log,
        dir: &std::path::Path,
        journal: bool,
    ) -> (Context, testing::Objects) {
        let objects = testing::Objects::new([(CLAIM, self.server_claim)]);
        let answer = objects.clone();
        let client = testing::client(log, move |call| answer.answer(call));
        let journal = if journal {
            let (j, _) = Journal::open(client.clone(), test_limiter(), "kube-system", "journal-n1")
                .await
                .expect("journal");
            tokio::spawn(j.clone().run_writer(CancellationToken::new()));
            Some(j)
        } else {
            None
        };
        let mut p = Fixture {
            client,
            driver: self.driver.serve(dir).await,
            config: ProvisionerConfig {
                driver_name: DRIVER.into(),
                immediate_topology: true,
                ..Default::default()
            },
            caps: DriverCapabilities {
                topology: self.topology,
                ..Default::default()
            },
            claims: fixture::store(&[self.cached_claim]),
            classes: fixture::store(&[self.class]),
            volumes: fixture::store(&[]),
            journal,
        }
        .provisioner();
        on_node(&mut p, "n1", Some(&[(KEY, "n1")]));
        log.clear();
        (p, objects)
    }
}

/// The calls but Events (asserted apart where they matter).
fn calls(log: &Log) -> Vec<String> {
    log.lines()
        .into_iter()
        .filter(|l| !l.contains("/events"))
        .collect()
}

fn room(bytes: i64) -> Arc<dyn Fn() -> Result<GetCapacityResponse, tonic::Status> + Send + Sync> {
    Arc::new(move || {
        Ok(GetCapacityResponse {
            available_capacity: bytes,
            ..Default::default()
        })
    })
}

#[tokio::test]
async fn the_node_that_waited_writes_itself_into_the_claim_then_provisions_it() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut setup = Setup::new(&log);
    setup.driver.capacity = room(2 << 30);
    let (p, objects) = setup.on_n1(&log, dir.path(), false).await;
    let node = p.node.clone().expect("on a node");

    // First look: the wait starts, nothing is written.
    claim::sync_claim(&p, &key()).await.expect("waiting");
    assert_eq!(log.lines(), Vec::<String>::new());
    assert_eq!(node.races.attempts(UID), 1);

    // Its turn: room here, then the update at the version seen.
    claim::sync_claim(&p, &key()).await.expect("claimed");
    assert_eq!(
        calls(&log),
        vec!["CSI GetCapacity".to_string(), format!("PUT {CLAIM}")]
    );
    let put = &log.calls()[1].body;
    assert_eq!(
        put["metadata"]["annotations"][SELECTED_NODE_ANNOTATION],
        "n1"
    );
    assert_eq!(put["metadata"]["resourceVersion"], "1");
    assert_eq!(
        objects.get(CLAIM).expect("claim")["metadata"]["annotations"][SELECTED_NODE_ANNOTATION],
        "n1"
    );
    assert!(node.races.is_empty(), "won: the race is over");

    // The next sync (queued by the win) provisions, with this node's own
    // claim finalizer (no journal here).
    log.clear();
    claim::sync_claim(&p, &key()).await.expect("provisioned");
    assert_eq!(
        calls(&log),
        vec![
            format!("PATCH {CLAIM}"),
            "CSI CreateVolume".to_string(),
            format!("POST {PVS}"),
            format!("PATCH {CLAIM}"),
        ]
    );
    assert_eq!(
        log.calls()[0].body["metadata"]["finalizers"],
        json!(["csiops.dev/volume-provisioning-n1"])
    );
}

#[tokio::test]
async fn a_conflict_means_another_wait_a_longer_one() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut setup = Setup::new(&log);
    // Someone changed the claim since the cache saw it.
    setup.server_claim = claim(|c| c["metadata"]["resourceVersion"] = json!("2"));
    let (p, objects) = setup.on_n1(&log, dir.path(), false).await;
    let node = p.node.clone().expect("on a node");
    claim::sync_claim(&p, &key()).await.expect("waiting");
    // GetCapacity is unimplemented: that does not keep the node out.
    claim::sync_claim(&p, &key())
        .await
        .expect("a conflict is no error");
    assert_eq!(
        calls(&log),
        vec!["CSI GetCapacity".to_string(), format!("PUT {CLAIM}")]
    );
    assert_eq!(
        objects.get(CLAIM).expect("claim")["metadata"]["annotations"][SELECTED_NODE_ANNOTATION],
        Value::Null,
        "nothing written"
    );
    assert_eq!(node.races.attempts(UID), 2, "a second, longer wait");
    assert!(
        !log.lines().iter().any(|l| l.contains("/events")),
        "no Event"
    );
}

#[tokio::test]
async fn without_room_here_the_node_stays_out() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut setup = Setup::new(&log);
    setup.driver.capacity = room((1 << 30) - 1);
    let (p, _) = setup.on_n1(&log, dir.path(), false).await;
    claim::sync_claim(&p, &key()).await.expect("waiting");
    claim::sync_claim(&p, &key()).await.expect("stays out");
    assert_eq!(log.lines(), vec!["CSI GetCapacity".to_string()]);
    // Looked at again later (a claim informer's resync, upstream).
    assert!(p.claims.delayed_len() >= 1);
}

#[tokio::test]
async fn another_nodes_win_ends_the_race_unwritten() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let (p, _) = Setup::new(&log).on_n1(&log, dir.path(), false).await;
    let node = p.node.clone().expect("on a node");
    claim::sync_claim(&p, &key()).await.expect("waiting");
    assert_eq!(node.races.len(), 1);
    // The watch brings n2's win.
    let won: k8s_openapi::api::core::v1::PersistentVolumeClaim =
        serde_json::from_value(claim(|c| {
            selected("n2")(c);
            c["metadata"]["resourceVersion"] = json!("3");
        }))
        .expect("claim");
    p.caches.claims.wrote(won);
    claim::sync_claim(&p, &key()).await.expect("not ours");
    assert_eq!(log.lines(), Vec::<String>::new());
    assert!(node.races.is_empty());
}

#[tokio::test]
async fn claims_of_other_nodes_and_of_the_scheduler_are_left_alone() {
    for (name, edit_claim, edit_class) in [
        (
            "selected elsewhere",
            (|c| selected("n2")(c)) as fn(&mut Value),
            (|_| {}) as fn(&mut Value),
        ),
        (
            "late binding, not selected yet",
            |_| {},
            |c| c["volumeBindingMode"] = json!("WaitForFirstConsumer"),
        ),
    ] {
        let log = Log::default();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut setup = Setup::new(&log);
        setup.cached_claim = claim(edit_claim);
        setup.class = class(edit_class);
        let (p, _) = setup.on_n1(&log, dir.path(), false).await;
        claim::sync_claim(&p, &key()).await.expect(name);
        assert_eq!(
            log.lines(),
            Vec::<String>::new(),
            "{name}: not even an Event"
        );
        assert!(p.node.as_ref().expect("node").races.is_empty(), "{name}");
    }
}

#[tokio::test]
async fn immediate_binding_off_leaves_unselected_claims_to_others() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut p, _) = Setup::new(&log).on_n1(&log, dir.path(), false).await;
    let node = p.node.clone().expect("node");
    let off = crate::provisioner::node_deployment::ThisNode::new(
        &crate::provisioner::node_deployment::NodeDeployment {
            node_name: "n1".into(),
            immediate_binding: false,
            base_delay: std::time::Duration::ZERO,
            max_delay: std::time::Duration::ZERO,
        },
        node.local.clone(),
    );
    p.node = Some(Arc::new(off));
    claim::sync_claim(&p, &key()).await.expect("left");
    claim::sync_claim(&p, &key()).await.expect("left");
    assert_eq!(log.lines(), Vec::<String>::new());
}

#[tokio::test]
async fn allowed_topologies_decide_whether_the_node_races() {
    for (allowed, races) in [("n2", false), ("n1", true)] {
        let log = Log::default();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut setup = Setup::new(&log);
        setup.topology = true;
        setup.class = class(|c| {
            c["allowedTopologies"] =
                json!([{"matchLabelExpressions": [{"key": KEY, "values": [allowed]}]}])
        });
        let (p, _) = setup.on_n1(&log, dir.path(), false).await;
        claim::sync_claim(&p, &key()).await.expect("looked");
        assert_eq!(log.lines(), Vec::<String>::new());
        assert_eq!(
            p.node.as_ref().expect("node").races.attempts(UID),
            u32::from(races),
            "allowed {allowed}"
        );
    }
}

#[tokio::test]
async fn a_missing_class_of_an_unselected_claim_is_retried_quietly() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut setup = Setup::new(&log);
    setup.class = class(|c| c["metadata"]["name"] = json!("other"));
    let (p, _) = setup.on_n1(&log, dir.path(), false).await;
    let err = claim::sync_claim(&p, &key()).await.expect_err("retried");
    assert!(err.quiet(), "{err}");
    // Selected here, it is this node's to report.
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut setup = Setup::new(&log);
    setup.class = class(|c| c["metadata"]["name"] = json!("other"));
    setup.cached_claim = claim(selected("n1"));
    let (p, _) = setup.on_n1(&log, dir.path(), false).await;
    let err = claim::sync_claim(&p, &key()).await.expect_err("reported");
    assert!(!err.quiet(), "{err}");
}

fn released_pv(node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": PV, "uid": "pv-uid", "resourceVersion": "5",
            "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER},
        },
        "spec": {
            "persistentVolumeReclaimPolicy": "Delete",
            "csi": {"driver": DRIVER, "volumeHandle": "vol-1"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": KEY, "operator": "In", "values": [node]}]},
            ]}},
        },
        "status": {"phase": "Released"},
    })
}

#[tokio::test]
async fn only_the_node_holding_a_released_volume_deletes_it() {
    for (node, deletes) in [("n2", false), ("n1", true)] {
        let log = Log::default();
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut p, objects) = Setup::new(&log).on_n1(&log, dir.path(), false).await;
        let pv = released_pv(node);
        p.caches.volumes = Arc::new(crate::common::cache::Cached::new(fixture::store(
            std::slice::from_ref(&pv),
        )));
        objects.put(&format!("{PVS}/{PV}"), pv);
        volume::sync_volume(&p, PV).await.expect("synced");
        let want: Vec<String> = if deletes {
            vec!["CSI DeleteVolume".into(), format!("DELETE {PVS}/{PV}")]
        } else {
            vec![]
        };
        assert_eq!(calls(&log), want, "PV on {node}");
    }
}

#[tokio::test]
async fn the_sweep_on_a_node_cleans_up_after_a_claim_that_moved_away() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut setup = Setup::new(&log);
    setup.cached_claim = claim(selected("n1"));
    // Rescheduled to n2 since this node recorded its intent.
    setup.server_claim = claim(selected("n2"));
    let (p, _) = setup.on_n1(&log, dir.path(), true).await;
    let journal = p.journal.clone().expect("journal");
    let cached = p.caches.claims.get(&key()).expect("cached");
    let request = csiops_proto::csi::v1::CreateVolumeRequest {
        name: PV.into(),
        ..Default::default()
    };
    journal
        .record(PV, Record::new(&cached, "fast", &request, None))
        .await
        .expect("recorded");
    log.clear();
    sweep::sync_intent(&p, PV).await.expect("cleaned up");
    assert_eq!(
        log.lines(),
        vec![
            format!("GET {CLAIM}"),
            format!("GET {PVS}/{PV}"),
            "CSI CreateVolume".to_string(),
            "CSI DeleteVolume".to_string(),
        ]
    );
    assert_eq!(journal.get(PV), None, "trimmed");
}

#[tokio::test]
async fn the_sweep_on_a_node_keeps_what_is_still_its_own() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut setup = Setup::new(&log);
    setup.cached_claim = claim(selected("n1"));
    setup.server_claim = claim(selected("n1"));
    let (p, _) = setup.on_n1(&log, dir.path(), true).await;
    let journal = p.journal.clone().expect("journal");
    let cached = p.caches.claims.get(&key()).expect("cached");
    let request = csiops_proto::csi::v1::CreateVolumeRequest {
        name: PV.into(),
        ..Default::default()
    };
    journal
        .record(PV, Record::new(&cached, "fast", &request, None))
        .await
        .expect("recorded");
    log.clear();
    sweep::sync_intent(&p, PV).await.expect("kept");
    assert_eq!(
        log.lines(),
        vec![format!("GET {CLAIM}"), format!("GET {PVS}/{PV}")]
    );
    assert!(journal.get(PV).is_some(), "kept for the claim's sync");
}
