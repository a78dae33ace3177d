//! `kubernetes.io/portworx-volume` ↔ `pxd.portworx.com`.
//!
//! - class: the OpenStorage auth Secret (`openstorage.io/auth-secret-name`
//!   and `-namespace`) becomes each of the six `csi.storage.k8s.io/…-secret-…`
//!   pairs (provisioner, controller publish and expand, node stage, publish
//!   and expand); everything else passes as it is; the provisioner becomes
//!   the driver's name;
//! - volume: the handle is the Portworx volume ID; a PV's auth Secret
//!   (the same two keys as annotations) becomes its five secret
//!   references. The CSI source does not carry readOnly (as upstream: an
//!   inline read-only volume is ReadOnlyMany instead).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PortworxVolumeSource, SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{csi_of, inline_pv, non_empty, only_true, MigrationError, Plugin};

const DRIVER: &str = Plugin::Portworx.driver_name();
pub const AUTH_SECRET_NAME_KEY: &str = "openstorage.io/auth-secret-name";
pub const AUTH_SECRET_NAMESPACE_KEY: &str = "openstorage.io/auth-secret-namespace";
/// The operations whose Secret the auth Secret becomes.
const SECRET_KINDS: [&str; 6] = [
    "provisioner",
    "controller-publish",
    "node-publish",
    "node-stage",
    "controller-expand",
    "node-expand",
];

pub(super) fn storage_class(sc: &mut StorageClass) {
    let mut params = BTreeMap::new();
    for (k, v) in sc.parameters.iter().flatten() {
        let suffix = match k.to_lowercase().as_str() {
            AUTH_SECRET_NAME_KEY => "name",
            AUTH_SECRET_NAMESPACE_KEY => "namespace",
            _ => {
                params.insert(k.clone(), v.clone());
                continue;
            }
        };
        for kind in SECRET_KINDS {
            params.insert(
                format!("csi.storage.k8s.io/{kind}-secret-{suffix}"),
                v.clone(),
            );
        }
    }
    // An empty set of parameters leaves the class's own as they were.
    if !params.is_empty() {
        sc.parameters = Some(params);
    }
    sc.provisioner = DRIVER.to_string();
}

fn csi_source(volume_id: &str, fs_type: Option<&str>) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: volume_id.to_string(),
        fs_type: fs_type.and_then(non_empty),
        ..Default::default()
    }
}

pub(super) fn pv_to_csi(pv: &mut PersistentVolume) {
    let Some(source) = pv.spec.as_ref().and_then(|s| s.portworx_volume.clone()) else {
        return;
    };
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    let secret = match (
        annotations.get(AUTH_SECRET_NAME_KEY),
        annotations.get(AUTH_SECRET_NAMESPACE_KEY),
    ) {
        (Some(name), Some(namespace)) => Some(SecretReference {
            name: non_empty(name),
            namespace: non_empty(namespace),
        }),
        _ => None,
    };
    let csi = CSIPersistentVolumeSource {
        controller_publish_secret_ref: secret.clone(),
        node_stage_secret_ref: secret.clone(),
        node_publish_secret_ref: secret.clone(),
        controller_expand_secret_ref: secret.clone(),
        node_expand_secret_ref: secret,
        ..csi_source(&source.volume_id, source.fs_type.as_deref())
    };
    let spec = pv.spec.get_or_insert_default();
    spec.portworx_volume = None;
    spec.csi = Some(csi);
}

pub(super) fn pv_to_in_tree(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let csi = csi_of(pv)?;
    let spec = pv.spec.get_or_insert_default();
    spec.csi = None;
    spec.portworx_volume = Some(PortworxVolumeSource {
        volume_id: csi.volume_handle,
        fs_type: csi.fs_type.filter(|f| !f.is_empty()),
        read_only: only_true(csi.read_only.unwrap_or(false)),
    });
    Ok(())
}

pub(super) fn inline_to_csi(volume: &Volume) -> PersistentVolume {
    let source = volume.portworx_volume.clone().unwrap_or_default();
    let mode = if source.read_only.unwrap_or(false) {
        "ReadOnlyMany"
    } else {
        "ReadWriteOnce"
    };
    let csi = csi_source(&source.volume_id, source.fs_type.as_deref());
    inline_pv(format!("{DRIVER}-{}", source.volume_id), csi, mode)
}
