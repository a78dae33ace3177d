//! The ordered rollout state machine, as a pure function.
//!
//! `plan` takes what the object asks for ([`Desired`]), what the cluster has
//! ([`Observed`]) and the step persisted in status, and says which actions to
//! take now and which step to persist next. It never talks to the API server,
//! so every transition is unit-tested, including a restart mid-rollout (the
//! persisted step plus a fresh observation), an edit mid-rollout (new
//! desired hashes while a step is under way), and nodes lost and back.
//!
//! The order comes from the Kubernetes CSI design: deploy the node DaemonSet
//! before the controller, tear the controller down before the node.
//! - Install: `NodeInstall` → `ControllerRoll`.
//! - Node-side change, `rollout.strategy: NonDisruptive` (the default):
//!   `NodeRoll` while the old controller keeps serving → `ControllerRoll`.
//! - Node-side change, `StopController`: `ControllerScaleDown` → `NodeRoll`
//!   → `ControllerRoll`.
//! - Controller-only change: `ControllerRoll`.
//! - Delete: `ControllerDelete` → `NodeDelete` → `ClusterCleanup` → finalizer removed.
//!
//! Without a controller workload (topology NodeLocal, [`Desired::controller`]
//! false) a rollout is node-only: `NodeInstall` or `NodeRoll`, nothing
//! after. Switching a central driver to node-local takes its controller
//! down first (`ControllerScaleDown`, whatever the strategy), rolls the
//! nodes to their node-local pods, then removes the controller workload
//! (`ControllerRoll` rolls it to none): a central provisioner and the
//! nodes' provisioners must never both act, or a claim scheduled to a node
//! gets two volumes, one of them on a driver instance that cannot serve it.
//! Switching back rolls the nodes (their provisioners go) and then starts
//! the controller, as an install would.
//!
//! Why nodes first and the old controller serving meanwhile: a controller
//! plugin only ever deals with node plugins through the CSI RPCs kubelet
//! makes (NodeStage/NodePublish with the volume context and publish context
//! the controller returned), and a node plugin must already serve volumes
//! created and attached by the previous controller, since those volumes
//! outlive any upgrade. So new node plugins under the old controller is the
//! skew every driver bears. The other way round is not: a new controller
//! may return contexts or topology that only its own node plugin knows, and
//! provisioning relies on up-to-date node topology (the CSI design's reason
//! for the order). The controller therefore moves last, and only once every
//! node that can run the new node pod runs it.
//!
//! A StatefulSet controller rolls with a surge: one more replica at the new
//! template first (`partition` keeps the old ones), then the old ones, then
//! back to the asked number; the sidecars' leader election keeps one of
//! them active. A Deployment surges by itself (maxUnavailable rounds to 0
//! below four replicas). So a Ready controller replica exists throughout,
//! and a new controller that never becomes Ready never replaces the old one.
//!
//! Node steps are judged node by node ([`crate::fleet`]): lost nodes are
//! named and never waited for.
//!
//! Every wait is judged on the live objects (template hash, observed
//! generation, counts), never on what this operator believes it did, so a
//! lost status write or a restart only repeats idempotent applies.

use chrono::{DateTime, Duration, Utc};
use csiops_crds::{ControllerKind, RolloutKind, RolloutStatus, RolloutStep, RolloutStrategy};

use crate::fleet::Fleet;

pub mod observe;
mod waits;

use waits::{controller_gone, controller_roll, controller_scaled_down, node_gone, node_rolled};

/// What the object asks for, reduced to what the state machine needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub node_hash: String,
    pub controller_hash: String,
    /// Whether a controller workload should exist (topology Central). When
    /// false, `controller_hash`, `controller_replicas` and `controller_kind`
    /// mean nothing and any controller workload is removed.
    pub controller: bool,
    /// Whether the registrar runs, so that "registered" can be waited for.
    pub registration_required: bool,
    pub step_timeout: Duration,
    pub paused: bool,
    /// True once a rollout has completed for this object (status.currentVersion set).
    pub ever_completed: bool,
    pub strategy: RolloutStrategy,
    /// `spec.controller.replicas`.
    pub controller_replicas: i32,
    pub controller_kind: ControllerKind,
}

/// The live controller StatefulSet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControllerObs {
    pub hash: Option<String>,
    pub generation: i64,
    pub observed_generation: i64,
    pub spec_replicas: i32,
    pub replicas: i32,
    pub ready: i32,
    pub updated: i32,
    /// A StatefulSet's `updateStrategy.rollingUpdate.partition` (0 when unset).
    pub partition: i32,
    /// Pods at the workload's update revision (StatefulSet) or newest
    /// ReplicaSet (Deployment) that are Ready.
    pub updated_ready: i32,
}

/// The live node DaemonSet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeObs {
    pub hash: Option<String>,
    pub generation: i64,
    pub observed_generation: i64,
}

/// What the cluster has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The controller workload of the kind the spec asks for.
    pub controller: Option<ControllerObs>,
    /// A controller workload of the other kind exists (left from before
    /// `spec.controller.kind` changed).
    pub stale_controller: bool,
    /// Controller pods that exist, terminating ones included.
    pub controller_pods: usize,
    pub node: Option<NodeObs>,
    /// Node pods that exist, terminating ones included.
    pub node_pods: usize,
    /// The node side, node by node (lost nodes apart).
    pub fleet: Fleet,
    /// Cluster-scoped objects (CSIDriver, RBAC, StorageClasses) still carrying our owner label.
    pub cluster_scoped_remaining: usize,
}

/// One thing the reconciler must do now, in order, for a live object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Server-side apply the rendered node DaemonSet.
    ApplyNode,
    /// Server-side apply the rendered controller workload.
    ApplyController,
    /// Server-side apply the rendered controller StatefulSet with these
    /// replicas and rolling-update partition: a phase of a surge roll.
    ApplyControllerSurge { replicas: i32, partition: i32 },
    /// Set the live controller workload's replicas to 0, keeping its template.
    ScaleControllerToZero,
    /// Delete the controller workload of the kind the spec no longer asks for.
    DeleteStaleController,
    /// Delete the controller workload of the spec's kind: the spec asks for
    /// none (topology NodeLocal).
    DeleteController,
}

/// One step of the ordered teardown of a deleted object, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeardownAction {
    /// Delete the controller workload of the spec's kind.
    DeleteController,
    /// Delete the controller workload of the other kind.
    DeleteStaleController,
    /// Delete the node DaemonSet.
    DeleteNode,
    /// Delete the CSIDriver, cluster RBAC and StorageClasses this object owns.
    CleanupClusterScoped,
    /// Teardown is complete: drop the finalizer.
    RemoveFinalizer,
}

/// A transition worth an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    RolloutStarted(RolloutKind),
    /// The object changed while a rollout ran; the rollout now aims at the new content.
    RolloutRetargeted {
        kind: RolloutKind,
        step: RolloutStep,
    },
    StepStarted(RolloutStep),
    StepCompleted(RolloutStep),
    RolloutCompleted(RolloutKind),
}

/// The outcome of one planning pass: [`Action`]s for a live object,
/// [`TeardownAction`]s for a deleted one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan<A = Action> {
    pub actions: Vec<A>,
    /// The rollout to persist in status; `None` when none is under way.
    pub rollout: Option<RolloutStatus>,
    pub transitions: Vec<Transition>,
    /// What the current step waits for, in words for status and logs.
    pub waiting_for: Option<String>,
    /// Set when the current step is past its deadline: the concrete reason.
    pub overdue: Option<String>,
    /// A rollout finished in this pass (the reconciler records the version).
    pub completed: bool,
}

impl<A> Plan<A> {
    fn new(rollout: Option<RolloutStatus>) -> Self {
        Self {
            actions: Vec::new(),
            rollout,
            transitions: Vec::new(),
            waiting_for: None,
            overdue: None,
            completed: false,
        }
    }
}

/// Plans a live (not deleted) object.
pub fn plan(
    desired: &Desired,
    observed: &Observed,
    persisted: Option<&RolloutStatus>,
    now: DateTime<Utc>,
) -> Plan {
    // A Delete rollout persisted on a live object can only come from a status
    // that outlived a deletion that was undone; it carries no meaning here.
    let persisted = persisted.filter(|r| r.kind != RolloutKind::Delete);
    if desired.paused {
        let mut plan = Plan::new(persisted.cloned());
        plan.waiting_for = Some("spec.paused is true: no change is made".to_string());
        return plan;
    }

    let mut plan = Plan::new(None);
    let rollout = match persisted {
        Some(r) => retarget(r, desired, now, &mut plan.transitions),
        None => match start(desired, observed, now) {
            Some(r) => {
                plan.transitions.push(Transition::RolloutStarted(r.kind));
                plan.transitions.push(Transition::StepStarted(r.step));
                r
            }
            None => {
                // Steady state: re-apply to undo drift; the hashes match.
                plan.actions = if desired.controller {
                    vec![Action::ApplyNode, Action::ApplyController]
                } else {
                    vec![Action::ApplyNode]
                };
                return plan;
            }
        },
    };

    drive_steps(
        &mut plan,
        rollout,
        desired.step_timeout,
        now,
        |step| run_step(step, desired, observed),
        |kind, step| {
            next_step(
                kind,
                step,
                desired.controller || controller_present(observed),
            )
        },
    );
    plan
}

/// Plans an object being deleted: the ordered teardown.
pub fn plan_delete(
    observed: &Observed,
    persisted: Option<&RolloutStatus>,
    step_timeout: Duration,
    now: DateTime<Utc>,
) -> Plan<TeardownAction> {
    let mut plan = Plan::new(None);
    let mut rollout = match persisted.filter(|r| r.kind == RolloutKind::Delete) {
        Some(r) => r.clone(),
        None => {
            let r = new_rollout(
                RolloutKind::Delete,
                RolloutStep::ControllerDelete,
                "",
                "",
                now,
            );
            plan.transitions
                .push(Transition::RolloutStarted(RolloutKind::Delete));
            plan.transitions.push(Transition::StepStarted(r.step));
            r
        }
    };
    // A step of a live rollout persisted here (a deletion that began before
    // this operator recorded it) restarts the teardown at its first step.
    if !matches!(
        rollout.step,
        RolloutStep::ControllerDelete | RolloutStep::NodeDelete | RolloutStep::ClusterCleanup
    ) {
        rollout.step = RolloutStep::ControllerDelete;
        rollout.step_started_at = rfc3339(now);
    }
    drive_steps(
        &mut plan,
        rollout,
        step_timeout,
        now,
        |step| run_delete_step(step, observed),
        |kind, step| next_step(kind, step, true),
    );
    if plan.completed {
        plan.actions.push(TeardownAction::RemoveFinalizer);
    }
    plan
}

/// Runs steps from `rollout.step` on: each step's actions are added to the
/// plan; a finished step starts the next one in the same pass; the first step
/// still waiting is persisted (with its deadline judged), or the rollout ends.
fn drive_steps<A: PartialEq>(
    plan: &mut Plan<A>,
    mut rollout: RolloutStatus,
    step_timeout: Duration,
    now: DateTime<Utc>,
    run: impl Fn(RolloutStep) -> (Vec<A>, Option<String>),
    next: impl Fn(RolloutKind, RolloutStep) -> Option<RolloutStep>,
) {
    loop {
        let (actions, wait) = run(rollout.step);
        for a in actions {
            if !plan.actions.contains(&a) {
                plan.actions.push(a);
            }
        }
        if let Some(waiting) = wait {
            plan.overdue = overdue(&rollout, step_timeout, now, &waiting);
            plan.waiting_for = Some(waiting);
            plan.rollout = Some(rollout);
            return;
        }
        plan.transitions
            .push(Transition::StepCompleted(rollout.step));
        match next(rollout.kind, rollout.step) {
            Some(step) => {
                plan.transitions.push(Transition::StepStarted(step));
                rollout.step = step;
                rollout.step_started_at = rfc3339(now);
            }
            None => {
                plan.transitions
                    .push(Transition::RolloutCompleted(rollout.kind));
                plan.completed = true;
                plan.rollout = None;
                return;
            }
        }
    }
}

/// Actions and wait of a teardown step.
fn run_delete_step(
    step: RolloutStep,
    observed: &Observed,
) -> (Vec<TeardownAction>, Option<String>) {
    match step {
        RolloutStep::ControllerDelete => {
            let mut actions: Vec<TeardownAction> = observed
                .controller
                .iter()
                .map(|_| TeardownAction::DeleteController)
                .collect();
            if observed.stale_controller {
                actions.push(TeardownAction::DeleteStaleController);
            }
            (actions, controller_gone(observed))
        }
        RolloutStep::NodeDelete => (
            observed
                .node
                .iter()
                .map(|_| TeardownAction::DeleteNode)
                .collect(),
            node_gone(observed),
        ),
        RolloutStep::ClusterCleanup => {
            let left = observed.cluster_scoped_remaining;
            if left == 0 {
                (Vec::new(), None)
            } else {
                (
                    vec![TeardownAction::CleanupClusterScoped],
                    Some(format!("{left} cluster-scoped object(s) still present")),
                )
            }
        }
        // Normalised away by `plan_delete` before the first step runs.
        RolloutStep::NodeInstall
        | RolloutStep::ControllerScaleDown
        | RolloutStep::NodeRoll
        | RolloutStep::ControllerRoll => (Vec::new(), None),
    }
}

/// Timestamps in status: RFC 3339, whole seconds, `Z`.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A Kubernetes timestamp in the form of [`rfc3339`].
pub fn rfc3339_of(t: &k8s_openapi::jiff::Timestamp) -> String {
    DateTime::from_timestamp(t.as_second(), 0)
        .map(rfc3339)
        .unwrap_or_default()
}

fn new_rollout(
    kind: RolloutKind,
    step: RolloutStep,
    node_hash: &str,
    controller_hash: &str,
    now: DateTime<Utc>,
) -> RolloutStatus {
    RolloutStatus {
        kind,
        step,
        started_at: rfc3339(now),
        step_started_at: rfc3339(now),
        target_node_hash: node_hash.to_string(),
        target_controller_hash: controller_hash.to_string(),
    }
}

/// Decides whether the live objects differ from the desired ones, and which
/// rollout brings them there.
fn start(desired: &Desired, observed: &Observed, now: DateTime<Utc>) -> Option<RolloutStatus> {
    if !desired.controller {
        return start_node_local(desired, observed, now);
    }
    let node_current = observed
        .node
        .as_ref()
        .is_some_and(|n| n.hash.as_deref() == Some(desired.node_hash.as_str()));
    let controller_current = observed
        .controller
        .as_ref()
        .is_some_and(|c| c.hash.as_deref() == Some(desired.controller_hash.as_str()));
    let controller_running = controller_running(observed);
    let stop_controller = desired.strategy == RolloutStrategy::StopController;

    let (kind, step) = if !node_current {
        if observed.node.is_none() && !controller_running {
            (RolloutKind::Install, RolloutStep::NodeInstall)
        } else if controller_running && stop_controller {
            // The node side changes under a running controller that must
            // not see node plugins of another version: take it down first.
            (upgrade_kind(desired), RolloutStep::ControllerScaleDown)
        } else {
            // The old controller keeps serving while the nodes roll.
            (upgrade_kind(desired), RolloutStep::NodeRoll)
        }
    } else if (!controller_current || observed.stale_controller)
        && ((!controller_running && node_rolled(observed).is_some()) || observed.fleet.is_rolling())
    {
        // The DaemonSet carries the desired content but its pods are not all
        // up (a status write lost, or a read older than our own write): no
        // new controller comes up before the node side is rolled out.
        if desired.ever_completed {
            (RolloutKind::Upgrade, RolloutStep::NodeRoll)
        } else {
            (RolloutKind::Install, RolloutStep::NodeInstall)
        }
    } else if !controller_current
        || observed.stale_controller
        || controller_mid_surge(desired, observed)
    {
        let kind = if desired.ever_completed {
            RolloutKind::ControllerUpdate
        } else {
            RolloutKind::Install
        };
        (kind, RolloutStep::ControllerRoll)
    } else if !desired.ever_completed {
        // Everything is in place but no rollout was ever recorded: objects
        // a takeover (spec.adoption) put there, or a status write lost
        // after an install. An install checks them and records the version.
        (RolloutKind::Install, RolloutStep::NodeInstall)
    } else {
        return None;
    };
    Some(new_rollout(
        kind,
        step,
        &desired.node_hash,
        &desired.controller_hash,
        now,
    ))
}

/// [`start`] without a controller workload: the node side, and the removal
/// of a controller left from a central past.
fn start_node_local(
    desired: &Desired,
    observed: &Observed,
    now: DateTime<Utc>,
) -> Option<RolloutStatus> {
    let node_current = observed
        .node
        .as_ref()
        .is_some_and(|n| n.hash.as_deref() == Some(desired.node_hash.as_str()));
    let first = if desired.ever_completed {
        RolloutStep::NodeRoll
    } else {
        RolloutStep::NodeInstall
    };
    let (kind, step) = if !node_current {
        if observed.node.is_none() && !controller_running(observed) {
            (RolloutKind::Install, RolloutStep::NodeInstall)
        } else if controller_running(observed) {
            // A central controller stops before the nodes take over its
            // provisioning (see the module docs).
            (upgrade_kind(desired), RolloutStep::ControllerScaleDown)
        } else {
            (upgrade_kind(desired), first)
        }
    } else if controller_present(observed) {
        if observed.fleet.is_rolling() {
            (upgrade_kind(desired), first)
        } else {
            (upgrade_kind(desired), RolloutStep::ControllerRoll)
        }
    } else if !desired.ever_completed {
        // As in `start`: in place, never recorded.
        (RolloutKind::Install, RolloutStep::NodeInstall)
    } else {
        return None;
    };
    Some(new_rollout(
        kind,
        step,
        &desired.node_hash,
        &desired.controller_hash,
        now,
    ))
}

/// Whether anything of a controller exists: a workload of either kind
/// (scaled down or not) or pods.
fn controller_present(observed: &Observed) -> bool {
    observed.controller.is_some() || observed.stale_controller || observed.controller_pods > 0
}

/// Whether any controller runs, or is about to: replicas asked, the other
/// kind's workload, or pods still there.
fn controller_running(observed: &Observed) -> bool {
    observed
        .controller
        .as_ref()
        .is_some_and(|c| c.spec_replicas > 0)
        || observed.stale_controller
        || observed.controller_pods > 0
}

/// A StatefulSet left between the phases of a surge roll (its status write
/// lost): the roll must be finished, the surge replica removed.
fn controller_mid_surge(desired: &Desired, observed: &Observed) -> bool {
    desired.controller
        && desired.controller_kind == ControllerKind::StatefulSet
        && observed.controller.as_ref().is_some_and(|c| {
            c.partition > 0
                || (c.spec_replicas > desired.controller_replicas && c.spec_replicas > 0)
        })
}

fn upgrade_kind(desired: &Desired) -> RolloutKind {
    if desired.ever_completed {
        RolloutKind::Upgrade
    } else {
        RolloutKind::Install
    }
}

/// An edit during a rollout: aim the rollout at the new content without ever
/// bringing up a controller over a node side it was not rolled out with.
fn retarget(
    persisted: &RolloutStatus,
    desired: &Desired,
    now: DateTime<Utc>,
    transitions: &mut Vec<Transition>,
) -> RolloutStatus {
    let mut r = persisted.clone();
    let node_changed = r.target_node_hash != desired.node_hash;
    let controller_changed = r.target_controller_hash != desired.controller_hash;
    if !node_changed && !controller_changed {
        return r;
    }
    r.target_node_hash = desired.node_hash.clone();
    r.target_controller_hash = desired.controller_hash.clone();
    if node_changed {
        match r.step {
            // Nothing of the controller exists yet in an install's first step,
            // and a node roll simply continues with the newer DaemonSet.
            RolloutStep::NodeInstall | RolloutStep::NodeRoll => {}
            // The controller may be coming up over the old node side: roll
            // the node side first (taking the controller down again where
            // the strategy says so; otherwise it keeps serving as it is).
            _ => {
                r.step = match desired.strategy {
                    RolloutStrategy::StopController => RolloutStep::ControllerScaleDown,
                    RolloutStrategy::NonDisruptive => RolloutStep::NodeRoll,
                };
                if r.kind == RolloutKind::ControllerUpdate {
                    r.kind = upgrade_kind(desired);
                }
            }
        }
    }
    r.step_started_at = rfc3339(now);
    transitions.push(Transition::RolloutRetargeted {
        kind: r.kind,
        step: r.step,
    });
    r
}

/// The step after `step`; `controller_step`: whether a controller step
/// follows the node side (a controller is wanted, or one is left to remove).
fn next_step(kind: RolloutKind, step: RolloutStep, controller_step: bool) -> Option<RolloutStep> {
    use RolloutStep::*;
    match (kind, step) {
        (RolloutKind::Delete, ControllerDelete) => Some(NodeDelete),
        (RolloutKind::Delete, NodeDelete) => Some(ClusterCleanup),
        (RolloutKind::Delete, _) => None,
        (_, NodeInstall) | (_, NodeRoll) => controller_step.then_some(ControllerRoll),
        (_, ControllerScaleDown) => Some(NodeRoll),
        (_, ControllerRoll) => None,
        // Teardown steps never appear in a live rollout; finish it.
        (_, ControllerDelete) | (_, NodeDelete) | (_, ClusterCleanup) => None,
    }
}

/// Actions of a step and, if it is not finished, what it still waits for.
fn run_step(
    step: RolloutStep,
    desired: &Desired,
    observed: &Observed,
) -> (Vec<Action>, Option<String>) {
    match step {
        RolloutStep::NodeInstall | RolloutStep::NodeRoll => {
            // A driver that cannot bear skew never has its nodes rolled
            // under a running controller, whichever way the step was
            // reached (a status lost, an edit mid-roll); nor does a driver
            // becoming node-local, whose nodes take over the provisioning.
            let stop = desired.strategy == RolloutStrategy::StopController || !desired.controller;
            if stop && controller_running(observed) {
                return run_step(RolloutStep::ControllerScaleDown, desired, observed);
            }
            (vec![Action::ApplyNode], node_rolled(observed))
        }
        RolloutStep::ControllerScaleDown => {
            let mut actions = match &observed.controller {
                Some(c) if c.spec_replicas != 0 => vec![Action::ScaleControllerToZero],
                _ => Vec::new(),
            };
            // A controller of the old kind is coming down for good: remove it.
            if observed.stale_controller {
                actions.push(Action::DeleteStaleController);
            }
            (actions, controller_scaled_down(observed))
        }
        RolloutStep::ControllerRoll => {
            // The controller content is only ever applied over a node side
            // already at its target: the DaemonSet must carry the desired hash.
            let node_at_target = observed
                .node
                .as_ref()
                .is_some_and(|n| n.hash.as_deref() == Some(desired.node_hash.as_str()));
            if !node_at_target {
                return (
                    vec![Action::ApplyNode],
                    Some("node DaemonSet is not at the desired content yet".to_string()),
                );
            }
            // Switching kinds: the old workload and its pods are gone before
            // the new one starts, so two controllers never run side by side.
            if !desired.controller {
                return remove_controller(observed);
            }
            if observed.stale_controller {
                return (
                    vec![Action::DeleteStaleController],
                    Some("controller of the previous kind is being removed".to_string()),
                );
            }
            // A new controller template is first applied only once no
            // healthy node runs a previous node pod (a node that came back,
            // say, gets its new pod first); a roll under way goes on.
            let template_current = observed
                .controller
                .as_ref()
                .is_some_and(|c| c.hash.as_deref() == Some(desired.controller_hash.as_str()));
            if !template_current && observed.fleet.is_rolling() {
                let why = observed
                    .fleet
                    .waiting_for()
                    .unwrap_or_else(|| "node side still rolling out".to_string());
                return (vec![Action::ApplyNode], Some(why));
            }
            if observed.controller.is_none() && observed.controller_pods > 0 {
                return (
                    Vec::new(),
                    Some(format!(
                        "controller of the previous kind: {} pod(s) left",
                        observed.controller_pods
                    )),
                );
            }
            controller_roll(desired, observed)
        }
        // A live rollout never holds a teardown step (see `next_step`).
        RolloutStep::ControllerDelete | RolloutStep::NodeDelete | RolloutStep::ClusterCleanup => {
            (Vec::new(), None)
        }
    }
}

/// The controller step of a spec without a controller: once every healthy
/// node runs its node-local pod, the workloads of both kinds are deleted,
/// and the step waits until their pods are gone.
fn remove_controller(observed: &Observed) -> (Vec<Action>, Option<String>) {
    if observed.fleet.is_rolling() {
        let why = observed
            .fleet
            .waiting_for()
            .unwrap_or_else(|| "node side still rolling out".to_string());
        return (vec![Action::ApplyNode], Some(why));
    }
    let mut actions = Vec::new();
    if observed.controller.is_some() {
        actions.push(Action::DeleteController);
    }
    if observed.stale_controller {
        actions.push(Action::DeleteStaleController);
    }
    let wait = controller_present(observed).then(|| {
        format!(
            "controller workload being removed (topology NodeLocal runs none): {} pod(s) left",
            observed.controller_pods
        )
    });
    (actions, wait)
}

fn overdue(
    rollout: &RolloutStatus,
    timeout: Duration,
    now: DateTime<Utc>,
    waiting: &str,
) -> Option<String> {
    let started = DateTime::parse_from_rfc3339(&rollout.step_started_at)
        .ok()?
        .with_timezone(&Utc);
    let elapsed = now - started;
    (elapsed > timeout).then(|| {
        format!(
            "step {} has not finished after {}s (deadline {}s): {}",
            rollout.step,
            elapsed.num_seconds(),
            timeout.num_seconds(),
            waiting
        )
    })
}

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
