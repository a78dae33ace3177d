//! One reconciliation of one object.
//!
//! Flow of [`reconcile`]:
//! 1. deleted object → ordered teardown ([`teardown`]);
//! 2. another object owns the driver name → Degraded (Conflict), nothing touched;
//! 3. render (pure) → a render error is Degraded (RenderFailed) + Event;
//! 4. supporting objects applied (ownership-checked, side by side, [`apply_supporting`]);
//! 5. workloads observed; a takeover (`spec.adoption`) runs its own plan
//!    until it is done ([`take_over`]); the state machine planned, its
//!    actions executed;
//! 6. the metrics Service and PodMonitor applied, objects the spec no longer
//!    renders pruned (after the workloads: no pod waits on them);
//! 7. Events for every transition, status by server-side apply ([`write_progress`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{Duration, Utc};
use csiops_crds::CSIDriverDeployment;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tracing::{debug, info, warn};

use super::conflict;
use super::context::{object_key, Context};
use super::error::Error;
use super::events::{announce, Note, Notes};
use super::pacing::{pace, retry};
use super::watch::caches;
use super::write::adoption;
use super::write::apply::{owned_only, Owner};
use super::write::cluster::ClusterScoped;
use super::write::finalizer::{ensure_finalizer, FINALIZER};
use super::write::status::{status_after, warn_once, write_problem, write_progress, Progress};
use super::write::supporting::apply_supporting;
use super::write::teardown::teardown;
use super::write::workloads::{execute, observe, pods_of, LiveController};
use super::write::{monitoring, namespaced};
use crate::health::{self, Health, HealthInput};
use crate::policy::presence;
use crate::render::labels;
use crate::render::{self, names, Rendered};
use crate::report::{self, Problem};
use crate::rollout::{self, Desired};
use csiops_runtime::chain;

/// How often an object is looked at while a rollout runs, besides watch events
/// (the step deadline must be noticed even if nothing changes).
const ROLLOUT_REQUEUE: StdDuration = StdDuration::from_secs(10);
/// Resync of a settled object.
const IDLE_REQUEUE: StdDuration = StdDuration::from_secs(300);
/// An object the user must fix is retried at this pace.
const USER_ERROR_REQUEUE: StdDuration = StdDuration::from_secs(60);

/// What of `obj` and its cached workloads lets a reconcile through the
/// pacer at once when it moved (see [`pace`]).
fn waypoints(caches: &caches::Caches, obj: &CSIDriverDeployment, ns: &str) -> pace::Waypoints {
    let node = names::node_name(obj);
    let controller = names::controller_name(obj);
    pace::Waypoints::of(
        obj,
        caches
            .daemonsets
            .get(&ObjectRef::new(&node).within(ns))
            .as_deref(),
        caches
            .statefulsets
            .get(&ObjectRef::new(&controller).within(ns))
            .as_deref(),
        caches
            .deployments
            .get(&ObjectRef::new(&controller).within(ns))
            .as_deref(),
    )
}

/// Transient failures are retried; the error is counted and logged.
/// Failures that reached here (a read of the object itself, its status
/// write) back off per object like the reported ones, from 5s to 5 minutes.
pub fn error_policy(obj: Arc<CSIDriverDeployment>, err: &Error, ctx: Arc<Context>) -> Requeue {
    ctx.metrics.reconcile_failed(err.metric_kind());
    let failures = ctx.objects.with(&object_key(&obj), |o| o.failures.record());
    let wait = retry::backoff(failures);
    warn!(object = %obj.name_any(), namespace = ?obj.namespace(), failures, retry_in = ?wait, error = %chain(err), "reconcile failed; retrying");
    Requeue::requeue(wait)
}

/// One reconciliation of one object.
pub async fn reconcile(obj: Arc<CSIDriverDeployment>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let _timer = ctx.metrics.reconcile_started();
    let key = object_key(&obj);
    match run_pass(obj, ctx.clone(), &key).await? {
        Some(requeue) => Ok(requeue),
        // The one place where what is kept of an object is dropped: it is
        // gone, or its teardown is done.
        None => {
            ctx.objects.forget(&key);
            Ok(Requeue::await_change())
        }
    }
}

/// [`reconcile`]: `None` once the object is gone or torn down.
async fn run_pass(
    obj: Arc<CSIDriverDeployment>,
    ctx: Arc<Context>,
    key: &str,
) -> Result<Option<Requeue>, Error> {
    let ns = obj.namespace().ok_or(Error::MissingMetadata("namespace"))?;
    let uid = obj.uid().ok_or(Error::MissingMetadata("uid"))?;
    let name = obj.name_any();
    let owner = Owner {
        uid: &uid,
        namespace: &ns,
        name: &name,
    };
    let api: Api<CSIDriverDeployment> = Api::namespaced(ctx.client.clone(), &ns);

    // Outside --watch-namespaces: not ours to act on, whatever it asks.
    if !ctx.scope.allows(&ns) {
        debug!(object = %name, namespace = %ns, "not in --watch-namespaces; left alone");
        return Ok(Some(Requeue::await_change()));
    }

    // Nothing is judged on caches still filling (every node would look
    // lost, every workload missing).
    if !ctx.caches.synced.ready() {
        return Ok(Some(Requeue::requeue(StdDuration::from_millis(500))));
    }
    let waypoints = waypoints(&ctx.caches, &obj, &ns);
    let now = std::time::Instant::now();
    if let Some(wait) = ctx.objects.with(key, |o| {
        ctx.pacer.hold_unless_moved(&mut o.paced, now, &waypoints)
    }) {
        debug!(object = %name, namespace = %ns, wait_ms = wait.as_millis() as u64, "paced");
        return Ok(Some(Requeue::requeue(wait)));
    }

    // Plan from a current copy: the watch cache's when it is known to be
    // current, else the API server's (see `pacing::fresh`).
    let version = obj.resource_version();
    let obj = if ctx
        .objects
        .with(key, |o| o.fresh.is_current(version.as_deref()))
    {
        obj
    } else {
        match api
            .get_opt(&name)
            .await
            .map_err(|e| Error::read("get", format!("CSIDriverDeployment {ns}/{name}"), e))?
        {
            Some(current) if current.uid().as_deref() == Some(uid.as_str()) => {
                let version = current.resource_version();
                ctx.objects.with(key, |o| o.fresh.note(version.as_deref()));
                Arc::new(current)
            }
            // Gone, or deleted and recreated under the same name: the new
            // object gets its own reconcile from the watch.
            _ => return Ok(None),
        }
    };

    // What the pass tells of the object from here on is collected and
    // published at its end, whatever the outcome (see `events::Notes`).
    let notes = Notes::about(&obj);
    let outcome = act(&obj, &ctx, &api, owner, key, &notes).await;
    notes.publish(&ctx.recorder).await;
    outcome
}

/// What a pass does with a current copy of a live or deleted object.
async fn act(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    api: &Api<CSIDriverDeployment>,
    owner: Owner<'_>,
    key: &str,
    notes: &Notes,
) -> Result<Option<Requeue>, Error> {
    if obj.metadata.deletion_timestamp.is_some() {
        ctx.objects.with(key, |o| o.failures.clear());
        if !obj.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(None);
        }
        return teardown(obj, ctx, api, owner, notes).await;
    }

    // Who owns the driver name: the cache first (cheap), then, until this
    // object's CSIDriver exists under its name, the API server itself, so
    // two objects created together never both write cluster-scoped objects.
    let all = ctx.deployments.state();
    let in_scope = |d: &&CSIDriverDeployment| ctx.scope.allows(&d.namespace().unwrap_or_default());
    let cached_rival =
        conflict::rival(obj, all.iter().map(|d| d.as_ref()).filter(in_scope)).cloned();
    let rival = match cached_rival {
        Some(r) => Some(r),
        None => match claim_driver_name(obj, ctx).await? {
            Claim::Ours => None,
            Claim::Rival(r) => Some(*r),
            Claim::TooEarly(wait) => return Ok(Some(Requeue::requeue(wait))),
        },
    };
    if let Some(rival) = rival {
        let problem = Problem {
            reason: "Conflict",
            message: conflict::message(obj, &rival),
        };
        ctx.metrics.reconcile_failed("conflict");
        write_problem(obj, ctx, api, &problem, notes).await?;
        return Ok(Some(Requeue::requeue(USER_ERROR_REQUEUE)));
    }

    ensure_finalizer(obj, api).await?;

    let rendered = match render::render(obj, &ctx.render_cfg) {
        Ok(r) => r,
        Err(e) => {
            let problem = Problem {
                reason: "RenderFailed",
                message: format!("cannot render the driver's objects: {}", chain(&e)),
            };
            ctx.metrics.reconcile_failed("render");
            write_problem(obj, ctx, api, &problem, notes).await?;
            return Ok(Some(Requeue::requeue(USER_ERROR_REQUEUE)));
        }
    };

    match drive(obj, ctx, api, owner, &rendered, notes).await {
        Ok(requeue) => {
            ctx.objects.with(key, |o| o.failures.clear());
            Ok(Some(requeue))
        }
        Err(e) => {
            if let Some(reason) = e.user_facing_reason() {
                ctx.metrics.reconcile_failed(e.metric_kind());
                let problem = Problem {
                    reason,
                    message: chain(&e).to_string(),
                };
                write_problem(obj, ctx, api, &problem, notes).await?;
                return Ok(Some(Requeue::requeue(USER_ERROR_REQUEUE)));
            }
            let Some(reason) = e.repeated_failure_reason() else {
                return Err(e);
            };
            ctx.metrics.reconcile_failed(e.metric_kind());
            let failures = ctx.objects.with(key, |o| o.failures.record());
            let wait = retry::backoff(failures);
            warn!(object = %owner.name, namespace = %owner.namespace, failures, retry_in = ?wait, error = %chain(&e), "write failed");
            if failures >= retry::REPORT_AFTER {
                // The message stays the same while the failure does, so the
                // condition and the Event are written once, not per retry.
                let problem = Problem {
                    reason,
                    message: format!("{}; retrying with backoff", chain(&e)),
                };
                write_problem(obj, ctx, api, &problem, notes).await?;
            }
            Ok(Some(Requeue::requeue(wait)))
        }
    }
}

/// Whether `obj` may write its driver's cluster-scoped objects.
enum Claim {
    Ours,
    Rival(Box<CSIDriverDeployment>),
    /// Created less than [`conflict::SETTLE`] ago: a rival created in the
    /// same second may not be listed yet; ask again after this.
    TooEarly(StdDuration),
}

/// Decides from the API server, unless this object's CSIDriver (named after
/// the driver) already carries its owner label: then it holds the name.
async fn claim_driver_name(obj: &CSIDriverDeployment, ctx: &Context) -> Result<Claim, Error> {
    let uid = obj.uid().unwrap_or_default();
    let held = ctx
        .caches
        .owned
        .get("CSIDriver", "", &obj.spec.driver_name)
        .is_some_and(|k| k.owner_uid.as_deref() == Some(uid.as_str()));
    if held {
        return Ok(Claim::Ours);
    }
    let created = obj
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| chrono::DateTime::from_timestamp(t.0.as_second(), 0));
    if let Some(wait) = conflict::too_early(created, Utc::now()) {
        return Ok(Claim::TooEarly(wait));
    }
    let api: Api<CSIDriverDeployment> = Api::all(ctx.client.clone());
    let live = api
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| Error::read("list", "CSIDriverDeployments", e))?;
    let in_scope = |d: &&CSIDriverDeployment| ctx.scope.allows(&d.namespace().unwrap_or_default());
    Ok(
        match conflict::rival(obj, live.items.iter().filter(in_scope)) {
            Some(r) => Claim::Rival(Box::new(r.clone())),
            None => Claim::Ours,
        },
    )
}

/// Steps 4–7 of a live object.
async fn drive(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    api: &Api<CSIDriverDeployment>,
    owner: Owner<'_>,
    rendered: &Rendered,
    notes: &Notes,
) -> Result<Requeue, Error> {
    let now = Utc::now();
    let started = std::time::Instant::now();
    let spec = &obj.spec;
    let status = obj.status.as_ref();

    let mut supporting_done = StdDuration::ZERO;
    if !spec.paused {
        if spec.adoption.is_some() {
            adoption::keep_csidriver(obj, ctx, owner, rendered).await?;
        }
        apply_supporting(obj, ctx, owner, rendered, notes).await?;
        supporting_done = started.elapsed();
        // A re-created CSIDriver or class is told before the workloads are
        // written (which take a while and may fail): whoever watches for it
        // finds its Event with it.
        notes.publish(&ctx.recorder).await;
    }

    let controller = LiveController::cached(ctx, obj, owner)?;
    let ds = owned_only(
        caches::Caches::get(
            &ctx.caches.daemonsets,
            owner.namespace,
            &names::node_name(obj),
        ),
        "DaemonSet",
        owner,
    )?;
    let pods = pods_of(ctx, owner);
    let registered = ctx.caches.csinodes.registered(&spec.driver_name);
    let registration_required = spec.sidecars.registrar.enabled;
    let mount_failures = ctx.caches.mount_failures.for_stuck(&pods, now);
    let (statefulset, deployment) = controller.current(spec.controller.kind);
    let node_infos = ctx.caches.nodes.snapshot();
    let health = health::assess(&HealthInput {
        driver_name: &spec.driver_name,
        kubelet_dir: &spec.node.kubelet_dir,
        registration_required,
        controller_replicas: spec.controller_replicas(),
        max_unavailable: spec.node.max_unavailable.as_ref(),
        statefulset,
        deployment,
        daemonset: ds.as_ref(),
        node_hash: &rendered.node_hash,
        pods: &pods,
        nodes: &node_infos,
        registered: &registered,
        tainted_nodes: ctx
            .caches
            .nodes
            .count_tainted(&csiops_crds::readiness_taint_key(&spec.driver_name)),
        mount_failures: &mount_failures,
        now,
    });
    let observed = observe(
        &controller,
        spec.controller.kind,
        ds.as_ref(),
        &health,
        &pods,
    );
    if let Some(requeue) = take_over(obj, ctx, api, owner, rendered, &health, notes).await? {
        return Ok(requeue);
    }
    let desired = Desired {
        node_hash: rendered.node_hash.clone(),
        controller_hash: rendered.controller_hash.clone(),
        controller: rendered.controller.is_some(),
        registration_required,
        step_timeout: Duration::seconds(spec.rollout.step_timeout_seconds),
        paused: spec.paused,
        ever_completed: status.is_some_and(|s| s.current_version.is_some()),
        strategy: spec.rollout.strategy,
        controller_replicas: spec.controller.replicas,
        controller_kind: spec.controller.kind,
    };
    let plan = rollout::plan(
        &desired,
        &observed,
        status.and_then(|s| s.rollout.as_ref()),
        now,
    );

    let node_budget = health
        .fleet
        .max_unavailable(spec.node.max_unavailable.as_ref());
    let planned = started.elapsed();
    for action in &plan.actions {
        execute(*action, obj, ctx, owner, rendered, &node_budget).await?;
    }
    let executed = started.elapsed();
    // After the workloads' writes: nothing a pod needs is among these, and
    // on an edit they cost a few requests the rollout need not wait for.
    if !spec.paused {
        tidy(obj, ctx, owner, rendered).await?;
    }
    let tidied = started.elapsed();
    announce(obj, &ctx.metrics, &plan, notes);
    announce_lost_nodes(obj, &health, notes);

    // No node to run on says more than any step deadline it causes.
    let no_nodes =
        health::no_matching_nodes(ds.as_ref(), &spec.node.node_selector).map(|why| Problem {
            reason: health::NO_MATCHING_NODES,
            message: why,
        });
    if let Some(p) = &no_nodes {
        warn_once(obj, p, notes);
    }
    let (lost_problem, next_lost) = lost_nodes_problem(obj, &health, now);
    let problem = no_nodes
        .or_else(|| {
            plan.overdue.as_ref().map(|why| Problem {
                reason: "RolloutStepTimeout",
                message: why.clone(),
            })
        })
        .or(lost_problem)
        .or_else(|| admission_problem(ctx));
    if let Some(p) = problem.as_ref().filter(|p| p.reason == presence::REASON) {
        warn_once(obj, p, notes);
    }
    let new_status = status_after(obj, Progress::of(&plan), &health, problem.as_ref(), now);
    let deferred = write_progress(obj, ctx, api, new_status, notes).await?;
    // Where a pass spends its time, cumulative from its start (milliseconds).
    debug!(
        object = %owner.name,
        step = ?plan.rollout.as_ref().map(|r| r.step),
        actions = ?plan.actions,
        supporting_ms = supporting_done.as_millis() as u64,
        planned_ms = planned.as_millis() as u64,
        executed_ms = executed.as_millis() as u64,
        tidied_ms = tidied.as_millis() as u64,
        written_ms = started.elapsed().as_millis() as u64,
        "pass"
    );
    let next = if plan.rollout.is_some() {
        ROLLOUT_REQUEUE
    } else {
        IDLE_REQUEUE
    };
    let next = [deferred, next_lost]
        .into_iter()
        .flatten()
        .fold(next, StdDuration::min);
    Ok(Requeue::requeue(next))
}

/// How often a takeover is looked at: a node's old pod leaving raises no
/// event for this object.
const ADOPTION_REQUEUE: StdDuration = StdDuration::from_secs(2);

/// One pass of a takeover (`spec.adoption`) while it runs, in place of the
/// rollout: `None` once it is done (or none is asked for), and the rollout
/// state machine takes over from the objects it left.
async fn take_over(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    api: &Api<CSIDriverDeployment>,
    owner: Owner<'_>,
    rendered: &Rendered,
    health: &Health,
    notes: &Notes,
) -> Result<Option<Requeue>, Error> {
    let spec = &obj.spec;
    let Some(wanted) = spec.adoption.as_ref().filter(|_| !spec.paused) else {
        return Ok(None);
    };
    let budget = health
        .fleet
        .max_unavailable(spec.node.max_unavailable.as_ref());
    let plan = adoption::plan(obj, ctx, owner, wanted, rendered, &budget).await?;
    if let Some(why) = plan.refused {
        return Err(Error::AdoptionRefused(why));
    }
    if plan.phase == crate::adoption::Phase::Done {
        return Ok(None);
    }
    for action in &plan.actions {
        adoption::execute(action, obj, ctx, owner, wanted, rendered, &budget).await?;
    }
    let progress = Progress {
        rollout: None,
        waiting_for: None,
        completed: false,
    };
    let status = status_after(obj, progress, health, None, Utc::now());
    let status = adoption::status_during(status, &plan);
    let deferred = write_progress(obj, ctx, api, status, notes).await?;
    let next = deferred.map_or(ADOPTION_REQUEUE, |d| d.min(ADOPTION_REQUEUE));
    Ok(Some(Requeue::requeue(next)))
}

/// The metrics Service and PodMonitor, and, when the spec changed since the
/// last status, the removal of the objects it no longer renders (side by
/// side: they are independent of each other).
async fn tidy(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    rendered: &Rendered,
) -> Result<(), Error> {
    let spec_changed =
        obj.status.as_ref().map(|s| s.observed_generation) != obj.metadata.generation;
    let monitoring = monitoring::apply_monitoring(
        &ctx.client,
        owner,
        rendered,
        spec_changed,
        &ctx.caches.owned,
    );
    let prune = async {
        if !spec_changed {
            return Ok(0);
        }
        let cluster = ClusterScoped::new(&ctx.client, labels::cluster_owner_selector(obj));
        let keep = namespaced::Keep::of(rendered);
        let (cluster, namespaced) = futures::try_join!(
            cluster.prune(rendered),
            namespaced::prune(&ctx.client, owner, &keep)
        )?;
        Ok::<_, Error>(cluster + namespaced)
    };
    let ((), pruned) = futures::try_join!(monitoring, prune)?;
    if pruned > 0 {
        info!(object = %owner.name, pruned, "removed objects the spec no longer renders");
    }
    Ok(())
}

/// The shipped admission policies not in force: every object says so, for
/// each is then editable into privileged pods on every node by whoever may
/// edit it. Announced once per object while it stands.
fn admission_problem(ctx: &Context) -> Option<Problem> {
    let differences = ctx.admission.differences();
    (!differences.is_empty()).then(|| Problem {
        reason: presence::REASON,
        message: format!(
            "{}; without them whoever may edit a CSIDriverDeployment may run privileged pods on every node: re-apply install.yaml or the chart (docs/security.md)",
            differences.join("; ")
        ),
    })
}

/// Degraded when a node has been lost for longer than the step deadline:
/// the driver serves nothing there. It holds no rollout back. Also how
/// long until the next lost node passes that deadline, to look again then.
fn lost_nodes_problem(
    obj: &CSIDriverDeployment,
    health: &Health,
    now: chrono::DateTime<Utc>,
) -> (Option<Problem>, Option<StdDuration>) {
    let listed = report::lost_nodes(&health.fleet.lost, obj.status.as_ref(), now);
    let timeout = Duration::seconds(obj.spec.rollout.step_timeout_seconds);
    let next = report::next_lost_deadline(&listed, timeout, now).and_then(|d| d.to_std().ok());
    let long = report::lost_too_long(&listed, timeout, now);
    let Some(first) = long.first() else {
        return (None, next);
    };
    let problem = Problem {
        reason: "NodesLost",
        message: format!(
            "{} node(s) lost for more than {}s, the driver serves nothing there: {} ({}) since {}; \
             they hold no rollout back and get the current node pod when they return",
            long.len(),
            timeout.num_seconds(),
            first.name,
            first.reason,
            first.since.as_deref().unwrap_or("?")
        ),
    };
    (Some(problem), next)
}

/// An Event when nodes are newly lost, and one when lost nodes return.
fn announce_lost_nodes(obj: &CSIDriverDeployment, health: &Health, notes: &Notes) {
    let before: BTreeSet<&str> = obj
        .status
        .as_ref()
        .map(|s| s.lost_nodes.iter().map(|n| n.name.as_str()).collect())
        .unwrap_or_default();
    let now: BTreeSet<&str> = health
        .fleet
        .lost
        .iter()
        .take(csiops_crds::MAX_LOST_NODES_LISTED)
        .map(|l| l.node.as_str())
        .collect();
    let newly: Vec<String> = health
        .fleet
        .lost
        .iter()
        .filter(|l| !before.contains(l.node.as_str()))
        .take(csiops_crds::MAX_LOST_NODES_LISTED)
        .map(|l| format!("{} ({})", l.node, l.reason.as_str()))
        .collect();
    if !newly.is_empty() {
        let note = format!(
            "node(s) lost: {}; the driver serves nothing there, and rollouts go on without them",
            newly.join(", ")
        );
        notes.push(Note::warning("NodesLost", note));
    }
    let back: Vec<&str> = before.difference(&now).copied().collect();
    if !back.is_empty() && health.fleet.lost.len() <= csiops_crds::MAX_LOST_NODES_LISTED {
        notes.push(Note {
            warning: false,
            reason: "NodesReturned".into(),
            action: "Observe".into(),
            note: format!("node(s) no longer lost: {}", back.join(", ")),
        });
    }
}

#[cfg(test)]
mod tests;
