//! `kubernetes.io/vsphere-volume` ↔ `csi.vsphere.vmware.com`.
//!
//! - class: the in-tree parameters the driver knows move to its
//!   `…-migrationparam` names (`datastore`, `diskformat` and the vSAN
//!   policy ones), `fstype` to `csi.storage.k8s.io/fstype`,
//!   `storagepolicyname` stays; any other parameter is dropped (the driver
//!   would refuse it); `csimigration: "true"` asks the driver for the
//!   volume's file path in the volume context (`initialvolumefilepath`),
//!   which is what the in-tree source names. Allowed topologies move to the
//!   driver's zone key;
//! - volume: the handle is the volume path; zone and region move between
//!   Kubernetes' keys and the driver's zone and region keys.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, Volume, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{self, add_requirement, allowed_topologies, replace_key, values};
use super::{csi_of, inline_pv, non_empty, MigrationError, Plugin, CSI_FS_TYPE_KEY, FS_TYPE_KEY};

const DRIVER: &str = Plugin::Vsphere.driver_name();
/// The driver's zone and region topology keys.
pub const ZONE_KEY: &str = "topology.csi.vmware.com/zone";
pub const REGION_KEY: &str = "topology.csi.vmware.com/region";
const STORAGE_POLICY_NAME: &str = "storagepolicyname";
const CSI_MIGRATION: &str = "csimigration";
/// The volume context key of the created volume's file path.
pub const INITIAL_VOLUME_FILE_PATH: &str = "initialvolumefilepath";

/// In-tree parameter → the driver's name for it.
fn driver_param(lower: &str) -> Option<&'static str> {
    Some(match lower {
        FS_TYPE_KEY => CSI_FS_TYPE_KEY,
        STORAGE_POLICY_NAME => STORAGE_POLICY_NAME,
        "datastore" => "datastore-migrationparam",
        "diskformat" => "diskformat-migrationparam",
        "hostfailurestotolerate" => "hostfailurestotolerate-migrationparam",
        "forceprovisioning" => "forceprovisioning-migrationparam",
        "cachereservation" => "cachereservation-migrationparam",
        "diskstripes" => "diskstripes-migrationparam",
        "objectspacereservation" => "objectspacereservation-migrationparam",
        "iopslimit" => "iopslimit-migrationparam",
        _ => return None,
    })
}

pub(super) fn storage_class(sc: &mut StorageClass) {
    let mut params = BTreeMap::new();
    for (k, v) in sc.parameters.iter().flatten() {
        match driver_param(&k.to_lowercase()) {
            Some(name) => {
                params.insert(name.to_string(), v.clone());
            }
            None => {
                tracing::debug!(parameter = %k, "vSphere StorageClass parameter not supported by the CSI driver; dropped")
            }
        }
    }
    params.insert(CSI_MIGRATION.to_string(), "true".to_string());
    if let Some(terms) = sc.allowed_topologies.as_mut().filter(|t| !t.is_empty()) {
        *terms = allowed_topologies(terms, ZONE_KEY);
    }
    sc.parameters = Some(params);
}

fn csi_source(
    path: &str,
    fs_type: Option<&str>,
    policy: Option<&str>,
) -> CSIPersistentVolumeSource {
    let attributes: BTreeMap<String, String> = policy
        .filter(|p| !p.is_empty())
        .map(|p| (STORAGE_POLICY_NAME.to_string(), p.to_string()))
        .into_iter()
        .collect();
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: path.to_string(),
        fs_type: fs_type.and_then(non_empty),
        volume_attributes: (!attributes.is_empty()).then_some(attributes),
        ..Default::default()
    }
}

pub(super) fn pv_to_csi(pv: &mut PersistentVolume) {
    let Some(source) = pv.spec.as_ref().and_then(|s| s.vsphere_volume.clone()) else {
        return;
    };
    let csi = csi_source(
        &source.volume_path,
        source.fs_type.as_deref(),
        source.storage_policy_name.as_deref(),
    );
    // Zone, then region: each from node affinity, else from its label (one
    // value, not split: vSphere volumes are in one zone).
    let (zone_key, region_key) = topology::zone_region_keys(pv);
    for (k8s_key, csi_key) in [(zone_key, ZONE_KEY), (region_key, REGION_KEY)] {
        if !values(pv, k8s_key).is_empty() {
            replace_key(pv, k8s_key, csi_key);
        } else if let Some(label) = pv
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k8s_key))
            .filter(|l| !l.is_empty())
            .cloned()
        {
            add_requirement(pv, csi_key, &[&label]);
        }
    }
    let spec = pv.spec.get_or_insert_default();
    spec.vsphere_volume = None;
    spec.csi = Some(csi);
}

pub(super) fn pv_to_in_tree(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let csi = csi_of(pv)?;
    let (zone_key, region_key) = topology::zone_region_keys(pv);
    replace_key(pv, ZONE_KEY, zone_key);
    replace_key(pv, REGION_KEY, region_key);
    // One zone and one region label: the first of each, if not there yet.
    for key in [zone_key, region_key] {
        if let Some(first) = values(pv, key).into_iter().next() {
            pv.metadata
                .labels
                .get_or_insert_default()
                .entry(key.to_string())
                .or_insert(first);
        }
    }
    let spec = pv.spec.get_or_insert_default();
    spec.csi = None;
    spec.vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
        volume_path: csi
            .volume_attributes
            .as_ref()
            .and_then(|a| a.get(INITIAL_VOLUME_FILE_PATH))
            .cloned()
            .unwrap_or_default(),
        fs_type: csi.fs_type.filter(|f| !f.is_empty()),
        storage_policy_id: None,
        storage_policy_name: None,
    });
    Ok(())
}

pub(super) fn inline_to_csi(volume: &Volume) -> PersistentVolume {
    let source = volume.vsphere_volume.clone().unwrap_or_default();
    // The storage policy is carried over from the pod's volume;
    // csi-translation-lib v0.34 reads it from the PV it is making (still
    // without a vSphere source) and crashes instead.
    let csi = csi_source(
        &source.volume_path,
        source.fs_type.as_deref(),
        source.storage_policy_name.as_deref(),
    );
    inline_pv(
        format!("{DRIVER}-{}", source.volume_path),
        csi,
        "ReadWriteOnce",
    )
}
