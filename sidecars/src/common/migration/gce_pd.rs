//! `kubernetes.io/gce-pd` ↔ `pd.csi.storage.gke.io`.
//!
//! - class: `fstype` → `csi.storage.k8s.io/fstype`; `zone`/`zones` →
//!   allowed topologies under [`TOPOLOGY_KEY`]; anything else (`type`,
//!   `replication-type`, …) passes as it is: the driver reads the same
//!   names;
//! - volume: the handle is `projects/<project>/zones/<zone>/disks/<name>`
//!   (`regions/<region>` for a regional disk); the project, and the zone
//!   when the PV's labels do not say, are `UNSPECIFIED` (see
//!   [`repair_volume_handle`]); the disk name is the handle's sixth part;
//!   a partition travels as the `partition` attribute (empty for none);
//!   access modes are narrowed to what the driver accepts (see
//!   [`compatible_access_modes`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{self, zonal_class, BETA_ZONE, MULTI_ZONE_DELIMITER, ZONE};
use super::{
    atoi32, csi_of, csi_param_name, inline_pv, non_empty, only_true, MigrationError, Plugin,
};

const DRIVER: &str = Plugin::GcePd.driver_name();
/// The driver's zonal topology key.
pub const TOPOLOGY_KEY: &str = "topology.gke.io/zone";
/// A project or zone the translation cannot know.
pub const UNSPECIFIED: &str = "UNSPECIFIED";
const PARTITION: &str = "partition";
/// Parts of `projects/<p>/zones|regions/<z>/disks/<d>`.
const PARTS: usize = 6;

pub(super) fn storage_class(sc: &mut StorageClass) -> Result<(), MigrationError> {
    zonal_class(sc, TOPOLOGY_KEY, |k, v, params| {
        // The driver never sees the prefixed key: the provisioner takes it
        // for the volume capability.
        params.insert(csi_param_name(k).to_string(), v.to_string());
    })
}

/// The in-tree plugin attached any disk read-write whatever the PV said;
/// the driver refuses ReadWriteMany and ReadWriteOnce with ReadOnlyMany.
/// So: ReadWriteMany counts as ReadWriteOnce; ReadWriteOnce (with anything)
/// is ReadWriteOnce; ReadOnlyMany alone stays; nothing else is
/// ReadWriteOnce.
pub fn compatible_access_modes(modes: Option<&[String]>) -> Option<Vec<String>> {
    let modes = modes?;
    let set: BTreeSet<&str> = modes
        .iter()
        .map(|m| match m.as_str() {
            "ReadWriteMany" => "ReadWriteOnce",
            other => other,
        })
        .collect();
    let one = if set.contains("ReadWriteOnce") || !set.contains("ReadOnlyMany") {
        "ReadWriteOnce"
    } else {
        "ReadOnlyMany"
    };
    Some(vec![one.to_string()])
}

fn partition_attribute(partition: Option<i32>) -> String {
    match partition.unwrap_or(0) {
        0 => String::new(),
        p => p.to_string(),
    }
}

fn csi_source(source: &GCEPersistentDiskVolumeSource, handle: String) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: handle,
        read_only: only_true(source.read_only.unwrap_or(false)),
        fs_type: source.fs_type.as_deref().and_then(non_empty),
        volume_attributes: Some(BTreeMap::from([(
            PARTITION.to_string(),
            partition_attribute(source.partition),
        )])),
        ..Default::default()
    }
}

fn zonal(project: &str, zone: &str, disk: &str) -> String {
    format!("projects/{project}/zones/{zone}/disks/{disk}")
}

fn regional(project: &str, region: &str, disk: &str) -> String {
    format!("projects/{project}/regions/{region}/disks/{disk}")
}

pub(super) fn pv_to_csi(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let source = pv
        .spec
        .as_ref()
        .and_then(|s| s.gce_persistent_disk.clone())
        .ok_or(MigrationError::NotInTree)?;
    // The zones from the labels, beta first (whichever the PV was made with).
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    let label = labels
        .get(BETA_ZONE)
        .filter(|l| !l.is_empty())
        .or_else(|| labels.get(ZONE))
        .map(String::as_str)
        .unwrap_or_default();
    let zones: Vec<String> = label
        .split(MULTI_ZONE_DELIMITER)
        .map(str::to_string)
        .collect();
    let handle = match zones.as_slice() {
        [zone] if !zone.is_empty() => zonal(UNSPECIFIED, zone, &source.pd_name),
        [_, _, ..] => {
            let region = region_of_zones(&zones).map_err(MigrationError::Region)?;
            regional(UNSPECIFIED, &region, &source.pd_name)
        }
        _ => zonal(UNSPECIFIED, UNSPECIFIED, &source.pd_name),
    };
    let csi = csi_source(&source, handle);
    topology::in_tree_to_csi(pv, TOPOLOGY_KEY);
    let spec = pv.spec.get_or_insert_default();
    spec.gce_persistent_disk = None;
    spec.csi = Some(csi);
    spec.access_modes = compatible_access_modes(spec.access_modes.as_deref());
    Ok(())
}

/// The disk name of a handle: its sixth `/`-separated part.
fn disk_name(handle: &str) -> Result<String, MigrationError> {
    let parts: Vec<&str> = handle.split('/').collect();
    if parts.len() < PARTS {
        return Err(MigrationError::VolumeHandle {
            handle: handle.to_string(),
            why: format!("{} parts, wanted {PARTS} or more", parts.len()),
        });
    }
    Ok(parts[5].to_string())
}

pub(super) fn pv_to_in_tree(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let csi = csi_of(pv)?;
    let pd_name = disk_name(&csi.volume_handle)?;
    let partition = match csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get(PARTITION))
        .filter(|p| !p.is_empty())
    {
        Some(p) => atoi32(p)?,
        None => 0,
    };
    topology::csi_to_in_tree(pv, TOPOLOGY_KEY, Some(region_of_zones))?;
    let spec = pv.spec.get_or_insert_default();
    spec.csi = None;
    spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
        pd_name,
        fs_type: csi.fs_type.filter(|f| !f.is_empty()),
        read_only: only_true(csi.read_only.unwrap_or(false)),
        partition: (partition != 0).then_some(partition),
    });
    Ok(())
}

pub(super) fn inline_to_csi(volume: &Volume) -> PersistentVolume {
    let source = volume.gce_persistent_disk.clone().unwrap_or_default();
    let mode = if source.read_only.unwrap_or(false) {
        "ReadOnlyMany"
    } else {
        "ReadWriteOnce"
    };
    let csi = csi_source(&source, zonal(UNSPECIFIED, UNSPECIFIED, &source.pd_name));
    // Filesystem, as every inline volume's (`inline_volume_to_csi`).
    inline_pv(format!("{DRIVER}-{}", source.pd_name), csi, mode)
}

/// A handle with `UNSPECIFIED` project (and zone or region) completed from
/// the node ID `projects/<project>/zones/<zone>/instances/<name>`; a handle
/// with a project is returned as it is.
pub fn repair_volume_handle(handle: &str, node_id: &str) -> Result<String, MigrationError> {
    let tok: Vec<&str> = handle.split('/').collect();
    if tok.len() < PARTS {
        return Err(MigrationError::VolumeHandle {
            handle: handle.to_string(),
            why: format!("{} parts, wanted {PARTS} or more", tok.len()),
        });
    }
    if tok[1] != UNSPECIFIED {
        return Ok(handle.to_string());
    }
    let node: Vec<&str> = node_id.split('/').collect();
    if node.len() < PARTS {
        return Err(MigrationError::NodeId {
            node: node_id.to_string(),
            why: format!("{} parts, wanted {PARTS} or more", node.len()),
        });
    }
    let known = |v: &str, fallback: &str| {
        if v == UNSPECIFIED {
            fallback.to_string()
        } else {
            v.to_string()
        }
    };
    match tok[2] {
        "zones" => Ok(zonal(node[1], &known(tok[3], node[3]), tok[5])),
        "regions" => {
            let region = if tok[3] == UNSPECIFIED {
                region_of_zones(&[node[3].to_string()]).map_err(MigrationError::Region)?
            } else {
                tok[3].to_string()
            };
            Ok(regional(node[1], &region, tok[5]))
        }
        other => Err(MigrationError::VolumeHandle {
            handle: handle.to_string(),
            why: format!("expected zones or regions, got {other:?}"),
        }),
    }
}

/// The one region of `zones` named `<locale>-<region>-<zone>`.
pub fn region_of_zones(zones: &[String]) -> Result<String, String> {
    topology::one_region(zones, |zone| {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() != 3 {
            return Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ));
        }
        Ok(parts[..2].join("-"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(m: &[&str]) -> Option<Vec<String>> {
        Some(m.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn access_modes() {
        let cases: [(&[&str], &[&str]); 6] = [
            (&["ReadWriteMany"], &["ReadWriteOnce"]),
            (&["ReadOnlyMany", "ReadWriteOnce"], &["ReadWriteOnce"]),
            (&["ReadOnlyMany", "ReadWriteMany"], &["ReadWriteOnce"]),
            (&["ReadOnlyMany"], &["ReadOnlyMany"]),
            (&["ReadWriteOncePod"], &["ReadWriteOnce"]),
            (&[], &["ReadWriteOnce"]),
        ];
        for (input, want) in cases {
            assert_eq!(
                compatible_access_modes(modes(input).as_deref()),
                modes(want),
                "{input:?}"
            );
        }
        assert_eq!(compatible_access_modes(None), None);
    }

    #[test]
    fn repair() {
        let node = "projects/p1/zones/us-central1-c/instances/n1";
        let cases = [
            (
                "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
                "projects/p1/zones/us-central1-c/disks/d",
            ),
            (
                "projects/UNSPECIFIED/zones/us-central1-a/disks/d",
                "projects/p1/zones/us-central1-a/disks/d",
            ),
            (
                "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
                "projects/p1/regions/us-central1/disks/d",
            ),
            (
                "projects/p2/zones/UNSPECIFIED/disks/d",
                "projects/p2/zones/UNSPECIFIED/disks/d",
            ),
        ];
        for (handle, want) in cases {
            assert_eq!(
                repair_volume_handle(handle, node).as_deref(),
                Ok(want),
                "{handle}"
            );
        }
        assert!(repair_volume_handle("projects/x/disks/d", node).is_err());
        assert!(repair_volume_handle("projects/UNSPECIFIED/zones/z/disks/d", "n1").is_err());
        assert!(repair_volume_handle("projects/UNSPECIFIED/other/z/disks/d", node).is_err());
    }

    #[test]
    fn regions() {
        let s = |z: &[&str]| z.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            region_of_zones(&s(&["europe-west1-b", "europe-west1-c"])).as_deref(),
            Ok("europe-west1")
        );
        assert!(region_of_zones(&s(&["europe-west1-b", "us-east1-b"])).is_err());
        assert!(region_of_zones(&s(&["us-east1"])).is_err());
    }
}
