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
use csiops_e2e::testdriver::state::Volume;
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

/// What the phases work on: the cluster, an admin client, the driver and our
/// two sidecars in front of it, and the APIs of claims, PVs and attachments.
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    driver: TestDriverProcess,
    provisioner: ManagedProcess,
    attacher: ManagedProcess,
    claims: Api<PersistentVolumeClaim>,
    volumes: Api<PersistentVolume>,
    vas: Api<VolumeAttachment>,
}

impl Bed {
    /// The tails of both sidecars' logs, for a failed wait.
    fn logs(&self) -> String {
        format!(
            "--- provisioner:\n{}\n--- attacher:\n{}",
            self.provisioner.log_tail(30),
            self.attacher.log_tail(30)
        )
    }
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
    let provisioner = sidecar(
        &cluster,
        &socket,
        "provisioner",
        provisioner_args(&cluster, &socket),
    );
    let attacher = sidecar(
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
    let mut bed = Bed {
        claims: Api::namespaced(client.clone(), NS),
        volumes: Api::all(client.clone()),
        vas: Api::all(client.clone()),
        cluster,
        client,
        driver,
        provisioner,
        attacher,
    };

    kcm_hands_the_in_tree_claim_to_the_driver(&bed).await;
    let (pv_name, volume) = the_volume_gets_the_translated_parameters(&bed).await;
    the_pv_has_the_in_tree_source_and_is_marked_migrated(&bed, &pv_name, &volume).await;
    let inline_id = both_attachments_publish_the_right_volume_ids(&bed, &pv_name, &volume).await;
    detaching_both_unpublishes_them(&bed, &volume, &inline_id).await;
    deleting_the_claim_deletes_its_volume_and_pv(&bed, &pv_name, &volume, &inline_id).await;
    bed.provisioner
        .check_running()
        .expect("provisioner still running");
    bed.attacher
        .check_running()
        .expect("attacher still running");
    eprintln!("migration e2e: {:?}", started.elapsed());
    bed.cluster.stop().await.expect("stop");
}

/// The in-tree class and a claim of it exist; kube-controller-manager hands
/// the claim to the migration target.
async fn kcm_hands_the_in_tree_claim_to_the_driver(bed: &Bed) {
    let Bed { client, claims, .. } = bed;
    let classes: Api<StorageClass> = Api::all(client.clone());
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
}

/// The claim is provisioned and bound, its volume made with the class's
/// parameters as csi-translation-lib translates them; returns the PV's name
/// and the volume.
async fn the_volume_gets_the_translated_parameters(bed: &Bed) -> (String, Volume) {
    let Bed { driver, claims, .. } = bed;
    // Provisioned and bound.
    let bound = wait_for(DEADLINE, POLL, || async {
        let c = claims.get_opt("data").await.ok().flatten()?;
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await
    .unwrap_or_else(|_| panic!("claim not Bound\n{}", bed.logs()));
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
    (pv_name, volume)
}

/// The PV is as upstream writes it for an in-tree class (an
/// `awsElasticBlockStore` source), then marked migrated by kcm.
async fn the_pv_has_the_in_tree_source_and_is_marked_migrated(
    bed: &Bed,
    pv_name: &str,
    volume: &Volume,
) {
    let Bed { volumes, .. } = bed;
    // The PV as upstream writes it for an in-tree class, then marked
    // migrated by kube-controller-manager.
    let pv = wait_for(DEADLINE, POLL, || async {
        let pv = volumes.get_opt(pv_name).await.ok().flatten()?;
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
}

/// The in-tree PV and a migrated pod volume (inline) attach, each published
/// with its volume ID and filesystem; returns the inline volume's ID.
async fn both_attachments_publish_the_right_volume_ids(
    bed: &Bed,
    pv_name: &str,
    volume: &Volume,
) -> String {
    let Bed {
        driver,
        volumes,
        vas,
        ..
    } = bed;
    let pp = PostParams::default();
    // Attach the in-tree PV, as the attach/detach controller asks for it.
    vas.create(
        &pp,
        &va(
            "va-pv",
            VolumeAttachmentSource {
                persistent_volume_name: Some(pv_name.to_string()),
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
        .unwrap_or_else(|_| panic!("{name} not attached\n{}", bed.logs()));
    }
    let state = load_state(driver.state_dir()).expect("driver state");
    for (id, fs) in [(volume.id.as_str(), "xfs"), (inline_id.as_str(), "ext4")] {
        let v = state.volumes.get(id).expect("the volume");
        assert_eq!(v.published_node_ids(), [NODE_ID], "{id}");
        assert_eq!(v.published_nodes[NODE_ID].capability.fs_type, fs, "{id}");
    }
    let pv = volumes.get(pv_name).await.expect("PV");
    assert!(
        has_finalizer(&pv.metadata, &finalizer),
        "the attacher's finalizer is on the in-tree PV"
    );
    inline_id
}

/// Detaching both unpublishes both volumes.
async fn detaching_both_unpublishes_them(bed: &Bed, volume: &Volume, inline_id: &str) {
    let Bed { driver, vas, .. } = bed;
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
        .unwrap_or_else(|_| panic!("{name} not detached\n{}", bed.logs()));
    }
    let state = load_state(driver.state_dir()).expect("driver state");
    for id in [volume.id.as_str(), inline_id] {
        assert!(state.volumes[id].published_nodes.is_empty(), "{id}");
    }
}

/// Deleting the claim deletes the in-tree PV's volume by its ID and the PV;
/// the pod volume stays.
async fn deleting_the_claim_deletes_its_volume_and_pv(
    bed: &Bed,
    pv_name: &str,
    volume: &Volume,
    inline_id: &str,
) {
    let Bed {
        driver,
        claims,
        volumes,
        ..
    } = bed;
    // Delete the claim: DeleteVolume of the in-tree PV's volume, PV gone.
    claims
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete claim");
    wait_for(DEADLINE, POLL, || async {
        volumes.get_opt(pv_name).await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("PV not deleted\n{}", bed.logs()));
    let state = load_state(driver.state_dir()).expect("driver state");
    assert!(!state.volumes.contains_key(&volume.id), "volume deleted");
    assert!(
        state.deleted.iter().any(|d| d.id == volume.id),
        "DeleteVolume got the volume's ID"
    );
    assert!(
        state.volumes.contains_key(inline_id),
        "the pod volume is not Kubernetes' to delete"
    );
}
