//! The objects a driver's pods need before they start: ServiceAccounts,
//! RBAC bindings, the CSIDriver and StorageClasses, applied ownership-checked; the
//! immutable CSIDriver and StorageClasses re-created when they change.
//!
//! They are independent of each other, so they are written side by side (at
//! most [`PARALLEL`] requests at once): an upgrade changes every one of them
//! (they carry the version label), and one after the other they held the
//! node DaemonSet's apply back by their sum.

use csiops_crds::CSIDriverDeployment;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::Api;
use kube::ResourceExt;
use tracing::{info, warn};

use super::apply::{apply, apply_checked, delete_owned, Applied, Mode, Owner};
use super::error::Error;
use super::events::{publish, Note};
use super::Context;
use crate::render::{csidriver, Rendered};

/// Supporting objects written at once.
pub(super) const PARALLEL: usize = 8;

/// ServiceAccounts, RBAC, the CSIDriver and StorageClasses: applied before any
/// workload so pods never start without their permissions. Every write runs
/// to its end, and then the first error is returned: a failure elsewhere
/// must not cut a re-creation (CSIDriver, StorageClass) between its delete
/// and its create.
pub(super) async fn apply_supporting(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    r: &Rendered,
) -> Result<(), Error> {
    let c = &ctx.client;
    let known = &ctx.caches.owned;
    let accounts: Api<ServiceAccount> = Api::namespaced(c.clone(), owner.namespace);
    // Bindings only: the roles are shipped with the operator (install.yaml),
    // which may bind them by name but holds none of their verbs.
    let role_bindings: Api<RoleBinding> = Api::namespaced(c.clone(), owner.namespace);
    let cluster_bindings: Api<ClusterRoleBinding> = Api::all(c.clone());
    let classes: Api<StorageClass> = Api::all(c.clone());

    let mut writes: Vec<BoxFuture<'_, Result<(), Error>>> = Vec::new();
    for account in r
        .controller_service_account
        .iter()
        .chain(std::iter::once(&r.node_service_account))
    {
        let desired = account.clone();
        let api = &accounts;
        writes.push(
            async move {
                apply(
                    api,
                    "ServiceAccount",
                    desired,
                    owner,
                    Mode::IfChanged,
                    known,
                )
                .await
                .map(drop)
            }
            .boxed(),
        );
    }
    for binding in &r.role_bindings {
        let desired = binding.clone();
        let api = &role_bindings;
        writes.push(
            async move {
                apply(api, "RoleBinding", desired, owner, Mode::IfChanged, known)
                    .await
                    .map(drop)
            }
            .boxed(),
        );
    }
    for binding in &r.cluster_role_bindings {
        let desired = binding.clone();
        let api = &cluster_bindings;
        writes.push(
            async move {
                apply(
                    api,
                    "ClusterRoleBinding",
                    desired,
                    owner,
                    Mode::IfChanged,
                    known,
                )
                .await
                .map(drop)
            }
            .boxed(),
        );
    }
    writes.push(apply_csidriver(obj, ctx, owner, r).boxed());
    for class in &r.storage_classes {
        writes.push(apply_storage_class(obj, ctx, &classes, owner, class).boxed());
    }
    let results: Vec<Result<(), Error>> = futures::stream::iter(writes)
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The CSIDriver. Some of its fields are immutable: when the API refuses
/// the change, the object is re-created (running volumes keep working
/// meanwhile). Some are dropped by an API server whose feature gate is
/// off: said with a Warning Event, and applied again until they are stored.
async fn apply_csidriver(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    owner: Owner<'_>,
    r: &Rendered,
) -> Result<(), Error> {
    let drivers: Api<CSIDriver> = Api::all(ctx.client.clone());
    let name = r.csi_driver.name_any();
    let dropped = match apply_checked(
        &drivers,
        "CSIDriver",
        r.csi_driver.clone(),
        owner,
        Mode::IfChanged,
        &ctx.caches.owned,
        csidriver::unstored_fields,
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
                csidriver::unstored_fields,
            )
            .await?;
            let note =
                format!("CSIDriver {name} re-created: an immutable field changed ({message})");
            publish(
                &ctx.recorder,
                obj,
                &Note::warning("CSIDriverRecreated", note),
            )
            .await;
            dropped
        }
        other => other?.1,
    };
    if !dropped.is_empty() {
        let note = csidriver::unstored_note(&name, &dropped);
        warn!(csidriver = %name, fields = ?dropped, "{note}");
        publish(
            &ctx.recorder,
            obj,
            &Note::warning("CSIDriverFieldNotStored", note),
        )
        .await;
    }
    Ok(())
}

/// One StorageClass. Its parameters, provisioner, reclaimPolicy and binding
/// mode are immutable: a changed class is re-created. Existing PVs are not
/// affected.
async fn apply_storage_class(
    obj: &CSIDriverDeployment,
    ctx: &Context,
    classes: &Api<StorageClass>,
    owner: Owner<'_>,
    class: &StorageClass,
) -> Result<(), Error> {
    let name = class.name_any();
    match apply(
        classes,
        "StorageClass",
        class.clone(),
        owner,
        Mode::RecreateIfChanged,
        &ctx.caches.owned,
    )
    .await?
    {
        Applied::Created => info!(storage_class = %name, "StorageClass created"),
        Applied::Recreated => {
            let note = format!("StorageClass {name} re-created with the new spec");
            publish(
                &ctx.recorder,
                obj,
                &Note {
                    warning: false,
                    reason: "StorageClassRecreated".into(),
                    action: "Apply".into(),
                    note,
                },
            )
            .await;
        }
        Applied::Updated | Applied::Unchanged => {}
    }
    Ok(())
}
