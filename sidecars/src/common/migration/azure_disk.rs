//! `kubernetes.io/azure-disk` ↔ `disk.csi.azure.com`.
//!
//! - class: `zone`/`zones` → allowed topologies under [`TOPOLOGY_KEY`];
//!   every other parameter (`fsType` included) passes as it is: the driver
//!   reads the in-tree names. A zone that is a bare number (`"0"`, the
//!   fault domain of a region without availability zones) becomes `""`,
//!   the driver's value there;
//! - volume: only managed disks migrate; the handle is the disk's resource
//!   URI, the caching mode and fsType travel as the `cachingmode` and
//!   `fstype` attributes, `kind: Managed` always. The disk name of the
//!   in-tree source is the URI's last part. Node affinity is left as it is.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{
    AzureDiskVolumeSource, CSIPersistentVolumeSource, PersistentVolume, TopologySelectorTerm,
    Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use regex::Regex;

use super::topology::zonal_class;
use super::{csi_of, inline_pv, only_true, MigrationError, Plugin};

const DRIVER: &str = Plugin::AzureDisk.driver_name();
/// The driver's zonal topology key.
pub const TOPOLOGY_KEY: &str = "topology.disk.csi.azure.com/zone";
const KIND: &str = "kind";
const CACHING_MODE: &str = "cachingmode";
const FS_TYPE: &str = "fstype";
/// The one disk kind that migrates.
const MANAGED: &str = "Managed";

/// The disk name of a managed disk's resource URI.
static MANAGED_URI: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)",
    )
    .ok()
});
/// The disk name of an unmanaged disk's blob URL.
static UNMANAGED_URI: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"http(?:.*)://(?:.*)/vhds/(.+)").ok());

pub(super) fn storage_class(sc: &mut StorageClass) -> Result<(), MigrationError> {
    zonal_class(sc, TOPOLOGY_KEY, |k, v, params| {
        params.insert(k.to_string(), v.to_string());
    })?;
    sc.allowed_topologies = sc.allowed_topologies.take().map(unzoned_to_csi);
    Ok(())
}

/// Fault-domain zones (a bare number) under the driver's key become `""`.
fn unzoned_to_csi(terms: Vec<TopologySelectorTerm>) -> Vec<TopologySelectorTerm> {
    terms
        .into_iter()
        .map(|mut term| {
            for e in term.match_label_expressions.iter_mut().flatten() {
                if e.key == TOPOLOGY_KEY {
                    for v in &mut e.values {
                        if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
                            v.clear();
                        }
                    }
                }
            }
            term
        })
        .collect()
}

/// Refuses a kind other than Managed (any case).
fn check_kind(kind: Option<&str>) -> Result<(), MigrationError> {
    match kind {
        Some(k) if !k.eq_ignore_ascii_case(MANAGED) => Err(MigrationError::AzureDiskKind(k.into())),
        _ => Ok(()),
    }
}

fn csi_source(
    source: &AzureDiskVolumeSource,
    skip_empty_caching: bool,
) -> CSIPersistentVolumeSource {
    let mut attributes = BTreeMap::from([(KIND.to_string(), MANAGED.to_string())]);
    if let Some(mode) = source
        .caching_mode
        .as_ref()
        .filter(|m| !skip_empty_caching || !m.is_empty())
    {
        attributes.insert(CACHING_MODE.to_string(), mode.clone());
    }
    if let Some(fs) = &source.fs_type {
        attributes.insert(FS_TYPE.to_string(), fs.clone());
    }
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: source.disk_uri.clone(),
        read_only: only_true(source.read_only.unwrap_or(false)),
        fs_type: source.fs_type.clone().filter(|f| !f.is_empty()),
        volume_attributes: Some(attributes),
        ..Default::default()
    }
}

pub(super) fn pv_to_csi(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let source = pv
        .spec
        .as_ref()
        .and_then(|s| s.azure_disk.clone())
        .ok_or(MigrationError::NotInTree)?;
    check_kind(source.kind.as_deref())?;
    // A PV's caching mode travels even when empty; an inline volume's not.
    let csi = csi_source(&source, false);
    let spec = pv.spec.get_or_insert_default();
    spec.azure_disk = None;
    spec.csi = Some(csi);
    Ok(())
}

/// The disk name in a disk URI: after `…/disks/` of a managed disk's
/// resource ID, after `…/vhds/` of an unmanaged disk's blob URL.
pub fn disk_name(uri: &str) -> Result<String, MigrationError> {
    let unmanaged = uri.len() > 4 && uri.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("http"));
    let re = if unmanaged {
        &UNMANAGED_URI
    } else {
        &MANAGED_URI
    };
    re.as_ref()
        .and_then(|re| re.captures(uri))
        .and_then(|c| c.get(1))
        .map(|m| m.as_str().to_string())
        .ok_or_else(|| MigrationError::AzureDiskUri(uri.to_string()))
}

pub(super) fn pv_to_in_tree(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let csi = csi_of(pv)?;
    let disk_name = disk_name(&csi.volume_handle)?;
    // The in-tree source keeps the CSI source's fsType and readOnly even
    // when empty or false; attributes override them.
    let mut source = AzureDiskVolumeSource {
        disk_name,
        disk_uri: csi.volume_handle.clone(),
        fs_type: Some(csi.fs_type.clone().unwrap_or_default()),
        read_only: Some(csi.read_only.unwrap_or(false)),
        kind: Some(MANAGED.to_string()),
        caching_mode: None,
    };
    for (k, v) in csi.volume_attributes.iter().flatten() {
        match k.to_lowercase().as_str() {
            CACHING_MODE if !v.is_empty() => source.caching_mode = Some(v.clone()),
            FS_TYPE if !v.is_empty() => source.fs_type = Some(v.clone()),
            _ => {}
        }
    }
    let spec = pv.spec.get_or_insert_default();
    spec.csi = None;
    spec.azure_disk = Some(source);
    Ok(())
}

pub(super) fn inline_to_csi(volume: &Volume) -> Result<PersistentVolume, MigrationError> {
    let source = volume
        .azure_disk
        .as_ref()
        .ok_or(MigrationError::NotInTree)?;
    check_kind(source.kind.as_deref())?;
    Ok(inline_pv(
        source.disk_uri.clone(),
        csi_source(source, true),
        "ReadWriteOnce",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_names() {
        let ok = [
            (
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d1",
                "d1",
            ),
            (
                "https://acct.blob.core.windows.net/vhds/disk.vhd",
                "disk.vhd",
            ),
            ("http://acct/vhds/a/b", "a/b"),
        ];
        for (uri, want) in ok {
            assert_eq!(disk_name(uri).as_deref(), Ok(want), "{uri}");
        }
        // An upper-case scheme is taken for unmanaged, and the pattern then
        // wants it lower-case: refused, as upstream.
        for bad in [
            "",
            "disk",
            "https://acct/blobs/d",
            "/subscriptions/s/disks/d",
            "HTTP://acct/vhds/a",
        ] {
            assert!(disk_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kinds() {
        assert_eq!(check_kind(None), Ok(()));
        assert_eq!(check_kind(Some("managed")), Ok(()));
        assert_eq!(
            check_kind(Some("Shared")),
            Err(MigrationError::AzureDiskKind("Shared".into()))
        );
    }
}
