//! The controller and node workloads of one object as the reconciler and the
//! teardown both read and change them: the live controller of either kind,
//! this object's pods, and the observation the rollout state machine decides on.

use csiops_crds::{CSIDriverDeployment, ControllerKind};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use kube::api::Api;

use super::apply::{delete_owned, owned_only, Owner};
use super::caches;
use super::error::Error;
use super::Context;
use crate::health::Health;
use crate::pods::PodView;
use crate::render::{labels, names};
use crate::rollout::{self, Observed};

pub(super) fn workload_apis(ctx: &Context, ns: &str) -> (Api<StatefulSet>, Api<DaemonSet>) {
    (
        Api::namespaced(ctx.client.clone(), ns),
        Api::namespaced(ctx.client.clone(), ns),
    )
}

/// This object's pods from the shared cache.
pub(super) fn pods_of(ctx: &Context, owner: Owner<'_>) -> Vec<PodView> {
    ctx.caches.pods_of(owner.namespace, owner.name)
}

/// The live controller workloads of both kinds (normally at most one exists;
/// both while `spec.controller.kind` is being switched).
pub(super) struct LiveController {
    pub(super) statefulset: Option<StatefulSet>,
    pub(super) deployment: Option<Deployment>,
}

impl LiveController {
    /// Both kinds from the caches, ownership-checked.
    pub(super) fn cached(
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
    pub(super) fn current(
        &self,
        kind: ControllerKind,
    ) -> (Option<&StatefulSet>, Option<&Deployment>) {
        match kind {
            ControllerKind::StatefulSet => (self.statefulset.as_ref(), None),
            ControllerKind::Deployment => (None, self.deployment.as_ref()),
        }
    }

    pub(super) fn obs(&self, kind: ControllerKind) -> Option<rollout::ControllerObs> {
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

    pub(super) fn exists(&self, kind: ControllerKind) -> bool {
        match kind {
            ControllerKind::StatefulSet => self.statefulset.is_some(),
            ControllerKind::Deployment => self.deployment.is_some(),
        }
    }
}

pub(super) fn other_kind(kind: ControllerKind) -> ControllerKind {
    match kind {
        ControllerKind::StatefulSet => ControllerKind::Deployment,
        ControllerKind::Deployment => ControllerKind::StatefulSet,
    }
}

/// Deletes the controller workload of `kind`, if it exists and is ours.
pub(super) async fn delete_controller(
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
pub(super) fn observe(
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
