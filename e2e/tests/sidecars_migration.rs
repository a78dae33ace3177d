//! CSI migration on a real control plane: `csi-test-driver` registered as
//! `ebs.csi.aws.com` (the migration target of `kubernetes.io/aws-ebs`), our
//! provisioner and attacher in front of it, kube-controller-manager v1.34
//! doing its part unprompted (no flag or feature gate: aws-ebs migration is
//! GA and always on).
//!
//! An in-tree StorageClass → kcm hands its claim to the driver → our
//! provisioner creates the volume with the translated parameters and a PV
//! with the `awsElasticBlockStore` source → kcm binds it and marks it
//! migrated → VolumeAttachments as the attach/detach controller makes them
//! (the in-tree PV by name; a migrated pod volume as its translated inline
//! spec) → our attacher publishes the right volume IDs → detach → the claim
//! deleted → DeleteVolume of the right ID and the PV gone.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use csiops_e2e::attach::{self, attached, has_finalizer};
use csiops_e2e::process::ManagedProcess;
use csiops_e2e::testdriver::{load_state, TestDriverProcess};
use csiops_e2e::{free_port, sidecar_bin, wait_for, Cluster, ClusterOptions};
use csiops_proto::csi::v1::{volume_capability, CreateVolumeRequest, VolumeCapability};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Node, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{
    StorageClass, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;

const TEST_DRIVER: &str = env!("CARGO_BIN_EXE_csi-test-driver");
const DRIVER: &str = "ebs.csi.aws.com";
const IN_TREE: &str = "kubernetes.io/aws-ebs";
const ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";
const NS: &str = "default";
const NODE: &str = "kwok-node-0";
/// The driver's node ID of [`NODE`] (not its name: a publish to it proves
/// the CSINode lookup).
const NODE_ID: &str = "i-0123456789abcdef0";
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
const PROVISIONER_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Each node in its own zone, with the driver's CSINode entry, as the
/// driver's registrar leaves them.
async fn register_nodes(cluster: &Cluster) {
    let client = cluster.client().expect("client");
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, name) in cluster.node_names().iter().enumerate() {
        let zone = format!("us-east-1{}", (b'a' + i as u8) as char);
        let labels = serde_json::json!({"metadata": {"labels": {ZONE_KEY: zone}}});
        nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&labels))
            .await
            .expect("zone label");
        let node_id = if name == NODE {
            NODE_ID.to_string()
        } else {
            format!("i-{name}")
        };
        attach::register_driver(&client, name, DRIVER, &node_id, &[ZONE_KEY])
            .await
            .expect("CSINode entry");
    }
}

fn sidecar(cluster: &Cluster, socket: &Path, role: &str, args: Vec<String>) -> ManagedProcess {
    ManagedProcess::spawn(
        role,
        &sidecar_bin().expect("csiops-sidecar built"),
        &args,
        &cluster.log_dir().join(format!("{role}.log")),
    )
    .unwrap_or_else(|e| panic!("{role} starts ({e}); socket {}", socket.display()))
}

fn provisioner_args(cluster: &Cluster, socket: &Path) -> Vec<String> {
    vec![
        "provisioner".into(),
        format!("--csi-address=unix://{}", socket.display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--http-endpoint=127.0.0.1:{}", free_port().expect("port")),
        "--retry-interval-start=200ms".into(),
        "--retry-interval-max=2s".into(),
        "--kube-api-qps=200".into(),
        "--kube-api-burst=400".into(),
        "--extra-create-metadata".into(),
        "--v=4".into(),
    ]
}

fn in_tree_class() -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("ebs-gp3".into()),
            ..Default::default()
        },
        provisioner: IN_TREE.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("Immediate".into()),
        parameters: Some(map(&[
            ("type", "gp3"),
            ("fsType", "xfs"),
            ("iopsPerGB", "10"),
            ("zone", "us-east-1a"),
        ])),
        ..Default::default()
    }
}

fn claim() -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some("ebs-gp3".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity("2Gi".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A VolumeAttachment to [`NODE`] with `source`.
fn va(name: &str, source: VolumeAttachmentSource) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: DRIVER.into(),
            node_name: NODE.into(),
            source,
        },
        status: None,
    }
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// `(key, values)` of each requirement of the PV's first required term.
fn affinity(pv: &PersistentVolume) -> Vec<(String, Vec<String>)> {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .and_then(|r| r.node_selector_terms.first())
        .and_then(|t| t.match_expressions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.key, r.values.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_tree_class_claim_pv_attach_delete() {
    let started = std::time::Instant::now();
    let cluster = Cluster::start(ClusterOptions::kwok(2))
        .await
        .expect("cluster");
    let client = cluster.client().expect("client");
    register_nodes(&cluster).await;
    let dir = cluster.work_dir().join("ebs");
    std::fs::create_dir_all(&dir).expect("driver dir");
    let socket = dir.join("csi.sock");
    let driver = TestDriverProcess::start(
        Path::new(TEST_DRIVER),
        &socket,
        &dir.join("state"),
        &[
            &format!("--drivername={DRIVER}"),
            &format!("--nodeid={NODE_ID}"),
            &format!("--topology-key={ZONE_KEY}"),
            "--enable-attach",
        ],
        &cluster.log_dir().join("csi-test-driver.log"),
    )
    .await
    .expect("csi-test-driver starts");
    let mut provisioner = sidecar(
        &cluster,
        &socket,
        "provisioner",
        provisioner_args(&cluster, &socket),
    );
    let mut attacher = sidecar(
        &cluster,
        &socket,
        "attacher",
        attach::attacher_args(
            &socket,
            cluster.kubeconfig_path(),
            free_port().expect("port"),
            &["--v=4"],
        ),
    );
    let logs = |p: &ManagedProcess, a: &ManagedProcess| {
        format!(
            "--- provisioner:\n{}\n--- attacher:\n{}",
            p.log_tail(30),
            a.log_tail(30)
        )
    };

    let classes: Api<StorageClass> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pp = PostParams::default();
    classes.create(&pp, &in_tree_class()).await.expect("class");
    claims.create(&pp, &claim()).await.expect("claim");

    // kube-controller-manager hands the claim of the in-tree class to the
    // migration target.
    let handed = wait_for(DEADLINE, POLL, || async {
        let c = claims.get_opt("data").await.ok().flatten()?;
        annotation(&c.metadata, "volume.kubernetes.io/storage-provisioner").map(str::to_string)
    })
    .await
    .expect("kube-controller-manager annotates the claim");
    assert_eq!(handed, DRIVER);

    // Provisioned and bound.
    let bound = wait_for(DEADLINE, POLL, || async {
        let c = claims.get_opt("data").await.ok().flatten()?;
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await
    .unwrap_or_else(|_| panic!("claim not Bound\n{}", logs(&provisioner, &attacher)));
    let pv_name = format!("pvc-{}", bound.uid().expect("uid"));
    assert_eq!(
        bound.spec.as_ref().and_then(|s| s.volume_name.as_deref()),
        Some(pv_name.as_str())
    );
    let state = driver.state().expect("driver state");
    let volume = state
        .volume_by_name(&pv_name)
        .expect("the driver has the volume")
        .clone();
    // The class's parameters as csi-translation-lib translates them: fsType
    // became the capability's filesystem, zone the topology requirement,
    // iopsPerGB brought allowautoiopspergbincrease.
    assert_eq!(
        volume.parameters,
        map(&[
            ("type", "gp3"),
            ("iopsPerGB", "10"),
            ("allowautoiopspergbincrease", "true"),
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", NS),
            ("csi.storage.k8s.io/pv/name", &pv_name),
        ])
    );
    assert_eq!(
        volume
            .volume_capabilities
            .iter()
            .map(|c| c.fs_type.as_str())
            .collect::<Vec<_>>(),
        ["xfs"]
    );
    assert_eq!(
        volume.accessible_topology,
        vec![map(&[(ZONE_KEY, "us-east-1a")])]
    );

    // The PV as upstream writes it for an in-tree class, then marked
    // migrated by kube-controller-manager.
    let pv = wait_for(DEADLINE, POLL, || async {
        let pv = volumes.get_opt(&pv_name).await.ok().flatten()?;
        annotation(&pv.metadata, "pv.kubernetes.io/migrated-to")
            .is_some()
            .then_some(pv)
    })
    .await
    .expect("kube-controller-manager marks the PV migrated");
    assert_eq!(
        annotation(&pv.metadata, "pv.kubernetes.io/migrated-to"),
        Some(DRIVER)
    );
    assert_eq!(
        annotation(&pv.metadata, "pv.kubernetes.io/provisioned-by"),
        Some(IN_TREE)
    );
    assert!(has_finalizer(&pv.metadata, PROVISIONER_FINALIZER));
    let spec = pv.spec.clone().expect("spec");
    assert!(spec.csi.is_none(), "no CSI source: {spec:?}");
    let ebs = spec
        .aws_elastic_block_store
        .clone()
        .expect("in-tree source");
    assert_eq!(ebs.volume_id, volume.id);
    assert_eq!(ebs.fs_type.as_deref(), Some("xfs"));
    assert_eq!(
        affinity(&pv),
        vec![
            (
                "topology.kubernetes.io/zone".to_string(),
                vec!["us-east-1a".to_string()]
            ),
            (
                "topology.kubernetes.io/region".to_string(),
                vec!["us-east-1".to_string()]
            ),
        ]
    );
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("us-east-1a")
    );
    assert_eq!(
        labels
            .get("topology.kubernetes.io/region")
            .map(String::as_str),
        Some("us-east-1")
    );

    // Attach the in-tree PV, as the attach/detach controller asks for it.
    vas.create(
        &pp,
        &va(
            "va-pv",
            VolumeAttachmentSource {
                persistent_volume_name: Some(pv_name.clone()),
                ..Default::default()
            },
        ),
    )
    .await
    .expect("VolumeAttachment of the PV");
    // A migrated pod volume (awsElasticBlockStore in the pod): kcm sends
    // its CSI translation inline, for a volume made outside Kubernetes.
    let csi = driver.client().await.expect("CSI client");
    let inline_id = csi
        .controller()
        .create_volume(CreateVolumeRequest {
            name: "pod-volume".into(),
            volume_capabilities: vec![VolumeCapability {
                access_mode: Some(volume_capability::AccessMode {
                    mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(volume_capability::AccessType::Mount(Default::default())),
            }],
            ..Default::default()
        })
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume")
        .volume_id;
    vas.create(
        &pp,
        &va(
            "va-inline",
            VolumeAttachmentSource {
                inline_volume_spec: Some(PersistentVolumeSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    volume_mode: Some("Filesystem".into()),
                    csi: Some(CSIPersistentVolumeSource {
                        driver: DRIVER.into(),
                        volume_handle: inline_id.clone(),
                        fs_type: Some("ext4".into()),
                        volume_attributes: Some(map(&[("partition", "0")])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ),
    )
    .await
    .expect("VolumeAttachment of the inline volume");
    let finalizer = attach::finalizer(DRIVER);
    for name in ["va-pv", "va-inline"] {
        wait_for(DEADLINE, POLL, || async {
            let v = vas.get_opt(name).await.ok().flatten()?;
            attached(&v, &finalizer).then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("{name} not attached\n{}", logs(&provisioner, &attacher)));
    }
    let state = load_state(driver.state_dir()).expect("driver state");
    for (id, fs) in [(&volume.id, "xfs"), (&inline_id, "ext4")] {
        let v = state.volumes.get(id).expect("the volume");
        assert_eq!(v.published_node_ids(), [NODE_ID], "{id}");
        assert_eq!(v.published_nodes[NODE_ID].capability.fs_type, fs, "{id}");
    }
    let pv = volumes.get(&pv_name).await.expect("PV");
    assert!(
        has_finalizer(&pv.metadata, &finalizer),
        "the attacher's finalizer is on the in-tree PV"
    );

    // Detach both.
    for name in ["va-pv", "va-inline"] {
        vas.delete(name, &DeleteParams::default())
            .await
            .expect("delete VolumeAttachment");
    }
    for name in ["va-pv", "va-inline"] {
        wait_for(DEADLINE, POLL, || async {
            vas.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("{name} not detached\n{}", logs(&provisioner, &attacher)));
    }
    let state = load_state(driver.state_dir()).expect("driver state");
    for id in [&volume.id, &inline_id] {
        assert!(state.volumes[id].published_nodes.is_empty(), "{id}");
    }

    // Delete the claim: DeleteVolume of the in-tree PV's volume, PV gone.
    claims
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete claim");
    wait_for(DEADLINE, POLL, || async {
        volumes
            .get_opt(&pv_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("PV not deleted\n{}", logs(&provisioner, &attacher)));
    let state = load_state(driver.state_dir()).expect("driver state");
    assert!(!state.volumes.contains_key(&volume.id), "volume deleted");
    assert!(
        state.deleted.iter().any(|d| d.id == volume.id),
        "DeleteVolume got the volume's ID"
    );
    assert!(
        state.volumes.contains_key(&inline_id),
        "the pod volume is not Kubernetes' to delete"
    );
    provisioner
        .check_running()
        .expect("provisioner still running");
    attacher.check_running().expect("attacher still running");
    eprintln!("migration e2e: {:?}", started.elapsed());
    cluster.stop().await.expect("stop");
}
