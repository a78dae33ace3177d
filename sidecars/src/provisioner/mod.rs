//! `csiops-sidecar provisioner`: the external-provisioner behaviour of the
//! upstream README and the CSI design doc. This part is the pure decision
//! logic, each piece a function of its inputs with table-driven tests:
//!
//! - [`naming`]: `<--volume-name-prefix>-<PVC UID>`, the volume and PV name;
//! - [`params`]: StorageClass parameters → CreateVolume parameters (reserved
//!   `csi.storage.k8s.io/` keys stripped), per-operation secret references
//!   with their templates, fsType, `--extra-create-metadata`;
//! - [`capabilities`]: access modes and volume mode → CSI volume
//!   capabilities, the claim's size → capacity range, the check of the size
//!   the driver answered with ([`quantity`] reads and writes quantities);
//! - [`topology`]: requisite/preferred accessibility requirements, per the
//!   README's table;
//! - [`pv`]: the PersistentVolume for a created volume;
//! - [`plan`]: the above composed into the two steps around CreateVolume.

pub mod capabilities;
pub mod naming;
pub mod params;
pub mod plan;
pub mod pv;
pub mod quantity;
pub mod topology;

pub use plan::{
    finish, prepare, Cluster, DriverCapabilities, FinishError, PrepareError, Prepared,
    ProvisionerConfig,
};
