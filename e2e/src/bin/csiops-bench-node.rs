//! Benchmark (not a test): idle memory of the node sidecars.
//!
//! Starts a one-node control plane, a CSI driver process, `csiops-sidecar
//! registrar` and `csiops-sidecar liveness-probe` as on a node, registers
//! through a plugin-watcher client, waits for the registrar's CSINode entry,
//! lets the liveness probe answer a few probes, idles, and prints VmRSS (file
//! and anonymous) and VmHWM of each sidecar as a Markdown table.
//!
//! As they run in their image: `CSIOPS_SIDECAR_BIN` should be the image's
//! `csiops-sidecar` (`$(e2e/images/build.sh)/sidecar-bin/csiops-sidecar`),
//! which hands the node roles to the `csiops-node-sidecar` beside it; and
//! the registrar gets the in-cluster configuration of a pod (ServiceAccount
//! files at their path in a mount namespace of its own, the API server from
//! `KUBERNETES_SERVICE_HOST`/`_PORT`), not a kubeconfig. Needs root
//! (`unshare --mount`).
//!
//! `--upstream-registrar PATH` and `--upstream-livenessprobe PATH` run
//! upstream's node-driver-registrar and livenessprobe (binaries you built
//! from their repositories) beside ours in the same run, against the same
//! driver, and add their rows to the table.

use std::path::Path;
use std::time::Duration;

use csiops_e2e::node_side::{register_when_ready, registration_socket, start_mock_driver};
use csiops_e2e::process::{memory_detail_kib, ManagedProcess};
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

/// How many of 20 liveness probes on `port` answer 200.
async fn probe_20(port: u16) -> Result<usize, tokio::task::JoinError> {
    tokio::task::spawn_blocking(move || (0..20).filter(|_| probe(port)).count()).await
}

/// Where a pod finds its ServiceAccount: the in-cluster configuration.
const SERVICE_ACCOUNT_DIR: &str = "/run/secrets/kubernetes.io/serviceaccount";

/// The registrar's in-cluster configuration, as a pod has it: the API
/// server's address and a token with the CA in `dir` (the admin token and
/// CA of the test cluster's kubeconfig). Returns the environment.
fn service_account(
    kubeconfig: &std::path::Path,
    api_url: &str,
    dir: &std::path::Path,
) -> Result<Vec<(&'static str, String)>, Box<dyn std::error::Error>> {
    let port = api_url
        .rsplit_once(':')
        .map(|(_, p)| p.to_string())
        .ok_or("no port in the API server's URL")?;
    let config: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(kubeconfig)?)?;
    let token = config["users"][0]["user"]["token"]
        .as_str()
        .ok_or("the kubeconfig has no user token")?;
    let ca = config["clusters"][0]["cluster"]["certificate-authority"]
        .as_str()
        .ok_or("the kubeconfig has no certificate-authority path")?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("token"), token)?;
    std::fs::copy(ca, dir.join("ca.crt"))?;
    std::fs::write(dir.join("namespace"), "default")?;
    Ok(vec![
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
        ("KUBERNETES_SERVICE_PORT", port),
        ("SA", dir.display().to_string()),
    ])
}

/// Runs `bin args` with the ServiceAccount files of `$SA` (see
/// [`service_account`]) at the path a pod has them, in a mount namespace of
/// its own (`unshare`: a tmpfs over /run that only this process sees; needs
/// root). `exec` all the way, so the process's pid is the sidecar's.
fn in_pod_command(bin: &std::path::Path, args: &[String]) -> (std::path::PathBuf, Vec<String>) {
    let script = format!(
        "mount -t tmpfs tmpfs /run && mkdir -p {SERVICE_ACCOUNT_DIR} && \
         cp \"$SA\"/* {SERVICE_ACCOUNT_DIR}/ && exec \"$@\""
    );
    let mut all = vec![
        "--mount".to_string(),
        "--propagation=private".into(),
        "--".into(),
        "/bin/sh".into(),
        "-c".into(),
        script,
        "sh".into(),
        bin.display().to_string(),
    ];
    all.extend(args.iter().cloned());
    ("unshare".into(), all)
}

/// `--upstream-registrar PATH` / `--upstream-livenessprobe PATH` (also `=PATH`).
#[derive(Debug, Default)]
struct Upstream {
    registrar: Option<std::path::PathBuf>,
    livenessprobe: Option<std::path::PathBuf>,
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Upstream, String> {
    let mut up = Upstream::default();
    let mut args = args;
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let slot = match flag.as_str() {
            "--upstream-registrar" => &mut up.registrar,
            "--upstream-livenessprobe" => &mut up.livenessprobe,
            _ => return Err(format!("unknown argument {a:?}; see the module docs")),
        };
        let value = inline
            .or_else(|| args.next())
            .ok_or_else(|| format!("{flag} needs a path"))?;
        let path = std::path::PathBuf::from(value);
        if !path.is_file() {
            return Err(format!("{flag}: {} is not a file", path.display()));
        }
        *slot = Some(path);
    }
    Ok(up)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let upstream = parse_args(std::env::args().skip(1))?;
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

    let registrar = start_registrar_as_in_its_pod(&cluster, &sidecar, &socket, &registry, &dir)?;
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

    let (up_registrar, up_liveness, up_probes) =
        start_upstreams_and_register(&upstream, &socket, &dir, driver).await?;

    our_registrar_lists_the_driver_in_csinode(&cluster, &registry, driver).await?;
    let probes = probe_20(live_port).await?;
    // Idle: the registrar re-checks NodeGetInfo every 10s and holds two watches.
    tokio::time::sleep(Duration::from_secs(15)).await;

    print_table(
        &sidecar,
        probes,
        up_probes,
        &registrar,
        &liveness,
        &up_registrar,
        &up_liveness,
    )?;
    drop(registrar);
    drop(liveness);
    drop(up_registrar);
    drop(up_liveness);
    cluster.stop().await?;
    Ok(())
}

/// Our registrar, in-cluster and with the ServiceAccount files where a pod
/// has them.
fn start_registrar_as_in_its_pod(
    cluster: &Cluster,
    sidecar: &Path,
    socket: &Path,
    registry: &Path,
    dir: &Path,
) -> Result<ManagedProcess, Box<dyn std::error::Error>> {
    let registrar_args = vec![
        "registrar".to_string(),
        format!("--csi-address={}", socket.display()),
        "--kubelet-registration-path=/var/lib/kubelet/plugins/bench/csi.sock".into(),
        format!("--plugin-registration-path={}", registry.display()),
        "--node-name=kwok-node-0".into(),
        format!("--http-endpoint=127.0.0.1:{}", free_port()?),
    ];
    // In-cluster, as in its pod: a kubeconfig would have it parse YAML,
    // which a pod never does.
    let env = service_account(
        cluster.kubeconfig_path(),
        &cluster.api_url(),
        &dir.join("serviceaccount"),
    )?;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (program, args) = in_pod_command(sidecar, &registrar_args);
    let registrar = ManagedProcess::spawn_with_env(
        "registrar",
        &program,
        &args,
        &env,
        &dir.join("registrar.log"),
    )?;
    Ok(registrar)
}

/// Upstream's registrar and liveness probe when asked for, registered and
/// probed; returns them and how many of 20 probes upstream's answered.
async fn start_upstreams_and_register(
    upstream: &Upstream,
    socket: &Path,
    dir: &Path,
    driver: &str,
) -> Result<(Option<ManagedProcess>, Option<ManagedProcess>, usize), Box<dyn std::error::Error>> {
    // Upstream's, with the same flags (its own registration dir: both
    // register the same driver name).
    let up_registry = dir.join("reg-upstream");
    std::fs::create_dir_all(&up_registry)?;
    let up_registrar = match &upstream.registrar {
        Some(bin) => Some(ManagedProcess::spawn(
            "upstream-registrar",
            bin,
            &[
                format!("--csi-address={}", socket.display()),
                "--kubelet-registration-path=/var/lib/kubelet/plugins/bench/csi.sock".into(),
                format!("--plugin-registration-path={}", up_registry.display()),
                format!("--http-endpoint=127.0.0.1:{}", free_port()?),
            ],
            &dir.join("upstream-registrar.log"),
        )?),
        None => None,
    };
    let up_live_port = free_port()?;
    let up_liveness = match &upstream.livenessprobe {
        Some(bin) => Some(ManagedProcess::spawn(
            "upstream-livenessprobe",
            bin,
            &[
                format!("--csi-address={}", socket.display()),
                format!("--http-endpoint=127.0.0.1:{up_live_port}"),
            ],
            &dir.join("upstream-livenessprobe.log"),
        )?),
        None => None,
    };
    if up_registrar.is_some() {
        let s = registration_socket(&up_registry, driver);
        register_when_ready(&s).await?;
    }
    let up_probes = if up_liveness.is_some() {
        probe_20(up_live_port).await?
    } else {
        0
    };
    Ok((up_registrar, up_liveness, up_probes))
}

/// Registers our registrar and waits until it has listed the driver in the
/// node's CSINode itself.
async fn our_registrar_lists_the_driver_in_csinode(
    cluster: &Cluster,
    registry: &Path,
    driver: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let reg_socket = registration_socket(registry, driver);
    register_when_ready(&reg_socket).await?;
    // Our registrar keeps the CSINode entry itself (through its in-cluster
    // client): measure it after it has done so.
    let csinodes: kube::Api<k8s_openapi::api::storage::v1::CSINode> =
        kube::Api::all(cluster.client()?);
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let c = csinodes.get_opt("kwok-node-0").await.ok()??;
            c.spec
                .drivers
                .iter()
                .any(|d| d.name == driver)
                .then_some(())
        },
    )
    .await
    .map_err(|_| "the registrar never listed the driver in CSINode kwok-node-0")?;
    Ok(())
}

/// The probes answered and the memory table of every sidecar, on stdout.
fn print_table(
    sidecar: &Path,
    probes: usize,
    up_probes: usize,
    registrar: &ManagedProcess,
    liveness: &ManagedProcess,
    up_registrar: &Option<ManagedProcess>,
    up_liveness: &Option<ManagedProcess>,
) -> Result<(), Box<dyn std::error::Error>> {
    println!("sidecar binary: {}", sidecar.display());
    println!("liveness probes answered 200: {probes}/20");
    if up_liveness.is_some() {
        println!("upstream livenessprobe answered 200: {up_probes}/20");
    }
    println!(
        "\n| process | VmRSS idle (MiB) | of it file-backed (RssFile) | anonymous (RssAnon) | VmHWM peak (MiB) |"
    );
    println!("|---|---|---|---|---|");
    let mut rows = vec![
        ("csiops-sidecar registrar", registrar.pid()),
        ("csiops-sidecar liveness-probe", liveness.pid()),
    ];
    if let Some(p) = up_registrar {
        rows.push(("upstream node-driver-registrar", p.pid()));
    }
    if let Some(p) = up_liveness {
        rows.push(("upstream livenessprobe", p.pid()));
    }
    for (name, pid) in rows {
        let m = memory_detail_kib(pid).ok_or("process gone")?;
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} |",
            mib(m.rss),
            mib(m.file),
            mib(m.anon),
            mib(m.hwm)
        );
    }
    Ok(())
}
