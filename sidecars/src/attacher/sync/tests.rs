//! The syncs against a mocked API server and a fake CSI driver in the test
//! process: the exact sequence of requests and CSI calls.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csiops_runtime::testing::{self, Log};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::super::controller::{Config, Controller, Kind, Queues, Watches};
use super::super::decide::{Mode, Refusal};
use super::super::finalizer::finalizer_name;
use super::super::metrics::Writes;
use super::super::node::VA_NODE_ID_ANNOTATION;
use super::super::request::PublishCaps;
use super::SyncError;
use crate::common::fake_csi::FakeController;
use crate::common::workqueue::Backoff;

const DRIVER: &str = "fake.csi.csiops.dev";
const PV: &str = "/api/v1/persistentvolumes/pv-0";
const VA: &str = "/apis/storage.k8s.io/v1/volumeattachments/va-0";
const VA_STATUS: &str = "/apis/storage.k8s.io/v1/volumeattachments/va-0/status";
const PUBLISH: &str = "CSI ControllerPublishVolume";

/// `obj` with our finalizer (and, on a VolumeAttachment, the node ID), as
/// an earlier attempt left it.
fn finalized(mut obj: Value) -> Value {
    obj["metadata"]["finalizers"] = json!([finalizer_name(DRIVER)]);
    if obj["kind"] == "VolumeAttachment" {
        obj["metadata"]["annotations"] = json!({VA_NODE_ID_ANNOTATION: "nid-0"});
    }
    obj
}

fn pv() -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-0", "uid": "pv-uid", "resourceVersion": "1"},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "volumeMode": "Filesystem",
            "csi": {"driver": DRIVER, "volumeHandle": "vol-0", "fsType": "ext4"},
        },
    })
}

fn va(pv: &str) -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": "va-0", "uid": "va-uid", "resourceVersion": "1"},
        "spec": {"attacher": DRIVER, "nodeName": "node-0", "source": {"persistentVolumeName": pv}},
    })
}

fn csinode() -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
        "metadata": {"name": "node-0", "resourceVersion": "1"},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": "nid-0"}]},
    })
}

fn object<K: serde::de::DeserializeOwned>(v: &Value) -> K {
    serde_json::from_value(v.clone()).expect("a valid object")
}

struct Fixture {
    ctrl: Arc<Controller>,
    /// Kept so the CSINode cache's writer lives as long as the test.
    _watches: Watches,
    log: Log,
    written: mpsc::UnboundedReceiver<Value>,
    _dir: tempfile::TempDir,
}

async fn fixture(
    va: Value,
    pv: Value,
    csi: impl FnOnce(Log) -> FakeController,
    backoff: Backoff,
) -> Fixture {
    let log = Log::default();
    let (tx, written) = mpsc::unbounded_channel();
    let objects = testing::Objects::new([(PV, pv.clone()), (VA, va.clone())]);
    // What the watch would bring back.
    objects.on_write(move |written| {
        let _ = tx.send(written.clone());
    });
    let client = testing::client(&log, move |call| objects.answer(call));
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = csi(log.clone()).serve(dir.path()).await;
    let cfg = Config {
        driver_name: DRIVER.to_string(),
        mode: Mode::Real,
        caps: PublishCaps::default(),
        default_fs_type: String::new(),
        timeout: Duration::from_secs(10),
        workers: 1,
        resync: Duration::ZERO,
        reconcile_sync: Duration::ZERO,
        list_published: false,
        max_entries: 0,
    };
    let (ctrl, mut watches) = Controller::new(
        cfg,
        client.clone(),
        client,
        driver,
        Queues::new(backoff),
        Writes::default(),
    );
    ctrl.vas.store().apply(&Event::Apply(object(&va)));
    ctrl.pvs.store().apply(&Event::Apply(object(&pv)));
    watches
        .csinode_writer
        .apply_watcher_event(&Event::Apply(object::<CSINode>(&csinode())));
    Fixture {
        ctrl,
        _watches: watches,
        log,
        written,
        _dir: dir,
    }
}

const BACKOFF: Backoff = Backoff {
    start: Duration::from_millis(200),
    max: Duration::from_secs(2),
};

/// The calls so far, without the Events (their count is the recorder's
/// business) and without reads.
fn writes(log: &Log) -> Vec<String> {
    log.writes()
        .into_iter()
        .filter(|w| !w.contains("/events"))
        .collect()
}

#[tokio::test]
async fn an_attach_writes_the_finalizers_before_the_publish_and_one_status() {
    let fx = fixture(va("pv-0"), pv(), FakeController::new, BACKOFF).await;
    fx.ctrl
        .sync_va("va-0", Kind::Attach)
        .await
        .expect("attached");
    assert_eq!(
        fx.log.lines(),
        vec![
            format!("PATCH {PV}"),
            format!("PATCH {VA}"),
            PUBLISH.to_string(),
            format!("PATCH {VA_STATUS}"),
        ]
    );
    // Queued again by the event of the first write, before the watch shows
    // the others: our own writes say it is done.
    fx.log.clear();
    fx.ctrl.sync_va("va-0", Kind::Attach).await.expect("done");
    assert_eq!(fx.log.lines(), Vec::<String>::new());
}

#[tokio::test]
async fn an_error_already_recorded_is_not_written_again() {
    let mut fx = fixture(va("pv-gone"), pv(), FakeController::new, BACKOFF).await;
    let err = fx
        .ctrl
        .sync_va("va-0", Kind::Attach)
        .await
        .expect_err("no PV");
    assert!(
        matches!(err, SyncError::Refused(Refusal::PvMissing(_))),
        "{err:?}"
    );
    assert_eq!(writes(&fx.log), vec![format!("PATCH {VA_STATUS}")]);
    assert_eq!(fx.log.writes().len(), 2, "one Event: {:?}", fx.log.writes());

    // Again, from our own copy, and again once the watch delivered it.
    fx.log.clear();
    fx.ctrl
        .sync_va("va-0", Kind::Attach)
        .await
        .expect_err("no PV");
    let recorded: VolumeAttachment = object(&fx.written.recv().await.expect("the status write"));
    let event = Event::Apply(recorded);
    fx.ctrl.vas.store().apply(&event);
    fx.ctrl.vas.observe(&event);
    fx.ctrl
        .sync_va("va-0", Kind::Attach)
        .await
        .expect_err("no PV");
    assert_eq!(fx.log.writes(), Vec::<String>::new());
}

#[tokio::test]
async fn new_error_messages_do_not_retry_faster_than_the_backoff() {
    // Every publish fails with a new message (as drivers that put request
    // IDs in them do), so every failure is a new attachError write, whose
    // watch event must not cut the backoff short. The finalizers are in
    // place (the event of adding them is a real change, and queues again).
    let calls = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let at = calls.clone();
    let fx = fixture(
        finalized(va("pv-0")),
        finalized(pv()),
        move |log| FakeController {
            publish: Arc::new(move || {
                let mut at = at.lock().unwrap();
                at.push(Instant::now());
                Err(tonic::Status::internal(format!("request {}", at.len())))
            }),
            ..FakeController::new(log)
        },
        BACKOFF,
    )
    .await;
    let worker = tokio::spawn(fx.ctrl.clone().va_worker(Kind::Attach));
    fx.ctrl.attach_q.add("va-0".to_string());
    // The watch: our own writes come back as events.
    let watch = {
        let ctrl = fx.ctrl.clone();
        let mut written = fx.written;
        tokio::spawn(async move {
            while let Some(obj) = written.recv().await {
                if obj["kind"] != "VolumeAttachment" {
                    continue;
                }
                let new: VolumeAttachment = object(&obj);
                let old = ctrl.vas.store().get(&ObjectRef::from_obj(&new));
                let event = Event::Apply(new);
                ctrl.vas.store().apply(&event);
                ctrl.on_va_event(event, old.as_deref());
            }
        })
    };
    while calls.lock().unwrap().len() < 4 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.abort();
    watch.abort();
    let calls = calls.lock().unwrap().clone();
    for (i, pair) in calls.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        let backoff = BACKOFF.delay(i as u32);
        assert!(
            gap >= backoff,
            "retry {} after {gap:?}, backoff {backoff:?}",
            i + 1
        );
    }
    // Per failure: the publish, then exactly one error record.
    let lines: Vec<String> = fx
        .log
        .lines()
        .into_iter()
        .filter(|l| !l.contains("/events"))
        .collect();
    let per_failure = [PUBLISH.to_string(), format!("PATCH {VA_STATUS}")];
    assert!(lines.len() >= 7, "{lines:?}");
    for (i, chunk) in lines.chunks(2).take(3).enumerate() {
        assert_eq!(chunk, per_failure, "failure {i}: {lines:?}");
    }
}
