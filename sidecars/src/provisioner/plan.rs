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
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use csiops_proto::csi::v1::volume_capability::access_mode::Mode;
    use csiops_proto::csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
    use csiops_proto::csi::v1::{CapacityRange, Topology, TopologyRequirement, VolumeCapability};
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, TypedLocalObjectReference, VolumeResourceRequirements,
    };
    use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    const DRIVER: &str = "hostpath.csi.k8s.io";
    const KEY: &str = "topology.hostpath.csi/node";
    const UID: &str = "9f3b1c2a-5d4e-4f60-8a7b-0c1d2e3f4a5b";

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn claim() -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                    limits: None,
                }),
                storage_class_name: Some("fast".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        c.metadata.name = Some("data".into());
        c.metadata.namespace = Some("team-a".into());
        c.metadata.uid = Some(UID.into());
        c.metadata.annotations = Some(map(&[
            (topology::SELECTED_NODE_ANNOTATION, "node-1"),
            ("example.com/stage-secret", "stage-creds"),
        ]));
        c
    }

    fn class() -> StorageClass {
        let mut sc = StorageClass {
            provisioner: DRIVER.into(),
            reclaim_policy: Some("Delete".into()),
            parameters: Some(map(&[
                ("kind", "fast"),
                (params::FS_TYPE_KEY, "xfs"),
                (
                    "csi.storage.k8s.io/provisioner-secret-name",
                    "${pvc.name}-prov",
                ),
                (
                    "csi.storage.k8s.io/provisioner-secret-namespace",
                    "${pvc.namespace}",
                ),
                (
                    "csi.storage.k8s.io/node-stage-secret-name",
                    "${pvc.annotations['example.com/stage-secret']}",
                ),
                (
                    "csi.storage.k8s.io/node-stage-secret-namespace",
                    "${pvc.namespace}",
                ),
            ])),
            mount_options: Some(vec!["noatime".into()]),
            ..Default::default()
        };
        sc.metadata.name = Some("fast".into());
        sc
    }

    fn cluster() -> (Vec<Arc<Node>>, Vec<Arc<CSINode>>) {
        let mut nodes = Vec::new();
        let mut csi = Vec::new();
        for n in ["node-0", "node-1"] {
            let mut node = Node::default();
            node.metadata.name = Some(n.into());
            node.metadata.labels = Some(map(&[(KEY, n)]));
            nodes.push(Arc::new(node));
            let mut c = CSINode {
                spec: CSINodeSpec {
                    drivers: vec![CSINodeDriver {
                        name: DRIVER.into(),
                        node_id: n.into(),
                        topology_keys: Some(vec![KEY.into()]),
                        allocatable: None,
                    }],
                },
                ..Default::default()
            };
            c.metadata.name = Some(n.into());
            csi.push(Arc::new(c));
        }
        (nodes, csi)
    }

    fn config() -> ProvisionerConfig {
        ProvisionerConfig {
            driver_name: DRIVER.into(),
            extra_create_metadata: true,
            immediate_topology: true,
            pv_protection_finalizer: true,
            ..Default::default()
        }
    }

    const CAPS: DriverCapabilities = DriverCapabilities {
        topology: true,
        single_node_multi_writer: false,
        create_delete_snapshot: false,
        clone_volume: false,
        publish_unpublish: false,
        modify_volume: false,
    };

    #[test]
    fn prepare_then_finish() {
        let (nodes, csi_nodes) = cluster();
        let cluster = Cluster {
            nodes: &nodes,
            csi_nodes: &csi_nodes,
        };
        let p = prepare(&claim(), &class(), None, &config(), CAPS, cluster).expect("prepared");
        let name = format!("pvc-{UID}");
        let seg = |n: &str| Topology {
            segments: HashMap::from([(KEY.to_string(), n.to_string())]),
        };
        assert_eq!(
            p,
            Prepared {
                name: name.clone(),
                request: CreateVolumeRequest {
                    name: name.clone(),
                    capacity_range: Some(CapacityRange {
                        required_bytes: 1 << 30,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![VolumeCapability {
                        access_mode: Some(AccessMode {
                            mode: Mode::SingleNodeWriter as i32
                        }),
                        access_type: Some(AccessType::Mount(MountVolume {
                            fs_type: "xfs".into(),
                            mount_flags: vec!["noatime".into()],
                            volume_mount_group: String::new(),
                        })),
                    }],
                    parameters: HashMap::from([
                        ("kind".to_string(), "fast".to_string()),
                        (params::PVC_NAME_KEY.to_string(), "data".to_string()),
                        (params::PVC_NAMESPACE_KEY.to_string(), "team-a".to_string()),
                        (params::PV_NAME_KEY.to_string(), name.clone()),
                    ]),
                    accessibility_requirements: Some(TopologyRequirement {
                        requisite: vec![seg("node-0"), seg("node-1")],
                        preferred: vec![seg("node-1"), seg("node-0")],
                    }),
                    ..Default::default()
                },
                provisioner_secret: Some(SecretRef {
                    name: "data-prov".into(),
                    namespace: "team-a".into(),
                }),
                pv_secrets: PvSecretRefs {
                    node_stage: Some(SecretRef {
                        name: "stage-creds".into(),
                        namespace: "team-a".into(),
                    }),
                    ..Default::default()
                },
                fs_type: Some("xfs".into()),
                migrated: None,
                attributes_class: None,
            }
        );

        let volume = Volume {
            capacity_bytes: 0,
            volume_id: "vol-1".into(),
            accessible_topology: vec![seg("node-1")],
            ..Default::default()
        };
        let pv = finish(&p, &claim(), &class(), &config(), CAPS, &volume).expect("pv");
        let spec = pv.spec.clone().unwrap_or_default();
        assert_eq!(pv.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(
            spec.capacity.and_then(|c| c.get("storage").cloned()),
            Some(Quantity("1Gi".into())),
            "capacity 0 = unknown: the request stands in"
        );
        assert_eq!(
            spec.csi
                .as_ref()
                .and_then(|c| c.node_stage_secret_ref.clone())
                .and_then(|r| r.name),
            Some("stage-creds".into())
        );
        assert!(spec.node_affinity.is_some());

        let small = Volume {
            capacity_bytes: 1,
            ..volume
        };
        assert_eq!(
            finish(&p, &claim(), &class(), &config(), CAPS, &small),
            Err(FinishError::Capacity(CapabilityError::TooSmall {
                provisioned: 1,
                required: 1 << 30,
            }))
        );
    }

    /// An in-tree class for a driver that is its migration target: the
    /// translated parameters and topology go to CreateVolume, the PV gets
    /// the in-tree source with Kubernetes' zone keys.
    #[test]
    fn migrated_class() {
        const EBS: &str = "ebs.csi.aws.com";
        const ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";
        let mut nodes = Vec::new();
        let mut csi_nodes = Vec::new();
        for (n, zone) in [("node-0", "us-east-1a"), ("node-1", "us-east-1b")] {
            let mut node = Node::default();
            node.metadata.name = Some(n.into());
            node.metadata.labels = Some(map(&[(ZONE_KEY, zone)]));
            nodes.push(Arc::new(node));
            let mut c = CSINode {
                spec: CSINodeSpec {
                    drivers: vec![CSINodeDriver {
                        name: EBS.into(),
                        node_id: n.into(),
                        topology_keys: Some(vec![ZONE_KEY.into()]),
                        allocatable: None,
                    }],
                },
                ..Default::default()
            };
            c.metadata.name = Some(n.into());
            csi_nodes.push(Arc::new(c));
        }
        let cluster = Cluster {
            nodes: &nodes,
            csi_nodes: &csi_nodes,
        };
        let config = ProvisionerConfig {
            driver_name: EBS.into(),
            ..config()
        };
        let mut class = StorageClass {
            provisioner: "kubernetes.io/aws-ebs".into(),
            reclaim_policy: Some("Delete".into()),
            parameters: Some(map(&[
                ("type", "io1"),
                ("fsType", "xfs"),
                ("iopsPerGB", "10"),
                ("zone", "us-east-1b"),
            ])),
            ..Default::default()
        };
        class.metadata.name = Some("ebs".into());
        let mut c = claim();
        c.metadata.annotations = None;
        let p = prepare(&c, &class, None, &config, CAPS, cluster).expect("prepared");
        assert_eq!(p.migrated, Some(Plugin::AwsEbs));
        assert_eq!(p.fs_type.as_deref(), Some("xfs"));
        let mut params: Vec<(&str, &str)> = p
            .request
            .parameters
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/pv"))
            .collect();
        params.sort();
        assert_eq!(
            params,
            vec![
                ("allowautoiopspergbincrease", "true"),
                ("iopsPerGB", "10"),
                ("type", "io1"),
            ]
        );
        let zone = |z: &str| Topology {
            segments: HashMap::from([(ZONE_KEY.to_string(), z.to_string())]),
        };
        assert_eq!(
            p.request.accessibility_requirements,
            Some(TopologyRequirement {
                requisite: vec![zone("us-east-1b")],
                preferred: vec![zone("us-east-1b")],
            }),
            "the zone parameter became the allowed topology"
        );

        let volume = Volume {
            volume_id: "vol-0abc".into(),
            accessible_topology: vec![zone("us-east-1b")],
            ..Default::default()
        };
        let pv = finish(&p, &c, &class, &config, CAPS, &volume).expect("pv");
        let annotations = pv.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get(PROVISIONED_BY_ANNOTATION)
                .map(String::as_str),
            Some("kubernetes.io/aws-ebs")
        );
        let spec = pv.spec.clone().unwrap_or_default();
        assert!(spec.csi.is_none());
        let ebs = spec
            .aws_elastic_block_store
            .clone()
            .expect("in-tree source");
        assert_eq!(
            (ebs.volume_id.as_str(), ebs.fs_type.as_deref()),
            ("vol-0abc", Some("xfs"))
        );
        let term = &spec
            .node_affinity
            .and_then(|a| a.required)
            .expect("affinity")
            .node_selector_terms[0];
        let exprs: Vec<(String, Vec<String>)> = term
            .match_expressions
            .iter()
            .flatten()
            .map(|r| (r.key.clone(), r.values.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            exprs,
            vec![
                (
                    "topology.kubernetes.io/zone".into(),
                    vec!["us-east-1b".into()]
                ),
                (
                    "topology.kubernetes.io/region".into(),
                    vec!["us-east-1".into()]
                ),
            ]
        );
        let labels = pv.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels
                .get("topology.kubernetes.io/zone")
                .map(String::as_str),
            Some("us-east-1b")
        );

        // A volume whose PV cannot take the in-tree source must go.
        let mut bad = class.clone();
        bad.provisioner = "kubernetes.io/gce-pd".into();
        let gce_config = ProvisionerConfig {
            driver_name: "pd.csi.storage.gke.io".into(),
            ..config.clone()
        };
        let mut gce = prepare(
            &c,
            &bad,
            None,
            &gce_config,
            DriverCapabilities::default(),
            cluster,
        )
        .expect("prepared");
        gce.request.accessibility_requirements = None;
        let err = finish(
            &gce,
            &c,
            &bad,
            &gce_config,
            DriverCapabilities::default(),
            &volume,
        )
        .expect_err("a GCE handle has six parts");
        assert!(err.unusable(), "{err}");
    }

    #[test]
    fn prepare_errors() {
        let (nodes, csi_nodes) = cluster();
        let cluster = Cluster {
            nodes: &nodes,
            csi_nodes: &csi_nodes,
        };
        let with = |f: fn(&mut PersistentVolumeClaim, &mut StorageClass)| {
            let (mut c, mut sc) = (claim(), class());
            f(&mut c, &mut sc);
            prepare(&c, &sc, None, &config(), CAPS, cluster).err()
        };
        let cases: Vec<(&str, Option<PrepareError>, Option<PrepareError>)> = vec![
            (
                "selector",
                with(|c, _| {
                    if let Some(s) = c.spec.as_mut() {
                        s.selector = Some(LabelSelector::default());
                    }
                }),
                Some(PrepareError::Selector),
            ),
            (
                "data source",
                with(|c, _| {
                    if let Some(s) = c.spec.as_mut() {
                        s.data_source = Some(TypedLocalObjectReference {
                            kind: "VolumeSnapshot".into(),
                            name: "snap".into(),
                            api_group: Some("snapshot.storage.k8s.io".into()),
                        });
                    }
                }),
                Some(PrepareError::DataSource(
                    ContentSourceError::SnapshotUnsupported,
                )),
            ),
            (
                "no UID",
                with(|c, _| c.metadata.uid = None),
                Some(PrepareError::Naming(NamingError::NoUid)),
            ),
            (
                "selected node unknown",
                with(|c, _| {
                    c.metadata.annotations =
                        Some(map(&[(topology::SELECTED_NODE_ANNOTATION, "node-9")]));
                }),
                Some(PrepareError::Topology(TopologyError::SelectedNodeNotFound(
                    "node-9".into(),
                ))),
            ),
            (
                "annotation template without the annotation",
                with(|c, _| {
                    c.metadata.annotations =
                        Some(map(&[(topology::SELECTED_NODE_ANNOTATION, "node-1")]));
                }),
                Some(PrepareError::Params(ParamsError::MissingAnnotation {
                    key: "csi.storage.k8s.io/node-stage-secret-name",
                    annotation: "example.com/stage-secret".into(),
                    template: "${pvc.annotations['example.com/stage-secret']}".into(),
                })),
            ),
            (
                "unknown reserved parameter",
                with(|_, sc| {
                    if let Some(p) = sc.parameters.as_mut() {
                        p.insert("csi.storage.k8s.io/whatever".into(), "x".into());
                    }
                }),
                Some(PrepareError::Params(ParamsError::UnknownReservedKey(
                    "csi.storage.k8s.io/whatever".into(),
                ))),
            ),
            (
                "no storage request",
                with(|c, _| {
                    if let Some(s) = c.spec.as_mut() {
                        s.resources = None;
                    }
                }),
                Some(PrepareError::Capability(CapabilityError::NoStorageRequest)),
            ),
        ];
        for (name, got, want) in cases {
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn attributes_class_reaches_request_and_pv() {
        use k8s_openapi::api::storage::v1::VolumeAttributesClass;
        let (nodes, csi_nodes) = cluster();
        let cluster = Cluster {
            nodes: &nodes,
            csi_nodes: &csi_nodes,
        };
        let mut c = claim();
        if let Some(s) = c.spec.as_mut() {
            s.volume_attributes_class_name = Some("gold".into());
        }
        let mut sc = class();
        if let Some(p) = sc.parameters.as_mut() {
            p.insert(
                "csi.storage.k8s.io/controller-modify-secret-name".into(),
                "${pvc.name}-modify".into(),
            );
            p.insert(
                "csi.storage.k8s.io/controller-modify-secret-namespace".into(),
                "${pvc.namespace}".into(),
            );
        }
        let mut gold = VolumeAttributesClass {
            driver_name: DRIVER.into(),
            parameters: Some(map(&[("iops", "3000")])),
            ..Default::default()
        };
        gold.metadata.name = Some("gold".into());
        let on = ProvisionerConfig {
            volume_attributes_class: true,
            ..config()
        };
        let caps = DriverCapabilities {
            modify_volume: true,
            ..CAPS
        };

        let p = prepare(&c, &sc, Some(&gold), &on, caps, cluster).expect("prepared");
        assert_eq!(
            p.request.mutable_parameters,
            HashMap::from([("iops".to_string(), "3000".to_string())])
        );
        assert!(
            !p.request
                .parameters
                .keys()
                .any(|k| k.contains("controller-modify")),
            "the modify secret keys are stripped: {:?}",
            p.request.parameters
        );
        assert!(p.request.secrets.is_empty());
        assert_eq!(
            p.pv_secrets.controller_modify,
            Some(SecretRef {
                name: "data-modify".into(),
                namespace: "team-a".into(),
            })
        );
        assert_eq!(p.attributes_class.as_deref(), Some("gold"));
        let volume = Volume {
            volume_id: "vol-1".into(),
            ..Default::default()
        };
        let pv = finish(&p, &c, &sc, &on, caps, &volume).expect("pv");
        assert_eq!(
            pv.spec
                .as_ref()
                .and_then(|s| s.volume_attributes_class_name.as_deref()),
            Some("gold")
        );
        let annotations = pv.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations
                .get(pv::MODIFY_SECRET_NAME_ANNOTATION)
                .map(String::as_str),
            Some("data-modify")
        );
        assert_eq!(
            annotations
                .get(pv::MODIFY_SECRET_NAMESPACE_ANNOTATION)
                .map(String::as_str),
            Some("team-a")
        );

        // The gate off: the class is not looked at, the PV names none.
        let off = ProvisionerConfig {
            volume_attributes_class: false,
            ..config()
        };
        let p = prepare(&c, &sc, None, &off, CAPS, cluster).expect("prepared");
        assert!(p.request.mutable_parameters.is_empty());
        assert_eq!(p.attributes_class, None);

        // The class missing; a driver that cannot modify (refused before
        // the class is looked at).
        assert_eq!(
            prepare(&c, &sc, None, &on, caps, cluster).err(),
            Some(PrepareError::AttributesClass(
                AttributesClassError::Missing("gold".into())
            ))
        );
        assert_eq!(
            prepare(&c, &sc, Some(&gold), &on, CAPS, cluster).err(),
            Some(PrepareError::AttributesClass(
                AttributesClassError::Unsupported
            ))
        );
    }
}
