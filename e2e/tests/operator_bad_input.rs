//! Bad input on a real control plane: the API server refuses what the schema
//! can judge, the operator reports the rest as Degraded with an Event, and
//! nothing of a good driver changes meanwhile.

use std::time::Duration;

use csiops_e2e::node_side::NodeSideSim;
use csiops_e2e::testkit::{self, DriverCr};
use csiops_e2e::{
    operator_bin, sigterm_and_wait, wait_for, Cluster, ClusterOptions, OperatorProcess,
};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use kube::api::Api;

const NS: &str = "csi-hostpath";
const DEADLINE: Duration = Duration::from_secs(90);

/// The Namespace and a CSIDriverDeployment of hostpathplugin with
/// `extra_spec`, spec fields as YAML lines indented by two spaces.
fn object(ns: &str, name: &str, driver: &str, extra_spec: &str) -> String {
    DriverCr::new(ns, name, driver, "v1.17.0")
        .image("registry.k8s.io/sig-storage/hostpathplugin:v1.17.0")
        .merge_yaml("", extra_spec)
        .expect("the extra spec is a YAML mapping")
        .yaml()
}

async fn degraded(cluster: &Cluster, ns: &str, name: &str) -> Option<(String, String)> {
    // One read of the whole status: separate reads can straddle the
    // operator's status write and pair an empty reason with a Degraded phase.
    let out = cluster
        .kubectl_ok(["-n", ns, "get", "csidd", name, "-o", "json"])
        .await
        .ok()?;
    let obj: serde_json::Value = serde_json::from_str(&out).ok()?;
    let status = &obj["status"];
    if status["phase"] != "Degraded" {
        return None;
    }
    let condition = status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Degraded")?;
    Some((
        condition["reason"].as_str()?.to_string(),
        condition["message"].as_str()?.to_string(),
    ))
}

async fn warning_events(cluster: &Cluster, ns: &str, name: &str) -> String {
    cluster
        .kubectl_ok([
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name},type=Warning"),
            "-o",
            "custom-columns=REASON:.reason,MSG:.message",
        ])
        .await
        .unwrap_or_default()
}

/// (resourceVersion, generation) of the good driver's workloads.
async fn fingerprint(
    sts: &Api<StatefulSet>,
    ds: &Api<DaemonSet>,
) -> (Option<String>, Option<String>) {
    let s = sts.get("hostpath-controller").await.expect("sts");
    let d = ds.get("hostpath-node").await.expect("ds");
    (s.metadata.resource_version, d.metadata.resource_version)
}

/// What every phase works on: the cluster, an admin client and the operator
/// (for its log when a wait fails).
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    operator: OperatorProcess,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_or_degraded_and_the_good_driver_is_untouched() {
    let cluster = Cluster::start(ClusterOptions::kwok(3))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    testkit::install_crd(&cluster).await.expect("CRD installs");
    let operator = cluster
        .run_operator(&operator_bin().expect("operator built"))
        .expect("operator starts");
    let _hostpath_nodes =
        testkit::node_side(&cluster, NS, "hostpath", "hostpath.csi.k8s.io").expect("node side");
    let _other_nodes = testkit::node_side(&cluster, "csi-other", "other", "other.csi.example.com")
        .expect("node side");

    let example = testkit::central_fixture_path();
    cluster
        .kubectl_ok(["apply", "-f", &example.to_string_lossy()])
        .await
        .expect("central fixture applies");
    testkit::wait_running(&cluster, NS, "hostpath", "v1.17.0", 3, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(40)));
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    let before = fingerprint(&sts, &ds).await;
    let mut bed = Bed {
        cluster,
        client,
        operator,
    };

    the_schema_refuses_what_it_can_judge(&bed).await;
    a_second_object_for_the_same_driver_is_a_conflict(&bed).await;
    an_unrenderable_object_is_degraded_until_fixed(&bed).await;
    a_node_selector_matching_no_node_is_said_plainly(&bed).await;
    a_write_the_api_server_keeps_failing_is_retried(&bed).await;
    // The slow driver's node side runs on to the end, as it did when this
    // was one function.
    let _slow_nodes = a_step_past_its_deadline_is_degraded_and_waits(&bed).await;
    a_changed_storage_class_is_recreated(&bed).await;
    deleting_the_duplicate_removes_nothing_of_the_first(&bed, &sts, &ds, &before).await;

    // SIGTERM ends the operator cleanly and promptly.
    bed.operator.check_running().expect("operator alive");
    assert!(
        sigterm_and_wait(bed.operator.pid(), Duration::from_secs(10)).await,
        "operator still running 10s after SIGTERM:\n{}",
        bed.operator.log_tail(20)
    );
    assert!(
        bed.operator.log_tail(5).contains("csiops-operator stopped"),
        "{}",
        bed.operator.log_tail(20)
    );
    let Bed {
        cluster, operator, ..
    } = bed;
    drop(operator);
    cluster.stop().await.expect("cluster stops");
}

/// The schema refuses what it can judge, with the field named; a name too
/// long for the names derived from it, and a changed driverName, too.
async fn the_schema_refuses_what_it_can_judge(bed: &Bed) {
    let Bed { cluster, .. } = bed;
    for (driver, extra, expect) in [
        ("Bad_Name", "", "spec.driverName"),
        ("ok.csi.example.com", "  node:\n    kubeletDir: var/lib/kubelet\n", "spec.node.kubeletDir"),
        ("ok.csi.example.com", "  node:\n    kubeletDir: /var/lib/../kubelet\n", "kubeletDir must be a clean absolute path"),
        ("ok.csi.example.com", "  controller:\n    replicas: -1\n", "spec.controller.replicas"),
        ("ok.csi.example.com", "  node:\n    kubeletDir: /var/lib/kubelet/\n", "no trailing '/'"),
        ("ok.csi.example.com", "  node:\n    resources:\n      limits:\n        memory: lots\n", "spec.node.resources.limits.memory"),
        ("ok.csi.example.com", "  sidecars:\n    provisioner:\n      resources:\n        requests:\n          cpu: 1 core\n", "spec.sidecars.provisioner.resources.requests.cpu"),
        ("ok.csi.example.com", "  storageClasses:\n  - name: a\n    isDefault: true\n  - name: b\n    isDefault: true\n", "at most one storageClass may set isDefault"),
        ("a-driver-name-too-long-for-a-readiness-taint.io", "  node:\n    readinessTaint: true\n", "needs a driverName of at most 46 characters"),
        ("ok.csi.example.com", "  node:\n    readinessTaint: true\n  sidecars:\n    registrar:\n      enabled: false\n", "needs the registrar"),
        // Topology NodeLocal: what only controller pods could run.
        ("ok.csi.example.com", "  topology: NodeLocal\n", "needs csiDriver.attachRequired: false"),
        ("ok.csi.example.com", "  topology: NodeLocal\n  csiDriver:\n    attachRequired: false\n  controller:\n    replicas: 2\n", "runs no controller workload"),
        ("ok.csi.example.com", "  topology: NodeLocal\n  csiDriver:\n    attachRequired: false\n  sidecars:\n    resizer:\n      enabled: true\n", "the resizer, snapshotter and healthMonitor helpers cannot run"),
        ("ok.csi.example.com", "  topology: NodeLocal\n  csiDriver:\n    attachRequired: false\n  sidecars:\n    extra:\n    - {name: x, image: x}\n", "needs pod: Node"),
        ("ok.csi.example.com", "  topology: Local\n", "spec.topology"),
    ] {
        testkit::assert_refused(cluster, &format!("{driver}/{extra:?}"), &object("csi-bad", "bad", driver, extra), expect).await;
    }
    // A name too long for the names derived from it is refused at admission.
    let long = "a".repeat(42);
    testkit::assert_refused(
        cluster,
        "a 42-character name",
        &object("csi-bad", &long, "ok.csi.example.com", ""),
        "at most 41 characters",
    )
    .await;

    let out = cluster
        .kubectl([
            "-n",
            NS,
            "patch",
            "csidd",
            "hostpath",
            "--type=merge",
            "-p",
            r#"{"spec":{"driverName":"renamed.csi.k8s.io"}}"#,
        ])
        .await
        .expect("kubectl runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("driverName is immutable"));
}

/// A second object claiming the same driver: Degraded (Conflict) with an
/// Event, nothing deployed.
async fn a_second_object_for_the_same_driver_is_a_conflict(bed: &Bed) {
    let Bed {
        cluster,
        client,
        operator,
        ..
    } = bed;
    let dup = object("csi-hostpath-2", "hostpath", "hostpath.csi.k8s.io", "");
    let out = testkit::apply_yaml(cluster, "dup", &dup)
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (reason, message) = wait_for(DEADLINE, Duration::from_millis(300), || {
        degraded(cluster, "csi-hostpath-2", "hostpath")
    })
    .await
    .unwrap_or_else(|_| panic!("duplicate never Degraded\n{}", operator.log_tail(40)));
    assert_eq!(reason, "Conflict");
    assert!(message.contains("csi-hostpath/hostpath"), "{message}");
    let events = wait_for(DEADLINE, Duration::from_millis(300), || async {
        let e = warning_events(cluster, "csi-hostpath-2", "hostpath").await;
        e.contains("Conflict").then_some(e)
    })
    .await
    .expect("Conflict Event");
    assert!(events.contains("already deployed"), "{events}");
    let dup_sts: Api<StatefulSet> = Api::namespaced(client.clone(), "csi-hostpath-2");
    assert!(dup_sts
        .get_opt("hostpath-controller")
        .await
        .expect("get")
        .is_none());
}

/// An object the operator cannot render: Degraded (RenderFailed) naming the
/// flag, and an Event. The controller keeps serving: fixing the object
/// deploys it.
async fn an_unrenderable_object_is_degraded_until_fixed(bed: &Bed) {
    let Bed {
        cluster, operator, ..
    } = bed;
    let unrenderable = object(
        "csi-other",
        "other",
        "other.csi.example.com",
        "  sidecars:\n    provisioner:\n      extraArgs: [\"--csi-address=/tmp/x.sock\"]\n  csiDriver:\n    attachRequired: false\n",
    );
    let out = testkit::apply_yaml(cluster, "other", &unrenderable)
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (reason, message) = wait_for(DEADLINE, Duration::from_millis(300), || {
        degraded(cluster, "csi-other", "other")
    })
    .await
    .expect("unrenderable object Degraded");
    assert_eq!(reason, "RenderFailed");
    assert!(message.contains("--csi-address"), "{message}");
    assert!(warning_events(cluster, "csi-other", "other")
        .await
        .contains("RenderFailed"));

    // The controller keeps serving: fixing the object deploys it.
    let fixed = object(
        "csi-other",
        "other",
        "other.csi.example.com",
        "  csiDriver:\n    attachRequired: false\n",
    );
    let out = testkit::apply_yaml(cluster, "other-fixed", &fixed)
        .await
        .expect("kubectl runs");
    assert!(out.status.success());
    testkit::wait_running(cluster, "csi-other", "other", "v1.17.0", 3, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(40)));
}

/// A nodeSelector that matches no node: said plainly, with an Event.
async fn a_node_selector_matching_no_node_is_said_plainly(bed: &Bed) {
    let Bed {
        cluster, operator, ..
    } = bed;
    let nomatch = object(
        "csi-nomatch",
        "nomatch",
        "nomatch.csi.example.com",
        "  node:\n    nodeSelector:\n      disk: nvme\n  csiDriver:\n    attachRequired: false\n",
    );
    let out = testkit::apply_yaml(cluster, "nomatch", &nomatch)
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (reason, message) = wait_for(DEADLINE, Duration::from_millis(300), || async {
        degraded(cluster, "csi-nomatch", "nomatch")
            .await
            .filter(|(r, _)| r == "NoMatchingNodes")
    })
    .await
    .unwrap_or_else(|_| panic!("no NoMatchingNodes\n{}", operator.log_tail(30)));
    assert!(
        message.contains("spec.node.nodeSelector disk=nvme"),
        "{reason}: {message}"
    );
    assert!(warning_events(cluster, "csi-nomatch", "nomatch")
        .await
        .contains("NoMatchingNodes"));
}

/// A write the API server keeps failing (here a 500 from an admission
/// webhook nobody serves): Degraded ApplyFailed with the API server's
/// message and an Event; the operator keeps retrying and recovers once the
/// cause is gone.
async fn a_write_the_api_server_keeps_failing_is_retried(bed: &Bed) {
    let Bed {
        cluster, operator, ..
    } = bed;
    let webhook = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: csiops-e2e-unreachable
webhooks:
  - name: unreachable.csiops.dev
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 2
    clientConfig:
      url: https://127.0.0.1:1/validate
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: csi-webhook
    rules:
      - apiGroups: ["apps"]
        apiVersions: ["v1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["daemonsets"]
"#;
    let out = testkit::apply_yaml(cluster, "webhook", webhook)
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hooked = object(
        "csi-webhook",
        "hooked",
        "hooked.csi.example.com",
        "  csiDriver:\n    attachRequired: false\n",
    );
    let out = testkit::apply_yaml(cluster, "hooked", &hooked)
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (reason, message) = wait_for(DEADLINE, Duration::from_millis(300), || async {
        degraded(cluster, "csi-webhook", "hooked")
            .await
            .filter(|(r, _)| r == "ApplyFailed")
    })
    .await
    .unwrap_or_else(|_| panic!("no ApplyFailed\n{}", operator.log_tail(30)));
    assert!(
        message.contains("DaemonSet hooked-node"),
        "{reason}: {message}"
    );
    assert!(message.contains("failed calling webhook"), "{message}");
    let events = warning_events(cluster, "csi-webhook", "hooked").await;
    assert!(events.contains("ApplyFailed"), "{events}");
    cluster
        .kubectl_ok([
            "delete",
            "validatingwebhookconfiguration",
            "csiops-e2e-unreachable",
        ])
        .await
        .expect("webhook deleted");
    let _hooked_nodes =
        testkit::node_side(cluster, "csi-webhook", "hooked", "hooked.csi.example.com")
            .expect("node side");
    testkit::wait_running(cluster, "csi-webhook", "hooked", "v1.17.0", 3, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(40)));
}

/// A step past its deadline: without a node side nothing registers, so the
/// install waits in NodeInstall; after rollout.stepTimeoutSeconds the object
/// is Degraded with the concrete reason and an Event, and keeps waiting.
/// Once the nodes register, the same rollout completes. The node side, to
/// keep running.
async fn a_step_past_its_deadline_is_degraded_and_waits(bed: &Bed) -> NodeSideSim {
    let Bed {
        cluster, operator, ..
    } = bed;
    let slow = object(
        "csi-slow",
        "slow",
        "slow.csi.example.com",
        "  rollout:\n    stepTimeoutSeconds: 10\n  csiDriver:\n    attachRequired: false\n",
    );
    let out = testkit::apply_yaml(cluster, "slow", &slow)
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (reason, message) = wait_for(DEADLINE, Duration::from_millis(500), || async {
        degraded(cluster, "csi-slow", "slow")
            .await
            .filter(|(r, _)| r == "RolloutStepTimeout")
    })
    .await
    .unwrap_or_else(|_| panic!("no step deadline\n{}", operator.log_tail(30)));
    assert_eq!(reason, "RolloutStepTimeout");
    assert!(message.contains("step NodeInstall"), "{message}");
    assert!(
        message.contains("0 of 3 node(s) done")
            && message.contains("the driver is not registered in its CSINode"),
        "{message}"
    );
    let progressing = testkit::jsonpath(
        cluster,
        &["-n", "csi-slow", "get", "csidd", "slow"],
        "{.status.conditions[?(@.type==\"Progressing\")].reason}",
    )
    .await
    .expect("jsonpath");
    assert_eq!(progressing, "ProgressDeadlineExceeded");
    assert!(warning_events(cluster, "csi-slow", "slow")
        .await
        .contains("RolloutStepTimeout"));
    // Once the nodes register, the same rollout completes.
    let _slow_nodes =
        testkit::node_side(cluster, "csi-slow", "slow", "slow.csi.example.com").expect("node side");
    testkit::wait_running(cluster, "csi-slow", "slow", "v1.17.0", 3, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", operator.log_tail(40)));
    _slow_nodes
}

/// A StorageClass is immutable: a changed class is deleted and created
/// again (with an Event), and the driver's workloads are not touched.
async fn a_changed_storage_class_is_recreated(bed: &Bed) {
    let Bed {
        cluster,
        client,
        operator,
        ..
    } = bed;
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client.clone());
    let old_uid = classes
        .get("csi-hostpath-sc")
        .await
        .expect("class")
        .metadata
        .uid;
    cluster
        .kubectl_ok([
            "-n", NS, "patch", "csidd", "hostpath", "--type=merge", "-p",
            r#"{"spec":{"storageClasses":[{"name":"csi-hostpath-sc","volumeBindingMode":"WaitForFirstConsumer","allowVolumeExpansion":true,"parameters":{"tier":"gold"}}]}}"#,
        ])
        .await
        .expect("class edit applies");
    let recreated = wait_for(DEADLINE, Duration::from_millis(300), || async {
        let c = classes.get_opt("csi-hostpath-sc").await.ok().flatten()?;
        (c.metadata.uid != old_uid).then_some(c)
    })
    .await
    .unwrap_or_else(|_| panic!("class not re-created\n{}", operator.log_tail(30)));
    assert_eq!(
        recreated
            .parameters
            .as_ref()
            .and_then(|p| p.get("tier"))
            .map(String::as_str),
        Some("gold")
    );
    let events = cluster
        .kubectl_ok([
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=hostpath",
            "-o",
            "custom-columns=REASON:.reason",
        ])
        .await
        .expect("events");
    assert!(events.contains("StorageClassRecreated"), "{events}");
}

/// Deleting the duplicate removes nothing of the first: its workloads are
/// as `before` (see [`fingerprint`]).
async fn deleting_the_duplicate_removes_nothing_of_the_first(
    bed: &Bed,
    sts: &Api<StatefulSet>,
    ds: &Api<DaemonSet>,
    before: &(Option<String>, Option<String>),
) {
    let Bed {
        cluster, client, ..
    } = bed;
    cluster
        .kubectl_ok(["-n", "csi-hostpath-2", "delete", "csidd", "hostpath"])
        .await
        .expect("delete dup");
    let row = testkit::csidd_row(cluster, NS, "hostpath")
        .await
        .expect("row");
    assert_eq!(row["PHASE"], "Running");
    assert!(
        Api::<k8s_openapi::api::storage::v1::CSIDriver>::all(client.clone())
            .get_opt("hostpath.csi.k8s.io")
            .await
            .expect("get")
            .is_some()
    );
    assert_eq!(
        fingerprint(sts, ds).await,
        *before,
        "the good driver's workloads were written to"
    );
}
