//! One PV's sync: delete the volume of a Released PV whose reclaim policy is
//! Delete, then the PV; never while a VolumeAttachment still refers to it.
//!
//! Order: DeleteVolume, then our finalizer off, then the PV deleted. A crash
//! between any two steps repeats the remaining ones: DeleteVolume of a gone
//! volume succeeds (NotFound counts as deleted), and a PV without our
//! finalizer but still Released is picked up again.
//!
//! In node deployment only the node whose driver holds the volume deletes
//! it ([`node_deployment::volume_action`]).
//!
//! A migrated in-tree PV (see [`decide::pv_is_ours`]) is read through its
//! CSI translation ([`migration::csi_view`]): the volume handle, and on a
//! node the affinity under the driver's topology keys.

use std::time::Instant;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tonic::Status;

use super::context::Context;
use super::decide::{self, VolumeAction};
use super::finalizer;
use super::metrics::Operation;
use super::node_deployment::{self, AffinityError};
use super::params::SecretRef;
use super::pv::{
    class_of, DELETION_SECRET_NAMESPACE_ANNOTATION, DELETION_SECRET_NAME_ANNOTATION,
    PV_PROTECTION_FINALIZER,
};
use super::secrets::{self, SecretError};
use crate::common::migration::{self, MigrationError};

/// Why a volume is not deleted yet (a Warning Event on the PV and a retry).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("persistentvolume {pv} is still attached to node {node}")]
    StillAttached { pv: String, node: String },
    #[error("the PV has no CSI volume handle")]
    NoHandle,
    #[error("cannot translate the in-tree PV to CSI: {0}")]
    Migration(#[from] MigrationError),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("rpc error: code = {:?} desc = {}", .0.code(), .0.message())]
    Delete(Status),
    #[error("persistentvolume {0} kept changing while its finalizer was being removed")]
    Busy(String),
    #[error("cannot tell which node holds the volume")]
    Affinity(#[from] AffinityError),
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
}

/// The deletion secret the PV's annotations name, if any (empty values are
/// upstream's "no secret").
pub fn deletion_secret(pv: &PersistentVolume) -> Option<SecretRef> {
    let a = pv.metadata.annotations.as_ref()?;
    let name = a
        .get(DELETION_SECRET_NAME_ANNOTATION)
        .filter(|s| !s.is_empty())?;
    let namespace = a
        .get(DELETION_SECRET_NAMESPACE_ANNOTATION)
        .filter(|s| !s.is_empty())?;
    Some(SecretRef {
        name: name.clone(),
        namespace: namespace.clone(),
    })
}

pub async fn sync_volume(cx: &Context, name: &str) -> Result<(), VolumeError> {
    let Some(pv) = cx.caches.volumes.get(&ObjectRef::new(name)) else {
        return Ok(());
    };
    let mut action = decide::volume_action(&pv, &cx.config.driver_name);
    if let (Some(node), VolumeAction::Delete) = (&cx.node, &action) {
        let csi = migration::csi_view(&pv)?;
        action = node_deployment::volume_action(action, node.local.holds(&csi)?);
    }
    match action {
        VolumeAction::Nothing(why) => {
            tracing::debug!(why, "nothing to do");
            Ok(())
        }
        VolumeAction::RemoveFinalizer => remove_pv_finalizer(cx, &pv).await,
        VolumeAction::Delete => delete(cx, &pv).await,
    }
}

async fn delete(cx: &Context, pv: &PersistentVolume) -> Result<(), VolumeError> {
    let started = Instant::now();
    let name = pv.name_any();
    let attached = cx.caches.attachments.by_index(&name).into_iter().next();
    if let Some(va) = attached {
        return Err(VolumeError::StillAttached {
            pv: name,
            node: va.spec.node_name.clone(),
        });
    }
    let handle = migration::csi_view(pv)?
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .filter(|h| !h.is_empty())
        .ok_or(VolumeError::NoHandle)?;
    let secrets = match deletion_secret(pv) {
        Some(r) => secrets::fetch(&cx.client, &r).await?,
        None => Default::default(),
    };
    {
        let _permit = cx.calls.acquire().await;
        cx.delete_volume(&handle, secrets)
            .await
            .map_err(VolumeError::Delete)?;
    }
    remove_pv_and_finalizer(cx, pv).await?;
    // Until the watch shows it gone, a sync finds nothing to delete.
    cx.caches.volumes.deleted(pv);
    cx.metrics
        .succeeded(Operation::Delete, class_of(pv), started.elapsed());
    tracing::info!(volume = %handle, "deleted");
    Ok(())
}

/// Our finalizer off, then the PV deleted (unless it is already).
async fn remove_pv_and_finalizer(cx: &Context, pv: &PersistentVolume) -> Result<(), VolumeError> {
    let name = pv.name_any();
    remove_pv_finalizer(cx, pv).await?;
    if pv.metadata.deletion_timestamp.is_none() {
        let api: Api<PersistentVolume> = Api::all(cx.critical.clone());
        let params = DeleteParams {
            // Never the PV of someone else that took the name since.
            preconditions: Some(Preconditions {
                uid: pv.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Takes [`PV_PROTECTION_FINALIZER`] off, re-reading when the list moved.
async fn remove_pv_finalizer(cx: &Context, pv: &PersistentVolume) -> Result<(), VolumeError> {
    // On the way to the PV being gone: as critical as the delete.
    let api: Api<PersistentVolume> = Api::all(cx.critical.clone());
    let name = pv.name_any();
    let mut current = pv.clone();
    for _ in 0..4 {
        let Some(patch) = finalizer::remove_at_index(&current.metadata, PV_PROTECTION_FINALIZER)
        else {
            return Ok(());
        };
        match api
            .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(patched) => {
                cx.caches.volumes.wrote(patched);
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
            // The finalizer list changed under us (a failed test): re-read.
            Err(kube::Error::Api(s)) if s.is_conflict() || s.code == 422 => {
                match api.get_opt(&name).await? {
                    Some(fresh) if fresh.uid() == pv.uid() => current = fresh,
                    _ => return Ok(()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(VolumeError::Busy(name))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn deletion_secret_from_annotations() {
        let mut pv = PersistentVolume::default();
        assert_eq!(deletion_secret(&pv), None);
        pv.metadata.annotations = Some(BTreeMap::from([
            (DELETION_SECRET_NAME_ANNOTATION.to_string(), String::new()),
            (
                DELETION_SECRET_NAMESPACE_ANNOTATION.to_string(),
                String::new(),
            ),
        ]));
        assert_eq!(deletion_secret(&pv), None, "empty means none");
        pv.metadata.annotations = Some(BTreeMap::from([
            (
                DELETION_SECRET_NAME_ANNOTATION.to_string(),
                "creds".to_string(),
            ),
            (
                DELETION_SECRET_NAMESPACE_ANNOTATION.to_string(),
                "ns".to_string(),
            ),
        ]));
        assert_eq!(
            deletion_secret(&pv),
            Some(SecretRef {
                name: "creds".into(),
                namespace: "ns".into()
            })
        );
    }
}
