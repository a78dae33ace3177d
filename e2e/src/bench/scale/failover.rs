//! Failover at N volumes: two replicas with leader election, `replica-a`
//! leading; it goes away in one of three ways ([`How`]) and at once a new
//! claim (for the attacher, a new VolumeAttachment) is created. Measured
//! from the leader's end: when the next leader holds the Lease, when its
//! first PV exists (its first successful CreateVolume; for the attacher,
//! the attachment is attached), when the claim is Bound; the API requests
//! made between the end and that first result (the bench's own polls
//! subtracted, Leases apart); and the new leader's VmHWM 15 s later.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, PostParams};

use super::{no_upstream, spawn_on, ApiCount, Args, Bed, DRIVER};
use crate::bench::objects;
use crate::bench::sample::mib;
use crate::bench::sidecar::{self, Role, Side};
use crate::process::{memory_kib, ManagedProcess};
use crate::{Error, Result};

const POLL: Duration = Duration::from_millis(100);
const GIVE_UP: Duration = Duration::from_secs(300);

/// How the leader goes away (`--failovers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum How {
    /// SIGKILL, and the standby takes over once the Lease runs out: a pod
    /// or node lost without a goodbye.
    Crash,
    /// SIGKILL, and the same replica starts again at once, as kubelet
    /// restarts a crashed container in its pod: its identity is the pod's
    /// name, so it takes back its own Lease without waiting it out.
    Restart,
    /// SIGTERM, as a pod's deletion (a drain, a rollout) sends: the leader
    /// releases its Lease and the standby, watching it, takes it at once.
    Release,
}

impl How {
    fn describe(self) -> &'static str {
        match self {
            How::Crash => "SIGKILL; the standby waits out the Lease",
            How::Restart => {
                "SIGKILL; the same replica restarted at once (kubelet's container restart)"
            }
            How::Release => "SIGTERM (a pod deleted); the leader releases its Lease",
        }
    }

    /// The replica expected to lead next.
    fn next(self) -> &'static str {
        match self {
            How::Restart => "replica-a",
            How::Crash | How::Release => "replica-b",
        }
    }
}

struct Outcome {
    /// How long the leader took to go (a graceful one releases first).
    ended: Duration,
    lease: Duration,
    first: Duration,
    bound: Option<Duration>,
    api: ApiCount,
    hwm_kib: u64,
    standby_rss_kib: u64,
}

async fn one(
    bed: &Bed,
    args: &Args,
    side: &Side,
    role: Role,
    how: How,
    k: usize,
) -> Result<Outcome> {
    let client = &bed.client;
    let lease = role.lease(DRIVER);
    let mut a = spawn_on(bed, side, role, &bed.flags(args, true)?, Some("replica-a"))?;
    super::until_holder(client, &lease, "replica-a").await?;
    let b = spawn_on(bed, side, role, &bed.flags(args, true)?, Some("replica-b"))?;
    // The leader settled on its N volumes, the standby waiting.
    tokio::time::sleep(args.settle()).await;
    a.check_running()?;
    let standby_rss_kib = memory_kib(b.pid()).map_or(0, |m| m.0);

    // For the attacher: a PV of a volume the driver has, not yet attached.
    let pv_name = format!("failover-{}-{k}", side.name);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    if role == Role::Attacher {
        let pv = crate::attach::pv(&pv_name, DRIVER, &bed.set.extra_handle(k));
        pvs.create(&PostParams::default(), &pv).await?;
    }
    let a0 = ApiCount::take(client).await?;
    let t0 = Instant::now();
    let mut restarted = None;
    // For a restart the holder stays the same: its new process's first
    // write is the first change of the Lease after the kill.
    let mut killed_version = None;
    match how {
        How::Crash => a.kill9(),
        How::Restart => {
            a.kill9();
            killed_version = sidecar::holder_at(client, &lease).await?.1;
            let flags = bed.flags(args, true)?;
            restarted = Some(spawn_on(bed, side, role, &flags, Some("replica-a"))?);
        }
        How::Release => a.terminate(Duration::from_secs(10)),
    }
    let t_end = t0.elapsed();
    let mut polls = ApiCount::default();
    let (first_pv, claim_uid) = match role {
        Role::Provisioner => {
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
            let c = objects::claim(
                &format!("failover-{}-{k}", side.name),
                "default",
                super::CLASS,
            );
            let c = pvcs.create(&PostParams::default(), &c).await?;
            (
                Some(format!(
                    "pvc-{}",
                    c.metadata.uid.clone().unwrap_or_default()
                )),
                c.metadata.name,
            )
        }
        Role::Attacher => {
            let vas: Api<VolumeAttachment> = Api::all(client.clone());
            let va = crate::attach::va(&pv_name, DRIVER, &pv_name, &bed.set.nodes[0]);
            vas.create(&PostParams::default(), &va).await?;
            (None, None)
        }
    };
    polls.writes += 1.0;
    let mut lease_at = None;
    let mut first = None;
    let mut api = ApiCount::default();
    while first.is_none() {
        if t0.elapsed() > GIVE_UP {
            return Err(Error::Other(format!(
                "{} {} ({how:?}): nothing done {GIVE_UP:?} after the leader's end\n{}",
                side.name,
                role.subcommand(),
                restarted.as_ref().unwrap_or(&b).log_tail(20)
            )));
        }
        if lease_at.is_none() {
            let (holder, version) = sidecar::holder_at(client, &lease).await?;
            let written = how != How::Restart || version != killed_version;
            if written && holder.is_some_and(|h| h.starts_with(how.next())) {
                lease_at = Some(t0.elapsed());
            }
        }
        polls.leases += 1.0;
        let done = match &first_pv {
            Some(pv) => pvs.get_opt(pv).await?.is_some(),
            None => {
                let vas: Api<VolumeAttachment> = Api::all(client.clone());
                vas.get(&pv_name).await?.status.is_some_and(|s| s.attached)
            }
        };
        polls.get += 1.0;
        if done {
            first = Some(t0.elapsed());
            api = ApiCount::take(client).await?.since(&a0);
        } else {
            tokio::time::sleep(POLL).await;
        }
    }
    let first = first.unwrap_or_default();
    let bound = match claim_uid {
        Some(name) => {
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
            crate::wait_for(GIVE_UP, POLL, || async {
                pvcs.get(&name)
                    .await
                    .ok()
                    .filter(objects::is_bound)
                    .map(|_| t0.elapsed())
            })
            .await
            .ok()
        }
        None => None,
    };
    tokio::time::sleep(Duration::from_secs(15)).await;
    let leader = restarted.as_ref().unwrap_or(&b);
    let hwm_kib = memory_kib(leader.pid()).map_or(0, |m| m.1);
    stop_all([a, b].into_iter().chain(restarted).collect());
    Ok(Outcome {
        ended: t_end,
        lease: lease_at.unwrap_or(first),
        first,
        bound,
        api: ApiCount {
            list: api.list,
            get: api.get - polls.get,
            watch: api.watch,
            writes: api.writes - polls.writes,
            leases: api.leases - polls.leases,
            listed_objects: api.listed_objects,
        },
        hwm_kib,
        standby_rss_kib,
    })
}

fn stop_all(mut procs: Vec<ManagedProcess>) {
    crate::process::terminate_all(&mut procs, Duration::from_secs(10));
}

pub async fn run(bed: &Bed, args: &Args) -> Result<String> {
    let hows = &args.failovers;
    let mut rows = String::new();
    for role in [Role::Provisioner, Role::Attacher] {
        let sides = args.sides(role)?;
        // Numbers the role's runs: each gets its own claim or PV.
        let mut k = 0;
        for &how in hows {
            for side in &sides {
                eprintln!("failover ({how:?}): {} {}", side.name, role.subcommand());
                let o = one(bed, args, side, role, how, k).await?;
                k += 1;
                // Let the Lease of the finished pair run out before the next.
                tokio::time::sleep(Duration::from_secs(2)).await;
                rows += &row(side, role, how, &o);
            }
            if sides.len() == 1 {
                rows += &no_upstream(role.subcommand(), role.upstream_env());
            }
        }
    }
    let hows: Vec<String> = hows
        .iter()
        .map(|h| format!("{h:?}: {}", h.describe()))
        .collect();
    Ok(format!(
        "### Failover at {n} volumes\n\n\
         Two replicas, leader election with the default timings (a 15 s Lease); the leader ends and a new claim \
         (attacher: a new VolumeAttachment) is created at once. How it ends: {hows}. Times from the signal. \
         Requests: kube-apiserver's count over the sidecars' resources between the signal and the first result, \
         Leases apart, the bench's own polls subtracted (kube-controller-manager's binding writes may be in it).\n\n\
         | sidecar | leader's end | new leader holds the Lease | first PV created (attacher: attached) | claim Bound | requests before the first result | standby VmRSS (MiB) | new leader VmHWM 15 s after (MiB) |\n\
         |---|---|---|---|---|---|---|---|\n{rows}\n",
        n = args.volumes,
        hows = hows.join("; "),
    ))
}

fn row(side: &Side, role: Role, how: How, o: &Outcome) -> String {
    format!(
        "| {} {} | {how:?} ({:.2} s) | {:.2} s | {:.2} s ({:.2} s after the Lease) | {} | {:.0} LIST ({:.0} objects), {:.0} GET, {:.0} WATCH, {:.0} writes | {} | {} |\n",
        side.name,
        role.subcommand(),
        o.ended.as_secs_f64(),
        o.lease.as_secs_f64(),
        o.first.as_secs_f64(),
        o.first.saturating_sub(o.lease).as_secs_f64(),
        o.bound.map_or("–".into(), |d| format!("{:.2} s", d.as_secs_f64())),
        o.api.list,
        o.api.listed_objects,
        o.api.get,
        o.api.watch,
        o.api.writes,
        mib(o.standby_rss_kib),
        mib(o.hwm_kib),
    )
}
