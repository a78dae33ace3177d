//! The takeover of a running deployment (`spec.adoption`): what
//! [`crate::adoption::plan`] needs, read from the API server, and its
//! actions written back. The decisions are all in `crate::adoption`.

use std::collections::{BTreeMap, BTreeSet};

use csiops_crds::{
    adoption_label_key, AdoptedObjectKind, AdoptedWorkloadKind, AdoptionSpec, AdoptionStage,
    CSIDriverDeployment, Phase,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::info;

use super::apply::{is_owned_by, Owner};
use super::workloads;
use crate::adoption::{self, Action, CsiDriverObs, Desired, Observed, Plan};
use crate::fleet::Readiness;
use crate::reconcile::context::Context;
use crate::reconcile::error::Error;
use crate::render::csidriver::AppliedCSIDriver;
use crate::render::labels::COMPONENT;
use crate::render::Rendered;
use crate::rollout;

/// Reads what the takeover needs and plans the pass.
pub(crate) async fn plan(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    adoption: &AdoptionSpec,
    rendered: &Rendered,
    node_budget: &IntOrString,
) -> Result<Plan, Error> {
    let observed = observe(obj, ctx, owner, adoption).await?;
    let desired = Desired {
        controller: rendered.controller.is_some(),
        registration_required: obj.spec.sidecars.registrar.enabled,
        batch: usize::try_from(crate::fleet::resolve_max_unavailable(
            node_budget,
            i32::try_from(observed.nodes.len()).unwrap_or(i32::MAX),
        ))
        .unwrap_or(1),
    };
    Ok(adoption::plan(&desired, &observed))
}

/// Only the CSIDriver check: refuses (a user-facing error, nothing
/// written) or keeps the running CSIDriver, before the supporting objects
/// are applied (which would otherwise find it not ours).
pub(crate) async fn keep_csidriver(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    rendered: &Rendered,
) -> Result<(), Error> {
    let Some(obs) = csidriver(ctx, owner, rendered).await? else {
        return Ok(());
    };
    if obs.ours {
        return Ok(());
    }
    let probe = Observed {
        csi_driver: Some(obs),
        ..Observed::default()
    };
    let desired = Desired {
        controller: false,
        registration_required: false,
        batch: 1,
    };
    let plan = adoption::plan(&desired, &probe);
    if let Some(why) = plan.refused {
        return Err(Error::AdoptionRefused(why));
    }
    let name = &obj.spec.driver_name;
    let api: Api<AppliedCSIDriver> = Api::all(ctx.client.clone());
    let labels = rendered
        .csi_driver
        .metadata
        .labels
        .clone()
        .unwrap_or_default();
    let patch = json!({"metadata": {"labels": labels}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::from_write("CSIDriver", name, e))?;
    ctx.caches.owned.forget("CSIDriver", "", name);
    info!(object = %owner.name, csidriver = %name, "took over the running CSIDriver");
    Ok(())
}

async fn csidriver(
    ctx: &Context,
    owner: Owner<'_>,
    rendered: &Rendered,
) -> Result<Option<CsiDriverObs>, Error> {
    let api: Api<AppliedCSIDriver> = Api::all(ctx.client.clone());
    let name = rendered.csi_driver.name_any();
    let live = api
        .get_opt(&name)
        .await
        .map_err(|e| Error::read("get", format!("CSIDriver {name}"), e))?;
    Ok(live.map(|live| {
        let spec = |d: &AppliedCSIDriver| serde_json::to_value(&d.spec).unwrap_or_default();
        CsiDriverObs {
            ours: is_owned_by(&live.metadata, owner),
            differences: adoption::immutable_differences(&spec(&live), &spec(&rendered.csi_driver)),
        }
    }))
}

/// The live old node DaemonSet, unless it is this object's own.
async fn old_daemonset(
    ctx: &Context,
    owner: Owner<'_>,
    adoption: &AdoptionSpec,
) -> Result<Option<DaemonSet>, Error> {
    match adoption.node_daemon_set.as_deref() {
        Some(name) => get_other::<DaemonSet>(ctx, owner, name).await,
        None => Ok(None),
    }
}

async fn observe(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    adoption: &AdoptionSpec,
) -> Result<Observed, Error> {
    let driver = &obj.spec.driver_name;
    let key = adoption_label_key(driver);
    let old_ds = old_daemonset(ctx, owner, adoption).await?;

    let mut nodes: BTreeMap<String, adoption::NodeObs> = BTreeMap::new();
    let node_api: Api<Node> = Api::all(ctx.client.clone());
    let labelled = node_api
        .list_metadata(&ListParams::default().labels(&key))
        .await
        .map_err(|e| Error::read("list", format!("Nodes labelled {key}"), e))?;
    for n in labelled.items {
        let stage = n.labels().get(&key).and_then(|v| AdoptionStage::parse(v));
        nodes.entry(n.name_any()).or_default().stage = stage;
    }
    if let Some(ds) = &old_ds {
        for node in old_pod_nodes(ctx, owner, ds).await? {
            nodes.entry(node).or_default().old_pod = true;
        }
    }
    let infos = ctx.caches.nodes.snapshot();
    let registered = ctx.caches.csinodes.registered(driver);
    let pods = workloads::pods_of(ctx, owner);
    let new_ready: BTreeSet<String> = pods
        .iter()
        .filter(|p| p.label(COMPONENT) == Some("node") && p.is_ready() && !p.terminating)
        .filter_map(|p| p.node.as_deref().map(str::to_string))
        .collect();
    for (name, n) in &mut nodes {
        n.reachable = infos
            .get(name)
            .is_some_and(|i| i.readiness == Readiness::Ready);
        n.new_pod_ready = new_ready.contains(name);
        n.registered = registered.contains(name);
    }

    let new_controller_ready = i32::try_from(
        pods.iter()
            .filter(|p| p.label(COMPONENT) == Some("controller") && p.is_ready())
            .count(),
    )
    .unwrap_or(i32::MAX);

    Ok(Observed {
        // Judged (refused or kept) by `keep_csidriver` earlier in the
        // same pass, before the supporting objects were applied: not
        // read again.
        csi_driver: None,
        old_node: old_ds.map(|ds| adoption::OldNodeObs {
            confined: ds.spec.as_ref().is_some_and(|s| {
                adoption::is_confined(driver, &serde_json::to_value(s).unwrap_or_default())
            }),
            deleting: ds.metadata.deletion_timestamp.is_some(),
        }),
        old_controller: old_controller(ctx, owner, adoption).await?,
        new_controller_ready,
        nodes,
        leftovers: leftovers(ctx, owner, adoption, false).await?,
    })
}

/// Nodes that run a pod of the old DaemonSet (terminating ones included).
async fn old_pod_nodes(
    ctx: &Context,
    owner: Owner<'_>,
    ds: &DaemonSet,
) -> Result<BTreeSet<String>, Error> {
    let selector = ds
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    if selector.is_empty() {
        // A selector of expressions only: no pod is matched here, and the
        // takeover would start the new plugin beside the old one.
        return Err(Error::AdoptionRefused(format!(
            "DaemonSet {} selects its pods without matchLabels; the takeover needs them to find its pods",
            ds.name_any()
        )));
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), owner.namespace);
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| Error::read("list", format!("pods of DaemonSet {}", ds.name_any()), e))?;
    let uid = ds.uid();
    Ok(list
        .items
        .iter()
        .filter(|p| {
            p.owner_references()
                .iter()
                .any(|r| Some(&r.uid) == uid.as_ref())
        })
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect())
}

async fn old_controller(
    ctx: &Context,
    owner: Owner<'_>,
    adoption: &AdoptionSpec,
) -> Result<Option<adoption::OldControllerObs>, Error> {
    let Some(w) = &adoption.controller else {
        return Ok(None);
    };
    let live = match w.kind {
        AdoptedWorkloadKind::Deployment => get_other::<Deployment>(ctx, owner, &w.name)
            .await?
            .map(|d| (d.metadata, d.spec.map(|s| s.template))),
        AdoptedWorkloadKind::StatefulSet => get_other::<StatefulSet>(ctx, owner, &w.name)
            .await?
            .map(|s| (s.metadata, s.spec.map(|s| s.template))),
    };
    Ok(live.map(|(meta, template)| {
        let containers: Vec<(String, Vec<String>)> = template
            .and_then(|t| t.spec)
            .map(|s| {
                s.containers
                    .into_iter()
                    .map(|c| {
                        let mut args = c.command.unwrap_or_default();
                        args.extend(c.args.unwrap_or_default());
                        (c.name, args)
                    })
                    .collect()
            })
            .unwrap_or_default();
        adoption::OldControllerObs {
            deleting: meta.deletion_timestamp.is_some(),
            unshared: adoption::lease_sharing(&containers, owner.namespace),
        }
    }))
}

/// What the typed reads and deletes here need of an object's type.
trait Kind: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug {}

impl<K> Kind for K where K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug {}

/// A namespaced object of the old deployment, unless it is this object's own.
async fn get_other<K>(ctx: &Context, owner: Owner<'_>, name: &str) -> Result<Option<K>, Error>
where
    K: Kind<Scope = k8s_openapi::NamespaceResourceScope>,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), owner.namespace);
    let live = api
        .get_opt(name)
        .await
        .map_err(|e| Error::read("get", format!("{} {name}", K::kind(&())), e))?;
    Ok(live.filter(|o| !is_owned_by(o.meta(), owner)))
}

/// Deletes (foreground, UID precondition) a namespaced workload of the old
/// deployment; `false` when it is gone or this object's own.
async fn delete_other<K>(ctx: &Context, owner: Owner<'_>, name: &str) -> Result<bool, Error>
where
    K: Kind<Scope = k8s_openapi::NamespaceResourceScope>,
{
    let Some(live) = get_other::<K>(ctx, owner, name).await? else {
        return Ok(false);
    };
    let api: Api<K> = Api::namespaced(ctx.client.clone(), owner.namespace);
    delete_exact(
        &api,
        &K::kind(&()),
        name,
        live.uid(),
        PropagationPolicy::Foreground,
    )
    .await?;
    Ok(true)
}

/// Counts (or, with `delete`, deletes) what `spec.adoption.remove` names
/// and still exists. Never an object owned by something (an owner
/// reference: its owner removes it), one of this object's, or a built-in
/// role.
async fn leftovers(
    ctx: &Context,
    owner: Owner<'_>,
    adoption: &AdoptionSpec,
    delete: bool,
) -> Result<usize, Error> {
    let mut n = 0;
    for item in &adoption.remove {
        if item.kind.cluster_scoped() && adoption::is_builtin(&item.name) {
            continue;
        }
        let check = Leftover {
            ctx,
            owner,
            name: &item.name,
            delete,
        };
        let found = match item.kind {
            AdoptedObjectKind::ServiceAccount => check.namespaced::<ServiceAccount>().await?,
            AdoptedObjectKind::RoleBinding => check.namespaced::<RoleBinding>().await?,
            AdoptedObjectKind::Service => check.namespaced::<Service>().await?,
            AdoptedObjectKind::ClusterRoleBinding => check.cluster::<ClusterRoleBinding>().await?,
        };
        n += usize::from(found);
    }
    Ok(n)
}

/// One `spec.adoption.remove` entry, looked up by the kind it names.
struct Leftover<'a> {
    ctx: &'a Context,
    owner: Owner<'a>,
    name: &'a str,
    delete: bool,
}

impl Leftover<'_> {
    /// In the namespace of the object being reconciled.
    async fn namespaced<K>(&self) -> Result<bool, Error>
    where
        K: Kind<Scope = k8s_openapi::NamespaceResourceScope>,
    {
        let api = Api::<K>::namespaced(self.ctx.client.clone(), self.owner.namespace);
        one(api, self.owner, self.name, self.delete).await
    }

    async fn cluster<K>(&self) -> Result<bool, Error>
    where
        K: Kind<Scope = k8s_openapi::ClusterResourceScope>,
    {
        let api = Api::<K>::all(self.ctx.client.clone());
        one(api, self.owner, self.name, self.delete).await
    }
}

/// Whether one named object exists and may go; deleted when `delete`.
async fn one<K>(api: Api<K>, owner: Owner<'_>, name: &str, delete: bool) -> Result<bool, Error>
where
    K: Kind,
{
    let kind = K::kind(&());
    let Some(live) = api
        .get_opt(name)
        .await
        .map_err(|e| Error::read("get", format!("{kind} {name}"), e))?
    else {
        return Ok(false);
    };
    let meta = live.meta();
    let owned_elsewhere = meta
        .owner_references
        .as_ref()
        .is_some_and(|r| !r.is_empty());
    if owned_elsewhere || is_owned_by(meta, owner) || meta.deletion_timestamp.is_some() {
        return Ok(false);
    }
    if delete {
        delete_exact(&api, &kind, name, live.uid(), PropagationPolicy::Background).await?;
        info!(object = %owner.name, kind = %kind, name, "removed an object of the deployment taken over");
    }
    Ok(true)
}

async fn delete_exact<K>(
    api: &Api<K>,
    kind: &str,
    name: &str,
    uid: Option<String>,
    propagation: PropagationPolicy,
) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        propagation_policy: Some(propagation),
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::WriteFailed {
            kind: "object",
            name: format!("{kind} {name}"),
            message: e.to_string(),
            source: Box::new(e),
        }),
    }
}

/// Carries out one action of the plan.
pub(crate) async fn execute(
    action: &Action,
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    adoption: &AdoptionSpec,
    rendered: &Rendered,
    node_budget: &IntOrString,
) -> Result<(), Error> {
    let driver = &obj.spec.driver_name;
    let key = adoption_label_key(driver);
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    // The new workloads go on as in an ordinary rollout.
    let apply_workload = |step| workloads::execute(step, obj, ctx, owner, rendered, node_budget);
    match action {
        // Done by `keep_csidriver`, before the supporting objects.
        Action::KeepCsiDriver => {}
        Action::LabelNode(node, stage) => {
            let patch = json!({"metadata": {"labels": {key: stage.as_str()}}});
            nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| Error::from_write("Node", node, e))?;
            info!(object = %owner.name, node, stage = stage.as_str(), "takeover: node");
        }
        Action::UnlabelNode(node) => {
            let patch = json!({"metadata": {"labels": {key: null}}});
            match nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(Error::from_write("Node", node, e)),
            }
        }
        Action::ConfineOldNode => {
            if let Some(ds) = old_daemonset(ctx, owner, adoption).await? {
                let affinity = ds
                    .spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .and_then(|s| s.affinity.as_ref())
                    .map(|a| serde_json::to_value(a).unwrap_or_default())
                    .unwrap_or_default();
                let patch = adoption::confine_patch(driver, &affinity);
                let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), owner.namespace);
                let name = ds.name_any();
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| Error::from_write("DaemonSet", &name, e))?;
                info!(object = %owner.name, daemonset = %name, "takeover: old DaemonSet confined to waiting nodes");
            }
        }
        Action::ApplyNode => apply_workload(rollout::Action::ApplyNode).await?,
        Action::ApplyController => apply_workload(rollout::Action::ApplyController).await?,
        Action::DeleteOldController => {
            if let Some(w) = &adoption.controller {
                // Foreground: the workload stays until its pods are gone,
                // which is what the next step waits for.
                let deleted = match w.kind {
                    AdoptedWorkloadKind::Deployment => {
                        delete_other::<Deployment>(ctx, owner, &w.name).await?
                    }
                    AdoptedWorkloadKind::StatefulSet => {
                        delete_other::<StatefulSet>(ctx, owner, &w.name).await?
                    }
                };
                if deleted {
                    info!(object = %owner.name, kind = w.kind.as_str(), name = %w.name, "takeover: old controller deleted");
                }
            }
        }
        Action::DeleteOldNode => {
            if let Some(name) = adoption.node_daemon_set.as_deref() {
                if delete_other::<DaemonSet>(ctx, owner, name).await? {
                    info!(object = %owner.name, daemonset = %name, "takeover: old DaemonSet deleted");
                }
            }
        }
        Action::RemoveLeftovers => {
            leftovers(ctx, owner, adoption, true).await?;
        }
    }
    Ok(())
}

/// The status while a takeover runs: phase Deploying, and the takeover's
/// progress as the message and the Progressing condition.
pub(crate) fn status_during(
    mut status: csiops_crds::CSIDriverDeploymentStatus,
    plan: &Plan,
) -> csiops_crds::CSIDriverDeploymentStatus {
    let waiting = plan.waiting_for.as_deref().unwrap_or("working");
    let message = format!(
        "taking over the running deployment ({:?}, {} of {} node(s) moved): {waiting}",
        plan.phase, plan.nodes_done, plan.nodes_total
    );
    if status.phase != Phase::Degraded {
        status.phase = Phase::Deploying;
        status.message = message.clone();
    }
    for c in &mut status.conditions {
        if c.type_ == "Progressing" {
            c.status = "True".to_string();
            c.reason = "Adopting".to_string();
            c.message = message.clone();
        }
    }
    status
}
