//! The objects a driver's pods need before they start: ServiceAccounts,
//! RBAC bindings, the controller's PodDisruptionBudget, the CSIDriver,
//! StorageClasses and VolumeAttributesClasses,
//! applied ownership-checked; the immutable CSIDriver, StorageClasses and
//! VolumeAttributesClasses re-created when they change.
//!
//! They are independent of each other, so they are written side by side (at
//! most [`PARALLEL`] requests at once): an upgrade changes every one of them
//! (they carry the version label), and one after the other they held the
//! node DaemonSet's apply back by their sum.

use std::fmt::Debug;

use csiops_crds::CSIDriverDeployment;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use kube::api::Api;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{debug, info, warn};

use super::apply::{
    apply, apply_checked, delete_owned, get_owned, Applied, Mode, Owner, StoreCheck,
};
use crate::reconcile::context::Context;
use crate::reconcile::error::Error;
use crate::reconcile::events::{Note, Notes};
use crate::reconcile::watch::owned::Owned;
use crate::render::{csidriver, AppliedCSIDriver, Rendered};

/// Supporting objects written at once.
pub(crate) const PARALLEL: usize = 8;

/// ServiceAccounts, RBAC, the CSIDriver and the classes: applied before any
/// workload so pods never start without their permissions. Every write runs
/// to its end, and then the first error is returned: a failure elsewhere
/// must not cut a re-creation (CSIDriver, a class) between its delete
/// and its create.
pub(crate) async fn apply_supporting(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    r: &Rendered,
    notes: &Notes,
) -> Result<(), Error> {
    let c = &ctx.client;
    let known = &ctx.caches.owned;
    let accounts: Api<ServiceAccount> = Api::namespaced(c.clone(), owner.namespace);
    // Bindings only: the roles are shipped with the operator (install.yaml),
    // which may bind them by name but holds none of their verbs.
    let role_bindings: Api<RoleBinding> = Api::namespaced(c.clone(), owner.namespace);
    let cluster_bindings: Api<ClusterRoleBinding> = Api::all(c.clone());
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(c.clone(), owner.namespace);
    let classes: Api<StorageClass> = Api::all(c.clone());
    let attributes_classes: Api<VolumeAttributesClass> = Api::all(c.clone());

    let mut writes: Vec<BoxFuture<'_, Result<(), Error>>> = Vec::new();
    for account in r
        .controller_service_account
        .iter()
        .chain(std::iter::once(&r.node_service_account))
    {
        writes.push(if_changed(
            accounts.clone(),
            "ServiceAccount",
            account,
            owner,
            known,
        ));
    }
    for binding in &r.role_bindings {
        writes.push(if_changed(
            role_bindings.clone(),
            "RoleBinding",
            binding,
            owner,
            known,
        ));
    }
    // In the namespaces whose Secrets the driver reads: owned by the owner
    // labels, like the cluster-scoped bindings (`cluster::ClusterScoped`
    // prunes them).
    for binding in &r.secret_reader_bindings {
        let namespace = binding
            .metadata
            .namespace
            .as_deref()
            .unwrap_or(owner.namespace);
        writes.push(if_changed(
            Api::namespaced(c.clone(), namespace),
            "RoleBinding",
            binding,
            owner,
            known,
        ));
    }
    for binding in &r.cluster_role_bindings {
        writes.push(if_changed(
            cluster_bindings.clone(),
            "ClusterRoleBinding",
            binding,
            owner,
            known,
        ));
    }
    // Before the workloads: a scale-up is protected from the first new
    // replica on. One the spec no longer renders (one replica, disabled)
    // is pruned after them (`namespaced::prune`), by when a scale-down is
    // written; it never blocks a scale-down anyway, only evictions.
    if let Some(budget) = &r.controller_disruption_budget {
        writes.push(if_changed(
            budgets.clone(),
            "PodDisruptionBudget",
            budget,
            owner,
            known,
        ));
    }
    writes.push(apply_csidriver(obj, ctx, owner, r, notes).boxed());
    for class in &r.storage_classes {
        writes.push(apply_storage_class(ctx, &classes, owner, class, notes).boxed());
    }
    for class in &r.attributes_classes {
        writes.push(apply_attributes_class(ctx, &attributes_classes, owner, class, notes).boxed());
    }
    let results: Vec<Result<(), Error>> = futures::stream::iter(writes)
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    results.into_iter().collect()
}

/// One ownership-checked apply of `desired` (written only if it changed),
/// boxed to run beside the other writes.
fn if_changed<'a, K>(
    api: Api<K>,
    kind: &'static str,
    desired: &K,
    owner: Owner<'a>,
    known: &'a Owned,
) -> BoxFuture<'a, Result<(), Error>>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'a,
{
    let desired = desired.clone();
    async move {
        apply(&api, kind, desired, owner, Mode::IfChanged, known)
            .await
            .map(drop)
    }
    .boxed()
}

/// What the API server would not store of the CSIDriver.
const CSIDRIVER_CHECK: StoreCheck<AppliedCSIDriver> = StoreCheck {
    unstored: csidriver::unstored_fields,
    unknown: csidriver::leave_out_unknown,
};

/// The CSIDriver. Some of its fields are immutable: when the API refuses
/// the change, the object is re-created (running volumes keep working
/// meanwhile). Some are dropped by an API server whose feature gate is
/// off, or refused by one older than the field (then left out): said with a
/// Warning Event, and applied again until they are stored. It is written
/// as [`AppliedCSIDriver`], not k8s-openapi's `CSIDriver`, whose pinned API
/// would lose the newer fields on the way out and on the way back.
async fn apply_csidriver(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    r: &Rendered,
    notes: &Notes,
) -> Result<(), Error> {
    let drivers: Api<AppliedCSIDriver> = Api::all(ctx.client.clone());
    let name = r.csi_driver.name_any();
    let dropped = match apply_checked(
        &drivers,
        "CSIDriver",
        r.csi_driver.clone(),
        owner,
        Mode::IfChanged,
        &ctx.caches.owned,
        CSIDRIVER_CHECK,
    )
    .await
    {
        Err(e) if e.is_immutable_field_refusal() => {
            let message = match &e {
                Error::Rejected { message, .. } => message.clone(),
                other => other.to_string(),
            };
            delete_owned(&drivers, "CSIDriver", &name, owner, &ctx.caches.owned).await?;
            let (_, dropped) = apply_checked(
                &drivers,
                "CSIDriver",
                r.csi_driver.clone(),
                owner,
                Mode::IfChanged,
                &ctx.caches.owned,
                CSIDRIVER_CHECK,
            )
            .await?;
            let note =
                format!("CSIDriver {name} re-created: an immutable field changed ({message})");
            notes.push(Note::warning("CSIDriverRecreated", note));
            dropped
        }
        other => other?.1,
    };
    const NOT_STORED: &str = "CSIDriverFieldNotStored";
    let key = crate::reconcile::context::object_key(obj);
    if dropped.is_empty() {
        ctx.objects.with(&key, |o| o.told.ended(NOT_STORED));
    } else {
        let note = csidriver::unstored_note(&name, &dropped);
        // Applied again at every reconcile (the gate may be turned on), but
        // told once until the fields change.
        if ctx
            .objects
            .with(&key, |o| o.told.is_news(NOT_STORED, &note))
        {
            warn!(csidriver = %name, fields = ?dropped, "{note}");
            notes.push(Note::warning(NOT_STORED, note));
        } else {
            debug!(csidriver = %name, fields = ?dropped, "still not stored");
        }
    }
    Ok(())
}

/// One StorageClass. Its parameters, provisioner, reclaimPolicy and binding
/// mode are immutable: a changed class is re-created. Existing PVs are not
/// affected.
async fn apply_storage_class(
    ctx: &Context,
    classes: &Api<StorageClass>,
    owner: Owner<'_>,
    class: &StorageClass,
    notes: &Notes,
) -> Result<(), Error> {
    let applied = apply(
        classes,
        "StorageClass",
        class.clone(),
        owner,
        Mode::RecreateIfChanged,
        &ctx.caches.owned,
    )
    .await?;
    tell_class("StorageClass", &class.name_any(), applied, notes);
    Ok(())
}

/// Logs a created class and tells a re-created one with a `<kind>Recreated`
/// Event: claims made since use the new spec.
fn tell_class(kind: &str, name: &str, applied: Applied, notes: &Notes) {
    match applied {
        Applied::Created => info!(kind, name, "class created"),
        Applied::Recreated => {
            let note = format!("{kind} {name} re-created with the new spec");
            notes.push(Note {
                warning: false,
                reason: format!("{kind}Recreated"),
                action: "Apply".into(),
                note,
            });
        }
        Applied::Updated | Applied::Unchanged => {}
    }
}

/// One VolumeAttributesClass. Its parameters and driverName are immutable,
/// so a changed class is deleted and created again. Kubernetes holds a
/// deleted class (its `kubernetes.io/vac-protection` finalizer) until no
/// claim or PV uses it: an unused one goes within moments, waited for here
/// (at most [`RELEASE_WAIT`]) so it is re-created in the same pass; one
/// still in use cannot be replaced yet, which is said with a Warning Event
/// rather than failed, and its deletion (watched) brings the object back
/// here then.
async fn apply_attributes_class(
    ctx: &Context,
    classes: &Api<VolumeAttributesClass>,
    owner: Owner<'_>,
    class: &VolumeAttributesClass,
    notes: &Notes,
) -> Result<(), Error> {
    let name = class.name_any();
    let apply_once = || {
        apply(
            classes,
            "VolumeAttributesClass",
            class.clone(),
            owner,
            Mode::RecreateIfChanged,
            &ctx.caches.owned,
        )
    };
    let applied = match apply_once().await {
        // The old class is still there, being deleted.
        Err(e @ Error::Rejected { code: 422, .. }) => {
            match released(classes, &name, owner).await? {
                Release::Gone => apply_once().await.map(|_| Applied::Recreated),
                Release::Held => {
                    let note = format!("VolumeAttributesClass {name} changed, but claims or PVs still use the old one: Kubernetes deletes it once none does, and it is created again with the new parameters then");
                    warn!(volume_attributes_class = %name, "{note}");
                    notes.push(Note::warning("VolumeAttributesClassInUse", note));
                    return Ok(());
                }
                Release::NotDeleting => Err(e),
            }
        }
        other => other,
    };
    tell_class("VolumeAttributesClass", &name, applied?, notes);
    Ok(())
}

/// How long a deleted class may take to go before it counts as in use:
/// the protection controller lets go of an unused one within moments.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What became of a class whose replacement the API server refused.
enum Release {
    /// Gone (at once or within [`RELEASE_WAIT`]): create the new one.
    Gone,
    /// Still being deleted: in use.
    Held,
    /// Not being deleted: the refusal was about something else.
    NotDeleting,
}

/// Waits for the deleted class `name` to go, unless it has been held for
/// longer than [`RELEASE_WAIT`] already (an earlier pass waited then).
async fn released(
    classes: &Api<VolumeAttributesClass>,
    name: &str,
    owner: Owner<'_>,
) -> Result<Release, Error> {
    let started = tokio::time::Instant::now();
    loop {
        let Some(live) = get_owned(classes, "VolumeAttributesClass", name, owner).await? else {
            return Ok(Release::Gone);
        };
        let Some(deleted_at) = live.metadata.deletion_timestamp else {
            return Ok(Release::NotDeleting);
        };
        let held_for = chrono::Utc::now().timestamp() - deleted_at.0.as_second();
        if held_for > RELEASE_WAIT.as_secs() as i64 || started.elapsed() > RELEASE_WAIT {
            return Ok(Release::Held);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
