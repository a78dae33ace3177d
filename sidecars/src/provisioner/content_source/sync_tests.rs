//! [`super::super::claim::sync_claim`] of restores and clones against a mocked API
//! server and a fake CSI driver: the order of reads, finalizers and the
//! CreateVolume call, and that a refused source creates nothing.

use std::sync::Arc;

use csiops_proto::csi::v1::{CreateVolumeResponse, Volume};
use csiops_runtime::testing::{self, Log};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::ObjectRef;
use serde_json::{json, Value};

use super::super::capabilities::DriverCapabilities;
use super::super::claim;
use super::super::context::Context;
use super::super::decide::STORAGE_PROVISIONER_ANNOTATION;
use super::super::fixture::{self, Fixture};
use super::super::plan::ProvisionerConfig;
use super::*;
use crate::common::fake_csi::FakeController;

const DRIVER: &str = "fake.csi.csiops.dev";
const CLAIM: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/c1";
const SOURCE: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/src";
const SNAPSHOT: &str = "/apis/snapshot.storage.k8s.io/v1/namespaces/ns/volumesnapshots/snap";
const CONTENT: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/content-1";
const PVS: &str = "/api/v1/persistentvolumes";

fn claim(size: &str, kind: &str, name: &str) -> Value {
    let group = (kind == SNAPSHOT_KIND).then_some(SNAPSHOT_GROUP);
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "c1", "namespace": "ns", "uid": "claim-uid", "resourceVersion": "1",
            "annotations": {STORAGE_PROVISIONER_ANNOTATION: DRIVER},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "resources": {"requests": {"storage": size}},
            "dataSource": {"kind": kind, "name": name, "apiGroup": group},
        },
    })
}

fn source_claim() -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "src", "namespace": "ns", "uid": "src-uid", "resourceVersion": "1"},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}}, "volumeName": "pv-src",
        },
        "status": {"phase": "Bound"},
    })
}

fn source_pv() -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-src", "resourceVersion": "1"},
        "spec": {
            "csi": {"driver": DRIVER, "volumeHandle": "vol-src"},
            "claimRef": {"name": "src", "namespace": "ns", "uid": "src-uid"},
        },
        "status": {"phase": "Bound"},
    })
}

fn snapshot() -> Value {
    json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "snap", "namespace": "ns", "uid": "snap-uid"},
        "status": {"boundVolumeSnapshotContentName": "content-1", "readyToUse": true, "restoreSize": "1Gi"},
    })
}

fn content() -> Value {
    json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": "content-1"},
        "spec": {
            "driver": DRIVER,
            "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "snap-uid"},
            "source": {"snapshotHandle": "h"},
        },
        "status": {"snapshotHandle": "snap-handle"},
    })
}

fn class() -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "fast", "resourceVersion": "1"},
        "provisioner": DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
    })
}

/// A provisioner whose API server holds `objects`, with `claims` and `pvs`
/// in its caches; the fake driver answers CreateVolume with a volume of
/// `content`.
async fn provisioner(
    log: &Log,
    dir: &std::path::Path,
    objects: Vec<(&str, Value)>,
    claims: &[Value],
    pvs: &[Value],
    content: VolumeContentSource,
) -> Context {
    let objects = testing::Objects::new(objects);
    let client = testing::client(log, move |call| objects.answer(call));
    let mut fake = FakeController::new(log.clone());
    fake.create = Arc::new(move || {
        Ok(CreateVolumeResponse {
            volume: Some(Volume {
                volume_id: "vol-1".into(),
                capacity_bytes: 1 << 30,
                content_source: Some(content.clone()),
                ..Default::default()
            }),
        })
    });
    Fixture {
        client,
        driver: fake.serve(dir).await,
        config: ProvisionerConfig {
            driver_name: DRIVER.into(),
            prevent_volume_mode_conversion: true,
            ..Default::default()
        },
        caps: DriverCapabilities {
            create_delete_snapshot: true,
            clone_volume: true,
            ..Default::default()
        },
        claims: fixture::store(claims),
        classes: fixture::store(&[class()]),
        volumes: fixture::store(pvs),
        // The claim-finalizer fallback: these tests are about the reads
        // and writes around the content source.
        journal: None,
    }
    .provisioner()
}

fn key() -> ObjectRef<PersistentVolumeClaim> {
    ObjectRef::new("c1").within("ns")
}

fn calls(log: &Log) -> Vec<String> {
    log.lines()
        .into_iter()
        .filter(|l| !l.contains("/events"))
        .collect()
}

fn snapshot_content() -> VolumeContentSource {
    VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: "snap-handle".into(),
        })),
    }
}

/// The snapshot carries the source-protection finalizer from before
/// CreateVolume until the PV exists.
#[tokio::test]
async fn a_restore_reads_the_snapshot_before_the_finalizer_and_the_volume() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let c = claim("1Gi", SNAPSHOT_KIND, "snap");
    let p = provisioner(
        &log,
        dir.path(),
        vec![
            (CLAIM, c.clone()),
            (SNAPSHOT, snapshot()),
            (CONTENT, content()),
        ],
        &[c],
        &[],
        snapshot_content(),
    )
    .await;
    claim::sync_claim(&p, &key()).await.expect("provisioned");
    assert_eq!(
        calls(&log),
        vec![
            format!("GET {SNAPSHOT}"),
            format!("GET {CONTENT}"),
            format!("PATCH {CLAIM}"),
            // The finalizer goes on the copy read for the checks.
            format!("PATCH {SNAPSHOT}"),
            "CSI CreateVolume".to_string(),
            format!("POST {PVS}"),
            format!("PATCH {CLAIM}"),
            format!("GET {SNAPSHOT}"),
            format!("PATCH {SNAPSHOT}"),
        ]
    );
    let patches: Vec<Value> = log
        .calls()
        .into_iter()
        .filter(|c| c.method == "PATCH" && c.path == SNAPSHOT)
        .map(|c| c.body)
        .collect();
    assert_eq!(
        patches[0]["metadata"]["finalizers"],
        json!([SNAPSHOT_SOURCE_FINALIZER])
    );
    assert_eq!(
        patches[1][1],
        json!({"op": "remove", "path": "/metadata/finalizers/0"})
    );
}

#[tokio::test]
async fn a_refused_restore_writes_nothing_and_creates_nothing() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let c = claim("512Mi", SNAPSHOT_KIND, "snap");
    let p = provisioner(
        &log,
        dir.path(),
        vec![
            (CLAIM, c.clone()),
            (SNAPSHOT, snapshot()),
            (CONTENT, content()),
        ],
        &[c],
        &[],
        snapshot_content(),
    )
    .await;
    let err = claim::sync_claim(&p, &key()).await.expect_err("too small");
    assert_eq!(
        err.to_string(),
        "requested volume size 536870912 is less than the size 1073741824 for the source snapshot snap"
    );
    assert_eq!(
        calls(&log),
        vec![format!("GET {SNAPSHOT}"), format!("GET {CONTENT}")]
    );
}

#[tokio::test]
async fn a_missing_snapshot_is_an_error_without_writes() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let c = claim("1Gi", SNAPSHOT_KIND, "snap");
    let p = provisioner(
        &log,
        dir.path(),
        vec![(CLAIM, c.clone())],
        &[c],
        &[],
        snapshot_content(),
    )
    .await;
    let err = claim::sync_claim(&p, &key())
        .await
        .expect_err("no snapshot");
    assert_eq!(
        err.to_string(),
        "error getting snapshot ns/snap from api server: not found"
    );
    assert_eq!(calls(&log), vec![format!("GET {SNAPSHOT}")]);
}

#[tokio::test]
async fn a_clone_protects_its_source_before_the_volume_is_created() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let c = claim("1Gi", CLAIM_KIND, "src");
    let cloned = VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: "vol-src".into(),
        })),
    };
    let p = provisioner(
        &log,
        dir.path(),
        vec![(CLAIM, c.clone()), (SOURCE, source_claim())],
        &[c, source_claim()],
        &[source_pv()],
        cloned,
    )
    .await;
    claim::sync_claim(&p, &key()).await.expect("provisioned");
    assert_eq!(
        calls(&log),
        vec![
            format!("PATCH {CLAIM}"),
            format!("PATCH {SOURCE}"),
            "CSI CreateVolume".to_string(),
            format!("POST {PVS}"),
            format!("PATCH {CLAIM}"),
        ]
    );
    let source_patch = log
        .calls()
        .into_iter()
        .find(|c| c.path == SOURCE)
        .map(|c| c.body)
        .expect("the source patch");
    assert_eq!(
        source_patch,
        json!({"metadata": {"resourceVersion": "1", "finalizers": [CLONE_FINALIZER]}})
    );
}

#[tokio::test]
async fn a_volume_without_the_content_asked_for_is_deleted() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let c = claim("1Gi", SNAPSHOT_KIND, "snap");
    let mut p = provisioner(
        &log,
        dir.path(),
        vec![
            (CLAIM, c.clone()),
            (SNAPSHOT, snapshot()),
            (CONTENT, content()),
        ],
        &[c],
        &[],
        snapshot_content(),
    )
    .await;
    // A driver that ignores the content source: its volume is deleted.
    let mut fake = FakeController::new(log.clone());
    fake.create = Arc::new(|| {
        Ok(CreateVolumeResponse {
            volume: Some(Volume {
                volume_id: "vol-1".into(),
                capacity_bytes: 1 << 30,
                ..Default::default()
            }),
        })
    });
    let other = tempfile::tempdir().expect("tempdir");
    p.driver = fake.serve(other.path()).await;
    let err = claim::sync_claim(&p, &key()).await.expect_err("no content");
    assert_eq!(
        err.to_string(),
        "the created volume is unusable (volume content source missing); it was deleted and will be created again"
    );
    assert!(calls(&log).iter().any(|l| l == "CSI DeleteVolume"));
    assert!(!calls(&log)
        .iter()
        .any(|l| l.starts_with("POST /api/v1/persistentvolumes")));
}
