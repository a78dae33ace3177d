//! The burst: on a fresh control plane per side (3 kwok nodes, the driver
//! answering CreateVolume after `--create-delay`), the provisioner alone
//! is started, then `--burst-claims` claims of an Immediate class are
//! created at once (32 creates in flight). Sampled every
//! `--sample-every` seconds: claims created, the driver's PVs created and
//! claims Bound (watches of the bench's own) and the provisioner's VmRSS; meanwhile another client
//! GETs `namespaces/default` every 200 ms ([`LatencyProbe`]). The
//! provisioner and that client act as ServiceAccounts (impersonated), so
//! API priority and fairness classes them as workloads; the bench itself,
//! creating the claims, is the bed's admin (exempt). Ends when
//! every claim is Bound, when none got Bound for `--stall` seconds, when
//! the provisioner exits (an OOM kill, say) or after `--burst-timeout`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;

use super::{no_upstream, start_driver, Args, CLASS, DRIVER};
use crate::bench::objects::{self, for_each};
use crate::bench::sample::{mib, Latencies, LatencyProbe};
use crate::bench::sidecar::{self, Flags, Role, Side};
use crate::process::{cpu_seconds, memory_kib};
use crate::{free_port, Cluster, ClusterOptions, Error, Result};

struct Sample {
    t: Duration,
    created: usize,
    provisioned: usize,
    bound: usize,
    rss_kib: u64,
}

struct Outcome {
    samples: Vec<Sample>,
    end: String,
    hwm_kib: u64,
    cpu: f64,
    latency: Latencies,
}

/// Counts the objects of `api`'s watch that `counts` accepts, each name
/// once: claims Bound (kube-controller-manager's binding) and the driver's
/// PVs (the provisioner's own work), so a slow binding shows apart from a
/// slow provisioner.
fn count_where<K>(
    api: Api<K>,
    counts: fn(&K) -> bool,
    n: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let mut seen: HashSet<String> = HashSet::new();
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            let o = match ev {
                Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => o,
                _ => continue,
            };
            if counts(&o) {
                if let Some(name) = o.meta().name.clone() {
                    seen.insert(name);
                }
            }
            n.store(seen.len(), Ordering::Relaxed);
        }
    })
}

fn is_ours(pv: &PersistentVolume) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|c| c.driver == DRIVER)
}

async fn one(args: &Args, side: &Side) -> Result<Outcome> {
    let cluster = Cluster::start(ClusterOptions::kwok(3)).await?;
    let client = cluster.client()?;
    let dir = cluster.work_dir().join("burst");
    std::fs::create_dir_all(&dir).map_err(|e| Error::Other(e.to_string()))?;
    let socket = dir.join("csi.sock");
    let _driver = start_driver(&dir, &socket, args, false).await?;
    super::register_nodes(&client, cluster.node_names()).await?;
    objects::storage_class(&client, CLASS, DRIVER).await?;
    // The provisioner and the other client as ServiceAccounts, so that
    // API priority and fairness sees them as it would in a cluster.
    let kubeconfig = sidecar::service_account_kubeconfig(&cluster, "scale-provisioner").await?;
    let other = sidecar::service_account_kubeconfig(&cluster, "scale-other-client").await?;
    let flags = Flags {
        socket: socket.clone(),
        kubeconfig,
        qps: args.qps,
        burst: args.burst,
        workers: args.workers,
        timeout: "15s".into(),
        leader_election: false,
        http_port: free_port()?,
    };
    let mut proc = sidecar::spawn(
        side,
        Role::Provisioner,
        &flags,
        None,
        &dir.join("provisioner.log"),
    )?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let n = args.burst_claims;
    let bound = Arc::new(AtomicUsize::new(0));
    let provisioned = Arc::new(AtomicUsize::new(0));
    let created = Arc::new(AtomicUsize::new(0));
    let watch = count_where(
        Api::<PersistentVolumeClaim>::namespaced(cluster.client()?, "default"),
        objects::is_bound,
        bound.clone(),
    );
    let pv_watch = count_where(
        Api::<PersistentVolume>::all(cluster.client()?),
        is_ours,
        provisioned.clone(),
    );
    let probe = LatencyProbe::start(
        sidecar::client_from(&other).await?,
        Duration::from_millis(200),
    );
    let creator = {
        let (client, created) = (client.clone(), created.clone());
        tokio::spawn(async move {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
            for_each(n, |i| {
                let (api, created) = (api.clone(), created.clone());
                async move {
                    api.create(
                        &PostParams::default(),
                        &objects::claim(&format!("burst-{i:05}"), "default", CLASS),
                    )
                    .await?;
                    created.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }
            })
            .await
        })
    };

    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut last_progress = (0, Instant::now());
    let end = loop {
        tokio::time::sleep(Duration::from_secs(args.sample_every)).await;
        let b = bound.load(Ordering::Relaxed);
        let rss_kib = memory_kib(proc.pid()).map_or(0, |m| m.0);
        samples.push(Sample {
            t: t0.elapsed(),
            created: created.load(Ordering::Relaxed),
            provisioned: provisioned.load(Ordering::Relaxed),
            bound: b,
            rss_kib,
        });
        if b > last_progress.0 {
            last_progress = (b, Instant::now());
        }
        if b >= n {
            break "all Bound".to_string();
        }
        if let Err(e) = proc.check_running() {
            break format!(
                "provisioner exited: {}",
                e.to_string().lines().next().unwrap_or("")
            );
        }
        if last_progress.1.elapsed() > Duration::from_secs(args.stall) {
            break format!("stalled: none Bound for {} s", args.stall);
        }
        if t0.elapsed() > Duration::from_secs(args.burst_timeout) {
            break format!("stopped after {} s", args.burst_timeout);
        }
    };
    let latency = probe.stop();
    creator.abort();
    watch.abort();
    pv_watch.abort();
    let hwm_kib = memory_kib(proc.pid()).map_or(0, |m| m.1);
    let cpu = cpu_seconds(proc.pid()).unwrap_or(0.0);
    drop(proc);
    cluster.stop().await?;
    Ok(Outcome {
        samples,
        end,
        hwm_kib,
        cpu,
        latency,
    })
}

/// The first sample with at least `share` of `n` Bound.
fn at(samples: &[Sample], n: usize, share: f64) -> Option<&Sample> {
    samples.iter().find(|s| s.bound as f64 >= share * n as f64)
}

fn summary_row(name: &str, n: usize, o: &Outcome) -> String {
    let last = o.samples.last();
    let bound = last.map_or(0, |s| s.bound);
    let t = last.map_or(Duration::ZERO, |s| s.t);
    let rss_at = |share| at(&o.samples, n, share).map_or("–".into(), |s| mib(s.rss_kib));
    // The rate between 10% and 90% Bound: steady if close to the overall.
    let rate = match (at(&o.samples, n, 0.1), at(&o.samples, n, 0.9)) {
        (Some(a), Some(b)) if b.t > a.t => format!(
            "{:.1}",
            (b.bound - a.bound) as f64 / (b.t - a.t).as_secs_f64()
        ),
        _ => "–".into(),
    };
    format!(
        "| {name} | {bound}/{n} in {:.0} s ({}) | {:.1} | {rate} | {} / {} / {} / {} | {} | {:.1} | {} |\n",
        t.as_secs_f64(),
        o.end,
        bound as f64 / t.as_secs_f64().max(1e-9),
        rss_at(0.25),
        rss_at(0.5),
        rss_at(0.75),
        last.map_or("–".into(), |s| mib(s.rss_kib)),
        mib(o.hwm_kib),
        o.cpu,
        o.latency.cell(),
    )
}

/// At most `rows` samples, evenly spread, the last one always.
fn timeline(name: &str, o: &Outcome, rows: usize) -> String {
    let step = o.samples.len().div_ceil(rows).max(1);
    let mut out = String::new();
    for (i, s) in o.samples.iter().enumerate() {
        if i % step == 0 || i + 1 == o.samples.len() {
            out += &format!(
                "| {name} | {:.0} | {} | {} | {} | {} |\n",
                s.t.as_secs_f64(),
                s.created,
                s.provisioned,
                s.bound,
                mib(s.rss_kib)
            );
        }
    }
    out
}

pub async fn run(args: &Args) -> Result<String> {
    let sides = args.sides(Role::Provisioner)?;
    let n = args.burst_claims;
    let mut summary = String::new();
    let mut lines = String::new();
    for side in &sides {
        eprintln!("burst: {} provisioner, {n} claims", side.name);
        let o = one(args, side).await?;
        summary += &summary_row(&format!("{} provisioner", side.name), n, &o);
        lines += &timeline(&side.name, &o, 16);
    }
    if sides.len() == 1 {
        summary += &no_upstream("provisioner", "UPSTREAM_PROVISIONER");
    }
    Ok(format!(
        "### Burst: {n} claims at once\n\n\
         A fresh control plane per side (3 kwok nodes), the driver answering CreateVolume after {delay}; \
         QPS {qps} / burst {burst}, {workers} workers, no memory limit set; the provisioner runs as a \
         ServiceAccount (impersonated), so API priority and fairness applies to it. Another ServiceAccount's GET of \
         namespaces/default every 200 ms during the burst: p50 / p99 / max.\n\n\
         | provisioner | claims Bound | Bound/s overall | Bound/s from 10% to 90% | VmRSS at 25/50/75% Bound and at the end (MiB) | VmHWM (MiB) | CPU s | another client's GET latency |\n\
         |---|---|---|---|---|---|---|---|\n{summary}\n\
         Over time:\n\n\
         | side | s | claims created | PVs created | Bound | VmRSS (MiB) |\n|---|---|---|---|---|---|\n{lines}\n",
        delay = args.create_delay,
        qps = args.qps,
        burst = args.burst,
        workers = args.workers,
    ))
}
