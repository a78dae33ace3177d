//! `spec.volumeAttributesClasses` on a real control plane: the operator
//! creates each class for the driver, re-creates a changed one (its
//! parameters are immutable), waits for Kubernetes to let go of a replaced
//! class a claim still uses, deletes a class removed from the spec and, with
//! the object, the rest; the API server refuses bad classes.

use std::time::Duration;

use csiops_e2e::testkit::{self, DriverCr};
use csiops_e2e::{operator_bin, wait_for, Cluster, ClusterOptions, OperatorProcess};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};

const NS: &str = "csi-vac";
const DRIVER: &str = "vac.csi.example.com";
const DEADLINE: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(300);
const OWNER_UID: &str = "csiops.dev/owner-uid";

/// The Namespace and the CSIDriverDeployment with `classes`, spec fields
/// as YAML lines indented by two spaces.
fn object(classes: &str) -> String {
    DriverCr::new(NS, "vac", DRIVER, "v1.0.0")
        .image("registry.example.com/vac-csi:1.0.0")
        .merge_yaml("", classes)
        .expect("the classes are a YAML mapping")
        .yaml()
}

async fn apply(cluster: &Cluster, classes: &str) {
    let out = testkit::apply_yaml(cluster, "vac", &object(classes))
        .await
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The class once it exists (and is not being deleted) with `iops`.
async fn class_with(
    classes: &Api<VolumeAttributesClass>,
    name: &str,
    iops: &str,
) -> VolumeAttributesClass {
    wait_for(DEADLINE, POLL, || async {
        let c = classes.get_opt(name).await.ok().flatten()?;
        (c.metadata.deletion_timestamp.is_none()
            && c.parameters.as_ref()?.get("iops").map(String::as_str) == Some(iops))
        .then_some(c)
    })
    .await
    .unwrap_or_else(|_| panic!("VolumeAttributesClass {name} with iops {iops} not there"))
}

async fn gone(classes: &Api<VolumeAttributesClass>, name: &str) {
    wait_for(DEADLINE, POLL, || async {
        classes.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("VolumeAttributesClass {name} still there"));
}

async fn event_reasons(cluster: &Cluster) -> String {
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=vac",
            "-o",
            "custom-columns=REASON:.reason",
        ])
        .await
        .expect("events")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classes_follow_the_spec() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    testkit::install_crd(&cluster).await.expect("CRD installs");
    let operator = cluster
        .run_operator(&operator_bin().expect("operator built"))
        .expect("operator starts");
    let classes: Api<VolumeAttributesClass> = Api::all(client.clone());

    the_schema_refuses_bad_classes(&cluster).await;
    let gold =
        classes_are_created_for_the_driver_labelled_with_their_owner(&cluster, &classes).await;
    a_changed_class_nothing_uses_is_re_created(&cluster, &classes, &gold).await;
    a_changed_class_a_claim_uses_waits_for_the_claim(&cluster, &client, &classes, &operator).await;
    removed_classes_go_and_the_rest_with_the_object(&cluster, &classes).await;
    drop(operator);
}

/// The schema refuses what Kubernetes would refuse of a class, and
/// duplicate names.
async fn the_schema_refuses_bad_classes(cluster: &Cluster) {
    for (classes_yaml, expect) in [
        (
            "  volumeAttributesClasses:\n  - name: a\n    parameters: {}\n",
            "spec.volumeAttributesClasses[0].parameters",
        ),
        (
            "  volumeAttributesClasses:\n  - name: a\n    parameters: {\"\": x}\n",
            "parameters keys must not be empty",
        ),
        (
            "  volumeAttributesClasses:\n  - name: a\n    parameters: {k: v}\n  - name: a\n    parameters: {k: w}\n",
            "volumeAttributesClasses names must be unique",
        ),
        (
            "  volumeAttributesClasses:\n  - name: Not_A_Name\n    parameters: {k: v}\n",
            "spec.volumeAttributesClasses[0].name",
        ),
    ] {
        testkit::assert_refused(
            cluster,
            &format!("{classes_yaml:?}"),
            &object(classes_yaml),
            expect,
        )
        .await;
    }
}

/// Created for the driver, labelled with their owner. The gold class.
async fn classes_are_created_for_the_driver_labelled_with_their_owner(
    cluster: &Cluster,
    classes: &Api<VolumeAttributesClass>,
) -> VolumeAttributesClass {
    apply(
        cluster,
        "  volumeAttributesClasses:\n  - name: vac-gold\n    parameters: {iops: \"3000\"}\n  - name: vac-silver\n    parameters: {iops: \"1000\"}\n",
    )
    .await;
    let gold = class_with(classes, "vac-gold", "3000").await;
    assert_eq!(gold.driver_name, DRIVER);
    assert!(
        gold.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(OWNER_UID)),
        "{:?}",
        gold.metadata.labels
    );
    class_with(classes, "vac-silver", "1000").await;
    gold
}

/// A changed class nothing uses is deleted and created again.
async fn a_changed_class_nothing_uses_is_re_created(
    cluster: &Cluster,
    classes: &Api<VolumeAttributesClass>,
    gold: &VolumeAttributesClass,
) {
    apply(
        cluster,
        "  volumeAttributesClasses:\n  - name: vac-gold\n    parameters: {iops: \"4000\"}\n  - name: vac-silver\n    parameters: {iops: \"1000\"}\n",
    )
    .await;
    let regold = class_with(classes, "vac-gold", "4000").await;
    assert_ne!(regold.metadata.uid, gold.metadata.uid);
    assert!(event_reasons(cluster)
        .await
        .contains("VolumeAttributesClassRecreated"));
}

/// A changed class a claim uses: Kubernetes keeps the old one until the
/// claim lets go, the operator says so, then creates the new one.
async fn a_changed_class_a_claim_uses_waits_for_the_claim(
    cluster: &Cluster,
    client: &kube::Client,
    classes: &Api<VolumeAttributesClass>,
    operator: &OperatorProcess,
) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    claims
        .create(
            &PostParams::default(),
            &PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("uses-silver".into()),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    storage_class_name: Some("none".into()),
                    volume_attributes_class_name: Some("vac-silver".into()),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("claim");
    // The protection controller's finalizer is on the class before the
    // change, so its deletion waits for the claim.
    wait_for(DEADLINE, POLL, || async {
        let c = classes.get_opt("vac-silver").await.ok().flatten()?;
        c.metadata
            .finalizers?
            .iter()
            .any(|f| f == "kubernetes.io/vac-protection")
            .then_some(())
    })
    .await
    .expect("vac-protection finalizer on vac-silver");
    apply(
        cluster,
        "  volumeAttributesClasses:\n  - name: vac-gold\n    parameters: {iops: \"4000\"}\n  - name: vac-silver\n    parameters: {iops: \"1500\"}\n",
    )
    .await;
    wait_for(DEADLINE, POLL, || async {
        event_reasons(cluster)
            .await
            .contains("VolumeAttributesClassInUse")
            .then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "no VolumeAttributesClassInUse Event\n{}",
            operator.log_tail(30)
        )
    });
    let held = classes.get("vac-silver").await.expect("old class held");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(
        held.parameters
            .as_ref()
            .and_then(|p| p.get("iops"))
            .map(String::as_str),
        Some("1000")
    );
    claims
        .delete("uses-silver", &DeleteParams::default())
        .await
        .expect("claim deleted");
    class_with(classes, "vac-silver", "1500").await;
}

/// Removed from the spec: deleted; the object deleted: the rest go too.
async fn removed_classes_go_and_the_rest_with_the_object(
    cluster: &Cluster,
    classes: &Api<VolumeAttributesClass>,
) {
    apply(
        cluster,
        "  volumeAttributesClasses:\n  - name: vac-gold\n    parameters: {iops: \"4000\"}\n",
    )
    .await;
    gone(classes, "vac-silver").await;
    class_with(classes, "vac-gold", "4000").await;
    cluster
        .kubectl_ok(["-n", NS, "delete", "csidd", "vac", "--wait=false"])
        .await
        .expect("delete");
    gone(classes, "vac-gold").await;
}
