//! Restore from a VolumeSnapshot and clone of a claim, end to end on a real
//! control plane: upstream's snapshot-controller and csi-snapshotter
//! (`EXTERNAL_SNAPSHOTTER_VERSION`, built by `e2e/cluster-bins/build.sh`
//! with the VolumeSnapshot CRDs) take the snapshot through csi-test-driver;
//! our provisioner restores and clones it; kube-controller-manager binds.
//! csi-test-driver's persisted state says what CreateVolume was asked.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use csiops_e2e::process::ManagedProcess;
use csiops_e2e::provisioning::{ProvisionerBed, DRIVER};
use csiops_e2e::testdriver::state::ContentSource;
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, TypedLocalObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::ResourceExt;
use serde_json::json;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
const CLONE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";
const CRDS: &[&str] = &[
    "volumesnapshotclasses",
    "volumesnapshotcontents",
    "volumesnapshots",
];

fn claim(name: &str, size: &str, source: Option<(&str, &str)>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some("fast".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                ..Default::default()
            }),
            data_source: source.map(|(kind, name)| TypedLocalObjectReference {
                api_group: (kind == "VolumeSnapshot").then(|| "snapshot.storage.k8s.io".into()),
                kind: kind.into(),
                name: name.into(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// snapshot-controller and csi-snapshotter, against the cluster and the
/// bed's driver socket; stopped when dropped.
struct Snapshotter {
    _procs: Vec<ManagedProcess>,
}

impl Snapshotter {
    async fn start(cluster: &Cluster, socket: &Path) -> Snapshotter {
        let bin = cluster.bin_dir();
        for crd in CRDS {
            let file = bin
                .join("crds/snapshot")
                .join(format!("snapshot.storage.k8s.io_{crd}.yaml"));
            cluster
                .kubectl_ok(["apply", "--server-side", "-f", &file.to_string_lossy()])
                .await
                .expect("snapshot CRD");
        }
        for crd in CRDS {
            cluster
                .kubectl_ok([
                    "wait",
                    "--for=condition=established",
                    "--timeout=60s",
                    &format!("crd/{crd}.snapshot.storage.k8s.io"),
                ])
                .await
                .expect("CRD established");
        }
        let kubeconfig = format!("--kubeconfig={}", cluster.kubeconfig_path().display());
        // No group snapshots: their CRDs are not installed, and looking for
        // them would only delay the start.
        let no_groups = "--feature-gates=CSIVolumeGroupSnapshot=false".to_string();
        let controller = ManagedProcess::spawn(
            "snapshot-controller",
            &bin.join("snapshot-controller"),
            &[kubeconfig.clone(), no_groups.clone(), "--v=4".into()],
            &cluster.log_dir().join("snapshot-controller.log"),
        )
        .expect("snapshot-controller");
        let sidecar = ManagedProcess::spawn(
            "csi-snapshotter",
            &bin.join("csi-snapshotter"),
            &[
                kubeconfig,
                no_groups,
                format!("--csi-address={}", socket.display()),
                "--v=4".into(),
            ],
            &cluster.log_dir().join("csi-snapshotter.log"),
        )
        .expect("csi-snapshotter");
        Snapshotter {
            _procs: vec![controller, sidecar],
        }
    }
}

/// The provisioner's finalizer on a VolumeSnapshot being restored.
const SOURCE_PROTECTION: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";

fn snapshot_api(client: &kube::Client, kind: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "snapshot.storage.k8s.io",
        "v1",
        kind,
    ));
    if kind == "VolumeSnapshot" {
        Api::namespaced_with(client.clone(), NS, &ar)
    } else {
        Api::all_with(client.clone(), &ar)
    }
}

fn object(value: serde_json::Value) -> DynamicObject {
    serde_json::from_value(value).expect("a valid object")
}

async fn bound(claims: &Api<PersistentVolumeClaim>, name: &str) -> PersistentVolumeClaim {
    testkit::wait_bound(claims, name, DEADLINE).await
}

fn finalizers(c: &PersistentVolumeClaim) -> Vec<String> {
    c.finalizers().to_vec()
}

async fn event_notes(cluster: &Cluster, object: &str) -> Vec<String> {
    testkit::event_lines(cluster, NS, object).await
}

/// What the phases work on besides the provisioner bed: an admin client and
/// the APIs of claims, PVs and VolumeSnapshots.
struct Apis {
    client: kube::Client,
    claims: Api<PersistentVolumeClaim>,
    volumes: Api<PersistentVolume>,
    snapshots: Api<DynamicObject>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restores_snapshots_and_clones_claims() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster");
    // CreateVolume takes a second, so the clone is seen pending.
    let mut bed = ProvisionerBed::start(
        &cluster,
        &["--delay=CreateVolume=1s"],
        &["--snapshot-orphan-sweep-interval=1s"],
    )
    .await
    .expect("provisioner bed");
    let _snapshotter = Snapshotter::start(&cluster, bed.driver.socket()).await;
    let client = cluster.client().expect("client");
    let a = Apis {
        claims: Api::namespaced(client.clone(), NS),
        volumes: Api::all(client.clone()),
        snapshots: snapshot_api(&client, "VolumeSnapshot"),
        client,
    };

    let data_volume = a_claim_is_bound(&a).await;
    let snapshot_id = a_snapshot_of_it_is_taken(&bed, &a, &data_volume).await;
    a_restore_asks_the_driver_for_the_snapshot(&bed, &a, &snapshot_id).await;
    too_small_a_restore_is_refused_before_create_volume(&cluster, &bed, &a).await;
    a_clone_protects_its_source_while_pending(&bed, &a, &data_volume).await;
    a_source_deleted_during_its_clone_stays_until_the_clone_binds(&a).await;
    the_orphan_sweep_takes_a_left_finalizer_off(&a).await;
    deleting_the_source_is_not_blocked(&a).await;
    bed.check_sidecar().expect("provisioner still running");
}

/// The class `fast` and a bound claim `data` exist; returns its volume's ID.
async fn a_claim_is_bound(a: &Apis) -> String {
    let Apis {
        client,
        claims,
        volumes,
        ..
    } = a;
    let pp = PostParams::default();
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &pp,
            &StorageClass {
                metadata: ObjectMeta {
                    name: Some("fast".into()),
                    ..Default::default()
                },
                provisioner: DRIVER.into(),
                reclaim_policy: Some("Delete".into()),
                volume_binding_mode: Some("Immediate".into()),
                ..Default::default()
            },
        )
        .await
        .expect("class");
    claims
        .create(&pp, &claim("data", "1Gi", None))
        .await
        .expect("claim");
    let data = bound(claims, "data").await;
    let data_pv = data
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .expect("bound claim names its PV");
    let data_volume = volumes
        .get(&data_pv)
        .await
        .expect("PV")
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .expect("CSI PV");
    data_volume
}

/// A snapshot of it, taken through upstream's controllers, is the driver's
/// only snapshot, of that volume; returns its ID.
async fn a_snapshot_of_it_is_taken(bed: &ProvisionerBed, a: &Apis, data_volume: &str) -> String {
    let Apis {
        client, snapshots, ..
    } = a;
    let pp = PostParams::default();
    // A snapshot of it, through upstream's controllers.
    snapshot_api(client, "VolumeSnapshotClass")
        .create(
            &pp,
            &object(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                "metadata": {"name": "snaps"},
                "driver": DRIVER, "deletionPolicy": "Delete",
            })),
        )
        .await
        .expect("snapshot class");
    snapshots
        .create(
            &pp,
            &object(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": "snap", "namespace": NS},
                "spec": {
                    "volumeSnapshotClassName": "snaps",
                    "source": {"persistentVolumeClaimName": "data"},
                },
            })),
        )
        .await
        .expect("snapshot");
    wait_for(DEADLINE, POLL, || async {
        let s = snapshots.get_opt("snap").await.ok().flatten()?;
        (s.data["status"]["readyToUse"] == json!(true)).then_some(())
    })
    .await
    .expect("snapshot readyToUse");
    let state = bed.driver.state().expect("driver state");
    assert_eq!(state.snapshots.len(), 1, "{:?}", state.snapshots);
    let snapshot_id = state.snapshots.keys().next().cloned().unwrap_or_default();
    assert_eq!(state.snapshots[&snapshot_id].source_volume_id, data_volume);
    snapshot_id
}

/// A restore asks the driver for the snapshot, and the source-protection
/// finalizer comes off once the PV exists.
async fn a_restore_asks_the_driver_for_the_snapshot(
    bed: &ProvisionerBed,
    a: &Apis,
    snapshot_id: &str,
) {
    let Apis {
        claims, snapshots, ..
    } = a;
    let pp = PostParams::default();
    // Restore: CreateVolume with the snapshot's handle.
    claims
        .create(
            &pp,
            &claim("restored", "1Gi", Some(("VolumeSnapshot", "snap"))),
        )
        .await
        .expect("restore claim");
    let restored = bound(claims, "restored").await;
    let state = bed.driver.state().expect("driver state");
    let name = format!("pvc-{}", restored.uid().unwrap_or_default());
    assert_eq!(
        state
            .volume_by_name(&name)
            .map(|v| v.content_source.clone()),
        Some(Some(ContentSource::Snapshot(snapshot_id.to_string()))),
        "the driver was asked to restore the snapshot"
    );
    // The source-protection finalizer comes off once the PV exists. The
    // claim can be seen bound a moment before the provisioner's patch lands,
    // so this waits on the snapshot rather than reading it once.
    wait_for(DEADLINE, POLL, || async {
        let s = snapshots.get("snap").await.ok()?;
        (!s.finalizers().iter().any(|f| f == SOURCE_PROTECTION)).then_some(())
    })
    .await
    .expect("the source-protection finalizer comes off after the restore");
}

/// A restore too small for the snapshot is refused before any CreateVolume,
/// with an Event saying why, and stays Pending.
async fn too_small_a_restore_is_refused_before_create_volume(
    cluster: &Cluster,
    bed: &ProvisionerBed,
    a: &Apis,
) {
    let Apis { claims, .. } = a;
    let pp = PostParams::default();
    // Too small for the snapshot: refused before any CreateVolume, with an
    // Event saying why, and retried (still Pending).
    claims
        .create(
            &pp,
            &claim("too-small", "512Mi", Some(("VolumeSnapshot", "snap"))),
        )
        .await
        .expect("small claim");
    let notes = wait_for(DEADLINE, POLL, || async {
        let notes = event_notes(cluster, "too-small").await;
        notes
            .iter()
            .any(|n| n.starts_with("ProvisioningFailed|"))
            .then_some(notes)
    })
    .await
    .expect("a ProvisioningFailed Event");
    assert!(
        notes.iter().any(|n| n
            == "ProvisioningFailed|requested volume size 536870912 is less than the size 1073741824 for the source snapshot snap"),
        "{notes:?}"
    );
    let small = claims.get("too-small").await.expect("claim");
    assert_eq!(
        small.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    let small_name = format!("pvc-{}", small.metadata.uid.unwrap_or_default());
    assert!(bed
        .driver
        .state()
        .expect("state")
        .volume_by_name(&small_name)
        .is_none());
}

/// A clone asks the driver to clone the source volume; the source carries
/// the cloning-protection finalizer while the clone is pending only.
async fn a_clone_protects_its_source_while_pending(
    bed: &ProvisionerBed,
    a: &Apis,
    data_volume: &str,
) {
    let Apis { claims, .. } = a;
    let pp = PostParams::default();
    // Clone: the source carries the cloning-protection finalizer while the
    // clone is pending, and loses it once the clone is bound.
    claims
        .create(
            &pp,
            &claim("clone", "1Gi", Some(("PersistentVolumeClaim", "data"))),
        )
        .await
        .expect("clone claim");
    wait_for(DEADLINE, Duration::from_millis(20), || async {
        let c = claims.get_opt("clone").await.ok().flatten()?;
        let pending = c.status.as_ref()?.phase.as_deref() == Some("Pending");
        let src = claims.get_opt("data").await.ok().flatten()?;
        (pending && finalizers(&src).iter().any(|f| f == CLONE_FINALIZER)).then_some(())
    })
    .await
    .expect("the source protected while the clone is pending");
    let clone = bound(claims, "clone").await;
    let state = bed.driver.state().expect("driver state");
    let clone_name = format!("pvc-{}", clone.uid().unwrap_or_default());
    assert_eq!(
        state
            .volume_by_name(&clone_name)
            .map(|v| v.content_source.clone()),
        Some(Some(ContentSource::Volume(data_volume.to_string()))),
        "the driver was asked to clone the source volume"
    );
    wait_for(DEADLINE, POLL, || async {
        let src = claims.get_opt("data").await.ok().flatten()?;
        (!finalizers(&src).iter().any(|f| f == CLONE_FINALIZER)).then_some(())
    })
    .await
    .expect("the cloning-protection finalizer removed once the clone is bound");
}

/// A source deleted while its clone is being created stays until the clone
/// is Bound, then goes.
async fn a_source_deleted_during_its_clone_stays_until_the_clone_binds(a: &Apis) {
    let Apis { claims, .. } = a;
    let pp = PostParams::default();
    // A source deleted while its clone is being created stays until the
    // clone is Bound, then goes.
    claims
        .create(
            &pp,
            &claim("clone2", "1Gi", Some(("PersistentVolumeClaim", "restored"))),
        )
        .await
        .expect("second clone claim");
    wait_for(DEADLINE, Duration::from_millis(20), || async {
        let src = claims.get_opt("restored").await.ok().flatten()?;
        finalizers(&src)
            .iter()
            .any(|f| f == CLONE_FINALIZER)
            .then_some(())
    })
    .await
    .expect("the second source protected");
    claims
        .delete("restored", &DeleteParams::default())
        .await
        .expect("delete the second source");
    wait_for(DEADLINE, Duration::from_millis(20), || async {
        let clone2 = claims.get_opt("clone2").await.ok().flatten()?;
        let bound = clone2.status.as_ref()?.phase.as_deref() == Some("Bound");
        if !bound {
            let source = claims.get_opt("restored").await.ok().flatten();
            assert!(
                source.is_some(),
                "the source went while its clone was pending"
            );
        }
        bound.then_some(())
    })
    .await
    .expect("the second clone Bound");
    wait_for(DEADLINE, POLL, || async {
        claims
            .get_opt("restored")
            .await
            .ok()
            .and_then(|c| c.is_none().then_some(()))
    })
    .await
    .expect("the second source gone once its clone is Bound");
}

/// A source-protection finalizer left behind (as by a crash) comes off with
/// the orphan sweep.
async fn the_orphan_sweep_takes_a_left_finalizer_off(a: &Apis) {
    let Apis {
        claims, snapshots, ..
    } = a;
    // A source-protection finalizer left behind (as by a crash) comes off
    // with the orphan sweep once no pending claim restores the snapshot.
    claims
        .delete("too-small", &DeleteParams::default())
        .await
        .expect("delete small claim");
    let mut finalizers_now = snapshots
        .get("snap")
        .await
        .expect("snapshot")
        .finalizers()
        .to_vec();
    finalizers_now.push(SOURCE_PROTECTION.to_string());
    snapshots
        .patch(
            "snap",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers_now}})),
        )
        .await
        .expect("an orphaned finalizer");
    wait_for(DEADLINE, POLL, || async {
        let s = snapshots.get("snap").await.ok()?;
        (!s.finalizers().iter().any(|f| f == SOURCE_PROTECTION)).then_some(())
    })
    .await
    .expect("the orphan sweep takes the finalizer off");
}

/// Deleting the source, after its snapshot, is not blocked.
async fn deleting_the_source_is_not_blocked(a: &Apis) {
    let Apis {
        claims, snapshots, ..
    } = a;
    // Deleting the source is not blocked (the snapshot goes first, so
    // snapshot-controller's own source protection is not in the way).
    snapshots
        .delete("snap", &DeleteParams::default())
        .await
        .expect("delete snapshot");
    claims
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete source");
    let gone = wait_for(DEADLINE, POLL, || async {
        claims
            .get_opt("data")
            .await
            .ok()
            .and_then(|c| c.is_none().then_some(()))
    })
    .await;
    if gone.is_err() {
        let left = claims
            .get_opt("data")
            .await
            .ok()
            .flatten()
            .map(|c| finalizers(&c));
        panic!("the source claim is still there, finalizers {left:?}");
    }
}
