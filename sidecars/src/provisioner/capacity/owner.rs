//! The owner of the published objects, as upstream's `owner.Lookup`: start
//! at the pod `POD_NAME` in `NAMESPACE` and follow controller references up
//! `--capacity-ownerref-level` levels. The objects are then garbage
//! collected with that owner (the provisioner's Deployment or StatefulSet),
//! not with the pod, so a restarted or failed-over provisioner keeps them.
//!
//! Each object on the way is read with a GET (kind found by discovery), the
//! last level excepted: its reference is taken from its child, so level 1
//! needs `get` on pods only, level 2 also on the pod's controller
//! (ReplicaSets for a Deployment), as upstream.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};

/// Why the owner could not be found.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error(
        "cannot read {kind} {namespace}/{name} to find the owner of CSIStorageCapacity objects"
    )]
    Get {
        kind: String,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot find the API of {api_version} {kind} (owner of {child})")]
    Discovery {
        api_version: String,
        kind: String,
        child: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind} {namespace}/{name} has no controlling owner, cannot go {levels} more level(s) up (--capacity-ownerref-level)")]
    NoController {
        kind: String,
        namespace: String,
        name: String,
        levels: i64,
    },
}

/// The reference upstream writes: apiVersion, kind, name, uid, controller.
fn reference(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The controlling owner among `refs`.
pub fn controller_of(refs: &[OwnerReference]) -> Option<&OwnerReference> {
    refs.iter().find(|r| r.controller == Some(true))
}

/// The owner `levels` up from pod `pod` in `namespace`; `None` for `-1`.
pub async fn lookup(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    levels: i64,
) -> Result<Option<OwnerReference>, OwnerError> {
    if levels < 0 {
        return Ok(None);
    }
    let mut resource = ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
    let mut name = pod.to_string();
    let mut levels = levels;
    loop {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let obj = api.get(&name).await.map_err(|source| OwnerError::Get {
            kind: resource.kind.clone(),
            namespace: namespace.into(),
            name: name.clone(),
            source,
        })?;
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        if levels == 0 {
            return Ok(Some(reference(
                &resource.api_version,
                &resource.kind,
                &name,
                &uid,
            )));
        }
        let refs = obj.metadata.owner_references.unwrap_or_default();
        let Some(up) = controller_of(&refs) else {
            return Err(OwnerError::NoController {
                kind: resource.kind.clone(),
                namespace: namespace.into(),
                name,
                levels,
            });
        };
        if levels == 1 {
            return Ok(Some(reference(
                &up.api_version,
                &up.kind,
                &up.name,
                &up.uid,
            )));
        }
        let (group, version) = match up.api_version.split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), up.api_version.clone()),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, &up.kind);
        let child = format!("{} {name}", resource.kind);
        let (found, _) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|source| OwnerError::Discovery {
                api_version: up.api_version.clone(),
                kind: up.kind.clone(),
                child,
                source,
            })?;
        resource = found;
        name = up.name.clone();
        levels -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_reference_is_followed() {
        let mut a = reference("v1", "ConfigMap", "a", "1");
        a.controller = None;
        let b = reference("apps/v1", "ReplicaSet", "b", "2");
        assert_eq!(controller_of(&[a.clone(), b.clone()]), Some(&b));
        assert_eq!(controller_of(&[a]), None);
        assert_eq!(
            serde_json::to_value(&b).unwrap(),
            serde_json::json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "b", "uid": "2", "controller": true})
        );
    }
}
