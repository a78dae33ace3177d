//! The object's status: built in one place from what a pass saw and
//! decided, written by server-side apply only when it changed, and the
//! problems a user must fix reported once, with an Event.

use chrono::{DateTime, Utc};
use csiops_crds::{CSIDriverDeployment, CSIDriverDeploymentStatus, RolloutStatus};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;
use tracing::warn;

use super::apply::FIELD_MANAGER;
use crate::health::Health;
use crate::reconcile::context::{object_key, Context};
use crate::reconcile::error::Error;
use crate::reconcile::events::{Note, Notes};
use crate::report::{self, Problem, ReportInput};
use crate::rollout::Plan;

/// Where the rollout stands after a pass.
pub(crate) struct Progress<'a> {
    pub rollout: Option<&'a RolloutStatus>,
    pub waiting_for: Option<&'a str>,
    /// A rollout completed in this pass.
    pub completed: bool,
}

impl<'a> Progress<'a> {
    /// As `plan` leaves it.
    pub fn of<A>(plan: &'a Plan<A>) -> Self {
        Progress {
            rollout: plan.rollout.as_ref(),
            waiting_for: plan.waiting_for.as_deref(),
            completed: plan.completed,
        }
    }
}

/// The status of `obj` after a pass: `progress`, the `health` observed and
/// the `problem` found, over the status it had. Paused and deleting are read
/// from the object (a deleted object is torn down even when paused).
pub(crate) fn status_after(
    obj: &CSIDriverDeployment,
    progress: Progress<'_>,
    health: &Health,
    problem: Option<&Problem>,
    now: DateTime<Utc>,
) -> CSIDriverDeploymentStatus {
    let deleting = obj.metadata.deletion_timestamp.is_some();
    report::build(&ReportInput {
        previous: obj.status.as_ref(),
        generation: obj.metadata.generation.unwrap_or(0),
        spec_version: &obj.spec.version,
        controller: obj.spec.topology.has_controller(),
        rollout: progress.rollout,
        waiting_for: progress.waiting_for,
        completed: progress.completed,
        health,
        problem,
        paused: obj.spec.paused && !deleting,
        deleting,
        now,
    })
}

/// A Warning Event for `problem`, unless the object already reports it
/// (its reason: the message of a standing problem may vary).
pub(crate) fn warn_once(obj: &CSIDriverDeployment, problem: &Problem, notes: &Notes) {
    warn_unless_reported(obj, problem, false, notes);
}

/// A log line and a Warning Event for `problem`, unless the object's
/// Degraded condition has its reason (and, when `exact`, its message).
fn warn_unless_reported(obj: &CSIDriverDeployment, problem: &Problem, exact: bool, notes: &Notes) {
    let already = obj
        .status
        .as_ref()
        .and_then(|s| s.condition(report::DEGRADED))
        .is_some_and(|c| {
            c.status == "True"
                && c.reason == problem.reason
                && (!exact || c.message == problem.message)
        });
    if !already {
        warn!(object = %obj.name_any(), reason = problem.reason, "{}", problem.message);
        notes.push(Note::warning(problem.reason, problem.message.clone()));
    }
}

/// Status and a Warning Event for a problem the user must fix.
pub(crate) async fn write_problem(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    api: &Api<CSIDriverDeployment>,
    problem: &Problem,
    notes: &Notes,
) -> Result<(), Error> {
    warn_unless_reported(obj, problem, true, notes);
    let previous = obj.status.as_ref();
    // Keep the last known counts and rollout: nothing was observed or changed.
    let health = previous.map(health_of_status).unwrap_or_default();
    let progress = Progress {
        rollout: previous.and_then(|s| s.rollout.as_ref()),
        waiting_for: None,
        completed: false,
    };
    let new_status = status_after(obj, progress, &health, Some(problem), Utc::now());
    write_status(obj, ctx, api, new_status, notes).await
}

fn health_of_status(s: &CSIDriverDeploymentStatus) -> Health {
    Health {
        controller: s.controller.clone(),
        node: s.node.clone(),
        registered_nodes: s.registered_nodes,
        tainted_nodes: s.tainted_nodes,
        unhealthy: s.unhealthy_pods.clone(),
        ..Health::default()
    }
}

/// How soon after the last one a status that only moved its counts and
/// messages ([`report::progress_only`]) is written: a node roll changes
/// them with every pod, and the object is reconciled up to four times a
/// second; one write a second keeps `kubectl get` current.
pub(crate) const PROGRESS_WRITE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// [`write_status`], unless `status` is mere progress over the object's and
/// the last such write was less than [`PROGRESS_WRITE_INTERVAL`] ago: then
/// nothing is written, and the time after which to reconcile again to write
/// it is returned.
pub(crate) async fn write_progress(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    api: &Api<CSIDriverDeployment>,
    status: CSIDriverDeploymentStatus,
    notes: &Notes,
) -> Result<Option<std::time::Duration>, Error> {
    let minor = obj
        .status
        .as_ref()
        .is_some_and(|old| *old != status && report::progress_only(old, &status));
    if minor {
        let now = std::time::Instant::now();
        let held = ctx.objects.with(&object_key(obj), |o| {
            ctx.progress_writes.hold(&mut o.progress_written, now)
        });
        if let Some(wait) = held {
            return Ok(Some(wait));
        }
    }
    write_status(obj, ctx, api, status, notes).await?;
    Ok(None)
}

/// Writes status by server-side apply, only when it changed, after the
/// Events the pass collected: whoever waits for the status (a user, an
/// alert, a test) finds the Events that tell why already there.
pub(crate) async fn write_status(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    api: &Api<CSIDriverDeployment>,
    status: CSIDriverDeploymentStatus,
    notes: &Notes,
) -> Result<(), Error> {
    if obj.status.as_ref() == Some(&status) {
        return Ok(());
    }
    notes.publish(&ctx.recorder).await;
    let patch = json!({
        "apiVersion": "csiops.dev/v1alpha1",
        "kind": "CSIDriverDeployment",
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match api
        .patch_status(&obj.name_any(), &params, &Patch::Apply(&patch))
        .await
    {
        Ok(written) => {
            let version = written.resource_version();
            ctx.objects
                .with(&object_key(obj), |o| o.fresh.note(version.as_deref()));
            Ok(())
        }
        // Deleted meanwhile: nothing to report on.
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}
