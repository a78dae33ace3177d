//! One claim's sync: provision it, let go of it, or clean up after it.
//!
//! Provisioning is ordered so that no crash can leak a volume:
//! 1. the intent goes into the journal ([`super::journal`]; batched with
//!    other claims' intents into one write). Without a journal (no RBAC for
//!    it) [`decide::CLAIM_FINALIZER`] goes on the claim instead;
//! 2. CreateVolume, named after the claim UID (idempotent across retries
//!    and restarts);
//! 3. the PV is created (it now carries the volume's lifecycle);
//! 4. the intent is trimmed (or the finalizer comes off), off the critical
//!    path.
//!
//! A crash before 3 leaves the intent: either the claim is still wanted and
//! the retry's CreateVolume returns the same volume, or the claim is gone
//! and the journal sweep ([`super::sweep`]) deletes the volume. A claim
//! still holding the finalizer (from the fallback, or an earlier version)
//! is cleaned up by [`clean_up`] before it is let go.
//!
//! In node deployment the central decision passes through
//! [`node_deployment::claim_action`] first: this node's claims only, the
//! race for unselected Immediate ones ([`super::become_owner`]), and this
//! node's own finalizer.

use std::time::{Duration, Instant};

use csiops_proto::csi::v1::CreateVolumeRequest;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tonic::{Code, Status};

use super::content_source::fetch;
use super::content_source::SourceKind;
use super::context::Context;
use super::csi::{self, rpc};
use super::decide::{self, ClaimAction, ClaimKey};
use super::journal::{Record, Recorded};
use super::metrics::Operation;
use super::plan::{self, PrepareError, Prepared};
use super::secrets::{self, SecretError};
use super::topology::TopologyError;
use super::{become_owner, finalizer, node_deployment, snapshot_protection, topology};
use csiops_runtime::chain;
use error::ClaimError;

pub mod error;

/// How soon a claim whose volume name the sweep holds is tried again.
const HELD_RETRY: Duration = Duration::from_millis(500);

/// One sync of the claim `key` names: what [`decide::claim_action`] (and on
/// a node [`node_deployment::claim_action`]) says, done.
pub async fn sync_claim(cx: &Context, key: &ClaimKey) -> Result<(), ClaimError> {
    let Some(claim) = cx.caches.claims.get(key) else {
        return Ok(());
    };
    let class = decide::class_name(&claim).and_then(|n| cx.caches.classes.get(&ObjectRef::new(n)));
    let pv_name = cx
        .config
        .namer
        .pv_name(claim.uid().as_deref().unwrap_or_default())?;
    let pv = cx.caches.volumes.get(&ObjectRef::new(&pv_name));
    let central = decide::claim_action(
        &claim,
        &cx.config.driver_name,
        class.as_deref(),
        &pv_name,
        pv.is_some(),
        cx.claim_finalizer(),
    );
    let action = match &cx.node {
        None => central,
        Some(node) => {
            let view = node.view(node.pv_seen(pv.as_deref()));
            let action = node_deployment::claim_action(central, &claim, class.as_deref(), view);
            if action != ClaimAction::BecomeOwner {
                // Selected (here or elsewhere), bound or gone: no race.
                node.races
                    .forget(claim.uid().as_deref().unwrap_or_default());
            }
            action
        }
    };
    match action {
        ClaimAction::Nothing(why) => {
            tracing::debug!(why, "nothing to do");
            Ok(())
        }
        ClaimAction::ClassMissing(name) => Err(ClaimError::ClassMissing(name)),
        ClaimAction::ReleaseClaim => set_claim_finalizer(cx, &claim, false).await.map(drop),
        ClaimAction::Provision => match class {
            Some(class) => {
                let (claim_uid, class_uid) = (
                    claim.uid().unwrap_or_default(),
                    class.uid().unwrap_or_default(),
                );
                let now = tokio::time::Instant::now();
                if let Some(left) = cx.infeasible.remaining(&claim_uid, &class_uid, now) {
                    return Err(ClaimError::RecentlyInfeasible { left });
                }
                let done = provision(cx, &claim, &class).await;
                if done.is_ok() {
                    cx.infeasible.forget(&claim_uid);
                }
                done
            }
            // claim_action decides Provision only with the class cached.
            None => Err(ClaimError::ClassMissing(
                decide::class_name(&claim).unwrap_or_default().to_string(),
            )),
        },
        ClaimAction::CleanUp => clean_up(cx, &claim, class.as_deref(), &pv_name).await,
        ClaimAction::BecomeOwner => match (&cx.node, class) {
            (Some(node), Some(class)) => become_owner::become_owner(cx, node, &claim, &class).await,
            // Decided only in node deployment, with the class cached.
            _ => Ok(()),
        },
        ClaimAction::RetryQuietly(why) => Err(ClaimError::NotYet(why)),
    }
}

/// Whether the PV carries this provisioner's volume: always centrally,
/// on a node if its affinity (under the driver's keys, for a migrated
/// in-tree PV) holds for the node.
fn holds(cx: &Context, pv: &PersistentVolume) -> Result<bool, ClaimError> {
    match &cx.node {
        None => Ok(true),
        Some(node) => {
            let csi =
                crate::common::migration::csi_view(pv).map_err(|source| ClaimError::Migration {
                    pv: pv.name_any(),
                    source,
                })?;
            node.local
                .holds(&csi)
                .map_err(|source| ClaimError::Affinity {
                    pv: pv.name_any(),
                    source,
                })
        }
    }
}

/// The CreateVolume request with the provisioner Secret's content.
async fn request_with_secrets(
    cx: &Context,
    prepared: &Prepared,
) -> Result<CreateVolumeRequest, SecretError> {
    let mut request = prepared.request.clone();
    if let Some(r) = &prepared.provisioner_secret {
        request.secrets = secrets::fetch(&cx.client, r).await?;
    }
    Ok(request)
}

async fn provision(
    cx: &Context,
    cached: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<(), ClaimError> {
    let started = Instant::now();
    let attributes_class = cx.attributes_class(cached).await?;
    let mut prepared = match cx.prepare(cached, class, attributes_class.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            // The scheduler chose a node that is gone: let it choose
            // again, as upstream does.
            if matches!(
                e,
                PrepareError::Topology(TopologyError::SelectedNodeNotFound(_))
            ) {
                reschedule(cx, cached).await?;
            }
            return Err(e.into());
        }
    };
    // One sync per volume name at a time: the journal sweep may be
    // looking at this claim's intent. It is quick; come back shortly.
    let Some(_hold) = cx.holds.take(&prepared.name) else {
        cx.claims.add_after(ObjectRef::from_obj(cached), HELD_RETRY);
        return Ok(());
    };
    let class_name = class.name_any();
    // A snapshot or claim to copy (see `content_source`).
    let resolved = fetch::content_source(cx, cached, class).await?;
    prepared.request.volume_content_source = resolved.as_ref().map(|r| r.content.clone());
    // 1. The intent first: from here on a volume may exist, and the
    //    journal says so whatever happens to the claim or to us.
    //    Whether one stood already (an earlier attempt of unknown
    //    outcome) decides what a refusal below proves.
    let (claim, recorded) = match &cx.journal {
        Some(journal) => {
            let record = Record::new(
                cached,
                &class_name,
                &prepared.request,
                prepared.provisioner_secret.as_ref(),
            );
            let recorded = journal
                .record(&prepared.name, record)
                .await
                .map_err(|source| ClaimError::Journal {
                    volume: prepared.name.clone(),
                    source,
                })?;
            (cached.clone(), recorded)
        }
        None => {
            let recorded = if decide::claim_has_finalizer(cached, cx.claim_finalizer()) {
                Recorded::Carried
            } else {
                Recorded::Fresh
            };
            let claim = set_claim_finalizer(cx, cached, true).await?;
            if claim.metadata.deletion_timestamp.is_some()
                || claim
                    .spec
                    .as_ref()
                    .and_then(|s| s.volume_name.as_ref())
                    .is_some()
            {
                // The cached claim was stale: it is bound or being
                // deleted now, and the watch event saying so is on its
                // way; that event brings the claim back here with the
                // right decision.
                return Ok(());
            }
            (claim, recorded)
        }
    };
    if let Some(resolved) = &resolved {
        fetch::protect_source(cx, resolved).await?;
    }
    // No "Provisioning" Event, unlike upstream: the PV controller's
    // ExternalProvisioning Event already says it, and every write counts
    // against --kube-api-qps.
    let request = request_with_secrets(cx, &prepared).await?;
    let secrets = request.secrets.clone();
    // 2. The volume.
    let created = {
        let _permit = cx.calls.acquire().await;
        cx.create_volume(request).await
    };
    let volume = match created {
        Ok(v) => v,
        Err(status) => {
            // A refusal of the request itself: this call made nothing.
            // If no earlier attempt of unknown outcome stood, there is
            // no volume, and nothing to remember (the claim, still
            // wanted, is retried). Otherwise an earlier call may have
            // made it (a driver upgraded since may refuse the same
            // request): the intent or finalizer stays.
            if csi::rejects_request(&status) {
                match recorded {
                    Recorded::Fresh if cx.journal.is_some() => trim(cx, &prepared.name),
                    Recorded::Fresh => {
                        set_claim_finalizer(cx, &claim, false).await?;
                    }
                    Recorded::Carried => tracing::warn!(
                        volume = %prepared.name, error = %rpc(&status),
                        "the driver refuses the request, but an earlier attempt may have made the volume: its intent stays"
                    ),
                }
            }
            if may_reschedule(cx, &claim, &status) {
                reschedule(cx, &claim).await?;
            }
            return Err(ClaimError::Create {
                class: class_name,
                status,
            });
        }
    };
    let pv = match plan::finish(&prepared, &claim, class, &cx.config, cx.caps, &volume) {
        Ok(pv) => pv,
        Err(error) if error.unusable() => {
            // Too small, or without the content asked for: no PV may
            // point at it; delete and start over.
            let _permit = cx.calls.acquire().await;
            return match cx.delete_volume(&volume.volume_id, secrets).await {
                Ok(()) => {
                    trim(cx, &prepared.name);
                    Err(ClaimError::Unusable { error })
                }
                Err(status) => Err(ClaimError::UnusableNotDeleted { error, status }),
            };
        }
        Err(e) => return Err(ClaimError::Pv(e)),
    };
    // 3. The PV.
    create_pv(cx, &pv, &claim).await?;
    // 4. The PV holds the volume now.
    if cx.journal.is_some() {
        trim(cx, &prepared.name);
    } else {
        set_claim_finalizer(cx, &claim, false).await?;
    }
    // A restored snapshot may go now.
    if let Some(r) = resolved
        .as_ref()
        .filter(|r| r.source.kind == SourceKind::Snapshot)
    {
        snapshot_protection::release_snapshot(cx, &r.source).await;
    }
    cx.metrics
        .succeeded(Operation::Provision, &class_name, started.elapsed());
    tracing::info!(pv = %prepared.name, volume = %volume.volume_id, "provisioned");
    cx.event(
        &claim,
        EventType::Normal,
        "ProvisioningSucceeded",
        format!("Successfully provisioned volume {}", prepared.name),
    )
    .await;
    Ok(())
}

/// Drops the journal's intent of `volume` (with a later write).
fn trim(cx: &Context, volume: &str) {
    if let Some(journal) = &cx.journal {
        journal.trim(volume);
    }
}

/// Whether to hand the claim back to the scheduler, as upstream does:
/// only with delayed binding (a selected node), a driver with topology
/// (another node changes the request) and an error saying the node's
/// storage is exhausted.
fn may_reschedule(cx: &Context, claim: &PersistentVolumeClaim, status: &Status) -> bool {
    cx.caps.topology
        && topology::selected_node(claim).is_some()
        && status.code() == Code::ResourceExhausted
}

/// Removes the selected-node annotations, so the scheduler picks again.
async fn reschedule(cx: &Context, claim: &PersistentVolumeClaim) -> Result<(), ClaimError> {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(cx.client.clone(), &claim.namespace().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"annotations": {
        topology::SELECTED_NODE_ANNOTATION: null,
        topology::ALPHA_SELECTED_NODE_ANNOTATION: null,
    }}});
    api.patch(
        &claim.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    tracing::info!(claim = %claim.name_any(), "storage exhausted on the selected node; rescheduling");
    Ok(())
}

/// Creates the PV; one already there for this claim (an earlier attempt)
/// is fine, one for another claim is an error.
async fn create_pv(
    cx: &Context,
    pv: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> Result<(), ClaimError> {
    let api: Api<PersistentVolume> = Api::all(cx.critical.clone());
    match api.create(&PostParams::default(), pv).await {
        Ok(created) => {
            cx.caches.volumes.wrote(created);
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            let name = pv.name_any();
            let existing = api.get(&name).await?;
            let claim_uid = existing
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.clone());
            // On a node, only a PV of this node's volume: another
            // node's PV for the claim leaves ours to the sweep.
            if claim_uid.is_some() && claim_uid == claim.uid() && holds(cx, &existing)? {
                cx.caches.volumes.wrote(existing);
                Ok(())
            } else {
                Err(ClaimError::PvTaken(name))
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// The claim holds our finalizer but no longer needs its volume: it was
/// deleted, or bound to another PV. If its PV exists, the PV's reclaim
/// policy takes it from here. If not, the volume may exist without any
/// object pointing at it: CreateVolume with the same name returns it if
/// it does (and creates it if it did not, which the DeleteVolume that
/// follows undoes), then the claim is let go.
async fn clean_up(
    cx: &Context,
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    pv_name: &str,
) -> Result<(), ClaimError> {
    // The cache may lag behind our own writes: a claim we let go a
    // moment ago may still show our finalizer there, and its volume is
    // deleted already. CreateVolume below would create it again, with
    // nothing left to delete it. So only the server's word counts.
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(cx.client.clone(), &claim.namespace().unwrap_or_default());
    let claim = match claims.get_opt(&claim.name_any()).await? {
        Some(fresh)
            if fresh.uid() == claim.uid()
                && decide::claim_has_finalizer(&fresh, cx.claim_finalizer()) =>
        {
            fresh
        }
        _ => return Ok(()),
    };
    let claim = &claim;
    // Likewise for a PV created a moment ago. On a node, another
    // node's PV for the claim does not hold this node's volume.
    let volumes: Api<PersistentVolume> = Api::all(cx.client.clone());
    if let Some(pv) = volumes.get_opt(pv_name).await? {
        if holds(cx, &pv)? {
            set_claim_finalizer(cx, claim, false).await?;
            return Ok(());
        }
    }
    let blocked = |why: String| ClaimError::CleanUpBlocked {
        volume: pv_name.to_string(),
        why,
        finalizer: cx.claim_finalizer().to_string(),
    };
    let class = class.ok_or_else(|| {
        blocked(format!(
            "StorageClass {:?} is gone",
            decide::class_name(claim).unwrap_or_default()
        ))
    })?;
    // Its VolumeAttributesClass too: a request without its mutable
    // parameters may not find the volume. A class deleted since blocks
    // the clean-up (said, with what to do).
    let attributes_class = cx
        .attributes_class(claim)
        .await
        .map_err(|e| blocked(chain(&e).to_string()))?;
    let mut prepared = cx
        .prepare(claim, class, attributes_class.as_deref())
        .map_err(|e| blocked(chain(&e).to_string()))?;
    // The same request as the provisioning's, content source included,
    // or a driver holding the volume answers AlreadyExists.
    prepared.request.volume_content_source = fetch::content_source(cx, claim, class)
        .await
        .map_err(|e| blocked(chain(&e).to_string()))?
        .map(|r| r.content);
    // A Secret deleted with its namespace blocks the clean-up: say so,
    // with what to do, rather than retry in silence.
    let request = request_with_secrets(cx, &prepared)
        .await
        .map_err(|e| blocked(chain(&e).to_string()))?;
    let secrets = request.secrets.clone();
    let permit = cx.calls.acquire().await;
    match cx.create_volume(request).await {
        Ok(volume) => {
            cx.delete_volume(&volume.volume_id, secrets)
                .await
                .map_err(|status| ClaimError::CleanUpFailed {
                    volume: pv_name.to_string(),
                    status,
                })?;
            tracing::info!(pv = %pv_name, volume = %volume.volume_id, "deleted the volume of a claim that no longer needs it");
        }
        // The name is taken by a volume this request does not match:
        // it may be ours, so it must not be forgotten.
        Err(status) if status.code() == Code::AlreadyExists => {
            return Err(blocked(rpc(&status)));
        }
        // The driver rejects the request itself: that proves nothing
        // about the volume the attempt that set the finalizer may have
        // made (the finalizer comes off at once when an attempt is
        // refused with nothing before it). Kept, said, and retried.
        Err(status) if csi::rejects_request(&status) => {
            return Err(blocked(format!(
                "the driver refuses the CreateVolume request that would find it ({}); a driver upgraded since may refuse an older request",
                rpc(&status)
            )));
        }
        Err(status) => {
            return Err(ClaimError::CleanUpFailed {
                volume: pv_name.to_string(),
                status,
            })
        }
    }
    drop(permit);
    set_claim_finalizer(cx, claim, false).await?;
    Ok(())
}

/// Adds (`present`) or removes [`Self::claim_finalizer`] (see [`finalizer`]
/// for the patches); when the patch no longer fits the claim, reads it
/// again and retries. Returns the claim as written.
async fn set_claim_finalizer(
    cx: &Context,
    claim: &PersistentVolumeClaim,
    present: bool,
) -> Result<PersistentVolumeClaim, ClaimError> {
    let namespace = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    // On: the volume waits for it. Off: the claim is bound (or gone)
    // already, so it waits behind the writes users wait on.
    let client = if present { &cx.client } else { &cx.bookkeeping };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let mut current = claim.clone();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let written = if present {
            let Some(patch) = finalizer::add(&current.metadata, cx.claim_finalizer()) else {
                return Ok(current);
            };
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        } else {
            let Some(patch) = finalizer::remove_at_index(&current.metadata, cx.claim_finalizer())
            else {
                return Ok(current);
            };
            api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
        };
        match written {
            Ok(written) => {
                cx.caches.claims.wrote(written.clone());
                return Ok(written);
            }
            // 409 for a stale version, 422 for a failed JSON-patch test.
            Err(kube::Error::Api(s)) if (s.is_conflict() || s.code == 422) && attempt <= 3 => {
                match api.get_opt(&name).await? {
                    Some(fresh) if fresh.uid() == claim.uid() => current = fresh,
                    // Gone: nothing holds a finalizer any more.
                    None if !present => return Ok(current),
                    _ => return Err(ClaimError::Recreated),
                }
            }
            Err(kube::Error::Api(s)) if s.is_not_found() && !present => return Ok(current),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests;
