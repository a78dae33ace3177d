//! The pure decisions of [`super`], table-driven.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    PersistentVolumeSpec, PersistentVolumeStatus, TypedLocalObjectReference, TypedObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::*;

const DRIVER: &str = "hostpath.csiops.dev";

fn claim(size: &str, mode: Option<&str>) -> PersistentVolumeClaim {
    let mut c = PersistentVolumeClaim {
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some("fast".into()),
            volume_mode: mode.map(str::to_string),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                limits: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    c.metadata.name = Some("restored".into());
    c.metadata.namespace = Some("ns".into());
    c
}

fn with_source(kind: &str, group: Option<&str>, name: &str) -> PersistentVolumeClaim {
    let mut c = claim("1Gi", None);
    if let Some(s) = c.spec.as_mut() {
        s.data_source = Some(TypedLocalObjectReference {
            kind: kind.into(),
            name: name.into(),
            api_group: group.map(str::to_string),
        });
    }
    c
}

fn with_ref(namespace: Option<&str>) -> PersistentVolumeClaim {
    let mut c = claim("1Gi", None);
    if let Some(s) = c.spec.as_mut() {
        s.data_source_ref = Some(TypedObjectReference {
            kind: SNAPSHOT_KIND.into(),
            name: "snap".into(),
            api_group: Some(SNAPSHOT_GROUP.into()),
            namespace: namespace.map(str::to_string),
        });
    }
    c
}

fn class() -> StorageClass {
    let mut sc = StorageClass {
        provisioner: DRIVER.into(),
        ..Default::default()
    };
    sc.metadata.name = Some("fast".into());
    sc
}

fn source(kind: SourceKind, namespace: &str) -> DataSource {
    DataSource {
        kind,
        name: "snap".into(),
        namespace: namespace.into(),
    }
}

#[test]
fn data_source_is_normalised_as_upstream() {
    assert_eq!(data_source(&claim("1Gi", None), false), Ok(None));
    assert_eq!(
        data_source(
            &with_source(SNAPSHOT_KIND, Some(SNAPSHOT_GROUP), "snap"),
            false
        ),
        Ok(Some(source(SourceKind::Snapshot, "ns")))
    );
    assert_eq!(
        data_source(&with_source(CLAIM_KIND, None, "src"), false),
        Ok(Some(DataSource {
            kind: SourceKind::Claim,
            name: "src".into(),
            namespace: "ns".into()
        }))
    );
    assert_eq!(
        data_source(&with_ref(None), false),
        Ok(Some(source(SourceKind::Snapshot, "ns")))
    );
    assert_eq!(
        data_source(&with_ref(Some("other")), false),
        Err(ContentSourceError::CrossNamespaceDisabled)
    );
    assert_eq!(
        data_source(&with_ref(Some("other")), true),
        Ok(Some(source(SourceKind::Snapshot, "other")))
    );
    assert_eq!(
        data_source(
            &with_source(SNAPSHOT_KIND, Some("example.com"), "snap"),
            false
        ),
        Err(ContentSourceError::SnapshotGroup("example.com".into()))
    );
    assert_eq!(
        data_source(&with_source("Bucket", Some("example.com"), "b"), false),
        Err(ContentSourceError::Populator("Bucket".into()))
    );
    assert_eq!(
        data_source(&with_source(CLAIM_KIND, None, ""), false),
        Err(ContentSourceError::NoName("restored".into()))
    );
    assert_eq!(
        ContentSourceError::CrossNamespaceDisabled.to_string(),
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
    );
}

#[test]
fn capabilities_are_required_per_kind() {
    let none = DriverCapabilities::default();
    let all = DriverCapabilities {
        create_delete_snapshot: true,
        clone_volume: true,
        ..none
    };
    assert_eq!(
        check_capabilities(SourceKind::Snapshot, none),
        Err(ContentSourceError::SnapshotUnsupported)
    );
    assert_eq!(
        check_capabilities(SourceKind::Claim, none),
        Err(ContentSourceError::CloneUnsupported)
    );
    assert_eq!(check_capabilities(SourceKind::Snapshot, all), Ok(()));
    assert_eq!(check_capabilities(SourceKind::Claim, all), Ok(()));
}

#[test]
fn reference_grants() {
    let grant = |ns: &str, from_ns: &str, to_name: Option<&str>| -> ReferenceGrant {
        serde_json::from_value(json!({
            "metadata": {"name": "g", "namespace": ns},
            "spec": {
                "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": from_ns}],
                "to": [{"group": SNAPSHOT_GROUP, "kind": SNAPSHOT_KIND, "name": to_name}],
            },
        }))
        .expect("grant")
    };
    let c = with_ref(Some("other"));
    let src = source(SourceKind::Snapshot, "other");
    assert_eq!(is_granted(&c, &src, &[grant("other", "ns", None)]), Ok(()));
    assert_eq!(
        is_granted(&c, &src, &[grant("other", "ns", Some("snap"))]),
        Ok(())
    );
    let refused = Err(ContentSourceError::NotGranted {
        source_namespace: "other".into(),
        name: "snap".into(),
        kind: SNAPSHOT_KIND.into(),
        claim: "ns/restored".into(),
    });
    assert_eq!(is_granted(&c, &src, &[]), refused);
    assert_eq!(
        is_granted(&c, &src, &[grant("other", "ns", Some("else"))]),
        refused
    );
    assert_eq!(
        is_granted(&c, &src, &[grant("other", "third", None)]),
        refused
    );
    assert_eq!(
        is_granted(&c, &src, &[grant("ns", "ns", None)]),
        refused,
        "a grant counts only in the source's namespace"
    );
}

fn snapshot(ready: bool, restore: Option<&str>) -> VolumeSnapshot {
    serde_json::from_value(json!({
        "metadata": {"name": "snap", "namespace": "ns", "uid": "snap-uid"},
        "status": {
            "boundVolumeSnapshotContentName": "content-1",
            "readyToUse": ready,
            "restoreSize": restore,
        },
    }))
    .expect("snapshot")
}

fn content(mode: Option<&str>, allow: Option<&str>) -> VolumeSnapshotContent {
    let annotations = allow.map(|a| json!({ALLOW_VOLUME_MODE_CHANGE: a}));
    serde_json::from_value(json!({
        "metadata": {"name": "content-1", "annotations": annotations},
        "spec": {
            "driver": DRIVER,
            "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "snap-uid"},
            "sourceVolumeMode": mode,
        },
        "status": {"snapshotHandle": "snap-handle-1"},
    }))
    .expect("content")
}

fn restored(handle: &str) -> VolumeContentSource {
    VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: handle.into(),
        })),
    }
}

#[test]
fn snapshot_restore_checks() {
    let c = claim("1Gi", Some("Filesystem"));
    let ok = snapshot_source(
        &c,
        &class(),
        &snapshot(true, Some("1Gi")),
        &content(Some("Filesystem"), None),
        true,
    );
    assert_eq!(ok, Ok(restored("snap-handle-1")));

    let small = snapshot_source(
        &claim("512Mi", None),
        &class(),
        &snapshot(true, Some("1Gi")),
        &content(None, None),
        true,
    );
    assert_eq!(
        small,
        Err(ContentSourceError::SmallerThanSnapshot {
            requested: 512 << 20,
            restore: 1 << 30,
            snapshot: "snap".into()
        })
    );
    assert_eq!(
        small.unwrap_err().to_string(),
        "requested volume size 536870912 is less than the size 1073741824 for the source snapshot snap"
    );

    assert_eq!(
        snapshot_source(
            &c,
            &class(),
            &snapshot(false, None),
            &content(None, None),
            true
        ),
        Err(ContentSourceError::SnapshotNotReady("snap".into()))
    );

    let mut other_driver = content(None, None);
    other_driver.spec.driver = "other.csi".into();
    assert_eq!(
        snapshot_source(&c, &class(), &snapshot(true, None), &other_driver, true),
        Err(ContentSourceError::ContentDriver {
            content: "content-1".into(),
            snapshot: "snap".into(),
            class: "fast".into(),
            driver: "other.csi".into(),
        })
    );

    let mut elsewhere = content(None, None);
    elsewhere.spec.volume_snapshot_ref.uid = Some("old-uid".into());
    assert_eq!(
        snapshot_source(&c, &class(), &snapshot(true, None), &elsewhere, true),
        Err(ContentSourceError::ContentBoundElsewhere {
            content: "content-1".into(),
            snapshot: "snap".into()
        })
    );

    let mut no_handle = content(None, None);
    no_handle.status = None;
    assert_eq!(
        snapshot_source(&c, &class(), &snapshot(true, None), &no_handle, true),
        Err(ContentSourceError::NoSnapshotHandle("snap".into()))
    );
}

#[test]
fn volume_mode_conversion() {
    let block = claim("1Gi", Some("Block"));
    let snap = snapshot(true, None);
    let conversion = |content: &VolumeSnapshotContent, prevent: bool| {
        snapshot_source(&block, &class(), &snap, content, prevent)
    };
    let refused = |why: &str| {
        Err(ContentSourceError::VolumeModeConversion {
            claim: "ns/restored".into(),
            why: why.into(),
        })
    };
    assert_eq!(
        conversion(&content(Some("Filesystem"), None), true),
        refused("snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content-1")
    );
    assert_eq!(
        conversion(&content(Some("Filesystem"), Some("false")), true),
        refused("snapshot.storage.kubernetes.io/allow-volume-mode-change is set to false on snapshotcontent content-1")
    );
    assert_eq!(
        conversion(&content(Some("Filesystem"), Some("yes")), true),
        refused("failed to convert snapshot.storage.kubernetes.io/allow-volume-mode-change annotation value \"yes\" to boolean")
    );
    assert_eq!(
        conversion(&content(Some("Filesystem"), Some("true")), true),
        Ok(restored("snap-handle-1"))
    );
    assert_eq!(
        conversion(&content(Some("Filesystem"), None), false),
        Ok(restored("snap-handle-1")),
        "--prevent-volume-mode-conversion=false"
    );
    assert_eq!(
        conversion(&content(None, None), true),
        Ok(restored("snap-handle-1")),
        "an old content without sourceVolumeMode"
    );
    assert_eq!(
        snapshot_source(
            &claim("1Gi", None),
            &class(),
            &snap,
            &content(Some("Block"), None),
            true
        ),
        Ok(restored("snap-handle-1")),
        "a claim without volumeMode is not compared, as upstream"
    );
}

#[test]
fn snapshot_binding() {
    let src = source(SourceKind::Snapshot, "ns");
    assert_eq!(
        bound_content(&snapshot(true, None), &src),
        Ok("content-1".into())
    );
    let mut unbound = snapshot(true, None);
    unbound.status = None;
    assert_eq!(
        bound_content(&unbound, &src),
        Err(ContentSourceError::SnapshotNotBound("snap".into()))
    );
    let mut deleting = snapshot(true, None);
    deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
    assert_eq!(
        bound_content(&deleting, &src),
        Err(ContentSourceError::SnapshotDeleting("snap".into()))
    );
    deleting.metadata.finalizers = Some(vec![SNAPSHOT_SOURCE_FINALIZER.into()]);
    assert_eq!(bound_content(&deleting, &src), Ok("content-1".into()));
}

fn source_claim(size: &str) -> PersistentVolumeClaim {
    let mut c = claim(size, None);
    c.metadata.name = Some("src".into());
    c.metadata.uid = Some("src-uid".into());
    if let Some(s) = c.spec.as_mut() {
        s.volume_name = Some("pv-src".into());
    }
    c.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".into()),
        ..Default::default()
    });
    c
}

fn source_pv(mode: Option<&str>) -> PersistentVolume {
    let mut pv = PersistentVolume {
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "vol-src".into(),
                ..Default::default()
            }),
            claim_ref: Some(ObjectReference {
                name: Some("src".into()),
                namespace: Some("ns".into()),
                uid: Some("src-uid".into()),
                ..Default::default()
            }),
            volume_mode: mode.map(str::to_string),
            ..Default::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    pv.metadata.name = Some("pv-src".into());
    pv
}

#[test]
fn clone_checks() {
    let c = claim("1Gi", None);
    let cloned = VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: "vol-src".into(),
        })),
    };
    assert_eq!(
        clone_source(&c, &class(), &source_claim("1Gi"), Some(&source_pv(None))),
        Ok(cloned.clone())
    );
    assert_eq!(
        clone_source(
            &claim("1Gi", Some("Filesystem")),
            &class(),
            &source_claim("1Gi"),
            Some(&source_pv(Some("Filesystem")))
        ),
        Ok(cloned)
    );
    assert_eq!(
        clone_source(&c, &class(), &source_claim("2Gi"), Some(&source_pv(None))),
        Err(ContentSourceError::SmallerThanSource {
            requested: 1 << 30,
            source_size: 2 << 30
        })
    );
    let mut pending = source_claim("1Gi");
    pending.status = None;
    assert_eq!(
        clone_source(&c, &class(), &pending, Some(&source_pv(None))),
        Err(ContentSourceError::SourceNotBound("src".into()))
    );
    let mut deleting = source_claim("1Gi");
    deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
    assert_eq!(
        clone_source(&c, &class(), &deleting, Some(&source_pv(None))),
        Err(ContentSourceError::SourceDeleting("src".into()))
    );
    assert_eq!(
        clone_source(&c, &class(), &source_claim("1Gi"), None),
        Err(ContentSourceError::SourceInvalid(
            "PV pv-src not found".into()
        ))
    );
    let mut other = source_pv(None);
    if let Some(csi) = other.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.driver = "other.csi".into();
    }
    assert_eq!(
        clone_source(&c, &class(), &source_claim("1Gi"), Some(&other)),
        Err(ContentSourceError::SourceInvalid(
            "PV pv-src is handled by CSI driver \"other.csi\", not by \"hostpath.csiops.dev\" of StorageClass fast".into()
        ))
    );
    let mut rebound = source_pv(None);
    if let Some(r) = rebound.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        r.uid = Some("another".into());
    }
    assert_eq!(
        clone_source(&c, &class(), &source_claim("1Gi"), Some(&rebound)),
        Err(ContentSourceError::SourceInvalid(
            "PV pv-src is not bound to PVC src".into()
        ))
    );
    assert_eq!(
        clone_source(
            &c,
            &class(),
            &source_claim("1Gi"),
            Some(&source_pv(Some("Block")))
        ),
        Err(ContentSourceError::CloneVolumeMode {
            source_mode: "Block",
            requested: "Filesystem"
        })
    );
    assert_eq!(
        clone_source(
            &claim("1Gi", Some("Block")),
            &class(),
            &source_claim("1Gi"),
            Some(&source_pv(None))
        ),
        Err(ContentSourceError::CloneVolumeMode {
            source_mode: "Filesystem",
            requested: "Block"
        })
    );
}

#[test]
fn clone_sources_for_the_cloning_queue() {
    let key = |ns: &str| Some(ObjectRef::<PersistentVolumeClaim>::new("src").within(ns));
    assert_eq!(
        clone_source_of(&with_source(CLAIM_KIND, None, "src")),
        key("ns")
    );
    assert_eq!(
        clone_source_of(&with_source(SNAPSHOT_KIND, Some(SNAPSHOT_GROUP), "src")),
        None
    );
    assert_eq!(clone_source_of(&claim("1Gi", None)), None);
    let mut cross = claim("1Gi", None);
    if let Some(s) = cross.spec.as_mut() {
        s.data_source_ref = Some(TypedObjectReference {
            kind: CLAIM_KIND.into(),
            name: "src".into(),
            api_group: None,
            namespace: Some("other".into()),
        });
    }
    assert_eq!(clone_source_of(&cross), key("other"));
}
