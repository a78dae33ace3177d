use super::*;
use serde_json::json;

fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-21T10:00:00Z")
        .map(|t| t.with_timezone(&Utc))
        .expect("fixed time")
}

fn pod(name: &str, component: &str, node: &str, status: serde_json::Value) -> PodView {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {COMPONENT: component}},
        "spec": {"nodeName": node, "containers": []},
        "status": status,
    }))
    .expect("pod fixture")
}

fn ready_since(t: &str) -> serde_json::Value {
    json!({"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": t}
    ]})
}

/// A CSINode: its node and the drivers it lists.
type CsiNode = (String, Vec<String>);

fn csinode(name: &str, drivers: &[&str]) -> CsiNode {
    (
        name.to_string(),
        drivers.iter().map(|d| d.to_string()).collect(),
    )
}

static NO_MOUNT_FAILURES: std::collections::BTreeMap<String, String> =
    std::collections::BTreeMap::new();
/// Nodes n1, n2 and n3, Ready.
static NODES: std::sync::LazyLock<std::collections::BTreeMap<String, NodeInfo>> =
    std::sync::LazyLock::new(|| {
        ["n1", "n2", "n3"]
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    NodeInfo {
                        readiness: crate::fleet::Readiness::Ready,
                        ready_since: None,
                        unschedulable: false,
                        taints: Vec::new(),
                    },
                )
            })
            .collect()
    });

fn input<'a>(pods: &'a [PodView], csinodes: &'a [CsiNode]) -> HealthInput<'a> {
    // The nodes whose CSINode lists the driver; leaked, a few bytes a test.
    let registered: &'a BTreeSet<String> = Box::leak(Box::new(
        csinodes
            .iter()
            .filter(|(_, drivers)| drivers.iter().any(|d| d == "hostpath.csi.k8s.io"))
            .map(|(n, _)| n.clone())
            .collect(),
    ));
    HealthInput {
        driver_name: "hostpath.csi.k8s.io",
        kubelet_dir: "/var/lib/kubelet",
        registration_required: true,
        controller_replicas: 1,
        max_unavailable: None,
        statefulset: None,
        deployment: None,
        daemonset: None,
        node_hash: "h2",
        pods,
        nodes: &NODES,
        registered,
        tainted_nodes: 0,
        mount_failures: &NO_MOUNT_FAILURES,
        now: now(),
    }
}

fn creating_since(t: &str) -> serde_json::Value {
    json!({"phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": t}],
        "containerStatuses": [{"name": "driver", "image": "i", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]})
}

#[test]
fn a_pod_creating_past_the_grace_is_looked_into() {
    let long = pod("a", "node", "n1", creating_since("2026-11-21T09:59:00Z"));
    let fresh = pod("b", "node", "n1", creating_since("2026-11-21T09:59:55Z"));
    let running = pod("c", "node", "n1", ready_since("2026-11-21T09:00:00Z"));
    assert!(stuck_creating(&long, now()));
    assert!(!stuck_creating(&fresh, now()));
    assert!(!stuck_creating(&running, now()));
    // Scheduled long ago but no container status at all (a simulated node,
    // or a kubelet that has not seen it yet): nothing is being created.
    let no_statuses = pod(
        "d",
        "node",
        "n1",
        json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-21T09:00:00Z"}
        ]}),
    );
    assert!(!stuck_creating(&no_statuses, now()));
}

#[test]
fn a_failed_mount_is_reported_in_kubelets_words_with_the_kubelet_dir_hint() {
    let pods = [
        pod(
            "node-a",
            "node",
            "n1",
            creating_since("2026-11-21T09:59:00Z"),
        ),
        pod(
            "ctrl-0",
            "controller",
            "n1",
            creating_since("2026-11-21T09:59:00Z"),
        ),
    ];
    let failures = std::collections::BTreeMap::from([
        (
            "node-a".to_string(),
            "MountVolume.SetUp failed for volume \"registration-dir\": hostPath type check failed"
                .to_string(),
        ),
        ("ctrl-0".to_string(), "secret \"x\" not found".to_string()),
    ]);
    let h = assess(&HealthInput {
        mount_failures: &failures,
        ..input(&pods, &[])
    });
    let node = h
        .unhealthy
        .iter()
        .find(|u| u.name == "node-a")
        .expect("node pod");
    assert_eq!(node.reason, "FailedMount");
    assert!(
        node.message.starts_with("MountVolume.SetUp failed"),
        "{}",
        node.message
    );
    assert!(
        node.message
            .contains("spec.node.kubeletDir (/var/lib/kubelet)"),
        "{}",
        node.message
    );
    let ctrl = h
        .unhealthy
        .iter()
        .find(|u| u.name == "ctrl-0")
        .expect("controller pod");
    assert_eq!(
        ctrl.message, "secret \"x\" not found",
        "no kubeletDir hint off the node"
    );
}

#[test]
fn registered_nodes_count_only_csinodes_listing_the_driver() {
    let csinodes = [
        csinode("n1", &["hostpath.csi.k8s.io"]),
        csinode("n2", &["other.csi.example.com"]),
        csinode("n3", &["other.csi.example.com", "hostpath.csi.k8s.io"]),
    ];
    let pods = [
        pod("node-a", "node", "n1", ready_since("2026-11-21T09:00:00Z")),
        pod("node-b", "node", "n2", ready_since("2026-11-21T09:59:50Z")),
    ];
    let h = assess(&input(&pods, &csinodes));
    // Counted over the nodes running a node pod: n3 runs none.
    assert_eq!(h.registered_nodes, 1);
    assert_eq!(h.node_pods, 2);
    // node-b is Ready for 10s only: still within the registration grace.
    assert!(h.unhealthy.is_empty(), "{:?}", h.unhealthy);
}

#[test]
fn ready_node_pod_on_unregistered_node_is_reported_with_kubelet_dir_hint() {
    let csinodes = [csinode("n2", &["other.csi.example.com"])];
    let pods = [pod(
        "node-b",
        "node",
        "n2",
        ready_since("2026-11-21T09:00:00Z"),
    )];
    let h = assess(&input(&pods, &csinodes));
    assert_eq!(h.unhealthy.len(), 1);
    let u = &h.unhealthy[0];
    assert_eq!(
        (u.name.as_str(), u.reason.as_str()),
        ("node-b", "NotRegistered")
    );
    assert_eq!(u.node.as_deref(), Some("n2"));
    assert!(
        u.message.contains("kubeletDir (/var/lib/kubelet)"),
        "{}",
        u.message
    );

    let mut no_registrar = input(&pods, &csinodes);
    no_registrar.registration_required = false;
    assert!(assess(&no_registrar).unhealthy.is_empty());
}

#[test]
fn crash_loops_image_pulls_and_unschedulable_pods_are_reported() {
    let crash = pod(
        "ctrl-0",
        "controller",
        "n1",
        json!({"phase": "Running", "containerStatuses": [{
            "name": "csi-driver", "image": "x", "imageID": "", "ready": false, "restartCount": 7,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}}
        }]}),
    );
    let pull = pod(
        "node-x",
        "node",
        "n1",
        json!({"phase": "Pending", "containerStatuses": [{
            "name": "csi-driver", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}
        }]}),
    );
    let unsched = pod(
        "ctrl-1",
        "controller",
        "",
        json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available"
        }]}),
    );
    let fine = pod("node-y", "node", "n1", ready_since("2026-11-21T09:00:00Z"));
    let pods = [crash, pull, unsched, fine];
    let csinodes = [csinode("n1", &["hostpath.csi.k8s.io"])];
    let h = assess(&input(&pods, &csinodes));
    let got: Vec<(&str, &str)> = h
        .unhealthy
        .iter()
        .map(|u| (u.name.as_str(), u.reason.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("ctrl-0", "CrashLoopBackOff"),
            ("ctrl-1", "Unschedulable"),
            ("node-x", "ImagePullBackOff")
        ]
    );
    assert!(h.unhealthy[0].message.contains("csi-driver: back-off 5m0s"));
    assert_eq!((h.controller_pods, h.node_pods), (2, 2));
}

#[test]
fn terminating_pods_are_counted_but_not_reported() {
    let mut p = pod("ctrl-0", "controller", "n1", json!({"phase": "Failed"}));
    p.terminating = true;
    let pods = [p];
    let h = assess(&input(&pods, &[]));
    assert_eq!(h.controller_pods, 1);
    assert!(h.unhealthy.is_empty());
}

#[test]
fn workload_counts_and_observations_come_from_the_live_objects() {
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "x-controller", "generation": 4, "annotations": {"h": "abc"}},
        "spec": {"replicas": 2, "selector": {}, "serviceName": "x", "template": {},
                 "updateStrategy": {"rollingUpdate": {"partition": 1}}},
        "status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "observedGeneration": 3,
                   "updateRevision": "x-controller-new"}
    }))
    .expect("sts fixture");
    let mut i = input(&[], &[]);
    i.statefulset = Some(&sts);
    let h = assess(&i);
    assert_eq!(
        (
            h.controller.desired,
            h.controller.ready,
            h.controller.updated
        ),
        (2, 1, 2)
    );

    // A StatefulSet scaled to zero for a node roll is not "0/0 ready".
    let mut scaled: StatefulSet = sts.clone();
    scaled.spec.as_mut().unwrap().replicas = Some(0);
    scaled.status.as_mut().unwrap().ready_replicas = Some(0);
    let mut i = input(&[], &[]);
    i.statefulset = Some(&scaled);
    assert_eq!(
        (assess(&i).controller.desired, assess(&i).controller.ready),
        (1, 0)
    );
}

#[test]
fn pods_on_lost_nodes_are_counted_once_and_named_not_reported_unhealthy() {
    // The cluster: the DaemonSet counts only the real node; three
    // lost nodes still run (old) pods and list the driver in their CSINode.
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "x-node", "generation": 2, "annotations": {
            crate::render::labels::TEMPLATE_HASH: "h2",
            crate::fleet::TEMPLATE_GENERATION_ANNOTATION: "2"}},
        "spec": {"selector": {}, "template": {}},
        "status": {"currentNumberScheduled": 1, "desiredNumberScheduled": 1, "numberMisscheduled": 0,
                   "numberReady": 1, "observedGeneration": 2}
    }))
    .expect("ds fixture");
    let node_pod = |name: &str, node: &str, generation: &str, ready: bool| -> PodView {
        let mut p = pod(
            name,
            "node",
            node,
            json!({"phase": "Running", "conditions": [
                {"type": "Ready", "status": if ready {"True"} else {"False"},
                 "lastTransitionTime": "2026-11-21T09:00:00Z"}]}),
        );
        p.set_label(crate::pods::POD_TEMPLATE_GENERATION_LABEL, generation);
        p
    };
    let pods = [
        node_pod("x-node-real", "real", "2", true),
        node_pod("x-node-a", "kwok-a", "1", false),
        node_pod("x-node-b", "kwok-b", "1", false),
        node_pod("x-node-c", "kwok-c", "1", false),
    ];
    let csinodes: Vec<_> = ["real", "kwok-a", "kwok-b", "kwok-c"]
        .iter()
        .map(|n| csinode(n, &["hostpath.csi.k8s.io"]))
        .collect();
    let lost = NodeInfo {
        readiness: crate::fleet::Readiness::Unknown,
        ready_since: Some("2026-11-21T09:50:00Z".into()),
        unschedulable: false,
        taints: Vec::new(),
    };
    let nodes = std::collections::BTreeMap::from([
        (
            "real".to_string(),
            NodeInfo {
                readiness: crate::fleet::Readiness::Ready,
                ..lost.clone()
            },
        ),
        ("kwok-a".to_string(), lost.clone()),
        ("kwok-b".to_string(), lost.clone()),
        ("kwok-c".to_string(), lost),
    ]);
    let mut i = input(&pods, &csinodes);
    i.daemonset = Some(&ds);
    i.nodes = &nodes;
    let h = assess(&i);
    assert_eq!(
        (
            h.node.desired,
            h.node.ready,
            h.node.updated,
            h.node.available,
            h.node.lost
        ),
        (4, 1, 1, 1, 3)
    );
    // Never more registered than desired (the issue saw "4/1").
    assert_eq!(h.registered_nodes, 1);
    assert!(h.unhealthy.is_empty(), "{:?}", h.unhealthy);
    assert_eq!(h.fleet.lost.len(), 3);
    assert!(h.nodes_serving);
}

fn ds_with(generation: i64, observed: Option<i64>, desired: i32) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": "x-node", "generation": generation},
        "spec": {"selector": {}, "template": {}},
        "status": {"currentNumberScheduled": desired, "desiredNumberScheduled": desired,
                   "numberMisscheduled": 0, "numberReady": 0, "observedGeneration": observed}
    }))
    .expect("ds fixture")
}

#[test]
fn a_daemonset_on_no_node_is_said_plainly() {
    let selector = std::collections::BTreeMap::from([("disk".to_string(), "nvme".to_string())]);
    let msg = no_matching_nodes(Some(&ds_with(1, Some(1), 0)), &selector).expect("reported");
    assert!(
        msg.contains("no node matches spec.node.nodeSelector disk=nvme"),
        "{msg}"
    );
    let msg =
        no_matching_nodes(Some(&ds_with(1, Some(1), 0)), &Default::default()).expect("reported");
    assert!(msg.contains("tolerations"), "{msg}");
    // Not before the DaemonSet controller has seen the current spec…
    assert_eq!(
        no_matching_nodes(Some(&ds_with(2, Some(1), 0)), &selector),
        None
    );
    assert_eq!(
        no_matching_nodes(Some(&ds_with(1, None, 0)), &selector),
        None
    );
    // …and not when it runs somewhere, or does not exist.
    assert_eq!(
        no_matching_nodes(Some(&ds_with(1, Some(1), 2)), &selector),
        None
    );
    assert_eq!(no_matching_nodes(None, &selector), None);
}
