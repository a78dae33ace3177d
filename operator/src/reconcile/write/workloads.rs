//! The controller and node workloads of one object as the reconciler and the
//! teardown both read and change them: the live controller of either kind,
//! this object's pods, the observation the rollout state machine decides on,
//! and the writes of the actions it plans ([`execute`]).

use csiops_crds::{CSIDriverDeployment, ControllerKind};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::info;

use super::apply::{apply, delete_owned, owned_only, Mode, Owner};
use crate::health::Health;
use crate::pods::PodView;
use crate::reconcile::context::Context;
use crate::reconcile::error::Error;
use crate::reconcile::watch::caches;
use crate::render::{self, labels, names, ControllerWorkload, Rendered};
use crate::rollout::{self, Action, Observed};

pub(crate) fn workload_apis(ctx: &Context, ns: &str) -> (Api<StatefulSet>, Api<DaemonSet>) {
    (
        Api::namespaced(ctx.client.clone(), ns),
        Api::namespaced(ctx.client.clone(), ns),
    )
}

/// This object's pods from the shared cache.
pub(crate) fn pods_of(ctx: &Context, owner: Owner<'_>) -> Vec<PodView> {
    ctx.caches.pods_of(owner.namespace, owner.name)
}

/// The live controller workloads of both kinds (normally at most one exists;
/// both while `spec.controller.kind` is being switched).
pub(crate) struct LiveController {
    pub(crate) statefulset: Option<StatefulSet>,
    pub(crate) deployment: Option<Deployment>,
}

impl LiveController {
    /// Both kinds from the caches, ownership-checked.
    pub(crate) fn cached(
        ctx: &Context,
        obj: &CSIDriverDeployment,
        owner: Owner<'_>,
    ) -> Result<Self, Error> {
        let name = names::controller_name(obj);
        let c = &ctx.caches;
        Ok(Self {
            statefulset: owned_only(
                caches::Caches::get(&c.statefulsets, owner.namespace, &name),
                "StatefulSet",
                owner,
            )?,
            deployment: owned_only(
                caches::Caches::get(&c.deployments, owner.namespace, &name),
                "Deployment",
                owner,
            )?,
        })
    }

    /// The workload of `kind` as (StatefulSet, Deployment), the other `None`.
    pub(crate) fn current(
        &self,
        kind: ControllerKind,
    ) -> (Option<&StatefulSet>, Option<&Deployment>) {
        match kind {
            ControllerKind::StatefulSet => (self.statefulset.as_ref(), None),
            ControllerKind::Deployment => (None, self.deployment.as_ref()),
        }
    }

    pub(crate) fn obs(&self, kind: ControllerKind) -> Option<rollout::ControllerObs> {
        match kind {
            ControllerKind::StatefulSet => self
                .statefulset
                .as_ref()
                .map(|s| rollout::observe::controller_obs(s, labels::TEMPLATE_HASH)),
            ControllerKind::Deployment => self
                .deployment
                .as_ref()
                .map(|d| rollout::observe::deployment_obs(d, labels::TEMPLATE_HASH)),
        }
    }

    pub(crate) fn exists(&self, kind: ControllerKind) -> bool {
        match kind {
            ControllerKind::StatefulSet => self.statefulset.is_some(),
            ControllerKind::Deployment => self.deployment.is_some(),
        }
    }
}

pub(crate) fn other_kind(kind: ControllerKind) -> ControllerKind {
    match kind {
        ControllerKind::StatefulSet => ControllerKind::Deployment,
        ControllerKind::Deployment => ControllerKind::StatefulSet,
    }
}

/// Deletes the controller workload of `kind`, if it exists and is ours.
pub(crate) async fn delete_controller(
    ctx: &Context,
    obj: &CSIDriverDeployment,
    owner: Owner<'_>,
    kind: ControllerKind,
) -> Result<bool, Error> {
    let name = names::controller_name(obj);
    match kind {
        ControllerKind::StatefulSet => {
            let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), owner.namespace);
            delete_owned(&api, "StatefulSet", &name, owner, &ctx.caches.owned).await
        }
        ControllerKind::Deployment => {
            let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), owner.namespace);
            delete_owned(&api, "Deployment", &name, owner, &ctx.caches.owned).await
        }
    }
}

/// What the state machine needs from the live objects.
pub(crate) fn observe(
    controller: &LiveController,
    kind: ControllerKind,
    ds: Option<&DaemonSet>,
    health: &Health,
    pods: &[PodView],
) -> Observed {
    let mut live = controller.obs(kind);
    if let (Some(obs), Some(sts)) = (live.as_mut(), controller.statefulset.as_ref()) {
        if kind == ControllerKind::StatefulSet {
            obs.updated_ready = rollout::observe::statefulset_updated_ready(sts, pods);
        }
    }
    Observed {
        controller: live,
        stale_controller: controller.exists(other_kind(kind)),
        controller_pods: health.controller_pods,
        node: ds.map(|d| rollout::observe::node_obs(d, labels::TEMPLATE_HASH)),
        node_pods: health.node_pods,
        fleet: health.fleet.clone(),
        cluster_scoped_remaining: 0,
    }
}

/// Runs one action of the state machine. `node_budget` is the DaemonSet's
/// `maxUnavailable` for now (the user's, plus the lost nodes).
pub(crate) async fn execute(
    action: Action,
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    r: &Rendered,
    node_budget: &IntOrString,
) -> Result<(), Error> {
    let (sts_api, ds_api) = workload_apis(ctx, owner.namespace);
    let known = &ctx.caches.owned;
    match action {
        Action::ApplyNode => {
            let ds = render::node::with_max_unavailable(r.daemonset.clone(), node_budget);
            apply(&ds_api, "DaemonSet", ds, owner, Mode::Always, known).await?;
        }
        Action::ApplyControllerSurge {
            replicas,
            partition,
        } => {
            if let Some(ControllerWorkload::StatefulSet(sts)) = &r.controller {
                let sts = render::controller::with_surge(sts.clone(), replicas, partition);
                apply(&sts_api, "StatefulSet", sts, owner, Mode::Always, known).await?;
            }
        }
        Action::ApplyController => match &r.controller {
            Some(ControllerWorkload::StatefulSet(sts)) => {
                apply(
                    &sts_api,
                    "StatefulSet",
                    sts.clone(),
                    owner,
                    Mode::Always,
                    known,
                )
                .await?;
            }
            Some(ControllerWorkload::Deployment(deploy)) => {
                let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), owner.namespace);
                apply(
                    &api,
                    "Deployment",
                    deploy.clone(),
                    owner,
                    Mode::Always,
                    known,
                )
                .await?;
            }
            // Never planned without a controller workload.
            None => {}
        },
        Action::ScaleControllerToZero => {
            // Replicas only: the old template stays until the node side is rolled.
            let name = names::controller_name(obj);
            let patch = json!({"spec": {"replicas": 0}});
            let params = PatchParams::default();
            let kind = obj.spec.controller.kind;
            let result = match kind {
                ControllerKind::StatefulSet => sts_api
                    .patch(&name, &params, &Patch::Merge(&patch))
                    .await
                    .map(drop),
                ControllerKind::Deployment => {
                    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), owner.namespace);
                    api.patch(&name, &params, &Patch::Merge(&patch))
                        .await
                        .map(drop)
                }
            };
            result.map_err(|e| Error::from_write(kind.as_str(), &name, e))?;
        }
        Action::DeleteStaleController => {
            let stale = other_kind(obj.spec.controller.kind);
            if delete_controller(ctx, obj, owner, stale).await? {
                info!(object = %owner.name, kind = stale.as_str(), "removed the controller of the previous kind");
            }
        }
        Action::DeleteController => {
            let kind = obj.spec.controller.kind;
            if delete_controller(ctx, obj, owner, kind).await? {
                info!(object = %owner.name, kind = kind.as_str(), "removed the controller workload: topology NodeLocal runs none");
            }
        }
    }
    Ok(())
}
