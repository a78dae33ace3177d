//! `kubernetes.io/aws-ebs` ↔ `ebs.csi.aws.com`.
//!
//! - class: `fstype` → `csi.storage.k8s.io/fstype`; `zone`/`zones` →
//!   allowed topologies under [`TOPOLOGY_KEY`]; `iopsPerGB` stays and brings
//!   `allowautoiopspergbincrease: "true"` (the in-tree plugin raised IOPS
//!   that came out too low for the size; the driver does only when asked);
//!   anything else passes as it is;
//! - volume: the handle is the bare EBS ID (`vol-…`) of the in-tree
//!   `aws://<zone>/vol-…` form; the partition travels as the `partition`
//!   attribute; the zone moves between [`TOPOLOGY_KEY`] and Kubernetes'
//!   zone key, the region derived from the zone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{self, zonal_class};
use super::{
    atoi32, csi_of, csi_param_name, inline_pv, non_empty, only_true, MigrationError, Plugin,
};

const DRIVER: &str = Plugin::AwsEbs.driver_name();
/// The driver's zonal topology key.
pub const TOPOLOGY_KEY: &str = "topology.ebs.csi.aws.com/zone";
const IOPS_PER_GB_KEY: &str = "iopspergb";
const ALLOW_IOPS_INCREASE_KEY: &str = "allowautoiopspergbincrease";
const PARTITION: &str = "partition";

pub(super) fn storage_class(sc: &mut StorageClass) -> Result<(), MigrationError> {
    zonal_class(sc, TOPOLOGY_KEY, |k, v, params| {
        params.insert(csi_param_name(k).to_string(), v.to_string());
        if k.to_lowercase() == IOPS_PER_GB_KEY {
            params.insert(ALLOW_IOPS_INCREASE_KEY.to_string(), "true".to_string());
        }
    })
}

/// The EBS volume ID of a Kubernetes EBS volume ID: `aws://<zone>/<id>`,
/// `aws:///<id>` or the bare `<id>`. The URL forms must name a `vol-…` ID.
pub fn ebs_volume_id(kubernetes_id: &str) -> Result<String, MigrationError> {
    let Some(rest) = kubernetes_id.strip_prefix("aws://") else {
        // A bare ID is taken as it is.
        return Ok(kubernetes_id.to_string());
    };
    let bad = |why: &str| MigrationError::EbsVolumeId(format!("{why} ({kubernetes_id})"));
    if kubernetes_id.chars().any(|c| c.is_ascii_control()) {
        return Err(bad("invalid control character in URL"));
    }
    // As a URL: the path follows the host, before any query or fragment.
    let rest = rest.split('#').next().unwrap_or_default();
    let rest = rest.split('?').next().unwrap_or_default();
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let path = percent_decode(path).ok_or_else(|| bad("invalid URL escape"))?;
    let id = path.trim_matches('/');
    if id.starts_with("vol-") && !id.contains('/') {
        Ok(id.to_string())
    } else {
        Err(bad("invalid format for AWS volume"))
    }
}

/// `%XX` escapes decoded; `None` for a malformed escape or bytes that are
/// not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn csi_source(
    source: &AWSElasticBlockStoreVolumeSource,
) -> Result<CSIPersistentVolumeSource, MigrationError> {
    Ok(CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: ebs_volume_id(&source.volume_id)?,
        read_only: only_true(source.read_only.unwrap_or(false)),
        fs_type: source.fs_type.as_deref().and_then(non_empty),
        volume_attributes: Some(BTreeMap::from([(
            PARTITION.to_string(),
            source.partition.unwrap_or(0).to_string(),
        )])),
        ..Default::default()
    })
}

pub(super) fn pv_to_csi(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let source = pv
        .spec
        .as_ref()
        .and_then(|s| s.aws_elastic_block_store.clone())
        .ok_or(MigrationError::NotInTree)?;
    let csi = csi_source(&source)?;
    topology::in_tree_to_csi(pv, TOPOLOGY_KEY);
    let spec = pv.spec.get_or_insert_default();
    spec.aws_elastic_block_store = None;
    spec.csi = Some(csi);
    Ok(())
}

pub(super) fn pv_to_in_tree(pv: &mut PersistentVolume) -> Result<(), MigrationError> {
    let csi = csi_of(pv)?;
    let partition = match csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get(PARTITION))
    {
        Some(p) => atoi32(p)?,
        None => 0,
    };
    topology::csi_to_in_tree(pv, TOPOLOGY_KEY, Some(region_of_zones))?;
    let spec = pv.spec.get_or_insert_default();
    spec.csi = None;
    spec.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
        volume_id: csi.volume_handle,
        fs_type: csi.fs_type.filter(|f| !f.is_empty()),
        read_only: only_true(csi.read_only.unwrap_or(false)),
        partition: (partition != 0).then_some(partition),
    });
    Ok(())
}

pub(super) fn inline_to_csi(volume: &Volume) -> Result<PersistentVolume, MigrationError> {
    let source = volume
        .aws_elastic_block_store
        .as_ref()
        .ok_or(MigrationError::NotInTree)?;
    let csi = csi_source(source)?;
    let name = format!("{DRIVER}-{}", csi.volume_handle);
    Ok(inline_pv(name, csi, "ReadWriteOnce"))
}

/// The one AWS region of `zones`: `us-west-2a` and `us-gov-east-1a` end in
/// a two-letter part whose digit is kept (`us-west-2`); local zones
/// (`us-west-2-lax-1a`) keep their first three parts, as do Wavelength
/// zones (`us-east-1-wl1-bos-wlz-1`).
pub fn region_of_zones(zones: &[String]) -> Result<String, String> {
    topology::one_region(zones, |zone| {
        let parts: Vec<&str> = zone.split('-').collect();
        let last = parts.last().copied().unwrap_or_default();
        match parts.len() {
            3 | 4 if last.len() == 2 && last.is_char_boundary(1) => {
                let mut p = parts.clone();
                let n = p.len() - 1;
                p[n] = &last[..1];
                Ok(p.join("-"))
            }
            5 | 7 => Ok(parts[..3].join("-")),
            _ => Err(format!(
                "unexpected zone format: {zone} is not a valid AWS zone"
            )),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_ids() {
        let ok = [
            ("vol-123", "vol-123"),
            ("aws://us-east-1a/vol-0abc", "vol-0abc"),
            ("aws:///vol-0abc", "vol-0abc"),
            ("aws://us-east-1a/vol-0abc/", "vol-0abc"),
            ("aws://z/vol-%30a?x=1#f", "vol-0a"),
            ("anything-bare", "anything-bare"),
        ];
        for (input, want) in ok {
            assert_eq!(ebs_volume_id(input).as_deref(), Ok(want), "{input}");
        }
        for bad in [
            "aws://us-east-1a/v-1",
            "aws://z/a/vol-1",
            "aws://z",
            "aws://z/vol-%zz",
        ] {
            assert!(ebs_volume_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn regions() {
        let s = |z: &[&str]| z.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            region_of_zones(&s(&["us-west-2a"])).as_deref(),
            Ok("us-west-2")
        );
        assert_eq!(
            region_of_zones(&s(&["us-gov-east-1a", "us-gov-east-1b"])).as_deref(),
            Ok("us-gov-east-1")
        );
        assert_eq!(
            region_of_zones(&s(&["us-west-2-lax-1a"])).as_deref(),
            Ok("us-west-2")
        );
        assert_eq!(
            region_of_zones(&s(&["us-east-1-wl1-bos-wlz-1"])).as_deref(),
            Ok("us-east-1")
        );
        assert!(region_of_zones(&s(&["us-west-2a", "us-east-1a"])).is_err());
        assert!(region_of_zones(&s(&["zone"])).is_err());
        assert!(region_of_zones(&[]).is_err());
    }
}
