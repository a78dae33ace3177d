//! [`super::run`] under the Lease: once the Lease is lost, no worker
//! sends CreateVolume or DeleteVolume any more.

use std::sync::Arc;
use std::time::Duration;

use csiops_runtime::leader::{run_as_leader, LeadError, LeaderConfig, LeaderError, LeaseGuard};
use csiops_runtime::shutdown::CancellationToken;
use csiops_runtime::testing::{self, Log, Objects};
use kube::runtime::reflector::ObjectRef;
use serde_json::{json, Value};

use super::super::capabilities::DriverCapabilities;
use super::super::decide::STORAGE_PROVISIONER_ANNOTATION;
use super::super::fixture::{self, Fixture};
use super::super::plan::ProvisionerConfig;
use super::fixed_store;
use crate::common::cache::Cached;
use crate::common::compact::Compact;
use crate::common::fake_csi::FakeController;
use crate::provisioner::context::Caches;

const DRIVER: &str = "fake.csi.csiops.dev";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/provisioner";
const CLAIMS: usize = 200;

fn claim(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": format!("c{i}"), "namespace": "ns", "uid": format!("claim-uid-{i}"),
            "resourceVersion": "1",
            "annotations": {STORAGE_PROVISIONER_ANNOTATION: DRIVER},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    })
}

/// A Released PV of ours whose reclaim policy is Delete: DeleteVolume next.
fn released_pv(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {
            "name": format!("pv-{i}"), "resourceVersion": "1", "uid": format!("pv-uid-{i}"),
            "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER},
        },
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "fast",
            "csi": {"driver": DRIVER, "volumeHandle": format!("vol-{i}")},
        },
        "status": {"phase": "Released"},
    })
}

fn class() -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "fast", "resourceVersion": "1"},
        "provisioner": DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
    })
}

fn objects<K>(values: &[Value]) -> Vec<K>
where
    K: serde::de::DeserializeOwned,
{
    values
        .iter()
        .map(|v| serde_json::from_value(v.clone()).expect("a valid object"))
        .collect()
}

fn volume_calls(log: &Log) -> usize {
    log.lines()
        .iter()
        .filter(|l| *l == "CSI CreateVolume" || *l == "CSI DeleteVolume")
        .count()
}

#[tokio::test]
async fn after_the_lease_is_lost_no_worker_calls_create_or_delete_volume() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let claims: Vec<Value> = (0..CLAIMS).map(claim).collect();
    let pvs: Vec<Value> = (0..CLAIMS).map(released_pv).collect();
    let paths: Vec<String> = (0..CLAIMS)
        .map(|i| format!("/api/v1/namespaces/ns/persistentvolumeclaims/c{i}"))
        .collect();
    let api = Objects::new(paths.iter().map(String::as_str).zip(claims.iter().cloned()));
    let client = {
        let api = api.clone();
        testing::client(&log, move |call| api.answer(call))
    };
    let guard = LeaseGuard::new();
    let mut p = Fixture {
        client: client.clone(),
        driver: FakeController::new(log.clone()).serve(dir.path()).await,
        config: ProvisionerConfig {
            driver_name: DRIVER.into(),
            immediate_topology: true,
            ..Default::default()
        },
        caps: DriverCapabilities::default(),
        claims: fixture::store(&[]),
        classes: fixture::store(&[]),
        volumes: fixture::store(&[]),
        journal: None,
    }
    .provisioner();
    // Caches that have listed (run waits for that).
    p.caches = Caches {
        claims: Arc::new(Cached::new(Compact::of(objects(&claims)))),
        classes: fixed_store(objects(&[class()])),
        volumes: Arc::new(Cached::new(Compact::of(objects(&pvs)))),
        csi_nodes: fixed_store(Vec::new()),
        nodes: fixed_store(Vec::new()),
        attachments: Compact::of([]),
        attributes_classes: fixed_store(Vec::new()),
    };
    p.lease = guard.clone();
    let p = Arc::new(p);

    let election = LeaderConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(100),
        ..LeaderConfig::new("provisioner", "kube-system", "me")
    };
    let stop = CancellationToken::new();
    let leading = {
        let (p, stop, guard) = (p.clone(), stop.clone(), guard.clone());
        tokio::spawn(async move {
            let inner = stop.clone();
            run_as_leader(
                client,
                Some(election),
                guard,
                &stop,
                |_| {},
                move || async move {
                    super::run(p, Vec::new(), 4, inner).await;
                    Ok::<(), std::convert::Infallible>(())
                },
            )
            .await
        })
    };
    // Claims and released PVs keep coming, as watch events would.
    let feeder = {
        let p = p.clone();
        tokio::spawn(async move {
            for i in (0..CLAIMS).cycle() {
                p.claims.add(ObjectRef::new(&format!("c{i}")).within("ns"));
                p.volumes.add(format!("pv-{i}"));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    // Leading: volumes are created and deleted.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(log.lines().contains(&"CSI CreateVolume".to_string())
        && log.lines().contains(&"CSI DeleteVolume".to_string()))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never provisioned: {:?}",
            log.lines()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(guard.is_held());

    // Someone else takes the Lease.
    api.put(
        LEASE,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "provisioner", "namespace": "kube-system", "resourceVersion": "999999"},
               "spec": {"holderIdentity": "thief", "leaseDurationSeconds": 3600}}),
    );
    let outcome = tokio::time::timeout(Duration::from_secs(5), leading)
        .await
        .expect("the loss ends the run")
        .expect("the run's task");
    match outcome {
        Err(LeadError::Leader(LeaderError::Lost { holder })) => assert_eq!(holder, "thief"),
        other => panic!("want the Lease lost to thief, got {other:?}"),
    }
    assert!(!guard.is_held(), "the guard is revoked with the loss");

    // Work keeps arriving; nothing reaches the driver any more.
    let at_loss = volume_calls(&log);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = volume_calls(&log);
    feeder.abort();
    stop.cancel();
    assert_eq!(
        after,
        at_loss,
        "{} CreateVolume/DeleteVolume sent after the Lease was lost",
        after - at_loss
    );
}
