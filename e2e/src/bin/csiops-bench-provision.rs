//! Benchmark (not a test): `csiops-sidecar provisioner` side by side with
//! upstream's csi-provisioner, on one local control plane, with the same
//! driver binary and the same flags.
//!
//! For each provisioner in turn: a fresh driver process (its own driver
//! name and state), the nodes' CSINode entries and topology labels as the
//! registrar leaves them, an Immediate StorageClass, the provisioner started
//! and given a moment to sync. Then N claims of 1Mi are created back to back
//! and the clock runs until all are Bound; then all are deleted at once and
//! the clock runs until no PV of that driver is left. Reported: both times,
//! their sum, API writes per claim lifecycle, CPU seconds and memory of the
//! provisioner process, and the volumes the driver still holds.
//!
//! API writes come from kube-apiserver's own `apiserver_request_total`
//! (POST/PUT/PATCH/DELETE of persistentvolumes, persistentvolumeclaims,
//! configmaps (our intent journal) and events), minus the bench's own N creates and one delete-collection. They
//! include kube-controller-manager's binding writes, which are the same for
//! both provisioners; the difference between two rows is the provisioners'.
//!
//! ```text
//! csiops-bench-provision [--claims N] [--qps Q] [--burst B] [--workers W] [--timeout 15s]
//!                        [--upstream-bin PATH] [--driver-bin PATH [--driver-arg ARG]...]
//!                        [--mock-driver] [--raw-pv-creates N] [--ours NAME=PATH]...
//! ```
//! `--ours NAME=PATH` (repeatable) runs those builds of our sidecar, in
//! order, in place of the one `CSIOPS_SIDECAR_BIN` names: a change and the
//! build before it, side by side on one control plane.
//! `--mock-driver` runs Kubernetes' in-memory `csi-mock-driver` (from the
//! test bed's bin dir) as the driver: the provisioners, not the driver,
//! are then the bottleneck. `--raw-pv-creates N` first measures the API
//! server's own PV create rate with N creates from a parallel, unthrottled
//! client, and prints the ratio of each provisioner's claims Bound per
//! second to it.
//! `--upstream-bin` (or `CSIOPS_UPSTREAM_PROVISIONER`): a csi-provisioner
//! binary the user built from upstream's repository; without it only ours
//! runs. `--driver-bin`: any CSI driver binary instead of csi-test-driver;
//! each `--driver-arg` may use `{endpoint}` (`unix:///…/csi.sock`), `{name}`
//! (the driver name the bench gives it), `{nodeid}` and `{dir}` (a scratch
//! directory of its own), and `--topology-key` names the topology key its
//! NodeGetInfo reports. Our provisioner is `CSIOPS_SIDECAR_BIN` (use a
//! release build).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use csiops_e2e::bench::sidecar::{our_sides, parse_named_build, Side};
use csiops_e2e::process::{memory_kib, ManagedProcess};
use csiops_e2e::testdriver::config::DEFAULT_TOPOLOGY_KEY;
use csiops_e2e::testdriver::{test_driver_bin, TestDriverProcess};
use csiops_e2e::{apimetrics, attach, free_port, Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

#[derive(Parser)]
struct Args {
    /// Claims per run.
    #[arg(long, default_value_t = 100)]
    claims: usize,
    #[arg(long, default_value_t = 5.0)]
    qps: f64,
    #[arg(long, default_value_t = 10)]
    burst: u32,
    #[arg(long, default_value_t = 100)]
    workers: usize,
    /// `--timeout` of both provisioners (a Go duration).
    #[arg(long, default_value = "15s")]
    timeout: String,
    /// A build of our sidecar as NAME=PATH, run in the order given
    /// (default: `csiops`, `CSIOPS_SIDECAR_BIN`).
    #[arg(long = "ours", value_parser = parse_named_build)]
    ours: Vec<(String, PathBuf)>,
    /// Upstream csi-provisioner binary.
    #[arg(long, env = "CSIOPS_UPSTREAM_PROVISIONER")]
    upstream_bin: Option<PathBuf>,
    /// A CSI driver binary to use instead of csi-test-driver.
    #[arg(long)]
    driver_bin: Option<PathBuf>,
    /// Arguments of `--driver-bin` (placeholders: {endpoint} {name} {nodeid} {dir}).
    #[arg(long = "driver-arg", allow_hyphen_values = true)]
    driver_args: Vec<String>,
    /// The topology key `--driver-bin` reports in NodeGetInfo.
    #[arg(long, default_value = DEFAULT_TOPOLOGY_KEY)]
    topology_key: String,
    /// Kubernetes' in-memory csi-mock-driver as the driver.
    #[arg(long, conflicts_with = "driver_bin")]
    mock_driver: bool,
    /// Measure the API server's raw PV create rate with this many creates.
    #[arg(long, default_value_t = 0)]
    raw_pv_creates: usize,
    /// Parallel requests of that measurement.
    #[arg(long, default_value_t = 32)]
    raw_concurrency: usize,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 1800)]
    phase_timeout: u64,
}

struct Outcome {
    name: String,
    created: Duration,
    bound: Duration,
    deleted: Duration,
    writes_per_claim: f64,
    /// The provisioner's own writes and requests per claim lifecycle, when
    /// its metrics count them.
    own_per_claim: Option<(f64, f64)>,
    cpu_seconds: f64,
    hwm_kib: u64,
    left: usize,
}

/// How many PVs of `driver` exist.
async fn driver_pvs(
    pvs: &Api<PersistentVolume>,
    driver: &str,
) -> Result<usize, Box<dyn std::error::Error>> {
    Ok(pvs
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .is_some_and(|c| c.driver == driver)
        })
        .count())
}

/// Writes to the kinds a provisioning touches, by anyone.
async fn writes(client: &kube::Client) -> Result<f64, Box<dyn std::error::Error>> {
    let mut kinds = Vec::new();
    for resource in [
        "persistentvolumes",
        "persistentvolumeclaims",
        "configmaps",
        "events",
    ] {
        for verb in ["POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION"] {
            kinds.push((resource, verb));
        }
    }
    Ok(apimetrics::requests(client, &kinds).await?)
}

/// A driver process: csi-test-driver, or `--driver-bin` with its arguments
/// (held to be stopped when dropped).
enum Driver {
    Test(TestDriverProcess),
    Other(#[allow(dead_code)] ManagedProcess),
}

impl Driver {
    async fn start(
        args: &Args,
        name: &str,
        dir: &Path,
        socket: &Path,
    ) -> Result<Driver, Box<dyn std::error::Error>> {
        let mock = args
            .mock_driver
            .then(|| csiops_e2e::bins::bin_dir().map(|d| d.join("csi-mock-driver")))
            .transpose()?;
        let mock_args = [
            "--endpoint={endpoint}".to_string(),
            "--drivername={name}".to_string(),
            "--nodeid={nodeid}".to_string(),
        ];
        let (bin, driver_args) = match (&mock, &args.driver_bin) {
            (Some(m), _) => (Some(m), &mock_args[..]),
            (None, Some(b)) => (Some(b), &args.driver_args[..]),
            (None, None) => (None, &args.driver_args[..]),
        };
        let Some(bin) = bin else {
            let d = TestDriverProcess::start(
                &test_driver_bin()?,
                socket,
                &dir.join("state"),
                &[
                    &format!("--drivername={name}"),
                    "--nodeid=controller",
                    "--capacity=100Ti",
                ],
                &dir.join("driver.log"),
            )
            .await?;
            return Ok(Driver::Test(d));
        };
        let scratch = dir.join("driver");
        std::fs::create_dir_all(&scratch)?;
        let argv: Vec<String> = driver_args
            .iter()
            .map(|a| {
                a.replace("{endpoint}", &format!("unix://{}", socket.display()))
                    .replace("{name}", name)
                    .replace("{nodeid}", "controller")
                    .replace("{dir}", &scratch.to_string_lossy())
            })
            .collect();
        let p = ManagedProcess::spawn("driver", bin, &argv, &dir.join("driver.log"))?;
        let t0 = Instant::now();
        while !socket.exists() {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(format!("{} made no socket in 30s", bin.display()).into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Driver::Other(p))
    }

    /// Volumes the driver still holds, when it can be told (csi-test-driver).
    fn volumes_left(&self) -> Option<usize> {
        match self {
            Driver::Test(d) => d.state().ok().map(|s| s.volumes.len()),
            Driver::Other(_) => None,
        }
    }
}

async fn run_one(
    cluster: &Cluster,
    args: &Args,
    who: &str,
    bin: &Path,
    upstream: bool,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let client = cluster.client()?;
    let driver_name = format!("{who}.bench.csiops.dev");
    let class = format!("bench-{who}");
    let dir = cluster.work_dir().join(who);
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("csi.sock");
    let driver = Driver::start(args, &driver_name, &dir, &socket).await?;

    register_nodes_and_class(cluster, &client, args, &driver_name, &class).await?;

    let port = free_port()?;
    let mut argv: Vec<String> = if upstream {
        vec![]
    } else {
        vec!["provisioner".to_string()]
    };
    argv.extend([
        format!("--csi-address=unix://{}", socket.display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--kube-api-qps={}", args.qps),
        format!("--kube-api-burst={}", args.burst),
        format!("--worker-threads={}", args.workers),
        format!("--timeout={}", args.timeout),
        format!("--http-endpoint=127.0.0.1:{port}"),
        "--v=1".to_string(),
    ]);
    let proc = ManagedProcess::spawn(who, bin, &argv, &dir.join("provisioner.log"))?;
    // Caches synced and idle.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let run = Run {
        args,
        who,
        pvcs: Api::namespaced(client.clone(), "default"),
        pvs: Api::all(client.clone()),
        driver_name: &driver_name,
        class: &class,
        proc: &proc,
        deadline: Duration::from_secs(args.phase_timeout),
    };
    let writes0 = writes(&client).await?;
    let own0 = apimetrics::scrape_own_requests(port)?;
    let cpu0 = csiops_e2e::process::cpu_seconds(proc.pid()).unwrap_or(0.0);
    let (created, bound) = create_until_bound(&run).await?;
    let deleted = delete_until_gone(&run).await?;
    // Late bookkeeping (finalizers, Events) is part of the lifecycle's cost.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes1 = writes(&client).await?;
    let own1 = apimetrics::scrape_own_requests(port)?;
    let cpu_seconds = csiops_e2e::process::cpu_seconds(proc.pid()).unwrap_or(0.0) - cpu0;
    let (_, hwm_kib) = memory_kib(proc.pid()).ok_or("provisioner gone")?;
    let left = driver.volumes_left().unwrap_or(usize::MAX);
    drop(proc);
    drop(driver);
    // The bench's own writes: N creates and N deletes.
    let n = args.claims as f64;
    Ok(Outcome {
        name: who.to_string(),
        created,
        bound,
        deleted,
        writes_per_claim: (writes1 - writes0 - 2.0 * n) / n,
        own_per_claim: own0
            .zip(own1)
            .map(|(a, b)| ((b.0 - a.0) / n, (b.1 - a.1) / n)),
        cpu_seconds,
        hwm_kib,
        left,
    })
}

/// The nodes as the registrar leaves them for this driver, and its class.
async fn register_nodes_and_class(
    cluster: &Cluster,
    client: &kube::Client,
    args: &Args,
    driver_name: &str,
    class: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    // The nodes as the registrar leaves them, for this driver.
    let nodes: Api<Node> = Api::all(client.clone());
    for node in cluster.node_names() {
        let labels =
            serde_json::json!({"metadata": {"labels": {args.topology_key.as_str(): node}}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&labels))
            .await?;
        attach::register_driver(client, node, driver_name, node, &[&args.topology_key]).await?;
    }
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &StorageClass {
                metadata: ObjectMeta {
                    name: Some(class.to_string()),
                    ..Default::default()
                },
                provisioner: driver_name.to_string(),
                reclaim_policy: Some("Delete".into()),
                volume_binding_mode: Some("Immediate".into()),
                ..Default::default()
            },
        )
        .await?;
    Ok(())
}

/// What the claims' phases of one run work on: the bench's arguments, whose
/// provisioner, the claims and PVs, the driver and class, the provisioner
/// (for its log) and the phase deadline.
struct Run<'a> {
    args: &'a Args,
    who: &'a str,
    pvcs: Api<PersistentVolumeClaim>,
    pvs: Api<PersistentVolume>,
    driver_name: &'a str,
    class: &'a str,
    proc: &'a ManagedProcess,
    deadline: Duration,
}

/// Creates the claims; returns when every PV existed and when every claim
/// was Bound, from the first create.
async fn create_until_bound(
    run: &Run<'_>,
) -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
    let Run {
        args,
        who,
        pvcs,
        pvs,
        driver_name,
        class,
        proc,
        deadline,
    } = run;
    let prefix = format!("{class}-");
    let t0 = Instant::now();
    for i in 0..args.claims {
        pvcs.create(
            &PostParams::default(),
            &csiops_e2e::bench::objects::claim(&format!("{class}-{i:04}"), "default", class),
        )
        .await?;
    }
    // When every PV exists (the provisioner's part), and when every claim
    // is Bound (kube-controller-manager's binding on top).
    let mut created: Option<Duration> = None;
    loop {
        if created.is_none() && driver_pvs(pvs, driver_name).await? == args.claims {
            created = Some(t0.elapsed());
        }
        let list = pvcs.list(&ListParams::default()).await?;
        let bound = list
            .items
            .iter()
            .filter(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound == args.claims {
            break;
        }
        if t0.elapsed() > *deadline {
            return Err(format!(
                "{who}: {bound}/{} Bound after {deadline:?}\n{}",
                args.claims,
                proc.log_tail(20)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let bound = t0.elapsed();
    let created = created.unwrap_or(bound);
    Ok((created, bound))
}

/// Deletes the claims; returns when the driver's last PV was gone.
async fn delete_until_gone(run: &Run<'_>) -> Result<Duration, Box<dyn std::error::Error>> {
    let Run {
        args,
        who,
        pvcs,
        pvs,
        driver_name,
        class,
        proc,
        deadline,
    } = run;
    let t1 = Instant::now();
    for i in 0..args.claims {
        pvcs.delete(&format!("{class}-{i:04}"), &DeleteParams::default())
            .await?;
    }
    loop {
        let left = driver_pvs(pvs, driver_name).await?;
        if left == 0 {
            break;
        }
        if t1.elapsed() > *deadline {
            return Err(format!(
                "{who}: {left} PVs left after {deadline:?}\n{}",
                proc.log_tail(20)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deleted = t1.elapsed();
    Ok(deleted)
}

/// PVs created per second by `concurrency` parallel unthrottled requests
/// (the PVs are deleted afterwards, outside the clock).
async fn raw_pv_rate(
    cluster: &Cluster,
    n: usize,
    concurrency: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let client = cluster.client()?;
    let pvs: Api<PersistentVolume> = Api::all(client);
    let pv = |i: usize| PersistentVolume {
        metadata: ObjectMeta {
            name: Some(format!("raw-{i:05}")),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Mi".into()))])),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            csi: Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: "raw.bench.csiops.dev".into(),
                volume_handle: format!("raw-{i:05}"),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let t0 = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let (pvs, pv) = (pvs.clone(), pv(i));
            async move { pvs.create(&PostParams::default(), &pv).await.map(drop) }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await?;
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    stream::iter(0..n)
        .map(|i| {
            let pvs = pvs.clone();
            async move {
                pvs.delete(&format!("raw-{i:05}"), &DeleteParams::default())
                    .await
                    .map(drop)
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await?;
    // Until kube-controller-manager has let the last of them go (it takes
    // pv-protection off each): its writes would otherwise land in the first
    // provisioner's run.
    let t1 = Instant::now();
    loop {
        let left = pvs
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("raw-"))
            })
            .count();
        if left == 0 {
            break;
        }
        if t1.elapsed() > Duration::from_secs(300) {
            return Err(format!("{left} raw PVs still there after 300s").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // And a moment for the controllers to settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(rate)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let cluster = Cluster::start(ClusterOptions::kwok(3)).await?;
    let raw = if args.raw_pv_creates > 0 {
        Some(raw_pv_rate(&cluster, args.raw_pv_creates, args.raw_concurrency).await?)
    } else {
        None
    };
    let mut sides = our_sides(&args.ours)?;
    sides.extend(args.upstream_bin.clone().map(Side::upstream));
    let mut runs = Vec::new();
    for side in &sides {
        runs.push(run_one(&cluster, &args, &side.name, &side.bin, side.upstream).await?);
    }
    cluster.stop().await?;

    let driver = if args.mock_driver {
        "csi-mock-driver".to_string()
    } else {
        args.driver_bin
            .as_deref()
            .and_then(Path::file_name)
            .map_or("csi-test-driver".into(), |n| {
                n.to_string_lossy().into_owned()
            })
    };
    println!(
        "{} claims, QPS {}/burst {}, --worker-threads={} --timeout={}, driver {driver}\n",
        args.claims, args.qps, args.burst, args.workers, args.timeout
    );
    println!("| provisioner | all PVs created | all Bound | claims Bound/s | all PVs deleted | lifecycle | API writes per claim (incl. kube-controller-manager's) | its own writes / requests per claim | CPU seconds | VmHWM (MiB) | volumes left |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &runs {
        let own = r
            .own_per_claim
            .map_or("?".to_string(), |(w, a)| format!("{w:.2} / {a:.2}"));
        let left = if r.left == usize::MAX {
            "?".to_string()
        } else {
            r.left.to_string()
        };
        println!(
            "| {} | {:.1} s | {:.1} s | {:.1} | {:.1} s | {:.1} s | {:.2} | {own} | {:.2} | {:.1} | {left} |",
            r.name,
            r.created.as_secs_f64(),
            r.bound.as_secs_f64(),
            args.claims as f64 / r.bound.as_secs_f64(),
            r.deleted.as_secs_f64(),
            (r.bound + r.deleted).as_secs_f64(),
            r.writes_per_claim,
            r.cpu_seconds,
            r.hwm_kib as f64 / 1024.0,
        );
    }
    if let Some(raw) = raw {
        println!(
            "\nThe API server's raw PV create rate ({} creates, {} in parallel, unthrottled): {raw:.0}/s",
            args.raw_pv_creates, args.raw_concurrency
        );
        for r in &runs {
            let bound = args.claims as f64 / r.bound.as_secs_f64();
            let made = args.claims as f64 / r.created.as_secs_f64();
            println!(
                "- {}: {made:.1} PVs created/s = {:.1}% of the raw PV create rate; {bound:.1} claims Bound/s = {:.1}%",
                r.name,
                100.0 * made / raw,
                100.0 * bound / raw
            );
        }
    }
    Ok(())
}
