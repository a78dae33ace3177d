//! ControllerPublishVolume / ControllerUnpublishVolume requests built from
//! the volume's spec (the PV's, or a VolumeAttachment's inline spec), the
//! way upstream builds them, so drivers see the same calls after an image
//! swap:
//!
//! - volume capability: `volumeMode: Block` → block; otherwise mount with
//!   the PV's `csi.fsType` (else `--default-fstype`) and `mountOptions`;
//! - access mode from all of the PV's access modes at once, per
//!   csi-lib-utils' `ToCSIAccessMode` (see [`access_mode`]);
//! - `readonly` from `csi.readOnly`, forced false when the driver lacks
//!   PUBLISH_READONLY (the CSI spec says the CO MUST);
//! - volume context from `csi.volumeAttributes`;
//! - secrets from `csi.controllerPublishSecretRef`, for both calls. The
//!   secret is read by the caller (one GET; secrets are never cached), so
//!   this module stays pure.

use std::collections::BTreeSet;

use csiops_proto::csi::v1::volume_capability::access_mode::Mode;
use csiops_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use csiops_proto::csi::v1::{
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, VolumeCapability,
};
use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};

/// The driver's controller capabilities that change the requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishCaps {
    /// PUBLISH_READONLY.
    pub publish_readonly: bool,
    /// SINGLE_NODE_MULTI_WRITER.
    pub single_node_multi_writer: bool,
}

/// A Secret by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

/// Why the spec cannot become a request. Permanent until the object changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the volume is not a CSI volume (spec.csi is missing)")]
    NotCsi,
    #[error("spec.csi.volumeHandle is empty")]
    NoVolumeHandle,
    #[error("the volume has no access modes")]
    NoAccessModes,
    #[error("CSI does not support ReadWriteOncePod with other access modes on the same PersistentVolume")]
    ReadWriteOncePodWithOthers,
    #[error("CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume")]
    ReadOnlyManyWithReadWriteOnce,
    #[error("unsupported access modes {0:?}")]
    UnsupportedAccessModes(Vec<String>),
    #[error("unsupported volume mode {0:?}")]
    UnknownVolumeMode(String),
    #[error("controllerPublishSecretRef has an empty name or namespace")]
    IncompleteSecretRef,
}

/// The CSI source of a volume spec.
pub fn csi_source(spec: &PersistentVolumeSpec) -> Result<&CSIPersistentVolumeSource, RequestError> {
    let csi = spec.csi.as_ref().ok_or(RequestError::NotCsi)?;
    if csi.volume_handle.is_empty() {
        return Err(RequestError::NoVolumeHandle);
    }
    Ok(csi)
}

/// The access mode of a PV's access modes taken together (csi-lib-utils).
pub fn access_mode(modes: &[String], single_node_multi_writer: bool) -> Result<Mode, RequestError> {
    let set: BTreeSet<&str> = modes.iter().map(String::as_str).collect();
    let rwo = set.contains("ReadWriteOnce");
    let rox = set.contains("ReadOnlyMany");
    let rwx = set.contains("ReadWriteMany");
    let rwop = set.contains("ReadWriteOncePod");
    if set.is_empty() {
        return Err(RequestError::NoAccessModes);
    }
    if rwop {
        if set.len() > 1 {
            return Err(RequestError::ReadWriteOncePodWithOthers);
        }
        return Ok(if single_node_multi_writer {
            Mode::SingleNodeSingleWriter
        } else {
            Mode::SingleNodeWriter
        });
    }
    if rwx {
        // ReadWriteMany wins over whatever else is listed.
        return Ok(Mode::MultiNodeMultiWriter);
    }
    match (rox, rwo) {
        (true, true) if single_node_multi_writer => Ok(Mode::MultiNodeSingleWriter),
        (true, true) => Err(RequestError::ReadOnlyManyWithReadWriteOnce),
        (true, false) => Ok(Mode::MultiNodeReaderOnly),
        (false, true) if single_node_multi_writer => Ok(Mode::SingleNodeMultiWriter),
        (false, true) => Ok(Mode::SingleNodeWriter),
        (false, false) => Err(RequestError::UnsupportedAccessModes(modes.to_vec())),
    }
}

/// The one volume capability of a publish.
pub fn volume_capability(
    spec: &PersistentVolumeSpec,
    caps: PublishCaps,
    default_fs_type: &str,
) -> Result<VolumeCapability, RequestError> {
    let csi = csi_source(spec)?;
    let access_type = match spec.volume_mode.as_deref() {
        Some("Block") => AccessType::Block(BlockVolume {}),
        None | Some("Filesystem") => {
            let fs_type = csi
                .fs_type
                .as_deref()
                .filter(|f| !f.is_empty())
                .unwrap_or(default_fs_type);
            AccessType::Mount(MountVolume {
                fs_type: fs_type.to_string(),
                mount_flags: spec.mount_options.clone().unwrap_or_default(),
                volume_mount_group: String::new(),
            })
        }
        Some(other) => return Err(RequestError::UnknownVolumeMode(other.to_string())),
    };
    let mode = access_mode(
        spec.access_modes.as_deref().unwrap_or_default(),
        caps.single_node_multi_writer,
    )?;
    Ok(VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(access_type),
    })
}

/// The Secret `controllerPublishSecretRef` names, if any.
pub fn publish_secret_ref(spec: &PersistentVolumeSpec) -> Result<Option<SecretRef>, RequestError> {
    let Some(r) = csi_source(spec)?.controller_publish_secret_ref.as_ref() else {
        return Ok(None);
    };
    let namespace = r.namespace.clone().unwrap_or_default();
    let name = r.name.clone().unwrap_or_default();
    if name.is_empty() || namespace.is_empty() {
        return Err(RequestError::IncompleteSecretRef);
    }
    Ok(Some(SecretRef { namespace, name }))
}

/// ControllerPublishVolume without secrets (the caller adds them).
pub fn publish_request(
    spec: &PersistentVolumeSpec,
    node_id: &str,
    caps: PublishCaps,
    default_fs_type: &str,
) -> Result<ControllerPublishVolumeRequest, RequestError> {
    let csi = csi_source(spec)?;
    Ok(ControllerPublishVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        node_id: node_id.to_string(),
        volume_capability: Some(volume_capability(spec, caps, default_fs_type)?),
        // "The CO MUST set this field to false if SP does not have the
        // PUBLISH_READONLY controller capability." (CSI spec)
        readonly: caps.publish_readonly && csi.read_only.unwrap_or(false),
        secrets: Default::default(),
        volume_context: csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
    })
}

/// ControllerUnpublishVolume without secrets (the caller adds them).
pub fn unpublish_request(
    spec: &PersistentVolumeSpec,
    node_id: &str,
) -> Result<ControllerUnpublishVolumeRequest, RequestError> {
    let csi = csi_source(spec)?;
    Ok(ControllerUnpublishVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        node_id: node_id.to_string(),
        secrets: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::SecretReference;
    use std::collections::BTreeMap;

    fn modes(m: &[&str]) -> Vec<String> {
        m.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn access_modes_like_csi_lib_utils() {
        use Mode::*;
        // (modes, SINGLE_NODE_MULTI_WRITER?, expected)
        let ok: &[(&[&str], bool, Mode)] = &[
            (&["ReadWriteOnce"], false, SingleNodeWriter),
            (&["ReadWriteOnce"], true, SingleNodeMultiWriter),
            (&["ReadOnlyMany"], false, MultiNodeReaderOnly),
            (&["ReadOnlyMany"], true, MultiNodeReaderOnly),
            (&["ReadWriteMany"], false, MultiNodeMultiWriter),
            (
                &["ReadWriteMany", "ReadWriteOnce"],
                false,
                MultiNodeMultiWriter,
            ),
            (
                &["ReadOnlyMany", "ReadWriteMany"],
                true,
                MultiNodeMultiWriter,
            ),
            (&["ReadWriteOncePod"], false, SingleNodeWriter),
            (&["ReadWriteOncePod"], true, SingleNodeSingleWriter),
            (
                &["ReadOnlyMany", "ReadWriteOnce"],
                true,
                MultiNodeSingleWriter,
            ),
            (&["ReadWriteOnce", "ReadWriteOnce"], false, SingleNodeWriter),
        ];
        for (m, snmw, want) in ok {
            assert_eq!(access_mode(&modes(m), *snmw), Ok(*want), "{m:?} {snmw}");
        }
        let bad: &[(&[&str], bool, RequestError)] = &[
            (&[], false, RequestError::NoAccessModes),
            (
                &["ReadWriteOncePod", "ReadWriteOnce"],
                true,
                RequestError::ReadWriteOncePodWithOthers,
            ),
            (
                &["ReadOnlyMany", "ReadWriteOnce"],
                false,
                RequestError::ReadOnlyManyWithReadWriteOnce,
            ),
            (
                &["Sometimes"],
                false,
                RequestError::UnsupportedAccessModes(modes(&["Sometimes"])),
            ),
        ];
        for (m, snmw, want) in bad {
            assert_eq!(access_mode(&modes(m), *snmw).as_ref(), Err(want), "{m:?}");
        }
    }

    fn spec() -> PersistentVolumeSpec {
        PersistentVolumeSpec {
            access_modes: Some(modes(&["ReadWriteOnce"])),
            mount_options: Some(modes(&["noatime", "ro"])),
            csi: Some(CSIPersistentVolumeSource {
                driver: "d".into(),
                volume_handle: "vol-1".into(),
                fs_type: Some("xfs".into()),
                read_only: Some(true),
                volume_attributes: Some(BTreeMap::from([("k".into(), "v".into())])),
                controller_publish_secret_ref: Some(SecretReference {
                    name: Some("s".into()),
                    namespace: Some("ns".into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn publish_request_from_the_pv() {
        let caps = PublishCaps {
            publish_readonly: true,
            single_node_multi_writer: false,
        };
        let r = publish_request(&spec(), "node-a", caps, "ext4").expect("request");
        assert_eq!(r.volume_id, "vol-1");
        assert_eq!(r.node_id, "node-a");
        assert!(r.readonly);
        assert!(r.secrets.is_empty());
        assert_eq!(r.volume_context.get("k").map(String::as_str), Some("v"));
        let cap = r.volume_capability.expect("capability");
        assert_eq!(
            cap.access_mode.map(|m| m.mode),
            Some(Mode::SingleNodeWriter as i32)
        );
        match cap.access_type {
            Some(AccessType::Mount(m)) => {
                assert_eq!(m.fs_type, "xfs");
                assert_eq!(m.mount_flags, modes(&["noatime", "ro"]));
            }
            other => panic!("expected mount, got {other:?}"),
        }
    }

    #[test]
    fn readonly_needs_the_capability() {
        let r = publish_request(&spec(), "n", PublishCaps::default(), "").expect("request");
        assert!(!r.readonly);
    }

    #[test]
    fn fs_type_falls_back_to_the_default_and_block_has_none() {
        let mut s = spec();
        if let Some(csi) = s.csi.as_mut() {
            csi.fs_type = None;
        }
        let cap = volume_capability(&s, PublishCaps::default(), "ext4").expect("cap");
        assert!(matches!(cap.access_type, Some(AccessType::Mount(ref m)) if m.fs_type == "ext4"));
        let cap = volume_capability(&s, PublishCaps::default(), "").expect("cap");
        assert!(matches!(cap.access_type, Some(AccessType::Mount(ref m)) if m.fs_type.is_empty()));
        s.volume_mode = Some("Block".into());
        let cap = volume_capability(&s, PublishCaps::default(), "ext4").expect("cap");
        assert!(matches!(cap.access_type, Some(AccessType::Block(_))));
        s.volume_mode = Some("Tape".into());
        assert_eq!(
            volume_capability(&s, PublishCaps::default(), "ext4"),
            Err(RequestError::UnknownVolumeMode("Tape".into()))
        );
    }

    #[test]
    fn secret_refs_and_broken_specs() {
        assert_eq!(
            publish_secret_ref(&spec()),
            Ok(Some(SecretRef {
                namespace: "ns".into(),
                name: "s".into()
            }))
        );
        let mut s = spec();
        if let Some(csi) = s.csi.as_mut() {
            csi.controller_publish_secret_ref = Some(SecretReference {
                name: Some("s".into()),
                namespace: None,
            });
        }
        assert_eq!(
            publish_secret_ref(&s),
            Err(RequestError::IncompleteSecretRef)
        );
        if let Some(csi) = s.csi.as_mut() {
            csi.controller_publish_secret_ref = None;
        }
        assert_eq!(publish_secret_ref(&s), Ok(None));
        if let Some(csi) = s.csi.as_mut() {
            csi.volume_handle.clear();
        }
        assert_eq!(
            unpublish_request(&s, "n").map(|r| r.volume_id),
            Err(RequestError::NoVolumeHandle)
        );
        s.csi = None;
        assert_eq!(
            publish_request(&s, "n", PublishCaps::default(), "").map(|r| r.volume_id),
            Err(RequestError::NotCsi)
        );
        let u = unpublish_request(&spec(), "node-b").expect("unpublish");
        assert_eq!(
            (u.volume_id.as_str(), u.node_id.as_str()),
            ("vol-1", "node-b")
        );
    }
}
