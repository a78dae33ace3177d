//! CSI migration: the in-tree volume plugins Kubernetes still lets users
//! keep (StorageClasses, PVs and pod volumes of `kubernetes.io/aws-ebs` and
//! its kind) and the CSI driver each one hands its volumes to.
//!
//! kube-controller-manager gives a claim of an in-tree class to the CSI
//! driver that replaces the plugin (`volume.kubernetes.io/storage-provisioner`
//! names the driver) and marks PVs of the plugin with
//! `pv.kubernetes.io/migrated-to`. The provisioner and attacher of that
//! driver then read and write in-tree objects through four translations,
//! the rules of `k8s.io/csi-translation-lib` v0.34 (the release our control
//! plane is built from):
//!
//! - [`storage_class_to_csi`]: an in-tree class → the class the CSI driver
//!   understands (parameter names, `zone`/`zones` → allowed topologies with
//!   the driver's topology key);
//! - [`csi_pv_to_in_tree`]: the PV of a volume the CSI driver created → the
//!   PV with the in-tree source, as written for a migrated class;
//! - [`in_tree_pv_to_csi`] (and [`csi_view`]): a PV with an in-tree source →
//!   the CSI source the driver's calls are made from;
//! - [`inline_volume_to_csi`]: a pod's in-tree volume → a PV with the CSI
//!   source.
//!
//! Everything here is pure. One file per plugin holds that plugin's rules;
//! [`topology`] the node-affinity rewrites they share. The golden tests
//! (`tests.rs`) hold every translation against the output of
//! csi-translation-lib itself (see `testdata/README.md`).

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

mod aws_ebs;
mod azure_disk;
mod azure_file;
mod cinder;
mod gce_pd;
mod portworx;
pub mod topology;
mod vsphere;

#[cfg(test)]
mod tests;

/// Set by kube-controller-manager on PVs (and claims) of a migrated plugin:
/// the CSI driver that now handles them.
pub const MIGRATED_TO_ANNOTATION: &str = "pv.kubernetes.io/migrated-to";

/// The CSI parameter key of the filesystem type.
pub(crate) const CSI_FS_TYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// The in-tree parameter keys csi-translation-lib rewrites for several
/// plugins (compared lower-cased, as it does).
pub(crate) const FS_TYPE_KEY: &str = "fstype";
pub(crate) const ZONE_KEY: &str = "zone";
pub(crate) const ZONES_KEY: &str = "zones";

/// An in-tree volume plugin that has a CSI migration target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plugin {
    AwsEbs,
    GcePd,
    AzureDisk,
    AzureFile,
    Cinder,
    Vsphere,
    Portworx,
}

impl Plugin {
    /// Every plugin csi-translation-lib v0.34 translates.
    pub const ALL: [Plugin; 7] = [
        Plugin::AwsEbs,
        Plugin::GcePd,
        Plugin::AzureDisk,
        Plugin::AzureFile,
        Plugin::Cinder,
        Plugin::Vsphere,
        Plugin::Portworx,
    ];

    /// The in-tree plugin name (a StorageClass `provisioner`, the
    /// `pv.kubernetes.io/provisioned-by` of the PVs it made).
    pub const fn in_tree_name(self) -> &'static str {
        match self {
            Plugin::AwsEbs => "kubernetes.io/aws-ebs",
            Plugin::GcePd => "kubernetes.io/gce-pd",
            Plugin::AzureDisk => "kubernetes.io/azure-disk",
            Plugin::AzureFile => "kubernetes.io/azure-file",
            Plugin::Cinder => "kubernetes.io/cinder",
            Plugin::Vsphere => "kubernetes.io/vsphere-volume",
            Plugin::Portworx => "kubernetes.io/portworx-volume",
        }
    }

    /// The CSI driver the plugin's volumes migrate to.
    pub const fn driver_name(self) -> &'static str {
        match self {
            Plugin::AwsEbs => "ebs.csi.aws.com",
            Plugin::GcePd => "pd.csi.storage.gke.io",
            Plugin::AzureDisk => "disk.csi.azure.com",
            Plugin::AzureFile => "file.csi.azure.com",
            Plugin::Cinder => "cinder.csi.openstack.org",
            Plugin::Vsphere => "csi.vsphere.vmware.com",
            Plugin::Portworx => "pxd.portworx.com",
        }
    }

    /// The plugin whose volumes migrate to CSI driver `driver`.
    pub fn for_driver(driver: &str) -> Option<Plugin> {
        Plugin::ALL.into_iter().find(|p| p.driver_name() == driver)
    }

    /// The plugin named `name` (a StorageClass provisioner).
    pub fn for_in_tree(name: &str) -> Option<Plugin> {
        Plugin::ALL.into_iter().find(|p| p.in_tree_name() == name)
    }

    /// The plugin whose source the PV spec has, if any (a valid spec has at
    /// most one source).
    pub fn of_spec(spec: &PersistentVolumeSpec) -> Option<Plugin> {
        if spec.aws_elastic_block_store.is_some() {
            Some(Plugin::AwsEbs)
        } else if spec.gce_persistent_disk.is_some() {
            Some(Plugin::GcePd)
        } else if spec.azure_disk.is_some() {
            Some(Plugin::AzureDisk)
        } else if spec.azure_file.is_some() {
            Some(Plugin::AzureFile)
        } else if spec.cinder.is_some() {
            Some(Plugin::Cinder)
        } else if spec.vsphere_volume.is_some() {
            Some(Plugin::Vsphere)
        } else if spec.portworx_volume.is_some() {
            Some(Plugin::Portworx)
        } else {
            None
        }
    }

    /// The plugin whose source the pod volume has, if any.
    pub fn of_volume(volume: &Volume) -> Option<Plugin> {
        if volume.aws_elastic_block_store.is_some() {
            Some(Plugin::AwsEbs)
        } else if volume.gce_persistent_disk.is_some() {
            Some(Plugin::GcePd)
        } else if volume.azure_disk.is_some() {
            Some(Plugin::AzureDisk)
        } else if volume.azure_file.is_some() {
            Some(Plugin::AzureFile)
        } else if volume.cinder.is_some() {
            Some(Plugin::Cinder)
        } else if volume.vsphere_volume.is_some() {
            Some(Plugin::Vsphere)
        } else if volume.portworx_volume.is_some() {
            Some(Plugin::Portworx)
        } else {
            None
        }
    }
}

/// Why an object cannot be translated. The messages say what is wrong with
/// the object, for the Event or error status it ends up in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigrationError {
    #[error("cannot simultaneously set allowed topologies and zone/zones parameters")]
    ZoneAndAllowedTopologies,
    #[error("the PV has no CSI source")]
    NoCsiSource,
    #[error("no in-tree plugin migrates to CSI driver {0:?}")]
    NotMigrated(String),
    #[error("the volume has no in-tree source that migrates to CSI")]
    NotInTree,
    #[error("failed to translate Kubernetes ID to EBS volume ID: {0}")]
    EbsVolumeId(String),
    #[error("failed to convert partition {0:?} to an integer")]
    Partition(String),
    #[error("failed to translate topology: {0}")]
    Topology(String),
    #[error("failed to get the region from zones: {0}")]
    Region(String),
    #[error("volume handle {handle:?}: {why}")]
    VolumeHandle { handle: String, why: String },
    #[error("node ID {node:?}: {why}")]
    NodeId { node: String, why: String },
    #[error("kind({0}) is not supported in csi migration")]
    AzureDiskKind(String),
    #[error("could not get disk name from {0}")]
    AzureDiskUri(String),
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileSecretNamespace,
}

/// Whether the string is a base-10 integer Go's `strconv.Atoi` accepts
/// (an optional sign, then digits, within 64 bits), truncated to 32 bits
/// as csi-translation-lib's `int32(...)` does.
pub(crate) fn atoi32(s: &str) -> Result<i32, MigrationError> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(MigrationError::Partition(s.to_string()));
    }
    s.parse::<i64>()
        .map(|v| v as i32)
        .map_err(|_| MigrationError::Partition(s.to_string()))
}

/// `Some(s)` unless empty: an empty Go string with `omitempty` is absent
/// from the JSON the API server stores.
pub(crate) fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// A class parameter's name for the CSI driver: `fstype` (in any case)
/// becomes [`CSI_FS_TYPE_KEY`], any other stays.
pub(crate) fn csi_param_name(k: &str) -> &str {
    if k.to_lowercase() == FS_TYPE_KEY {
        CSI_FS_TYPE_KEY
    } else {
        k
    }
}

/// `Some(true)` or absent, for Go's `bool` with `omitempty`.
pub(crate) fn only_true(b: bool) -> Option<bool> {
    b.then_some(true)
}

/// The CSI source of a PV, which its translation in-tree starts from.
pub(crate) fn csi_of(pv: &PersistentVolume) -> Result<CSIPersistentVolumeSource, MigrationError> {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.clone())
        .ok_or(MigrationError::NoCsiSource)
}

/// The PV a pod's in-tree volume stands for: `name`, unique per disk (the
/// staging path is made from it), the CSI source and one access mode.
pub(crate) fn inline_pv(
    name: String,
    csi: CSIPersistentVolumeSource,
    access_mode: &str,
) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(csi),
            access_modes: Some(vec![access_mode.into()]),
            ..Default::default()
        }),
        status: None,
    }
}

/// A class of `plugin`'s in-tree provisioner, translated for the plugin's
/// CSI driver (a copy; the input is left as it is).
pub fn storage_class_to_csi(
    plugin: Plugin,
    class: &StorageClass,
) -> Result<StorageClass, MigrationError> {
    let mut sc = class.clone();
    match plugin {
        Plugin::AwsEbs => aws_ebs::storage_class(&mut sc)?,
        Plugin::GcePd => gce_pd::storage_class(&mut sc)?,
        Plugin::AzureDisk => azure_disk::storage_class(&mut sc)?,
        Plugin::AzureFile => {}
        Plugin::Cinder => cinder::storage_class(&mut sc),
        Plugin::Vsphere => vsphere::storage_class(&mut sc),
        Plugin::Portworx => portworx::storage_class(&mut sc),
    }
    Ok(sc)
}

/// The PV with its in-tree source replaced by the CSI source of the
/// plugin's driver (and its topology moved to the driver's keys).
pub fn in_tree_pv_to_csi(pv: &PersistentVolume) -> Result<PersistentVolume, MigrationError> {
    let plugin = pv
        .spec
        .as_ref()
        .and_then(Plugin::of_spec)
        .ok_or(MigrationError::NotInTree)?;
    let mut pv = pv.clone();
    match plugin {
        Plugin::AwsEbs => aws_ebs::pv_to_csi(&mut pv)?,
        Plugin::GcePd => gce_pd::pv_to_csi(&mut pv)?,
        Plugin::AzureDisk => azure_disk::pv_to_csi(&mut pv)?,
        Plugin::AzureFile => azure_file::pv_to_csi(&mut pv)?,
        Plugin::Cinder => cinder::pv_to_csi(&mut pv),
        Plugin::Vsphere => vsphere::pv_to_csi(&mut pv),
        Plugin::Portworx => portworx::pv_to_csi(&mut pv),
    }
    Ok(pv)
}

/// The PV as the CSI driver's calls see it: a PV with an in-tree source of
/// a migrated plugin translated ([`in_tree_pv_to_csi`]), any other as it is.
pub fn csi_view(pv: &PersistentVolume) -> Result<Cow<'_, PersistentVolume>, MigrationError> {
    if pv.spec.as_ref().and_then(Plugin::of_spec).is_some() {
        in_tree_pv_to_csi(pv).map(Cow::Owned)
    } else {
        Ok(Cow::Borrowed(pv))
    }
}

/// The PV with its CSI source replaced by the in-tree source of the plugin
/// that migrates to the source's driver.
pub fn csi_pv_to_in_tree(pv: &PersistentVolume) -> Result<PersistentVolume, MigrationError> {
    let driver = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.driver.as_str())
        .ok_or(MigrationError::NoCsiSource)?;
    let plugin =
        Plugin::for_driver(driver).ok_or_else(|| MigrationError::NotMigrated(driver.into()))?;
    let mut pv = pv.clone();
    match plugin {
        Plugin::AwsEbs => aws_ebs::pv_to_in_tree(&mut pv)?,
        Plugin::GcePd => gce_pd::pv_to_in_tree(&mut pv)?,
        Plugin::AzureDisk => azure_disk::pv_to_in_tree(&mut pv)?,
        Plugin::AzureFile => azure_file::pv_to_in_tree(&mut pv)?,
        Plugin::Cinder => cinder::pv_to_in_tree(&mut pv)?,
        Plugin::Vsphere => vsphere::pv_to_in_tree(&mut pv)?,
        Plugin::Portworx => portworx::pv_to_in_tree(&mut pv)?,
    }
    Ok(pv)
}

/// A pod's in-tree volume as a PV with the CSI source (the PV is never
/// created: its name is unique per disk, as the staging path needs). The
/// volume mode is Filesystem, the only one inline volumes have.
/// `pod_namespace` is where an Azure File volume's Secret is.
pub fn inline_volume_to_csi(
    volume: &Volume,
    pod_namespace: &str,
) -> Result<PersistentVolume, MigrationError> {
    let plugin = Plugin::of_volume(volume).ok_or(MigrationError::NotInTree)?;
    let mut pv = match plugin {
        Plugin::AwsEbs => aws_ebs::inline_to_csi(volume)?,
        Plugin::GcePd => gce_pd::inline_to_csi(volume),
        Plugin::AzureDisk => azure_disk::inline_to_csi(volume)?,
        Plugin::AzureFile => azure_file::inline_to_csi(volume, pod_namespace),
        Plugin::Cinder => cinder::inline_to_csi(volume),
        Plugin::Vsphere => vsphere::inline_to_csi(volume),
        Plugin::Portworx => portworx::inline_to_csi(volume),
    };
    if let Some(spec) = pv.spec.as_mut() {
        spec.volume_mode.get_or_insert_with(|| "Filesystem".into());
    }
    Ok(pv)
}

/// csi-translation-lib's `RepairVolumeHandle`: the handle of a migrated
/// volume made whole from the node ID, for comparing with what the driver
/// reports as published. Only GCE PD handles have parts left unknown by the
/// translation (project and zone); every other handle is returned as it is.
pub fn repair_volume_handle(
    driver: &str,
    handle: &str,
    node_id: &str,
) -> Result<String, MigrationError> {
    match Plugin::for_driver(driver) {
        Some(Plugin::GcePd) => gce_pd::repair_volume_handle(handle, node_id),
        Some(_) => Ok(handle.to_string()),
        None => Err(MigrationError::NotMigrated(driver.to_string())),
    }
}
