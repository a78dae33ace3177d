//! Transition tests of the rollout state machine against the simulated
//! cluster of [`super::sim`].

use super::sim::*;
use super::*;

#[test]
fn install_applies_the_daemonset_then_waits_then_the_controller() {
    let d = desired("n1", "c1");
    let mut sim = Sim::default();
    let p = sim.run(&d, t0());
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    let r = p.rollout.as_ref().expect("rollout under way");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Install, RolloutStep::NodeInstall)
    );
    assert!(p
        .transitions
        .contains(&Transition::RolloutStarted(RolloutKind::Install)));

    // Nothing converged yet: still NodeInstall, still no controller.
    let p = sim.run(&d, t0());
    assert!(!p.actions.contains(&Action::ApplyController));
    assert_eq!(
        sim.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::NodeInstall)
    );

    sim.settle();
    let p = sim.run(&d, t0());
    assert_eq!(p.actions, vec![Action::ApplyNode, Action::ApplyController]);
    assert_eq!(
        sim.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::ControllerRoll)
    );
    assert!(p
        .transitions
        .contains(&Transition::StepCompleted(RolloutStep::NodeInstall)));

    sim.settle();
    let p = sim.run(&d, t0());
    assert!(p.completed);
    assert!(p.rollout.is_none());
    assert!(p
        .transitions
        .contains(&Transition::RolloutCompleted(RolloutKind::Install)));
}

#[test]
fn install_waits_for_registration_on_every_node() {
    let d = desired("n1", "c1");
    let mut sim = Sim::default();
    sim.run(&d, t0());
    sim.settle();
    sim.nodes[1].registered = false;
    let p = sim.run(&d, t0());
    assert!(!p.actions.contains(&Action::ApplyController));
    let waiting = p.waiting_for.unwrap_or_default();
    assert!(
        waiting.contains("node-1") && waiting.contains("not registered"),
        "{waiting}"
    );

    // Without a registrar there is nothing to wait for.
    let mut d = d;
    d.registration_required = false;
    let p = sim.run(&d, t0());
    assert!(p.actions.contains(&Action::ApplyController));
}

#[test]
fn node_side_upgrade_rolls_nodes_under_the_serving_controller_then_surges_it() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    assert!(sim.must_serve);
    let d2 = upgrade("n2", "c2");

    let p = sim.run(&d2, t0());
    let r = p.rollout.as_ref().expect("upgrade under way");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Upgrade, RolloutStep::NodeRoll)
    );
    assert_eq!(p.actions, vec![Action::ApplyNode]);

    sim.drive(&d2, t0());
    let log = &sim.log;
    assert!(!log.contains(&Action::ScaleControllerToZero), "{log:?}");
    let surge = first_surge(log).expect("the controller rolled with a surge");
    assert!(first(log, Action::ApplyNode) < surge);
    assert_eq!(
        log[surge],
        Action::ApplyControllerSurge {
            replicas: 2,
            partition: 1
        }
    );
    assert!(log.contains(&Action::ApplyControllerSurge {
        replicas: 2,
        partition: 0
    }));
    sim.settle();
    let c = sim.ctrl.as_ref().expect("controller");
    assert_eq!(
        (c.hash.as_str(), c.spec_replicas, c.partition),
        ("c2", 1, 0)
    );
    assert!(c.pods.iter().flatten().all(|p| p.rev == "c2" && p.ready));
    assert_eq!(c.pods.len(), 1);
    // Checked after every action and tick: never without a Ready replica.
    assert!(sim.min_ready >= 1);
    assert_eq!(sim.completed, 2);
}

#[test]
fn stop_controller_strategy_takes_the_controller_down_for_the_node_roll() {
    let mut d1 = desired("n1", "c1");
    d1.strategy = RolloutStrategy::StopController;
    let mut sim = Sim::installed(&d1);
    let mut d2 = upgrade("n2", "c2");
    d2.strategy = RolloutStrategy::StopController;

    let p = sim.run(&d2, t0());
    let r = p.rollout.as_ref().expect("upgrade under way");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Upgrade, RolloutStep::ControllerScaleDown)
    );
    assert_eq!(p.actions, vec![Action::ScaleControllerToZero]);

    // Pods still terminating: the DaemonSet is not touched yet.
    let p = sim.run(&d2, t0());
    assert!(!p.actions.contains(&Action::ApplyNode), "{:?}", p.actions);
    assert!(p
        .waiting_for
        .as_deref()
        .unwrap_or("")
        .contains("scaling down"));

    sim.settle();
    let p = sim.run(&d2, t0());
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    assert_eq!(
        sim.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::NodeRoll)
    );

    sim.drive(&d2, t0());
    let log = &sim.log;
    assert!(first(log, Action::ScaleControllerToZero) < first(log, Action::ApplyNode));
    // Nothing serves to keep serving: a plain apply, no surge.
    assert!(first(log, Action::ApplyNode) < first(log, Action::ApplyController));
    assert_eq!(first_surge(log), None);
    sim.settle();
    assert_eq!(sim.ctrl_hash(), Some("c2"));
    assert_eq!(sim.completed, 2);
}

#[test]
fn controller_only_change_rolls_only_the_controller() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d = upgrade("n1", "c2");
    let p = sim.run(&d, t0());
    let r = p.rollout.as_ref().expect("rollout");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::ControllerUpdate, RolloutStep::ControllerRoll)
    );
    sim.drive(&d, t0());
    assert!(!sim.log.contains(&Action::ScaleControllerToZero));
    assert!(first_surge(&sim.log).is_some());
    assert_eq!(sim.ds_hash(), Some("n1"));
    assert_eq!(sim.ds.as_ref().map(|d| d.generation), Some(1));
    assert!(sim.min_ready >= 1);
}

#[test]
fn more_replicas_surge_by_one_and_come_back_to_the_asked_number() {
    let mut d1 = desired("n1", "c1");
    d1.controller_replicas = 3;
    let mut sim = Sim::installed(&d1);
    let mut d2 = upgrade("n2", "c2");
    d2.controller_replicas = 3;
    sim.drive(&d2, t0());
    assert!(sim.log.contains(&Action::ApplyControllerSurge {
        replicas: 4,
        partition: 3
    }));
    sim.settle();
    let c = sim.ctrl.as_ref().expect("controller");
    assert_eq!((c.spec_replicas, c.pods.len()), (3, 3));
    assert!(c.pods.iter().flatten().all(|p| p.rev == "c2"));
    assert!(sim.min_ready >= 1);
}

#[test]
fn a_new_controller_that_never_becomes_ready_never_replaces_the_old_one() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    sim.broken_rev = Some("c2".into());
    let d = upgrade("n1", "c2");
    let mut last = None;
    for i in 0..30 {
        last = Some(sim.run(&d, t0() + Duration::seconds(i * 30)));
        sim.tick();
    }
    let p = last.expect("planned");
    assert_eq!(
        p.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::ControllerRoll)
    );
    let waiting = p.waiting_for.unwrap_or_default();
    assert!(waiting.contains("surge replica"), "{waiting}");
    assert!(p.overdue.is_some(), "past the step deadline: reported");
    let c = sim.ctrl.as_ref().expect("controller");
    // The old replica still serves, at the old template.
    assert_eq!(
        c.pods[0].as_ref().map(|p| (p.rev.as_str(), p.ready)),
        Some(("c1", true))
    );
    assert!(!sim.log.contains(&Action::ApplyControllerSurge {
        replicas: 2,
        partition: 0
    }));
}

#[test]
fn a_deployment_controller_is_applied_as_rendered_it_surges_by_itself() {
    let mut d1 = desired("n1", "c1");
    d1.controller_kind = ControllerKind::Deployment;
    let mut sim = Sim::installed(&d1);
    let mut d2 = upgrade("n2", "c2");
    d2.controller_kind = ControllerKind::Deployment;
    // The simulated StatefulSet rolls like a Deployment with maxSurge here
    // would not; only the actions are checked.
    sim.must_serve = false;
    sim.drive(&d2, t0());
    assert!(sim.log.contains(&Action::ApplyController));
    assert_eq!(first_surge(&sim.log), None);
}

#[test]
fn lost_nodes_mid_upgrade_never_wedge_it_and_get_the_new_pod_when_back() {
    let d1 = desired("n1", "c1");
    let mut sim = Sim::with_nodes(20);
    sim.drive(&d1, t0());
    sim.settle();
    sim.log.clear();
    let d2 = upgrade("n2", "c2");
    sim.run(&d2, t0());
    sim.tick();
    sim.tick();
    // Two nodes stop reporting in the middle of the node roll.
    sim.nodes[7].lost = true;
    sim.nodes[15].lost = true;
    sim.drive(&d2, t0());
    assert_eq!(sim.completed, 2);
    assert!(sim.min_ready >= 1);
    sim.settle();
    assert_eq!(sim.ctrl_hash(), Some("c2"));
    let template = sim.ds.as_ref().map(|d| d.template_generation);
    let old: Vec<&str> = sim
        .nodes
        .iter()
        .filter(|n| n.pod.map(|(g, _)| g) != template)
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(
        old,
        vec!["node-007", "node-015"],
        "only the lost nodes are behind"
    );

    // They come back: the DaemonSet replaces their pods; no new rollout.
    sim.nodes[7].lost = false;
    sim.nodes[15].lost = false;
    sim.settle();
    let p = sim.run(&d2, t0());
    assert!(p.rollout.is_none());
    assert!(sim.nodes.iter().all(|n| n.pod.map(|(g, _)| g) == template));
}

#[test]
fn a_node_lost_before_the_upgrade_is_not_waited_for() {
    let d1 = desired("n1", "c1");
    let mut sim = Sim::installed(&d1);
    sim.nodes[0].lost = true;
    let d2 = upgrade("n2", "c2");
    sim.drive(&d2, t0());
    assert_eq!(sim.completed, 2);
    let p = sim.run(&d2, t0());
    assert!(p.rollout.is_none());
}

#[test]
fn steady_state_reapplies_both_and_starts_nothing() {
    let d = Desired {
        ever_completed: true,
        ..desired("n1", "c1")
    };
    let mut sim = Sim::installed(&d);
    let p = sim.run(&d, t0());
    assert_eq!(p.actions, vec![Action::ApplyNode, Action::ApplyController]);
    assert!(p.rollout.is_none() && p.transitions.is_empty() && !p.completed);
}

#[test]
fn objects_in_place_without_a_recorded_rollout_complete_an_install() {
    // What a takeover (spec.adoption) leaves, or an install whose status
    // write was lost: every object current, no version recorded.
    let d = desired("n1", "c1");
    assert!(!d.ever_completed);
    let mut sim = Sim::installed(&d);
    let p = sim.run(&d, t0());
    assert!(p.completed, "{p:?}");
    assert!(p
        .transitions
        .contains(&Transition::RolloutCompleted(RolloutKind::Install)));
}

#[test]
fn restart_mid_node_roll_resumes_the_same_step() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d2 = upgrade("n2", "c2");
    sim.run(&d2, t0());
    sim.tick(); // NodeRoll applied, not converged
    let persisted = sim.rollout.clone().expect("persisted step");
    assert_eq!(persisted.step, RolloutStep::NodeRoll);

    // A new operator process: only the persisted status and a fresh observation.
    let later = t0() + Duration::seconds(30);
    let p = plan(&d2, &sim.observed(&d2), Some(&persisted), later);
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    assert_eq!(
        p.rollout.as_ref(),
        Some(&persisted),
        "same step, same start times"
    );
    assert!(p.transitions.is_empty());
}

#[test]
fn restart_after_a_lost_status_write_skips_finished_steps() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d2 = upgrade("n2", "c2");
    sim.run(&d2, t0());
    let stale = sim.rollout.clone().expect("NodeRoll persisted");
    sim.settle();
    // Status still says NodeRoll, but every node is rolled.
    let p = plan(&d2, &sim.observed(&d2), Some(&stale), t0());
    assert_eq!(
        p.actions,
        vec![
            Action::ApplyNode,
            Action::ApplyControllerSurge {
                replicas: 2,
                partition: 1
            }
        ]
    );
    assert_eq!(
        p.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::ControllerRoll)
    );
}

#[test]
fn status_lost_entirely_never_brings_a_controller_over_an_unrolled_node() {
    // Status wiped mid-upgrade: the DaemonSet half-rolled to n2, the old
    // controller serving.
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d2 = upgrade("n2", "c2");
    sim.run(&d2, t0());
    sim.tick();
    let p = plan(&d2, &sim.observed(&d2), None, t0());
    let r = p.rollout.as_ref().expect("rollout restarted");
    // The DaemonSet carries the desired hash but its pods are not all
    // updated: the node side is rolled out first, and the controller waits.
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Upgrade, RolloutStep::NodeRoll)
    );
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    sim.rollout = None;
    sim.drive(&d2, t0());
    assert!(first_surge(&sim.log) > Some(first(&sim.log, Action::ApplyNode)));
}

#[test]
fn status_lost_mid_surge_finishes_the_surge() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d = upgrade("n1", "c2");
    sim.run(&d, t0());
    sim.tick();
    sim.tick();
    assert_eq!(sim.ctrl.as_ref().map(|c| c.spec_replicas), Some(2));
    sim.rollout = None;
    sim.drive(&d, t0());
    sim.settle();
    let c = sim.ctrl.as_ref().expect("controller");
    assert_eq!((c.spec_replicas, c.partition, c.pods.len()), (1, 0, 1));
    // And a settled surge-free StatefulSet starts nothing.
    let p = sim.run(&d, t0());
    assert!(p.rollout.is_none());
}

#[test]
fn a_controller_left_at_a_non_rendered_replica_count_is_rolled_back_to_it() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    if let Some(c) = sim.ctrl.as_mut() {
        c.spec_replicas = 2;
    }
    let d = desired("n1", "c1");
    let p = sim.run(&d, t0());
    assert_eq!(
        p.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::ControllerRoll)
    );
    sim.drive(&d, t0());
    sim.settle();
    assert_eq!(sim.ctrl.as_ref().map(|c| c.pods.len()), Some(1));
}

#[test]
fn install_read_without_its_own_status_keeps_waiting_for_the_node() {
    // The first pass applied the DaemonSet and persisted NodeInstall; a second
    // pass runs on an older copy of the object (no rollout in status) while
    // the DaemonSet controller has not yet looked at the new DaemonSet.
    let d = desired("n1", "c1");
    let mut sim = Sim::default();
    let p = sim.run(&d, t0());
    assert_eq!(p.rollout.map(|r| r.step), Some(RolloutStep::NodeInstall));
    let p = plan(&d, &sim.observed(&d), None, t0());
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    let r = p.rollout.expect("the install goes on");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Install, RolloutStep::NodeInstall)
    );
    assert!(
        p.transitions
            .iter()
            .all(|t| *t != Transition::StepStarted(RolloutStep::ControllerRoll)),
        "{:?}",
        p.transitions
    );
}

/// Upgrades to (n2, c2) until the controller roll has begun.
fn upgrade_to_controller_roll(sim: &mut Sim, d2: &Desired) {
    sim.run(d2, t0());
    for _ in 0..50 {
        if sim.rollout.as_ref().map(|r| r.step) == Some(RolloutStep::ControllerRoll) {
            return;
        }
        sim.tick();
        sim.run(d2, t0());
    }
    panic!("never reached ControllerRoll");
}

#[test]
fn node_edit_during_controller_roll_rolls_the_nodes_again_under_the_serving_controller() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d2 = upgrade("n2", "c2");
    upgrade_to_controller_roll(&mut sim, &d2);

    let d3 = upgrade("n3", "c3");
    let later = t0() + Duration::seconds(5);
    let p = sim.run(&d3, later);
    let r = p.rollout.as_ref().expect("still rolling");
    assert_eq!(r.step, RolloutStep::NodeRoll);
    assert_eq!(r.target_node_hash, "n3");
    assert_eq!(r.step_started_at, rfc3339(later));
    assert!(p
        .transitions
        .iter()
        .any(|t| matches!(t, Transition::RolloutRetargeted { .. })));
    assert_eq!(p.actions, vec![Action::ApplyNode]);

    sim.drive(&d3, later);
    sim.settle();
    assert_eq!(sim.ds_hash(), Some("n3"));
    assert_eq!(sim.ctrl_hash(), Some("c3"));
    assert!(sim.min_ready >= 1);
}

#[test]
fn node_edit_during_controller_roll_takes_a_stop_controller_driver_down_again() {
    let mut d1 = desired("n1", "c1");
    d1.strategy = RolloutStrategy::StopController;
    let mut sim = Sim::installed(&d1);
    let mut d2 = upgrade("n2", "c2");
    d2.strategy = RolloutStrategy::StopController;
    upgrade_to_controller_roll(&mut sim, &d2);
    let mut d3 = upgrade("n3", "c3");
    d3.strategy = RolloutStrategy::StopController;
    let p = sim.run(&d3, t0());
    assert_eq!(
        p.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::ControllerScaleDown)
    );
    assert_eq!(p.actions, vec![Action::ScaleControllerToZero]);
    sim.drive(&d3, t0());
    sim.settle();
    assert_eq!((sim.ds_hash(), sim.ctrl_hash()), (Some("n3"), Some("c3")));
}

#[test]
fn node_edit_during_node_roll_continues_with_the_newer_daemonset() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d2 = upgrade("n2", "c2");
    sim.run(&d2, t0());
    sim.tick(); // NodeRoll, n2 applied but not converged
    let d3 = upgrade("n3", "c3");
    let p = sim.run(&d3, t0());
    assert_eq!(
        p.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::NodeRoll)
    );
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    assert_eq!(sim.ds_hash(), Some("n3"));
}

#[test]
fn controller_edit_during_node_roll_changes_only_the_target() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d2 = upgrade("n2", "c2");
    sim.run(&d2, t0());
    sim.tick();
    let d2b = upgrade("n2", "c2b");
    let p = sim.run(&d2b, t0());
    let r = p.rollout.as_ref().expect("rollout");
    assert_eq!(r.step, RolloutStep::NodeRoll);
    assert_eq!(r.target_controller_hash, "c2b");
    assert!(first_surge(&p.actions).is_none());
    sim.drive(&d2b, t0());
    assert_eq!(sim.ctrl_hash(), Some("c2b"));
}

#[test]
fn edit_during_install_node_step_keeps_installing() {
    let mut sim = Sim::default();
    sim.run(&desired("n1", "c1"), t0());
    let p = sim.run(&desired("n2", "c2"), t0());
    let r = p.rollout.as_ref().expect("install");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Install, RolloutStep::NodeInstall)
    );
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    sim.drive(&desired("n2", "c2"), t0());
    assert_eq!(sim.ctrl_hash(), Some("c2"));
}

#[test]
fn a_step_past_its_deadline_is_reported_with_the_reason_and_keeps_waiting() {
    let d = desired("n1", "c1");
    let mut sim = Sim::default();
    sim.run(&d, t0());
    let p = sim.run(&d, t0() + Duration::seconds(599));
    assert!(p.overdue.is_none());
    if let Some(ds) = &mut sim.ds {
        ds.observed_generation = ds.generation;
    }
    let p = sim.run(&d, t0() + Duration::seconds(700));
    let why = p.overdue.expect("overdue");
    assert!(why.contains("step NodeInstall"), "{why}");
    assert!(why.contains("700s"), "{why}");
    assert!(why.contains("0 of 3 node(s) done; next: node-0"), "{why}");
    assert_eq!(p.actions, vec![Action::ApplyNode], "still driving the step");
}

#[test]
fn paused_changes_nothing() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let mut d = desired("n2", "c2");
    d.paused = true;
    let p = sim.run(&d, t0());
    assert!(p.actions.is_empty());
    assert!(p.rollout.is_none());
    assert!(p.waiting_for.as_deref().unwrap_or("").contains("paused"));
}

fn tear(sim: &mut Sim, a: TeardownAction) {
    match a {
        TeardownAction::DeleteController => {
            // The workload goes; its pods terminate a moment later.
            let pods = sim
                .ctrl
                .take()
                .map_or(0, |c| c.pods.iter().flatten().count());
            sim.stale_pods += pods;
            sim.stale = false;
        }
        TeardownAction::DeleteStaleController => sim.stale = false,
        TeardownAction::DeleteNode => sim.ds = None,
        TeardownAction::CleanupClusterScoped => sim.cluster_scoped_remaining = 0,
        TeardownAction::RemoveFinalizer => {}
    }
}

#[test]
fn delete_tears_down_controller_then_node_then_cluster_objects() {
    let d = desired("n1", "c1");
    let mut sim = Sim::installed(&d);
    sim.must_serve = false;
    sim.cluster_scoped_remaining = 4;
    let timeout = Duration::seconds(600);

    let p = plan_delete(&sim.observed(&d), None, timeout, t0());
    assert_eq!(p.actions, vec![TeardownAction::DeleteController]);
    let r = p.rollout.clone().expect("delete rollout");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Delete, RolloutStep::ControllerDelete)
    );
    tear(&mut sim, TeardownAction::DeleteController);

    // StatefulSet gone but its pods still terminating: the DaemonSet waits.
    let p = plan_delete(&sim.observed(&d), Some(&r), timeout, t0());
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p
        .waiting_for
        .as_deref()
        .unwrap_or("")
        .contains("1 pod(s) left"));

    sim.settle();
    let p = plan_delete(&sim.observed(&d), Some(&r), timeout, t0());
    assert_eq!(p.actions, vec![TeardownAction::DeleteNode]);
    let r = p.rollout.clone().expect("node step");
    assert_eq!(r.step, RolloutStep::NodeDelete);
    tear(&mut sim, TeardownAction::DeleteNode);
    sim.settle();

    let p = plan_delete(&sim.observed(&d), Some(&r), timeout, t0());
    assert_eq!(p.actions, vec![TeardownAction::CleanupClusterScoped]);
    tear(&mut sim, TeardownAction::CleanupClusterScoped);
    let r = p.rollout.clone().expect("cleanup step");
    let p = plan_delete(&sim.observed(&d), Some(&r), timeout, t0());
    assert_eq!(p.actions, vec![TeardownAction::RemoveFinalizer]);
    assert!(p.completed && p.rollout.is_none());
}

#[test]
fn delete_mid_upgrade_restarts_at_the_controller() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d2 = upgrade("n2", "c2");
    sim.run(&d2, t0());
    let upgrading = sim.rollout.clone().expect("upgrade");
    let p = plan_delete(
        &sim.observed(&d2),
        Some(&upgrading),
        Duration::seconds(600),
        t0(),
    );
    assert_eq!(p.actions, vec![TeardownAction::DeleteController]);
    assert_eq!(p.rollout.map(|r| r.kind), Some(RolloutKind::Delete));
}

#[test]
fn delete_of_an_object_that_deployed_nothing_finishes_at_once() {
    let p = plan_delete(&Observed::default(), None, Duration::seconds(600), t0());
    assert_eq!(p.actions, vec![TeardownAction::RemoveFinalizer]);
}

/// `spec.controller.kind` changed: the workload of the desired kind does not
/// exist yet, the old one (and its pod) still runs.
fn switch_kind(sim: &mut Sim) {
    sim.ctrl = None;
    sim.stale = true;
    sim.stale_pods = 1;
    // The old kind's pod serves until it goes; the new one follows it.
    sim.must_serve = false;
}

#[test]
fn switching_the_controller_kind_removes_the_old_one_before_the_new_starts() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    switch_kind(&mut sim);
    let d = desired("n1", "c2-deployment");

    let p = sim.run(&d, t0());
    let r = p.rollout.as_ref().expect("a rollout");
    // Controller-only: the node side is not touched beyond the usual re-apply.
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Install, RolloutStep::ControllerRoll)
    );
    assert!(p.actions.contains(&Action::DeleteStaleController));
    assert!(!p.actions.contains(&Action::ApplyController));

    // The old workload is gone but its pod still terminates: keep waiting.
    sim.stale_pods = 1;
    let p = sim.run(&d, t0());
    assert!(
        !p.actions.contains(&Action::ApplyController),
        "{:?}",
        p.actions
    );
    let waiting = p.waiting_for.clone().unwrap_or_default();
    assert!(waiting.contains("1 pod(s) left"), "{waiting}");

    sim.settle();
    let p = sim.run(&d, t0());
    assert!(p.actions.contains(&Action::ApplyController));
    sim.settle();
    let p = sim.run(&d, t0());
    assert!(p.completed);
    assert!(
        first(&sim.log, Action::DeleteStaleController) < first(&sim.log, Action::ApplyController)
    );
    assert!(!sim.log.contains(&Action::ScaleControllerToZero));
}

#[test]
fn switching_kinds_after_a_completed_rollout_is_a_controller_update() {
    let mut sim = Sim::installed(&upgrade("n1", "c1"));
    switch_kind(&mut sim);
    let d = upgrade("n1", "c2-deployment");
    let p = sim.run(&d, t0());
    let r = p.rollout.as_ref().expect("a rollout");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::ControllerUpdate, RolloutStep::ControllerRoll)
    );
    sim.drive(&d, t0());
    assert_eq!(sim.completed, 2);
}

#[test]
fn node_upgrade_while_switching_kinds_removes_the_old_kind_in_scale_down() {
    let mut d = upgrade("n1", "c1");
    d.strategy = RolloutStrategy::StopController;
    let mut sim = Sim::installed(&d);
    switch_kind(&mut sim);
    let d2 = Desired {
        node_hash: "n2".into(),
        controller_hash: "c2-deployment".into(),
        ..d
    };
    let p = sim.run(&d2, t0());
    assert_eq!(
        p.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::ControllerScaleDown)
    );
    assert!(p.actions.contains(&Action::DeleteStaleController));
    // The node side is not rolled until the old controller's pods are gone.
    assert!(!p.actions.contains(&Action::ApplyNode));
    sim.drive(&d2, t0());
    assert!(first(&sim.log, Action::DeleteStaleController) < first(&sim.log, Action::ApplyNode));
}

#[test]
fn delete_removes_controllers_of_both_kinds() {
    let observed = Observed {
        controller: Some(ControllerObs::default()),
        stale_controller: true,
        controller_pods: 2,
        ..Observed::default()
    };
    let p = plan_delete(&observed, None, Duration::seconds(600), t0());
    assert_eq!(
        p.actions,
        vec![
            TeardownAction::DeleteController,
            TeardownAction::DeleteStaleController
        ]
    );
    let only_stale = Observed {
        stale_controller: true,
        ..Observed::default()
    };
    let p = plan_delete(&only_stale, None, Duration::seconds(600), t0());
    assert_eq!(p.actions, vec![TeardownAction::DeleteStaleController]);
    assert!(p.waiting_for.is_some(), "waits until the old kind is gone");
}

/// Random walks: edits, node losses and returns, restarts and status loss
/// at arbitrary moments, for both strategies. Whatever happens, the
/// invariants hold (checked by the simulator after every action and tick)
/// and the rollout ends at the last edit's content.
#[test]
fn random_walks_keep_the_invariants_and_converge() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for walk in 0..200 {
        let strategy = if walk % 3 == 0 {
            RolloutStrategy::StopController
        } else {
            RolloutStrategy::NonDisruptive
        };
        let mut d = desired("n0", "c0");
        d.strategy = strategy;
        d.controller_replicas = 1 + (walk % 2);
        let mut sim = Sim::with_nodes(6);
        sim.drive(&d, t0());
        sim.settle();
        let mut version = 0;
        for _ in 0..60 {
            match next(10) {
                0 | 1 => {
                    version += 1;
                    d.ever_completed = true;
                    d.node_hash = format!("n{}", version - next(2) as usize);
                    d.controller_hash = format!("c{version}");
                }
                2 => {
                    let i = next(6) as usize;
                    sim.nodes[i].lost = !sim.nodes[i].lost;
                }
                3 => sim.rollout = None, // status lost
                _ => {}
            }
            sim.run(&d, t0());
            for _ in 0..next(3) {
                sim.tick();
            }
        }
        for n in &mut sim.nodes {
            n.lost = false;
        }
        sim.drive(&d, t0());
        sim.settle();
        let p = sim.run(&d, t0());
        assert!(p.rollout.is_none(), "walk {walk}: {:?}", p.rollout);
        assert_eq!(
            sim.ctrl_hash(),
            Some(d.controller_hash.as_str()),
            "walk {walk}"
        );
        assert_eq!(sim.ds_hash(), Some(d.node_hash.as_str()), "walk {walk}");
        let c = sim.ctrl.as_ref().expect("controller");
        assert_eq!(c.pods.len() as i32, d.controller_replicas, "walk {walk}");
        if strategy == RolloutStrategy::NonDisruptive {
            assert!(sim.min_ready >= 1, "walk {walk}");
        }
    }
}

// ---------------------------------------------------------------- topology NodeLocal

fn never_controller(log: &[Action]) -> bool {
    !log.iter().any(|a| {
        matches!(
            a,
            Action::ApplyController | Action::ApplyControllerSurge { .. }
        )
    })
}

#[test]
fn a_node_local_install_is_node_only() {
    let d = node_local("L1");
    let mut sim = Sim::default();
    let p = sim.run(&d, t0());
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    let r = p.rollout.as_ref().expect("install under way");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Install, RolloutStep::NodeInstall)
    );
    sim.settle();
    let p = sim.run(&d, t0());
    assert!(p.completed, "{:?}", p.waiting_for);
    assert!(p.rollout.is_none());
    // No controller step was ever started (no Event about one either).
    let steps: Vec<_> = p
        .transitions
        .iter()
        .filter_map(|t| match t {
            Transition::StepStarted(s) => Some(*s),
            _ => None,
        })
        .collect();
    assert!(steps.is_empty(), "{steps:?}");
    assert!(p
        .transitions
        .contains(&Transition::RolloutCompleted(RolloutKind::Install)));
    assert!(never_controller(&sim.log), "{:?}", sim.log);
    assert!(sim.ctrl.is_none());

    // Steady state: the DaemonSet only.
    let p = sim.run(&d, t0());
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    assert!(p.rollout.is_none());
}

#[test]
fn a_node_local_install_waits_for_registration_on_every_node() {
    let d = node_local("L1");
    let mut sim = Sim::default();
    sim.run(&d, t0());
    sim.settle();
    sim.nodes[2].registered = false;
    let p = sim.run(&d, t0());
    assert!(!p.completed);
    let waiting = p.waiting_for.unwrap_or_default();
    assert!(waiting.contains("node-2"), "{waiting}");
}

#[test]
fn a_node_local_upgrade_rolls_the_nodes_and_ends() {
    let mut sim = Sim::default();
    sim.drive(&node_local("L1"), t0());
    sim.settle();
    sim.log.clear();
    let d2 = Desired {
        ever_completed: true,
        ..node_local("L2")
    };
    let p = sim.run(&d2, t0());
    let r = p.rollout.as_ref().expect("upgrade");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Upgrade, RolloutStep::NodeRoll)
    );
    sim.drive(&d2, t0());
    sim.settle();
    assert_eq!(sim.ds_hash(), Some("L2"));
    assert!(sim
        .nodes
        .iter()
        .all(|n| n.pod.is_some_and(|(g, r)| g == 2 && r)));
    assert!(never_controller(&sim.log), "{:?}", sim.log);
    assert!(!sim.log.contains(&Action::ScaleControllerToZero));
}

/// Central → NodeLocal: the controller stops first (the nodes' provisioners
/// take over, never beside it), the nodes roll, then the controller
/// workload is deleted.
#[test]
fn becoming_node_local_stops_the_controller_rolls_the_nodes_then_removes_it() {
    for strategy in [
        RolloutStrategy::NonDisruptive,
        RolloutStrategy::StopController,
    ] {
        let mut d1 = desired("n1", "c1");
        d1.strategy = strategy;
        let mut sim = Sim::installed(&d1);
        let d2 = Desired {
            ever_completed: true,
            strategy,
            ..node_local("L2")
        };
        let p = sim.run(&d2, t0());
        let r = p.rollout.as_ref().expect("switch under way");
        assert_eq!(
            (r.kind, r.step),
            (RolloutKind::Upgrade, RolloutStep::ControllerScaleDown)
        );
        assert_eq!(p.actions, vec![Action::ScaleControllerToZero]);
        // Pods still terminating: the DaemonSet waits.
        let p = sim.run(&d2, t0());
        assert!(!p.actions.contains(&Action::ApplyNode), "{:?}", p.actions);
        sim.drive(&d2, t0());
        sim.settle();
        let log = &sim.log;
        let scale = first(log, Action::ScaleControllerToZero);
        let node = first(log, Action::ApplyNode);
        let delete = first(log, Action::DeleteController);
        assert!(scale < node && node < delete, "{log:?}");
        assert!(never_controller(log), "{log:?}");
        assert!(sim.ctrl.is_none(), "{:?}", sim.ctrl);
        assert_eq!(sim.stale_pods, 0);
        assert_eq!(sim.ds_hash(), Some("L2"));
        assert_eq!(sim.completed, 2);
        let p = sim.run(&d2, t0());
        assert!(p.rollout.is_none());
        assert_eq!(p.actions, vec![Action::ApplyNode]);
    }
}

/// The controller workload goes only once every healthy node runs its
/// node-local pod; lost nodes are not waited for.
#[test]
fn a_central_controller_is_removed_after_the_nodes_even_with_a_node_lost() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    sim.nodes[1].lost = true;
    let d2 = Desired {
        ever_completed: true,
        ..node_local("L2")
    };
    // Scaled down and gone; the roll is under way.
    for _ in 0..3 {
        sim.run(&d2, t0());
        sim.tick();
    }
    assert!(sim.ctrl.as_ref().is_some_and(|c| c.spec_replicas == 0));
    sim.drive(&d2, t0());
    sim.settle();
    assert!(sim.ctrl.is_none());
    assert_eq!(sim.nodes[1].pod.map(|(g, _)| g), Some(1), "old pod stays");
    // Back: it gets the node-local pod.
    sim.nodes[1].lost = false;
    sim.settle();
    assert_eq!(sim.nodes[1].pod.map(|(g, _)| g), Some(2));
}

/// NodeLocal → Central: the nodes roll first (their provisioners go), then
/// the controller starts, as an install would; never beside a node-local pod.
#[test]
fn becoming_central_rolls_the_nodes_then_starts_the_controller() {
    let mut sim = Sim::default();
    sim.drive(&node_local("L1"), t0());
    sim.settle();
    sim.log.clear();
    let d2 = upgrade("n2", "c2");
    let p = sim.run(&d2, t0());
    let r = p.rollout.as_ref().expect("switch");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Upgrade, RolloutStep::NodeRoll)
    );
    sim.drive(&d2, t0());
    sim.settle();
    let log = &sim.log;
    assert!(first(log, Action::ApplyNode) < first(log, Action::ApplyController));
    // Nothing served, so a plain apply, no surge.
    assert_eq!(first_surge(log), None);
    assert_eq!(sim.ctrl_hash(), Some("c2"));
    assert!(sim
        .ctrl
        .as_ref()
        .is_some_and(|c| c.pods.iter().flatten().all(|p| p.ready)));
    // Serving from now on, under the usual invariants.
    assert!(sim.must_serve);
}

/// A lost status write in the middle of a switch: the next pass decides
/// from what it sees and still never runs both provisioners.
#[test]
fn a_switch_resumes_from_observation_after_the_status_is_lost() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let d2 = Desired {
        ever_completed: true,
        ..node_local("L2")
    };
    sim.run(&d2, t0());
    sim.settle();
    sim.rollout = None; // status lost: controller at 0, nodes not rolled
    let p = sim.run(&d2, t0());
    let r = p.rollout.as_ref().expect("resumed");
    assert_eq!(r.step, RolloutStep::NodeRoll);
    sim.drive(&d2, t0());
    sim.settle();
    sim.rollout = None; // lost again once done: a stale workload left?
    let p = sim.run(&d2, t0());
    assert!(p.rollout.is_none(), "{:?}", p.rollout);
    assert!(sim.ctrl.is_none());

    // A controller workload left at 0 replicas (the delete never made it)
    // is removed by a controller step of its own.
    sim.ctrl = Some(Ctrl {
        hash: "c1".into(),
        ..Ctrl::default()
    });
    let p = sim.run(&d2, t0());
    let r = p.rollout.as_ref().expect("removal");
    assert_eq!(r.step, RolloutStep::ControllerRoll);
    assert!(p.actions.contains(&Action::DeleteController));
    sim.drive(&d2, t0());
    assert!(sim.ctrl.is_none());
}

/// Switching back to Central in the middle of becoming node-local.
#[test]
fn an_edit_back_to_central_mid_switch_ends_central() {
    let d1 = desired("n1", "c1");
    let mut sim = Sim::installed(&d1);
    let d2 = Desired {
        ever_completed: true,
        ..node_local("L2")
    };
    for _ in 0..4 {
        sim.run(&d2, t0());
        sim.tick();
    }
    assert_eq!(
        sim.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::NodeRoll)
    );
    let d3 = upgrade("n3", "c3");
    sim.drive(&d3, t0());
    sim.settle();
    assert_eq!(sim.ctrl_hash(), Some("c3"));
    assert_eq!(sim.ds_hash(), Some("n3"));
    assert!(sim
        .ctrl
        .as_ref()
        .is_some_and(|c| c.spec_replicas == 1 && c.pods.iter().flatten().all(|p| p.ready)));
}

#[test]
fn deleting_a_node_local_driver_tears_down_the_node_side() {
    let mut sim = Sim::default();
    sim.drive(&node_local("L1"), t0());
    sim.settle();
    sim.cluster_scoped_remaining = 3;
    let p = plan_delete(
        &sim.observed(&node_local("L1")),
        None,
        Duration::seconds(600),
        t0(),
    );
    assert_eq!(p.actions, vec![TeardownAction::DeleteNode]);
    let r = p.rollout.as_ref().expect("teardown");
    assert_eq!(r.step, RolloutStep::NodeDelete);
}

/// Random walks across both topologies: edits that switch topology, node
/// losses and returns, status loss, at arbitrary moments. The simulator's
/// invariants hold throughout (a controller pod never runs beside a healthy
/// node's node-local pod; a central controller is applied only over its
/// rolled node side) and the rollout ends at the last edit's content.
#[test]
fn random_walks_across_topologies_keep_the_invariants_and_converge() {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for walk in 0..150 {
        let strategy = if walk % 4 == 0 {
            RolloutStrategy::StopController
        } else {
            RolloutStrategy::NonDisruptive
        };
        let target = |version: usize, central: bool, strategy| {
            let d = if central {
                desired(&format!("n{version}"), &format!("c{version}"))
            } else {
                node_local(&format!("L{version}"))
            };
            Desired {
                strategy,
                ever_completed: version > 0,
                ..d
            }
        };
        let mut d = target(0, walk % 2 == 0, strategy);
        let mut sim = Sim::with_nodes(5);
        sim.drive(&d, t0());
        sim.settle();
        let mut version = 0;
        for _ in 0..50 {
            match next(10) {
                0 | 1 => {
                    version += 1;
                    d = target(version, next(2) == 0, strategy);
                }
                2 => {
                    let i = next(5) as usize;
                    sim.nodes[i].lost = !sim.nodes[i].lost;
                }
                3 => sim.rollout = None,
                _ => {}
            }
            sim.run(&d, t0());
            for _ in 0..next(3) {
                sim.tick();
            }
        }
        for n in &mut sim.nodes {
            n.lost = false;
        }
        sim.drive(&d, t0());
        sim.settle();
        let p = sim.run(&d, t0());
        assert!(p.rollout.is_none(), "walk {walk}: {:?}", p.rollout);
        assert_eq!(sim.ds_hash(), Some(d.node_hash.as_str()), "walk {walk}");
        if d.controller {
            assert_eq!(
                sim.ctrl_hash(),
                Some(d.controller_hash.as_str()),
                "walk {walk}"
            );
        } else {
            assert!(sim.ctrl.is_none(), "walk {walk}: {:?}", sim.ctrl);
            assert_eq!(sim.stale_pods, 0, "walk {walk}");
        }
    }
}
