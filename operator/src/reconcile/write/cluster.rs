//! The cluster-scoped objects of a driver (CSIDriver, ClusterRoleBindings,
//! StorageClasses, VolumeAttributesClasses), and its Secret readers' RoleBindings
//! in other namespaces: they cannot carry an owner reference to a namespaced
//! object, so they are found by our owner-uid label, pruned when the spec
//! stops rendering them, and deleted in the last teardown step.

use std::collections::BTreeSet;
use std::fmt::Debug;

use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttributesClass};
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::apply::{is_owned_by, Owner};
use crate::reconcile::error::Error;
use crate::render::rbac::SECRET_READER_ROLE;
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
        if !keep.contains(&name) && delete_exactly(api, kind, &name, uid).await? {
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Deletes `name` if it is still the object `uid` names; whether it did.
async fn delete_exactly<K>(
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    uid: Option<String>,
) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(false),
        Err(e) => Err(Error::from_write(kind, name, e)),
    }
}

/// The four kinds and the Secret readers' RoleBindings, addressed by one
/// owner selector. (No ClusterRoles: the roles are shipped with the
/// operator, which cannot write any.)
pub struct ClusterScoped {
    csidrivers: Api<CSIDriver>,
    cluster_role_bindings: Api<ClusterRoleBinding>,
    role_bindings: Api<RoleBinding>,
    storage_classes: Api<StorageClass>,
    attributes_classes: Api<VolumeAttributesClass>,
    selector: String,
}

impl ClusterScoped {
    pub fn new(client: &Client, selector: String) -> Self {
        Self {
            csidrivers: Api::all(client.clone()),
            cluster_role_bindings: Api::all(client.clone()),
            role_bindings: Api::all(client.clone()),
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
                .len()
            + self.secret_readers().await?.len())
    }

    /// The Secret readers' RoleBindings of ours, wherever they are: (namespace,
    /// name, uid).
    async fn secret_readers(&self) -> Result<Vec<(String, String, Option<String>)>, Error> {
        let sel = self.selector.as_str();
        let list = self
            .role_bindings
            .list(&ListParams::default().labels(sel))
            .await
            .map_err(|e| Error::read("list", format!("RoleBinding objects labelled {sel}"), e))?;
        Ok(list
            .items
            .iter()
            .filter(|b| {
                b.role_ref.kind == "ClusterRole" && b.role_ref.name == SECRET_READER_ROLE.name
            })
            .map(|b| (b.namespace().unwrap_or_default(), b.name_any(), b.uid()))
            .collect())
    }

    /// Deletes the Secret readers' RoleBindings of ours but those in `keep`
    /// (namespace, name).
    async fn delete_secret_readers(
        &self,
        keep: &BTreeSet<(String, String)>,
    ) -> Result<usize, Error> {
        let mut deleted = 0;
        for (namespace, name, uid) in self.secret_readers().await? {
            if keep.contains(&(namespace.clone(), name.clone())) {
                continue;
            }
            let api: Api<RoleBinding> =
                Api::namespaced(self.role_bindings.clone().into_client(), &namespace);
            if delete_exactly(&api, "RoleBinding", &name, uid).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Deletes every one of ours (teardown).
    pub async fn delete_all(&self) -> Result<usize, Error> {
        Ok(self
            .delete_except(
                &BTreeSet::new(),
                &BTreeSet::new(),
                &BTreeSet::new(),
                &BTreeSet::new(),
            )
            .await?
            + self.delete_secret_readers(&BTreeSet::new()).await?)
    }

    /// Deletes ours that the current spec no longer renders (a StorageClass
    /// removed from the list, the registrar's binding once it is disabled).
    pub async fn prune(&self, rendered: &Rendered) -> Result<usize, Error> {
        let names = |it: &mut dyn Iterator<Item = String>| it.collect::<BTreeSet<String>>();
        let classes = names(&mut rendered.storage_classes.iter().map(|o| o.name_any()));
        let attributes = names(&mut rendered.attributes_classes.iter().map(|o| o.name_any()));
        let bindings = names(&mut rendered.cluster_role_bindings.iter().map(|o| o.name_any()));
        let drivers = names(&mut std::iter::once(rendered.csi_driver.name_any()));
        let readers = rendered
            .secret_reader_bindings
            .iter()
            .map(|b| (b.namespace().unwrap_or_default(), b.name_any()))
            .collect();
        Ok(self
            .delete_except(&classes, &attributes, &bindings, &drivers)
            .await?
            + self.delete_secret_readers(&readers).await?)
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
