//! The two pure halves of one provisioning, around the CreateVolume call:
//!
//! 1. [`prepare`]: claim + class + flags + driver capabilities + the cached
//!    Nodes and CSINodes → the CreateVolume request (without credentials:
//!    the caller fetches the provisioner Secret named in
//!    [`Prepared::provisioner_secret`] and fills `request.secrets`) and what
//!    the PV will need.
//! 2. [`finish`]: the driver's `Volume` → the checked capacity and the PV.
//!    A [`FinishError::Capacity`] means the volume exists but is unusable:
//!    the caller deletes it before retrying.
//!
//! A class of the in-tree plugin that migrates to the driver (CSI
//! migration) is translated first ([`migration::storage_class_to_csi`]),
//! and its PV is written with the in-tree source
//! ([`migration::csi_pv_to_in_tree`]) and the plugin's name as
//! `pv.kubernetes.io/provisioned-by`, as upstream writes it.

use std::sync::Arc;

use csiops_proto::csi::v1::{CreateVolumeRequest, Volume};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttributesClass};

use super::attributes_class::{self, AttributesClassError};
use super::capabilities::{self, CapabilityError, DriverCapabilities};
use super::content_source::{self, ContentSourceError};
use super::decide;
use super::naming::{NamingError, VolumeNamer};
use super::params::{
    self, ExtraCreateMetadata, ParamsError, PvSecretRefs, SecretKind, SecretRef, TemplateContext,
};
use super::pv::{self, PvError, PvInputs, PvOptions, PROVISIONED_BY_ANNOTATION};
use super::topology::{self, TopologyError, TopologyInputs};
use crate::common::migration::{self, MigrationError, Plugin};

/// The provisioner's flags that decide what is provisioned.
#[derive(Debug, Clone, Default)]
pub struct ProvisionerConfig {
    pub driver_name: String,
    /// `--volume-name-prefix`, `--volume-name-uuid-length`.
    pub namer: VolumeNamer,
    /// `--default-fstype`.
    pub default_fs_type: Option<String>,
    /// `--extra-create-metadata`.
    pub extra_create_metadata: bool,
    /// `--strict-topology`.
    pub strict_topology: bool,
    /// `--immediate-topology` (upstream default true).
    pub immediate_topology: bool,
    /// `--controller-publish-readonly`.
    pub controller_publish_read_only: bool,
    /// PV deletion protection finalizer on Delete-policy PVs.
    pub pv_protection_finalizer: bool,
    /// Value of the `storage.kubernetes.io/csiProvisionerIdentity` attribute.
    pub identity: Option<String>,
    /// The `CrossNamespaceVolumeDataSource` gate.
    pub cross_namespace_data_source: bool,
    /// `--prevent-volume-mode-conversion`.
    pub prevent_volume_mode_conversion: bool,
    /// `--cloning-protection-threads`.
    pub cloning_protection_threads: usize,
    /// `--snapshot-orphan-sweep-interval` (zero: no sweep).
    pub snapshot_orphan_sweep_interval: std::time::Duration,
    /// The `VolumeAttributesClass` gate, as resolved at start (see
    /// [`super::args::FeatureGates::attributes_class_enabled`]).
    pub volume_attributes_class: bool,
}

/// The informer caches topology is computed from.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cluster<'a> {
    pub nodes: &'a [Arc<Node>],
    pub csi_nodes: &'a [Arc<CSINode>],
}

/// Why a claim cannot be provisioned now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// Upstream: "claim Selector is not supported".
    #[error("claim Selector is not supported")]
    Selector,
    #[error(transparent)]
    DataSource(#[from] ContentSourceError),
    #[error("the claim has no {0}")]
    Claim(&'static str),
    #[error(transparent)]
    Naming(#[from] NamingError),
    #[error(transparent)]
    Params(#[from] ParamsError),
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("failed to translate the in-tree StorageClass: {0}")]
    Migration(#[from] MigrationError),
    #[error(transparent)]
    AttributesClass(#[from] AttributesClassError),
}

/// A CreateVolume request and what the PV will carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// Volume name = PV name.
    pub name: String,
    /// `secrets` is empty: fill it from `provisioner_secret`.
    pub request: CreateVolumeRequest,
    pub provisioner_secret: Option<SecretRef>,
    pub pv_secrets: PvSecretRefs,
    pub fs_type: Option<String>,
    /// The in-tree plugin of a class whose volumes migrate to the driver:
    /// the PV gets the plugin's source.
    pub migrated: Option<Plugin>,
    /// The claim's VolumeAttributesClass, for the PV (gate on only).
    pub attributes_class: Option<String>,
}

/// Step 1: the CreateVolume request for `claim` of `class`.
/// `attributes_class` is the VolumeAttributesClass the claim names
/// ([`attributes_class::requested`]) as cached, `None` when it does not
/// exist (or the claim names none).
pub fn prepare(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    attributes_class: Option<&VolumeAttributesClass>,
    config: &ProvisionerConfig,
    caps: DriverCapabilities,
    cluster: Cluster<'_>,
) -> Result<Prepared, PrepareError> {
    let spec = claim.spec.clone().unwrap_or_default();
    // The data source is checked here and read by the caller
    // (`content_source`), which fills `request.volume_content_source`.
    if let Some(source) = content_source::data_source(claim, config.cross_namespace_data_source)? {
        content_source::check_capabilities(source.kind, caps)?;
    }
    // Before anything else of the claim, as upstream: a driver that cannot
    // modify volumes refuses every claim naming a class.
    let requested_class = attributes_class::requested(claim, config.volume_attributes_class);
    if requested_class.is_some() && !caps.modify_volume {
        return Err(AttributesClassError::Unsupported.into());
    }
    if spec.selector.is_some() {
        return Err(PrepareError::Selector);
    }
    let meta = &claim.metadata;
    let pvc_name = meta.name.as_deref().ok_or(PrepareError::Claim("name"))?;
    let pvc_namespace = meta
        .namespace
        .as_deref()
        .ok_or(PrepareError::Claim("namespace"))?;
    let name = config
        .namer
        .volume_name(meta.uid.as_deref().unwrap_or_default())?;

    // An in-tree class: the class the driver understands, from here on.
    let migrated = decide::migrated_plugin(class, &config.driver_name);
    let translated;
    let class = match migrated {
        Some(plugin) => {
            translated = migration::storage_class_to_csi(plugin, class)?;
            &translated
        }
        None => class,
    };
    let empty = Default::default();
    let class_params = class.parameters.as_ref().unwrap_or(&empty);
    let fs_type = params::fs_type(class_params, config.default_fs_type.as_deref())?;
    let capacity_range = capabilities::capacity_range(&spec)?;
    let volume_capabilities = capabilities::volume_capabilities(
        &spec,
        fs_type.as_deref(),
        class.mount_options.as_deref().unwrap_or_default(),
        caps.single_node_multi_writer,
    )?;
    let requirements = topology::accessibility_requirements(&TopologyInputs {
        supports_topology: caps.topology,
        driver: &config.driver_name,
        pvc_name,
        strict_topology: config.strict_topology,
        immediate_topology: config.immediate_topology,
        allowed_topologies: class.allowed_topologies.as_deref().unwrap_or_default(),
        selected_node: topology::selected_node(claim),
        nodes: cluster.nodes,
        csi_nodes: cluster.csi_nodes,
    })?;

    let ctx = TemplateContext {
        pv_name: &name,
        pvc_name,
        pvc_namespace,
        pvc_annotations: None,
    };
    let provisioner_secret = params::secret_ref(SecretKind::Provisioner, class_params, &ctx)?;
    let pv_secrets = params::pv_secret_refs(
        class_params,
        &TemplateContext {
            pvc_annotations: meta.annotations.as_ref().or(Some(&empty)),
            ..ctx
        },
    )?;
    let extra = ExtraCreateMetadata {
        pvc_name,
        pvc_namespace,
        pv_name: &name,
    };
    let parameters = params::create_volume_parameters(
        class_params,
        config.extra_create_metadata.then_some(&extra),
    )?;
    let mutable_parameters = attributes_class::mutable_parameters(
        requested_class,
        attributes_class,
        &config.driver_name,
        caps.modify_volume,
    )?;

    Ok(Prepared {
        request: CreateVolumeRequest {
            name: name.clone(),
            capacity_range: Some(capacity_range),
            volume_capabilities,
            parameters,
            mutable_parameters,
            accessibility_requirements: requirements,
            ..CreateVolumeRequest::default()
        },
        name,
        provisioner_secret,
        pv_secrets,
        fs_type,
        migrated,
        attributes_class: requested_class.map(str::to_string),
    })
}

/// Why the created volume cannot become a PV.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FinishError {
    /// The volume does not fit the claim: delete it, then retry.
    #[error(transparent)]
    Capacity(CapabilityError),
    /// The request named a content source and the volume has none: the
    /// driver ignored it, and the volume is empty. Delete it, then retry.
    #[error("volume content source missing")]
    ContentSourceMissing,
    #[error(transparent)]
    Pv(#[from] PvError),
    /// The PV of a migrated class cannot get the in-tree source: no PV may
    /// point at the volume (upstream deletes it too).
    #[error("failed to translate the PV to the in-tree source: {0}")]
    Migration(MigrationError),
}

impl FinishError {
    /// Whether the volume exists but must not become a PV: the caller
    /// deletes it before retrying.
    pub fn unusable(&self) -> bool {
        matches!(
            self,
            FinishError::Capacity(_)
                | FinishError::ContentSourceMissing
                | FinishError::Migration(_)
        )
    }
}

/// Step 2: the PV for the volume the driver created.
pub fn finish(
    prepared: &Prepared,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    config: &ProvisionerConfig,
    caps: DriverCapabilities,
    volume: &Volume,
) -> Result<PersistentVolume, FinishError> {
    if prepared.request.volume_content_source.is_some() && volume.content_source.is_none() {
        return Err(FinishError::ContentSourceMissing);
    }
    let requested = prepared.request.capacity_range.unwrap_or_default();
    let capacity_bytes = capabilities::provisioned_capacity(&requested, volume.capacity_bytes)
        .map_err(FinishError::Capacity)?;
    let pv = pv::build_pv(
        &PvInputs {
            pv_name: &prepared.name,
            claim,
            class,
            volume,
            capacity_bytes,
            fs_type: prepared.fs_type.as_deref(),
            provisioner_secret: prepared.provisioner_secret.as_ref(),
            secrets: &prepared.pv_secrets,
            attributes_class: prepared.attributes_class.as_deref(),
        },
        &PvOptions {
            driver: &config.driver_name,
            supports_topology: caps.topology,
            protection_finalizer: config.pv_protection_finalizer,
            controller_publish_read_only: config.controller_publish_read_only,
            identity: config.identity.as_deref(),
        },
    )?;
    match prepared.migrated {
        None => Ok(pv),
        Some(plugin) => {
            let mut pv = migration::csi_pv_to_in_tree(&pv).map_err(FinishError::Migration)?;
            // The class's provisioner, as upstream's library writes it:
            // kube-controller-manager then marks the PV migrated to us.
            pv.metadata.annotations.get_or_insert_default().insert(
                PROVISIONED_BY_ANNOTATION.to_string(),
                plugin.in_tree_name().to_string(),
            );
            Ok(pv)
        }
    }
}

#[cfg(test)]
mod tests;
