//! The sweep's one decision about an intent, as a pure function of what
//! the server shows now: keep it, trim it, or clean its volume up.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;

use super::Record;
use crate::provisioner::node_deployment::{self, PvSeen};

/// What the sweep does with one intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentAction {
    /// A claim sync is working on it, or the claim still wants the volume:
    /// that claim's sync finishes the job (and trims).
    Keep,
    /// The PV exists (it holds the volume now), or the claim is bound to it.
    Trim,
    /// Nobody wants the volume: CreateVolume with the stored request, delete
    /// what it returns, then trim.
    CleanUp,
}

/// The sweep's decision for the intent of volume `name`, from the server's
/// current claim (by the intent's namespace/name) and its PV (`pv`: absent,
/// or where its volume is; centrally it is always [`PvSeen::Here`]).
/// `node` is the provisioner's node in node deployment: there the volume is
/// this node's only while the claim is, so a claim now selected elsewhere
/// (or nowhere), a PV another node made, or a PV of the claim that came
/// and went (whose node cannot be told) means cleaning up here.
pub fn intent_action(
    name: &str,
    record: &Record,
    claim: Option<&PersistentVolumeClaim>,
    pv: PvSeen,
    held: bool,
    node: Option<&str>,
) -> IntentAction {
    if held {
        return IntentAction::Keep;
    }
    match pv {
        PvSeen::Here => return IntentAction::Trim,
        PvSeen::Elsewhere => return IntentAction::CleanUp,
        PvSeen::Absent => {}
    }
    let Some(claim) = claim.filter(|c| c.uid().as_deref() == Some(record.claim.uid.as_str()))
    else {
        // Gone, or re-created under the same name (a new UID, a new volume).
        return IntentAction::CleanUp;
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return IntentAction::CleanUp;
    }
    match claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
    {
        None => match node {
            Some(node) if node_deployment::selected_node(claim) != Some(node) => {
                IntentAction::CleanUp
            }
            _ => IntentAction::Keep,
        },
        // Bound to our PV, which is gone since: its deletion dealt with the
        // volume (reclaim policy), nothing is left to us. On a node, that PV
        // may have been another node's.
        Some(v) if v == name && node.is_none() => IntentAction::Trim,
        // Bound to another PV: our volume is nobody's.
        Some(_) => IntentAction::CleanUp,
    }
}
