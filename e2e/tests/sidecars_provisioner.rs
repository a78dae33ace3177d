//! The provisioner on a real control plane (kube-controller-manager's PV
//! controller binds what it creates) with a real CSI driver process
//! (`csi-test-driver`, whose persisted state is the truth about volumes).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use csiops_e2e::provisioning::{ProvisionerBed, DRIVER, TOPOLOGY_KEY};
use csiops_e2e::testdriver::state::Volume;
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, Secret,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{
    StorageClass, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
const SECRET_VALUE: &str = "s3cr3t-value-never-logged";
const CLAIM_FINALIZER: &str = "csiops.dev/volume-provisioning";
/// The label of the provisioner's intent journal ConfigMap.
const JOURNAL_LABEL: &str = "csiops.dev/provisioning-journal";
/// Intents a provisioner inherited without a PV, by what its sweep did.
const RECOVERED: &str = "csiops_provisioner_journal_recovered_total";

/// The volume names in the provisioner's intent journal (the ConfigMap
/// beside its Lease: `default` here).
async fn journal_keys(cluster: &Cluster) -> Option<BTreeSet<String>> {
    let client = cluster.client().ok()?;
    let maps: Api<ConfigMap> = Api::namespaced(client, NS);
    let list = maps
        .list(&ListParams::default().labels(JOURNAL_LABEL))
        .await
        .ok()?;
    Some(
        list.items
            .iter()
            .flat_map(|cm| cm.data.iter().flatten().map(|(k, _)| k.clone()))
            .collect(),
    )
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn class(name: &str, reclaim: &str, binding: &str, params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: DRIVER.into(),
        reclaim_policy: Some(reclaim.into()),
        volume_binding_mode: Some(binding.into()),
        parameters: Some(map(params)),
        ..Default::default()
    }
}

fn claim(name: &str, class: &str, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct Apis {
    claims: Api<PersistentVolumeClaim>,
    volumes: Api<PersistentVolume>,
    classes: Api<StorageClass>,
}

impl Apis {
    async fn add_class(&self, class: &StorageClass) {
        self.classes
            .create(&PostParams::default(), class)
            .await
            .expect("class");
    }

    async fn add_claim(&self, claim: &PersistentVolumeClaim) {
        self.claims
            .create(&PostParams::default(), claim)
            .await
            .expect("claim");
    }
}

/// A cluster of `nodes` with the provisioner bed (driver and provisioner
/// flags on top of the bed's defaults).
async fn start(
    nodes: usize,
    driver_args: &[&str],
    sidecar_args: &[&str],
) -> (Cluster, ProvisionerBed, Apis) {
    let cluster = Cluster::start(ClusterOptions::kwok(nodes))
        .await
        .expect("cluster");
    let bed = ProvisionerBed::start(&cluster, driver_args, sidecar_args)
        .await
        .expect("provisioner bed");
    let a = apis(&cluster);
    (cluster, bed, a)
}

fn apis(cluster: &Cluster) -> Apis {
    let client = cluster.client().expect("client");
    Apis {
        claims: Api::namespaced(client.clone(), NS),
        volumes: Api::all(client.clone()),
        classes: Api::all(client),
    }
}

/// Waits until the claim is Bound; returns it with its PV.
async fn bound(a: &Apis, name: &str) -> (PersistentVolumeClaim, PersistentVolume) {
    testkit::wait_bound_volume(&a.claims, &a.volumes, name, DEADLINE).await
}

async fn event_reasons(cluster: &Cluster, object: &str) -> Vec<String> {
    testkit::event_lines(cluster, NS, object).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisions_binds_deletes_and_retains() {
    let (cluster, mut bed, a) = start(
        3,
        &[],
        &["--leader-election", "--leader-election-namespace=default"],
    )
    .await;
    the_secret_and_the_classes_exist(&cluster, &a).await;
    let (pv, uid, pv_name, volume) = a_claim_gets_exactly_one_volume(&bed, &a).await;
    the_pv_is_written_as_upstream_writes_it(&cluster, &pv, &uid, &volume).await;
    events_the_lease_and_metrics_tell_the_story(&cluster, &bed, &a).await;
    deletion_waits_for_the_attachment_then_goes(&cluster, &bed, &a, &pv_name, &volume).await;
    retain_keeps_the_released_pv_and_its_volume(&bed, &a).await;
    secrets_never_reach_the_log(&mut bed);
    bed.stop_sidecar();
    cluster.stop().await.expect("stop");
}

/// The provisioner's Secret and the classes `fast` (Delete, with secrets and
/// mount options) and `keep` (Retain) exist.
async fn the_secret_and_the_classes_exist(cluster: &Cluster, a: &Apis) {
    let client = cluster.client().expect("client");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("creds".into()),
                    ..Default::default()
                },
                string_data: Some(map(&[("password", SECRET_VALUE)])),
                ..Default::default()
            },
        )
        .await
        .expect("secret");
    let mut fast = class(
        "fast",
        "Delete",
        "Immediate",
        &[
            ("type", "ssd"),
            ("csi.storage.k8s.io/fstype", "xfs"),
            ("csi.storage.k8s.io/provisioner-secret-name", "creds"),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pvc.namespace}",
            ),
            (
                "csi.storage.k8s.io/node-stage-secret-name",
                "${pvc.name}-stage",
            ),
            (
                "csi.storage.k8s.io/node-stage-secret-namespace",
                "${pvc.namespace}",
            ),
        ],
    );
    fast.mount_options = Some(vec!["noatime".into()]);
    a.add_class(&fast).await;
    a.add_class(&class("keep", "Retain", "Immediate", &[("type", "hdd")]))
        .await;
}

/// A claim of `fast` binds to a PV named after it and the driver has exactly
/// one volume for it, with the class's parameters and secret; returns the
/// PV, the claim's UID, the PV's name and the driver's volume.
async fn a_claim_gets_exactly_one_volume(
    bed: &ProvisionerBed,
    a: &Apis,
) -> (PersistentVolume, String, String, Volume) {
    // Provision.
    a.add_claim(&claim("data", "fast", "2Gi")).await;
    let (c, pv) = bound(a, "data").await;
    let uid = c.uid().expect("uid");
    let pv_name = format!("pvc-{uid}");
    assert_eq!(pv.name_any(), pv_name);
    let state = bed.driver.state().expect("driver state");
    let volume = state
        .volume_by_name(&pv_name)
        .expect("the driver has the volume")
        .clone();
    assert_eq!(
        state.volumes.values().filter(|v| v.name == pv_name).count(),
        1,
        "exactly one volume for the claim"
    );
    // Parameters: reserved keys stripped, extra metadata added.
    assert_eq!(
        volume.parameters,
        map(&[
            ("type", "ssd"),
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", NS),
            ("csi.storage.k8s.io/pv/name", &pv_name),
        ])
    );
    assert_eq!(
        volume.secret_keys,
        vec!["password".to_string()],
        "provisioner secret passed"
    );
    assert_eq!(volume.capacity_bytes, 2 << 30);
    (pv, uid, pv_name, volume)
}

/// The PV is as upstream writes it, pinned to the one node's segment the
/// driver chose.
async fn the_pv_is_written_as_upstream_writes_it(
    cluster: &Cluster,
    pv: &PersistentVolume,
    uid: &str,
    volume: &Volume,
) {
    // The PV as upstream writes it.
    let spec = pv.spec.clone().expect("spec");
    let csi = spec.csi.clone().expect("CSI source");
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(csi.volume_handle, volume.id);
    assert_eq!(csi.fs_type.as_deref(), Some("xfs"));
    assert_eq!(
        csi.node_stage_secret_ref
            .as_ref()
            .and_then(|r| r.name.as_deref()),
        Some("data-stage")
    );
    assert!(csi.controller_publish_secret_ref.is_none());
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
    assert_eq!(
        spec.capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.as_str()),
        Some("2Gi")
    );
    assert_eq!(
        spec.claim_ref.as_ref().and_then(|r| r.uid.clone()),
        Some(uid.to_string())
    );
    let annotations = pv.annotations();
    assert_eq!(
        annotations
            .get("pv.kubernetes.io/provisioned-by")
            .map(String::as_str),
        Some(DRIVER)
    );
    assert_eq!(
        annotations
            .get("volume.kubernetes.io/provisioner-deletion-secret-name")
            .map(String::as_str),
        Some("creds")
    );
    assert!(pv
        .finalizers()
        .iter()
        .any(|f| f == "external-provisioner.volume.kubernetes.io/finalizer"));
    // Immediate binding: the driver chose one node's segment; the PV is
    // pinned to exactly that.
    let chosen = volume
        .accessible_topology
        .first()
        .and_then(|s| s.get(TOPOLOGY_KEY))
        .cloned()
        .expect("topology");
    assert!(cluster.node_names().contains(&chosen), "{chosen}");
    let terms = spec
        .node_affinity
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .expect("node affinity");
    let exprs = terms[0].match_expressions.clone().unwrap_or_default();
    assert_eq!(terms.len(), 1);
    assert_eq!(
        (exprs[0].key.as_str(), exprs[0].values.clone()),
        (TOPOLOGY_KEY, Some(vec![chosen]))
    );
}

/// The claim no longer carries our finalizer; Events, the Lease and the
/// metrics (with upstream names) tell the story.
async fn events_the_lease_and_metrics_tell_the_story(
    cluster: &Cluster,
    bed: &ProvisionerBed,
    a: &Apis,
) {
    // The claim no longer carries our finalizer; Events tell the story.
    let c = a.claims.get("data").await.expect("claim");
    assert!(
        !c.finalizers().iter().any(|f| f == CLAIM_FINALIZER),
        "{:?}",
        c.finalizers()
    );
    let reasons = event_reasons(cluster, "data").await;
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("ProvisioningSucceeded|")),
        "{reasons:?}"
    );
    // Leader election: the Lease names this provisioner.
    let holder = testkit::jsonpath(
        cluster,
        &["get", "lease", "-n", NS, "test-csi-csiops-dev"],
        "{.spec.holderIdentity}",
    )
    .await
    .expect("lease");
    assert!(!holder.is_empty(), "lease without holder");
    // Metrics with upstream names.
    let (status, metrics) =
        testkit::http_get_async(([127, 0, 0, 1], bed.http_port).into(), "/metrics")
            .await
            .expect("metrics");
    assert_eq!(status, 200);
    for needle in [
        "controller_persistentvolumeclaim_provision_total{class=\"fast\"} 1",
        "method_name=\"/csi.v1.Controller/CreateVolume\",grpc_status_code=\"OK\"",
        "workqueue_depth{name=\"claims\"}",
    ] {
        assert!(metrics.contains(needle), "missing {needle} in\n{metrics}");
    }
}

/// Deleting the claim leaves the volume while a VolumeAttachment names the
/// PV; once it is gone the volume goes from the driver, then the PV.
async fn deletion_waits_for_the_attachment_then_goes(
    cluster: &Cluster,
    bed: &ProvisionerBed,
    a: &Apis,
    pv_name: &str,
    volume: &Volume,
) {
    let client = cluster.client().expect("client");
    // Delete while a VolumeAttachment still names the PV: the PV is
    // Released but the volume stays until the attachment is gone.
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    attachments
        .create(
            &PostParams::default(),
            &VolumeAttachment {
                metadata: ObjectMeta {
                    name: Some("csi-data".into()),
                    ..Default::default()
                },
                spec: VolumeAttachmentSpec {
                    attacher: DRIVER.into(),
                    node_name: cluster.node_names()[0].clone(),
                    source: VolumeAttachmentSource {
                        persistent_volume_name: Some(pv_name.to_string()),
                        ..Default::default()
                    },
                },
                ..Default::default()
            },
        )
        .await
        .expect("attachment");
    a.claims
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete claim");
    let waiting = wait_for(DEADLINE, POLL, || async {
        let r = event_reasons(cluster, pv_name).await;
        r.into_iter()
            .find(|r| r.starts_with("VolumeFailedDelete|") && r.contains("still attached"))
    })
    .await;
    assert!(waiting.is_ok(), "no VolumeFailedDelete while attached");
    assert!(
        bed.driver_volumes().expect("volumes").contains_key(pv_name),
        "deleted while attached"
    );
    assert!(a.volumes.get_opt(pv_name).await.expect("get").is_some());
    attachments
        .delete("csi-data", &DeleteParams::default())
        .await
        .expect("detach");
    // Delete: the volume goes from the driver, then the PV.
    wait_for(DEADLINE, POLL, || async {
        a.volumes
            .get_opt(pv_name)
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await
    .expect("PV deleted");
    let state = bed.driver.state().expect("driver state");
    assert!(
        state.volume_by_name(pv_name).is_none(),
        "volume left in the driver"
    );
    assert!(
        state.deleted.iter().any(|d| d.id == volume.id),
        "no DeleteVolume recorded"
    );
}

/// Retain: the PV stays Released and the volume stays.
async fn retain_keeps_the_released_pv_and_its_volume(bed: &ProvisionerBed, a: &Apis) {
    // Retain: the PV stays Released and the volume stays.
    a.add_claim(&claim("kept", "keep", "1Gi")).await;
    let (_, kept_pv) = bound(a, "kept").await;
    assert!(kept_pv
        .finalizers()
        .iter()
        .all(|f| f != "external-provisioner.volume.kubernetes.io/finalizer"));
    a.claims
        .delete("kept", &DeleteParams::default())
        .await
        .expect("delete claim");
    wait_for(DEADLINE, POLL, || async {
        let pv = a
            .volumes
            .get_opt(&kept_pv.name_any())
            .await
            .ok()
            .flatten()?;
        (pv.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await
    .expect("PV Released");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        a.volumes
            .get_opt(&kept_pv.name_any())
            .await
            .expect("get")
            .is_some(),
        "retained PV deleted"
    );
    assert!(
        bed.driver_volumes()
            .expect("volumes")
            .contains_key(&kept_pv.name_any()),
        "retained volume deleted"
    );
}

/// Secrets never reach the log, even at -v=4.
fn secrets_never_reach_the_log(bed: &mut ProvisionerBed) {
    // Secrets never reach the log, even at -v=4.
    bed.check_sidecar().expect("provisioner still running");
    let log = bed.sidecar_log();
    assert!(
        log.contains("provisioned"),
        "log has no provisioning lines:\n{log}"
    );
    assert!(
        !log.contains(SECRET_VALUE),
        "secret value in the provisioner log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_binding_follows_the_selected_node() {
    // The first CreateVolume finds the node's storage exhausted.
    let (cluster, bed, a) = start(3, &["--fail=CreateVolume=RESOURCE_EXHAUSTED:1"], &[]).await;
    a.add_class(&class("late", "Delete", "WaitForFirstConsumer", &[]))
        .await;
    a.add_claim(&claim("late", "late", "1Gi")).await;
    // Without a node choice nothing happens.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        bed.driver_volumes().expect("volumes").is_empty(),
        "provisioned before the scheduler chose"
    );
    // The scheduler's choice, as kube-scheduler writes it.
    let node = cluster.node_names()[1].clone();
    let patch = serde_json::json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node}}});
    a.claims
        .patch("late", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("select node");
    // Exhausted storage hands the claim back to the scheduler: the
    // provisioner removes its choice.
    wait_for(DEADLINE, POLL, || async {
        let c = a.claims.get("late").await.ok()?;
        (!c.annotations()
            .contains_key("volume.kubernetes.io/selected-node"))
        .then_some(())
    })
    .await
    .expect("selected-node removed after RESOURCE_EXHAUSTED");
    // The scheduler chooses again (the same node, now with room).
    a.claims
        .patch("late", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("select node again");
    let (_, pv) = bound(&a, "late").await;
    let state = bed.driver.state().expect("state");
    let volume = state.volume_by_name(&pv.name_any()).expect("volume");
    assert_eq!(
        volume.accessible_topology,
        vec![map(&[(TOPOLOGY_KEY, &node)])],
        "the driver was asked to prefer the selected node first"
    );
    let terms = pv
        .spec
        .and_then(|s| s.node_affinity)
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .expect("affinity");
    let values: Vec<_> = terms
        .iter()
        .flat_map(|t| t.match_expressions.clone().unwrap_or_default())
        .flat_map(|e| e.values.unwrap_or_default())
        .collect();
    assert_eq!(values, vec![node]);
    cluster.stop().await.expect("stop");
}

/// CreateVolume calls the driver answered with `code`, from its log.
fn create_calls(log: &str, code: &str) -> usize {
    log.matches(&format!("method=\"CreateVolume\" code={code}"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_become_events_and_are_retried() {
    // Two failures, then the driver accepts. An internal error is retried on
    // the ordinary backoff (1 s, then 2 s).
    let (cluster, bed, a) = start(1, &["--fail=CreateVolume=INTERNAL:2"], &[]).await;
    a.add_class(&class("flaky", "Delete", "Immediate", &[]))
        .await;
    a.add_claim(&claim("flaky", "flaky", "1Gi")).await;
    let (_, pv) = bound(&a, "flaky").await;
    let reasons = event_reasons(&cluster, "flaky").await;
    let failed: Vec<_> = reasons
        .iter()
        .filter(|r| r.starts_with("ProvisioningFailed|"))
        .collect();
    assert!(!failed.is_empty(), "{reasons:?}");
    assert!(
        failed[0].contains("code = Internal"),
        "driver's message in the Event: {failed:?}"
    );
    assert_eq!(
        bed.driver_volumes()
            .expect("volumes")
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec![pv.name_any()]
    );

    // A claim of a class that does not exist: a Warning, no volume.
    a.add_claim(&claim("orphan", "missing", "1Gi")).await;
    // The PV controller only hands claims of existing classes to external
    // provisioners; mark it the way it would.
    let patch = serde_json::json!({"metadata": {"annotations": {"volume.kubernetes.io/storage-provisioner": DRIVER}}});
    a.claims
        .patch("orphan", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
    let found = wait_for(DEADLINE, POLL, || async {
        let r = event_reasons(&cluster, "orphan").await;
        r.into_iter()
            .find(|r| r.starts_with("ProvisioningFailed|") && r.contains("\"missing\" not found"))
    })
    .await;
    assert!(found.is_ok(), "no ProvisioningFailed for the missing class");
    assert_eq!(bed.driver_volumes().expect("volumes").len(), 1);
    cluster.stop().await.expect("stop");
}

/// The driver refuses a request as InvalidArgument: upstream (v6.0 on)
/// calls it infeasible and waits `--retry-interval-max` before the next
/// attempt instead of the ordinary backoff, and says so in the Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infeasible_request_waits_the_maximum_interval() {
    let wait = Duration::from_secs(8);
    let (cluster, bed, a) = start(
        1,
        &["--fail=CreateVolume=INVALID_ARGUMENT:1"],
        &["--retry-interval-start=1s", "--retry-interval-max=8s"],
    )
    .await;
    a.add_class(&class("strict", "Delete", "Immediate", &[]))
        .await;
    a.add_claim(&claim("refused", "strict", "1Gi")).await;
    let event = wait_for(DEADLINE, POLL, || async {
        event_reasons(&cluster, "refused")
            .await
            .into_iter()
            .find(|r| r.starts_with("ProvisioningFailed|"))
    })
    .await
    .expect("a ProvisioningFailed Event");
    let refused_at = std::time::Instant::now();
    assert!(
        event.contains("infeasible error. Retries will be delayed")
            && event.contains("code = InvalidArgument"),
        "{event}"
    );
    // Half the wait later, no second attempt: on the ordinary backoff there
    // would have been two (1 s, 2 s).
    tokio::time::sleep(wait / 2).await;
    let log = bed.driver.log();
    assert_eq!(
        (
            create_calls(&log, "InvalidArgument"),
            create_calls(&log, "OK")
        ),
        (1, 0),
        "one refused call and no retry yet"
    );
    let (_, pv) = bound(&a, "refused").await;
    assert!(
        refused_at.elapsed() >= wait / 2,
        "bound after the wait, not on the ordinary backoff"
    );
    assert_eq!(create_calls(&bed.driver.log(), "OK"), 1);
    assert_eq!(
        bed.driver_volumes()
            .expect("volumes")
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec![pv.name_any()]
    );
    cluster.stop().await.expect("stop");
}

/// A claim that gets bound to another PV while its own volume was being
/// created (here: CreateVolume in flight, the provisioner killed, an admin's
/// pre-bound PV appears) no longer needs that volume: the restarted
/// provisioner's journal sweep deletes it and trims the intent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_bound_elsewhere_leaves_no_volume_behind() {
    let (cluster, mut bed, a) = start(1, &["--delay=CreateVolume=3s"], &[]).await;
    a.add_class(&class("slow", "Delete", "Immediate", &[]))
        .await;
    a.add_claim(&claim("taken", "slow", "1Gi")).await;
    let c = a.claims.get("taken").await.expect("claim");
    let uid = c.uid().expect("uid");
    let ours = format!("pvc-{uid}");
    // The intent is written before CreateVolume is sent; kill the
    // provisioner only once the driver has the call (the intent alone can
    // come before it, and a call never sent leaves no volume to sweep).
    wait_for(DEADLINE, POLL, || async {
        journal_keys(&cluster).await?.contains(&ours).then_some(())
    })
    .await
    .expect("intent recorded before CreateVolume");
    wait_for(DEADLINE, POLL, || async {
        bed.driver.received("CreateVolume", &ours).then_some(())
    })
    .await
    .expect("the driver received CreateVolume");
    bed.kill9_sidecar();
    assert!(
        !a.claims
            .get("taken")
            .await
            .expect("claim")
            .finalizers()
            .iter()
            .any(|f| f == CLAIM_FINALIZER),
        "with the journal, the claim is never written"
    );
    // The driver finishes the volume nobody will use.
    wait_for(DEADLINE, POLL, || async {
        bed.driver_volumes().ok()?.contains_key(&ours).then_some(())
    })
    .await
    .expect("the in-flight CreateVolume completes");
    // An admin's PV, pre-bound to the claim: the PV controller binds them.
    let static_pv = PersistentVolume {
        metadata: ObjectMeta {
            name: Some("static-pv".into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
            storage_class_name: Some("slow".into()),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            claim_ref: Some(k8s_openapi::api::core::v1::ObjectReference {
                namespace: Some(NS.into()),
                name: Some("taken".into()),
                uid: Some(uid.clone()),
                ..Default::default()
            }),
            csi: Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: "static.example.com".into(),
                volume_handle: "static-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    a.volumes
        .create(&PostParams::default(), &static_pv)
        .await
        .expect("static PV");
    let (_, pv) = bound(&a, "taken").await;
    assert_eq!(pv.name_any(), "static-pv");
    // Restart: the sweep at leader start deletes the unused volume, then
    // trims its intent.
    bed.start_sidecar().expect("restart");
    wait_for(DEADLINE, POLL, || async {
        (!journal_keys(&cluster).await?.contains(&ours)).then_some(())
    })
    .await
    .expect("intent trimmed");
    assert!(
        !bed.driver_volumes().expect("volumes").contains_key(&ours),
        "the unused volume was left behind"
    );
    assert!(a.volumes.get_opt(&ours).await.expect("get").is_none());
    bed.stop_sidecar();
    cluster.stop().await.expect("stop");
}

/// `kill -9` of the provisioner again and again while 100 claims are
/// provisioned and half of them deleted (some before their PV exists), then
/// the rest deleted: at every settled point the driver holds exactly one
/// volume per live claim, and none at the end. Each provisioner says (before
/// it is killed, and the last at the end) how many intents it inherited
/// without a PV: more than none proves that kills landed between an intent
/// and its PV, the window the journal is for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_provisioning_and_deletion_leaks_nothing() {
    const CLAIMS: usize = 100;
    // A slow CreateVolume widens the window between the volume and its PV.
    let (cluster, mut bed, a) = start(
        2,
        &["--delay=CreateVolume=150ms", "--delay=DeleteVolume=100ms"],
        &["--worker-threads=10"],
    )
    .await;
    a.add_class(&class("chaos", "Delete", "Immediate", &[]))
        .await;

    let names: Vec<String> = (0..CLAIMS).map(|i| format!("c{i:03}")).collect();
    let mut kills = 0;
    // Intents each provisioner inherited without a PV, summed over all.
    let mut recovered = 0;
    claims_come_and_a_third_go_between_kills(&mut bed, &a, &names, &mut kills, &mut recovered)
        .await;
    let deleted: BTreeSet<String> = names
        .chunks(10)
        .flat_map(|c| c.iter().step_by(3).cloned())
        .collect();
    let live: Vec<&String> = names.iter().filter(|n| !deleted.contains(*n)).collect();
    the_live_claims_bind_under_more_kills(&mut bed, &a, &live, &mut kills, &mut recovered).await;
    each_live_claim_has_exactly_one_volume(&bed, &a, &live).await;
    deleting_the_rest_leaves_no_volume_or_intent(
        &cluster,
        &mut bed,
        &a,
        &live,
        &mut kills,
        &mut recovered,
    )
    .await;
    recovered += bed.metric_sum(RECOVERED).await;
    eprintln!("{kills} kills; the provisioners inherited {recovered} intents without a PV");
    assert!(
        recovered > 0,
        "none of the {kills} kills left an intent without its PV: the journal's window was never hit"
    );
    bed.stop_sidecar();
    cluster.stop().await.expect("stop");
}

/// The claims are made while the provisioner is killed every tenth, and a
/// third of them deleted while nothing runs.
async fn claims_come_and_a_third_go_between_kills(
    bed: &mut ProvisionerBed,
    a: &Apis,
    names: &[String],
    kills: &mut u32,
    recovered: &mut u64,
) {
    for (i, name) in names.iter().enumerate() {
        a.add_claim(&claim(name, "chaos", "1Mi")).await;
        if i % 10 == 9 {
            *recovered += bed.metric_sum(RECOVERED).await;
            bed.kill9_sidecar();
            *kills += 1;
            // Delete some claims while nothing runs: their volumes may
            // exist with no PV yet.
            for gone in names[i - 9..=i].iter().step_by(3) {
                a.claims
                    .delete(gone, &DeleteParams::default())
                    .await
                    .expect("delete");
            }
            bed.start_sidecar().expect("restart");
            tokio::time::sleep(Duration::from_millis(300 + (i as u64 * 37) % 500)).await;
        }
    }
}

/// More kills while the rest settles; every live claim binds.
async fn the_live_claims_bind_under_more_kills(
    bed: &mut ProvisionerBed,
    a: &Apis,
    live: &[&String],
    kills: &mut u32,
    recovered: &mut u64,
) {
    // Keep killing while the rest settles.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        *recovered += bed.metric_sum(RECOVERED).await;
        bed.kill9_sidecar();
        bed.start_sidecar().expect("restart");
        *kills += 1;
    }
    for name in live {
        bound(a, name).await;
    }
}

/// Deleted claims and their PVs are gone, and the driver holds exactly one
/// volume per live claim.
async fn each_live_claim_has_exactly_one_volume(bed: &ProvisionerBed, a: &Apis, live: &[&String]) {
    // Deleted claims are gone (our finalizer released) and every PV is
    // gone with them.
    let settled = wait_for(
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let claims = a.claims.list(&ListParams::default()).await.ok()?;
            let pvs = a.volumes.list(&ListParams::default()).await.ok()?;
            let volumes = bed.driver_volumes().ok()?;
            let pv_names: BTreeSet<String> = pvs.items.iter().map(|p| p.name_any()).collect();
            (claims.items.len() == live.len()
                && pv_names.len() == live.len()
                && volumes.keys().cloned().collect::<BTreeSet<_>>() == pv_names)
                .then_some((pv_names, volumes))
        },
    )
    .await;
    let (pv_names, volumes) = match settled {
        Ok(v) => v,
        Err(_) => {
            let claims = a.claims.list(&ListParams::default()).await.expect("list");
            let pvs = a.volumes.list(&ListParams::default()).await.expect("list");
            let volumes = bed.driver_volumes().expect("volumes");
            let pv_names: BTreeSet<String> = pvs.items.iter().map(|p| p.name_any()).collect();
            let extra: Vec<_> = volumes.keys().filter(|v| !pv_names.contains(*v)).collect();
            let missing: Vec<_> = pv_names
                .iter()
                .filter(|p| !volumes.contains_key(*p))
                .collect();
            let stuck: Vec<String> = claims
                .items
                .iter()
                .filter(|c| !live.contains(&&c.name_any()))
                .map(|c| format!("{} {:?} {:?}", c.name_any(), c.uid(), c.finalizers()))
                .collect();
            panic!(
                "not settled: {} claims ({} expected), {} PVs, {} volumes; volumes without PV {extra:?}; PVs without volume {missing:?}; deleted claims still there {stuck:?}; log at {}",
                claims.items.len(),
                live.len(),
                pvs.items.len(),
                volumes.len(),
                bed.sidecar_log_path().display()
            )
        }
    };
    // One volume per claim: names are unique by construction, so compare
    // counts of the driver's volumes (by ID) too.
    let state = bed.driver.state().expect("state");
    assert_eq!(
        state.volumes.len(),
        live.len(),
        "duplicate volumes: {:?}",
        state.volumes.keys()
    );
    assert_eq!(volumes.len(), pv_names.len());
}

/// Deleting the rest, with more kills, leaves no PV, no volume and no intent.
async fn deleting_the_rest_leaves_no_volume_or_intent(
    cluster: &Cluster,
    bed: &mut ProvisionerBed,
    a: &Apis,
    live: &[&String],
    kills: &mut u32,
    recovered: &mut u64,
) {
    // Delete the rest, with more kills.
    for (i, name) in live.iter().enumerate() {
        a.claims
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
        if i % 15 == 14 {
            *recovered += bed.metric_sum(RECOVERED).await;
            bed.kill9_sidecar();
            bed.start_sidecar().expect("restart");
            *kills += 1;
        }
    }
    wait_for(
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let pvs = a.volumes.list(&ListParams::default()).await.ok()?;
            (pvs.items.is_empty() && bed.driver_volumes().ok()?.is_empty()).then_some(())
        },
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "volumes left after deleting every claim: {:?}",
            bed.driver_volumes()
        )
    });
    // Nothing is left in the journal either (trims are written last).
    if wait_for(DEADLINE, POLL, || async {
        journal_keys(cluster).await?.is_empty().then_some(())
    })
    .await
    .is_err()
    {
        panic!("intents left: {:?}", journal_keys(cluster).await);
    }
}
