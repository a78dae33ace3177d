//! Volumes with content: a claim whose `dataSource`/`dataSourceRef` names a
//! VolumeSnapshot (restore) or another claim (clone) gets CreateVolume with
//! `volume_content_source`, as external-provisioner v6.3.0 does
//! (`getSnapshotSource`, `getPVCSource`, `dataSource` in its controller).
//!
//! This module holds the decisions, pure functions of the objects involved,
//! with tests: [`data_source`] (normalising `dataSource`/`dataSourceRef`,
//! the cross-namespace gate), [`check_capabilities`], [`is_granted`]
//! (ReferenceGrant), [`snapshot_source`] and [`clone_source`]; [`super::plan`]
//! uses them without any I/O. [`fetch`] reads the objects around them: the
//! source claim and its PV from the shared caches, the VolumeSnapshot, its
//! content and ReferenceGrants with a GET (they change rarely and are read
//! once per provisioning, so a watch of every snapshot in the cluster would
//! cost more than it saves), and puts the cloning-protection finalizer on a
//! source claim before the volume is created.
//!
//! A restored snapshot is protected while its volume is made (see
//! [`super::snapshot_protection`]).

use std::collections::BTreeMap;

use csiops_proto::csi::v1::volume_content_source::{SnapshotSource, Type, VolumeSource};
use csiops_proto::csi::v1::VolumeContentSource;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use serde::Deserialize;

use super::capabilities::{DriverCapabilities, VOLUME_MODE_BLOCK, VOLUME_MODE_FILESYSTEM};
use super::quantity::{self, QuantityError};

pub mod fetch;

pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
pub const SNAPSHOT_KIND: &str = "VolumeSnapshot";
pub const CLAIM_KIND: &str = "PersistentVolumeClaim";
/// Upstream's finalizer on a clone's source claim: the source cannot go
/// while a clone of it is being created.
pub const CLONE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";
/// Upstream v6.3's finalizer on a VolumeSnapshot being restored (see
/// `snapshot_protection`); a snapshot being deleted that still carries it
/// may be restored, as upstream: a restore of it had started.
pub const SNAPSHOT_SOURCE_FINALIZER: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// Annotation on a VolumeSnapshotContent allowing a restore into another
/// volume mode despite `--prevent-volume-mode-conversion`.
pub const ALLOW_VOLUME_MODE_CHANGE: &str =
    "snapshot.storage.kubernetes.io/allow-volume-mode-change";
const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// What a data source names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Snapshot,
    Claim,
}

/// A claim's data source, normalised as upstream's `dataSource()`:
/// `dataSource` wins over `dataSourceRef`; the namespace is the claim's
/// unless `dataSourceRef` names another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSource {
    pub kind: SourceKind,
    pub name: String,
    pub namespace: String,
}

impl DataSource {
    fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Why the claim's content source cannot be used (now). Every one becomes a
/// `ProvisioningFailed` Event on the claim and a retry with backoff; the
/// messages keep upstream's words where it has them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContentSourceError {
    #[error("dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled")]
    CrossNamespaceDisabled,
    #[error("accessing {source_namespace}/{name} of {kind} dataSource from {claim} isn't allowed: no ReferenceGrant in namespace {source_namespace} allows it")]
    NotGranted {
        source_namespace: String,
        name: String,
        kind: String,
        claim: String,
    },
    #[error("cannot list ReferenceGrants in namespace {namespace} ({why}); a cross-namespace data source needs the Gateway API ReferenceGrant CRD")]
    Grants { namespace: String, why: String },
    #[error("the PVC source not found for PVC {0}")]
    NoName(String),
    #[error("the PVC source does not belong to the right APIGroup. Expected {SNAPSHOT_GROUP}, Got {0:?}")]
    SnapshotGroup(String),
    /// Upstream leaves such a claim to an external populator; here it stays
    /// an error, as before data sources were implemented.
    #[error("data source {0:?} is not handled by the provisioner (only VolumeSnapshot and PersistentVolumeClaim are)")]
    Populator(String),
    #[error("CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported")]
    SnapshotUnsupported,
    #[error("CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported")]
    CloneUnsupported,
    #[error("claim {0}: spec.resources.requests.storage")]
    Size(String, #[source] QuantityError),
    #[error("error getting snapshot {0} from api server: not found")]
    SnapshotNotFound(String),
    #[error("snapshot {0} is being deleted")]
    SnapshotDeleting(String),
    #[error("snapshot {0} not bound")]
    SnapshotNotBound(String),
    #[error("error getting snapshotcontent {content} for snapshot {snapshot}: not found")]
    ContentNotFound { content: String, snapshot: String },
    #[error("snapshotcontent {content} for snapshot {snapshot} is bound to a different snapshot")]
    ContentBoundElsewhere { content: String, snapshot: String },
    #[error("snapshotcontent {content} for snapshot {snapshot} is not handled by CSI driver of StorageClass {class} (its driver is {driver:?})")]
    ContentDriver {
        content: String,
        snapshot: String,
        class: String,
        driver: String,
    },
    #[error("snapshot {0} is not Ready")]
    SnapshotNotReady(String),
    #[error("snapshot handle {0} is not available")]
    NoSnapshotHandle(String),
    #[error("snapshot {snapshot}: status.restoreSize")]
    RestoreSize {
        snapshot: String,
        #[source]
        source: QuantityError,
    },
    #[error("requested volume size {requested} is less than the size {restore} for the source snapshot {snapshot}")]
    SmallerThanSnapshot {
        requested: i64,
        restore: i64,
        snapshot: String,
    },
    #[error("requested volume {claim} modifies the mode of the source volume but does not have permission to do so. {why}")]
    VolumeModeConversion { claim: String, why: String },
    #[error("error getting PVC {0} from the cache: not found")]
    SourceClaimNotFound(String),
    #[error("the PVC DataSource {0} must have a status of Bound")]
    SourceNotBound(String),
    #[error("the PVC DataSource {0} is currently being deleted")]
    SourceDeleting(String),
    #[error("the source PVC ({0}) storageclass cannot be empty")]
    SourceNoClass(String),
    #[error("the requested PVC ({0}) storageclass cannot be empty")]
    NoClass(String),
    #[error("error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {requested} but source is {source_size}")]
    SmallerThanSource { requested: i64, source_size: i64 },
    #[error("volume name is empty in source PVC {0}")]
    SourceNoVolume(String),
    /// Upstream logs the detail and reports only "claim in dataSource not
    /// bound or invalid"; the detail is what an admin needs, so it is here.
    #[error("claim in dataSource not bound or invalid: {0}")]
    SourceInvalid(String),
    #[error("the source PVC and destination PVCs must have the same volume mode for cloning.  Source is {source_mode}, but new PVC requested {requested}")]
    CloneVolumeMode {
        source_mode: &'static str,
        requested: &'static str,
    },
    #[error("cannot add finalizer {CLONE_FINALIZER} to source PVC {0}: it changed too often")]
    SourceBusy(String),
    #[error("cannot add finalizer {SNAPSHOT_SOURCE_FINALIZER} to VolumeSnapshot {0}: it changed too often")]
    SnapshotBusy(String),
}

/// [`ContentSourceError`] or the API call that read the objects.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Source(#[from] ContentSourceError),
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
}

/// The fields of a `snapshot.storage.k8s.io/v1` VolumeSnapshot read here.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshot {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<VolumeSnapshotStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    pub bound_volume_snapshot_content_name: Option<String>,
    pub ready_to_use: Option<bool>,
    pub restore_size: Option<Quantity>,
}

/// The fields of a `snapshot.storage.k8s.io/v1` VolumeSnapshotContent read
/// here.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContent {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotContentSpec,
    #[serde(default)]
    pub status: Option<VolumeSnapshotContentStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub volume_snapshot_ref: ObjectReference,
    pub source_volume_mode: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    pub snapshot_handle: Option<String>,
}

/// The fields of a `gateway.networking.k8s.io/v1beta1` ReferenceGrant read
/// here.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReferenceGrant {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct GrantFrom {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct GrantTo {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    pub name: Option<String>,
}

/// The claim's data source, or `None` without one. A source of another kind
/// (a volume populator's) is an error here, see
/// [`ContentSourceError::Populator`].
pub fn data_source(
    claim: &PersistentVolumeClaim,
    cross_namespace: bool,
) -> Result<Option<DataSource>, ContentSourceError> {
    let claim_namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let spec = claim.spec.as_ref();
    let (kind, group, name, namespace) = if let Some(ds) = spec.and_then(|s| s.data_source.as_ref())
    {
        (&ds.kind, ds.api_group.as_deref(), &ds.name, None)
    } else if let Some(r) = spec.and_then(|s| s.data_source_ref.as_ref()) {
        let namespace = r.namespace.as_deref().filter(|n| !n.is_empty());
        if namespace.is_some() && !cross_namespace {
            return Err(ContentSourceError::CrossNamespaceDisabled);
        }
        (&r.kind, r.api_group.as_deref(), &r.name, namespace)
    } else {
        return Ok(None);
    };
    let kind = match kind.as_str() {
        SNAPSHOT_KIND => {
            let group = group.unwrap_or_default();
            if group != SNAPSHOT_GROUP {
                return Err(ContentSourceError::SnapshotGroup(group.to_string()));
            }
            SourceKind::Snapshot
        }
        // A claim is a core object: any group but the core one is a
        // populator's own kind of that name.
        CLAIM_KIND if group.unwrap_or_default().is_empty() => SourceKind::Claim,
        other => return Err(ContentSourceError::Populator(other.to_string())),
    };
    if name.is_empty() {
        return Err(ContentSourceError::NoName(claim.name_any()));
    }
    Ok(Some(DataSource {
        kind,
        name: name.clone(),
        namespace: namespace.map_or(claim_namespace, str::to_string),
    }))
}

/// Whether the driver can create a volume from `kind`, as upstream's
/// `checkDriverCapabilities`.
pub fn check_capabilities(
    kind: SourceKind,
    caps: DriverCapabilities,
) -> Result<(), ContentSourceError> {
    match kind {
        SourceKind::Snapshot if !caps.create_delete_snapshot => {
            Err(ContentSourceError::SnapshotUnsupported)
        }
        SourceKind::Claim if !caps.clone_volume => Err(ContentSourceError::CloneUnsupported),
        _ => Ok(()),
    }
}

/// Whether a ReferenceGrant in the source's namespace lets claims of the
/// claim's namespace refer to the source, as upstream's `IsGranted`: a
/// grant `from` {group "", kind PersistentVolumeClaim, the claim's
/// namespace} `to` {the source's group and kind, its name or none}.
pub fn is_granted(
    claim: &PersistentVolumeClaim,
    source: &DataSource,
    grants: &[ReferenceGrant],
) -> Result<(), ContentSourceError> {
    let claim_namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let (group, kind) = match source.kind {
        SourceKind::Snapshot => (SNAPSHOT_GROUP, SNAPSHOT_KIND),
        SourceKind::Claim => ("", CLAIM_KIND),
    };
    let allowed = grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref() == Some(source.namespace.as_str()))
        .filter(|g| {
            g.spec.from.iter().any(|f| {
                f.group.is_empty() && f.kind == CLAIM_KIND && f.namespace == claim_namespace
            })
        })
        .any(|g| {
            g.spec.to.iter().any(|t| {
                t.group == group
                    && t.kind == kind
                    && t.name
                        .as_deref()
                        .is_none_or(|n| n.is_empty() || n == source.name)
            })
        });
    if allowed {
        Ok(())
    } else {
        Err(ContentSourceError::NotGranted {
            source_namespace: source.namespace.clone(),
            name: source.name.clone(),
            kind: kind.to_string(),
            claim: format!("{claim_namespace}/{}", claim.name_any()),
        })
    }
}

/// The claim's storage request in bytes (0 without one: upstream's
/// `capacity.Value()` of a missing quantity).
fn requested_bytes(claim: &PersistentVolumeClaim) -> Result<i64, ContentSourceError> {
    match claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(super::capabilities::STORAGE))
    {
        Some(q) => {
            quantity::to_bytes(q).map_err(|e| ContentSourceError::Size(claim_display(claim), e))
        }
        None => Ok(0),
    }
}

fn claim_display(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.name_any()
    )
}

fn claim_volume_mode(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref())
}

/// The content a snapshot's status names: checks that the snapshot may be
/// restored at all (not being deleted, bound to a content).
pub fn bound_content(
    snapshot: &VolumeSnapshot,
    source: &DataSource,
) -> Result<String, ContentSourceError> {
    if snapshot.metadata.deletion_timestamp.is_some()
        && !snapshot
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == SNAPSHOT_SOURCE_FINALIZER))
    {
        return Err(ContentSourceError::SnapshotDeleting(source.name.clone()));
    }
    snapshot
        .status
        .as_ref()
        .and_then(|s| s.bound_volume_snapshot_content_name.clone())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ContentSourceError::SnapshotNotBound(source.name.clone()))
}

/// The content source restoring `snapshot` (bound to `content`) into
/// `claim` of `class`, with upstream's checks in upstream's order: the
/// content is bound to this snapshot, its driver is the class's, the
/// snapshot is ready, the content has a handle, the claim is at least the
/// restore size, and (with `prevent_mode_conversion`) the volume mode is
/// kept unless the content allows a change.
pub fn snapshot_source(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    snapshot: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
    prevent_mode_conversion: bool,
) -> Result<VolumeContentSource, ContentSourceError> {
    let snapshot_name = snapshot.metadata.name.clone().unwrap_or_default();
    let content_name = content.metadata.name.clone().unwrap_or_default();
    let r = &content.spec.volume_snapshot_ref;
    if r.uid != snapshot.metadata.uid
        || r.namespace != snapshot.metadata.namespace
        || r.name != snapshot.metadata.name
    {
        return Err(ContentSourceError::ContentBoundElsewhere {
            content: content_name,
            snapshot: snapshot_name,
        });
    }
    if content.spec.driver != class.provisioner {
        return Err(ContentSourceError::ContentDriver {
            content: content_name,
            snapshot: snapshot_name,
            class: class.name_any(),
            driver: content.spec.driver.clone(),
        });
    }
    let status = snapshot.status.clone().unwrap_or_default();
    if status.ready_to_use != Some(true) {
        return Err(ContentSourceError::SnapshotNotReady(snapshot_name));
    }
    let handle = content
        .status
        .as_ref()
        .and_then(|s| s.snapshot_handle.clone())
        .ok_or_else(|| ContentSourceError::NoSnapshotHandle(snapshot_name.clone()))?;
    if let Some(restore) = &status.restore_size {
        let restore =
            quantity::to_bytes(restore).map_err(|source| ContentSourceError::RestoreSize {
                snapshot: snapshot_name.clone(),
                source,
            })?;
        let requested = requested_bytes(claim)?;
        if requested < restore {
            return Err(ContentSourceError::SmallerThanSnapshot {
                requested,
                restore,
                snapshot: snapshot_name,
            });
        }
    }
    if prevent_mode_conversion {
        if let (Some(source), Some(wanted)) = (
            content.spec.source_volume_mode.as_deref(),
            claim_volume_mode(claim),
        ) {
            if source != wanted {
                mode_change_allowed(content, claim)?;
            }
        }
    }
    Ok(VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: handle,
        })),
    })
}

/// The content's permission to change the volume mode, in upstream's words.
fn mode_change_allowed(
    content: &VolumeSnapshotContent,
    claim: &PersistentVolumeClaim,
) -> Result<(), ContentSourceError> {
    let name = content.metadata.name.clone().unwrap_or_default();
    let refuse = |why: String| ContentSourceError::VolumeModeConversion {
        claim: claim_display(claim),
        why,
    };
    let empty = BTreeMap::new();
    let annotations = content.metadata.annotations.as_ref().unwrap_or(&empty);
    match annotations
        .get(ALLOW_VOLUME_MODE_CHANGE)
        .map(String::as_str)
    {
        None => Err(refuse(format!(
            "{ALLOW_VOLUME_MODE_CHANGE} annotation is not present on snapshotcontent {name}"
        ))),
        Some(v) => match parse_go_bool(v) {
            Some(true) => Ok(()),
            Some(false) => Err(refuse(format!(
                "{ALLOW_VOLUME_MODE_CHANGE} is set to false on snapshotcontent {name}"
            ))),
            None => Err(refuse(format!(
                "failed to convert {ALLOW_VOLUME_MODE_CHANGE} annotation value {v:?} to boolean"
            ))),
        },
    }
}

/// Go's `strconv.ParseBool`, which upstream reads the annotation with.
fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The content source cloning `source_claim` (bound to `source_pv`) into
/// `claim` of `class`, with upstream's checks in upstream's order.
/// `source_pv` is `None` when the PV is not (yet) in the cache.
pub fn clone_source(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    source_claim: &PersistentVolumeClaim,
    source_pv: Option<&PersistentVolume>,
) -> Result<VolumeContentSource, ContentSourceError> {
    let source_name = source_claim.name_any();
    let phase = source_claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref());
    if phase != Some("Bound") {
        return Err(ContentSourceError::SourceNotBound(source_name));
    }
    if source_claim.metadata.deletion_timestamp.is_some() {
        return Err(ContentSourceError::SourceDeleting(source_name));
    }
    let source_spec = source_claim.spec.clone().unwrap_or_default();
    if source_spec.storage_class_name.is_none() {
        return Err(ContentSourceError::SourceNoClass(source_name));
    }
    if claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_ref())
        .is_none()
    {
        return Err(ContentSourceError::NoClass(claim.name_any()));
    }
    let requested = requested_bytes(claim)?;
    let source_size = requested_bytes(source_claim)?;
    if requested < source_size {
        return Err(ContentSourceError::SmallerThanSource {
            requested,
            source_size,
        });
    }
    let volume_name = source_spec
        .volume_name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ContentSourceError::SourceNoVolume(source_name.clone()))?;
    let invalid = |why: String| ContentSourceError::SourceInvalid(why);
    let pv = source_pv.ok_or_else(|| invalid(format!("PV {volume_name} not found")))?;
    let pv_spec = pv.spec.clone().unwrap_or_default();
    let csi = pv_spec
        .csi
        .as_ref()
        .ok_or_else(|| invalid(format!("PV {volume_name} is not a CSI volume")))?;
    if csi.driver != class.provisioner {
        return Err(invalid(format!(
            "PV {volume_name} is handled by CSI driver {:?}, not by {:?} of StorageClass {}",
            csi.driver,
            class.provisioner,
            class.name_any()
        )));
    }
    let bound_to_source = pv_spec.claim_ref.as_ref().is_some_and(|r| {
        r.uid == source_claim.metadata.uid
            && r.namespace == source_claim.metadata.namespace
            && r.name == source_claim.metadata.name
    });
    if !bound_to_source {
        return Err(invalid(format!(
            "PV {volume_name} is not bound to PVC {source_name}"
        )));
    }
    let pv_phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    if pv_phase != Some("Bound") {
        return Err(invalid(format!(
            "PV {volume_name} status is {:?}, should instead be \"Bound\"",
            pv_phase.unwrap_or_default()
        )));
    }
    let source_block = pv_spec.volume_mode.as_deref() == Some(VOLUME_MODE_BLOCK);
    let wanted_block = claim_volume_mode(claim) == Some(VOLUME_MODE_BLOCK);
    if source_block != wanted_block {
        let name = |block: bool| {
            if block {
                VOLUME_MODE_BLOCK
            } else {
                VOLUME_MODE_FILESYSTEM
            }
        };
        return Err(ContentSourceError::CloneVolumeMode {
            source_mode: name(source_block),
            requested: name(wanted_block),
        });
    }
    Ok(VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: csi.volume_handle.clone(),
        })),
    })
}

/// The source claim of a clone claim (`dataSource`, or `dataSourceRef`, of
/// kind PersistentVolumeClaim) as a cache key, for the cloning-protection
/// workers: `None` for any other claim.
pub fn clone_source_of(claim: &PersistentVolumeClaim) -> Option<ObjectRef<PersistentVolumeClaim>> {
    let spec = claim.spec.as_ref()?;
    let own = claim.metadata.namespace.as_deref().unwrap_or_default();
    let core = |g: Option<&str>| g.unwrap_or_default().is_empty();
    let (name, namespace) = if let Some(ds) = &spec.data_source {
        (ds.kind == CLAIM_KIND && core(ds.api_group.as_deref())).then_some((&ds.name, own))?
    } else {
        let r = spec.data_source_ref.as_ref()?;
        let namespace = r
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(own);
        (r.kind == CLAIM_KIND && core(r.api_group.as_deref())).then_some((&r.name, namespace))?
    };
    (!name.is_empty()).then(|| ObjectRef::new(name).within(namespace))
}

/// A data source read for one provisioning.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub source: DataSource,
    pub content: VolumeContentSource,
    /// The VolumeSnapshot as read for the checks (a restore only): its
    /// source-protection finalizer is added to this copy.
    pub snapshot: Option<VolumeSnapshot>,
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod sync_tests;
