//! [`reconcile`] against a mocked API server (csiops-runtime's `testing`):
//! the exact sequence of writes of one pass.

use std::sync::Arc;

use csiops_runtime::testing::{self, Log};
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use serde_json::{json, Value};

use super::*;
use crate::metrics::Metrics;
use crate::reconcile::scope;
use crate::reconcile::watch::owned::APPLIED_HASH;
use crate::render::RenderConfig;
use kube::runtime::events::{Recorder, Reporter};

const NS: &str = "storage";
const OBJ: &str = "/apis/csiops.dev/v1alpha1/namespaces/storage/csidriverdeployments/hp";

fn cdd(extra_meta: Value, spec: Value) -> Value {
    let mut obj = json!({
        "apiVersion": "csiops.dev/v1alpha1", "kind": "CSIDriverDeployment",
        "metadata": {"name": "hp", "namespace": NS, "uid": "cdd-uid", "generation": 1,
                     "resourceVersion": "1", "creationTimestamp": "2026-11-21T10:00:00Z"},
        "spec": {"driverName": "hp.csi.example.com", "version": "v1", "driver": {"image": "x"}},
    });
    obj["metadata"] = testing::merge(&obj["metadata"], &extra_meta);
    obj["spec"] = testing::merge(&obj["spec"], &spec);
    obj
}

struct Fixture {
    ctx: Arc<Context>,
    log: Log,
    objects: testing::Objects,
}

impl Fixture {
    fn new(obj: Value) -> Self {
        Self::with(obj, [])
    }

    /// With more objects on the fake API server (by path).
    fn with<'a>(obj: Value, more: impl IntoIterator<Item = (&'a str, Value)>) -> Self {
        Self::answering(obj, more, |_| None)
    }

    /// With `first` answering the calls it wants to (a refusal, an outage)
    /// before the fake API server does.
    fn answering<'a>(
        obj: Value,
        more: impl IntoIterator<Item = (&'a str, Value)>,
        first: impl Fn(&testing::Call) -> Option<testing::Reply> + Send + Sync + 'static,
    ) -> Self {
        let log = Log::default();
        let objects = testing::Objects::new(std::iter::once((OBJ, obj.clone())).chain(more));
        let server = objects.clone();
        let client = testing::client(&log, move |call| {
            first(call).unwrap_or_else(|| server.answer(call))
        });
        let (deployments, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Apply(
            serde_json::from_value::<CSIDriverDeployment>(obj).expect("a valid object"),
        ));
        let ctx = Arc::new(Context {
            client: client.clone(),
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "csiops-operator".into(),
                    instance: None,
                },
            ),
            metrics: Arc::new(Metrics::new()),
            scope: Default::default(),
            render_cfg: RenderConfig {
                sidecar_image: "example.com/sidecar:v1".into(),
                operator_version: "0.1.0".into(),
            },
            caches: caches::Caches::empty(),
            deployments,
            pacer: pace::Pacer::new(std::time::Duration::ZERO),
            progress_writes: pace::Pacer::new(std::time::Duration::ZERO),
            objects: Default::default(),
            admission: Default::default(),
        });
        Fixture { ctx, log, objects }
    }

    /// One pass over the object as the API server has it now (the watch
    /// cache's copy is refreshed by the reconciler's own GET).
    async fn reconcile(&self) -> Result<Requeue, Error> {
        let obj = self.objects.get(OBJ).expect("the object");
        let obj: CSIDriverDeployment = serde_json::from_value(obj).expect("a valid object");
        reconcile(Arc::new(obj), self.ctx.clone()).await
    }

    /// Writes so far, without Events.
    fn writes(&self) -> Vec<String> {
        self.log
            .writes()
            .into_iter()
            .filter(|w| !w.contains("/events"))
            .collect()
    }

    fn events(&self) -> usize {
        self.log
            .writes()
            .iter()
            .filter(|w| w.contains("/events"))
            .count()
    }
}

#[tokio::test]
async fn a_new_object_gets_its_finalizer_before_any_child_and_the_node_side_first() {
    let fx = Fixture::new(cdd(json!({}), json!({})));
    fx.reconcile().await.expect("reconciled");
    let writes = fx.writes();
    assert_eq!(writes[0], format!("PATCH {OBJ}"), "{writes:#?}");
    // Supporting objects (side by side, so in any order), then the
    // DaemonSet, then one status write; the controller waits for the node
    // side (an install starts with it).
    let mut supporting = writes[1..writes.len().min(9)].to_vec();
    supporting.sort();
    assert_eq!(
        supporting,
        [
            "PATCH /api/v1/namespaces/storage/serviceaccounts/hp-controller",
            "PATCH /api/v1/namespaces/storage/serviceaccounts/hp-node",
            "PATCH /apis/rbac.authorization.k8s.io/v1/clusterrolebindings/csiops:hp.csi.example.com:attacher",
            "PATCH /apis/rbac.authorization.k8s.io/v1/clusterrolebindings/csiops:hp.csi.example.com:provisioner",
            "PATCH /apis/rbac.authorization.k8s.io/v1/clusterrolebindings/csiops:hp.csi.example.com:registrar",
            "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/storage/rolebindings/hp-journal",
            "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/storage/rolebindings/hp-leases",
            "PATCH /apis/storage.k8s.io/v1/csidrivers/hp.csi.example.com",
        ],
        "{writes:#?}"
    );
    assert_eq!(
        writes[9..],
        [
            "PATCH /apis/apps/v1/namespaces/storage/daemonsets/hp-node",
            &format!("PATCH {OBJ}/status"),
        ],
        "{writes:#?}"
    );
    assert!(fx.events() >= 2, "rollout and step started");
}

#[tokio::test]
async fn a_problem_already_reported_is_not_written_again() {
    // A relative kubeletDir: the render fails, which the user must fix.
    let fx = Fixture::new(cdd(
        json!({}),
        json!({"driver": {"image": "x", "args": []}, "node": {"kubeletDir": "relative/path"}}),
    ));
    fx.reconcile().await.expect("reported, not failed");
    assert_eq!(
        fx.writes(),
        vec![format!("PATCH {OBJ}"), format!("PATCH {OBJ}/status")]
    );
    assert_eq!(fx.events(), 1);
    let status = fx.objects.get(OBJ).expect("the object")["status"].to_string();
    assert!(status.contains("RenderFailed"), "{status}");
    fx.log.clear();
    fx.reconcile().await.expect("reported, not failed");
    assert_eq!(fx.writes(), Vec::<String>::new());
    assert_eq!(fx.events(), 0);
}

#[tokio::test]
async fn a_deleted_object_with_nothing_left_only_loses_its_finalizer() {
    let fx = Fixture::new(cdd(
        json!({"finalizers": [FINALIZER], "deletionTimestamp": "2026-11-21T11:00:00Z"}),
        json!({}),
    ));
    fx.reconcile().await.expect("torn down");
    assert_eq!(fx.writes(), vec![format!("PATCH {OBJ}")]);
    let calls = fx.log.calls();
    let patch = &calls
        .iter()
        .rev()
        .find(|c| c.method == "PATCH")
        .unwrap()
        .body;
    assert_eq!(patch["metadata"]["finalizers"], json!([]));
}

/// The PATCHes of CSIDrivers (dry runs too) in `log`.
fn csidriver_patches(log: &Log) -> Vec<testing::Call> {
    log.calls()
        .into_iter()
        .filter(|c| c.method == "PATCH" && c.path.contains("/csidrivers/"))
        .collect()
}

/// The applied-hash annotation a CSIDriver PATCH carries ("" without one).
fn applied_hash(c: &testing::Call) -> String {
    c.body["metadata"]["annotations"][APPLIED_HASH]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `spec.monitoring` with a PodMonitor wanted.
fn monitored() -> Value {
    cdd(
        json!({}),
        json!({"monitoring": {"metricsAuth": true, "podMonitor": {"enabled": true}}}),
    )
}

const SERVICE: &str = "PATCH /api/v1/namespaces/storage/services/hp-metrics";
const POD_MONITOR: &str =
    "PATCH /apis/monitoring.coreos.com/v1/namespaces/storage/podmonitors/hp-metrics";

#[tokio::test]
async fn without_the_pod_monitor_crd_the_service_is_applied_and_nothing_fails() {
    let fx = Fixture::new(monitored());
    fx.reconcile().await.expect("reconciled");
    let writes = fx.writes();
    // After the workloads: no pod waits on the metrics Service.
    let service = writes.iter().position(|w| w == SERVICE);
    let daemonset = writes
        .iter()
        .position(|w| w.ends_with("/daemonsets/hp-node"));
    assert!(daemonset.is_some() && service > daemonset, "{writes:#?}");
    assert!(
        !writes.iter().any(|w| w.contains("podmonitors")),
        "{writes:#?}"
    );
    // The reviewing sidecars may review: both ServiceAccounts are bound
    // to the shipped role.
    let binding = fx
        .objects
        .get("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/csiops:hp.csi.example.com:metrics-auth")
        .expect("metrics-auth binding");
    assert_eq!(
        binding["roleRef"]["name"], "csiops:metrics-auth",
        "{binding}"
    );
    let subjects = binding["subjects"].to_string();
    assert!(
        subjects.contains("hp-controller") && subjects.contains("hp-node"),
        "{subjects}"
    );
}

#[tokio::test]
async fn with_the_pod_monitor_crd_the_pod_monitor_is_applied_and_removed_with_the_spec() {
    let discovery = json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "monitoring.coreos.com/v1",
        "resources": [{"name": "podmonitors", "singularName": "podmonitor", "namespaced": true,
                       "kind": "PodMonitor", "verbs": ["get", "list", "create", "patch", "delete"]}],
    });
    let fx = Fixture::with(monitored(), [("/apis/monitoring.coreos.com/v1", discovery)]);
    fx.reconcile().await.expect("reconciled");
    let writes = fx.writes();
    assert!(writes.iter().any(|w| w == SERVICE), "{writes:#?}");
    assert!(writes.iter().any(|w| w == POD_MONITOR), "{writes:#?}");

    // Monitoring turned off (a new generation): both are deleted.
    let mut obj = fx.objects.get(OBJ).expect("the object");
    obj["metadata"]["generation"] = json!(2);
    obj["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("monitoring");
    fx.objects.put(OBJ, obj);
    fx.log.clear();
    fx.reconcile().await.expect("reconciled");
    let deletes: Vec<_> = fx
        .log
        .calls()
        .into_iter()
        .filter(|c| c.method == "DELETE")
        .map(|c| c.path)
        .collect();
    assert!(
        deletes.iter().any(|p| p.ends_with("/services/hp-metrics")),
        "{deletes:#?}"
    );
    assert!(
        deletes
            .iter()
            .any(|p| p.ends_with("/podmonitors/hp-metrics")),
        "{deletes:#?}"
    );
}

const BUDGET: &str = "/apis/policy/v1/namespaces/storage/poddisruptionbudgets/hp-controller";

#[tokio::test]
async fn a_replicated_controller_gets_its_budget_before_the_workloads_and_loses_it_at_one() {
    let fx = Fixture::new(cdd(json!({}), json!({"controller": {"replicas": 2}})));
    fx.reconcile().await.expect("reconciled");
    let writes = fx.writes();
    let budget = writes.iter().position(|w| *w == format!("PATCH {BUDGET}"));
    let daemonset = writes
        .iter()
        .position(|w| w.ends_with("/daemonsets/hp-node"));
    assert!(budget.is_some() && budget < daemonset, "{writes:#?}");
    let live = fx.objects.get(BUDGET).expect("the budget");
    assert_eq!(live["spec"]["maxUnavailable"], json!(1), "{live}");
    assert!(
        live["metadata"]["annotations"][APPLIED_HASH].is_string(),
        "{live}"
    );

    // Down to one replica (a new generation): the budget is pruned.
    let mut obj = fx.objects.get(OBJ).expect("the object");
    obj["metadata"]["generation"] = json!(2);
    obj["spec"]["controller"]["replicas"] = json!(1);
    fx.objects.put(OBJ, obj);
    fx.log.clear();
    fx.reconcile().await.expect("reconciled");
    assert!(fx.objects.get(BUDGET).is_none(), "{:#?}", fx.log.lines());
}

#[tokio::test]
async fn a_read_the_api_server_refuses_is_reported_once_it_repeats() {
    // The operator may not list StorageClasses (a 403 on the prune of a
    // changed spec): the object must not go on saying it is fine.
    let fx = Fixture::answering(cdd(json!({}), json!({})), [], |call| {
        (call.method == "GET" && call.path == "/apis/storage.k8s.io/v1/storageclasses").then(|| {
            testing::status(
                403,
                "Forbidden",
                "storageclasses is forbidden: User cannot list",
            )
        })
    });
    let first = fx.reconcile().await.expect("handled, not raised");
    assert!(
        first != Requeue::requeue(std::time::Duration::from_secs(15)),
        "backs off: {first:?}"
    );
    let status = fx.objects.get(OBJ).expect("the object")["status"].clone();
    assert!(
        status.is_null(),
        "a single failure is only retried: {status}"
    );
    fx.reconcile().await.expect("handled, not raised");
    let status = fx.objects.get(OBJ).expect("the object")["status"].clone();
    let degraded = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Degraded"))
        .cloned()
        .expect("Degraded condition");
    assert_eq!(degraded["status"], "True", "{status}");
    assert_eq!(degraded["reason"], "ReadFailed", "{status}");
    let message = degraded["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot list StorageClass objects labelled")
            && message.contains("storageclasses is forbidden"),
        "{message}"
    );
    assert_eq!(status["phase"], "Degraded");
}

#[tokio::test]
async fn a_failed_supporting_write_lets_the_others_finish_and_holds_the_workloads_back() {
    // The supporting objects are written side by side: one refused does not
    // cut the others short, and no workload is applied without them.
    let fx = Fixture::answering(cdd(json!({}), json!({})), [], |call| {
        (call.method == "PATCH" && call.path.ends_with("/serviceaccounts/hp-node"))
            .then(|| testing::status(500, "InternalError", "etcd is having a moment"))
    });
    fx.reconcile().await.expect("retried, not raised");
    let writes = fx.writes();
    for written in [
        "PATCH /api/v1/namespaces/storage/serviceaccounts/hp-controller",
        "PATCH /apis/rbac.authorization.k8s.io/v1/clusterrolebindings/csiops:hp.csi.example.com:registrar",
        "PATCH /apis/storage.k8s.io/v1/csidrivers/hp.csi.example.com",
    ] {
        assert!(writes.iter().any(|w| w == written), "{written}: {writes:#?}");
    }
    assert!(
        !writes.iter().any(|w| w.contains("/daemonsets/")),
        "{writes:#?}"
    );
}

#[tokio::test]
async fn a_csidriver_refused_by_a_webhook_is_not_deleted() {
    // An admission webhook's 403 on the CSIDriver: reported, never "fixed"
    // by deleting the object.
    let fx = Fixture::answering(cdd(json!({}), json!({})), [], |call| {
        (call.method == "PATCH" && call.path.starts_with("/apis/storage.k8s.io/v1/csidrivers/"))
            .then(|| {
                testing::status(
                    403,
                    "Forbidden",
                    "admission webhook \"policy\" denied the request",
                )
            })
    });
    fx.reconcile().await.expect("reported");
    let calls = fx.log.calls();
    assert!(
        !calls
            .iter()
            .any(|c| c.method == "DELETE" && c.path.contains("/csidrivers/")),
        "{:#?}",
        fx.log.lines()
    );
    let status = fx.objects.get(OBJ).expect("the object")["status"].to_string();
    assert!(
        status.contains("ApplyFailed") && status.contains("denied the request"),
        "{status}"
    );
}

#[tokio::test]
async fn supporting_objects_the_spec_no_longer_renders_are_pruned() {
    // The leader-election RoleBinding of a controller whose sidecars were
    // all turned off: no longer rendered, so deleted; someone else's stays.
    // The Role an earlier version made is left to the garbage collector
    // (our owner reference): the operator never calls the roles API.
    let ours = |kind: &str, name: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
               "metadata": {"name": name, "namespace": NS,
                 "labels": {"app.kubernetes.io/managed-by": "csiops-operator",
                            "app.kubernetes.io/instance": "hp"},
                 "ownerReferences": [{"apiVersion": "csiops.dev/v1alpha1",
                   "kind": "CSIDriverDeployment", "name": "hp", "uid": "cdd-uid", "controller": true}]}})
    };
    let role = "/apis/rbac.authorization.k8s.io/v1/namespaces/storage/roles/hp-leader-election";
    let binding =
        "/apis/rbac.authorization.k8s.io/v1/namespaces/storage/rolebindings/hp-leader-election";
    let foreign =
        "/apis/rbac.authorization.k8s.io/v1/namespaces/storage/rolebindings/someone-elses";
    let fx = Fixture::with(
        cdd(
            json!({}),
            json!({"sidecars": {"provisioner": {"enabled": false}, "attacher": {"enabled": false}}}),
        ),
        [
            (role, ours("Role", "hp-leader-election")),
            (binding, ours("RoleBinding", "hp-leader-election")),
            (
                foreign,
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                       "metadata": {"name": "someone-elses", "namespace": NS}}),
            ),
        ],
    );
    fx.reconcile().await.expect("reconciled");
    assert!(fx.objects.get(binding).is_none(), "{:#?}", fx.log.lines());
    assert!(fx.objects.get(foreign).is_some(), "not ours: kept");
    // The prune's lists come after the DaemonSet's apply: a rollout does
    // not wait on them.
    let calls = fx.log.calls();
    let daemonset = calls
        .iter()
        .position(|c| c.method == "PATCH" && c.path.ends_with("/daemonsets/hp-node"));
    let first_list = calls.iter().position(|c| {
        c.method == "GET"
            && [
                "/rolebindings",
                "/clusterrolebindings",
                "/storageclasses",
                "/csidrivers",
            ]
            .iter()
            .any(|kind| c.path.ends_with(kind))
    });
    assert!(
        daemonset.is_some() && first_list > daemonset,
        "{:#?}",
        fx.log.lines()
    );
    assert!(fx.objects.get(role).is_some(), "{:#?}", fx.log.lines());
    assert!(
        !fx.log
            .calls()
            .iter()
            .any(|c| c.path.contains("/roles") || c.path.contains("/clusterroles")),
        "{:#?}",
        fx.log.lines()
    );
}

#[tokio::test]
async fn a_rival_only_the_api_server_knows_of_wins_and_nothing_cluster_scoped_is_written() {
    // Two objects created together: the cache holds only ours, the API
    // server both. The older one (created a minute earlier) owns the name.
    let rival_path = "/apis/csiops.dev/v1alpha1/namespaces/other/csidriverdeployments/hp2";
    let mut rival = cdd(json!({}), json!({}));
    rival["metadata"]["namespace"] = json!("other");
    rival["metadata"]["name"] = json!("hp2");
    rival["metadata"]["uid"] = json!("rival-uid");
    rival["metadata"]["creationTimestamp"] = json!("2026-11-21T09:59:00Z");
    let fx = Fixture::with(cdd(json!({}), json!({})), [(rival_path, rival)]);
    fx.reconcile().await.expect("reported");
    let writes = fx.writes();
    assert!(
        !writes
            .iter()
            .any(|w| w.contains("/clusterroles") || w.contains("/csidrivers/")),
        "{writes:#?}"
    );
    let status = fx.objects.get(OBJ).expect("the object")["status"].to_string();
    assert!(
        status.contains("Conflict") && status.contains("other/hp2"),
        "{status}"
    );
}

#[tokio::test]
async fn a_csidriver_field_the_api_server_drops_is_warned_about_and_applied_again() {
    // An API server with MutableCSINodeAllocatableCount off clears
    // nodeAllocatableUpdatePeriodSeconds without an error; `gate` turns it on.
    use std::sync::atomic::{AtomicBool, Ordering};
    let gate = Arc::new(AtomicBool::new(false));
    let on = gate.clone();
    let fx = Fixture::answering(
        cdd(
            json!({}),
            json!({"csiDriver": {"nodeAllocatableUpdatePeriodSeconds": 10}}),
        ),
        [],
        move |call| {
            (call.method == "PATCH" && call.path.starts_with("/apis/storage.k8s.io/v1/csidrivers/"))
                .then(|| {
                    let mut stored = call.body.clone();
                    if !on.load(Ordering::SeqCst) {
                        if let Some(spec) = stored["spec"].as_object_mut() {
                            spec.remove("nodeAllocatableUpdatePeriodSeconds");
                        }
                    }
                    stored["metadata"]["resourceVersion"] = json!("7");
                    (200, stored)
                })
        },
    );
    let warnings = |log: &Log| -> Vec<String> {
        log.calls()
            .into_iter()
            .filter(|c| c.path.ends_with("/events") && c.body["type"] == "Warning")
            .map(|c| format!("{} {}", c.body["reason"], c.body["note"]))
            .collect()
    };

    fx.reconcile().await.expect("reconciled");
    let patches = csidriver_patches(&fx.log);
    assert_eq!(patches.len(), 2, "a dry run, then the write: {patches:#?}");
    assert!(patches[0].is_dry_run() && !patches[1].is_dry_run());
    assert_eq!(
        patches[1].body["spec"]["nodeAllocatableUpdatePeriodSeconds"],
        10
    );
    let first = applied_hash(&patches[1]);
    assert!(first.ends_with("-incomplete"), "{first}");
    let first_body = patches[1].body.clone();
    let said = warnings(&fx.log);
    assert!(
        said.iter().any(|w| w.contains("CSIDriverFieldNotStored")
            && w.contains("spec.nodeAllocatableUpdatePeriodSeconds")
            && w.contains("MutableCSINodeAllocatableCount")),
        "{said:#?}"
    );

    // Nothing changed: applied again all the same (the same content, a
    // no-op for the API server), not skipped as settled as the watch's
    // record of the last apply would have it.
    fx.log.clear();
    fx.reconcile().await.expect("reconciled");
    let patches = csidriver_patches(&fx.log);
    assert_eq!(patches.len(), 2, "{patches:#?}");
    assert_eq!(patches[1].body, first_body);
    // Told once: the same warning is not published at every reconcile.
    assert!(
        !warnings(&fx.log)
            .iter()
            .any(|w| w.contains("CSIDriverFieldNotStored")),
        "{:#?}",
        warnings(&fx.log)
    );

    // The gate is turned on: stored whole, the real hash, no warning.
    gate.store(true, Ordering::SeqCst);
    fx.log.clear();
    fx.reconcile().await.expect("reconciled");
    let patches = csidriver_patches(&fx.log);
    assert_eq!(patches.len(), 2, "{patches:#?}");
    assert_eq!(format!("{}-incomplete", applied_hash(&patches[1])), first);
    assert!(
        !warnings(&fx.log)
            .iter()
            .any(|w| w.contains("CSIDriverFieldNotStored")),
        "{:#?}",
        warnings(&fx.log)
    );
}

#[tokio::test]
async fn csidriver_fields_an_older_api_server_does_not_know_are_left_out_and_warned_about() {
    // An API server older than a field (1.34 knows neither
    // serviceAccountTokenInSecrets, 1.35, nor preventPodSchedulingIfMissing,
    // 1.36; 1.35 knows only the first): a server-side apply that
    // sets one fails whole, naming one of them (a 500, as the real one
    // answers). `upgraded` makes it a server that knows both.
    use std::sync::atomic::{AtomicBool, Ordering};
    const NEWER: [&str; 2] = [
        "preventPodSchedulingIfMissing",
        "serviceAccountTokenInSecrets",
    ];
    let upgraded = Arc::new(AtomicBool::new(false));
    let knows = upgraded.clone();
    let fx = Fixture::answering(
        cdd(
            json!({}),
            json!({"csiDriver": {
                "tokenRequests": [{"audience": "vault"}],
                "serviceAccountTokenInSecrets": true,
                "preventPodSchedulingIfMissing": false
            }}),
        ),
        [],
        move |call| {
            if knows.load(Ordering::SeqCst)
                || call.method != "PATCH"
                || !call.path.starts_with("/apis/storage.k8s.io/v1/csidrivers/")
            {
                return None;
            }
            let unknown = NEWER
                .iter()
                .find(|f| call.body["spec"].get(**f).is_some())?;
            Some(testing::status(
                500,
                "",
                &format!("failed to create typed patch object (/hp.csi.example.com; storage.k8s.io/v1, Kind=CSIDriver): .spec.{unknown}: field not declared in schema"),
            ))
        },
    );
    let not_stored = |log: &Log| -> Vec<String> {
        log.calls()
            .into_iter()
            .filter(|c| {
                c.path.ends_with("/events") && c.body["reason"] == "CSIDriverFieldNotStored"
            })
            .map(|c| c.body["note"].to_string())
            .collect()
    };
    let newer_in = |c: &testing::Call| -> Vec<&str> {
        NEWER
            .into_iter()
            .filter(|f| c.body["spec"].get(*f).is_some())
            .collect()
    };

    fx.reconcile()
        .await
        .expect("reconciled: the rest is applied");
    let patches = csidriver_patches(&fx.log);
    // Dry runs: refused twice (one field named each time), then accepted
    // without either; then the write, without either.
    assert_eq!(patches.len(), 4, "{patches:#?}");
    assert!(patches[..3].iter().all(|p| p.is_dry_run()) && !patches[3].is_dry_run());
    assert_eq!(newer_in(&patches[0]), NEWER, "sent when set: {patches:#?}");
    assert_eq!(newer_in(&patches[1]).len(), 1);
    assert!(newer_in(&patches[2]).is_empty() && newer_in(&patches[3]).is_empty());
    assert_eq!(
        patches[3].body["spec"]["tokenRequests"][0]["audience"],
        "vault"
    );
    let first = applied_hash(&patches[3]);
    assert!(first.ends_with("-incomplete"), "{first}");
    let said = not_stored(&fx.log);
    assert_eq!(said.len(), 1, "{said:#?}");
    assert!(
        said[0].contains("spec.serviceAccountTokenInSecrets (it needs Kubernetes 1.35 or later with the CSIServiceAccountTokenSecrets feature gate")
            && said[0].contains("spec.preventPodSchedulingIfMissing (it needs Kubernetes 1.36 or later with the VolumeLimitScaling feature gate"),
        "{said:#?}"
    );
    let status = fx.objects.get(OBJ).expect("the object")["status"].to_string();
    assert!(!status.contains("ApplyFailed"), "{status}");

    // Nothing changed: asked again (the server may have been upgraded),
    // the same write, no second warning.
    fx.log.clear();
    fx.reconcile().await.expect("reconciled");
    let again = csidriver_patches(&fx.log);
    assert_eq!(again.len(), 4, "{again:#?}");
    assert_eq!(again[3].body, patches[3].body);
    assert!(not_stored(&fx.log).is_empty(), "{:#?}", fx.log.lines());

    // Upgraded: stored whole, the real hash, no warning.
    upgraded.store(true, Ordering::SeqCst);
    fx.log.clear();
    fx.reconcile().await.expect("reconciled");
    let whole = csidriver_patches(&fx.log);
    assert_eq!(whole.len(), 2, "{whole:#?}");
    assert_eq!(newer_in(&whole[1]), NEWER);
    assert_eq!(whole[1].body["spec"]["serviceAccountTokenInSecrets"], true);
    assert_eq!(
        whole[1].body["spec"]["preventPodSchedulingIfMissing"],
        false
    );
    assert_eq!(format!("{}-incomplete", applied_hash(&whole[1])), first);
    assert!(not_stored(&fx.log).is_empty(), "{:#?}", fx.log.lines());
}

#[tokio::test]
async fn an_object_outside_watch_namespaces_is_left_alone() {
    let mut fx = Fixture::new(cdd(json!({}), json!({})));
    let ctx = Arc::get_mut(&mut fx.ctx).expect("one owner");
    ctx.scope = scope::Namespaces::from_list(["storage-system"]);
    fx.reconcile().await.expect("nothing to do");
    assert!(fx.log.calls().is_empty(), "{:#?}", fx.log.lines());
    // In scope: the same object is acted on.
    let ctx = Arc::get_mut(&mut fx.ctx).expect("one owner");
    ctx.scope = scope::Namespaces::from_list(["storage-system", NS]);
    fx.reconcile().await.expect("reconciled");
    assert!(!fx.writes().is_empty());
}

/// Where a pass's collected Events go out among its writes.
fn event_positions(fx: &Fixture) -> (Vec<usize>, Vec<String>) {
    let writes = fx.log.writes();
    let at = writes
        .iter()
        .enumerate()
        .filter(|(_, w)| w.contains("/events"))
        .map(|(i, _)| i)
        .collect();
    (at, writes)
}

#[tokio::test]
async fn a_pass_publishes_its_events_before_its_status_write() {
    let fx = Fixture::new(cdd(json!({}), json!({})));
    fx.reconcile().await.expect("reconciled");
    let (events, writes) = event_positions(&fx);
    let status = writes
        .iter()
        .position(|w| *w == format!("PATCH {OBJ}/status"))
        .expect("a status write");
    assert!(events.len() >= 2, "{writes:#?}");
    assert!(events.iter().all(|&e| e < status), "{writes:#?}");

    // A problem the user must fix: its Warning, then the status saying it.
    let fx = Fixture::new(cdd(
        json!({}),
        json!({"driver": {"image": "x", "args": []}, "node": {"kubeletDir": "relative/path"}}),
    ));
    fx.reconcile().await.expect("reported, not failed");
    let (events, writes) = event_positions(&fx);
    assert_eq!(events.len(), 1, "{writes:#?}");
    assert_eq!(writes.last(), Some(&format!("PATCH {OBJ}/status")));
}

#[tokio::test]
async fn a_finished_teardown_tells_it_before_the_finalizer_goes_and_drops_the_record() {
    let fx = Fixture::new(cdd(
        json!({"finalizers": [FINALIZER], "deletionTimestamp": "2026-11-21T11:00:00Z"}),
        json!({}),
    ));
    fx.reconcile().await.expect("torn down");
    let (events, writes) = event_positions(&fx);
    let release = writes
        .iter()
        .position(|w| *w == format!("PATCH {OBJ}"))
        .expect("the finalizer released");
    assert!(events.iter().all(|&e| e < release), "{writes:#?}");
    assert!(
        !fx.ctx.objects.holds("storage/hp"),
        "forgotten once torn down"
    );
}
