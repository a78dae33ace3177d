//! `csiDriver.serviceAccountTokenInSecrets` on the real node (Kubernetes
//! 1.35+: `CSIServiceAccountTokenSecrets`, GA in 1.36): with
//! `tokenRequests`, kubelet hands the pod's ServiceAccount tokens to
//! NodePublishVolume — in its `secrets` when the field is true (which
//! drivers and sidecars never log), in the volume context when it is false.
//!
//! csi-test-driver logs every request with its secrets stripped, so its
//! NodePublishVolume line shows which: `"secrets":"***stripped***"` only
//! when secrets were sent, and the token key in `volume_context` only when
//! the tokens travelled there. The field is switched on the live object and
//! the pod mounts again.
//!
//! Needs root and `make node-prereqs`, like `real_node.rs`.

use std::time::Duration;

use csiops_e2e::walkthrough::{self, App, Use, VolumeDriver, NAME, NS};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::{Api, DeleteParams};

const DEADLINE: Duration = Duration::from_secs(180);
/// The key kubelet puts the tokens under, in either place.
const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";
const AUDIENCE: &str = "csiops-e2e";

/// The NodePublishVolume lines of the node driver's log for `volume`.
fn publish_lines(cluster: &Cluster, volume: &str) -> Vec<String> {
    let log = testkit::kubectl_text(
        cluster,
        &[
            "-n",
            NS,
            "logs",
            &format!("daemonset/{NAME}-node"),
            "-c",
            "csi-driver",
        ],
    );
    log.lines()
        .filter(|l| {
            l.contains("method=\"NodePublishVolume\"") && l.contains(" call ") && l.contains(volume)
        })
        .map(str::to_string)
        .collect()
}

/// Runs `app` (claim and pod), waits until its pod runs, and returns the
/// last NodePublishVolume line of its volume.
async fn mount(cluster: &Cluster, app: &App<'_>, pod: &str, first: bool) -> String {
    let yaml = if first { app.yaml() } else { app.pod_yaml(pod) };
    testkit::apply_ok(cluster, pod, &yaml).await;
    walkthrough::wait_pod_running(cluster, pod, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.log_tails(30)));
    let volume = testkit::jsonpath(
        cluster,
        &["-n", NS, "get", "pvc", app.name],
        "{.spec.volumeName}",
    )
    .await
    .expect("the claim's volume");
    publish_lines(cluster, &volume)
        .pop()
        .unwrap_or_else(|| panic!("no NodePublishVolume of {volume} in the driver's log"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_travel_in_secrets_or_in_the_volume_context_as_the_field_says() {
    let cluster = Cluster::start(ClusterOptions {
        nodes: 0,
        real_node: true,
        ..ClusterOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("cluster with a real node starts: {e}"));
    let client = cluster.client().expect("client");
    let (image, kubelet_dir, data_dir) =
        walkthrough::real_node_bed(&cluster, "csi-data").expect("the real node's bed");
    walkthrough::install_operator(&cluster)
        .await
        .unwrap_or_else(|e| panic!("operator ready: {e}"));

    let driver = VolumeDriver {
        image: &image,
        version: "v0.1.0",
        kubelet_dir: &kubelet_dir,
        data_dir: &data_dir,
        on_simulated_nodes: false,
        controller_args: &[],
        node_args: &[],
        node_fields: &[],
    };
    let csi_driver = "  csiDriver:\n    attachRequired: true\n";
    let with_tokens = |in_secrets: bool| {
        let base = driver.yaml();
        assert!(base.contains(csi_driver), "{base}");
        base.replace(
            csi_driver,
            &format!(
                "{csi_driver}    tokenRequests:\n    - audience: {AUDIENCE}\n    serviceAccountTokenInSecrets: {in_secrets}\n"
            ),
        )
    };
    testkit::apply_ok(&cluster, "driver", &with_tokens(true)).await;
    testkit::wait_running(&cluster, NS, NAME, "v0.1.0", 1, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let csidrivers: Api<CSIDriver> = Api::all(client.clone());
    let stored = |d: CSIDriver| d.spec.service_account_token_in_secrets;
    assert_eq!(
        stored(
            csidrivers
                .get(walkthrough::DRIVER)
                .await
                .expect("CSIDriver")
        ),
        Some(true),
        "the API server stored the field"
    );

    // In secrets: stripped from the log, and not in the volume context.
    let app = App {
        name: "tokens",
        image: &image,
        text: "token-test",
        access_mode: "ReadWriteOnce",
        usage: Use::Filesystem,
        fs_group: None,
    };
    let line = mount(&cluster, &app, app.name, true).await;
    assert!(
        line.contains("\"secrets\":\"***stripped***\"") && !line.contains(TOKENS_KEY),
        "with serviceAccountTokenInSecrets the tokens come in secrets only: {line}"
    );

    // Switched off on the live object: the next mount has them in the
    // volume context, and no secrets.
    testkit::apply_ok(&cluster, "driver", &with_tokens(false)).await;
    wait_for(DEADLINE, Duration::from_millis(500), || async {
        let d = csidrivers.get(walkthrough::DRIVER).await.ok()?;
        (stored(d) == Some(false)).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("the CSIDriver never said false"));
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    pods.delete(app.name, &DeleteParams::default())
        .await
        .expect("delete the pod");
    wait_for(DEADLINE, Duration::from_millis(500), || async {
        pods.get_opt(app.name)
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await
    .unwrap_or_else(|_| panic!("the pod never went"));
    let line = mount(&cluster, &app, "tokens-again", false).await;
    assert!(
        line.contains(TOKENS_KEY) && !line.contains("\"secrets\":"),
        "without it the tokens come in the volume context: {line}"
    );

    for (kind, name) in [("pod", "tokens-again"), ("pvc", app.name)] {
        cluster
            .kubectl_ok(["-n", NS, "delete", kind, name, "--timeout=120s"])
            .await
            .unwrap_or_else(|e| panic!("delete {kind}: {e}"));
    }
    testkit::wait_no_volumes(&cluster, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("the volume was not deleted: {e}"));
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "delete",
            "csidriverdeployment",
            NAME,
            "--timeout=120s",
        ])
        .await
        .unwrap_or_else(|e| panic!("teardown: {e}"));
    let left = cluster.stop_and_report().await.expect("cluster stops");
    assert!(left.is_empty(), "left on the host: {left:?}");
}
