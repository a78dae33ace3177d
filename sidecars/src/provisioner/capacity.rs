//! CSIStorageCapacity publishing (`--enable-capacity`), as external-provisioner
//! v6.3.0's central capacity controller does it: for every topology segment
//! of the nodes that run the driver and every StorageClass of the driver
//! with late binding, one `CSIStorageCapacity` in the provisioner's
//! namespace holding what GetCapacity answered, so the scheduler can place
//! pods where their volumes fit.
//!
//! - [`args`]: the flags and the `NAMESPACE`/`POD_NAME` environment;
//! - [`objects`]: the pure part — segments from CSINodes and Node labels,
//!   which (segment, class) pairs to track, which existing objects are ours
//!   and which of them serve a pair (adoption) or are obsolete, the object
//!   to create and whether one needs an update;
//! - [`owner`]: the owner reference, walked up from the pod;
//! - [`controller`]: the planner and the workers, run by the leader only
//!   (in node deployment by every node, each for its own segment, with
//!   managed-by `external-provisioner-<node>`).

pub mod args;
pub mod controller;
pub mod objects;
pub mod owner;

pub use args::{CapacityArgs, CapacityEnv};
pub use controller::{CapacityController, CapacityMetrics, CapacitySetup};

/// Why capacity publishing cannot start.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("--enable-capacity needs the NAMESPACE environment variable (the namespace of the CSIStorageCapacity objects; set it from the downward API, metadata.namespace)")]
    NoNamespace,
    #[error("--capacity-ownerref-level={level} needs the POD_NAME environment variable (set it from the downward API, metadata.name), or --capacity-ownerref-level=-1 for objects without an owner")]
    NoPodName { level: i64 },
    /// Boxed: kube's errors are large, and this one is rare.
    #[error(transparent)]
    Owner(Box<owner::OwnerError>),
    #[error(transparent)]
    Kube(#[from] crate::common::kube::KubeError),
}

impl From<owner::OwnerError> for CapacityError {
    fn from(e: owner::OwnerError) -> Self {
        CapacityError::Owner(Box::new(e))
    }
}
