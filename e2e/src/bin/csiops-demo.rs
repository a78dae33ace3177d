//! `make demo`: a local control plane, the operator, the hostpath example, and
//! `kubectl get csidriverdeployments -o wide`.
//!
//! In a terminal the cluster stays up until Ctrl-C so you can look around
//! (the KUBECONFIG is printed); without one (CI, pipes) it tears down at once.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use csiops_e2e::testkit;
use csiops_e2e::{operator_bin, Cluster, ClusterOptions};

const NS: &str = "csi-hostpath";

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
    eprintln!("==> starting a local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok with 3 nodes)");
    let cluster = Cluster::start(ClusterOptions { nodes: 3 }).await?;
    eprintln!("    up in {:.1}s", cluster.startup_time().as_secs_f64());

    eprintln!("==> installing the CSIDriverDeployment CRD");
    testkit::install_crd(&cluster).await?;

    eprintln!("==> starting csiops-operator (out of cluster, from the kubeconfig)");
    let operator = cluster.run_operator(&operator_bin()?)?;
    // kwok pods run nothing: each node whose node pod is Ready gets a real CSI
    // driver process and the csiops registrar, registered like kubelet would.
    let _nodes = testkit::node_side(&cluster, NS, "hostpath", "hostpath.csi.k8s.io")?;

    let example = testkit::example_path();
    eprintln!("==> kubectl apply -f {}", example.display());
    print!(
        "{}",
        cluster
            .kubectl_ok(["apply", "-f", &example.to_string_lossy()])
            .await?
    );

    eprintln!("==> waiting until the driver is Running on every node");
    if let Err(e) = testkit::wait_running(
        &cluster,
        NS,
        "hostpath",
        "v1.17.0",
        3,
        Duration::from_secs(120),
    )
    .await
    {
        eprintln!("operator log:\n{}", operator.log_tail(30));
        return Err(e.into());
    }

    eprintln!("==> kubectl get csidriverdeployments -A -o wide");
    print!(
        "{}",
        cluster
            .kubectl_ok(["get", "csidriverdeployments", "-A", "-o", "wide"])
            .await?
    );
    eprintln!();
    eprintln!("==> kubectl -n {NS} get statefulsets,daemonsets,pods");
    print!(
        "{}",
        cluster
            .kubectl_ok([
                "-n",
                NS,
                "get",
                "statefulsets,daemonsets,pods",
                "-o",
                "wide"
            ])
            .await?
    );
    eprintln!("\n(done in {:.1}s)", started.elapsed().as_secs_f64());

    if std::io::stdin().is_terminal() && std::env::var_os("CI").is_none() {
        eprintln!("\nThe cluster stays up until Ctrl-C. Try:");
        eprintln!(
            "  export KUBECONFIG={}",
            cluster.kubeconfig_path().display()
        );
        eprintln!("  kubectl -n {NS} describe csidd hostpath");
        eprintln!("  kubectl -n {NS} patch csidd hostpath --type=merge -p '{{\"spec\":{{\"version\":\"v1.18.0\"}}}}'");
        eprintln!("  kubectl get csidd -A -w");
        tokio::signal::ctrl_c().await?;
        eprintln!("\n==> stopping");
    }
    operator.stop().await;
    cluster.stop().await?;
    Ok(())
}
