//! Why a claim sync failed. Below the claim sync and the node-deployment
//! race ([`super::super::become_owner`]) alike, which both report it, so
//! neither has to import the other's module for it.

use std::time::Duration;

use tonic::Status;

use crate::provisioner::content_source::ResolveError;
use crate::provisioner::csi::rpc;
use crate::provisioner::journal::JournalError;
use crate::provisioner::naming::NamingError;
use crate::provisioner::node_deployment;
use crate::provisioner::plan::{FinishError, PrepareError};
use crate::provisioner::secrets::SecretError;

/// Why a claim is not provisioned yet (each becomes a Warning Event on the
/// claim and a retry with backoff).
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("storageclass.storage.k8s.io {0:?} not found")]
    ClassMissing(String),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Naming(#[from] NamingError),
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    ContentSource(#[from] ResolveError),
    #[error("failed to provision volume with StorageClass {class:?}: {}", rpc(.status))]
    Create { class: String, status: Status },
    #[error("the driver refused this claim's CreateVolume as infeasible; the next attempt is in {left:?}")]
    RecentlyInfeasible { left: Duration },
    #[error("the created volume is unusable ({error}); it was deleted and will be created again")]
    Unusable { error: FinishError },
    #[error("the created volume is unusable ({error}) and deleting it failed: {}", rpc(.status))]
    UnusableNotDeleted { error: FinishError, status: Status },
    #[error("cannot build the PV")]
    Pv(#[source] FinishError),
    #[error("PV {0:?} exists and belongs to another claim")]
    PvTaken(String),
    #[error("the claim was deleted and re-created while being provisioned")]
    Recreated,
    #[error("the claim no longer needs volume {volume:?} (deleted, or bound to another PV) and cleaning it up failed: {}", rpc(.status))]
    CleanUpFailed { volume: String, status: Status },
    #[error("the claim no longer needs volume {volume:?} (deleted, bound to another PV, or moved to another node), and whether that volume exists cannot be told: {why}. Delete it on the storage backend if it exists, then remove finalizer {finalizer} from the claim")]
    CleanUpBlocked {
        volume: String,
        why: String,
        finalizer: String,
    },
    #[error("cannot record the intent to provision volume {volume:?}")]
    Journal {
        volume: String,
        source: JournalError,
    },
    #[error("cannot select node {node:?} for the claim")]
    BecomeOwner {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("PV {pv:?}: cannot tell which node holds its volume")]
    Affinity {
        pv: String,
        #[source]
        source: node_deployment::AffinityError,
    },
    #[error("PV {pv:?}: cannot translate the in-tree PV to CSI")]
    Migration {
        pv: String,
        #[source]
        source: crate::common::migration::MigrationError,
    },
    /// Not this node's claim yet, and not ready to be: retried with
    /// backoff, without an Event (see [`ClaimError::quiet`]).
    #[error("{0}")]
    NotYet(&'static str),
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
}

impl ClaimError {
    /// Retried without an Event or a failure counted: node deployment's
    /// waits on claims that are not this node's (an Event from each node
    /// would flood the claim).
    pub fn quiet(&self) -> bool {
        matches!(self, ClaimError::NotYet(_))
    }

    /// The driver refused the request as infeasible (see [`crate::provisioner::infeasible`]).
    pub fn infeasible(&self) -> bool {
        matches!(self, ClaimError::Create { status, .. } if crate::provisioner::infeasible::is_infeasible(status))
    }

    /// The Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ClaimError::CleanUpFailed { .. } | ClaimError::CleanUpBlocked { .. } => {
                "ProvisioningCleanupFailed"
            }
            _ => "ProvisioningFailed",
        }
    }
}
