//! What to do with one claim or one PV, as pure functions of the cached
//! objects, so every branch has a table test.
//!
//! The claim finalizer [`CLAIM_FINALIZER`] is what makes provisioning
//! leak-free: it is on the claim before CreateVolume is called and comes off
//! only once the PV exists (the PV then carries the volume's lifecycle) or,
//! for a claim deleted meanwhile, once the volume is known to be deleted.
//! Upstream has no such marker, so a claim deleted while its volume is being
//! created (or while the provisioner is down after CreateVolume) leaves the
//! volume behind with nothing pointing at it.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::ObjectRef;

use super::pv::{PROVISIONED_BY_ANNOTATION, PV_PROTECTION_FINALIZER, RECLAIM_DELETE};
use super::topology::selected_node;
use crate::common::migration::{Plugin, MIGRATED_TO_ANNOTATION};

/// The key of a claim in the caches and the claim queue.
pub type ClaimKey = ObjectRef<PersistentVolumeClaim>;

/// `namespace/name`, as admins write it.
pub fn display(key: &ClaimKey) -> String {
    format!(
        "{}/{}",
        key.namespace.as_deref().unwrap_or_default(),
        key.name
    )
}

/// On a claim from just before CreateVolume until its PV exists.
pub const CLAIM_FINALIZER: &str = "csiops.dev/volume-provisioning";
/// Which provisioner a claim waits for (set by the PV controller).
pub const STORAGE_PROVISIONER_ANNOTATION: &str = "volume.kubernetes.io/storage-provisioner";
pub const BETA_STORAGE_PROVISIONER_ANNOTATION: &str =
    "volume.beta.kubernetes.io/storage-provisioner";
/// Binding mode that waits for the scheduler's node choice.
pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

/// What the claim needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimAction {
    /// Not ours, already bound, or nothing to do yet; the reason is for
    /// debug logs.
    Nothing(&'static str),
    /// Create the volume and its PV (finalizer first).
    Provision,
    /// The PV exists: only take our finalizer off the claim.
    ReleaseClaim,
    /// The claim is being deleted with our finalizer: find out from the API
    /// server whether its PV exists; if not, delete the volume, then release.
    CleanUp,
    /// The claim's StorageClass is missing; retry later (it may be created).
    ClassMissing(String),
    /// Node deployment: no node is selected and the class binds at once;
    /// race the other nodes for the claim (see `node_deployment`).
    BecomeOwner,
    /// Node deployment: look again later, without an Event (the reason is
    /// for debug logs).
    RetryQuietly(&'static str),
}

fn has_finalizer(finalizers: Option<&Vec<String>>, name: &str) -> bool {
    finalizers.is_some_and(|f| f.iter().any(|x| x == name))
}

/// Whether the claim waits for `driver` (GA or beta annotation). For a
/// driver that is a migration target, also a claim that waits for the
/// in-tree plugin and is marked `pv.kubernetes.io/migrated-to` the driver
/// (how kube-controller-manager before 1.23 handed such claims over; since,
/// it names the driver itself).
pub fn claim_is_for(claim: &PersistentVolumeClaim, driver: &str) -> bool {
    let Some(a) = claim.metadata.annotations.as_ref() else {
        return false;
    };
    let waits_for = |name: &str| {
        [
            STORAGE_PROVISIONER_ANNOTATION,
            BETA_STORAGE_PROVISIONER_ANNOTATION,
        ]
        .iter()
        .any(|k| a.get(*k).map(String::as_str) == Some(name))
    };
    waits_for(driver)
        || Plugin::for_driver(driver).is_some_and(|p| {
            waits_for(p.in_tree_name())
                && a.get(MIGRATED_TO_ANNOTATION).map(String::as_str) == Some(driver)
        })
}

/// The in-tree plugin of `class` when its volumes migrate to `driver`: the
/// class is then this provisioner's, its parameters translated (CSI
/// migration).
pub fn migrated_plugin(class: &StorageClass, driver: &str) -> Option<Plugin> {
    Plugin::for_driver(driver).filter(|p| p.in_tree_name() == class.provisioner)
}

/// Whether claims of `class` are `driver`'s to provision: the class names
/// the driver, or the in-tree plugin that migrates to it.
pub fn class_is_for(class: &StorageClass, driver: &str) -> bool {
    class.provisioner == driver || migrated_plugin(class, driver).is_some()
}

/// Whether the claim carries `finalizer` ([`CLAIM_FINALIZER`], or a node's
/// own in node deployment).
pub fn claim_has_finalizer(claim: &PersistentVolumeClaim, finalizer: &str) -> bool {
    has_finalizer(claim.metadata.finalizers.as_ref(), finalizer)
}

/// The claim's StorageClass name (spec, else the beta annotation).
pub fn class_name(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .or_else(|| {
            claim
                .metadata
                .annotations
                .as_ref()?
                .get("volume.beta.kubernetes.io/storage-class")
                .map(String::as_str)
        })
        .filter(|s| !s.is_empty())
}

/// The decision for `claim`. `class` is the cached class named by the claim;
/// `pv_name` the name of the claim's volume and PV; `pv_cached` whether the
/// cache holds that PV; `finalizer` the claim finalizer of this provisioner.
pub fn claim_action(
    claim: &PersistentVolumeClaim,
    driver: &str,
    class: Option<&StorageClass>,
    pv_name: &str,
    pv_cached: bool,
    finalizer: &str,
) -> ClaimAction {
    // The finalizer has one name for every driver: only the provisioner the
    // claim names (an annotation that stays through deletion) may act on it.
    if !claim_is_for(claim, driver) {
        return ClaimAction::Nothing("claim is for another provisioner");
    }
    let ours = claim_has_finalizer(claim, finalizer);
    if claim.metadata.deletion_timestamp.is_some() {
        return if ours {
            ClaimAction::CleanUp
        } else {
            ClaimAction::Nothing("claim is being deleted")
        };
    }
    let bound_to = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty());
    match (bound_to, ours) {
        (Some(v), true) if v == pv_name => return ClaimAction::ReleaseClaim,
        // Bound to another PV (a matching one appeared while ours was being
        // made): our volume, if it exists, is nobody's. Clean it up first.
        (Some(_), true) => return ClaimAction::CleanUp,
        (Some(_), false) => return ClaimAction::Nothing("claim already has a volume"),
        (None, true) if pv_cached => return ClaimAction::ReleaseClaim,
        (None, false) if pv_cached => return ClaimAction::Nothing("claim already has a volume"),
        (None, _) => {}
    }
    let Some(class_name) = class_name(claim) else {
        return ClaimAction::Nothing("claim has no StorageClass");
    };
    let Some(class) = class else {
        return ClaimAction::ClassMissing(class_name.to_string());
    };
    if !class_is_for(class, driver) {
        return ClaimAction::Nothing("StorageClass is for another provisioner");
    }
    if class.volume_binding_mode.as_deref() == Some(WAIT_FOR_FIRST_CONSUMER)
        && selected_node(claim).is_none()
    {
        return ClaimAction::Nothing("waiting for the scheduler to select a node");
    }
    ClaimAction::Provision
}

/// What a PV needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeAction {
    Nothing(&'static str),
    /// DeleteVolume, then remove the PV (and our protection finalizer).
    Delete,
    /// Only take the protection finalizer off (Retain now, or the PV was
    /// never ours to delete).
    RemoveFinalizer,
}

/// Whether `driver` provisioned the PV. For a driver that is a migration
/// target, also a PV with the in-tree source of the plugin that migrates to
/// it, provisioned by that plugin's name (by the plugin itself before the
/// migration, or by us for an in-tree class since) and marked
/// `pv.kubernetes.io/migrated-to` the driver by kube-controller-manager.
/// Without that mark kube-controller-manager's in-tree plugin deletes the
/// volume itself (migration turned off), so the PV is not ours.
pub fn pv_is_ours(pv: &PersistentVolume, driver: &str) -> bool {
    let annotation = |key: &str| {
        pv.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let provisioned_by = annotation(PROVISIONED_BY_ANNOTATION);
    let spec = pv.spec.as_ref();
    let csi_driver = spec
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|c| c.driver == driver);
    if provisioned_by == Some(driver) && csi_driver {
        return true;
    }
    Plugin::for_driver(driver).is_some_and(|plugin| {
        spec.and_then(Plugin::of_spec) == Some(plugin)
            && provisioned_by == Some(plugin.in_tree_name())
            && annotation(MIGRATED_TO_ANNOTATION) == Some(driver)
    })
}

/// The decision for `pv`.
pub fn volume_action(pv: &PersistentVolume, driver: &str) -> VolumeAction {
    if !pv_is_ours(pv, driver) {
        return VolumeAction::Nothing("not provisioned by this driver");
    }
    let protected = has_finalizer(pv.metadata.finalizers.as_ref(), PV_PROTECTION_FINALIZER);
    let deleting = pv.metadata.deletion_timestamp.is_some();
    let policy = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    if policy != Some(RECLAIM_DELETE) {
        // Retain (or Recycle): the volume stays; our finalizer must not keep
        // the PV object alive.
        return if protected {
            VolumeAction::RemoveFinalizer
        } else {
            VolumeAction::Nothing("reclaim policy keeps the volume")
        };
    }
    match phase {
        Some("Released") | Some("Failed") => VolumeAction::Delete,
        // Deleted by hand while not in use: kubernetes.io/pv-protection lets
        // that happen only once the PV is unbound; with our finalizer the
        // volume is deleted too instead of leaking.
        Some("Available") | Some("Pending") | None if deleting && protected => VolumeAction::Delete,
        _ if deleting && !protected => VolumeAction::Nothing("PV is going away"),
        _ => VolumeAction::Nothing("PV is in use or not released"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        CSIPersistentVolumeSource, PersistentVolumeClaimSpec, PersistentVolumeSpec,
        PersistentVolumeStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    const DRIVER: &str = "test.csi.csiops.dev";
    const PV: &str = "pvc-0000";

    fn claim(edit: impl FnOnce(&mut PersistentVolumeClaim)) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: Some("fast".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        c.metadata.annotations = Some(BTreeMap::from([(
            STORAGE_PROVISIONER_ANNOTATION.to_string(),
            DRIVER.to_string(),
        )]));
        edit(&mut c);
        c
    }

    fn class(mode: &str) -> StorageClass {
        StorageClass {
            provisioner: DRIVER.into(),
            volume_binding_mode: Some(mode.into()),
            ..Default::default()
        }
    }

    fn deleted() -> Option<Time> {
        Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
    }

    fn with_finalizer(c: &mut PersistentVolumeClaim) {
        c.metadata.finalizers = Some(vec![
            "kubernetes.io/pvc-protection".into(),
            CLAIM_FINALIZER.into(),
        ]);
    }

    #[test]
    fn claim_decisions() {
        let immediate = class("Immediate");
        let wffc = class(WAIT_FOR_FIRST_CONSUMER);
        let other = StorageClass {
            provisioner: "other".into(),
            ..class("Immediate")
        };
        use ClaimAction::*;
        let cases: Vec<(
            &str,
            PersistentVolumeClaim,
            Option<&StorageClass>,
            bool,
            ClaimAction,
        )> = vec![
            (
                "fresh claim",
                claim(|_| {}),
                Some(&immediate),
                false,
                Provision,
            ),
            (
                "retry after the finalizer is on",
                claim(with_finalizer),
                Some(&immediate),
                false,
                Provision,
            ),
            (
                "beta annotation",
                claim(|c| {
                    c.metadata.annotations = Some(BTreeMap::from([(
                        BETA_STORAGE_PROVISIONER_ANNOTATION.to_string(),
                        DRIVER.to_string(),
                    )]));
                }),
                Some(&immediate),
                false,
                Provision,
            ),
            (
                "other provisioner",
                claim(|c| {
                    c.metadata.annotations = Some(BTreeMap::from([(
                        STORAGE_PROVISIONER_ANNOTATION.to_string(),
                        "x".to_string(),
                    )]));
                }),
                Some(&immediate),
                false,
                Nothing("claim is for another provisioner"),
            ),
            (
                "no annotation",
                claim(|c| c.metadata.annotations = None),
                Some(&immediate),
                false,
                Nothing("claim is for another provisioner"),
            ),
            (
                "class of another provisioner",
                claim(|_| {}),
                Some(&other),
                false,
                Nothing("StorageClass is for another provisioner"),
            ),
            (
                "class missing",
                claim(|_| {}),
                None,
                false,
                ClassMissing("fast".into()),
            ),
            (
                "no class",
                claim(|c| {
                    c.spec
                        .as_mut()
                        .map(|s| s.storage_class_name = None)
                        .unwrap_or(())
                }),
                None,
                false,
                Nothing("claim has no StorageClass"),
            ),
            (
                "delayed binding, no node yet",
                claim(|_| {}),
                Some(&wffc),
                false,
                Nothing("waiting for the scheduler to select a node"),
            ),
            (
                "delayed binding, node selected",
                claim(|c| {
                    c.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert("volume.kubernetes.io/selected-node".into(), "n1".into());
                }),
                Some(&wffc),
                false,
                Provision,
            ),
            (
                "bound",
                claim(|c| {
                    c.spec
                        .as_mut()
                        .map(|s| s.volume_name = Some("pv-1".into()))
                        .unwrap_or(())
                }),
                Some(&immediate),
                false,
                Nothing("claim already has a volume"),
            ),
            (
                "bound to our PV, our finalizer still on",
                claim(|c| {
                    with_finalizer(c);
                    c.spec
                        .as_mut()
                        .map(|s| s.volume_name = Some(PV.into()))
                        .unwrap_or(());
                }),
                Some(&immediate),
                false,
                ReleaseClaim,
            ),
            (
                "PV created, not bound yet",
                claim(with_finalizer),
                Some(&immediate),
                true,
                ReleaseClaim,
            ),
            (
                "PV created by an earlier run",
                claim(|_| {}),
                Some(&immediate),
                true,
                Nothing("claim already has a volume"),
            ),
            (
                "deleted with our finalizer",
                claim(|c| {
                    with_finalizer(c);
                    c.metadata.deletion_timestamp = deleted();
                }),
                Some(&immediate),
                false,
                CleanUp,
            ),
            (
                "deleted with our finalizer, class gone",
                claim(|c| {
                    with_finalizer(c);
                    c.metadata.deletion_timestamp = deleted();
                }),
                None,
                true,
                CleanUp,
            ),
            (
                "deleted without it",
                claim(|c| c.metadata.deletion_timestamp = deleted()),
                Some(&immediate),
                false,
                Nothing("claim is being deleted"),
            ),
        ];
        for (name, c, class, pv, want) in cases {
            assert_eq!(
                claim_action(&c, DRIVER, class, PV, pv, CLAIM_FINALIZER),
                want,
                "{name}"
            );
        }
    }

    /// CSI migration: claims of in-tree classes and in-tree PVs of the
    /// plugin that migrates to the driver.
    #[test]
    fn migrated_claims_and_volumes() {
        use k8s_openapi::api::core::v1::AWSElasticBlockStoreVolumeSource;
        const EBS: &str = "ebs.csi.aws.com";
        const IN_TREE: &str = "kubernetes.io/aws-ebs";
        let in_tree = StorageClass {
            provisioner: IN_TREE.into(),
            ..class("Immediate")
        };
        let gce = StorageClass {
            provisioner: "kubernetes.io/gce-pd".into(),
            ..class("Immediate")
        };
        let annotated = |pairs: &[(&str, &str)]| {
            claim(|c| {
                c.metadata.annotations = Some(
                    pairs
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                )
            })
        };
        use ClaimAction::*;
        let cases = [
            (
                "kcm names the driver, class of the in-tree plugin",
                annotated(&[(STORAGE_PROVISIONER_ANNOTATION, EBS)]),
                &in_tree,
                EBS,
                Provision,
            ),
            (
                "names the in-tree plugin, migrated to the driver",
                annotated(&[
                    (BETA_STORAGE_PROVISIONER_ANNOTATION, IN_TREE),
                    (MIGRATED_TO_ANNOTATION, EBS),
                ]),
                &in_tree,
                EBS,
                Provision,
            ),
            (
                "names the in-tree plugin, not migrated",
                annotated(&[(STORAGE_PROVISIONER_ANNOTATION, IN_TREE)]),
                &in_tree,
                EBS,
                Nothing("claim is for another provisioner"),
            ),
            (
                "class of another in-tree plugin",
                annotated(&[(STORAGE_PROVISIONER_ANNOTATION, EBS)]),
                &gce,
                EBS,
                Nothing("StorageClass is for another provisioner"),
            ),
            (
                "a driver that is no migration target",
                annotated(&[(STORAGE_PROVISIONER_ANNOTATION, DRIVER)]),
                &in_tree,
                DRIVER,
                Nothing("StorageClass is for another provisioner"),
            ),
        ];
        for (name, c, class, driver, want) in cases {
            assert_eq!(
                claim_action(&c, driver, Some(class), PV, false, CLAIM_FINALIZER),
                want,
                "{name}"
            );
        }
        assert_eq!(migrated_plugin(&in_tree, EBS), Some(Plugin::AwsEbs));
        assert_eq!(migrated_plugin(&in_tree, DRIVER), None);

        let ebs_pv = |annotations: &[(&str, &str)]| {
            pv("Delete", "Released", |p| {
                if let Some(s) = p.spec.as_mut() {
                    s.csi = None;
                    s.aws_elastic_block_store = Some(AWSElasticBlockStoreVolumeSource {
                        volume_id: "vol-1".into(),
                        ..Default::default()
                    });
                }
                p.metadata.annotations = Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                );
            })
        };
        let migrated = ebs_pv(&[
            (PROVISIONED_BY_ANNOTATION, IN_TREE),
            (MIGRATED_TO_ANNOTATION, EBS),
        ]);
        assert_eq!(volume_action(&migrated, EBS), VolumeAction::Delete);
        assert_eq!(
            volume_action(&migrated, DRIVER),
            VolumeAction::Nothing("not provisioned by this driver")
        );
        for (name, p) in [
            (
                "not marked migrated: kcm's in-tree plugin deletes it",
                ebs_pv(&[(PROVISIONED_BY_ANNOTATION, IN_TREE)]),
            ),
            (
                "static in-tree PV",
                ebs_pv(&[(MIGRATED_TO_ANNOTATION, EBS)]),
            ),
            (
                "provisioned by another plugin",
                ebs_pv(&[
                    (PROVISIONED_BY_ANNOTATION, "kubernetes.io/gce-pd"),
                    (MIGRATED_TO_ANNOTATION, EBS),
                ]),
            ),
        ] {
            assert_eq!(
                volume_action(&p, EBS),
                VolumeAction::Nothing("not provisioned by this driver"),
                "{name}"
            );
        }
    }

    fn pv(policy: &str, phase: &str, edit: impl FnOnce(&mut PersistentVolume)) -> PersistentVolume {
        let mut pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                persistent_volume_reclaim_policy: Some(policy.into()),
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.into(),
                    volume_handle: "vol-1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        pv.metadata.annotations = Some(BTreeMap::from([(
            PROVISIONED_BY_ANNOTATION.to_string(),
            DRIVER.to_string(),
        )]));
        edit(&mut pv);
        pv
    }

    fn protect(pv: &mut PersistentVolume) {
        pv.metadata.finalizers = Some(vec![
            "kubernetes.io/pv-protection".into(),
            PV_PROTECTION_FINALIZER.into(),
        ]);
    }

    #[test]
    fn volume_decisions() {
        use VolumeAction::*;
        let cases: Vec<(&str, PersistentVolume, VolumeAction)> = vec![
            ("released, Delete", pv("Delete", "Released", |_| {}), Delete),
            ("failed, Delete", pv("Delete", "Failed", protect), Delete),
            (
                "bound",
                pv("Delete", "Bound", protect),
                Nothing("PV is in use or not released"),
            ),
            (
                "bound and deleted by hand",
                pv("Delete", "Bound", |p| {
                    protect(p);
                    p.metadata.deletion_timestamp = deleted();
                }),
                Nothing("PV is in use or not released"),
            ),
            (
                "available and deleted by hand",
                pv("Delete", "Available", |p| {
                    protect(p);
                    p.metadata.deletion_timestamp = deleted();
                }),
                Delete,
            ),
            (
                "deleted, unprotected",
                pv("Delete", "Available", |p| {
                    p.metadata.deletion_timestamp = deleted()
                }),
                Nothing("PV is going away"),
            ),
            (
                "released, Retain",
                pv("Retain", "Released", |_| {}),
                Nothing("reclaim policy keeps the volume"),
            ),
            (
                "switched to Retain, finalizer left",
                pv("Retain", "Bound", protect),
                RemoveFinalizer,
            ),
            (
                "other driver's PV",
                pv("Delete", "Released", |p| {
                    p.metadata.annotations = Some(BTreeMap::from([(
                        PROVISIONED_BY_ANNOTATION.to_string(),
                        "other".to_string(),
                    )]));
                }),
                Nothing("not provisioned by this driver"),
            ),
            (
                "static PV of this driver",
                pv("Delete", "Released", |p| p.metadata.annotations = None),
                Nothing("not provisioned by this driver"),
            ),
        ];
        for (name, p, want) in cases {
            assert_eq!(volume_action(&p, DRIVER), want, "{name}");
        }
    }
}
