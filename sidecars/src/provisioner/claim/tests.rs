//! [`Provisioner::sync_claim`] against a mocked API server and a fake CSI
//! driver in the test process: the exact sequence of requests and calls.

use std::sync::Arc;
use std::time::Duration;

use csiops_runtime::testing::{self, Log};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::Event;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::super::controller::{Caches, ClaimKey, Provisioner, Queues};
use super::super::decide::STORAGE_PROVISIONER_ANNOTATION;
use super::super::metrics::OperationMetrics;
use super::super::plan::{DriverCapabilities, ProvisionerConfig};
use crate::common::cache::Cached;
use crate::common::fake_csi::FakeController;
use crate::common::workqueue::Backoff;

const DRIVER: &str = "fake.csi.csiops.dev";
const CLAIM: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/c1";
const PVS: &str = "/api/v1/persistentvolumes";

fn claim() -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "c1", "namespace": "ns", "uid": "claim-uid", "resourceVersion": "1",
            "annotations": {STORAGE_PROVISIONER_ANNOTATION: DRIVER},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    })
}

fn class() -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "fast", "resourceVersion": "1"},
        "provisioner": DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
    })
}

fn object<K: serde::de::DeserializeOwned>(v: &Value) -> K {
    serde_json::from_value(v.clone()).expect("a valid object")
}

async fn provisioner(log: &Log, dir: &std::path::Path) -> Provisioner {
    let objects = testing::Objects::new([(CLAIM, claim())]);
    let client = testing::client(log, move |call| objects.answer(call));
    let driver = FakeController::new(log.clone()).serve(dir).await;
    let (claims, mut claims_writer) = reflector::store();
    claims_writer.apply_watcher_event(&Event::Apply(object::<PersistentVolumeClaim>(&claim())));
    let (classes, mut classes_writer) = reflector::store();
    classes_writer.apply_watcher_event(&Event::Apply(object::<StorageClass>(&class())));
    let queues = Queues::new(Backoff {
        start: Duration::from_secs(1),
        max: Duration::from_secs(10),
    });
    Provisioner {
        client: client.clone(),
        critical: client.clone(),
        bookkeeping: client.clone(),
        driver,
        config: ProvisionerConfig {
            driver_name: DRIVER.into(),
            immediate_topology: true,
            ..Default::default()
        },
        caps: DriverCapabilities::default(),
        timeout: Duration::from_secs(10),
        caches: Caches {
            claims: Arc::new(Cached::new(claims)),
            classes,
            volumes: Arc::new(Cached::new(reflector::store().0)),
            csi_nodes: reflector::store().0,
            nodes: reflector::store().0,
            attachments: reflector::store().0,
        },
        claims: queues.claims,
        volumes: queues.volumes,
        cloning: queues.cloning,
        calls: Semaphore::new(1),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: "external-provisioner".into(),
                instance: None,
            },
        ),
        metrics: Arc::new(OperationMetrics::default()),
    }
}

fn key() -> ClaimKey {
    ObjectRef::new("c1").within("ns")
}

#[tokio::test]
async fn the_claim_holds_a_finalizer_from_before_the_volume_until_its_pv_exists() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = provisioner(&log, dir.path()).await;
    p.sync_claim(&key()).await.expect("provisioned");
    let calls: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| !l.contains("/events"))
        .collect();
    assert_eq!(
        calls,
        vec![
            format!("PATCH {CLAIM}"),
            "CSI CreateVolume".to_string(),
            format!("POST {PVS}"),
            format!("PATCH {CLAIM}"),
        ]
    );
    let bodies = log.calls();
    let patches: Vec<&Value> = bodies
        .iter()
        .filter(|c| c.method == "PATCH")
        .map(|c| &c.body)
        .collect();
    assert_eq!(
        patches[0]["metadata"]["finalizers"],
        json!(["csiops.dev/volume-provisioning"])
    );
    assert_eq!(
        patches[1][1],
        json!({"op": "remove", "path": "/metadata/finalizers/0"})
    );

    // Queued again by the events of these writes before the watch brought
    // them: our own writes say the claim has its volume.
    log.clear();
    p.sync_claim(&key()).await.expect("nothing to do");
    assert_eq!(log.lines(), Vec::<String>::new());
}

#[tokio::test]
async fn a_failed_create_leaves_the_finalizer_and_no_pv() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut p = provisioner(&log, dir.path()).await;
    let second = dir.path().join("second");
    std::fs::create_dir(&second).expect("dir");
    p.driver = FakeController {
        create: Arc::new(|| Err(tonic::Status::resource_exhausted("no space"))),
        ..FakeController::new(log.clone())
    }
    .serve(&second)
    .await;
    let err = p.sync_claim(&key()).await.expect_err("the driver refused");
    assert!(err.to_string().contains("no space"), "{err}");
    assert_eq!(
        log.writes(),
        vec![format!("PATCH {CLAIM}"), "CSI CreateVolume".to_string()]
    );
}
