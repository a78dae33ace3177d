//! The journal's pure parts, and its writer against a fake API server: what
//! each write carries and at which priority.

use std::sync::Arc;
use std::time::Duration;

use csiops_proto::csi::v1::CreateVolumeRequest;
use csiops_runtime::testing::{self, Log};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use serde_json::{json, Value};

use super::*;
use crate::provisioner::node_deployment::PvSeen;
use crate::provisioner::params::SecretRef;

const CM: &str = "/api/v1/namespaces/kube-system/configmaps/csiops-provisioning-fake-csi";
const KEY: &str = "/api/v1/namespaces/kube-system/secrets/csiops-provisioning-fake-csi-key";

/// The journal's key as the fake API server holds it.
fn stored_key(objects: &testing::Objects) -> JournalKey {
    use base64::Engine;
    let secret = objects.get(KEY).expect("the key Secret");
    let b64 = secret["data"][KEY_FIELD].as_str().expect("key field");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64");
    JournalKey::from_bytes(&bytes).expect("key")
}

fn claim(edit: impl FnOnce(&mut Value)) -> PersistentVolumeClaim {
    let mut v = json!({
        "metadata": {"name": "c1", "namespace": "ns", "uid": "u1"},
        "spec": {},
    });
    edit(&mut v);
    serde_json::from_value(v).expect("claim")
}

fn record(uid: &str) -> Record {
    let request = CreateVolumeRequest {
        name: format!("pvc-{uid}"),
        secrets: [("password".to_string(), "hunter2".to_string())].into(),
        ..Default::default()
    };
    let secret = SecretRef {
        namespace: "ns".into(),
        name: "creds".into(),
    };
    Record::new(&claim(|_| {}), "fast", &request, Some(&secret))
}

#[test]
fn names_are_lowercase_object_names() {
    assert_eq!(journal_name("Fake.CSI"), "csiops-provisioning-fake-csi");
    assert_eq!(
        journal_name("hostpath.csi.k8s.io"),
        "csiops-provisioning-hostpath-csi-k8s-io"
    );
}

#[test]
fn a_record_keeps_the_request_but_never_its_secrets() {
    let r = record("u1");
    let request = r.request().expect("decodes");
    assert_eq!(request.name, "pvc-u1");
    assert!(request.secrets.is_empty());
    assert!(!r.encode().contains("hunter2"));
    assert_eq!(
        r.secret_ref(),
        Some(SecretRef {
            namespace: "ns".into(),
            name: "creds".into()
        })
    );
    assert_eq!(r.claim.uid, "u1");
    // What is written is what is read back; what the key did not seal
    // is not (a forgery, or another journal's entry), unless the journal
    // predates its key.
    let (key, _) = JournalKey::generate().expect("key");
    let sealed = key.seal("pvc-u1", r.encode().as_bytes()).expect("seal");
    assert!(!sealed.contains("fast") && !sealed.contains("pvc-u1"));
    let cm = ConfigMap {
        data: Some(
            [
                ("pvc-u1".to_string(), sealed.clone()),
                ("pvc-moved".to_string(), sealed.clone()),
                ("pvc-plain".to_string(), r.encode()),
                ("pvc-bad".to_string(), "{not json".to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    let (good, bad) = parse_entries(&cm, &key, false);
    assert_eq!(good.get("pvc-u1"), Some(&(r.clone(), sealed)));
    assert_eq!(good.len(), 1);
    assert_eq!(
        bad,
        vec![
            "pvc-bad".to_string(),
            "pvc-moved".to_string(),
            "pvc-plain".to_string()
        ]
    );
    let (good, _) = parse_entries(&cm, &key, true);
    assert_eq!(good.get("pvc-plain").map(|(r, _)| r), Some(&r));
}

#[test]
fn the_sweep_decides_from_the_claim_and_the_pv() {
    use IntentAction::*;
    use PvSeen::{Absent, Here};
    let r = record("u1");
    let live = claim(|_| {});
    let deleting = claim(|c| c["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z"));
    let recreated = claim(|c| c["metadata"]["uid"] = json!("u2"));
    let bound_ours = claim(|c| c["spec"]["volumeName"] = json!("pvc-u1"));
    let bound_other = claim(|c| c["spec"]["volumeName"] = json!("pv-static"));
    let cases: &[(Option<&PersistentVolumeClaim>, PvSeen, bool, IntentAction)] = &[
        // held by a claim sync: hands off, whatever else
        (None, Absent, true, Keep),
        // the PV holds the volume
        (None, Here, false, Trim),
        (Some(&live), Here, false, Trim),
        // still wanted: the claim's sync finishes it
        (Some(&live), Absent, false, Keep),
        // nobody wants it
        (None, Absent, false, CleanUp),
        (Some(&deleting), Absent, false, CleanUp),
        (Some(&recreated), Absent, false, CleanUp),
        (Some(&bound_other), Absent, false, CleanUp),
        // its PV came and went: the reclaim policy dealt with the volume
        (Some(&bound_ours), Absent, false, Trim),
    ];
    for (i, (claim, pv, held, want)) in cases.iter().enumerate() {
        assert_eq!(
            intent_action("pvc-u1", &r, *claim, *pv, *held, None),
            *want,
            "case {i}"
        );
    }
}

#[test]
fn on_a_node_the_sweep_cleans_up_what_moved_away() {
    use IntentAction::*;
    use PvSeen::{Absent, Elsewhere, Here};
    let r = record("u1");
    let selected = |node: &str| {
        let node = node.to_string();
        claim(move |c| {
            c["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] = json!(node)
        })
    };
    let here = selected("n1");
    let there = selected("n2");
    let unselected = claim(|_| {});
    let bound_ours = claim(|c| c["spec"]["volumeName"] = json!("pvc-u1"));
    let cases: &[(Option<&PersistentVolumeClaim>, PvSeen, bool, IntentAction)] = &[
        (Some(&here), Absent, true, Keep),
        // still this node's claim
        (Some(&here), Absent, false, Keep),
        // its PV holds this node's volume
        (Some(&here), Here, false, Trim),
        // another node made the claim's PV: ours (if any) is nobody's
        (Some(&there), Elsewhere, false, CleanUp),
        (Some(&here), Elsewhere, false, CleanUp),
        // moved to another node, or handed back to the scheduler
        (Some(&there), Absent, false, CleanUp),
        (Some(&unselected), Absent, false, CleanUp),
        // a PV of the claim came and went, maybe another node's
        (Some(&bound_ours), Absent, false, CleanUp),
        (None, Absent, false, CleanUp),
    ];
    for (i, (claim, pv, held, want)) in cases.iter().enumerate() {
        assert_eq!(
            intent_action("pvc-u1", &r, *claim, *pv, *held, Some("n1")),
            *want,
            "case {i}"
        );
    }
}

#[test]
fn each_node_has_its_own_journal_name() {
    let d = "hostpath.csi.k8s.io";
    assert_eq!(
        node_journal_name(d, "worker-1"),
        "csiops-provisioning-hostpath-csi-k8s-io-worker-1"
    );
    assert_ne!(
        node_journal_name(d, "worker-1"),
        node_journal_name(d, "worker-2")
    );
    // The longest node names still make a valid, distinct object name.
    let long = |last: char| format!("{}{last}", "n".repeat(252));
    let (a, b) = (
        node_journal_name(d, &long('a')),
        node_journal_name(d, &long('b')),
    );
    for n in [&a, &b] {
        assert!(n.len() <= 253, "{n}");
        assert!(crate::provisioner::naming::is_dns1123_subdomain(n), "{n}");
        assert!(n.starts_with("csiops-provisioning-"), "{n}");
    }
    assert_ne!(a, b);
    assert_eq!(a, node_journal_name(d, &long('a')), "deterministic");
}

#[test]
fn one_hold_per_name() {
    let holds = Holds::default();
    let a = holds.take("pvc-1").expect("free");
    assert!(holds.take("pvc-1").is_none());
    assert!(holds.take("pvc-2").is_some());
    assert!(holds.is_held("pvc-1"));
    drop(a);
    assert!(!holds.is_held("pvc-1"));
    assert!(holds.take("pvc-1").is_some());
}

async fn open(log: &Log, objects: testing::Objects) -> Arc<Journal> {
    let (journal, bad) = open_with_unreadable(log, objects).await;
    assert!(bad.is_empty());
    journal
}

/// The journal, with the keys of the entries it could not read.
async fn open_with_unreadable(log: &Log, objects: testing::Objects) -> (Arc<Journal>, Vec<String>) {
    let client = testing::client(log, move |call| objects.answer(call));
    Journal::open(
        client,
        test_limiter(),
        "kube-system",
        "csiops-provisioning-fake-csi",
    )
    .await
    .expect("opens")
}

#[tokio::test]
async fn open_creates_an_empty_journal_once() {
    let log = Log::default();
    let objects = testing::Objects::default();
    let journal = open(&log, objects.clone()).await;
    assert_eq!(
        log.lines(),
        vec![
            format!("GET {KEY}"),
            "POST /api/v1/namespaces/kube-system/secrets".to_string(),
            format!("GET {CM}"),
            "POST /api/v1/namespaces/kube-system/configmaps".to_string()
        ]
    );
    assert!(journal.names().is_empty());
    let cm = objects.get(CM).expect("created");
    assert_eq!(cm["metadata"]["labels"][JOURNAL_LABEL], json!("true"));

    // A second leader reads what the first wrote, with the same key.
    let sealed = stored_key(&objects)
        .seal("pvc-u1", record("u1").encode().as_bytes())
        .expect("seal");
    objects.put(
        CM,
        json!({"metadata": {"name": "csiops-provisioning-fake-csi", "namespace": "kube-system"},
               "data": {"pvc-u1": sealed}}),
    );
    log.clear();
    let journal = open(&log, objects).await;
    assert_eq!(log.lines(), vec![format!("GET {KEY}"), format!("GET {CM}")]);
    assert_eq!(journal.names(), vec!["pvc-u1".to_string()]);
    assert_eq!(journal.get("pvc-u1"), Some(record("u1")));
    // What the first left is inherited, once.
    assert!(journal.take_inherited("pvc-u1"));
    assert!(!journal.take_inherited("pvc-u1"));
    assert!(!journal.take_inherited("pvc-u2"));
}

#[tokio::test]
async fn record_tells_whether_an_earlier_attempt_stood() {
    let log = Log::default();
    let objects = testing::Objects::default();
    let journal = open(&log, objects.clone()).await;
    tokio::spawn(journal.clone().run_writer(CancellationToken::new()));
    let rec = |name: &'static str| journal.record(name, record("a"));
    assert_eq!(rec("pvc-a").await.expect("a"), Recorded::Fresh);
    // Not trimmed (the attempt's outcome is unknown): the next one is not
    // the only one that may have made the volume.
    assert_eq!(rec("pvc-a").await.expect("a"), Recorded::Carried);
    // Trimmed (refused, or its PV exists): the next attempt starts afresh,
    // whether the trim was written yet or not.
    journal.trim("pvc-a");
    assert_eq!(rec("pvc-a").await.expect("a"), Recorded::Fresh);
    assert_eq!(rec("pvc-a").await.expect("a"), Recorded::Carried);
    journal.trim("pvc-a");
    tokio::time::timeout(Duration::from_secs(5), async {
        while objects
            .get(CM)
            .is_some_and(|cm| !cm["data"]["pvc-a"].is_null())
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the trim written");
    assert_eq!(rec("pvc-a").await.expect("a"), Recorded::Fresh);
}

#[tokio::test]
async fn intents_queued_together_share_one_write_and_trims_ride_along() {
    let log = Log::default();
    let objects = testing::Objects::default();
    let journal = open(&log, objects.clone()).await;
    log.clear();
    let stop = CancellationToken::new();
    tokio::spawn(journal.clone().run_writer(stop.clone()));
    // Three intents queued in one poll, before the writer runs: one write.
    let (a, b, c) = tokio::join!(
        journal.record("pvc-a", record("a")),
        journal.record("pvc-b", record("b")),
        journal.record("pvc-c", record("c")),
    );
    a.expect("a");
    b.expect("b");
    c.expect("c");
    assert_eq!(log.lines(), vec![format!("PATCH {CM}")]);
    let cm = objects.get(CM).expect("cm");
    let data = cm["data"].as_object().expect("data");
    assert_eq!(data.len(), 3);

    // An identical intent again (a retried claim) costs nothing.
    journal.record("pvc-a", record("a")).await.expect("again");
    assert_eq!(log.lines().len(), 1);

    // Trims wait for company; the next intent takes them along.
    journal.trim("pvc-a");
    journal.trim("pvc-b");
    assert_eq!(
        journal.get("pvc-a"),
        None,
        "a trim on its way hides the intent"
    );
    journal.record("pvc-d", record("d")).await.expect("d");
    assert_eq!(log.lines().len(), 2);
    let patch = &log.calls()[1].body;
    assert_eq!(patch["data"]["pvc-a"], Value::Null);
    assert_eq!(patch["data"]["pvc-b"], Value::Null);
    assert!(patch["data"]["pvc-d"].is_string());
    let cm = objects.get(CM).expect("cm");
    let mut keys: Vec<&String> = cm["data"].as_object().expect("data").keys().collect();
    keys.sort();
    assert_eq!(keys, ["pvc-c", "pvc-d"]);

    // Trims alone are written too, a little later.
    journal.trim("pvc-c");
    journal.trim("pvc-d");
    tokio::time::timeout(Duration::from_secs(5), async {
        while objects.get(CM).expect("cm")["data"]
            .as_object()
            .is_some_and(|d| !d.is_empty())
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("trims written");
    assert_eq!(log.lines().len(), 3);
    assert!(journal.names().is_empty());
    stop.cancel();
}

/// The token first, then the batch: intents recorded while a write waits
/// for its token ride in it (at QPS 5 a hundred claims cost a write or two).
#[tokio::test]
async fn intents_recorded_while_the_write_waits_for_its_token_share_it() {
    let log = Log::default();
    let objects = testing::Objects::default();
    let client = {
        let objects = objects.clone();
        testing::client(&log, move |call| objects.answer(call))
    };
    // One token now, the next 200 ms later.
    let limiter = Limiter::new(5.0, 1, Default::default());
    let (journal, _) = Journal::open(
        client,
        limiter,
        "kube-system",
        "csiops-provisioning-fake-csi",
    )
    .await
    .expect("opens");
    log.clear();
    let stop = CancellationToken::new();
    tokio::spawn(journal.clone().run_writer(stop.clone()));
    journal.record("pvc-a", record("a")).await.expect("a");
    assert_eq!(log.lines().len(), 1, "the first intent took the token");
    // b makes the writer wait for the next token; c and d come meanwhile.
    let first = {
        let journal = journal.clone();
        tokio::spawn(async move { journal.record("pvc-b", record("b")).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (c, d) = tokio::join!(
        journal.record("pvc-c", record("c")),
        journal.record("pvc-d", record("d")),
    );
    first.await.expect("task").expect("b");
    c.expect("c");
    d.expect("d");
    assert_eq!(
        log.lines(),
        vec![format!("PATCH {CM}"), format!("PATCH {CM}")]
    );
    let mut keys: Vec<String> = log.calls()[1].body["data"]
        .as_object()
        .expect("data")
        .keys()
        .cloned()
        .collect();
    keys.sort();
    assert_eq!(keys, ["pvc-b", "pvc-c", "pvc-d"]);
    stop.cancel();
}

#[tokio::test]
async fn a_refused_write_fails_its_intents_and_keeps_its_trims() {
    let log = Log::default();
    let objects = testing::Objects::default();
    let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let (objects, refuse) = (objects.clone(), refuse.clone());
        testing::client(&log, move |call| {
            if call.method == "PATCH" && refuse.load(std::sync::atomic::Ordering::SeqCst) {
                testing::status(403, "Forbidden", "configmaps is forbidden")
            } else {
                objects.answer(call)
            }
        })
    };
    let (journal, _) = Journal::open(
        client,
        test_limiter(),
        "kube-system",
        "csiops-provisioning-fake-csi",
    )
    .await
    .expect("opens");
    let stop = CancellationToken::new();
    tokio::spawn(journal.clone().run_writer(stop.clone()));
    journal.record("pvc-a", record("a")).await.expect("a");
    refuse.store(true, std::sync::atomic::Ordering::SeqCst);
    journal.trim("pvc-a");
    let err = journal
        .record("pvc-b", record("b"))
        .await
        .expect_err("refused");
    assert!(
        matches!(err, JournalError::Forbidden { verb: "patch", .. }),
        "{err}"
    );
    // The trim waits for the next write; the refused intent is not kept.
    assert!(journal.names().is_empty());
    let cm = objects.get(CM).expect("cm");
    let keys: Vec<&String> = cm["data"].as_object().expect("data").keys().collect();
    assert_eq!(keys, ["pvc-a"]);
    refuse.store(false, std::sync::atomic::Ordering::SeqCst);
    journal.record("pvc-b", record("b")).await.expect("b");
    let cm = objects.get(CM).expect("cm");
    let keys: Vec<&String> = cm["data"].as_object().expect("data").keys().collect();
    assert_eq!(keys, ["pvc-b"]);
    stop.cancel();
}

#[tokio::test]
async fn a_journal_deleted_behind_our_back_is_written_anew_with_all_it_held() {
    let log = Log::default();
    let objects = testing::Objects::default();
    let journal = open(&log, objects.clone()).await;
    let stop = CancellationToken::new();
    tokio::spawn(journal.clone().run_writer(stop.clone()));
    journal.record("pvc-a", record("a")).await.expect("a");
    objects.remove(CM);
    journal.record("pvc-b", record("b")).await.expect("b");
    let cm = objects.get(CM).expect("made again");
    let mut keys: Vec<&String> = cm["data"].as_object().expect("data").keys().collect();
    keys.sort();
    assert_eq!(keys, ["pvc-a", "pvc-b"]);
    assert_eq!(cm["metadata"]["labels"][JOURNAL_LABEL], json!("true"));
    stop.cancel();
}

#[tokio::test]
async fn an_intent_beyond_the_size_budget_is_refused_and_the_journal_keeps_the_rest() {
    let log = Log::default();
    let objects = testing::Objects::default();
    let journal = open(&log, objects.clone()).await;
    let stop = CancellationToken::new();
    tokio::spawn(journal.clone().run_writer(stop.clone()));
    journal.record("pvc-a", record("a")).await.expect("a fits");
    let mut huge = record("h");
    huge.request = k8s_openapi::ByteString(vec![0; SIZE_BUDGET]);
    let err = journal.record("pvc-h", huge).await.expect_err("too big");
    assert!(
        matches!(err, JournalError::Full { entries: 1, .. }),
        "{err}"
    );
    assert_eq!(journal.names(), vec!["pvc-a".to_string()]);
    let cm = objects.get(CM).expect("cm");
    let keys: Vec<&String> = cm["data"].as_object().expect("data").keys().collect();
    assert_eq!(keys, ["pvc-a"]);
    stop.cancel();
}

#[tokio::test]
async fn an_unsealed_journal_is_sealed_once_and_forgeries_are_not_read() {
    let log = Log::default();
    // An earlier version's journal: plain entries, no key yet.
    let objects = testing::Objects::new([(
        CM,
        json!({"metadata": {"name": "csiops-provisioning-fake-csi", "namespace": "kube-system"},
               "data": {"pvc-u1": record("u1").encode()}}),
    )]);
    let journal = open(&log, objects.clone()).await;
    assert_eq!(
        journal.get("pvc-u1"),
        Some(record("u1")),
        "taken once, as the key is made"
    );
    let value = objects.get(CM).expect("cm")["data"]["pvc-u1"]
        .as_str()
        .expect("entry")
        .to_string();
    assert!(value.starts_with(SEALED_PREFIX), "sealed in place: {value}");
    assert!(log.lines().contains(&format!("PATCH {CM}")));

    // From now on a plain entry is a forgery: not read, so never swept.
    let mut cm = objects.get(CM).expect("cm");
    cm["data"]["pvc-forged"] = json!(record("forged").encode());
    objects.put(CM, cm);
    let (journal, bad) = open_with_unreadable(&log, objects).await;
    assert_eq!(bad, vec!["pvc-forged".to_string()]);
    assert_eq!(journal.names(), vec!["pvc-u1".to_string()]);
}
