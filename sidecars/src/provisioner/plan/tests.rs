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
