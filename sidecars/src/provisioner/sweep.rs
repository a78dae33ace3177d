//! The journal sweep: for one intent, find out whether the volume it may
//! stand for is still wanted, and delete it if not (see
//! [`super::journal`] for when intents are swept and why this is enough).
//!
//! The volume is found by sending the stored CreateVolume request again
//! (idempotent by name: an existing volume comes back). When the driver
//! cannot answer that — it refuses the request (InvalidArgument,
//! OutOfRange, Unimplemented: a driver upgraded since may reject an older
//! request) or the name is taken by another request (AlreadyExists) —
//! nothing proves that no volume exists: the intent stays, the sweep is
//! [blocked](SweepError::is_blocked), and that is reported (a warning, a
//! Warning Event `VolumeCleanupBlocked` on the journal ConfigMap, and the
//! `csiops_provisioner_journal_blocked_intents` gauge) and retried with
//! backoff, until the driver answers or an admin removes the key.
//!
//! Nothing read from the journal is trusted (see [`super::trust`]): an
//! intent whose key is not its request's volume, or whose Secret is not
//! what its StorageClass gives, is [untrusted](SweepError::Untrusted):
//! no Secret is read, no CSI call made, and it is reported as blocked.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use tonic::{Code, Status};

use super::context::Context;
use super::csi::{self, rpc};
use super::journal::{intent_action, IntentAction, Record};
use super::node_deployment::{AffinityError, PvSeen};
use super::secrets::{self, SecretError};
use super::trust;

/// How soon an intent a claim sync holds is looked at again.
const HELD_RETRY: Duration = Duration::from_secs(2);

/// Why an abandoned volume was not cleaned up yet (logged; retried).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("the journal's request for volume {volume:?} does not decode ({source}); delete the volume on the storage backend if it exists, then remove key {volume:?} from the journal ConfigMap")]
    Corrupt {
        volume: String,
        source: prost::DecodeError,
    },
    #[error("the claim {claim} no longer needs volume {volume:?}, and its provisioner Secret cannot be read to delete it")]
    Secret {
        volume: String,
        claim: String,
        source: SecretError,
    },
    #[error("the claim {claim} no longer needs volume {volume:?}, and whether that volume exists cannot be told: {}. Delete it on the storage backend if it exists, then remove key {volume:?} from the journal ConfigMap", rpc(.status))]
    Blocked {
        volume: String,
        claim: String,
        status: Status,
    },
    #[error("the claim {claim} no longer needs volume {volume:?}, and the driver refuses the stored CreateVolume request that would find it ({}), so whether that volume exists cannot be told (a driver upgraded since may reject an older request). The intent is kept and tried again; if the volume exists, delete it on the storage backend, then remove key {volume:?} from the journal ConfigMap", rpc(.status))]
    Refused {
        volume: String,
        claim: String,
        status: Status,
    },
    #[error("the claim {claim} no longer needs volume {volume:?}, and cleaning it up failed: {}", rpc(.status))]
    Failed {
        volume: String,
        claim: String,
        status: Status,
    },
    #[error("the journal's intent for volume {volume:?} (claim {claim}) is not one this provisioner could have written: {why}. Nothing was read or deleted; if it is a forgery remove key {volume:?} from the journal ConfigMap, if a volume really leaked delete it on the storage backend first")]
    Untrusted {
        volume: String,
        claim: String,
        why: super::trust::Distrust,
    },
    #[error("cannot tell which node holds the volume of the claim's PV")]
    Affinity(#[from] AffinityError),
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
}

impl SweepError {
    /// Whether the sweep cannot tell if the volume exists (not a passing
    /// failure): the intent stays and a human may be needed.
    pub fn is_blocked(&self) -> bool {
        matches!(
            self,
            SweepError::Blocked { .. }
                | SweepError::Refused { .. }
                | SweepError::Corrupt { .. }
                | SweepError::Untrusted { .. }
        )
    }
}

pub async fn sync_intent(cx: &Context, name: &str) -> Result<(), SweepError> {
    let Some(journal) = &cx.journal else {
        return Ok(());
    };
    let Some(record) = journal.get(name) else {
        return Ok(());
    };
    // A claim sync works on it: look again once it is done.
    let Some(_hold) = cx.holds.take(name) else {
        cx.intents.add_after(name.to_string(), HELD_RETRY);
        return Ok(());
    };
    // The server's word, not the caches': the sweep runs at leader start
    // and right after deletions, when the caches may lag.
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(cx.client.clone(), &record.claim.namespace);
    let claim = claims.get_opt(&record.claim.name).await?;
    let volumes: Api<PersistentVolume> = Api::all(cx.client.clone());
    let pv = volumes.get_opt(name).await?;
    let (pv, node) = match &cx.node {
        // Centrally the PV, if any, is the volume's.
        None => (
            if pv.is_some() {
                PvSeen::Here
            } else {
                PvSeen::Absent
            },
            None,
        ),
        // Never guessed: an affinity that cannot be read stops the sweep.
        Some(node) => {
            let seen = match &pv {
                None => PvSeen::Absent,
                Some(pv) if node.local.holds(pv)? => PvSeen::Here,
                Some(_) => PvSeen::Elsewhere,
            };
            (seen, Some(node.name()))
        }
    };
    let action = intent_action(name, &record, claim.as_ref(), pv, false, node);
    // An intent an earlier leader left without a PV: it stopped between
    // the intent and the PV (killed, or the Lease lost).
    if journal.take_inherited(name) && pv == PvSeen::Absent {
        cx.metrics.journal.recovered(action);
    }
    match action {
        IntentAction::Keep => {
            // The claim's own sync provisions it (again) and trims.
            cx.claims
                .add(ObjectRef::new(&record.claim.name).within(&record.claim.namespace));
            Ok(())
        }
        IntentAction::Trim => {
            journal.trim(name);
            Ok(())
        }
        IntentAction::CleanUp => {
            let verified = claim
                .as_ref()
                .is_some_and(|c| c.metadata.uid.as_deref() == Some(record.claim.uid.as_str()));
            delete_abandoned(cx, name, &record, verified).await?;
            journal.trim(name);
            Ok(())
        }
    }
}

/// CreateVolume with the stored request returns the volume if it exists
/// (and creates it if it did not, which the DeleteVolume that follows
/// undoes). No answer but a volume tells whether it exists: a refusal of
/// the request leaves the intent, as AlreadyExists does.
async fn delete_abandoned(
    cx: &Context,
    name: &str,
    record: &Record,
    claim_verified: bool,
) -> Result<(), SweepError> {
    let claim = format!("{}/{}", record.claim.namespace, record.claim.name);
    let mut request = record.request().map_err(|source| SweepError::Corrupt {
        volume: name.to_string(),
        source,
    })?;
    // The class from the server, and only when the intent names a
    // Secret (the check needs it then only).
    let class = match record.secret {
        Some(_) => {
            Api::<StorageClass>::all(cx.client.clone())
                .get_opt(&record.class)
                .await?
        }
        None => None,
    };
    let secret = trust::check(
        name,
        record,
        &request.name,
        class.as_ref(),
        &cx.config.driver_name,
        claim_verified,
    )
    .map_err(|why| SweepError::Untrusted {
        volume: name.to_string(),
        claim: claim.clone(),
        why,
    })?;
    if let Some(secret) = secret {
        request.secrets = secrets::fetch(&cx.client, &secret)
            .await
            .map_err(|source| SweepError::Secret {
                volume: name.to_string(),
                claim: claim.clone(),
                source,
            })?;
    }
    let secrets = request.secrets.clone();
    let _permit = cx.calls.acquire().await;
    match cx.create_volume(request).await {
        Ok(volume) => {
            cx.delete_volume(&volume.volume_id, secrets)
                .await
                .map_err(|status| SweepError::Failed {
                    volume: name.to_string(),
                    claim: claim.clone(),
                    status,
                })?;
            tracing::info!(%claim, volume = %volume.volume_id, "deleted the volume of a claim that no longer needs it");
            Ok(())
        }
        // The name is taken by a volume this request does not match: it
        // may be ours, so it must not be forgotten.
        Err(status) if status.code() == Code::AlreadyExists => Err(SweepError::Blocked {
            volume: name.to_string(),
            claim,
            status,
        }),
        // This call made nothing, but the call the intent stands for may
        // have: a driver upgraded since may refuse the older request.
        Err(status) if csi::rejects_request(&status) => Err(SweepError::Refused {
            volume: name.to_string(),
            claim,
            status,
        }),
        Err(status) => Err(SweepError::Failed {
            volume: name.to_string(),
            claim,
            status,
        }),
    }
}
