//! Benchmark (not a test): idle memory of the node sidecars.
//!
//! Starts a one-node control plane, a CSI driver process, `csiops-sidecar
//! registrar` and `csiops-sidecar liveness-probe` as on a node, registers
//! through a plugin-watcher client, lets the liveness probe answer a few
//! probes, idles, and prints VmRSS / VmHWM of each sidecar as a Markdown
//! table. Build the sidecar with `--release` first for representative numbers
//! (`CSIOPS_SIDECAR_BIN` picks a specific binary).

use std::time::Duration;

use csiops_e2e::node_side::{kubelet_register, registration_socket, start_mock_driver};
use csiops_e2e::process::{memory_kib, ManagedProcess};
use csiops_e2e::{free_port, sidecar_bin, wait_for, Cluster, ClusterOptions};

fn probe(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    if write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut out = String::new();
    s.read_to_string(&mut out).is_ok() && out.starts_with("HTTP/1.1 200")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sidecar = sidecar_bin()?;
    let cluster = Cluster::start(ClusterOptions::kwok(1)).await?;
    let dir = cluster.work_dir().join("bench");
    let registry = dir.join("reg");
    std::fs::create_dir_all(&registry)?;
    let socket = dir.join("csi.sock");
    let driver = "bench.csi.csiops.dev";
    let _driver = start_mock_driver(
        cluster.bin_dir(),
        &socket,
        driver,
        "kwok-node-0",
        &dir.join("driver.log"),
    )?;

    let registrar_args = vec![
        "registrar".to_string(),
        format!("--csi-address={}", socket.display()),
        "--kubelet-registration-path=/var/lib/kubelet/plugins/bench/csi.sock".into(),
        format!("--plugin-registration-path={}", registry.display()),
        "--node-name=kwok-node-0".into(),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--http-endpoint=127.0.0.1:{}", free_port()?),
    ];
    let registrar = ManagedProcess::spawn(
        "registrar",
        &sidecar,
        &registrar_args,
        &dir.join("registrar.log"),
    )?;
    let live_port = free_port()?;
    let live_args = vec![
        "liveness-probe".to_string(),
        format!("--csi-address={}", socket.display()),
        format!("--http-endpoint=127.0.0.1:{live_port}"),
    ];
    let liveness = ManagedProcess::spawn(
        "liveness-probe",
        &sidecar,
        &live_args,
        &dir.join("liveness.log"),
    )?;

    let reg_socket = registration_socket(&registry, driver);
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            if !reg_socket.exists() {
                return None;
            }
            kubelet_register(&reg_socket, Ok(())).await.ok()
        },
    )
    .await?;
    let probes =
        tokio::task::spawn_blocking(move || (0..20).filter(|_| probe(live_port)).count()).await?;
    // Idle: the registrar re-checks NodeGetInfo every 10s and holds two watches.
    tokio::time::sleep(Duration::from_secs(15)).await;

    println!("sidecar binary: {}", sidecar.display());
    println!("liveness probes answered 200: {probes}/20\n");
    println!("| process | VmRSS idle (MiB) | VmHWM peak (MiB) |");
    println!("|---|---|---|");
    for (name, pid) in [
        ("csiops-sidecar registrar", registrar.pid()),
        ("csiops-sidecar liveness-probe", liveness.pid()),
    ] {
        let (rss, hwm) = memory_kib(pid).ok_or("process gone")?;
        println!(
            "| {name} | {:.1} | {:.1} |",
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0
        );
    }
    drop(registrar);
    drop(liveness);
    cluster.stop().await?;
    Ok(())
}
