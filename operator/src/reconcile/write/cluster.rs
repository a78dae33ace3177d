//! The cluster-scoped objects of a driver (CSIDriver, ClusterRoleBindings,
//! StorageClasses, VolumeAttributesClasses): they cannot carry an owner reference
//! to a namespaced object, so they are found by our owner-uid label, pruned
//! when the spec stops rendering them, and deleted in the last teardown step.

use std::collections::BTreeSet;
use std::fmt::Debug;

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttributesClass};
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::apply::{is_owned_by, Owner};
use crate::reconcile::error::Error;
use crate::render::Rendered;

/// Names (and uids) of the objects of one kind that carry `selector` and,
/// when `owner` is given, its controller owner reference.
pub(crate) async fn owned_names<K>(
    api: &Api<K>,
    kind: &'static str,
    selector: &str,
    owner: Option<Owner<'_>>,
) -> Result<Vec<(String, Option<String>)>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let list = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| Error::read("list", format!("{kind} objects labelled {selector}"), e))?;
    Ok(list
        .items
        .iter()
        .filter(|o| owner.is_none_or(|owner| is_owned_by(o.meta(), owner)))
        .map(|o| (o.name_any(), o.uid()))
        .collect())
}

/// Deletes the objects [`owned_names`] finds, but those in `keep`.
pub(crate) async fn delete_all<K>(
    api: &Api<K>,
    kind: &'static str,
    selector: &str,
    owner: Option<Owner<'_>>,
    keep: &BTreeSet<String>,
) -> Result<usize, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut deleted = 0;
    for (name, uid) in owned_names(api, kind, selector, owner).await? {
        if keep.contains(&name) {
            continue;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
            Err(e) => return Err(Error::from_write(kind, &name, e)),
        }
    }
    Ok(deleted)
}

/// The four kinds, addressed by one owner selector. (No ClusterRoles: the
/// roles are shipped with the operator, which cannot write any.)
pub struct ClusterScoped {
    csidrivers: Api<CSIDriver>,
    cluster_role_bindings: Api<ClusterRoleBinding>,
    storage_classes: Api<StorageClass>,
    attributes_classes: Api<VolumeAttributesClass>,
    selector: String,
}

impl ClusterScoped {
    pub fn new(client: &Client, selector: String) -> Self {
        Self {
            csidrivers: Api::all(client.clone()),
            cluster_role_bindings: Api::all(client.clone()),
            storage_classes: Api::all(client.clone()),
            attributes_classes: Api::all(client.clone()),
            selector,
        }
    }

    /// How many of ours remain. A VolumeAttributesClass already deleted
    /// does not count: Kubernetes removes it once no claim or PV uses it,
    /// which may be long after the driver is gone, and nothing of ours
    /// holds it.
    pub async fn count(&self) -> Result<usize, Error> {
        let sel = self.selector.as_str();
        let attributes_classes = self
            .attributes_classes
            .list(&ListParams::default().labels(sel))
            .await
            .map_err(|e| {
                Error::read(
                    "list",
                    format!("VolumeAttributesClass objects labelled {sel}"),
                    e,
                )
            })?
            .items
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .count();
        Ok(attributes_classes
            + owned_names(&self.csidrivers, "CSIDriver", sel, None)
                .await?
                .len()
            + owned_names(&self.cluster_role_bindings, "ClusterRoleBinding", sel, None)
                .await?
                .len()
            + owned_names(&self.storage_classes, "StorageClass", sel, None)
                .await?
                .len())
    }

    /// Deletes every one of ours (teardown).
    pub async fn delete_all(&self) -> Result<usize, Error> {
        self.delete_except(
            &BTreeSet::new(),
            &BTreeSet::new(),
            &BTreeSet::new(),
            &BTreeSet::new(),
        )
        .await
    }

    /// Deletes ours that the current spec no longer renders (a StorageClass
    /// removed from the list, the registrar's binding once it is disabled).
    pub async fn prune(&self, rendered: &Rendered) -> Result<usize, Error> {
        let names = |it: &mut dyn Iterator<Item = String>| it.collect::<BTreeSet<String>>();
        let classes = names(&mut rendered.storage_classes.iter().map(|o| o.name_any()));
        let attributes = names(&mut rendered.attributes_classes.iter().map(|o| o.name_any()));
        let bindings = names(&mut rendered.cluster_role_bindings.iter().map(|o| o.name_any()));
        let drivers = names(&mut std::iter::once(rendered.csi_driver.name_any()));
        self.delete_except(&classes, &attributes, &bindings, &drivers)
            .await
    }

    async fn delete_except(
        &self,
        classes: &BTreeSet<String>,
        attributes: &BTreeSet<String>,
        bindings: &BTreeSet<String>,
        drivers: &BTreeSet<String>,
    ) -> Result<usize, Error> {
        let sel = self.selector.as_str();
        Ok(
            delete_all(&self.storage_classes, "StorageClass", sel, None, classes).await?
                + delete_terminating_aside(
                    &self.attributes_classes,
                    "VolumeAttributesClass",
                    sel,
                    attributes,
                )
                .await?
                + delete_all(
                    &self.cluster_role_bindings,
                    "ClusterRoleBinding",
                    sel,
                    None,
                    bindings,
                )
                .await?
                + delete_all(&self.csidrivers, "CSIDriver", sel, None, drivers).await?,
        )
    }
}

/// [`delete_all`] for VolumeAttributesClasses, skipping those already being
/// deleted (Kubernetes holds a class in use; deleting it again each
/// reconcile would count as work done and change nothing).
async fn delete_terminating_aside(
    api: &Api<VolumeAttributesClass>,
    kind: &'static str,
    selector: &str,
    keep: &BTreeSet<String>,
) -> Result<usize, Error> {
    let list = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| Error::read("list", format!("{kind} objects labelled {selector}"), e))?;
    let mut keep = keep.clone();
    keep.extend(
        list.items
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_some())
            .map(|c| c.name_any()),
    );
    delete_all(api, kind, selector, None, &keep).await
}
