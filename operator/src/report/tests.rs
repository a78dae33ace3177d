use super::*;
use crate::health::Health;
use csiops_crds::{ControllerCounts, NodeCounts, RolloutStep, UnhealthyPod};

fn t(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .expect("fixed time")
}

fn healthy() -> Health {
    Health {
        controller: ControllerCounts {
            desired: 1,
            ready: 1,
            updated: 1,
        },
        node: NodeCounts {
            desired: 3,
            ready: 3,
            updated: 3,
            available: 3,
            lost: 0,
        },
        registered_nodes: 3,
        tainted_nodes: 0,
        controller_pods: 1,
        node_pods: 3,
        unhealthy: vec![],
        fleet: Default::default(),
        nodes_serving: true,
    }
}

fn input<'a>(
    health: &'a Health,
    previous: Option<&'a CSIDriverDeploymentStatus>,
) -> ReportInput<'a> {
    ReportInput {
        previous,
        generation: 2,
        spec_version: "v1.17.0",
        controller: true,
        rollout: None,
        waiting_for: None,
        completed: false,
        health,
        problem: None,
        paused: false,
        deleting: false,
        now: t("2026-11-21T10:00:00Z"),
    }
}

fn cond<'a>(s: &'a CSIDriverDeploymentStatus, type_: &str) -> &'a Condition {
    s.condition(type_).expect("condition present")
}

#[test]
fn completed_rollout_is_running_with_summary_columns() {
    let h = healthy();
    let mut i = input(&h, None);
    i.completed = true;
    let s = build(&i);
    assert_eq!(s.phase, Phase::Running);
    assert_eq!(s.current_version.as_deref(), Some("v1.17.0"));
    assert_eq!(
        (
            s.summary.controller.as_str(),
            s.summary.nodes.as_str(),
            s.summary.registered.as_str()
        ),
        ("1/1", "3/3", "3/3")
    );
    assert_eq!(cond(&s, AVAILABLE).status, "True");
    assert_eq!(cond(&s, DEGRADED).status, "False");
    assert_eq!(cond(&s, PROGRESSING).reason, "RolloutComplete");
    assert!(s.conditions.iter().all(|c| c.observed_generation == 2));
}

#[test]
fn rollout_in_progress_shows_kind_step_and_what_it_waits_for() {
    let h = healthy();
    let r = RolloutStatus {
        kind: RolloutKind::Upgrade,
        step: RolloutStep::NodeRoll,
        started_at: "2026-11-21T09:59:00Z".into(),
        step_started_at: "2026-11-21T09:59:30Z".into(),
        target_node_hash: "n".into(),
        target_controller_hash: "c".into(),
    };
    let prev = CSIDriverDeploymentStatus {
        current_version: Some("v1.16.0".into()),
        ..Default::default()
    };
    let mut i = input(&h, Some(&prev));
    i.rollout = Some(&r);
    i.waiting_for = Some("node pods: 1 updated, 3 available of 3 desired");
    let s = build(&i);
    assert_eq!(s.phase, Phase::Upgrading);
    assert_eq!(s.current_version.as_deref(), Some("v1.16.0"));
    assert_eq!(s.target_version.as_deref(), Some("v1.17.0"));
    assert_eq!(cond(&s, PROGRESSING).status, "True");
    assert!(
        s.message
            .contains("Upgrade step NodeRoll: node pods: 1 updated"),
        "{}",
        s.message
    );
}

#[test]
fn a_problem_makes_the_object_degraded_with_its_reason() {
    let h = healthy();
    let p = Problem {
        reason: "Conflict",
        message: "driver hostpath.csi.k8s.io is already deployed by ns-a/hostpath".into(),
    };
    let mut i = input(&h, None);
    i.problem = Some(&p);
    let s = build(&i);
    assert_eq!(s.phase, Phase::Degraded);
    let d = cond(&s, DEGRADED);
    assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", "Conflict"));
    assert_eq!(s.message, p.message);
}

#[test]
fn unhealthy_pods_degrade_a_deployed_driver() {
    let mut h = healthy();
    h.unhealthy.push(UnhealthyPod {
        name: "x-node-abc".into(),
        node: Some("n2".into()),
        reason: "NotRegistered".into(),
        message: "pod is Ready but CSINode n2 does not list driver".into(),
    });
    let prev = CSIDriverDeploymentStatus {
        current_version: Some("v1.17.0".into()),
        ..Default::default()
    };
    let s = build(&input(&h, Some(&prev)));
    assert_eq!(s.phase, Phase::Degraded);
    assert_eq!(cond(&s, DEGRADED).reason, "NotRegistered");
    assert!(s.message.contains("x-node-abc"), "{}", s.message);
    assert_eq!(s.unhealthy_pods.len(), 1);
}

#[test]
fn transition_time_moves_only_when_status_changes() {
    let h = healthy();
    let mut i = input(&h, None);
    i.completed = true;
    let first = build(&i);
    let mut later = input(&h, Some(&first));
    later.now = t("2026-11-21T11:00:00Z");
    let second = build(&later);
    assert_eq!(
        cond(&second, AVAILABLE).last_transition_time,
        "2026-11-21T10:00:00Z"
    );

    let mut broken = healthy();
    broken.controller.ready = 0;
    let mut i3 = input(&broken, Some(&second));
    i3.now = t("2026-11-21T12:00:00Z");
    let third = build(&i3);
    let a = cond(&third, AVAILABLE);
    assert_eq!(
        (a.status.as_str(), a.reason.as_str()),
        ("False", "ControllerNotReady")
    );
    assert_eq!(a.last_transition_time, "2026-11-21T12:00:00Z");
    assert_eq!(third.phase, Phase::Degraded);
}

#[test]
fn deleting_and_paused_phases() {
    let h = healthy();
    let mut i = input(&h, None);
    i.deleting = true;
    assert_eq!(build(&i).phase, Phase::Deleting);
    let mut i = input(&h, None);
    i.paused = true;
    let s = build(&i);
    assert_eq!(s.phase, Phase::Pending);
    assert_eq!(cond(&s, PROGRESSING).reason, "Paused");
}

#[test]
fn tainted_nodes_are_counted_in_status_and_absent_when_none() {
    let mut h = healthy();
    h.tainted_nodes = 2;
    let mut i = input(&h, None);
    i.completed = true;
    let s = build(&i);
    assert_eq!(s.tainted_nodes, 2);
    let json = serde_json::to_value(&s).expect("serializes");
    assert_eq!(json["taintedNodes"], 2);

    let h = healthy();
    let mut i = input(&h, None);
    i.completed = true;
    let json = serde_json::to_value(build(&i)).expect("serializes");
    assert!(json.get("taintedNodes").is_none(), "{json}");
}

#[test]
fn no_ready_controller_replica_is_never_available() {
    // The "controller 0/0 ready": a StatefulSet scaled to zero
    // reads as desired 1 (what the object asks for), ready 0.
    let mut h = healthy();
    h.controller = ControllerCounts {
        desired: 1,
        ready: 0,
        updated: 0,
    };
    let previous = build(&ReportInput {
        completed: true,
        ..input(&healthy(), None)
    });
    let s = build(&input(&h, Some(&previous)));
    let available = cond(&s, AVAILABLE);
    assert_eq!(
        (available.status.as_str(), available.reason.as_str()),
        ("False", "ControllerNotReady")
    );
    assert!(
        available.message.contains("controller 0/1 ready"),
        "{}",
        available.message
    );
    // Paused, it says so rather than blaming the controller.
    let mut i = input(&h, Some(&previous));
    i.paused = true;
    assert_eq!(cond(&build(&i), AVAILABLE).reason, "Paused");
    // An object that asks for no controller replica needs none.
    h.controller.desired = 0;
    assert_eq!(
        cond(&build(&input(&h, Some(&previous))), AVAILABLE).status,
        "True"
    );
}

#[test]
fn nodes_down_within_the_roll_budget_keep_the_driver_available() {
    let previous = build(&ReportInput {
        completed: true,
        ..input(&healthy(), None)
    });
    let mut h = healthy();
    h.nodes_serving = false;
    let s = build(&input(&h, Some(&previous)));
    assert_eq!(cond(&s, AVAILABLE).reason, "NodesNotAvailable");
    h.nodes_serving = true;
    h.node.available = 2;
    assert_eq!(
        cond(&build(&input(&h, Some(&previous))), AVAILABLE).status,
        "True"
    );
}

fn lost(node: &str, reason: crate::fleet::LostReason, since: Option<&str>) -> crate::fleet::Lost {
    crate::fleet::Lost {
        node: node.into(),
        reason,
        since: since.map(Into::into),
        pod: Some(format!("x-node-{node}")),
        current: false,
    }
}

#[test]
fn lost_nodes_are_listed_and_named_in_the_message() {
    use crate::fleet::LostReason;
    let previous = build(&ReportInput {
        completed: true,
        ..input(&healthy(), None)
    });
    let mut h = healthy();
    h.fleet.lost = (0..7)
        .map(|i| {
            lost(
                &format!("n{i}"),
                LostReason::Unreachable,
                Some("2026-11-21T09:00:00Z"),
            )
        })
        .collect();
    let s = build(&input(&h, Some(&previous)));
    assert_eq!(s.lost_nodes.len(), 7);
    assert_eq!(s.lost_nodes[0].pod.as_deref(), Some("x-node-n0"));
    assert!(
        s.message.ends_with("; 7 node(s) lost: n0 (Unreachable), n1 (Unreachable), n2 (Unreachable), n3 (Unreachable), n4 (Unreachable) and 2 more"),
        "{}",
        s.message
    );
    // More than 20: the first 20 are listed, the message counts them all.
    h.fleet.lost = (0..25)
        .map(|i| lost(&format!("n{i:02}"), LostReason::NotReady, None))
        .collect();
    let s = build(&input(&h, Some(&previous)));
    assert_eq!(s.lost_nodes.len(), csiops_crds::MAX_LOST_NODES_LISTED);
    assert!(s.message.contains("25 node(s) lost"), "{}", s.message);
}

#[test]
fn cordoned_nodes_are_listed_and_named_without_costing_availability() {
    let mut h = healthy();
    h.fleet.cordoned = (0..22).map(|i| format!("n{i:02}")).collect();
    let s = build(&ReportInput {
        completed: true,
        ..input(&h, None)
    });
    assert_eq!(s.cordoned_nodes.len(), csiops_crds::MAX_LOST_NODES_LISTED);
    assert_eq!(s.cordoned_nodes[0], "n00");
    assert!(
        s.message
            .ends_with("; 22 node(s) cordoned: n00, n01, n02, n03, n04 and 17 more"),
        "{}",
        s.message
    );
    let available = s.condition("Available").expect("Available");
    assert_eq!(available.status, "True", "{available:?}");
    h.fleet.cordoned.clear();
    let s = build(&input(&h, None));
    assert!(s.cordoned_nodes.is_empty() && !s.message.contains("cordoned"));
}

#[test]
fn a_lost_node_without_a_transition_time_keeps_the_first_time_it_was_seen() {
    use crate::fleet::LostReason;
    let first = t("2026-11-21T10:00:00Z");
    let listed = lost_nodes(&[lost("c", LostReason::Cordoned, None)], None, first);
    assert_eq!(listed[0].since.as_deref(), Some("2026-11-21T10:00:00Z"));
    let before = CSIDriverDeploymentStatus {
        lost_nodes: listed,
        ..Default::default()
    };
    let later = t("2026-11-21T10:30:00Z");
    let again = lost_nodes(
        &[lost("c", LostReason::Cordoned, None)],
        Some(&before),
        later,
    );
    assert_eq!(again[0].since.as_deref(), Some("2026-11-21T10:00:00Z"));
    // Lost for 30 minutes against a 10-minute deadline.
    let long = lost_too_long(&again, chrono::Duration::seconds(600), later);
    assert_eq!(long.len(), 1);
    assert!(lost_too_long(&again, chrono::Duration::seconds(3600), later).is_empty());
    // Lost again for another reason: a new since.
    let other = lost_nodes(
        &[lost("c", LostReason::NotReady, None)],
        Some(&before),
        later,
    );
    assert_eq!(other[0].since.as_deref(), Some("2026-11-21T10:30:00Z"));
}

#[test]
fn the_next_look_is_when_the_next_lost_node_passes_its_deadline() {
    use crate::fleet::LostReason;
    let now = t("2026-11-21T10:01:31Z");
    let listed = lost_nodes(
        &[
            lost("a", LostReason::Unreachable, Some("2026-11-21T10:00:00Z")),
            lost("b", LostReason::Unreachable, Some("2026-11-21T10:00:05Z")),
            lost("c", LostReason::Unreachable, Some("2026-11-21T10:00:20Z")),
        ],
        None,
        now,
    );
    let timeout = chrono::Duration::seconds(90);
    // a is past the 90 s; b reaches it in 4 s, c in 19 s.
    assert_eq!(lost_too_long(&listed, timeout, now).len(), 1);
    let next = next_lost_deadline(&listed, timeout, now).expect("b is next");
    assert_eq!(next, chrono::Duration::seconds(5));
    // Looked at then, b counts too.
    assert_eq!(lost_too_long(&listed, timeout, now + next).len(), 2);
    // Once all are past it, there is nothing to look again for.
    let late = t("2026-11-21T10:05:00Z");
    assert_eq!(next_lost_deadline(&listed, timeout, late), None);
    assert_eq!(next_lost_deadline(&[], timeout, now), None);
}

#[test]
fn a_node_local_driver_is_available_without_a_controller_and_shows_none() {
    let h = Health {
        controller: ControllerCounts::default(),
        controller_pods: 0,
        ..healthy()
    };
    let mut i = input(&h, None);
    i.controller = false;
    i.completed = true;
    let s = build(&i);
    assert_eq!(s.phase, Phase::Running);
    assert_eq!(cond(&s, AVAILABLE).status, "True");
    assert_eq!(cond(&s, AVAILABLE).reason, "AllReady");
    assert_eq!(s.summary.controller, "-");
    assert_eq!(s.message, "node-local: node pods 3/3 available");

    // The same counts for a central driver: no controller is not available.
    let mut central = input(&h, None);
    central.completed = true;
    central.controller = true;
    let mut h1 = h.clone();
    h1.controller.desired = 1;
    central.health = &h1;
    let s = build(&central);
    assert_eq!(cond(&s, AVAILABLE).status, "False");
    assert_eq!(cond(&s, AVAILABLE).reason, "ControllerNotReady");
    assert_eq!(s.summary.controller, "0/1");

    // A central controller still being removed is counted, not hidden, and
    // does not make a node-local driver unavailable.
    let mut h2 = h.clone();
    h2.controller = ControllerCounts {
        desired: 1,
        ready: 0,
        updated: 0,
    };
    let mut leaving = input(&h2, None);
    leaving.controller = false;
    leaving.completed = true;
    let s = build(&leaving);
    assert_eq!(s.summary.controller, "0/1");
    assert_eq!(cond(&s, AVAILABLE).status, "True");
}

#[test]
fn counts_and_messages_are_progress_and_the_rest_is_not() {
    let h = healthy();
    let old = build(&input(&h, None));
    let mut new = old.clone();
    assert!(progress_only(&old, &new), "no change at all");
    new.node.ready = 2;
    new.node.available = 2;
    new.message = "2 of 3 node pods ready".into();
    new.summary.registered = "2/3".into();
    if let Some(c) = new.conditions.first_mut() {
        c.message = "something else".into();
    }
    assert!(progress_only(&old, &new), "{new:?}");

    let changed: [fn(&mut CSIDriverDeploymentStatus); 6] = [
        |s| s.phase = csiops_crds::Phase::Degraded,
        |s| s.observed_generation += 1,
        |s| s.current_version = Some("v9".into()),
        |s| {
            if let Some(c) = s.conditions.first_mut() {
                c.status = if c.status == "True" { "False" } else { "True" }.into();
            }
        },
        |s| {
            s.lost_nodes.push(csiops_crds::LostNode {
                name: "n1".into(),
                reason: "NotReady".into(),
                since: None,
                pod: None,
                current: false,
            })
        },
        |s| {
            s.rollout = Some(RolloutStatus {
                kind: RolloutKind::Upgrade,
                step: RolloutStep::NodeRoll,
                started_at: "2026-11-21T09:00:00Z".into(),
                step_started_at: "2026-11-21T09:00:00Z".into(),
                target_node_hash: "n".into(),
                target_controller_hash: "c".into(),
            })
        },
    ];
    for (i, change) in changed.iter().enumerate() {
        let mut s = old.clone();
        change(&mut s);
        assert!(!progress_only(&old, &s), "change {i} is not mere progress");
    }
}
