//! What the claim asks for, in CSI terms: volume capabilities (access mode ×
//! block or mount) and the capacity range; and the check of the size the
//! driver answered with.
//!
//! Access modes map as csi-lib-utils' `accessmodes` table does, one CSI
//! capability per claim access mode (upstream calls it with one mode at a time):
//!
//! | claim access mode | driver without SINGLE_NODE_MULTI_WRITER | with it |
//! |---|---|---|
//! | ReadWriteOnce    | SINGLE_NODE_WRITER      | SINGLE_NODE_MULTI_WRITER  |
//! | ReadOnlyMany     | MULTI_NODE_READER_ONLY  | MULTI_NODE_READER_ONLY    |
//! | ReadWriteMany    | MULTI_NODE_MULTI_WRITER | MULTI_NODE_MULTI_WRITER   |
//! | ReadWriteOncePod | SINGLE_NODE_WRITER      | SINGLE_NODE_SINGLE_WRITER |

use csiops_proto::csi::v1::volume_capability::access_mode::Mode;
use csiops_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csiops_proto::csi::v1::{CapacityRange, VolumeCapability};
use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;

use super::quantity::{self, QuantityError};

pub const READ_WRITE_ONCE: &str = "ReadWriteOnce";
pub const READ_ONLY_MANY: &str = "ReadOnlyMany";
pub const READ_WRITE_MANY: &str = "ReadWriteMany";
pub const READ_WRITE_ONCE_POD: &str = "ReadWriteOncePod";
pub const VOLUME_MODE_BLOCK: &str = "Block";
pub const VOLUME_MODE_FILESYSTEM: &str = "Filesystem";
/// The resource name of a claim's size.
pub const STORAGE: &str = "storage";

/// What the driver said it can do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCapabilities {
    /// Plugin VOLUME_ACCESSIBILITY_CONSTRAINTS (and topology enabled).
    pub topology: bool,
    /// Controller SINGLE_NODE_MULTI_WRITER.
    pub single_node_multi_writer: bool,
    /// Controller CREATE_DELETE_SNAPSHOT: restore from a snapshot.
    pub create_delete_snapshot: bool,
    /// Controller CLONE_VOLUME: a claim as data source.
    pub clone_volume: bool,
    /// Controller PUBLISH_UNPUBLISH_VOLUME: the volumes get
    /// VolumeAttachments (a node's provisioner watches them only then).
    pub publish_unpublish: bool,
    /// Controller MODIFY_VOLUME: claims may name a VolumeAttributesClass.
    pub modify_volume: bool,
}

/// Why the claim cannot be expressed as a CreateVolume request, or the
/// driver's answer does not fit it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    #[error("the claim has no access modes")]
    NoAccessModes,
    #[error("unsupported access mode {0:?}")]
    UnknownAccessMode(String),
    #[error("ReadWriteOncePod cannot be combined with other access modes")]
    ReadWriteOncePodWithOthers,
    #[error("unsupported volume mode {0:?}")]
    UnknownVolumeMode(String),
    #[error("the claim requests no storage (spec.resources.requests.storage)")]
    NoStorageRequest,
    #[error("spec.resources.{field}.storage")]
    Quantity {
        field: &'static str,
        source: QuantityError,
    },
    #[error("storage limit {limit} is below the request {request}")]
    LimitBelowRequest { request: i64, limit: i64 },
    #[error("the driver reported a negative capacity {0}")]
    NegativeCapacity(i64),
    #[error("created volume capacity {provisioned} less than requested capacity {required}")]
    TooSmall { provisioned: i64, required: i64 },
    #[error("created volume capacity {provisioned} exceeds the claim's limit {limit}")]
    TooLarge { provisioned: i64, limit: i64 },
}

/// The CSI access mode of one claim access mode.
pub fn access_mode(mode: &str, single_node_multi_writer: bool) -> Result<Mode, CapabilityError> {
    Ok(match mode {
        READ_WRITE_ONCE if single_node_multi_writer => Mode::SingleNodeMultiWriter,
        READ_WRITE_ONCE => Mode::SingleNodeWriter,
        READ_ONLY_MANY => Mode::MultiNodeReaderOnly,
        READ_WRITE_MANY => Mode::MultiNodeMultiWriter,
        READ_WRITE_ONCE_POD if single_node_multi_writer => Mode::SingleNodeSingleWriter,
        // "This mapping exists to enable CSI drivers that lack the
        // SINGLE_NODE_MULTI_WRITER capability to work with the
        // ReadWriteOncePod access mode." (csi-lib-utils)
        READ_WRITE_ONCE_POD => Mode::SingleNodeWriter,
        other => return Err(CapabilityError::UnknownAccessMode(other.to_string())),
    })
}

/// Whether the claim asks for a raw block volume (`volumeMode: Block`);
/// absent means Filesystem.
pub fn is_block(spec: &PersistentVolumeClaimSpec) -> Result<bool, CapabilityError> {
    match spec.volume_mode.as_deref() {
        None | Some(VOLUME_MODE_FILESYSTEM) => Ok(false),
        Some(VOLUME_MODE_BLOCK) => Ok(true),
        Some(other) => Err(CapabilityError::UnknownVolumeMode(other.to_string())),
    }
}

/// `CreateVolumeRequest.volume_capabilities`: one per distinct access mode,
/// in the claim's order; Block, or Mount with the filesystem type and the
/// class's mount options.
pub fn volume_capabilities(
    spec: &PersistentVolumeClaimSpec,
    fs_type: Option<&str>,
    mount_options: &[String],
    single_node_multi_writer: bool,
) -> Result<Vec<VolumeCapability>, CapabilityError> {
    let mut modes: Vec<&str> = Vec::new();
    for m in spec.access_modes.iter().flatten() {
        if !modes.contains(&m.as_str()) {
            modes.push(m);
        }
    }
    if modes.is_empty() {
        return Err(CapabilityError::NoAccessModes);
    }
    if modes.len() > 1 && modes.contains(&READ_WRITE_ONCE_POD) {
        return Err(CapabilityError::ReadWriteOncePodWithOthers);
    }
    let access_type = if is_block(spec)? {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: fs_type.unwrap_or_default().to_string(),
            mount_flags: mount_options.to_vec(),
            volume_mount_group: String::new(),
        })
    };
    modes
        .into_iter()
        .map(|m| {
            Ok(VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: access_mode(m, single_node_multi_writer)? as i32,
                }),
                access_type: Some(access_type.clone()),
            })
        })
        .collect()
}

/// `CreateVolumeRequest.capacity_range`: the claim's storage request as
/// `required_bytes` (rounded up to a byte) and its storage limit, if any, as
/// `limit_bytes` (0 = no limit).
pub fn capacity_range(spec: &PersistentVolumeClaimSpec) -> Result<CapacityRange, CapabilityError> {
    let resources = spec.resources.as_ref();
    let bytes = |field: &'static str, q| {
        quantity::to_bytes(q).map_err(|source| CapabilityError::Quantity { field, source })
    };
    let request = resources
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(STORAGE))
        .ok_or(CapabilityError::NoStorageRequest)?;
    let required_bytes = bytes("requests", request)?;
    let limit_bytes = match resources
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(STORAGE))
    {
        Some(q) => {
            let limit = bytes("limits", q)?;
            if limit < required_bytes {
                return Err(CapabilityError::LimitBelowRequest {
                    request: required_bytes,
                    limit,
                });
            }
            limit
        }
        None => 0,
    };
    Ok(CapacityRange {
        required_bytes,
        limit_bytes,
    })
}

/// The PV's capacity from `Volume.capacity_bytes` — the final size check after
/// the driver rounded the request. 0 means unknown ("According to CSI spec
/// CreateVolume should be able to return capacity = 0, which means it is
/// unknown"), and the request stands in; less than requested (or more than
/// the limit) is an error, and the caller must delete the volume it got.
pub fn provisioned_capacity(
    requested: &CapacityRange,
    capacity_bytes: i64,
) -> Result<i64, CapabilityError> {
    match capacity_bytes {
        0 => Ok(requested.required_bytes),
        n if n < 0 => Err(CapabilityError::NegativeCapacity(n)),
        n if n < requested.required_bytes => Err(CapabilityError::TooSmall {
            provisioned: n,
            required: requested.required_bytes,
        }),
        n if requested.limit_bytes > 0 && n > requested.limit_bytes => {
            Err(CapabilityError::TooLarge {
                provisioned: n,
                limit: requested.limit_bytes,
            })
        }
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::VolumeResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn spec(modes: &[&str], volume_mode: Option<&str>) -> PersistentVolumeClaimSpec {
        PersistentVolumeClaimSpec {
            access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
            volume_mode: volume_mode.map(str::to_string),
            ..Default::default()
        }
    }

    fn mount(fs: &str, flags: &[&str], mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                mount_flags: flags.iter().map(|f| f.to_string()).collect(),
                volume_mount_group: String::new(),
            })),
        }
    }

    fn block(mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Block(BlockVolume {})),
        }
    }

    #[test]
    fn access_modes() {
        use Mode::*;
        // (claim mode, driver has SINGLE_NODE_MULTI_WRITER, CSI mode)
        let cases: &[(&str, bool, Result<Mode, CapabilityError>)] = &[
            (READ_WRITE_ONCE, false, Ok(SingleNodeWriter)),
            (READ_WRITE_ONCE, true, Ok(SingleNodeMultiWriter)),
            (READ_ONLY_MANY, false, Ok(MultiNodeReaderOnly)),
            (READ_ONLY_MANY, true, Ok(MultiNodeReaderOnly)),
            (READ_WRITE_MANY, false, Ok(MultiNodeMultiWriter)),
            (READ_WRITE_MANY, true, Ok(MultiNodeMultiWriter)),
            (READ_WRITE_ONCE_POD, false, Ok(SingleNodeWriter)),
            (READ_WRITE_ONCE_POD, true, Ok(SingleNodeSingleWriter)),
            (
                "WriteOnly",
                false,
                Err(CapabilityError::UnknownAccessMode("WriteOnly".into())),
            ),
        ];
        for (mode, snmw, want) in cases {
            assert_eq!(access_mode(mode, *snmw), *want, "{mode} {snmw}");
        }
    }

    #[test]
    fn capabilities() {
        use Mode::*;
        let opts = vec!["noatime".to_string(), "discard".to_string()];
        type Case<'a> = (
            &'a str,
            PersistentVolumeClaimSpec,
            Option<&'a str>,
            bool,
            Result<Vec<VolumeCapability>, CapabilityError>,
        );
        let cases: Vec<Case> = vec![
            (
                "filesystem with fstype and mount options",
                spec(&[READ_WRITE_ONCE], None),
                Some("ext4"),
                false,
                Ok(vec![mount(
                    "ext4",
                    &["noatime", "discard"],
                    SingleNodeWriter,
                )]),
            ),
            (
                "explicit Filesystem, no fstype",
                spec(&[READ_WRITE_MANY], Some(VOLUME_MODE_FILESYSTEM)),
                None,
                false,
                Ok(vec![mount(
                    "",
                    &["noatime", "discard"],
                    MultiNodeMultiWriter,
                )]),
            ),
            (
                "block ignores fstype and mount options",
                spec(&[READ_WRITE_ONCE], Some(VOLUME_MODE_BLOCK)),
                Some("ext4"),
                true,
                Ok(vec![block(SingleNodeMultiWriter)]),
            ),
            (
                "one capability per access mode, duplicates dropped",
                spec(
                    &[READ_WRITE_ONCE, READ_ONLY_MANY, READ_WRITE_ONCE],
                    Some(VOLUME_MODE_BLOCK),
                ),
                None,
                false,
                Ok(vec![block(SingleNodeWriter), block(MultiNodeReaderOnly)]),
            ),
            (
                "RWOP alone",
                spec(&[READ_WRITE_ONCE_POD], Some(VOLUME_MODE_BLOCK)),
                None,
                true,
                Ok(vec![block(SingleNodeSingleWriter)]),
            ),
            (
                // csi-lib-utils: "ReadWriteOncePod ... Cannot be combined with any AccessMode"
                "RWOP with others",
                spec(&[READ_WRITE_ONCE_POD, READ_WRITE_ONCE], None),
                None,
                true,
                Err(CapabilityError::ReadWriteOncePodWithOthers),
            ),
            (
                "no access modes",
                spec(&[], None),
                None,
                false,
                Err(CapabilityError::NoAccessModes),
            ),
            (
                "unknown volume mode",
                spec(&[READ_WRITE_ONCE], Some("Raw")),
                None,
                false,
                Err(CapabilityError::UnknownVolumeMode("Raw".into())),
            ),
        ];
        for (name, s, fs, snmw, want) in cases {
            assert_eq!(volume_capabilities(&s, fs, &opts, snmw), want, "{name}");
        }
    }

    fn sized(request: Option<&str>, limit: Option<&str>) -> PersistentVolumeClaimSpec {
        let map = |q: Option<&str>| {
            q.map(|q| BTreeMap::from([(STORAGE.to_string(), Quantity(q.to_string()))]))
        };
        PersistentVolumeClaimSpec {
            resources: Some(VolumeResourceRequirements {
                requests: map(request),
                limits: map(limit),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn capacity_ranges() {
        let range = |required_bytes, limit_bytes| CapacityRange {
            required_bytes,
            limit_bytes,
        };
        let cases: Vec<(
            &str,
            PersistentVolumeClaimSpec,
            Result<CapacityRange, CapabilityError>,
        )> = vec![
            // CSI design doc: "The `CreateVolume` capacity will be taken from
            // the `PersistentVolumeClaim` object."
            (
                "request only",
                sized(Some("1Gi"), None),
                Ok(range(1 << 30, 0)),
            ),
            (
                "decimal request",
                sized(Some("1G"), None),
                Ok(range(1_000_000_000, 0)),
            ),
            (
                "fractions round up",
                sized(Some("1500m"), None),
                Ok(range(2, 0)),
            ),
            (
                "request and limit",
                sized(Some("1Gi"), Some("2Gi")),
                Ok(range(1 << 30, 2 << 30)),
            ),
            (
                "limit equal to request",
                sized(Some("1Gi"), Some("1Gi")),
                Ok(range(1 << 30, 1 << 30)),
            ),
            (
                "limit below request",
                sized(Some("2Gi"), Some("1Gi")),
                Err(CapabilityError::LimitBelowRequest {
                    request: 2 << 30,
                    limit: 1 << 30,
                }),
            ),
            (
                "no request",
                sized(None, Some("1Gi")),
                Err(CapabilityError::NoStorageRequest),
            ),
            (
                "no resources",
                PersistentVolumeClaimSpec::default(),
                Err(CapabilityError::NoStorageRequest),
            ),
            (
                "bad request",
                sized(Some("lots"), None),
                Err(CapabilityError::Quantity {
                    field: "requests",
                    source: QuantityError::Syntax("lots".into()),
                }),
            ),
            (
                "bad limit",
                sized(Some("1Gi"), Some("-1Gi")),
                Err(CapabilityError::Quantity {
                    field: "limits",
                    source: QuantityError::Negative("-1Gi".into()),
                }),
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(capacity_range(&s), want, "{name}");
        }
    }

    #[test]
    fn provisioned_sizes() {
        let gi = 1i64 << 30;
        let unlimited = CapacityRange {
            required_bytes: gi,
            limit_bytes: 0,
        };
        let limited = CapacityRange {
            required_bytes: gi,
            limit_bytes: 2 * gi,
        };
        let cases: &[(&str, &CapacityRange, i64, Result<i64, CapabilityError>)] = &[
            ("exact", &unlimited, gi, Ok(gi)),
            ("rounded up by the driver", &unlimited, 5 * gi, Ok(5 * gi)),
            ("unknown (0) uses the request", &unlimited, 0, Ok(gi)),
            (
                "smaller than requested",
                &unlimited,
                gi - 1,
                Err(CapabilityError::TooSmall {
                    provisioned: gi - 1,
                    required: gi,
                }),
            ),
            ("within the limit", &limited, 2 * gi, Ok(2 * gi)),
            (
                "beyond the limit",
                &limited,
                2 * gi + 1,
                Err(CapabilityError::TooLarge {
                    provisioned: 2 * gi + 1,
                    limit: 2 * gi,
                }),
            ),
            (
                "negative",
                &unlimited,
                -1,
                Err(CapabilityError::NegativeCapacity(-1)),
            ),
        ];
        for (name, range, got, want) in cases {
            assert_eq!(provisioned_capacity(range, *got), *want, "{name}");
        }
    }
}
