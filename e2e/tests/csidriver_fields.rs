//! `spec.csiDriver` round-trips through a real kube-apiserver (the test
//! bed's, v1.37 by default; `make test-matrix` runs it on the older
//! supported minors) into the cluster's `CSIDriver` object: every field,
//! `tokenRequests` and `nodeAllocatableUpdatePeriodSeconds` (KEP-4876)
//! included.
//!
//! - The CRD refuses what the CSIDriver API would (a period under 10 s, a
//!   token shorter than 10 minutes or longer than 2^32 s, an audience twice),
//!   naming the field.
//! - A change of a mutable field updates the CSIDriver in place (same UID),
//!   unsetting a field removes it; a change of an immutable one
//!   (`attachRequired`) re-creates it, with a `CSIDriverRecreated` Event.
//! - The fields of newer APIs than the oldest supported (1.35) are stored
//!   where the server has them: `serviceAccountTokenInSecrets` (1.35) and
//!   `nodeAllocatableUpdatePeriodSeconds` on every supported minor,
//!   `preventPodSchedulingIfMissing` (1.36, behind `VolumeLimitScaling`)
//!   from 1.37, where its gate is on by default. No Warning then.
//! - Where the server does not store one (its gate off, or a server older
//!   than the field, which refuses a server-side apply that sets it), the
//!   operator leaves it out, says so with one `CSIDriverFieldNotStored`
//!   Warning naming what it needs, and applies the rest.
//!
//! The operator runs as a local process; no driver pod needs to run (the
//! CSIDriver is applied before any workload).

use std::time::Duration;

use csiops_crds::SERVICE_ACCOUNT_TOKEN_IN_SECRETS_MESSAGE;
use csiops_e2e::cluster::ALLOCATABLE_COUNT_GATE;
use csiops_e2e::testkit::DriverCr;
use csiops_e2e::{operator_bin, testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

const NS: &str = "csi-fields";
const NAME: &str = "fields";
const DRIVER: &str = "fields.csi.example.com";
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(250);

/// The Namespace and a CSIDriverDeployment whose `spec.csiDriver` is `csi`
/// (YAML lines indented by four spaces).
fn object(csi: &str) -> String {
    DriverCr::new(NS, NAME, DRIVER, "v1.0.0")
        .image("registry.example.com/fields-driver:v1.0.0")
        .merge_yaml("csiDriver", csi)
        .expect("the csiDriver fields are a YAML mapping")
        .yaml()
}

/// Every field of `spec.csiDriver` set away from its default.
const ALL_FIELDS: &str = r#"    attachRequired: true
    podInfoOnMount: true
    fsGroupPolicy: File
    volumeLifecycleModes: [Persistent, Ephemeral]
    storageCapacity: true
    requiresRepublish: true
    seLinuxMount: true
    tokenRequests:
    - {audience: vault.example.com, expirationSeconds: 3600}
    - {audience: ""}
    nodeAllocatableUpdatePeriodSeconds: 10
"#;

/// The cluster's CSIDrivers, read as plain JSON: what the API server
/// stores, every field, not only those k8s-openapi's pinned type knows.
fn csidrivers(cluster: &Cluster) -> Api<DynamicObject> {
    Api::all_with(
        cluster.client().expect("client"),
        &ApiResource::erase::<CSIDriver>(&()),
    )
}

/// The CSIDriver's spec as the API server stores it, and its UID.
async fn stored(api: &Api<DynamicObject>) -> Option<(Value, String)> {
    let d = api.get_opt(DRIVER).await.ok()??;
    let uid = d.uid()?;
    Some((d.data.get("spec")?.clone(), uid))
}

/// Waits until the stored spec satisfies `want`; its spec and UID.
async fn wait_spec(
    api: &Api<DynamicObject>,
    cluster: &Cluster,
    what: &str,
    want: impl Fn(&Value) -> bool,
) -> (Value, String) {
    let want = &want;
    let found = wait_for(DEADLINE, POLL, || async move {
        stored(api).await.filter(|(spec, _)| want(spec))
    })
    .await;
    match found {
        Ok(v) => v,
        Err(_) => panic!(
            "CSIDriver {DRIVER}: {what} within {DEADLINE:?}; it is {:?}\n--- events\n{}",
            stored(api).await,
            testkit::kubectl_text(cluster, &["-n", NS, "get", "events"]),
        ),
    }
}

async fn patch_spec(cluster: &Cluster, patch: Value) {
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "patch",
            "csidd",
            NAME,
            "--type=merge",
            "-p",
            &json!({ "spec": { "csiDriver": patch } }).to_string(),
        ])
        .await
        .unwrap_or_else(|e| panic!("kubectl patch {patch}: {e}"));
}

async fn events(cluster: &Cluster) -> Vec<String> {
    testkit::event_lines(cluster, NS, NAME).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_csidriver_field_round_trips_and_changes_in_place_or_by_re_creation() {
    let cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        feature_gates: vec![ALLOCATABLE_COUNT_GATE],
        ..ClusterOptions::default()
    })
    .await
    .expect("cluster starts");
    testkit::install_crd(&cluster).await.expect("CRD installs");
    let mut operator = cluster
        .run_operator(&operator_bin().expect("operator built"))
        .expect("operator starts");
    let api = csidrivers(&cluster);

    the_crd_refuses_what_the_csidriver_api_would(&cluster).await;
    let uid = every_field_reaches_the_csidriver(&cluster, &api).await;
    mutable_fields_change_in_place(&cluster, &api, &uid).await;
    unset_fields_go_from_it_in_place(&cluster, &api, &uid).await;
    an_immutable_field_re_creates_it_keeping_the_others(&cluster, &api, &uid).await;

    operator.check_running().expect("operator still running");
    operator.stop().await;
    cluster.stop().await.expect("cluster stops");
}

/// The CRD refuses what the CSIDriver API would, naming the field.
async fn the_crd_refuses_what_the_csidriver_api_would(cluster: &Cluster) {
    for (csi, expect) in [
        (
            "    nodeAllocatableUpdatePeriodSeconds: 9\n",
            "spec.csiDriver.nodeAllocatableUpdatePeriodSeconds",
        ),
        (
            "    tokenRequests:\n    - {audience: a, expirationSeconds: 599}\n",
            "spec.csiDriver.tokenRequests[0].expirationSeconds",
        ),
        (
            "    tokenRequests:\n    - {audience: a, expirationSeconds: 4294967297}\n",
            "spec.csiDriver.tokenRequests[0].expirationSeconds",
        ),
        (
            "    tokenRequests:\n    - {audience: a}\n    - {audience: a, expirationSeconds: 600}\n",
            "Duplicate value",
        ),
        (
            "    tokenRequests:\n    - {expirationSeconds: 600}\n",
            "spec.csiDriver.tokenRequests[0].audience",
        ),
        // The API server refuses it without tokens, true or false.
        (
            "    serviceAccountTokenInSecrets: true\n",
            SERVICE_ACCOUNT_TOKEN_IN_SECRETS_MESSAGE,
        ),
        (
            "    serviceAccountTokenInSecrets: false\n",
            SERVICE_ACCOUNT_TOKEN_IN_SECRETS_MESSAGE,
        ),
        (
            "    serviceAccountTokenInSecrets: true\n    tokenRequests: []\n",
            SERVICE_ACCOUNT_TOKEN_IN_SECRETS_MESSAGE,
        ),
    ] {
        testkit::assert_refused(cluster, &format!("{csi:?}"), &object(csi), expect).await;
    }
}

/// Every field reaches the CSIDriver, stored as the API server of this
/// minor stores it. Its UID.
async fn every_field_reaches_the_csidriver(cluster: &Cluster, api: &Api<DynamicObject>) -> String {
    testkit::apply_ok(cluster, "all", &object(ALL_FIELDS)).await;
    let (spec, uid) = wait_spec(api, cluster, "carries every field", |s| {
        s["nodeAllocatableUpdatePeriodSeconds"] == 10
    })
    .await;
    let mut want = json!({
            "attachRequired": true,
            "podInfoOnMount": true,
            "fsGroupPolicy": "File",
            "volumeLifecycleModes": ["Persistent", "Ephemeral"],
            "storageCapacity": true,
            "requiresRepublish": true,
            "seLinuxMount": true,
            "tokenRequests": [
                {"audience": "vault.example.com", "expirationSeconds": 3600},
                {"audience": ""}
            ],
            "nodeAllocatableUpdatePeriodSeconds": 10
    });
    // From 1.37 (VolumeLimitScaling on by default) the API server defaults
    // preventPodSchedulingIfMissing to false.
    let minor = cluster.server_minor().await.expect("server version");
    if minor >= 37 {
        want["preventPodSchedulingIfMissing"] = json!(false);
    }
    assert_eq!(
        spec, want,
        "1.{minor}: the CSIDriver as the API server stores it"
    );
    uid
}

/// Mutable fields change in place (the CSIDriver keeps `uid`).
async fn mutable_fields_change_in_place(cluster: &Cluster, api: &Api<DynamicObject>, uid: &str) {
    patch_spec(
        cluster,
        json!({
            "podInfoOnMount": false,
            "fsGroupPolicy": "None",
            "storageCapacity": false,
            "requiresRepublish": false,
            "seLinuxMount": false,
            "tokenRequests": [{"audience": "other.example.com", "expirationSeconds": 7200}],
            "nodeAllocatableUpdatePeriodSeconds": 30
        }),
    )
    .await;
    let (spec, same) = wait_spec(api, cluster, "takes the mutable changes", |s| {
        s["nodeAllocatableUpdatePeriodSeconds"] == 30
    })
    .await;
    assert_eq!(same, uid, "updated in place, not re-created");
    assert_eq!(
        spec["tokenRequests"],
        json!([{"audience": "other.example.com", "expirationSeconds": 7200}])
    );
    for (field, value) in [
        ("podInfoOnMount", json!(false)),
        ("fsGroupPolicy", json!("None")),
        ("storageCapacity", json!(false)),
        ("requiresRepublish", json!(false)),
        ("seLinuxMount", json!(false)),
    ] {
        assert_eq!(spec[field], value, "{field} in {spec}");
    }
}

/// Unset, they are gone from the CSIDriver (still in place), with no
/// re-creation or not-stored Event.
async fn unset_fields_go_from_it_in_place(cluster: &Cluster, api: &Api<DynamicObject>, uid: &str) {
    patch_spec(
        cluster,
        json!({"tokenRequests": null, "nodeAllocatableUpdatePeriodSeconds": null}),
    )
    .await;
    let (spec, same) = wait_spec(api, cluster, "loses the unset fields", |s| {
        s.get("nodeAllocatableUpdatePeriodSeconds").is_none() && s.get("tokenRequests").is_none()
    })
    .await;
    assert_eq!(same, uid, "updated in place, not re-created");
    assert_eq!(spec["attachRequired"], true);
    assert!(
        !events(cluster).await.iter().any(
            |e| e.starts_with("CSIDriverRecreated") || e.starts_with("CSIDriverFieldNotStored")
        ),
        "{:#?}",
        events(cluster).await
    );
}

/// An immutable field: re-created (a new UID, an Event saying why), the
/// others kept.
async fn an_immutable_field_re_creates_it_keeping_the_others(
    cluster: &Cluster,
    api: &Api<DynamicObject>,
    uid: &str,
) {
    patch_spec(
        cluster,
        json!({"attachRequired": false, "nodeAllocatableUpdatePeriodSeconds": 20}),
    )
    .await;
    let (spec, new_uid) = wait_spec(api, cluster, "is re-created without attach", |s| {
        s["attachRequired"] == false
    })
    .await;
    assert_ne!(new_uid, uid, "attachRequired is immutable: a new object");
    assert_eq!(spec["nodeAllocatableUpdatePeriodSeconds"], 20);
    assert_eq!(
        spec["volumeLifecycleModes"],
        json!(["Persistent", "Ephemeral"])
    );
    let said = events(cluster).await;
    assert!(
        said.iter()
            .any(|e| e.starts_with("CSIDriverRecreated|") && e.contains("field is immutable")),
        "{said:#?}"
    );
}

/// The fields of newer APIs than the oldest supported one (1.35) that
/// [`ALL_FIELDS`] lacks.
const NEWER_FIELDS: &str = r#"    serviceAccountTokenInSecrets: true
    preventPodSchedulingIfMissing: true
"#;

/// The stored-or-not fields the tests look at.
const CHECKED: [&str; 3] = [
    "nodeAllocatableUpdatePeriodSeconds",
    "serviceAccountTokenInSecrets",
    "preventPodSchedulingIfMissing",
];

/// Applies [`ALL_FIELDS`] and [`NEWER_FIELDS`] and waits for the CSIDriver;
/// its stored spec.
async fn apply_all_and_newer(cluster: &Cluster, api: &Api<DynamicObject>) -> Value {
    testkit::apply_ok(
        cluster,
        "all",
        &object(&format!("{ALL_FIELDS}{NEWER_FIELDS}")),
    )
    .await;
    let (spec, _) = wait_spec(api, cluster, "exists", |s| s["requiresRepublish"] == true).await;
    assert_eq!(
        spec["tokenRequests"],
        json!([
            {"audience": "vault.example.com", "expirationSeconds": 3600},
            {"audience": ""}
        ]),
        "the rest is applied: {spec}"
    );
    assert_eq!(spec["fsGroupPolicy"], "File", "{spec}");
    spec
}

/// The CSIDriver's `csiops.dev/applied-hash`.
async fn applied_hash(api: &Api<DynamicObject>) -> String {
    let d = api.get(DRIVER).await.expect("CSIDriver");
    d.annotations()
        .get("csiops.dev/applied-hash")
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_the_api_server_does_not_store_are_warned_about() {
    // VolumeLimitScaling off: 1.37 (beta) and 1.36 (alpha) then drop
    // preventPodSchedulingIfMissing; 1.35 does not know the field and
    // refuses an apply that sets it. The other two are stored on every
    // supported minor (their gates are on by default from 1.35).
    let cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        feature_gates: vec![("VolumeLimitScaling", false)],
        ..ClusterOptions::default()
    })
    .await
    .expect("cluster starts");
    testkit::install_crd(&cluster).await.expect("CRD installs");
    let mut operator = cluster
        .run_operator(&operator_bin().expect("operator built"))
        .expect("operator starts");
    let api = csidrivers(&cluster);

    let spec = apply_all_and_newer(&cluster, &api).await;
    assert!(
        spec.get("preventPodSchedulingIfMissing").is_none(),
        "the API server does not store preventPodSchedulingIfMissing: {spec}"
    );
    assert_eq!(
        spec["nodeAllocatableUpdatePeriodSeconds"],
        json!(10),
        "{spec}"
    );
    assert_eq!(spec["serviceAccountTokenInSecrets"], json!(true), "{spec}");
    let warning = wait_for(DEADLINE, POLL, || async {
        events(&cluster)
            .await
            .into_iter()
            .find(|e| e.starts_with("CSIDriverFieldNotStored|"))
    })
    .await;
    let Ok(warning) = warning else {
        panic!(
            "no CSIDriverFieldNotStored warning: {:#?}\n{}",
            events(&cluster).await,
            operator.log_tail(30)
        );
    };
    for needs in [
        "spec.preventPodSchedulingIfMissing (it needs Kubernetes 1.36 or later with the VolumeLimitScaling feature gate",
        DRIVER,
    ] {
        assert!(warning.contains(needs), "{needs}: {warning}");
    }
    for stored in [
        "nodeAllocatableUpdatePeriodSeconds",
        "serviceAccountTokenInSecrets",
    ] {
        assert!(!warning.contains(stored), "{stored} is stored: {warning}");
    }
    // Stamped so that it is applied again (and checked) at every reconcile.
    let hash = applied_hash(&api).await;
    assert!(hash.ends_with("-incomplete"), "{hash}");
    // Nothing failed meanwhile: the object is not Degraded by the refusals.
    let conditions = testkit::kubectl_text(
        &cluster,
        &[
            "-n",
            NS,
            "get",
            "csidd",
            NAME,
            "-o",
            "jsonpath={.status.conditions}",
        ],
    );
    assert!(!conditions.contains("ApplyFailed"), "{conditions}");

    operator.check_running().expect("operator still running");
    operator.stop().await;
    cluster.stop().await.expect("cluster stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_of_newer_apis_are_stored_where_the_server_has_them() {
    // A stock API server of the minor under test, no gate changed.
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster starts");
    let minor = cluster.server_minor().await.expect("server version");
    testkit::install_crd(&cluster).await.expect("CRD installs");
    let mut operator = cluster
        .run_operator(&operator_bin().expect("operator built"))
        .expect("operator starts");
    let api = csidrivers(&cluster);

    // preventPodSchedulingIfMissing's gate is on by default from 1.37.
    let prevent_stored = minor >= 37;
    apply_all_and_newer(&cluster, &api).await;
    // The hash is stamped once the stored object was compared with the
    // applied one: "-incomplete" where something was not stored.
    let hash = wait_for(DEADLINE, POLL, || async {
        Some(applied_hash(&api).await).filter(|h| !h.is_empty())
    })
    .await
    .expect("the CSIDriver's applied hash is stamped");
    let (spec, _) = stored(&api).await.expect("CSIDriver");
    for field in CHECKED {
        let want = field != "preventPodSchedulingIfMissing" || prevent_stored;
        assert_eq!(
            spec.get(field).is_some(),
            want,
            "1.{minor}: {field} stored is {want}: {spec}"
        );
    }
    assert_eq!(
        hash.ends_with("-incomplete"),
        !prevent_stored,
        "1.{minor}: {hash}"
    );
    // The Warning follows the apply within the same reconcile; where none
    // is due, a few seconds without one (the operator's other Events of
    // the pass arrive meanwhile) stand for "never".
    let warned = wait_for(Duration::from_secs(5), POLL, || async {
        events(&cluster)
            .await
            .into_iter()
            .find(|e| e.starts_with("CSIDriverFieldNotStored|"))
    })
    .await;
    assert_eq!(
        warned.is_ok(),
        !prevent_stored,
        "1.{minor}: {:#?}",
        events(&cluster).await
    );

    operator.check_running().expect("operator still running");
    operator.stop().await;
    cluster.stop().await.expect("cluster stops");
}

/// A claim bound to a volume of [`DRIVER`], and a pod that uses it.
fn claim_and_pod() -> (String, String) {
    let claim = format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata:
  name: fields-pv
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  claimRef: {{namespace: {NS}, name: data}}
  csi: {{driver: {DRIVER}, volumeHandle: vol-1}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
  namespace: {NS}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: fields-pv
  resources: {{requests: {{storage: 1Gi}}}}
"#
    );
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: app
  namespace: {NS}
spec:
  containers:
  - {{name: app, image: registry.example.com/app:1}}
  volumes:
  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}
"#
    );
    (claim, pod)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prevent_pod_scheduling_if_missing_keeps_pods_off_nodes_without_the_driver() {
    // Two kwok nodes, neither with the driver in its CSINode (no kubelet
    // registers anything there). Where the server stores the field (1.37),
    // kube-scheduler keeps the pod off both until one node's CSINode lists
    // the driver, then places it there; elsewhere the field is not stored
    // and the pod is placed at once.
    let cluster = Cluster::start(ClusterOptions::kwok(2))
        .await
        .expect("cluster starts");
    let minor = cluster.server_minor().await.expect("server version");
    let enforced = minor >= 37;
    testkit::install_crd(&cluster).await.expect("CRD installs");
    let mut operator = cluster
        .run_operator(&operator_bin().expect("operator built"))
        .expect("operator starts");
    let api = csidrivers(&cluster);
    testkit::apply_ok(
        &cluster,
        "prevent",
        &object("    attachRequired: false\n    preventPodSchedulingIfMissing: true\n"),
    )
    .await;
    wait_spec(&api, &cluster, "exists", |s| s["attachRequired"] == false).await;
    // The pod only once its claim is bound: a pod the scheduler first
    // turned down for an unbound claim may wait minutes for its next try.
    let (claim, pod) = claim_and_pod();
    testkit::apply_ok(&cluster, "claim", &claim).await;
    let client = cluster.client().expect("client");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    wait_for(DEADLINE, POLL, || async {
        let c = claims.get_opt("data").await.ok().flatten()?;
        (c.status?.phase.as_deref() == Some("Bound")).then_some(())
    })
    .await
    .expect("the claim is bound");
    testkit::apply_ok(&cluster, "pod", &pod).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let node_of = || async {
        pods.get_opt("app")
            .await
            .ok()
            .flatten()
            .and_then(|p| p.spec)
            .and_then(|s| s.node_name)
    };
    if enforced {
        // The scheduler says why, naming the driver (after an earlier
        // FailedScheduling, maybe, while the claim was not yet bound).
        let missing = format!("{DRIVER} CSI driver is not installed on the node");
        let why = wait_for(DEADLINE, POLL, || async {
            testkit::kubectl_text(&cluster, &["-n", NS, "get", "events"])
                .lines()
                .find(|l| l.contains("FailedScheduling") && l.contains(&missing))
                .map(str::to_string)
        })
        .await;
        assert!(
            why.is_ok(),
            "no FailedScheduling naming the driver: {}\n{}",
            testkit::kubectl_text(&cluster, &["-n", NS, "get", "events"]),
            testkit::kubectl_text(&cluster, &["-n", NS, "get", "pv,pvc", "-o", "yaml"])
        );
        assert_eq!(
            node_of().await,
            None,
            "not placed before a node has the driver"
        );
        // The driver registers on the first node.
        let node = "kwok-node-0";
        let csinodes: Api<CSINode> = Api::all(client.clone());
        csinodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": node},
                    "spec": {"drivers": [{"name": DRIVER, "nodeID": node}]}
                }))
                .expect("a CSINode"),
            )
            .await
            .expect("CSINode created");
        let placed = wait_for(DEADLINE, POLL, || async { node_of().await })
            .await
            .expect("placed once a node has the driver");
        assert_eq!(placed, node, "on the node whose CSINode lists the driver");
    } else {
        let placed = wait_for(DEADLINE, POLL, || async { node_of().await }).await;
        assert!(
            placed.is_ok(),
            "1.{minor} does not store the field: the pod is placed"
        );
    }

    operator.check_running().expect("operator still running");
    operator.stop().await;
    cluster.stop().await.expect("cluster stops");
}
