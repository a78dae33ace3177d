//! The cluster-scoped objects of a driver (CSIDriver, ClusterRoles,
//! ClusterRoleBindings, StorageClasses): they cannot carry an owner reference
//! to a namespaced object, so they are found by our owner-uid label, pruned
//! when the spec stops rendering them, and deleted in the last teardown step.

use std::collections::BTreeSet;
use std::fmt::Debug;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::error::Error;
use crate::render::Rendered;

/// Names of the cluster-scoped objects of one kind that are ours.
async fn owned_names<K>(
    api: &Api<K>,
    selector: &str,
) -> Result<Vec<(String, Option<String>)>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let list = api.list(&ListParams::default().labels(selector)).await?;
    Ok(list.items.iter().map(|o| (o.name_any(), o.uid())).collect())
}

async fn delete_all<K>(
    api: &Api<K>,
    selector: &str,
    keep: &BTreeSet<String>,
) -> Result<usize, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut deleted = 0;
    for (name, uid) in owned_names(api, selector).await? {
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
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    Ok(deleted)
}

/// The four kinds, addressed by one owner selector.
pub struct ClusterScoped {
    csidrivers: Api<CSIDriver>,
    cluster_roles: Api<ClusterRole>,
    cluster_role_bindings: Api<ClusterRoleBinding>,
    storage_classes: Api<StorageClass>,
    selector: String,
}

impl ClusterScoped {
    pub fn new(client: &Client, selector: String) -> Self {
        Self {
            csidrivers: Api::all(client.clone()),
            cluster_roles: Api::all(client.clone()),
            cluster_role_bindings: Api::all(client.clone()),
            storage_classes: Api::all(client.clone()),
            selector,
        }
    }

    /// How many of ours remain.
    pub async fn count(&self) -> Result<usize, Error> {
        Ok(owned_names(&self.csidrivers, &self.selector).await?.len()
            + owned_names(&self.cluster_roles, &self.selector)
                .await?
                .len()
            + owned_names(&self.cluster_role_bindings, &self.selector)
                .await?
                .len()
            + owned_names(&self.storage_classes, &self.selector)
                .await?
                .len())
    }

    /// Deletes every one of ours (teardown).
    pub async fn delete_all(&self) -> Result<usize, Error> {
        let none = BTreeSet::new();
        // Bindings before roles, so no binding ever points at a missing role.
        Ok(
            delete_all(&self.storage_classes, &self.selector, &none).await?
                + delete_all(&self.cluster_role_bindings, &self.selector, &none).await?
                + delete_all(&self.cluster_roles, &self.selector, &none).await?
                + delete_all(&self.csidrivers, &self.selector, &none).await?,
        )
    }

    /// Deletes ours that the current spec no longer renders (a StorageClass
    /// removed from the list, the node role of a disabled registrar).
    pub async fn prune(&self, rendered: &Rendered) -> Result<usize, Error> {
        let names = |it: &mut dyn Iterator<Item = String>| it.collect::<BTreeSet<String>>();
        let classes = names(&mut rendered.storage_classes.iter().map(|o| o.name_any()));
        let bindings = names(&mut rendered.cluster_role_bindings.iter().map(|o| o.name_any()));
        let roles = names(&mut rendered.cluster_roles.iter().map(|o| o.name_any()));
        let drivers = names(&mut std::iter::once(rendered.csi_driver.name_any()));
        Ok(
            delete_all(&self.storage_classes, &self.selector, &classes).await?
                + delete_all(&self.cluster_role_bindings, &self.selector, &bindings).await?
                + delete_all(&self.cluster_roles, &self.selector, &roles).await?
                + delete_all(&self.csidrivers, &self.selector, &drivers).await?,
        )
    }
}
