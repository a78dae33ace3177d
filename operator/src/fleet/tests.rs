//! The node-by-node judgement on small fleets.

use super::*;
use k8s_openapi::api::apps::v1::{DaemonSetSpec, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

const HASH: &str = "h2";
const ANN: &str = "csiops.dev/template-hash";

fn ds(
    hash: &str,
    template_generation: i64,
    desired: i32,
    tolerations: Vec<Toleration>,
) -> DaemonSet {
    DaemonSet {
        metadata: ObjectMeta {
            generation: Some(3),
            annotations: Some(BTreeMap::from([
                (ANN.to_string(), hash.to_string()),
                (
                    TEMPLATE_GENERATION_ANNOTATION.to_string(),
                    template_generation.to_string(),
                ),
            ])),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    tolerations: Some(tolerations),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }),
        status: Some(DaemonSetStatus {
            observed_generation: Some(3),
            desired_number_scheduled: desired,
            ..Default::default()
        }),
    }
}

fn pod(name: &str, node: &str, generation: i64, ready: bool, terminating: bool) -> PodView {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                POD_TEMPLATE_GENERATION_LABEL.to_string(),
                generation.to_string(),
            )])),
            deletion_timestamp: terminating
                .then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    };
    serde_json::from_value(serde_json::to_value(pod).expect("serializes")).expect("a pod view")
}

fn healthy() -> NodeInfo {
    NodeInfo {
        readiness: Readiness::Ready,
        ready_since: Some("2026-11-01T00:00:00Z".into()),
        unschedulable: false,
        taints: Vec::new(),
    }
}

fn unreachable() -> NodeInfo {
    NodeInfo {
        readiness: Readiness::Unknown,
        ready_since: Some("2026-11-25T10:00:00Z".into()),
        unschedulable: false,
        taints: vec![
            TaintInfo {
                key: TAINT_UNREACHABLE.into(),
                value: None,
                effect: "NoSchedule".into(),
            },
            TaintInfo {
                key: TAINT_UNREACHABLE.into(),
                value: None,
                effect: "NoExecute".into(),
            },
        ],
    }
}

struct World {
    ds: DaemonSet,
    pods: Vec<PodView>,
    nodes: BTreeMap<String, NodeInfo>,
    registered: Vec<String>,
}

impl World {
    fn fleet(&self) -> Fleet {
        let pods: Vec<&PodView> = self.pods.iter().collect();
        let registered: BTreeSet<&str> = self.registered.iter().map(String::as_str).collect();
        assess(&FleetInput {
            daemonset: Some(&self.ds),
            desired_hash: HASH,
            hash_annotation: ANN,
            pods: &pods,
            nodes: &self.nodes,
            registered: &registered,
            registration_required: true,
        })
    }
}

/// The cluster: three simulated nodes lost, one real node, the
/// DaemonSet at its new template (generation 2) and only the real node's
/// pod in its `desiredNumberScheduled` (the lost nodes carry the
/// unreachable NoSchedule taint, which DaemonSet pods do not tolerate).
fn three_lost_one_real() -> World {
    let mut nodes = BTreeMap::from([("real".to_string(), healthy())]);
    let mut pods = vec![pod("p-real", "real", 1, true, false)];
    for i in 0..3 {
        nodes.insert(format!("kwok-{i}"), unreachable());
        pods.push(pod(
            &format!("p-{i}"),
            &format!("kwok-{i}"),
            1,
            false,
            false,
        ));
    }
    World {
        ds: ds(HASH, 2, 1, Vec::new()),
        pods,
        nodes,
        registered: vec![
            "real".into(),
            "kwok-0".into(),
            "kwok-1".into(),
            "kwok-2".into(),
        ],
    }
}

#[test]
fn lost_nodes_are_named_counted_once_and_do_not_hold_the_roll() {
    let mut w = three_lost_one_real();
    let f = w.fleet();
    assert_eq!(f.lost.len(), 3);
    assert!(f
        .lost
        .iter()
        .all(|l| l.reason == LostReason::Unreachable && !l.current));
    assert_eq!(f.lost[0].pod.as_deref(), Some("p-0"));
    assert_eq!(f.lost[0].since.as_deref(), Some("2026-11-25T10:00:00Z"));
    // Counted in desired and lost, nowhere else: no count exceeds desired.
    assert_eq!((f.desired, f.ready, f.updated, f.registered), (4, 1, 0, 1));
    assert_eq!(f.missing, 0);
    assert_eq!(
        f.pending,
        vec![("real".to_string(), "runs the previous node pod")]
    );
    let waiting = f.waiting_for().expect("the real node is not rolled yet");
    assert!(
        waiting.contains("0 of 1") && waiting.contains("real"),
        "{waiting}"
    );

    // The DaemonSet gets the user's 1 plus one per lost node: 4.
    assert_eq!(f.max_unavailable(None), IntOrString::Int(4));

    // The real node rolls; the lost nodes still run the old pod: done.
    w.pods[0] = pod("p-real-2", "real", 2, true, false);
    let f = w.fleet();
    assert_eq!(f.waiting_for(), None);
    assert_eq!((f.desired, f.ready, f.updated, f.available), (4, 1, 1, 1));
}

#[test]
fn a_returning_node_is_pending_again_until_it_runs_the_new_pod() {
    let mut w = three_lost_one_real();
    w.pods[0] = pod("p-real-2", "real", 2, true, false);
    w.nodes.insert("kwok-0".into(), healthy());
    w.ds.status.as_mut().unwrap().desired_number_scheduled = 2;
    let f = w.fleet();
    assert_eq!(f.lost.len(), 2);
    assert_eq!(
        f.pending,
        vec![("kwok-0".to_string(), "runs the previous node pod")]
    );
    // Its old pod is deleted, kubelet confirms: the node waits for the new one.
    w.pods[1] = pod("p-0", "kwok-0", 1, true, true);
    let f = w.fleet();
    assert_eq!(
        f.pending,
        vec![("kwok-0".to_string(), "its pod is being replaced")]
    );
    assert_eq!(f.desired, 4);
    w.pods[1] = pod("p-0-2", "kwok-0", 2, true, false);
    let f = w.fleet();
    assert_eq!(f.waiting_for(), None);
    assert_eq!(f.updated, 2);
}

#[test]
fn a_node_without_its_pod_yet_is_waited_for() {
    let w = World {
        ds: ds(HASH, 2, 3, Vec::new()),
        pods: vec![
            pod("a", "n1", 2, true, false),
            pod("b", "n2", 2, true, false),
        ],
        nodes: BTreeMap::from([
            ("n1".to_string(), healthy()),
            ("n2".to_string(), healthy()),
            ("n3".to_string(), healthy()),
        ]),
        registered: vec!["n1".into(), "n2".into()],
    };
    let f = w.fleet();
    assert_eq!(f.missing, 1);
    assert_eq!(f.desired, 3);
    assert!(f
        .waiting_for()
        .expect("n3 has no pod")
        .contains("no node pod yet"));
}

#[test]
fn a_lost_node_the_daemonset_still_counts_is_not_missing() {
    // Tolerating everything, the DaemonSet counts the lost node in its
    // desired number: it is lost, not missing.
    let all = Toleration {
        operator: Some("Exists".into()),
        ..Default::default()
    };
    let mut w = three_lost_one_real();
    w.ds = ds(HASH, 2, 4, vec![all]);
    w.pods[0] = pod("p-real-2", "real", 2, true, false);
    let f = w.fleet();
    assert_eq!((f.missing, f.desired, f.lost.len()), (0, 4, 3));
    assert_eq!(f.waiting_for(), None);
}

#[test]
fn unregistered_and_unready_pods_keep_their_node_pending() {
    let mut w = World {
        ds: ds(HASH, 2, 1, Vec::new()),
        pods: vec![pod("a", "n1", 2, false, false)],
        nodes: BTreeMap::from([("n1".to_string(), healthy())]),
        registered: Vec::new(),
    };
    assert_eq!(w.fleet().pending[0].1, "its node pod is not Ready");
    w.pods[0] = pod("a", "n1", 2, true, false);
    assert_eq!(
        w.fleet().pending[0].1,
        "the driver is not registered in its CSINode"
    );
    w.registered.push("n1".into());
    assert_eq!(w.fleet().waiting_for(), None);
}

#[test]
fn nothing_is_current_until_the_daemonset_carries_the_desired_content() {
    let mut w = three_lost_one_real();
    w.ds = ds("h1", 1, 1, Vec::new());
    let f = w.fleet();
    assert!(!f.daemonset_current);
    assert_eq!(f.updated, 0);
    assert!(f
        .waiting_for()
        .expect("old DaemonSet")
        .contains("not observed"));
    // Applied but not yet observed by its controller.
    w.ds = ds(HASH, 2, 1, Vec::new());
    w.ds.status.as_mut().unwrap().observed_generation = Some(2);
    assert!(!w.fleet().daemonset_current);
}

#[test]
fn cordoned_nodes_roll_like_others_unless_their_pod_is_down() {
    let cordoned = NodeInfo {
        unschedulable: true,
        ..healthy()
    };
    let mut w = World {
        ds: ds(HASH, 2, 2, Vec::new()),
        pods: vec![
            pod("a", "n1", 2, true, false),
            pod("b", "n2", 1, true, false),
        ],
        nodes: BTreeMap::from([("n1".to_string(), healthy()), ("n2".to_string(), cordoned)]),
        registered: vec!["n1".into(), "n2".into()],
    };
    let f = w.fleet();
    assert!(f.lost.is_empty());
    assert_eq!(
        f.cordoned,
        vec!["n2".to_string()],
        "told, while its pod serves"
    );
    assert_eq!(f.ready, 2, "and counted healthy");
    assert_eq!(
        f.pending,
        vec![("n2".to_string(), "runs the previous node pod")]
    );
    w.pods[1] = pod("b", "n2", 2, false, false);
    let f = w.fleet();
    assert!(f.cordoned.is_empty(), "a lost node is told as lost");
    assert_eq!(f.lost.len(), 1);
    assert_eq!(f.lost[0].reason, LostReason::Cordoned);
    assert!(f.lost[0].current);
    assert_eq!(f.waiting_for(), None);
}

#[test]
fn a_pod_whose_node_object_is_gone_is_lost_as_deleted() {
    let w = World {
        ds: ds(HASH, 2, 1, Vec::new()),
        pods: vec![
            pod("a", "n1", 2, true, false),
            pod("b", "gone", 1, true, false),
        ],
        nodes: BTreeMap::from([("n1".to_string(), healthy())]),
        registered: vec!["n1".into()],
    };
    let f = w.fleet();
    assert_eq!(f.lost[0].reason, LostReason::Deleted);
    assert_eq!(f.lost[0].since, None);
    assert_eq!(f.waiting_for(), None);
}

#[test]
fn not_ready_and_tainted_nodes_are_lost_too() {
    let not_ready = NodeInfo {
        readiness: Readiness::NotReady,
        ..healthy()
    };
    let tainted = NodeInfo {
        taints: vec![TaintInfo {
            key: TAINT_NOT_READY.into(),
            value: None,
            effect: "NoSchedule".into(),
        }],
        ..healthy()
    };
    assert_eq!(node_lost(Some(&not_ready)), Some(LostReason::NotReady));
    assert_eq!(node_lost(Some(&tainted)), Some(LostReason::NotReady));
    assert_eq!(
        node_lost(Some(&unreachable())),
        Some(LostReason::Unreachable)
    );
    assert_eq!(node_lost(Some(&healthy())), None);
    assert_eq!(node_lost(None), Some(LostReason::Deleted));
}

#[test]
fn max_unavailable_resolves_percentages_over_healthy_nodes_and_adds_lost_ones() {
    let pct = |s: &str| IntOrString::String(s.into());
    assert_eq!(resolve_max_unavailable(&pct("10%"), 1000), 100);
    assert_eq!(resolve_max_unavailable(&pct("10%"), 5), 1);
    assert_eq!(resolve_max_unavailable(&pct("25%"), 10), 3);
    assert_eq!(resolve_max_unavailable(&IntOrString::Int(3), 10), 3);
    assert_eq!(resolve_max_unavailable(&IntOrString::Int(0), 10), 1);

    let mut w = three_lost_one_real();
    // 997 healthy nodes at 10% (100) + 3 lost.
    w.ds.status.as_mut().unwrap().desired_number_scheduled = 997;
    let f = w.fleet();
    assert_eq!(f.healthy(), 997);
    assert_eq!(f.max_unavailable(Some(&pct("10%"))), IntOrString::Int(103));
    // No lost node: the user's value as written.
    let none_lost = Fleet::default();
    assert_eq!(none_lost.max_unavailable(Some(&pct("10%"))), pct("10%"));
}

#[test]
fn tolerations_match_as_the_scheduler_matches_them() {
    let taint = |k: &str, v: Option<&str>, e: &str| TaintInfo {
        key: k.into(),
        value: v.map(Into::into),
        effect: e.into(),
    };
    let tol = |k: Option<&str>, op: Option<&str>, v: Option<&str>, e: Option<&str>| Toleration {
        key: k.map(Into::into),
        operator: op.map(Into::into),
        value: v.map(Into::into),
        effect: e.map(Into::into),
        ..Default::default()
    };
    let t = taint("a", Some("1"), "NoSchedule");
    assert!(tolerates(&tol(None, Some("Exists"), None, None), &t));
    assert!(tolerates(&tol(Some("a"), Some("Exists"), None, None), &t));
    assert!(tolerates(
        &tol(Some("a"), None, Some("1"), Some("NoSchedule")),
        &t
    ));
    assert!(!tolerates(&tol(Some("a"), None, Some("2"), None), &t));
    assert!(!tolerates(
        &tol(Some("a"), Some("Exists"), None, Some("NoExecute")),
        &t
    ));
    assert!(!tolerates(&tol(Some("b"), Some("Exists"), None, None), &t));

    let lost = unreachable();
    assert!(!daemonset_wants(&lost, &[]));
    assert!(daemonset_wants(
        &lost,
        &[tol(
            Some(TAINT_UNREACHABLE),
            Some("Exists"),
            None,
            Some("NoSchedule")
        )]
    ));
    let cordoned = NodeInfo {
        taints: vec![taint(
            "node.kubernetes.io/unschedulable",
            None,
            "NoSchedule",
        )],
        ..healthy()
    };
    assert!(daemonset_wants(&cordoned, &[]));
}

#[test]
fn over_budget_is_judged_on_healthy_nodes_only() {
    let mut w = three_lost_one_real();
    w.pods[0] = pod("p-real-2", "real", 2, true, false);
    assert!(!w.fleet().over_budget(None));
    w.pods[0] = pod("p-real-2", "real", 2, false, false);
    assert!(w.fleet().over_budget(None), "no healthy node serves");
}
