//! Steady state at N bound volumes: each side's provisioner, then its
//! attacher, alone with leader election on (as deployed), given
//! `--settle` seconds, then `--rest` seconds at rest: VmRSS (its anonymous
//! part) and VmHWM, the API server's requests a minute to the sidecars'
//! resources (minus the same window with no sidecar running), its own
//! count where it exports one, and CPU seconds a minute.

use std::time::{Duration, Instant};

use super::{no_upstream, spawn_on, ApiCount, Args, Bed};
use crate::apimetrics;
use crate::bench::sample::mib;
use crate::bench::sidecar::Role;
use crate::process::{cpu_seconds, memory_detail_kib};
use crate::{Error, Result};

/// What a window at rest cost.
struct Rest {
    /// Requests a minute, Leases apart, and the Leases'.
    api: ApiCount,
    /// Its own requests a minute, when it counts them.
    own: Option<f64>,
    cpu_per_min: f64,
}

async fn rest_window(
    bed: &Bed,
    pid: Option<u32>,
    port: Option<u16>,
    window: Duration,
) -> Result<Rest> {
    let a0 = ApiCount::take(&bed.client).await?;
    let own0 = port.and_then(|p| apimetrics::scrape_own_requests(p).ok().flatten());
    let cpu0 = pid.and_then(cpu_seconds).unwrap_or(0.0);
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let a1 = ApiCount::take(&bed.client).await?;
    let own1 = port.and_then(|p| apimetrics::scrape_own_requests(p).ok().flatten());
    let cpu1 = pid.and_then(cpu_seconds).unwrap_or(0.0);
    let d = a1.since(&a0);
    let per_min = |x: f64| x / minutes;
    Ok(Rest {
        api: ApiCount {
            list: per_min(d.list),
            get: per_min(d.get),
            watch: per_min(d.watch),
            writes: per_min(d.writes),
            leases: per_min(d.leases),
            listed_objects: per_min(d.listed_objects),
        },
        own: own0.zip(own1).map(|(a, b)| per_min(b.1 - a.1)),
        cpu_per_min: per_min(cpu1 - cpu0),
    })
}

pub async fn run(bed: &Bed, args: &Args) -> Result<String> {
    let window = Duration::from_secs(args.rest);
    eprintln!("steady: baseline, {}s with no sidecar", args.rest);
    let base = rest_window(bed, None, None, window).await?;
    let mut rows = String::new();
    for role in [Role::Provisioner, Role::Attacher] {
        for side in args.sides(role)? {
            eprintln!("steady: {} {}", side.name, role.subcommand());
            let flags = bed.flags(args, true)?;
            // A host name of its own: it is measured once it holds the Lease.
            let mut proc = spawn_on(bed, &side, role, &flags, Some("steady"))?;
            let t0 = Instant::now();
            super::until_holder(&bed.client, &role.lease(super::DRIVER), "steady").await?;
            tokio::time::sleep(args.settle()).await;
            proc.check_running()?;
            let rest = rest_window(bed, Some(proc.pid()), Some(flags.http_port), window).await?;
            let mem = memory_detail_kib(proc.pid())
                .ok_or_else(|| Error::Other(format!("{} gone", proc.name())))?;
            let api = rest.api;
            let over = |x: f64, b: f64| x - b;
            rows += &format!(
                "| {} {} | {} | {} | {} | {:.1} ({:.1} LIST, {:.1} GET, {:.1} writes) | {:.1} | {} | {:.3} | {:.0} s |\n",
                side.name,
                role.subcommand(),
                mib(mem.rss),
                mib(mem.anon),
                mib(mem.hwm),
                over(api.total(), base.api.total()),
                over(api.list, base.api.list),
                over(api.get, base.api.get),
                over(api.writes, base.api.writes),
                over(api.leases, base.api.leases),
                rest.own.map_or("?".into(), |o| format!("{o:.1}")),
                rest.cpu_per_min,
                t0.elapsed().as_secs_f64(),
            );
            proc.terminate(Duration::from_secs(10));
            // Its Lease released or expired before the next one starts.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        if args.sides(role)?.len() == 1 {
            rows += &no_upstream(role.subcommand(), role.upstream_env());
        }
    }
    Ok(format!(
        "### Steady state at {n} bound volumes\n\n\
         Each sidecar alone, leader election on, {settle} s to settle once it holds the Lease, then {rest} s at rest. \
         Requests a minute: kube-apiserver's own count over the sidecars' resources, Leases apart, minus the same \
         window with no sidecar ({base:.1}/min, Leases {base_l:.1}/min).\n\n\
         | sidecar | VmRSS (MiB) | of it anonymous | VmHWM (MiB) | API requests/min at rest | Lease requests/min | own count/min | CPU s/min at rest | measured after |\n\
         |---|---|---|---|---|---|---|---|---|\n{rows}\n",
        n = args.volumes,
        settle = args.settle().as_secs(),
        rest = args.rest,
        base = base.api.total(),
        base_l = base.api.leases,
    ))
}
