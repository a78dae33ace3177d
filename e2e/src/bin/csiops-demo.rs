//! `make demo`: a local control plane with three kwok nodes and one real
//! node (containerd, kubelet, kube-proxy); `manifests/install.yaml` runs the
//! operator in containers on the real node; a CSIDriverDeployment of
//! csi-test-driver puts its node pods on every node (real containers on the
//! real node, simulated ones on kwok's); then `kubectl get
//! csidriverdeployments -o wide` and the pods with their container IDs.
//! Last, the CSI design's walkthrough: a pod on the real node writes to a
//! volume that csiops provisioned, attached and mounted; `kubectl exec`
//! shows the file, then `kubectl get pvc,pv,volumeattachments`.
//!
//! In a terminal the cluster stays up until Ctrl-C so you can look around
//! (the KUBECONFIG is printed); without one (CI, pipes) it tears down at once.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use csiops_e2e::realnode::images;
use csiops_e2e::testkit;
use csiops_e2e::walkthrough::{self, App, Use, VolumeDriver, APP_FILE, DRIVER, NAME, NS};
use csiops_e2e::{Cluster, ClusterOptions};

const KWOK_NODES: usize = 3;

#[tokio::main]
async fn main() -> ExitCode {
    match demo().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    eprintln!("==> starting a local control plane (etcd, kube-apiserver, controller-manager, scheduler), {KWOK_NODES} kwok nodes and one real node (containerd, kubelet, kube-proxy)");
    let cluster = Cluster::start(ClusterOptions {
        nodes: KWOK_NODES,
        real_node: true,
        ..Default::default()
    })
    .await?;
    eprintln!("    up in {:.1}s", cluster.startup_time().as_secs_f64());
    let node = cluster.real_node().ok_or("the cluster has no real node")?;
    print!(
        "{}",
        cluster.kubectl_ok(["get", "nodes", "-o", "wide"]).await?
    );

    eprintln!("\n==> kubectl apply --server-side -f manifests/install.yaml");
    walkthrough::install_operator(&cluster).await?;
    print!(
        "{}",
        cluster
            .kubectl_ok(["-n", "csiops-system", "get", "pods", "-o", "wide"])
            .await?
    );

    // kwok pods run nothing: each kwok node whose node pod is Ready gets a
    // real CSI driver process and the csiops registrar, registered like
    // kubelet would. The real node's pod is registered by the real kubelet.
    let _kwok_nodes = testkit::node_side(&cluster, NS, NAME, DRIVER)?;
    let image = node.images().reference(images::TEST_DRIVER)?;
    let data_dir = node.layout().root.join("csi-data");
    let cr = VolumeDriver {
        image,
        version: "v0.1.0",
        kubelet_dir: &node.layout().kubelet_dir(),
        data_dir: &data_dir,
        on_simulated_nodes: true,
        controller_args: &[],
        node_args: &[],
        node_fields: &[],
    };
    eprintln!(
        "\n==> kubectl apply -f - (a CSIDriverDeployment of csi-test-driver)\n{}",
        cr.yaml()
    );
    let out = testkit::apply_yaml(&cluster, "demo-driver", &cr.yaml()).await?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }

    the_driver_runs_on_every_node(&cluster).await?;
    the_app_reads_its_file_from_a_csiops_volume(&cluster, image, &cr).await?;
    eprintln!("\n(done in {:.1}s)", started.elapsed().as_secs_f64());

    stay_up_until_ctrl_c_in_a_terminal(&cluster).await?;
    // Give the volume back through the driver (unpublish, unstage, detach,
    // DeleteVolume) while it still runs, rather than leave it to teardown.
    eprintln!("==> kubectl -n {NS} delete pod,pvc app");
    cluster
        .kubectl_ok(["-n", NS, "delete", "pod,pvc", "app", "--timeout=120s"])
        .await?;
    cluster.stop().await?;
    Ok(())
}

/// Waits until the driver is Running and registered on every node (the
/// operator's log if not), then shows the object and its pods.
async fn the_driver_runs_on_every_node(
    cluster: &Cluster,
) -> Result<(), Box<dyn std::error::Error>> {
    eprintln!("==> waiting until the driver is Running and registered on every node");
    let nodes = KWOK_NODES + 1;
    if let Err(e) =
        testkit::wait_running(cluster, NS, NAME, "v0.1.0", nodes, Duration::from_secs(180)).await
    {
        let logs = cluster
            .kubectl([
                "-n",
                "csiops-system",
                "logs",
                "deployment/csiops-operator",
                "--tail=30",
            ])
            .await?;
        eprintln!("operator log:\n{}", String::from_utf8_lossy(&logs.stdout));
        return Err(e.into());
    }

    eprintln!("==> kubectl get csidriverdeployments -A -o wide");
    print!(
        "{}",
        cluster
            .kubectl_ok(["get", "csidriverdeployments", "-A", "-o", "wide"])
            .await?
    );
    eprintln!("\n==> kubectl -n {NS} get pods (container IDs: real containers in containerd; kwok's pods have none)");
    print!(
        "{}",
        cluster
            .kubectl_ok([
                "-n",
                NS,
                "get",
                "pods",
                "-o",
                "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,STATUS:.status.phase,CONTAINER-IDS:.status.containerStatuses[*].containerID",
            ])
            .await?
    );
    Ok(())
}

/// A claim and a pod on the real node: the pod reads the file it wrote to
/// the volume csiops provisioned, attached and mounted; then the claim, PV
/// and VolumeAttachment.
async fn the_app_reads_its_file_from_a_csiops_volume(
    cluster: &Cluster,
    image: &str,
    cr: &VolumeDriver<'_>,
) -> Result<(), Box<dyn std::error::Error>> {
    let app = App {
        name: "app",
        image,
        text: "hello from a volume csiops provisioned, attached and mounted",
        access_mode: "ReadWriteOnce",
        usage: Use::Filesystem,
        fs_group: None,
    };
    eprintln!(
        "\n==> kubectl apply -f - (a claim of StorageClass {} and a pod on the real node)\n{}",
        walkthrough::STORAGE_CLASS,
        app.yaml()
    );
    let out = testkit::apply_yaml(cluster, "demo-app", &app.yaml()).await?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    walkthrough::wait_pod_running(cluster, app.name, Duration::from_secs(180)).await?;
    let file = format!("/data/{APP_FILE}");
    eprintln!("==> kubectl -n {NS} exec app -- /csi-test-driver cat {file}");
    println!(
        "{}",
        cluster
            .kubectl_ok([
                "-n",
                NS,
                "exec",
                "app",
                "--",
                "/csi-test-driver",
                "cat",
                &file
            ])
            .await?
    );
    eprintln!("\n==> kubectl get pvc,pv,volumeattachments");
    print!(
        "{}",
        cluster
            .kubectl_ok(["-n", NS, "get", "pvc,pv,volumeattachments", "-o", "wide"])
            .await?
    );
    eprintln!(
        "(on the host, the file is in the driver's data dir: {})",
        cr.volumes_dir().display()
    );
    Ok(())
}

/// In a terminal (and not in CI), the cluster stays up until Ctrl-C.
async fn stay_up_until_ctrl_c_in_a_terminal(
    cluster: &Cluster,
) -> Result<(), Box<dyn std::error::Error>> {
    if std::io::stdin().is_terminal() && std::env::var_os("CI").is_none() {
        eprintln!("\nThe cluster stays up until Ctrl-C. Try:");
        eprintln!(
            "  export KUBECONFIG={}",
            cluster.kubeconfig_path().display()
        );
        eprintln!("  kubectl -n {NS} describe csidd {NAME}");
        eprintln!("  kubectl -n csiops-system logs deployment/csiops-operator");
        eprintln!("  kubectl get csidd -A -w");
        tokio::signal::ctrl_c().await?;
        eprintln!("\n==> stopping");
    }
    Ok(())
}
