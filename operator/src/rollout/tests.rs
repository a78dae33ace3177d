//! Transition tests of the rollout state machine, against a small simulated
//! cluster whose StatefulSet/DaemonSet controllers converge when told to.

use super::*;
use std::collections::BTreeMap;

const NODES: i32 = 3;

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-21T10:00:00Z")
        .map(|t| t.with_timezone(&Utc))
        .expect("fixed time parses")
}

fn desired(n: &str, c: &str) -> Desired {
    Desired {
        node_hash: n.into(),
        controller_hash: c.into(),
        registration_required: true,
        step_timeout: Duration::seconds(600),
        paused: false,
        ever_completed: false,
    }
}

/// A cluster that does what the actions say and converges on `settle`.
#[derive(Default)]
struct Sim {
    obs: Observed,
    replicas_wanted: i32,
    /// controller hash -> node hash it was rendered with (the invariant below).
    pairs: BTreeMap<String, String>,
    /// Every action in the order the reconciler would run it.
    log: Vec<Action>,
    rollout: Option<RolloutStatus>,
    completed: usize,
}

impl Sim {
    fn run(&mut self, d: &Desired, now: DateTime<Utc>) -> Plan {
        self.pairs
            .insert(d.controller_hash.clone(), d.node_hash.clone());
        let p = plan(d, &self.obs, self.rollout.as_ref(), now);
        for a in &p.actions {
            self.apply(*a, d);
        }
        self.rollout = p.rollout.clone();
        if p.completed {
            self.completed += 1;
        }
        p
    }

    fn apply(&mut self, a: Action, d: &Desired) {
        self.log.push(a);
        match a {
            Action::ApplyNode => {
                let n = self.obs.node.get_or_insert_with(|| NodeObs {
                    desired: NODES,
                    ..NodeObs::default()
                });
                if n.hash.as_deref() != Some(d.node_hash.as_str()) {
                    n.hash = Some(d.node_hash.clone());
                    n.generation += 1;
                    n.updated = 0;
                }
            }
            Action::ApplyController => {
                // Switching kinds: the new controller never starts while the
                // old one or any of its pods is still there.
                assert!(
                    !self.obs.stale_controller,
                    "controller applied while the old kind exists"
                );
                assert!(
                    self.obs.controller.is_some() || self.obs.controller_pods == 0,
                    "new controller applied while {} old pod(s) run",
                    self.obs.controller_pods
                );
                let c = self
                    .obs
                    .controller
                    .get_or_insert_with(ControllerObs::default);
                if c.hash.as_deref() != Some(d.controller_hash.as_str()) || c.spec_replicas != 1 {
                    c.hash = Some(d.controller_hash.clone());
                    c.generation += 1;
                    c.spec_replicas = 1;
                    c.updated = 0;
                    c.ready = 0;
                }
                self.replicas_wanted = 1;
            }
            Action::ScaleControllerToZero => {
                if let Some(c) = &mut self.obs.controller {
                    c.spec_replicas = 0;
                    c.generation += 1;
                }
            }
            Action::DeleteStaleController => self.obs.stale_controller = false,
        }
        self.check_invariant();
    }

    fn tear(&mut self, a: TeardownAction) {
        match a {
            TeardownAction::DeleteController => self.obs.controller = None,
            TeardownAction::DeleteStaleController => self.obs.stale_controller = false,
            TeardownAction::DeleteNode => self.obs.node = None,
            TeardownAction::CleanupClusterScoped => self.obs.cluster_scoped_remaining = 0,
            TeardownAction::RemoveFinalizer => {}
        }
        self.check_invariant();
    }

    /// The controllers of the cluster catch up: pods roll, register, become ready.
    fn settle(&mut self) {
        if let Some(n) = &mut self.obs.node {
            n.observed_generation = n.generation;
            n.updated = n.desired;
            n.available = n.desired;
            n.ready = n.desired;
            self.obs.node_pods = n.desired as usize;
            self.obs.registered_nodes = n.desired;
        } else {
            self.obs.node_pods = 0;
        }
        if let Some(c) = &mut self.obs.controller {
            c.observed_generation = c.generation;
            c.replicas = c.spec_replicas;
            c.ready = c.spec_replicas;
            c.updated = c.spec_replicas;
            self.obs.controller_pods = c.spec_replicas as usize;
        } else if !self.obs.stale_controller {
            // Pods of a deleted workload are gone once the cluster settles;
            // those of a stale one keep running.
            self.obs.controller_pods = 0;
        }
        self.check_invariant();
    }

    /// A running controller is only ever the one rendered with the live node side.
    fn check_invariant(&self) {
        if let (Some(c), Some(n)) = (&self.obs.controller, &self.obs.node) {
            if c.spec_replicas > 0 {
                let pair = c.hash.as_ref().and_then(|h| self.pairs.get(h));
                assert_eq!(
                    pair,
                    n.hash.as_ref(),
                    "controller {:?} runs over node side {:?}",
                    c.hash,
                    n.hash
                );
            }
        }
    }

    fn drive(&mut self, d: &Desired, now: DateTime<Utc>) {
        for _ in 0..10 {
            let p = self.run(d, now);
            if p.rollout.is_none() {
                return;
            }
            self.settle();
        }
        panic!("rollout did not finish: {:?}", self.rollout);
    }

    fn installed(d: &Desired) -> Sim {
        let mut sim = Sim::default();
        sim.drive(d, t0());
        sim.log.clear();
        sim
    }
}

fn first(log: &[Action], a: Action) -> usize {
    log.iter()
        .position(|x| *x == a)
        .unwrap_or_else(|| panic!("{a:?} never happened in {log:?}"))
}

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
    sim.obs.registered_nodes = 1;
    let p = sim.run(&d, t0());
    assert!(!p.actions.contains(&Action::ApplyController));
    assert_eq!(
        p.waiting_for.as_deref(),
        Some("driver registered on 1 of 3 nodes")
    );

    // Without a registrar there is nothing to wait for.
    let mut d = d;
    d.registration_required = false;
    let p = sim.run(&d, t0());
    assert!(p.actions.contains(&Action::ApplyController));
}

#[test]
fn node_side_upgrade_is_controller_down_node_rolled_controller_up() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let mut d2 = desired("n2", "c2");
    d2.ever_completed = true;

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

    sim.settle();
    sim.drive(&d2, t0());
    let log = &sim.log;
    assert!(first(log, Action::ScaleControllerToZero) < first(log, Action::ApplyNode));
    assert!(first(log, Action::ApplyNode) < first(log, Action::ApplyController));
    let c = sim.obs.controller.as_ref().expect("controller back");
    assert_eq!((c.hash.as_deref(), c.spec_replicas), (Some("c2"), 1));
    assert_eq!(sim.completed, 2);
}

#[test]
fn controller_only_change_rolls_only_the_controller() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let mut d = desired("n1", "c2");
    d.ever_completed = true;
    let p = sim.run(&d, t0());
    let r = p.rollout.as_ref().expect("rollout");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::ControllerUpdate, RolloutStep::ControllerRoll)
    );
    sim.settle();
    sim.drive(&d, t0());
    assert!(!sim.log.contains(&Action::ScaleControllerToZero));
    assert_eq!(
        sim.obs.node.as_ref().and_then(|n| n.hash.as_deref()),
        Some("n1")
    );
    assert_eq!(sim.obs.node.as_ref().map(|n| n.generation), Some(1));
}

#[test]
fn steady_state_reapplies_both_and_starts_nothing() {
    let d = desired("n1", "c1");
    let mut sim = Sim::installed(&d);
    let p = sim.run(&d, t0());
    assert_eq!(p.actions, vec![Action::ApplyNode, Action::ApplyController]);
    assert!(p.rollout.is_none() && p.transitions.is_empty() && !p.completed);
}

#[test]
fn restart_mid_node_roll_resumes_the_same_step() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let mut d2 = desired("n2", "c2");
    d2.ever_completed = true;
    sim.run(&d2, t0());
    sim.settle();
    sim.run(&d2, t0()); // NodeRoll applied, not converged
    let persisted = sim.rollout.clone().expect("persisted step");
    assert_eq!(persisted.step, RolloutStep::NodeRoll);

    // A new operator process: only the persisted status and a fresh observation.
    let later = t0() + Duration::seconds(30);
    let p = plan(&d2, &sim.obs, Some(&persisted), later);
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
    let mut d2 = desired("n2", "c2");
    d2.ever_completed = true;
    sim.run(&d2, t0());
    let stale = sim.rollout.clone().expect("ControllerScaleDown persisted");
    sim.settle();
    sim.run(&d2, t0());
    sim.settle();
    // Status still says ControllerScaleDown, but the cluster is past NodeRoll.
    let p = plan(&d2, &sim.obs, Some(&stale), t0());
    assert_eq!(p.actions, vec![Action::ApplyNode, Action::ApplyController]);
    assert_eq!(
        p.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::ControllerRoll)
    );
}

#[test]
fn status_lost_entirely_never_brings_a_controller_over_an_unrolled_node() {
    // Status wiped mid-upgrade: DaemonSet half-rolled to n2, controller at 0.
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let mut d2 = desired("n2", "c2");
    d2.ever_completed = true;
    sim.run(&d2, t0());
    sim.settle();
    sim.run(&d2, t0());
    let p = plan(&d2, &sim.obs, None, t0());
    let r = p.rollout.as_ref().expect("rollout restarted");
    // The DaemonSet carries the desired hash but its pods are not all updated:
    // the node side is rolled out first, and the controller waits.
    assert_eq!(r.step, RolloutStep::NodeRoll);
    assert_eq!(r.kind, RolloutKind::Upgrade);
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    sim.rollout = None;
    sim.drive(&d2, t0());
    assert!(first(&sim.log, Action::ApplyController) > first(&sim.log, Action::ApplyNode));
}

#[test]
fn install_read_without_its_own_status_keeps_waiting_for_the_node() {
    // The first pass applied the DaemonSet and persisted NodeInstall; a second
    // pass runs on an older copy of the object (no rollout in status) while
    // the DaemonSet controller has not yet counted the new DaemonSet's nodes.
    let d = desired("n1", "c1");
    let mut sim = Sim::default();
    let p = sim.run(&d, t0());
    assert_eq!(p.rollout.map(|r| r.step), Some(RolloutStep::NodeInstall));
    if let Some(n) = &mut sim.obs.node {
        n.desired = 0;
    }
    let p = plan(&d, &sim.obs, None, t0());
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

#[test]
fn node_edit_during_controller_roll_takes_the_controller_down_again() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let mut d2 = desired("n2", "c2");
    d2.ever_completed = true;
    sim.run(&d2, t0());
    sim.settle();
    sim.run(&d2, t0());
    sim.settle();
    let p = sim.run(&d2, t0()); // controller c2 being applied
    assert_eq!(
        p.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::ControllerRoll)
    );

    let mut d3 = desired("n3", "c3");
    d3.ever_completed = true;
    let later = t0() + Duration::seconds(5);
    let p = sim.run(&d3, later);
    let r = p.rollout.as_ref().expect("still rolling");
    assert_eq!(r.step, RolloutStep::ControllerScaleDown);
    assert_eq!(r.target_node_hash, "n3");
    assert_eq!(r.step_started_at, rfc3339(later));
    assert!(p
        .transitions
        .iter()
        .any(|t| matches!(t, Transition::RolloutRetargeted { .. })));
    assert_eq!(p.actions, vec![Action::ScaleControllerToZero]);

    sim.settle();
    sim.drive(&d3, later);
    assert_eq!(
        sim.obs.node.as_ref().and_then(|n| n.hash.as_deref()),
        Some("n3")
    );
    assert_eq!(
        sim.obs.controller.as_ref().and_then(|c| c.hash.as_deref()),
        Some("c3")
    );
}

#[test]
fn node_edit_during_node_roll_continues_with_the_newer_daemonset() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let mut d2 = desired("n2", "c2");
    d2.ever_completed = true;
    sim.run(&d2, t0());
    sim.settle();
    sim.run(&d2, t0()); // NodeRoll, n2 applied but not converged
    let mut d3 = desired("n3", "c3");
    d3.ever_completed = true;
    let p = sim.run(&d3, t0());
    assert_eq!(
        p.rollout.as_ref().map(|r| r.step),
        Some(RolloutStep::NodeRoll)
    );
    assert_eq!(p.actions, vec![Action::ApplyNode]);
    assert_eq!(
        sim.obs.node.as_ref().and_then(|n| n.hash.as_deref()),
        Some("n3")
    );
}

#[test]
fn controller_edit_during_node_roll_changes_only_the_target() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let mut d2 = desired("n2", "c2");
    d2.ever_completed = true;
    sim.run(&d2, t0());
    sim.settle();
    sim.run(&d2, t0());
    let mut d2b = desired("n2", "c2b");
    d2b.ever_completed = true;
    let p = sim.run(&d2b, t0());
    let r = p.rollout.as_ref().expect("rollout");
    assert_eq!(r.step, RolloutStep::NodeRoll);
    assert_eq!(r.target_controller_hash, "c2b");
    assert!(!p.actions.contains(&Action::ApplyController));
    sim.settle();
    sim.drive(&d2b, t0());
    assert_eq!(
        sim.obs.controller.as_ref().and_then(|c| c.hash.as_deref()),
        Some("c2b")
    );
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
    sim.settle();
    sim.drive(&desired("n2", "c2"), t0());
    assert_eq!(
        sim.obs.controller.as_ref().and_then(|c| c.hash.as_deref()),
        Some("c2")
    );
}

#[test]
fn a_step_past_its_deadline_is_reported_with_the_reason_and_keeps_waiting() {
    let d = desired("n1", "c1");
    let mut sim = Sim::default();
    sim.run(&d, t0());
    let p = sim.run(&d, t0() + Duration::seconds(599));
    assert!(p.overdue.is_none());
    if let Some(n) = &mut sim.obs.node {
        n.observed_generation = n.generation;
    }
    let p = sim.run(&d, t0() + Duration::seconds(700));
    let why = p.overdue.expect("overdue");
    assert!(why.contains("step NodeInstall"), "{why}");
    assert!(why.contains("700s"), "{why}");
    assert!(
        why.contains("node pods: 0 updated, 0 available of 3 desired"),
        "{why}"
    );
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

#[test]
fn delete_tears_down_controller_then_node_then_cluster_objects() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    sim.obs.cluster_scoped_remaining = 4;
    let timeout = Duration::seconds(600);

    let p = plan_delete(&sim.obs, None, timeout, t0());
    assert_eq!(p.actions, vec![TeardownAction::DeleteController]);
    let r = p.rollout.clone().expect("delete rollout");
    assert_eq!(
        (r.kind, r.step),
        (RolloutKind::Delete, RolloutStep::ControllerDelete)
    );
    sim.tear(TeardownAction::DeleteController);

    // StatefulSet gone but its pods still terminating: the DaemonSet waits.
    let p = plan_delete(&sim.obs, Some(&r), timeout, t0());
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p
        .waiting_for
        .as_deref()
        .unwrap_or("")
        .contains("1 pod(s) left"));

    sim.settle();
    let p = plan_delete(&sim.obs, Some(&r), timeout, t0());
    assert_eq!(p.actions, vec![TeardownAction::DeleteNode]);
    let r = p.rollout.clone().expect("node step");
    assert_eq!(r.step, RolloutStep::NodeDelete);
    sim.tear(TeardownAction::DeleteNode);
    sim.settle();

    let p = plan_delete(&sim.obs, Some(&r), timeout, t0());
    assert_eq!(p.actions, vec![TeardownAction::CleanupClusterScoped]);
    sim.tear(TeardownAction::CleanupClusterScoped);
    let r = p.rollout.clone().expect("cleanup step");
    let p = plan_delete(&sim.obs, Some(&r), timeout, t0());
    assert_eq!(p.actions, vec![TeardownAction::RemoveFinalizer]);
    assert!(p.completed && p.rollout.is_none());
}

#[test]
fn delete_mid_upgrade_restarts_at_the_controller() {
    let mut sim = Sim::installed(&desired("n1", "c1"));
    let mut d2 = desired("n2", "c2");
    d2.ever_completed = true;
    sim.run(&d2, t0());
    let upgrading = sim.rollout.clone().expect("upgrade");
    let p = plan_delete(&sim.obs, Some(&upgrading), Duration::seconds(600), t0());
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
    sim.obs.controller = None;
    sim.obs.stale_controller = true;
    sim.obs.controller_pods = 1;
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
    let mut d = desired("n1", "c1");
    d.ever_completed = true;
    let mut sim = Sim::installed(&d);
    switch_kind(&mut sim);
    d.controller_hash = "c2-deployment".into();
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
    let mut d = desired("n1", "c1");
    d.ever_completed = true;
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
