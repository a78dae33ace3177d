//! [`super::sync_claim`] against a mocked API server and a fake CSI
//! driver in the test process: the exact sequence of requests and calls.

use std::sync::Arc;
use std::time::Duration;

use csiops_runtime::testing::{self, Log};
use kube::runtime::reflector::ObjectRef;
use serde_json::{json, Value};

use super::super::capabilities::DriverCapabilities;
use super::super::context::Context;
use super::super::decide::ClaimKey;
use super::super::decide::STORAGE_PROVISIONER_ANNOTATION;
use super::super::fixture::{self, Fixture};
use super::super::journal::{test_limiter, Journal};
use super::super::plan::ProvisionerConfig;
use super::super::{controller, sweep};
use super::ClaimError;
use crate::common::fake_csi::FakeController;
use csiops_runtime::shutdown::CancellationToken;

const DRIVER: &str = "fake.csi.csiops.dev";
const CLAIM: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/c1";
const PVS: &str = "/api/v1/persistentvolumes";
const JOURNAL: &str = "/api/v1/namespaces/kube-system/configmaps/journal";

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

/// A provisioner without a journal: each claim carries the finalizer (the
/// fallback without RBAC for the journal, see `super::journal`).
async fn provisioner(log: &Log, dir: &std::path::Path) -> Context {
    provisioner_with(log, dir, testing::Objects::new([(CLAIM, claim())]), None).await
}

/// A provisioner whose journal is in `objects`, its writer running.
async fn journaled(log: &Log, dir: &std::path::Path, objects: testing::Objects) -> Context {
    let client = {
        let objects = objects.clone();
        testing::client(log, move |call| objects.answer(call))
    };
    let (journal, _) = Journal::open(client, test_limiter(), "kube-system", "journal")
        .await
        .expect("journal");
    tokio::spawn(journal.clone().run_writer(CancellationToken::new()));
    let p = provisioner_with(log, dir, objects, Some(journal)).await;
    log.clear();
    p
}

async fn provisioner_with(
    log: &Log,
    dir: &std::path::Path,
    objects: testing::Objects,
    journal: Option<Arc<Journal>>,
) -> Context {
    provisioner_of(log, dir, claim(), objects, journal).await
}

/// [`provisioner_with`], its cache holding `cached` as the claim.
async fn provisioner_of(
    log: &Log,
    dir: &std::path::Path,
    cached: Value,
    objects: testing::Objects,
    journal: Option<Arc<Journal>>,
) -> Context {
    let client = testing::client(log, move |call| objects.answer(call));
    Fixture {
        client,
        driver: FakeController::new(log.clone()).serve(dir).await,
        config: ProvisionerConfig {
            driver_name: DRIVER.into(),
            immediate_topology: true,
            ..Default::default()
        },
        caps: DriverCapabilities::default(),
        claims: fixture::store(&[cached]),
        classes: fixture::store(&[class()]),
        volumes: fixture::store(&[]),
        journal,
    }
    .provisioner()
}

fn key() -> ClaimKey {
    ObjectRef::new("c1").within("ns")
}

#[tokio::test]
async fn the_claim_holds_a_finalizer_from_before_the_volume_until_its_pv_exists() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = provisioner(&log, dir.path()).await;
    super::sync_claim(&p, &key()).await.expect("provisioned");
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
    super::sync_claim(&p, &key()).await.expect("nothing to do");
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
    let err = super::sync_claim(&p, &key())
        .await
        .expect_err("the driver refused");
    assert!(err.to_string().contains("no space"), "{err}");
    assert_eq!(
        log.writes(),
        vec![format!("PATCH {CLAIM}"), "CSI CreateVolume".to_string()]
    );
}

#[tokio::test]
async fn with_the_journal_the_claim_is_never_written_and_the_intent_outlives_the_create() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = testing::Objects::new([(CLAIM, claim())]);
    let p = journaled(&log, dir.path(), objects.clone()).await;
    super::sync_claim(&p, &key()).await.expect("provisioned");
    // The intent, the volume, the PV; the trim is written later, alone or
    // with the next intents.
    let writes: Vec<String> = log
        .writes()
        .into_iter()
        .filter(|l| !l.contains("/events"))
        .collect();
    assert_eq!(
        writes[..3],
        [
            format!("PATCH {JOURNAL}"),
            "CSI CreateVolume".to_string(),
            format!("POST {PVS}"),
        ]
    );
    let intent = &log.calls()[0].body["data"];
    let name = intent
        .as_object()
        .and_then(|d| d.keys().next().cloned())
        .expect("an intent");
    assert!(name.starts_with("pvc-"), "{name}");
    assert!(
        !writes.iter().any(|w| w.contains("persistentvolumeclaims")),
        "{writes:?}"
    );
    tokio::time::timeout(Duration::from_secs(5), async {
        while objects.get(JOURNAL).expect("journal")["data"]
            .as_object()
            .is_some_and(|d| !d.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the intent is trimmed once the PV exists");
}

#[tokio::test]
async fn with_the_journal_a_failed_create_keeps_the_intent_unless_the_driver_proves_no_volume() {
    for (status, kept) in [
        (tonic::Status::deadline_exceeded("slow"), true),
        (tonic::Status::invalid_argument("bad parameter"), false),
    ] {
        let log = Log::default();
        let dir = tempfile::tempdir().expect("tempdir");
        let objects = testing::Objects::new([(CLAIM, claim())]);
        let mut p = journaled(&log, dir.path(), objects.clone()).await;
        let second = dir.path().join("second");
        std::fs::create_dir(&second).expect("dir");
        let answer = status.clone();
        p.driver = FakeController {
            create: Arc::new(move || Err(answer.clone())),
            ..FakeController::new(log.clone())
        }
        .serve(&second)
        .await;
        super::sync_claim(&p, &key())
            .await
            .expect_err("the driver refused");
        let journal = p.journal.clone().expect("journal");
        assert_eq!(journal.names().len(), usize::from(kept), "{status:?}");
        assert!(
            !log.writes().iter().any(|w| w.contains(PVS)),
            "no PV without a volume"
        );
    }
}

/// A driver that answers CreateVolume with each of `answers` in turn (the
/// last one from then on), served beside the provisioner's in `dir`.
async fn driver_answering(
    log: &Log,
    dir: &std::path::Path,
    answers: Vec<Result<(), tonic::Status>>,
) -> crate::common::driver::Driver {
    let second = dir.join("second");
    std::fs::create_dir(&second).expect("dir");
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    FakeController {
        create: Arc::new(move || {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            match &answers[n.min(answers.len() - 1)] {
                Ok(()) => (FakeController::new(Log::default()).create)(),
                Err(status) => Err(status.clone()),
            }
        }),
        ..FakeController::new(log.clone())
    }
    .serve(&second)
    .await
}

#[tokio::test]
async fn a_refusal_after_an_attempt_of_unknown_outcome_keeps_the_intent() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = testing::Objects::new([(CLAIM, claim())]);
    let mut p = journaled(&log, dir.path(), objects.clone()).await;
    // The first CreateVolume times out (the volume may exist); the driver,
    // upgraded since, refuses the same request.
    p.driver = driver_answering(
        &log,
        dir.path(),
        vec![
            Err(tonic::Status::deadline_exceeded("slow")),
            Err(tonic::Status::invalid_argument("unknown parameter")),
        ],
    )
    .await;
    let journal = p.journal.clone().expect("journal");
    super::sync_claim(&p, &key()).await.expect_err("timed out");
    let name = journal.names().pop().expect("the intent stays");
    super::sync_claim(&p, &key()).await.expect_err("refused");
    assert_eq!(
        journal.names(),
        vec![name.clone()],
        "the refusal proves nothing about the first call's volume"
    );
    assert!(journal.get(&name).is_some(), "and no trim is on its way");
}

#[tokio::test]
async fn the_sweep_keeps_and_reports_an_intent_whose_request_the_driver_now_refuses() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = testing::Objects::new([(CLAIM, claim())]);
    let mut p = journaled(&log, dir.path(), objects.clone()).await;
    p.driver = driver_answering(
        &log,
        dir.path(),
        vec![
            Err(tonic::Status::deadline_exceeded("slow")),
            Err(tonic::Status::invalid_argument("unknown parameter")),
        ],
    )
    .await;
    super::sync_claim(&p, &key()).await.expect_err("timed out");
    let journal = p.journal.clone().expect("journal");
    let name = journal.names().pop().expect("the intent stays");
    // The claim goes; the sweep sends the stored request to a driver that
    // refuses it now.
    objects.remove(CLAIM);
    log.clear();
    let p = Arc::new(p);
    controller::intent_pass(&p, &name).await;
    assert!(
        log.lines().contains(&"CSI CreateVolume".to_string()),
        "{:?}",
        log.lines()
    );
    assert!(
        !log.lines().contains(&"CSI DeleteVolume".to_string()),
        "nothing was found to delete"
    );
    assert!(journal.get(&name).is_some(), "the intent stays");
    assert_eq!(p.metrics.journal.blocked_intents(), 1);
    // Reported on the journal ConfigMap, the claim being gone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let event = loop {
        let found = log
            .calls()
            .into_iter()
            .find(|c| c.method == "POST" && c.path.ends_with("/events"));
        if let Some(c) = found {
            break c.body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Event: {:?}",
            log.lines()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(event["reason"], "VolumeCleanupBlocked");
    assert_eq!(event["regarding"]["kind"], "ConfigMap");
    assert_eq!(event["regarding"]["name"], "journal");
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("unknown parameter") && note.contains(&name),
        "{note}"
    );
    let err = sweep::sync_intent(&p, &name)
        .await
        .expect_err("still blocked");
    assert!(err.is_blocked(), "{err}");
}

#[tokio::test]
async fn without_the_journal_a_refused_first_attempt_takes_the_finalizer_off() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut p = provisioner(&log, dir.path()).await;
    p.driver = driver_answering(
        &log,
        dir.path(),
        vec![Err(tonic::Status::invalid_argument("bad parameter"))],
    )
    .await;
    super::sync_claim(&p, &key()).await.expect_err("refused");
    let writes: Vec<String> = log
        .writes()
        .into_iter()
        .filter(|w| !w.contains("/events"))
        .collect();
    assert_eq!(
        writes,
        vec![
            format!("PATCH {CLAIM}"),
            "CSI CreateVolume".to_string(),
            format!("PATCH {CLAIM}"),
        ],
        "nothing was made: the finalizer comes off, and a deletion needs no clean-up"
    );
}

#[tokio::test]
async fn the_clean_up_of_a_claim_whose_request_is_now_refused_keeps_the_finalizer() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut deleted = claim();
    deleted["metadata"]["finalizers"] = json!([super::super::decide::CLAIM_FINALIZER]);
    deleted["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
    let objects = testing::Objects::new([(CLAIM, deleted.clone())]);
    let mut p = provisioner_of(&log, dir.path(), deleted, objects.clone(), None).await;
    p.driver = driver_answering(
        &log,
        dir.path(),
        vec![Err(tonic::Status::invalid_argument("unknown parameter"))],
    )
    .await;
    let err = super::sync_claim(&p, &key()).await.expect_err("blocked");
    assert!(matches!(err, ClaimError::CleanUpBlocked { .. }), "{err}");
    assert!(err.to_string().contains("unknown parameter"), "{err}");
    assert_eq!(
        objects.get(CLAIM).expect("claim")["metadata"]["finalizers"],
        json!([super::super::decide::CLAIM_FINALIZER]),
        "the finalizer stays: the volume may exist"
    );
}

#[tokio::test]
async fn the_sweep_deletes_the_volume_of_a_claim_deleted_after_its_intent() {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = testing::Objects::new([(CLAIM, claim())]);
    let mut p = journaled(&log, dir.path(), objects.clone()).await;
    let second = dir.path().join("second");
    std::fs::create_dir(&second).expect("dir");
    // CreateVolume times out (the volume may exist), then the claim goes.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    p.driver = FakeController {
        create: Arc::new(move || {
            if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                Err(tonic::Status::deadline_exceeded("slow"))
            } else {
                (FakeController::new(Log::default()).create)()
            }
        }),
        ..FakeController::new(log.clone())
    }
    .serve(&second)
    .await;
    super::sync_claim(&p, &key()).await.expect_err("timed out");
    let journal = p.journal.clone().expect("journal");
    let name = journal.names().pop().expect("the intent stays");
    objects.remove(CLAIM);
    log.clear();
    sweep::sync_intent(&p, &name).await.expect("cleaned up");
    let lines: Vec<String> = log.lines();
    assert_eq!(
        lines,
        vec![
            format!("GET {CLAIM}"),
            format!("GET {PVS}/{name}"),
            "CSI CreateVolume".to_string(),
            "CSI DeleteVolume".to_string(),
        ]
    );
    assert_eq!(journal.get(&name), None, "trimmed");
}

// ------------------------------------------------------------ forged intents

/// A journal ConfigMap holding `entries` (key → record), as anyone who may
/// write ConfigMaps in the driver's namespace could leave it.
fn journal_with(entries: &[(&str, super::super::journal::Record)]) -> Value {
    let data: serde_json::Map<String, Value> = entries
        .iter()
        .map(|(k, r)| {
            (
                k.to_string(),
                Value::String(serde_json::to_string(r).expect("record serializes")),
            )
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "journal", "namespace": "kube-system", "resourceVersion": "1"},
           "data": data})
}

/// A record of claim ns/gone (which does not exist) for volume `volume`.
fn record_for(volume: &str, secret: Option<(&str, &str)>) -> super::super::journal::Record {
    let gone: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "gone", "namespace": "ns", "uid": "gone-uid"}}))
    .expect("claim");
    let request = csiops_proto::csi::v1::CreateVolumeRequest {
        name: volume.to_string(),
        ..Default::default()
    };
    let secret = secret.map(|(namespace, name)| super::super::params::SecretRef {
        namespace: namespace.into(),
        name: name.into(),
    });
    super::super::journal::Record::new(&gone, "fast", &request, secret.as_ref())
}

fn secret_object(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": name, "namespace": ns}, "data": {"key": "c2VjcmV0"}})
}

/// Sweeps `key` of a journal holding `entries`, with `extra` objects on the
/// API server; the log of what it did and the error.
async fn sweep_forged(
    entries: &[(&str, super::super::journal::Record)],
    key: &str,
    extra: Vec<(String, Value)>,
) -> (Log, Result<(), super::super::sweep::SweepError>) {
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut all = vec![(JOURNAL.to_string(), journal_with(entries))];
    all.extend(extra);
    let objects = testing::Objects::new(all.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let p = journaled(&log, dir.path(), objects).await;
    let result = sweep::sync_intent(&p, key).await;
    (log, result)
}

#[tokio::test]
async fn a_forged_intent_naming_a_live_volume_deletes_nothing() {
    // Key `pvc-forged` (no PV of that name), request for the live `pvc-live`.
    let live_pv = format!("{PVS}/pvc-live");
    let (log, result) = sweep_forged(
        &[("pvc-forged", record_for("pvc-live", None))],
        "pvc-forged",
        vec![(
            live_pv,
            json!({"apiVersion": "v1", "kind": "PersistentVolume",
                              "metadata": {"name": "pvc-live"}}),
        )],
    )
    .await;
    let err = result.expect_err("refused");
    assert!(err.is_blocked(), "{err}");
    assert!(
        err.to_string().contains("creates volume \"pvc-live\""),
        "{err}"
    );
    let csi: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("CSI "))
        .collect();
    assert!(csi.is_empty(), "no CSI call: {csi:?}");
}

#[tokio::test]
async fn a_forged_intent_cannot_hand_the_driver_a_secret() {
    // The class `fast` names no Secret; the intent names kube-system's.
    let admin = "/api/v1/namespaces/kube-system/secrets/admin";
    let (log, result) = sweep_forged(
        &[("pvc-x", record_for("pvc-x", Some(("kube-system", "admin"))))],
        "pvc-x",
        vec![
            (admin.to_string(), secret_object("kube-system", "admin")),
            (
                "/apis/storage.k8s.io/v1/storageclasses/fast".to_string(),
                class(),
            ),
        ],
    )
    .await;
    let err = result.expect_err("refused");
    assert!(err.is_blocked(), "{err}");
    assert!(err.to_string().contains("kube-system/admin"), "{err}");
    let lines = log.lines();
    assert!(
        !lines.iter().any(|l| l.contains("/secrets/")),
        "no Secret read: {lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("CSI ")),
        "no CSI call: {lines:?}"
    );
}

#[tokio::test]
async fn an_intent_with_the_classs_secret_is_cleaned_up_with_it() {
    let mut with_secret = class();
    with_secret["parameters"] = json!({
        "csi.storage.k8s.io/provisioner-secret-namespace": "storage",
        "csi.storage.k8s.io/provisioner-secret-name": "prov"});
    let (log, result) = sweep_forged(
        &[("pvc-y", record_for("pvc-y", Some(("storage", "prov"))))],
        "pvc-y",
        vec![
            (
                "/api/v1/namespaces/storage/secrets/prov".to_string(),
                secret_object("storage", "prov"),
            ),
            (
                "/apis/storage.k8s.io/v1/storageclasses/fast".to_string(),
                with_secret,
            ),
        ],
    )
    .await;
    result.expect("cleaned up");
    let lines = log.lines();
    assert!(
        lines.contains(&"GET /api/v1/namespaces/storage/secrets/prov".to_string()),
        "{lines:?}"
    );
    assert!(lines.contains(&"CSI DeleteVolume".to_string()), "{lines:?}");
}

/// CSI migration: a claim of an in-tree class, handed to the driver that
/// is the plugin's migration target, gets a PV with the in-tree source.
#[tokio::test]
async fn a_claim_of_an_in_tree_class_gets_an_in_tree_pv() {
    const EBS: &str = "ebs.csi.aws.com";
    let log = Log::default();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cached = claim();
    cached["metadata"]["annotations"] = json!({STORAGE_PROVISIONER_ANNOTATION: EBS});
    let mut in_tree = class();
    in_tree["provisioner"] = json!("kubernetes.io/aws-ebs");
    in_tree["parameters"] = json!({"type": "gp3", "fsType": "xfs"});
    let objects = testing::Objects::new([(CLAIM, cached.clone())]);
    let client = testing::client(&log, move |call| objects.answer(call));
    let p = Fixture {
        client,
        driver: FakeController::new(log.clone()).serve(dir.path()).await,
        config: ProvisionerConfig {
            driver_name: EBS.into(),
            immediate_topology: true,
            ..Default::default()
        },
        caps: DriverCapabilities::default(),
        claims: fixture::store(&[cached]),
        classes: fixture::store(&[in_tree]),
        volumes: fixture::store(&[]),
        journal: None,
    }
    .provisioner();
    super::sync_claim(&p, &key()).await.expect("provisioned");
    let calls = log.calls();
    let pv = &calls
        .iter()
        .find(|c| c.method == "POST" && c.path == PVS)
        .expect("the PV is created")
        .body;
    assert_eq!(
        pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"],
        json!("kubernetes.io/aws-ebs")
    );
    assert_eq!(
        pv["spec"]["awsElasticBlockStore"],
        json!({"volumeID": "vol-1", "fsType": "xfs"})
    );
    assert_eq!(pv["spec"]["csi"], Value::Null);
    assert_eq!(pv["spec"]["storageClassName"], json!("fast"));
}
