//! The attacher's syncs, as external-attacher's handler: what one
//! VolumeAttachment or PersistentVolume needs, carried out (finalizers,
//! ControllerPublish/Unpublish, status), and errors recorded in
//! `attachError`/`detachError` with an Event. The caches, queues and workers
//! that call them are in [`controller`](super::controller).

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tonic::Status;

use super::controller::{Controller, Kind};
use super::decide::{self, PvAction, Refusal, VaAction, Volume};
use super::metrics::Write;
use super::node::{self, NodeIdError};
use super::request::{self, RequestError, SecretRef};
use super::{csi, status};
use crate::common::driver::code_name;
use csiops_runtime::{chain, truncate};

/// Event reasons (close to the kubelet/attach-detach controller's wording).
pub const REASON_ATTACH_FAILED: &str = "AttachFailed";
pub const REASON_DETACH_FAILED: &str = "DetachFailed";

/// Why one sync failed. The ones before the CSI call's answer are recorded
/// in `attachError`/`detachError`, like upstream.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("failed to translate the in-tree volume to CSI: {0}")]
    Migration(#[from] crate::common::migration::MigrationError),
    #[error(transparent)]
    NodeId(#[from] NodeIdError),
    #[error("failed to load secret \"{namespace}/{name}\"")]
    Secret {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("could not add PersistentVolume finalizer")]
    PvFinalizer(#[source] kube::Error),
    #[error("could not save VolumeAttachment")]
    SaveVa(#[source] kube::Error),
    #[error("rpc error: code = {} desc = {}", code_name(.0.code()), .0.message())]
    Csi(Status),
    #[error("could not mark as attached")]
    MarkAttached(#[source] kube::Error),
    #[error("could not mark as detached")]
    MarkDetached(#[source] kube::Error),
    #[error("could not remove PersistentVolume finalizer")]
    PvFinalizerRemove(#[source] kube::Error),
}

impl SyncError {
    /// The driver's gRPC code when the CSI call itself failed: what
    /// `VolumeError.errorCode` carries (upstream's attacher since v4.10).
    fn csi_code(&self) -> Option<i32> {
        match self {
            SyncError::Csi(status) => Some(i32::from(status.code())),
            _ => None,
        }
    }

    /// Whether the error belongs in `attachError`/`detachError`.
    fn recorded(&self) -> bool {
        !matches!(
            self,
            SyncError::MarkAttached(_)
                | SyncError::MarkDetached(_)
                | SyncError::PvFinalizerRemove(_)
        )
    }
}

impl Controller {
    /// One VolumeAttachment, from the queue `kind`.
    pub(super) async fn sync_va(&self, name: &str, kind: Kind) -> Result<(), SyncError> {
        let Some(va) = self.vas.get_named(name) else {
            return Ok(());
        };
        // The object may have moved on since it was queued: hand it over.
        let deleting = va.metadata.deletion_timestamp.is_some();
        if deleting != (kind == Kind::Detach) {
            self.enqueue_va(&va);
            return Ok(());
        }
        let pv_name = va.spec.source.persistent_volume_name.clone();
        let pv = pv_name.as_deref().and_then(|n| self.pvs.get_named(n));
        let volume = Volume::of(&va, |_| pv.as_deref());
        let action = decide::va_action(
            &va,
            volume,
            &self.cfg.driver_name,
            &self.finalizer,
            self.cfg.mode,
        );
        tracing::debug!(?action, "sync");
        match action {
            VaAction::NotOurs | VaAction::Done => Ok(()),
            VaAction::MarkAttached => self.mark_attached(&va, &Default::default()).await,
            VaAction::DropFinalizer => self.remove_va_finalizer(&va).await,
            VaAction::Refuse(r) => {
                let err = SyncError::from(r);
                self.record_attach_error(&va, &err).await;
                Err(err)
            }
            VaAction::Attach {
                add_pv_finalizer,
                add_va_finalizer,
            } => {
                let res = self
                    .attach(&va, volume, add_pv_finalizer, add_va_finalizer)
                    .await;
                if let Err(e) = &res {
                    if e.recorded() {
                        self.record_attach_error(&va, e).await;
                    }
                }
                res
            }
            VaAction::Detach { clear_status } => {
                let res = self.detach(&va, volume, clear_status).await;
                if let Err(e) = &res {
                    if e.recorded() {
                        self.record_detach_error(&va, e).await;
                    }
                }
                res
            }
        }
    }

    pub(super) fn node_id(
        &self,
        va: &VolumeAttachment,
        for_detach: bool,
    ) -> Result<String, NodeIdError> {
        let node = &va.spec.node_name;
        let csinode = self.csinodes.get(&ObjectRef::new(node));
        let meta = self.nodes.get(&ObjectRef::new(node));
        node::node_id(
            &self.cfg.driver_name,
            node,
            csinode.as_deref(),
            meta.as_ref().and_then(|m| m.metadata.annotations.as_ref()),
            for_detach.then_some(va),
        )
    }

    /// One GET; secrets are not cached (they are not ours to hold).
    async fn secrets(
        &self,
        r: Option<SecretRef>,
    ) -> Result<std::collections::HashMap<String, String>, SyncError> {
        let Some(r) = r else {
            return Ok(Default::default());
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &r.namespace);
        let secret = api.get(&r.name).await.map_err(|source| SyncError::Secret {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            source,
        })?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }

    async fn attach(
        &self,
        va: &VolumeAttachment,
        volume: Volume<'_>,
        add_pv_finalizer: bool,
        add_va_finalizer: bool,
    ) -> Result<(), SyncError> {
        let name = va.name_any();
        // Everything that can fail without a write is checked first: a
        // finalizer added for an attach that cannot happen would only hold
        // up the object's deletion.
        let spec = volume.csi_spec()?.ok_or(RequestError::NotCsi)?;
        let node_id = self.node_id(va, false)?;
        let mut req =
            request::publish_request(&spec, &node_id, self.cfg.caps, &self.cfg.default_fs_type)?;
        req.secrets = self.secrets(request::publish_secret_ref(&spec)?).await?;

        if add_pv_finalizer {
            if let Volume::Pv(pv) = volume {
                let pv_name = pv.name_any();
                let api: Api<PersistentVolume> = Api::all(self.client.clone());
                let patched = api
                    .patch(
                        &pv_name,
                        &PatchParams::default(),
                        &Patch::Strategic(status::add_finalizer(&self.finalizer, None)),
                    )
                    .await
                    .map_err(SyncError::PvFinalizer)?;
                self.metrics.wrote(Write::PvFinalizer);
                // The API server refuses new finalizers on an object being
                // deleted, so a PV that got its deletionTimestamp meanwhile
                // fails above; one that already had ours is checked here.
                if patched.metadata.deletion_timestamp.is_some() {
                    self.pvs.wrote(patched);
                    return Err(Refusal::PvDeleting(pv_name).into());
                }
                self.pvs.wrote(patched);
            }
        }
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let mut current = va.clone();
        if add_va_finalizer {
            current = api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Strategic(status::add_finalizer(&self.finalizer, Some(&node_id))),
                )
                .await
                .map_err(SyncError::SaveVa)?;
            self.metrics.wrote(Write::VaFinalizer);
            self.vas.wrote(current.clone());
        }

        tracing::info!(volume = %req.volume_id, node = %node_id, "attaching");
        let publish_context = {
            let _permit = self.calls.acquire().await;
            csi::publish(&self.driver, req, self.cfg.timeout).await
        }
        .map_err(SyncError::Csi)?;
        self.mark_attached(&current, &publish_context).await?;
        tracing::info!("attached");
        Ok(())
    }

    async fn mark_attached(
        &self,
        va: &VolumeAttachment,
        publish_context: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), SyncError> {
        let old = va
            .status
            .as_ref()
            .and_then(|s| s.attachment_metadata.as_ref());
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let patched = api
            .patch_status(
                &va.name_any(),
                &PatchParams::default(),
                &Patch::Merge(status::attached(old, publish_context)),
            )
            .await
            .map_err(SyncError::MarkAttached)?;
        self.metrics.wrote(Write::VaStatus);
        self.vas.wrote(patched);
        Ok(())
    }

    async fn detach(
        &self,
        va: &VolumeAttachment,
        volume: Volume<'_>,
        clear_status: bool,
    ) -> Result<(), SyncError> {
        let name = va.name_any();
        let spec = match volume {
            Volume::MissingPv(pv) => return Err(Refusal::PvMissing(pv.to_string()).into()),
            Volume::Invalid => return Err(Refusal::BadSource.into()),
            v => v.csi_spec()?.ok_or(RequestError::NotCsi)?,
        };
        let node_id = self.node_id(va, true)?;
        let mut req = request::unpublish_request(&spec, &node_id)?;
        req.secrets = self.secrets(request::publish_secret_ref(&spec)?).await?;
        tracing::info!(volume = %req.volume_id, node = %node_id, "detaching");
        {
            let _permit = self.calls.acquire().await;
            csi::unpublish(&self.driver, req, self.cfg.timeout).await
        }
        .map_err(SyncError::Csi)?;
        if clear_status {
            let api: Api<VolumeAttachment> = Api::all(self.client.clone());
            let patched = api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(status::detached()),
                )
                .await
                .map_err(SyncError::MarkDetached)?;
            self.metrics.wrote(Write::VaStatus);
            self.vas.wrote(patched);
        }
        self.remove_va_finalizer(va).await?;
        tracing::info!("detached");
        Ok(())
    }

    async fn remove_va_finalizer(&self, va: &VolumeAttachment) -> Result<(), SyncError> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        match api
            .patch(
                &va.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(status::remove_finalizer(&self.finalizer)),
            )
            .await
        {
            Ok(patched) => {
                self.metrics.wrote(Write::VaFinalizer);
                self.vas.wrote(patched);
                Ok(())
            }
            // Gone already: nothing left to release.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(SyncError::MarkDetached(e)),
        }
    }

    async fn record_attach_error(&self, va: &VolumeAttachment, err: &SyncError) {
        self.record_error(va, err, false).await;
    }

    async fn record_detach_error(&self, va: &VolumeAttachment, err: &SyncError) {
        self.record_error(va, err, true).await;
    }

    /// `attachError` (or `detachError`) and an Event, unless the same message
    /// is already on record: another identical write and Event on every
    /// retry would only load the API server.
    async fn record_error(&self, va: &VolumeAttachment, err: &SyncError, detach: bool) {
        let message = chain(err).to_string();
        let code = err.csi_code();
        let recorded = va.status.as_ref().and_then(|s| {
            if detach {
                s.detach_error.as_ref()
            } else {
                s.attach_error.as_ref()
            }
        });
        // The message alone decides: a CSI error's message names its code,
        // and a server whose MutableCSINodeAllocatableCount gate is off
        // drops `errorCode`, which must not make every retry a new write.
        if recorded.and_then(|e| e.message.as_deref())
            == Some(truncate(&message, status::MAX_ERROR_MESSAGE))
        {
            return;
        }
        let (patch, reason, action) = if detach {
            (
                status::detach_error(&message, code, now()),
                REASON_DETACH_FAILED,
                "Detach",
            )
        } else {
            (
                status::attach_error(&message, code, now()),
                REASON_ATTACH_FAILED,
                "Attach",
            )
        };
        self.record(va, patch, reason, action, &message).await;
    }

    /// The error into the status and an Event; failures to record are only
    /// logged (the sync's own error is what drives the retry).
    async fn record(
        &self,
        va: &VolumeAttachment,
        patch: serde_json::Value,
        reason: &str,
        action: &str,
        message: &str,
    ) {
        let name = va.name_any();
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(patched) => {
                self.metrics.wrote(Write::VaStatus);
                self.vas.wrote(patched);
            }
            Err(e) => {
                tracing::warn!(error = %chain(&e), "could not save the error to the status")
            }
        }
        let reference = ObjectReference {
            api_version: Some("storage.k8s.io/v1".into()),
            kind: Some("VolumeAttachment".into()),
            name: Some(name.clone()),
            uid: va.metadata.uid.clone(),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(truncate(message, status::MAX_ERROR_MESSAGE).to_string()),
            action: action.into(),
            secondary: None,
        };
        match self.recorder.publish(&event, &reference).await {
            Ok(()) => self.metrics.wrote(Write::Event),
            Err(e) => tracing::warn!(error = %chain(&e), "could not record an Event"),
        }
    }

    /// One PersistentVolume: drop our finalizer once it is being deleted and
    /// no VolumeAttachment refers to it.
    pub(super) async fn sync_pv(&self, name: &str) -> Result<(), SyncError> {
        let Some(pv) = self.pvs.get_named(name) else {
            return Ok(());
        };
        if pv.metadata.deletion_timestamp.is_none() {
            return Ok(());
        }
        let referenced = !self.vas.store().by_index(name).is_empty();
        if decide::pv_action(&pv, &self.finalizer, referenced) != PvAction::RemoveFinalizer {
            return Ok(());
        }
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Strategic(status::remove_finalizer(&self.finalizer)),
            )
            .await
        {
            Ok(patched) => {
                self.metrics.wrote(Write::PvFinalizer);
                tracing::info!("removed the finalizer from the PersistentVolume");
                self.pvs.wrote(patched);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(SyncError::PvFinalizerRemove(e)),
        }
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

#[cfg(test)]
mod tests;
