//! VolumeAttributesClass through the provisioner, on a real control plane
//! (kube-apiserver v1.34 serves `storage.k8s.io/v1` VolumeAttributesClass,
//! kube-controller-manager's PV controller binds a claim only to a PV of
//! its class) with `csi-test-driver --enable-modify` (MODIFY_VOLUME), whose
//! persisted state shows what reached the driver.
//!
//! The modify to a new class goes through upstream's external-resizer when
//! `CSIOPS_UPSTREAM_RESIZER` names a `csi-resizer` binary (built from its
//! tag, outside the repository: the Go module proxy refuses the module, so
//! the test bed cannot build it). Without it the test sends what the
//! resizer would (ControllerModifyVolume with the new class's parameters
//! and the Secret the PV's annotations name) to the driver itself. Either
//! way the driver's volume must change.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use csiops_e2e::process::ManagedProcess;
use csiops_e2e::provisioning::{ProvisionerBed, DRIVER};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use csiops_proto::csi::v1::ControllerModifyVolumeRequest;
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, Secret,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::ResourceExt;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
const MODIFY_NAME: &str = "volume.kubernetes.io/controller-modify-secret-name";
const MODIFY_NAMESPACE: &str = "volume.kubernetes.io/controller-modify-secret-namespace";
/// A `csi-resizer` binary to modify volumes through (optional).
const UPSTREAM_RESIZER: &str = "CSIOPS_UPSTREAM_RESIZER";

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn attributes_class(name: &str, driver: &str, params: &[(&str, &str)]) -> VolumeAttributesClass {
    VolumeAttributesClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        driver_name: driver.into(),
        parameters: Some(map(params)),
    }
}

fn claim(name: &str, class: &str, attributes: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.into()),
            volume_attributes_class_name: Some(attributes.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
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
    attributes: Api<VolumeAttributesClass>,
}

/// A kwok cluster with the provisioner bed over `csi-test-driver
/// <driver_args>`, a StorageClass `fast` of the driver naming a
/// ControllerModify secret by template, and the Secret it resolves to for
/// claim `data`.
async fn start(driver_args: &[&str]) -> (Cluster, ProvisionerBed, Apis) {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster");
    let bed = ProvisionerBed::start(&cluster, driver_args, &[])
        .await
        .expect("provisioner bed");
    let client = cluster.client().expect("client");
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &StorageClass {
                metadata: ObjectMeta {
                    name: Some("fast".into()),
                    ..Default::default()
                },
                provisioner: DRIVER.into(),
                reclaim_policy: Some("Delete".into()),
                volume_binding_mode: Some("Immediate".into()),
                parameters: Some(map(&[
                    ("type", "ssd"),
                    (
                        "csi.storage.k8s.io/controller-modify-secret-name",
                        "${pvc.name}-modify",
                    ),
                    (
                        "csi.storage.k8s.io/controller-modify-secret-namespace",
                        "${pvc.namespace}",
                    ),
                ])),
                ..Default::default()
            },
        )
        .await
        .expect("class");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("data-modify".into()),
                    ..Default::default()
                },
                string_data: Some(map(&[("modify-token", "never-logged")])),
                ..Default::default()
            },
        )
        .await
        .expect("secret");
    let apis = Apis {
        claims: Api::namespaced(client.clone(), NS),
        volumes: Api::all(client.clone()),
        attributes: Api::all(client),
    };
    (cluster, bed, apis)
}

/// The claim once Bound, with its PV.
async fn bound(a: &Apis, name: &str) -> (PersistentVolumeClaim, PersistentVolume) {
    testkit::wait_bound_volume(&a.claims, &a.volumes, name, DEADLINE).await
}

/// Waits for a Warning Event on `object` whose line contains every one of
/// `needles`; returns the Event lines.
async fn event_with(cluster: &Cluster, object: &str, needles: &[&str]) -> Vec<String> {
    wait_for(DEADLINE, POLL, || async {
        let lines = testkit::event_lines(cluster, NS, object).await;
        lines
            .iter()
            .any(|l| needles.iter().all(|n| l.contains(n)))
            .then_some(lines)
    })
    .await
    .unwrap_or_else(|_| panic!("no Event on {object} containing {needles:?} within {DEADLINE:?}"))
}

/// What the external-resizer does when claim `data` moves to class
/// `platinum`, done by the test: ControllerModifyVolume with the class's
/// parameters and the Secret the PV's annotations name.
async fn modify_as_the_resizer_would(
    cluster: &Cluster,
    bed: &ProvisionerBed,
    pv: &PersistentVolume,
) {
    let client = cluster.client().expect("client");
    let secret: Secret = Api::namespaced(client, NS)
        .get("data-modify")
        .await
        .expect("modify secret");
    let secrets: HashMap<String, String> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .expect("CSI source")
        .volume_handle
        .clone();
    let csi = bed.driver.client().await.expect("driver client");
    csi.controller()
        .controller_modify_volume(ControllerModifyVolumeRequest {
            volume_id: handle,
            secrets,
            mutable_parameters: HashMap::from([("iops".to_string(), "9000".to_string())]),
        })
        .await
        .expect("ControllerModifyVolume");
}

/// Claim `data` moves to class `platinum` and upstream's resizer
/// (`resizer`, on the driver's socket) modifies it: the claim and its PV
/// end up naming `platinum`.
async fn modify_through_resizer(
    cluster: &Cluster,
    bed: &ProvisionerBed,
    a: &Apis,
    resizer: &std::path::Path,
) {
    let args = vec![
        format!("--csi-address={}", bed.driver.socket().display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        "--leader-election=false".to_string(),
        "--v=4".to_string(),
    ];
    let log = cluster.log_dir().join("csi-resizer.log");
    let _resizer = ManagedProcess::spawn("csi-resizer", resizer, &args, &log).expect("csi-resizer");
    a.claims
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"volumeAttributesClassName": "platinum"}})),
        )
        .await
        .expect("claim data to platinum");
    let done = wait_for(DEADLINE, POLL, || async {
        let c = a.claims.get("data").await.ok()?;
        let current = c.status?.current_volume_attributes_class_name?;
        (current == "platinum").then_some(())
    })
    .await;
    assert!(
        done.is_ok(),
        "the resizer did not modify claim data to platinum within {DEADLINE:?}:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let pv = a
        .volumes
        .get(
            &a.claims
                .get("data")
                .await
                .expect("claim")
                .spec
                .and_then(|s| s.volume_name)
                .expect("bound"),
        )
        .await
        .expect("PV");
    assert_eq!(
        pv.spec
            .and_then(|s| s.volume_attributes_class_name)
            .as_deref(),
        Some("platinum")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutable_parameters_reach_the_driver_and_a_missing_class_is_waited_for() {
    let (cluster, mut bed, a) = start(&["--enable-modify"]).await;
    a.attributes
        .create(
            &PostParams::default(),
            &attributes_class("gold", DRIVER, &[("iops", "3000"), ("tier", "gold")]),
        )
        .await
        .expect("VolumeAttributesClass gold");

    let pv = a_class_gives_create_volume_its_mutable_parameters(&bed, &a).await;
    moving_to_platinum_modifies_the_volume(&cluster, &bed, &a, &pv).await;
    a_claim_of_a_missing_class_waits_for_it(&cluster, &bed, &a).await;
    a_class_of_another_driver_is_refused(&cluster, &a).await;
    bed.check_sidecar().expect("the provisioner still runs");
    let log = bed.sidecar_log();
    assert!(!log.contains("never-logged"), "a Secret value was logged");
}

/// A claim of an existing class: its parameters are CreateVolume's mutable
/// parameters and the PV names the class and the modify secret; returns the PV.
async fn a_class_gives_create_volume_its_mutable_parameters(
    bed: &ProvisionerBed,
    a: &Apis,
) -> PersistentVolume {
    // A claim of an existing class: its parameters are CreateVolume's
    // mutable parameters, the PV names the class and the modify secret.
    a.claims
        .create(&PostParams::default(), &claim("data", "fast", "gold"))
        .await
        .expect("claim data");
    let (c, pv) = bound(a, "data").await;
    let state = bed.driver.state().expect("driver state");
    let volume = state
        .volume_by_name(&pv.name_any())
        .expect("the driver has the volume")
        .clone();
    assert_eq!(
        volume.mutable_parameters,
        map(&[("iops", "3000"), ("tier", "gold")])
    );
    assert!(
        !volume
            .parameters
            .keys()
            .any(|k| k.contains("controller-modify")),
        "the modify secret keys are the provisioner's: {:?}",
        volume.parameters
    );
    assert!(
        volume.secret_keys.is_empty(),
        "CreateVolume gets no modify secret: {:?}",
        volume.secret_keys
    );
    let spec = pv.spec.clone().expect("PV spec");
    assert_eq!(spec.volume_attributes_class_name.as_deref(), Some("gold"));
    let annotations = pv.annotations();
    assert_eq!(
        annotations.get(MODIFY_NAME).map(String::as_str),
        Some("data-modify")
    );
    assert_eq!(
        annotations.get(MODIFY_NAMESPACE).map(String::as_str),
        Some(NS)
    );
    // The PV controller reports the class the volume has now.
    let current = wait_for(DEADLINE, POLL, || async {
        let c = a.claims.get("data").await.ok()?;
        c.status?.current_volume_attributes_class_name
    })
    .await
    .ok();
    assert_eq!(current.as_deref(), Some("gold"), "claim {:?}", c.status);
    pv
}

/// The claim moves to class `platinum`: the driver's volume gets its
/// parameters (merged) and the modify secret.
async fn moving_to_platinum_modifies_the_volume(
    cluster: &Cluster,
    bed: &ProvisionerBed,
    a: &Apis,
    pv: &PersistentVolume,
) {
    // The claim moves to class `platinum`: the driver's volume gets its
    // parameters (merged, as the driver keeps them) and the modify secret.
    a.attributes
        .create(
            &PostParams::default(),
            &attributes_class("platinum", DRIVER, &[("iops", "9000")]),
        )
        .await
        .expect("VolumeAttributesClass platinum");
    match std::env::var_os(UPSTREAM_RESIZER) {
        Some(resizer) => modify_through_resizer(cluster, bed, a, resizer.as_ref()).await,
        None => modify_as_the_resizer_would(cluster, bed, pv).await,
    }
    let modified = bed.driver.state().expect("driver state");
    let modified = modified.volume_by_name(&pv.name_any()).expect("volume");
    assert_eq!(
        modified.mutable_parameters,
        map(&[("iops", "9000"), ("tier", "gold")])
    );
    assert_eq!(modified.modify_secret_keys, ["modify-token"]);
}

/// A claim naming a class that does not exist yet waits, saying for what,
/// with no volume; once the class appears it is provisioned with its
/// parameters.
async fn a_claim_of_a_missing_class_waits_for_it(
    cluster: &Cluster,
    bed: &ProvisionerBed,
    a: &Apis,
) {
    // A claim naming a class that does not exist yet waits, saying for
    // what; no volume is made meanwhile.
    a.claims
        .create(&PostParams::default(), &claim("later", "fast", "silver"))
        .await
        .expect("claim later");
    let lines = event_with(
        cluster,
        "later",
        &["ProvisioningFailed", "\"silver\"", "not found"],
    )
    .await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("waits for VolumeAttributesClass")),
        "{lines:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = a.claims.get("later").await.expect("claim later");
    assert_eq!(
        c.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    let uid = c.uid().expect("uid");
    assert!(
        !bed.driver_volumes()
            .expect("driver volumes")
            .contains_key(&format!("pvc-{uid}")),
        "no volume while the class is missing"
    );
    // The class appears: provisioned with its parameters, promptly (the
    // class watch, not the claim's backoff, brings the claim back).
    a.attributes
        .create(
            &PostParams::default(),
            &attributes_class("silver", DRIVER, &[("iops", "1000")]),
        )
        .await
        .expect("VolumeAttributesClass silver");
    let (_, pv) = bound(a, "later").await;
    let state = bed.driver.state().expect("driver state");
    let volume = state.volume_by_name(&pv.name_any()).expect("volume");
    assert_eq!(volume.mutable_parameters, map(&[("iops", "1000")]));
    assert_eq!(
        pv.spec
            .as_ref()
            .and_then(|s| s.volume_attributes_class_name.as_deref()),
        Some("silver")
    );
}

/// A class of another driver is refused, with upstream's reason.
async fn a_class_of_another_driver_is_refused(cluster: &Cluster, a: &Apis) {
    // A class of another driver is refused, with upstream's reason.
    a.attributes
        .create(
            &PostParams::default(),
            &attributes_class("theirs", "other.csi.example.com", &[("iops", "1")]),
        )
        .await
        .expect("VolumeAttributesClass theirs");
    a.claims
        .create(&PostParams::default(), &claim("wrong", "fast", "theirs"))
        .await
        .expect("claim wrong");
    event_with(
        cluster,
        "wrong",
        &["ProvisioningFailed", "\"theirs\"", "other.csi.example.com"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_modify_volume_refuses_claims_with_a_class() {
    let (cluster, bed, a) = start(&[]).await;
    a.attributes
        .create(
            &PostParams::default(),
            &attributes_class("gold", DRIVER, &[("iops", "3000")]),
        )
        .await
        .expect("VolumeAttributesClass gold");
    a.claims
        .create(&PostParams::default(), &claim("data", "fast", "gold"))
        .await
        .expect("claim data");
    event_with(
        &cluster,
        "data",
        &[
            "ProvisioningFailed",
            "MODIFY_VOLUME capability is not reported",
        ],
    )
    .await;
    assert!(
        bed.driver_volumes().expect("driver volumes").is_empty(),
        "nothing created"
    );
    // A claim without a class is provisioned as ever by the same driver.
    let mut plain = claim("plain", "fast", "");
    if let Some(s) = plain.spec.as_mut() {
        s.volume_attributes_class_name = None;
    }
    a.claims
        .create(&PostParams::default(), &plain)
        .await
        .expect("claim plain");
    let (_, pv) = bound(&a, "plain").await;
    assert_eq!(
        pv.spec
            .as_ref()
            .and_then(|s| s.volume_attributes_class_name.clone()),
        None
    );
    // The modify secret is named on every PV of the class, as upstream.
    assert_eq!(
        pv.annotations().get(MODIFY_NAME).map(String::as_str),
        Some("plain-modify")
    );
}
