//! Upstream v6.3's source protection of a VolumeSnapshot being restored:
//! the finalizer [`SNAPSHOT_SOURCE_FINALIZER`] goes on the snapshot before
//! CreateVolume and comes off once the PV exists, so the snapshot (and the
//! backend snapshot behind it) cannot vanish while a volume is made from it.
//! Without RBAC to write VolumeSnapshots the restore goes on unprotected, as
//! upstream's does. A finalizer left behind (a crash, a claim deleted while
//! pending) is taken off by the orphan sweep every
//! `--snapshot-orphan-sweep-interval`: a snapshot that no pending claim
//! restores from keeps no finalizer of ours.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{ListParams, Patch, PatchParams};

use super::content_source::{
    self, ContentSourceError, DataSource, ResolveError, SourceKind, VolumeSnapshot,
    SNAPSHOT_SOURCE_FINALIZER,
};
use super::context::Context;
use super::finalizer;
use super::snapshot_api::{get_custom, snapshots};

/// `namespace/name` of every VolumeSnapshot a pending claim restores from
/// (any driver's claim: another provisioner's restore counts too).
pub fn pending_sources<C: Borrow<PersistentVolumeClaim>>(
    claims: impl IntoIterator<Item = C>,
) -> BTreeSet<String> {
    claims
        .into_iter()
        .filter(|c| {
            let c = c.borrow();
            let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
            matches!(phase, None | Some("") | Some("Pending"))
        })
        // Cross-namespace sources count whatever the gate says: the sweep
        // must never strip a snapshot another provisioner restores.
        .filter_map(|c| content_source::data_source(c.borrow(), true).ok().flatten())
        .filter(|s| s.kind == SourceKind::Snapshot)
        .map(|s| format!("{}/{}", s.namespace, s.name))
        .collect()
}

/// The snapshots that carry our finalizer with no pending restore of them.
pub fn orphans<'a>(
    snapshots: &'a [VolumeSnapshot],
    pending: &BTreeSet<String>,
) -> Vec<&'a VolumeSnapshot> {
    snapshots
        .iter()
        .filter(|s| {
            s.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == SNAPSHOT_SOURCE_FINALIZER)
        })
        .filter(|s| {
            let key = format!(
                "{}/{}",
                s.metadata.namespace.as_deref().unwrap_or_default(),
                s.metadata.name.as_deref().unwrap_or_default()
            );
            !pending.contains(&key)
        })
        .collect()
}

/// Puts the finalizer on the snapshot `source` names, before
/// CreateVolume, starting from the copy `read` while resolving it (read
/// again only when it changed since).
pub(super) async fn protect_snapshot(
    cx: &Context,
    source: &DataSource,
    read: Option<VolumeSnapshot>,
) -> Result<(), ResolveError> {
    let api = snapshots(&cx.client, Some(&source.namespace));
    let mut current = read;
    for _ in 0..3 {
        let snapshot = match current.take() {
            Some(s) => s,
            None => get_custom(api.clone(), &source.name)
                .await?
                .ok_or_else(|| ContentSourceError::SnapshotNotFound(source.name.clone()))?,
        };
        let Some(patch) = finalizer::add(&snapshot.metadata, SNAPSHOT_SOURCE_FINALIZER) else {
            return Ok(());
        };
        match api
            .patch(&source.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 403 => {
                tracing::info!(snapshot = %format!("{}/{}", source.namespace, source.name), "no RBAC to write VolumeSnapshots: restoring without source protection");
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(ContentSourceError::SnapshotBusy(format!("{}/{}", source.namespace, source.name)).into())
}

/// Takes the finalizer off once the PV exists; a failure is logged and
/// left to the orphan sweep (the volume is made, nothing waits on it).
pub(super) async fn release_snapshot(cx: &Context, source: &DataSource) {
    let api = snapshots(&cx.client, Some(&source.namespace));
    let snapshot = match get_custom::<VolumeSnapshot>(api, &source.name).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the restored snapshot; the orphan sweep will release it");
            None
        }
    };
    if let Some(snapshot) = snapshot {
        if let Err(e) = remove_snapshot_finalizer(cx, &snapshot).await {
            tracing::warn!(error = %e, "cannot release the restored snapshot; the orphan sweep will");
        }
    }
}

async fn remove_snapshot_finalizer(
    cx: &Context,
    snapshot: &VolumeSnapshot,
) -> Result<(), kube::Error> {
    let Some(patch) = finalizer::remove_at_index(&snapshot.metadata, SNAPSHOT_SOURCE_FINALIZER)
    else {
        return Ok(());
    };
    let name = snapshot.metadata.name.clone().unwrap_or_default();
    let api = snapshots(&cx.bookkeeping, snapshot.metadata.namespace.as_deref());
    match api
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone, or changed since read: the next sweep looks again.
        Err(kube::Error::Api(s)) if s.is_not_found() || s.code == 422 || s.is_conflict() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Every `interval`: the finalizer off every snapshot no pending claim
/// restores from. Stops quietly without RBAC to list snapshots, or when
/// the snapshot API is not installed.
pub async fn sweep_snapshot_finalizers(cx: Arc<Context>, interval: Duration) {
    let api = snapshots(&cx.client, None);
    loop {
        tokio::time::sleep(interval).await;
        let listed = match api.list(&ListParams::default()).await {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .filter_map(|v| serde_json::from_value(v).ok())
                .collect::<Vec<VolumeSnapshot>>(),
            Err(kube::Error::Api(s)) if s.code == 403 || s.is_not_found() => {
                tracing::info!(error = %s.message, "snapshot source-protection sweep off");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list VolumeSnapshots for the source-protection sweep");
                continue;
            }
        };
        let pending = pending_sources(cx.caches.claims.store().iter());
        for snapshot in orphans(&listed, &pending) {
            if let Err(e) = remove_snapshot_finalizer(&cx, snapshot).await {
                tracing::warn!(error = %e, "cannot release an orphaned snapshot");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(phase: Option<&str>, source: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"dataSource": source},
            "status": {"phase": phase},
        }))
        .expect("claim")
    }

    fn snap(name: &str, finalizers: &[&str]) -> VolumeSnapshot {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "finalizers": finalizers},
        }))
        .expect("snapshot")
    }

    #[test]
    fn only_snapshots_of_pending_restores_keep_the_finalizer() {
        let snapshot_source = |n: &str| json!({"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": n});
        let claims = [
            claim(Some("Pending"), snapshot_source("a")),
            claim(None, snapshot_source("b")),
            claim(Some("Bound"), snapshot_source("c")),
            claim(
                Some("Pending"),
                json!({"kind": "PersistentVolumeClaim", "name": "d"}),
            ),
        ];
        let pending = pending_sources(claims.iter());
        assert_eq!(pending.into_iter().collect::<Vec<_>>(), ["ns/a", "ns/b"]);
        let listed = [
            snap("a", &[SNAPSHOT_SOURCE_FINALIZER]),
            snap("c", &[SNAPSHOT_SOURCE_FINALIZER, "other"]),
            snap("d", &["other"]),
        ];
        let pending = pending_sources(claims.iter());
        let names: Vec<_> = orphans(&listed, &pending)
            .iter()
            .map(|s| s.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["c"]);
    }
}
