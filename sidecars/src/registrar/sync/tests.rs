use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use csiops_proto::csi::v1::{NodeGetInfoResponse, Topology};
use csiops_runtime::testing::{self, Log, Objects};
use serde_json::json;

use super::*;
use crate::common::fake_csi::{FakeNode, NodeInfoAnswer};

const NODE: &str = "/api/v1/nodes/node-a";
const CSINODE: &str = "/apis/storage.k8s.io/v1/csinodes/node-a";
const DRIVER: &str = "csi.example.com";

fn answer(info: Result<NodeGetInfoResponse, Status>) -> NodeInfoAnswer {
    Arc::new(std::sync::Mutex::new(info))
}

fn info(max_volumes: i64) -> NodeGetInfoResponse {
    NodeGetInfoResponse {
        node_id: "id-a".into(),
        max_volumes_per_node: max_volumes,
        accessible_topology: Some(Topology {
            segments: [("example.com/zone".to_string(), "z1".to_string())].into(),
        }),
    }
}

/// A sync of `node-a` against a fake driver answering `info` on
/// `dir/csi.sock` and an API server answering `api`, kubelet's verdict
/// given.
async fn sync_with(
    dir: &Path,
    log: &Log,
    info: NodeInfoAnswer,
    api: impl Fn(&testing::Call) -> testing::Reply + Send + Sync + 'static,
    verdict: Verdict,
) -> (NodeInfoSync, watch::Sender<Verdict>) {
    let driver = FakeNode {
        log: log.clone(),
        info,
    }
    .serve(dir, Duration::from_secs(2))
    .await;
    let (tx, kubelet) = watch::channel(verdict);
    let sync = NodeInfoSync::new(
        testing::client(log, api),
        "node-a".into(),
        DRIVER.into(),
        driver,
        Duration::from_secs(10),
        kubelet,
    )
    .with_driver_socket(Some(dir.join("csi.sock")));
    (sync, tx)
}

/// `node-a` as kubelet left it: our entry in CSINode (allocatable 5),
/// our node ID in the annotation, beside another driver's.
fn registered_node() -> Objects {
    Objects::new([
        (
            NODE,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": "node-a", "uid": "u-a", "resourceVersion": "1",
                "labels": {"example.com/zone": "z1"},
                "annotations": {nodeinfo::NODE_ID_ANNOTATION:
                    format!(r#"{{"{DRIVER}":"id-a","other.csi":"x"}}"#)}}}),
        ),
        (
            CSINODE,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": "node-a", "resourceVersion": "1"},
                "spec": {"drivers": [
                    {"name": "other.csi", "nodeID": "x"},
                    {"name": DRIVER, "nodeID": "id-a",
                     "topologyKeys": ["example.com/zone"],
                     "allocatable": {"count": 5}}]}}),
        ),
    ])
}

fn has_entry(objects: &Objects) -> bool {
    objects.get(CSINODE).expect("CSINode")["spec"]["drivers"]
        .as_array()
        .is_some_and(|d| d.iter().any(|e| e["name"] == DRIVER))
}

fn has_node_id(objects: &Objects) -> bool {
    let node = objects.get(NODE).expect("Node");
    let ids = node["metadata"]["annotations"][nodeinfo::NODE_ID_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ids.contains(DRIVER)
}

/// The API writes (not the driver calls noted in the same log).
fn api_writes(log: &Log) -> Vec<String> {
    log.writes()
        .into_iter()
        .filter(|w| !w.starts_with("CSI "))
        .collect()
}

fn calls_of(log: &Log, method: &str) -> usize {
    log.lines()
        .iter()
        .filter(|l| *l == &format!("CSI {method}"))
        .count()
}

#[tokio::test]
async fn nothing_is_written_before_kubelet_accepts_nor_after_it_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::default();
    let (sync, verdict) = sync_with(
        dir.path(),
        &log,
        answer(Ok(info(0))),
        |_| testing::status(500, "InternalError", "refused"),
        Verdict::Pending,
    )
    .await;
    let mut streak = FailureStreak::default();
    let now = Instant::now();
    assert_eq!(
        sync.pass(&mut streak, now).await.ok(),
        Some(Outcome::AwaitingKubelet)
    );
    verdict.send_replace(Verdict::Refused("incompatible version".into()));
    assert_eq!(
        sync.pass(&mut streak, now).await.ok(),
        Some(Outcome::AwaitingKubelet)
    );
    assert!(log.lines().is_empty(), "no call at all: {:?}", log.lines());

    // Accepted: the pass asks the driver and then the API server (which
    // fails), so the gate was what held it back.
    verdict.send_replace(Verdict::Registered);
    assert!(matches!(
        sync.pass(&mut streak, now).await,
        Err(SyncError::Kube(_))
    ));
    assert_eq!(calls_of(&log, "NodeGetInfo"), 1);
    assert!(
        log.lines().iter().any(|l| l.starts_with("GET ")),
        "{:?}",
        log.lines()
    );
}

#[tokio::test]
async fn a_forbidden_answer_stops_the_maintenance_instead_of_retrying() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::default();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    let (sync, _verdict) = sync_with(
        dir.path(),
        &log,
        answer(Ok(info(0))),
        move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            testing::status(403, "Forbidden", "refused")
        },
        Verdict::Registered,
    )
    .await;
    let stop = CancellationToken::new();
    // A 500 would be retried with backoff until shutdown; a 403 ends it.
    tokio::time::timeout(Duration::from_secs(10), sync.run(&stop))
        .await
        .expect("run returns on 403 without a shutdown");
    assert!(requests.load(Ordering::SeqCst) > 0);
}

#[tokio::test]
async fn a_failing_driver_keeps_its_entry_and_is_asked_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::default();
    let objects = registered_node();
    let api = objects.clone();
    let failing = answer(Err(Status::unavailable("driver restarting")));
    let (mut sync, _verdict) = sync_with(
        dir.path(),
        &log,
        failing.clone(),
        move |c| api.answer(c),
        Verdict::Registered,
    )
    .await;
    sync.interval = Duration::from_millis(200);
    let stop = CancellationToken::new();
    let run = {
        let (sync, stop) = (sync.clone(), stop.clone());
        tokio::spawn(async move { sync.run(&stop).await })
    };
    // Passes retried with backoff while the driver fails: a second,
    // a third… NodeGetInfo, and nothing removed meanwhile.
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls_of(&log, "NodeGetInfo") < 3 {
        assert!(
            Instant::now() < deadline,
            "NodeGetInfo not retried: {:?}",
            log.lines()
        );
        assert!(
            has_entry(&objects) && has_node_id(&objects),
            "removed after {:?}",
            log.lines()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(api_writes(&log).is_empty(), "wrote {:?}", api_writes(&log));
    assert!(
        has_entry(&objects),
        "the entry stays while the driver's socket is there"
    );
    assert!(has_node_id(&objects), "the node ID stays too");
    // The driver answers again (with kubelet's count): still nothing to write.
    *failing.lock().expect("lock") = Ok(info(5));
    let answered = calls_of(&log, "NodeGetInfo");
    while calls_of(&log, "NodeGetInfo") == answered {
        assert!(
            Instant::now() < deadline,
            "not asked again: {:?}",
            log.lines()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    run.await.expect("run ends");
    assert!(api_writes(&log).is_empty(), "wrote {:?}", api_writes(&log));
}

#[tokio::test]
async fn the_entry_goes_once_the_drivers_socket_has_been_gone_long_enough() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::default();
    let objects = registered_node();
    let api = objects.clone();
    let (sync, _verdict) = sync_with(
        dir.path(),
        &log,
        answer(Err(Status::deadline_exceeded("slow"))),
        move |c| api.answer(c),
        Verdict::Registered,
    )
    .await;
    let mut streak = FailureStreak::default();
    let t0 = Instant::now();
    let gone_after = sync.gone_after();
    // Failing for longer than the grace, socket there: kept.
    for at in [t0, t0 + gone_after, t0 + gone_after * 2] {
        assert_eq!(
            sync.pass(&mut streak, at).await.ok(),
            Some(Outcome::DriverFailed {
                code: tonic::Code::DeadlineExceeded
            })
        );
    }
    assert!(api_writes(&log).is_empty() && has_entry(&objects));
    // The socket goes (the connection made before stays up and fails).
    std::fs::remove_file(dir.path().join("csi.sock")).expect("remove the socket");
    let t1 = t0 + gone_after * 3;
    for at in [t1, t1 + gone_after - Duration::from_millis(1)] {
        assert_eq!(
            sync.pass(&mut streak, at).await.ok(),
            Some(Outcome::DriverFailed {
                code: tonic::Code::DeadlineExceeded
            })
        );
    }
    assert!(api_writes(&log).is_empty() && has_entry(&objects));
    assert_eq!(
        sync.pass(&mut streak, t1 + gone_after).await.ok(),
        Some(Outcome::Uninstalled { wrote: true })
    );
    assert!(!has_entry(&objects), "the entry of a gone driver goes");
    assert!(!has_node_id(&objects), "and its node ID");
    let csinode = objects.get(CSINODE).expect("CSINode");
    assert_eq!(csinode["spec"]["drivers"][0]["name"], "other.csi");
    // Still gone: nothing more to remove.
    let writes = api_writes(&log).len();
    assert_eq!(
        sync.pass(&mut streak, t1 + gone_after * 2).await.ok(),
        Some(Outcome::Uninstalled { wrote: false })
    );
    assert_eq!(api_writes(&log).len(), writes);
}

#[tokio::test]
async fn kubelets_allocatable_is_never_overwritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::default();
    let objects = registered_node();
    let api = objects.clone();
    // kubelet wrote 5 (KEP-4876); the driver answers 7 now.
    let (sync, _verdict) = sync_with(
        dir.path(),
        &log,
        answer(Ok(info(7))),
        move |c| api.answer(c),
        Verdict::Registered,
    )
    .await;
    let mut streak = FailureStreak::default();
    assert_eq!(
        sync.pass(&mut streak, Instant::now()).await.ok(),
        Some(Outcome::Installed { wrote: false })
    );
    assert!(api_writes(&log).is_empty(), "wrote {:?}", api_writes(&log));
    let csinode = objects.get(CSINODE).expect("CSINode");
    assert_eq!(csinode["spec"]["drivers"][1]["allocatable"]["count"], 5);
}

#[test]
fn only_a_socket_absent_for_the_whole_grace_removes_the_entry() {
    use AfterFailure::{Keep, Remove};
    use SocketState::{Absent, Present, Unknown};
    let grace = Duration::from_secs(30);
    let t0 = Instant::now();
    let s = |secs: u64| t0 + Duration::from_secs(secs);
    // (socket state and time of each failure, decision at the last)
    let cases: &[(&[(SocketState, u64)], AfterFailure)] = &[
        (&[(Present, 0)], Keep),
        (&[(Present, 0), (Present, 100)], Keep),
        (&[(Unknown, 0), (Unknown, 100)], Keep),
        (&[(Absent, 0)], Keep),
        (&[(Absent, 0), (Absent, 29)], Keep),
        (&[(Absent, 0), (Absent, 30)], Remove),
        (&[(Absent, 0), (Absent, 10), (Absent, 31)], Remove),
        // Seen again in between: the count starts again.
        (
            &[(Absent, 0), (Present, 10), (Absent, 20), (Absent, 45)],
            Keep,
        ),
        (
            &[(Absent, 0), (Unknown, 10), (Absent, 20), (Absent, 50)],
            Remove,
        ),
        (&[(Present, 0), (Absent, 5), (Absent, 35)], Remove),
    ];
    for (failures, want) in cases {
        let mut streak = FailureStreak::default();
        let mut got = Keep;
        for (state, at) in failures.iter() {
            got = streak.failed(*state, s(*at), grace);
        }
        assert_eq!(got, *want, "{failures:?}");
        assert_eq!(streak.failures as usize, failures.len());
    }
}

#[test]
fn the_socket_state_is_read_from_the_file_system() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("csi.sock");
    assert_eq!(socket_state(Some(&path)), SocketState::Absent);
    std::fs::write(&path, "").expect("write");
    assert_eq!(socket_state(Some(&path)), SocketState::Present);
    assert_eq!(socket_state(None), SocketState::Unknown);
}

#[tokio::test]
async fn a_topology_that_would_relabel_the_node_is_refused_with_one_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::default();
    // The Node is in zone z9; the driver says z1.
    let objects = registered_node();
    let mut node = objects.get(NODE).expect("Node");
    node["metadata"]["labels"]["example.com/zone"] = json!("z9");
    objects.put(NODE, node);
    let api = objects.clone();
    let (sync, _verdict) = sync_with(
        dir.path(),
        &log,
        answer(Ok(info(0))),
        move |c| {
            if c.path.contains("/events") {
                return (201, c.body.clone());
            }
            api.answer(c)
        },
        Verdict::Registered,
    )
    .await;
    let before = objects.get(CSINODE).expect("CSINode");
    let mut streak = FailureStreak::default();
    for _ in 0..2 {
        let err = sync
            .pass(&mut streak, Instant::now())
            .await
            .expect_err("refused");
        assert!(
            matches!(&err, SyncError::Collision(c) if c.key == "example.com/zone" && c.existing == "z9"),
            "{err:?}"
        );
    }
    // Nothing of the Node or the CSINode was written, as kubelet would.
    let writes = api_writes(&log);
    assert!(writes.iter().all(|w| w.contains("/events")), "{writes:?}");
    assert_eq!(objects.get(CSINODE), Some(before));
    // One Warning Event on the Node, in kubelet's words, for both passes.
    let events: Vec<_> = log
        .calls()
        .into_iter()
        .filter(|c| c.method == "POST" && c.path.contains("/events"))
        .collect();
    assert_eq!(events.len(), 1, "{:?}", log.lines());
    let event = &events[0].body;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], "TopologyLabelCollision");
    assert_eq!(event["regarding"]["kind"], "Node");
    assert_eq!(event["regarding"]["name"], "node-a");
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("detected topology value collision")
            && note.contains("\"example.com/zone\":\"z9\""),
        "{note}"
    );
}

#[tokio::test]
async fn failing_watches_back_off_instead_of_looping() {
    // An API outage: every request fails. kubelet has not accepted the
    // driver yet, so passes make no request: what is counted is the
    // watches' retries.
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::default();
    let (sync, _verdict) = sync_with(
        dir.path(),
        &log,
        answer(Ok(info(0))),
        |_| testing::status(500, "InternalError", "down"),
        Verdict::Pending,
    )
    .await;
    let stop = CancellationToken::new();
    let run = {
        let (sync, stop) = (sync.clone(), stop.clone());
        tokio::spawn(async move { sync.run(&stop).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    run.await.expect("run ends");
    let lists = log
        .calls()
        .iter()
        .filter(|c| {
            c.method == "GET" && (c.path.ends_with("/nodes") || c.path.ends_with("/csinodes"))
        })
        .count();
    // Unthrottled, two watches retried every ~100 ms: about 60 in 3 s.
    // Backed off (800 ms doubling, jittered): a handful.
    assert!(lists >= 2, "the watches ran: {:?}", log.lines());
    assert!(
        lists <= 12,
        "{lists} watch requests in 3 s: {:?}",
        log.lines()
    );
}
