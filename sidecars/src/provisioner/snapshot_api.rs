//! Reads of the `snapshot.storage.k8s.io` objects, which have no typed
//! client here: a dynamic GET turned into the typed view of them that
//! [`super::content_source`] reads. Below both the restore's reads and the
//! snapshot protection, which each use it.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

use super::content_source::{ResolveError, SNAPSHOT_GROUP, SNAPSHOT_KIND};

/// The API resource of a snapshot object of `kind`.
pub fn snapshot_resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(SNAPSHOT_GROUP, "v1", kind))
}

/// A GET of a custom object into the typed view of it read here; `None`
/// when it does not exist.
pub async fn get_custom<T: serde::de::DeserializeOwned>(
    api: Api<DynamicObject>,
    name: &str,
) -> Result<Option<T>, ResolveError> {
    let Some(obj) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let value = serde_json::to_value(obj).map_err(kube::Error::SerdeError)?;
    let typed = serde_json::from_value(value).map_err(kube::Error::SerdeError)?;
    Ok(Some(typed))
}

/// VolumeSnapshots in `namespace`, or in every namespace.
pub fn snapshots(client: &kube::Client, namespace: Option<&str>) -> Api<DynamicObject> {
    let resource = snapshot_resource(SNAPSHOT_KIND);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}
