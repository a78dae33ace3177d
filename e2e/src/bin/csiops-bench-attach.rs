//! Benchmark (not a test): attach and detach throughput and memory of
//! `csiops-sidecar attacher` side by side with upstream's csi-attacher.
//!
//! For each attacher, on one local control plane: a fresh `csi-test-driver
//! --enable-attach` (its own driver name), N volumes and PVs, the CSINode
//! entry; the attacher is started and given a moment to sync its caches;
//! then N VolumeAttachments are created at once and the clock runs until all
//! are attached; then all are deleted and the clock runs until all are gone
//! (unpublished and finalizer removed). Reported: both durations, the API
//! writes the attacher made per attachment (from kube-apiserver's own
//! `apiserver_request_total`), and VmHWM/VmRSS of the attacher process.
//! Both run with the same `--kube-api-qps`, `--kube-api-burst`,
//! `--worker-threads` and `--timeout`.
//!
//! ```text
//! csiops-bench-attach [--vas N] [--qps Q] [--burst B] [--workers W] [--upstream PATH]
//!                     [--ours NAME=PATH]...
//! ```
//! `--ours NAME=PATH` (repeatable) runs those builds of our sidecar, in
//! order, in place of the one `CSIOPS_SIDECAR_BIN` names.
//! `--upstream` (or `CSIOPS_EXTERNAL_ATTACHER`): the csi-attacher binary, as
//! `e2e/cluster-bins/external-attacher.sh` prints it; without it only ours runs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use csiops_e2e::apimetrics;
use csiops_e2e::attach;
use csiops_e2e::bench::sidecar::{our_sides, parse_named_build, Side};
use csiops_e2e::process::ManagedProcess;
use csiops_e2e::testdriver::{test_driver_bin, TestDriverProcess};
use csiops_e2e::{free_port, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const NODE: &str = "kwok-node-0";
const NODE_ID: &str = "bench-node-0";

#[derive(Parser)]
struct Args {
    /// VolumeAttachments per run.
    #[arg(long, default_value_t = 300)]
    vas: usize,
    #[arg(long, default_value_t = 5.0)]
    qps: f64,
    #[arg(long, default_value_t = 10)]
    burst: u32,
    #[arg(long, default_value_t = 10)]
    workers: usize,
    /// A build of our sidecar as NAME=PATH, run in the order given
    /// (default: `csiops`, `CSIOPS_SIDECAR_BIN`).
    #[arg(long = "ours", value_parser = parse_named_build)]
    ours: Vec<(String, PathBuf)>,
    /// Upstream csi-attacher binary.
    #[arg(long, env = "CSIOPS_EXTERNAL_ATTACHER")]
    upstream: Option<PathBuf>,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 600)]
    phase_timeout: u64,
}

struct Outcome {
    name: String,
    attach: Duration,
    detach: Duration,
    writes_attach: f64,
    writes_detach: f64,
    hwm_kib: u64,
    rss_kib: u64,
}

/// Writes the attacher makes: PATCH/PUT of VolumeAttachments and PVs (incl.
/// status), and Events.
async fn attacher_writes(client: &kube::Client) -> Result<f64, Box<dyn std::error::Error>> {
    Ok(apimetrics::requests(
        client,
        &[
            ("volumeattachments", "PATCH"),
            ("volumeattachments", "PUT"),
            ("persistentvolumes", "PATCH"),
            ("persistentvolumes", "PUT"),
            ("events", "POST"),
            ("events", "PATCH"),
        ],
    )
    .await?)
}

async fn count_attached(
    vas: &Api<VolumeAttachment>,
    driver: &str,
) -> Result<(usize, usize), kube::Error> {
    let list = vas.list(&ListParams::default()).await?;
    let ours: Vec<_> = list
        .items
        .iter()
        .filter(|v| v.spec.attacher == driver)
        .collect();
    let attached = ours
        .iter()
        .filter(|v| v.status.as_ref().is_some_and(|s| s.attached))
        .count();
    Ok((ours.len(), attached))
}

async fn run_one(
    cluster: &Cluster,
    args: &Args,
    name: &str,
    bin: &Path,
    upstream: bool,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let client = cluster.client()?;
    let driver_name = format!("{name}.bench.csiops.dev");
    let dir = cluster.work_dir().join(name);
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("csi.sock");
    let driver = TestDriverProcess::start(
        &test_driver_bin()?,
        &socket,
        &dir.join("state"),
        &[
            "--enable-attach",
            "--capacity=100Ti",
            &format!("--drivername={driver_name}"),
            &format!("--nodeid={NODE_ID}"),
        ],
        &dir.join("driver.log"),
    )
    .await?;
    attach::register_driver(&client, NODE, &driver_name, NODE_ID, &[]).await?;
    let csi = driver.client().await?;
    let ids = attach::create_volumes(&csi, name, args.vas).await?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pp = PostParams::default();
    for (i, id) in ids.iter().enumerate() {
        pvs.create(
            &pp,
            &attach::pv(&format!("{name}-pv-{i}"), &driver_name, id),
        )
        .await?;
    }

    let port = free_port()?;
    let common = [
        format!("--csi-address={}", socket.display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--kube-api-qps={}", args.qps),
        format!("--kube-api-burst={}", args.burst),
        format!("--worker-threads={}", args.workers),
        "--timeout=15s".to_string(),
        format!("--http-endpoint=127.0.0.1:{port}"),
        "--v=1".to_string(),
    ];
    let mut argv: Vec<String> = if upstream {
        vec![]
    } else {
        vec!["attacher".to_string()]
    };
    argv.extend(common);
    let proc = ManagedProcess::spawn(name, bin, &argv, &dir.join("attacher.log"))?;
    // Caches synced and idle: both list four kinds of objects at start.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let deadline = Duration::from_secs(args.phase_timeout);
    let writes0 = attacher_writes(&client).await?;
    let t0 = Instant::now();
    for i in 0..args.vas {
        vas.create(
            &pp,
            &attach::va(
                &format!("{name}-va-{i}"),
                &driver_name,
                &format!("{name}-pv-{i}"),
                NODE,
            ),
        )
        .await?;
    }
    loop {
        let (_, attached) = count_attached(&vas, &driver_name).await?;
        if attached == args.vas {
            break;
        }
        if t0.elapsed() > deadline {
            return Err(format!(
                "{name}: {attached}/{} attached after {deadline:?}\n{}",
                args.vas,
                proc.log_tail(20)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let attach_time = t0.elapsed();
    let writes1 = attacher_writes(&client).await?;

    let t1 = Instant::now();
    for i in 0..args.vas {
        vas.delete(&format!("{name}-va-{i}"), &DeleteParams::default())
            .await?;
    }
    loop {
        let (left, _) = count_attached(&vas, &driver_name).await?;
        if left == 0 {
            break;
        }
        if t1.elapsed() > deadline {
            return Err(format!(
                "{name}: {left} VolumeAttachments left after {deadline:?}\n{}",
                proc.log_tail(20)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let detach_time = t1.elapsed();
    let writes2 = attacher_writes(&client).await?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", proc.pid()))?;
    let field = |k: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let published: usize = driver
        .state()?
        .volumes
        .values()
        .map(|v| v.published_nodes.len())
        .sum();
    if published != 0 {
        return Err(format!("{name}: {published} publications left in the driver").into());
    }
    drop(proc);
    Ok(Outcome {
        name: name.to_string(),
        attach: attach_time,
        detach: detach_time,
        writes_attach: (writes1 - writes0) / args.vas as f64,
        writes_detach: (writes2 - writes1) / args.vas as f64,
        hwm_kib: field("VmHWM:"),
        rss_kib: field("VmRSS:"),
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let mut runs = our_sides(&args.ours)?;
    let cluster = Cluster::start(ClusterOptions::kwok(1)).await?;
    if let Some(up) = &args.upstream {
        runs.push(Side::upstream(up.clone()));
    }
    let mut out = Vec::new();
    for side in &runs {
        eprintln!("running {} ({})", side.name, side.bin.display());
        out.push(run_one(&cluster, &args, &side.name, &side.bin, side.upstream).await?);
    }
    println!(
        "{} VolumeAttachments, --kube-api-qps={} --kube-api-burst={} --worker-threads={}\n",
        args.vas, args.qps, args.burst, args.workers
    );
    println!("| attacher | attach all (s) | attaches/s | detach all (s) | detaches/s | API writes per attach | per detach | VmHWM (MiB) | VmRSS end (MiB) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for o in &out {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} |",
            o.name,
            o.attach.as_secs_f64(),
            args.vas as f64 / o.attach.as_secs_f64(),
            o.detach.as_secs_f64(),
            args.vas as f64 / o.detach.as_secs_f64(),
            o.writes_attach,
            o.writes_detach,
            o.hwm_kib as f64 / 1024.0,
            o.rss_kib as f64 / 1024.0,
        );
    }
    cluster.stop().await?;
    Ok(())
}
