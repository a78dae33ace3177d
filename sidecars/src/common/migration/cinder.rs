//! `kubernetes.io/cinder` ↔ `cinder.csi.openstack.org`.
//!
//! - class: `fstype` → `csi.storage.k8s.io/fstype`; everything else passes
//!   as it is (the driver reads `availability` itself, so it is not turned
//!   into topology); allowed topologies move to [`TOPOLOGY_KEY`];
//! - volume: the handle is the Cinder volume ID; the zone moves between
//!   [`TOPOLOGY_KEY`] and Kubernetes' zone key (no region: a Cinder zone
//!   does not name its region).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, PersistentVolume, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{self, allowed_topologies};
use super::{csi_of, csi_param_name, inline_pv, non_empty, only_true, MigrationError, Plugin};

const DRIVER: &str = Plugin::Cinder.driver_name();
/// The driver's zonal topology key.
pub const TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";

pub(super) fn storage_class(sc: &mut StorageClass) {
    let mut params = BTreeMap::new();
    for (k, v) in sc.parameters.iter().flatten() {
        params.insert(csi_param_name(k).to_string(), v.clone());
    }
    if let Some(terms) = sc.allowed_topologies.as_mut().filter(|t| !t.is_empty()) {
        *terms = allowed_topologies(terms, TOPOLOGY_KEY);
    }
    sc.parameters = (!params.is_empty()).then_some(params);
}

fn csi_source(
    volume_id: &str,
    fs_type: Option<&str>,
    read_only: Option<bool>,
) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: volume_id.to_string(),
        read_only: only_true(read_only.unwrap_or(false)),
        fs_type: fs_type.and_then(non_empty),
        ..Default::default()
    }
}

pub(super) fn pv_to_csi(pv: &mut PersistentVolume) {
    let Some(source) = pv.spec.as_ref().and_then(|s| s.cinder.clone()) else {
        return;
    };
    let csi = csi_source(
        &source.volume_id,
        source.fs_type.as_deref(),
        source.read_only,
    );
    topology::in_tree_to_csi(pv, TOPOLOGY_KEY);
    let spec = pv.spec.get_or_insert_default();
    spec.cinder = None;
    spec.csi = Some(csi);
}

pub(super) fn pv_to_in_tree(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let csi = csi_of(pv)?;
    topology::csi_to_in_tree(pv, TOPOLOGY_KEY, None)?;
    let spec = pv.spec.get_or_insert_default();
    spec.csi = None;
    spec.cinder = Some(CinderPersistentVolumeSource {
        volume_id: csi.volume_handle,
        fs_type: csi.fs_type.filter(|f| !f.is_empty()),
        read_only: only_true(csi.read_only.unwrap_or(false)),
        secret_ref: None,
    });
    Ok(())
}

pub(super) fn inline_to_csi(volume: &Volume) -> PersistentVolume {
    let source = volume.cinder.clone().unwrap_or_default();
    let csi = csi_source(
        &source.volume_id,
        source.fs_type.as_deref(),
        source.read_only,
    );
    inline_pv(
        format!("{DRIVER}-{}", source.volume_id),
        csi,
        "ReadWriteOnce",
    )
}
