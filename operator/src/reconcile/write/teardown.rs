//! The ordered teardown of a deleted object: controller, then node
//! DaemonSet, then the cluster-scoped objects (with the metrics objects and
//! the controller's PodDisruptionBudget), then the finalizer.

use std::time::Duration as StdDuration;

use chrono::{Duration, Utc};
use csiops_crds::CSIDriverDeployment;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use tracing::info;

use super::apply::{delete_owned, get_owned, Owner};
use super::cluster::ClusterScoped;
use super::status::{status_after, write_status, Progress};
use super::workloads::{
    delete_controller, observe, other_kind, pods_of, workload_apis, LiveController,
};
use super::{finalizer, monitoring};
use crate::health::{self, HealthInput};
use crate::reconcile::context::Context;
use crate::reconcile::error::Error;
use crate::reconcile::events::{announce, Notes};
use crate::render::{labels, names};
use crate::report::Problem;
use crate::rollout::{self, TeardownAction};

/// The ordered teardown of a deleted object: `None` once it is done (the
/// finalizer released).
pub(crate) async fn teardown(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    api: &Api<CSIDriverDeployment>,
    owner: Owner<'_>,
    notes: &Notes,
) -> Result<Option<Requeue>, Error> {
    let now = Utc::now();
    let (sts_api, ds_api) = workload_apis(ctx, owner.namespace);
    let deploy_api: Api<Deployment> = Api::namespaced(ctx.client.clone(), owner.namespace);
    // What is not ours is not torn down: treat a foreign same-named workload as absent.
    let controller = LiveController {
        statefulset: get_owned(&sts_api, "StatefulSet", &names::controller_name(obj), owner)
            .await
            .or_else(ignore_not_owned)?,
        deployment: get_owned(
            &deploy_api,
            "Deployment",
            &names::controller_name(obj),
            owner,
        )
        .await
        .or_else(ignore_not_owned)?,
    };
    let ds = get_owned(&ds_api, "DaemonSet", &names::node_name(obj), owner)
        .await
        .or_else(ignore_not_owned)?;
    let kind = obj.spec.controller.kind;
    let (statefulset, deployment) = controller.current(kind);
    let cluster = ClusterScoped::new(&ctx.client, labels::cluster_owner_selector(obj));
    let remaining = cluster.count().await?;
    let pods = pods_of(ctx, owner);
    let health = health::assess(&HealthInput {
        driver_name: &obj.spec.driver_name,
        kubelet_dir: &obj.spec.node.kubelet_dir,
        registration_required: false,
        controller_replicas: obj.spec.controller_replicas(),
        max_unavailable: obj.spec.node.max_unavailable.as_ref(),
        statefulset,
        deployment,
        daemonset: ds.as_ref(),
        node_hash: "",
        pods: &pods,
        nodes: &ctx.caches.nodes.snapshot(),
        registered: &Default::default(),
        tainted_nodes: 0,
        mount_failures: &Default::default(),
        now,
    });
    let mut observed = observe(&controller, kind, ds.as_ref(), &health, &pods);
    observed.cluster_scoped_remaining = remaining;
    let status = obj.status.as_ref();
    let plan = rollout::plan_delete(
        &observed,
        status.and_then(|s| s.rollout.as_ref()),
        Duration::seconds(obj.spec.rollout.step_timeout_seconds),
        now,
    );
    for action in &plan.actions {
        match action {
            TeardownAction::DeleteController => {
                delete_controller(ctx, obj, owner, kind).await?;
            }
            TeardownAction::DeleteStaleController => {
                delete_controller(ctx, obj, owner, other_kind(kind)).await?;
            }
            TeardownAction::DeleteNode => {
                delete_owned(
                    &ds_api,
                    "DaemonSet",
                    &names::node_name(obj),
                    owner,
                    &ctx.caches.owned,
                )
                .await?;
            }
            TeardownAction::CleanupClusterScoped => {
                monitoring::delete_monitoring(&ctx.client, owner, &ctx.caches.owned).await?;
                // The garbage collector would take it with the object; the
                // teardown leaves nothing behind itself, as with the metrics
                // Service.
                let budgets: Api<PodDisruptionBudget> =
                    Api::namespaced(ctx.client.clone(), owner.namespace);
                delete_owned(
                    &budgets,
                    "PodDisruptionBudget",
                    &names::controller_name(obj),
                    owner,
                    &ctx.caches.owned,
                )
                .await?;
                cluster.delete_all().await?;
            }
            TeardownAction::RemoveFinalizer => {
                announce(obj, &ctx.metrics, &plan, notes);
                // Published before the finalizer goes: with it goes the
                // object, and whoever waits for that finds the teardown's
                // story complete.
                notes.publish(&ctx.recorder).await;
                finalizer::release(obj, api).await?;
                info!(object = %owner.name, namespace = %owner.namespace, "teardown complete");
                return Ok(None);
            }
        }
    }
    announce(obj, &ctx.metrics, &plan, notes);
    let problem = plan.overdue.as_ref().map(|why| Problem {
        reason: "RolloutStepTimeout",
        message: why.clone(),
    });
    let new_status = status_after(obj, Progress::of(&plan), &health, problem.as_ref(), now);
    write_status(obj, ctx, api, new_status, notes).await?;
    Ok(Some(Requeue::requeue(StdDuration::from_secs(5))))
}

fn ignore_not_owned<K>(e: Error) -> Result<Option<K>, Error> {
    match e {
        Error::NotOwned { .. } => Ok(None),
        other => Err(other),
    }
}
