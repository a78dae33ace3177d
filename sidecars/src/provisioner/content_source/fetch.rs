//! The reads and writes around [`super`]'s decisions for one provisioning:
//! the source claim and its PV from the caches, the snapshot objects and
//! ReferenceGrants with a GET, and the protection finalizer on the source.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;

use super::{
    bound_content, check_capabilities, clone_source, data_source, is_granted, snapshot_source,
    ContentSourceError, DataSource, ReferenceGrant, ResolveError, Resolved, SourceKind,
    VolumeSnapshot, VolumeSnapshotContent, CLONE_FINALIZER, GATEWAY_GROUP,
};
use crate::provisioner::context::Context;
use crate::provisioner::snapshot_api::{get_custom, snapshot_resource};
use crate::provisioner::{finalizer, snapshot_protection};
use csiops_proto::csi::v1::VolumeContentSource;

/// The content source of `claim`, or `None` without a data source:
/// reads the source and checks it (see [`snapshot_source`],
/// [`clone_source`]).
pub async fn content_source(
    cx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<Option<Resolved>, ResolveError> {
    let Some(source) = data_source(claim, cx.config.cross_namespace_data_source)? else {
        return Ok(None);
    };
    check_capabilities(source.kind, cx.caps)?;
    if claim.metadata.namespace.as_deref() != Some(source.namespace.as_str()) {
        check_grant(cx, claim, &source).await?;
    }
    let (content, snapshot) = match source.kind {
        SourceKind::Snapshot => {
            let (content, snapshot) = snapshot_content_source(cx, claim, class, &source).await?;
            (content, Some(snapshot))
        }
        SourceKind::Claim => {
            let key = ObjectRef::new(&source.name).within(&source.namespace);
            let source_claim = cx
                .caches
                .claims
                .get(&key)
                .ok_or_else(|| ContentSourceError::SourceClaimNotFound(source.display()))?;
            let pv = source_claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .and_then(|n| cx.caches.volumes.get(&ObjectRef::new(n)));
            (
                clone_source(claim, class, &source_claim, pv.as_deref())?,
                None,
            )
        }
    };
    Ok(Some(Resolved {
        source,
        content,
        snapshot,
    }))
}

async fn snapshot_content_source(
    cx: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    source: &DataSource,
) -> Result<(VolumeContentSource, VolumeSnapshot), ResolveError> {
    let snapshots = Api::<DynamicObject>::namespaced_with(
        cx.client.clone(),
        &source.namespace,
        &snapshot_resource("VolumeSnapshot"),
    );
    let snapshot: VolumeSnapshot = get_custom(snapshots, &source.name)
        .await?
        .ok_or_else(|| ContentSourceError::SnapshotNotFound(source.display()))?;
    let content_name = bound_content(&snapshot, source)?;
    let contents = Api::<DynamicObject>::all_with(
        cx.client.clone(),
        &snapshot_resource("VolumeSnapshotContent"),
    );
    let content: VolumeSnapshotContent =
        get_custom(contents, &content_name).await?.ok_or_else(|| {
            ContentSourceError::ContentNotFound {
                content: content_name.clone(),
                snapshot: source.name.clone(),
            }
        })?;
    let restored = snapshot_source(
        claim,
        class,
        &snapshot,
        &content,
        cx.config.prevent_volume_mode_conversion,
    )?;
    Ok((restored, snapshot))
}

/// A ReferenceGrant in the source's namespace must allow the reference.
async fn check_grant(
    cx: &Context,
    claim: &PersistentVolumeClaim,
    source: &DataSource,
) -> Result<(), ResolveError> {
    let api = Api::<DynamicObject>::namespaced_with(
        cx.client.clone(),
        &source.namespace,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            GATEWAY_GROUP,
            "v1beta1",
            "ReferenceGrant",
        )),
    );
    let list = api
        .list(&Default::default())
        .await
        .map_err(|e| ContentSourceError::Grants {
            namespace: source.namespace.clone(),
            why: csiops_runtime::chain(&e).to_string(),
        })?;
    let grants: Vec<ReferenceGrant> = list
        .items
        .into_iter()
        .filter_map(|o| serde_json::to_value(o).ok())
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    Ok(is_granted(claim, source, &grants)?)
}

/// Puts [`CLONE_FINALIZER`] on the source claim of a clone, before the
/// volume is created (upstream's `setCloneFinalizer`): the source then
/// cannot go until the clone is bound (see `cloning`).
pub async fn protect_source(cx: &Context, resolved: &Resolved) -> Result<(), ResolveError> {
    if resolved.source.kind == SourceKind::Snapshot {
        return snapshot_protection::protect_snapshot(
            cx,
            &resolved.source,
            resolved.snapshot.clone(),
        )
        .await;
    }
    let source = &resolved.source;
    // Ordered with the cloning workers' removal (see `cloning`).
    let _held = cx.cloning.lock.lock().await;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(cx.client.clone(), &source.namespace);
    let key = ObjectRef::new(&source.name).within(&source.namespace);
    let mut current = cx.caches.claims.get(&key).map(|c| (*c).clone());
    for _ in 0..3 {
        let claim = match current.take() {
            Some(c) => c,
            None => api
                .get_opt(&source.name)
                .await?
                .ok_or_else(|| ContentSourceError::SourceClaimNotFound(source.display()))?,
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(ContentSourceError::SourceDeleting(source.name.clone()).into());
        }
        let Some(patch) = finalizer::add(&claim.metadata, CLONE_FINALIZER) else {
            return Ok(());
        };
        match api
            .patch(&source.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => {
                cx.caches.claims.wrote(written);
                tracing::debug!(source = %source.display(), "cloning-protection finalizer added");
                return Ok(());
            }
            // The cached copy was stale: read it again.
            Err(kube::Error::Api(s)) if s.is_conflict() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(ContentSourceError::SourceBusy(source.display()).into())
}
