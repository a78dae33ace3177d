//! The PersistentVolume for a created volume, as upstream external-provisioner
//! and its provisioner library write it:
//!
//! - name = the volume name; annotations `pv.kubernetes.io/provisioned-by:
//!   <driver>` and `volume.kubernetes.io/provisioner-deletion-secret-name` /
//!   `-namespace` (the provisioner secret, for DeleteVolume; both empty
//!   strings when there is none, as upstream writes them, so deletion knows
//!   "no secret" without reading the StorageClass again);
//!   `volume.kubernetes.io/controller-modify-secret-name` / `-namespace`
//!   when the class names a ControllerModify secret (the external-resizer's
//!   ControllerModifyVolume reads them; absent otherwise, as upstream);
//! - finalizer `external-provisioner.volume.kubernetes.io/finalizer` when
//!   PV deletion protection is on and the reclaim policy is Delete (upstream
//!   adds it at creation and strips it from Retain/Recycle PVs at once; this
//!   writes the end state);
//! - spec: access modes and volume mode of the claim, capacity from the driver
//!   (or the request when it answered 0, see
//!   [`super::capabilities::provisioned_capacity`]), claimRef, reclaim policy,
//!   mount options and class name, the claim's VolumeAttributesClass
//!   (gate on, see [`super::attributes_class`]), the CSI source (driver, volume handle,
//!   volume context as attributes, fsType unless Block, the five secret
//!   references) and node affinity in Form 1 of the CSI design doc.

use std::collections::BTreeMap;

use csiops_proto::csi::v1::{Topology, Volume};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::capabilities::{is_block, CapabilityError, READ_ONLY_MANY, STORAGE};
use super::params::{PvSecretRefs, SecretRef};
use super::quantity;

/// Names the provisioner of a dynamically provisioned PV.
pub const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";
/// Where DeleteVolume finds its secret.
pub const DELETION_SECRET_NAME_ANNOTATION: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-name";
pub const DELETION_SECRET_NAMESPACE_ANNOTATION: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// Where the external-resizer finds the ControllerModifyVolume secret.
pub const MODIFY_SECRET_NAME_ANNOTATION: &str =
    "volume.kubernetes.io/controller-modify-secret-name";
pub const MODIFY_SECRET_NAMESPACE_ANNOTATION: &str =
    "volume.kubernetes.io/controller-modify-secret-namespace";
/// Keeps the PV until the volume behind it is deleted.
pub const PV_PROTECTION_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// Volume attribute upstream stamps with its instance identity.
pub const PROVISIONER_IDENTITY_KEY: &str = "storage.kubernetes.io/csiProvisionerIdentity";
pub const RECLAIM_DELETE: &str = "Delete";

/// Why the PV cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PvError {
    #[error("the claim has no {0}")]
    Claim(&'static str),
    #[error("the StorageClass has no name")]
    ClassName,
    #[error("the driver returned a volume without an ID")]
    NoVolumeId,
    #[error(transparent)]
    Capability(#[from] CapabilityError),
}

/// Provisioner-wide settings that shape the PV.
#[derive(Debug, Clone, Copy, Default)]
pub struct PvOptions<'a> {
    /// Driver name (`CSIPersistentVolumeSource.driver`, provisioned-by).
    pub driver: &'a str,
    /// Whether the driver has VOLUME_ACCESSIBILITY_CONSTRAINTS (and topology
    /// is enabled): only then does the PV get node affinity.
    pub supports_topology: bool,
    /// PV deletion protection (upstream's HonorPVReclaimPolicy).
    pub protection_finalizer: bool,
    /// `--controller-publish-readonly`: a claim whose only access mode is
    /// ReadOnlyMany gets `csi.readOnly: true`.
    pub controller_publish_read_only: bool,
    /// Upstream's per-instance identity, stored as volume attribute
    /// `storage.kubernetes.io/csiProvisionerIdentity` when set.
    pub identity: Option<&'a str>,
}

/// What the PV is made from.
#[derive(Debug, Clone, Copy)]
pub struct PvInputs<'a> {
    pub pv_name: &'a str,
    pub claim: &'a PersistentVolumeClaim,
    pub class: &'a StorageClass,
    /// `CreateVolumeResponse.volume`.
    pub volume: &'a Volume,
    /// The checked capacity ([`super::capabilities::provisioned_capacity`]).
    pub capacity_bytes: i64,
    pub fs_type: Option<&'a str>,
    pub provisioner_secret: Option<&'a SecretRef>,
    pub secrets: &'a PvSecretRefs,
    /// The claim's VolumeAttributesClass (already `None` with the gate off).
    pub attributes_class: Option<&'a str>,
}

/// The PV's StorageClass name (empty when it has none), the `class` label
/// of the operation metrics.
pub fn class_of(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

/// `VolumeNodeAffinity` in Form 1: one term per accessible segment, one
/// `In` expression with exactly one value per key ("The provisioner will
/// always choose Form 1, i.e. all `values` will have at most 1 element.").
/// Keys are sorted; empty segments are skipped; `None` when nothing is left
/// (an affinity without terms would be rejected by the API server).
pub fn node_affinity(accessible: &[Topology]) -> Option<VolumeNodeAffinity> {
    let terms: Vec<NodeSelectorTerm> = accessible
        .iter()
        .filter(|t| !t.segments.is_empty())
        .map(|t| {
            let sorted: BTreeMap<&String, &String> = t.segments.iter().collect();
            NodeSelectorTerm {
                match_expressions: Some(
                    sorted
                        .into_iter()
                        .map(|(k, v)| NodeSelectorRequirement {
                            key: k.clone(),
                            operator: "In".into(),
                            values: Some(vec![v.clone()]),
                        })
                        .collect(),
                ),
                match_fields: None,
            }
        })
        .collect();
    (!terms.is_empty()).then_some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    })
}

/// The claimRef binding the PV to its claim (what client-go's
/// `reference.GetReference` makes of a PVC).
pub fn claim_ref(claim: &PersistentVolumeClaim) -> Result<ObjectReference, PvError> {
    let meta = &claim.metadata;
    let need = |v: &Option<String>, what| match v.as_deref() {
        Some(s) if !s.is_empty() => Ok(s.to_string()),
        _ => Err(PvError::Claim(what)),
    };
    Ok(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(need(&meta.namespace, "namespace")?),
        name: Some(need(&meta.name, "name")?),
        uid: Some(need(&meta.uid, "UID")?),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    })
}

/// The PersistentVolume to create.
pub fn build_pv(
    inputs: &PvInputs<'_>,
    options: &PvOptions<'_>,
) -> Result<PersistentVolume, PvError> {
    let claim_spec = inputs.claim.spec.clone().unwrap_or_default();
    let block = is_block(&claim_spec)?;
    if inputs.volume.volume_id.is_empty() {
        return Err(PvError::NoVolumeId);
    }
    let class_name = inputs
        .class
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or(PvError::ClassName)?;
    let reclaim_policy = inputs.class.reclaim_policy.clone();

    let (secret_name, secret_namespace) = match inputs.provisioner_secret {
        Some(s) => (s.name.clone(), s.namespace.clone()),
        None => (String::new(), String::new()),
    };
    let mut annotations = BTreeMap::from([
        (
            PROVISIONED_BY_ANNOTATION.to_string(),
            options.driver.to_string(),
        ),
        (DELETION_SECRET_NAME_ANNOTATION.to_string(), secret_name),
        (
            DELETION_SECRET_NAMESPACE_ANNOTATION.to_string(),
            secret_namespace,
        ),
    ]);
    if let Some(modify) = &inputs.secrets.controller_modify {
        annotations.insert(MODIFY_SECRET_NAME_ANNOTATION.into(), modify.name.clone());
        annotations.insert(
            MODIFY_SECRET_NAMESPACE_ANNOTATION.into(),
            modify.namespace.clone(),
        );
    }
    let finalizers = (options.protection_finalizer
        && reclaim_policy.as_deref() == Some(RECLAIM_DELETE))
    .then(|| vec![PV_PROTECTION_FINALIZER.to_string()]);

    let mut attributes = BTreeMap::new();
    if let Some(id) = options.identity {
        attributes.insert(PROVISIONER_IDENTITY_KEY.to_string(), id.to_string());
    }
    // The driver's context wins over the identity, as upstream.
    attributes.extend(
        inputs
            .volume
            .volume_context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );

    let access_modes = claim_spec.access_modes.clone();
    let read_only = options.controller_publish_read_only
        && access_modes.as_deref() == Some(&[READ_ONLY_MANY.to_string()][..]);
    let secrets = inputs.secrets;
    let csi = CSIPersistentVolumeSource {
        driver: options.driver.to_string(),
        volume_handle: inputs.volume.volume_id.clone(),
        volume_attributes: (!attributes.is_empty()).then_some(attributes),
        fs_type: if block {
            None
        } else {
            inputs.fs_type.filter(|f| !f.is_empty()).map(str::to_string)
        },
        read_only: read_only.then_some(true),
        controller_publish_secret_ref: secrets.controller_publish.as_ref().map(Into::into),
        node_stage_secret_ref: secrets.node_stage.as_ref().map(Into::into),
        node_publish_secret_ref: secrets.node_publish.as_ref().map(Into::into),
        controller_expand_secret_ref: secrets.controller_expand.as_ref().map(Into::into),
        node_expand_secret_ref: secrets.node_expand.as_ref().map(Into::into),
    };

    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(inputs.pv_name.to_string()),
            annotations: Some(annotations),
            finalizers,
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes,
            capacity: Some(BTreeMap::from([(
                STORAGE.to_string(),
                quantity::from_bytes(inputs.capacity_bytes),
            )])),
            claim_ref: Some(claim_ref(inputs.claim)?),
            csi: Some(csi),
            mount_options: inputs.class.mount_options.clone(),
            node_affinity: if options.supports_topology {
                node_affinity(&inputs.volume.accessible_topology)
            } else {
                None
            },
            persistent_volume_reclaim_policy: reclaim_policy,
            storage_class_name: Some(class_name),
            volume_mode: claim_spec.volume_mode.clone(),
            volume_attributes_class_name: inputs.attributes_class.map(str::to_string),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, SecretReference};
    use serde_json::json;

    use super::*;

    const DRIVER: &str = "hostpath.csi.k8s.io";

    fn claim(modes: &[&str], volume_mode: Option<&str>) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                volume_mode: volume_mode.map(str::to_string),
                storage_class_name: Some("fast".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        c.metadata.name = Some("data-web-0".into());
        c.metadata.namespace = Some("team-a".into());
        c.metadata.uid = Some("9f3b1c2a-5d4e-4f60-8a7b-0c1d2e3f4a5b".into());
        c.metadata.resource_version = Some("4711".into());
        c
    }

    fn class(reclaim: Option<&str>, mount_options: Option<&[&str]>) -> StorageClass {
        let mut sc = StorageClass {
            provisioner: DRIVER.into(),
            reclaim_policy: reclaim.map(str::to_string),
            mount_options: mount_options.map(|m| m.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        sc.metadata.name = Some("fast".into());
        sc
    }

    fn topo(pairs: &[(&str, &str)]) -> Topology {
        Topology {
            segments: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn volume(accessible: Vec<Topology>) -> Volume {
        Volume {
            capacity_bytes: 2 << 30,
            volume_id: "vol-42".into(),
            volume_context: HashMap::from([("pool".to_string(), "gold".to_string())]),
            content_source: None,
            accessible_topology: accessible,
        }
    }

    fn sref(name: &str) -> SecretRef {
        SecretRef {
            name: name.into(),
            namespace: "kube-system".into(),
        }
    }

    #[test]
    fn full_pv() {
        let c = claim(&["ReadWriteOnce"], Some("Filesystem"));
        let sc = class(Some("Delete"), Some(&["noatime"]));
        let v = volume(vec![topo(&[("zone", "a"), ("rack", "1")])]);
        let secrets = PvSecretRefs {
            controller_publish: Some(sref("cp")),
            node_stage: Some(sref("ns")),
            node_publish: Some(sref("np")),
            controller_expand: Some(sref("ce")),
            node_expand: Some(sref("ne")),
            controller_modify: Some(sref("cm")),
        };
        let prov = sref("prov");
        let pv = build_pv(
            &PvInputs {
                pv_name: "pvc-9f3b1c2a-5d4e-4f60-8a7b-0c1d2e3f4a5b",
                claim: &c,
                class: &sc,
                volume: &v,
                capacity_bytes: 2 << 30,
                fs_type: Some("ext4"),
                provisioner_secret: Some(&prov),
                secrets: &secrets,
                attributes_class: Some("gold"),
            },
            &PvOptions {
                driver: DRIVER,
                supports_topology: true,
                protection_finalizer: true,
                controller_publish_read_only: false,
                identity: Some("1700000000000-1234-hostpath.csi.k8s.io"),
            },
        )
        .expect("pv");
        let secret = |n: &str| json!({"name": n, "namespace": "kube-system"});
        assert_eq!(
            serde_json::to_value(&pv).expect("json"),
            json!({
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {
                    "name": "pvc-9f3b1c2a-5d4e-4f60-8a7b-0c1d2e3f4a5b",
                    "annotations": {
                        "pv.kubernetes.io/provisioned-by": DRIVER,
                        "volume.kubernetes.io/provisioner-deletion-secret-name": "prov",
                        "volume.kubernetes.io/provisioner-deletion-secret-namespace": "kube-system",
                        "volume.kubernetes.io/controller-modify-secret-name": "cm",
                        "volume.kubernetes.io/controller-modify-secret-namespace": "kube-system",
                    },
                    "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
                },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "capacity": {"storage": "2Gi"},
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": "team-a",
                        "name": "data-web-0",
                        "uid": "9f3b1c2a-5d4e-4f60-8a7b-0c1d2e3f4a5b",
                        "resourceVersion": "4711",
                    },
                    "csi": {
                        "driver": DRIVER,
                        "volumeHandle": "vol-42",
                        "fsType": "ext4",
                        "volumeAttributes": {
                            "pool": "gold",
                            "storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-1234-hostpath.csi.k8s.io",
                        },
                        "controllerPublishSecretRef": secret("cp"),
                        "nodeStageSecretRef": secret("ns"),
                        "nodePublishSecretRef": secret("np"),
                        "controllerExpandSecretRef": secret("ce"),
                        "nodeExpandSecretRef": secret("ne"),
                    },
                    "mountOptions": ["noatime"],
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": "rack", "operator": "In", "values": ["1"]},
                            {"key": "zone", "operator": "In", "values": ["a"]},
                        ]},
                    ]}},
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": "fast",
                    "volumeAttributesClassName": "gold",
                    "volumeMode": "Filesystem",
                },
            })
        );
    }

    #[test]
    fn variations() {
        let no_secrets = PvSecretRefs::default();
        let opts = PvOptions {
            driver: DRIVER,
            supports_topology: true,
            ..PvOptions::default()
        };
        type Check = fn(&PersistentVolume);
        let cases: Vec<(
            &str,
            PersistentVolumeClaim,
            StorageClass,
            Volume,
            PvOptions,
            Check,
        )> = vec![
            (
                // Upstream: "Set FSType if PV is not Block Volume".
                "block: no fsType, volume mode kept",
                claim(&["ReadWriteOnce"], Some("Block")),
                class(Some("Delete"), None),
                volume(vec![]),
                opts,
                |pv| {
                    let s = pv.spec.as_ref().expect("spec");
                    assert_eq!(s.volume_mode.as_deref(), Some("Block"));
                    assert_eq!(s.csi.as_ref().and_then(|c| c.fs_type.clone()), None);
                    assert_eq!(s.node_affinity, None, "no accessible topology");
                },
            ),
            (
                "no provisioner secret: empty deletion annotations",
                claim(&["ReadWriteOnce"], None),
                class(Some("Delete"), None),
                volume(vec![]),
                opts,
                |pv| {
                    let a = pv.metadata.annotations.clone().unwrap_or_default();
                    assert_eq!(
                        a.get(DELETION_SECRET_NAME_ANNOTATION).map(String::as_str),
                        Some("")
                    );
                    assert_eq!(
                        a.get(DELETION_SECRET_NAMESPACE_ANNOTATION)
                            .map(String::as_str),
                        Some("")
                    );
                    assert_eq!(pv.metadata.finalizers, None, "protection off");
                    // No modify secret: no annotation at all, as upstream.
                    assert!(!a.contains_key(MODIFY_SECRET_NAME_ANNOTATION));
                    assert!(!a.contains_key(MODIFY_SECRET_NAMESPACE_ANNOTATION));
                    let s = pv.spec.as_ref().expect("spec");
                    assert_eq!(s.volume_attributes_class_name, None);
                },
            ),
            (
                "Retain: no protection finalizer",
                claim(&["ReadWriteOnce"], None),
                class(Some("Retain"), None),
                volume(vec![]),
                PvOptions {
                    protection_finalizer: true,
                    ..opts
                },
                |pv| {
                    assert_eq!(pv.metadata.finalizers, None);
                    assert_eq!(
                        pv.spec
                            .as_ref()
                            .and_then(|s| s.persistent_volume_reclaim_policy.clone()),
                        Some("Retain".into())
                    );
                },
            ),
            (
                "no topology support: no node affinity",
                claim(&["ReadWriteOnce"], None),
                class(Some("Delete"), None),
                volume(vec![topo(&[("zone", "a")])]),
                PvOptions {
                    supports_topology: false,
                    ..opts
                },
                |pv| assert_eq!(pv.spec.as_ref().and_then(|s| s.node_affinity.clone()), None),
            ),
            (
                "ROX only with --controller-publish-readonly",
                claim(&["ReadOnlyMany"], None),
                class(Some("Delete"), None),
                volume(vec![]),
                PvOptions {
                    controller_publish_read_only: true,
                    ..opts
                },
                |pv| {
                    let c = pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.csi.clone())
                        .unwrap_or_default();
                    assert_eq!(c.read_only, Some(true));
                },
            ),
            (
                "ROX among others stays writable",
                claim(&["ReadOnlyMany", "ReadWriteMany"], None),
                class(Some("Delete"), None),
                volume(vec![]),
                PvOptions {
                    controller_publish_read_only: true,
                    ..opts
                },
                |pv| {
                    let c = pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.csi.clone())
                        .unwrap_or_default();
                    assert_eq!(c.read_only, None);
                },
            ),
            (
                "no identity: only the driver's context",
                claim(&["ReadWriteOnce"], None),
                class(None, None),
                volume(vec![]),
                opts,
                |pv| {
                    let c = pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.csi.clone())
                        .unwrap_or_default();
                    assert_eq!(
                        c.volume_attributes,
                        Some(BTreeMap::from([("pool".to_string(), "gold".to_string())]))
                    );
                    let s = pv.spec.clone().unwrap_or_default();
                    assert_eq!(s.persistent_volume_reclaim_policy, None);
                    assert_eq!(s.volume_mode, None);
                    assert_eq!(s.mount_options, None);
                },
            ),
        ];
        for (name, c, sc, v, o, check) in cases {
            let pv = build_pv(
                &PvInputs {
                    pv_name: "pvc-1",
                    claim: &c,
                    class: &sc,
                    volume: &v,
                    capacity_bytes: 1000,
                    fs_type: Some("xfs"),
                    provisioner_secret: None,
                    secrets: &no_secrets,
                    attributes_class: None,
                },
                &o,
            );
            match pv {
                Ok(pv) => {
                    assert_eq!(
                        pv.spec.as_ref().and_then(|s| s.capacity.clone()),
                        Some(BTreeMap::from([(
                            STORAGE.to_string(),
                            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1k".into())
                        )])),
                        "{name}"
                    );
                    check(&pv);
                }
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }

    #[test]
    fn errors() {
        let no_secrets = PvSecretRefs::default();
        let opts = PvOptions {
            driver: DRIVER,
            ..PvOptions::default()
        };
        let mut no_uid = claim(&["ReadWriteOnce"], None);
        no_uid.metadata.uid = None;
        let mut unnamed_class = class(None, None);
        unnamed_class.metadata.name = None;
        let mut no_id = volume(vec![]);
        no_id.volume_id.clear();
        let cases: Vec<(&str, PersistentVolumeClaim, StorageClass, Volume, PvError)> = vec![
            (
                "claim without UID",
                no_uid,
                class(None, None),
                volume(vec![]),
                PvError::Claim("UID"),
            ),
            (
                "class without name",
                claim(&["ReadWriteOnce"], None),
                unnamed_class,
                volume(vec![]),
                PvError::ClassName,
            ),
            (
                "volume without ID",
                claim(&["ReadWriteOnce"], None),
                class(None, None),
                no_id,
                PvError::NoVolumeId,
            ),
            (
                "bad volume mode",
                claim(&["ReadWriteOnce"], Some("Raw")),
                class(None, None),
                volume(vec![]),
                PvError::Capability(CapabilityError::UnknownVolumeMode("Raw".into())),
            ),
        ];
        for (name, c, sc, v, want) in cases {
            let got = build_pv(
                &PvInputs {
                    pv_name: "pvc-1",
                    claim: &c,
                    class: &sc,
                    volume: &v,
                    capacity_bytes: 1,
                    fs_type: None,
                    provisioner_secret: None,
                    secrets: &no_secrets,
                    attributes_class: None,
                },
                &opts,
            );
            assert_eq!(got.err(), Some(want), "{name}");
        }
    }

    #[test]
    fn node_affinity_form_1() {
        // The CSI design doc's example: three segments → three terms, one
        // value each.
        let accessible = vec![
            topo(&[("zone", "a"), ("rack", "1")]),
            topo(&[("zone", "b"), ("rack", "1")]),
            topo(&[("zone", "b"), ("rack", "2")]),
            topo(&[]),
        ];
        let got = serde_json::to_value(node_affinity(&accessible)).expect("json");
        let term = |zone: &str, rack: &str| {
            json!({"matchExpressions": [
                {"key": "rack", "operator": "In", "values": [rack]},
                {"key": "zone", "operator": "In", "values": [zone]},
            ]})
        };
        assert_eq!(
            got,
            json!({"required": {"nodeSelectorTerms": [
                term("a", "1"),
                term("b", "1"),
                term("b", "2"),
            ]}})
        );
        assert_eq!(node_affinity(&[]), None);
        assert_eq!(node_affinity(&[topo(&[])]), None);
        assert_eq!(
            SecretReference::from(&sref("x")).namespace.as_deref(),
            Some("kube-system")
        );
    }
}
