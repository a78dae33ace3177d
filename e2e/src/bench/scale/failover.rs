//! Failover at N volumes: two replicas with leader election, `replica-a`
//! leading; it is killed (SIGKILL, a crash: its Lease runs out rather than
//! being released) and at once a new claim (for the attacher, a new
//! VolumeAttachment) is created. Measured from the kill: when `replica-b`
//! holds the Lease, when its first PV exists (its first successful
//! CreateVolume; for the attacher, the attachment is attached), when the
//! claim is Bound; the API requests made between the kill and that first
//! result (the bench's own polls subtracted, Leases apart); and the new
//! leader's VmHWM 15 s later.

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

struct Outcome {
    lease: Duration,
    first: Duration,
    bound: Option<Duration>,
    api: ApiCount,
    hwm_kib: u64,
    standby_rss_kib: u64,
}

async fn one(bed: &Bed, args: &Args, side: &Side, role: Role, k: usize) -> Result<Outcome> {
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
    a.kill9();
    let mut polls = ApiCount::default();
    let (first_pv, claim_uid) = match role {
        Role::Provisioner => {
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
            let c = objects::claim(&format!("failover-{}", side.name), "default", super::CLASS);
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
                "{} {}: nothing done {GIVE_UP:?} after the kill\n{}",
                side.name,
                role.subcommand(),
                b.log_tail(20)
            )));
        }
        if lease_at.is_none()
            && sidecar::holder(client, &lease)
                .await?
                .is_some_and(|h| h.starts_with("replica-b"))
        {
            lease_at = Some(t0.elapsed());
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
    let hwm_kib = memory_kib(b.pid()).map_or(0, |m| m.1);
    stop_all(vec![a, b]);
    Ok(Outcome {
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
    let mut rows = String::new();
    for role in [Role::Provisioner, Role::Attacher] {
        let sides = args.sides(role)?;
        for (k, side) in sides.iter().enumerate() {
            eprintln!("failover: {} {}", side.name, role.subcommand());
            let o = one(bed, args, side, role, k).await?;
            // Let the Lease of the finished pair run out before the next.
            tokio::time::sleep(Duration::from_secs(2)).await;
            rows += &format!(
                "| {} {} | {:.2} s | {:.2} s ({:.2} s after the Lease) | {} | {:.0} LIST ({:.0} objects), {:.0} GET, {:.0} WATCH, {:.0} writes | {} | {} |\n",
                side.name,
                role.subcommand(),
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
            );
        }
        if sides.len() == 1 {
            rows += &no_upstream(role.subcommand(), role.upstream_env());
        }
    }
    Ok(format!(
        "### Failover at {n} volumes\n\n\
         Two replicas, leader election with the default timings; the leader SIGKILLed, a new claim \
         (attacher: a new VolumeAttachment) created at once. Times from the kill. Requests: kube-apiserver's count \
         over the sidecars' resources between the kill and the first result, Leases apart, the bench's own \
         polls subtracted (kube-controller-manager's binding writes may be in it).\n\n\
         | sidecar | new leader holds the Lease | first PV created (attacher: attached) | claim Bound | requests before the first result | standby VmRSS (MiB) | new leader VmHWM 15 s after (MiB) |\n\
         |---|---|---|---|---|---|---|\n{rows}\n",
        n = args.volumes
    ))
}
