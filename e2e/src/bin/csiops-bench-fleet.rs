//! Benchmark (not a test): the operator on a fleet, by default 1000 kwok
//! nodes × 20 CSIDriverDeployments (20 000 node pods).
//!
//! One local control plane; the operator runs as a local process (as in the
//! e2e tests on kwok), leader election off. Every node's CSINode gets every
//! driver's entry (kwok runs no kubelet; see `csiops_e2e::fleet`). The
//! drivers are deployed at v1 and settle; then, in this order:
//!
//! 1. steady state: the operator's own API requests
//!    (`csiops_kube_api_requests_total`, every request it sends) over
//!    `--idle-seconds` with nothing changing, per driver and minute;
//! 2. edits: `--edits` drivers get a `spec.rollout.stepTimeoutSeconds` edit,
//!    one at a time; the time from sending the edit to the operator's next
//!    write request (its counter, read every few milliseconds);
//! 3. a bare DaemonSet with driver d00's node pod template (same update
//!    strategy, same nodes, relabelled away from the operator) is created at
//!    v1;
//! 4. `--rounds` times: d00 is upgraded to the next version (version and
//!    image): the time from the edit to its status saying that version with
//!    no rollout left (nodes first, then the controller); and the bare
//!    DaemonSet gets d00's pod template, marked with the round's version
//!    so every pod rolls: the time until its controller reports every pod
//!    updated and available. Rounds alternate which side goes first (the
//!    operator's in round 1, the bare one in round 2, …), so neither is
//!    always the first churn after a quiet spell. The ratio is the sum of
//!    the operator's times over the sum of the bare ones (rounds even out a
//!    shared machine's moments). Watches on both DaemonSets, d00's
//!    StatefulSet and d00 itself say where the time went (when each
//!    DaemonSet was edited, got its first new pod and was rolled out; when
//!    the controller's surge began; when the status said done): printed
//!    on stderr as each round ends, and summed up in the table.
//!
//! Memory is `VmRSS`/`VmHWM` of the operator process from `/proc`.
//!
//! ```text
//! csiops-bench-fleet [--nodes N] [--drivers M] [--max-unavailable 10%] [--idle-seconds S] [--edits E] [--rounds R]
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use csiops_e2e::fleet::{self, FleetDriver};
use csiops_e2e::operator::ApiRequests;
use csiops_e2e::process::{memory_kib, CpuSample};
use csiops_e2e::rollout_clock::{self, secs, DaemonSetMarks, Mark, RolloutClock};
use csiops_e2e::{kwok, operator_bin, testkit, wait_for, Cluster, ClusterOptions, OperatorProcess};
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::Api;
use serde_json::json;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    #[arg(long, default_value_t = 20)]
    drivers: usize,
    /// `spec.node.maxUnavailable` of every driver (a count or a percentage).
    #[arg(long, default_value = "10%")]
    max_unavailable: String,
    /// Length of the steady-state window.
    #[arg(long, default_value_t = 600)]
    idle_seconds: u64,
    /// CR edits timed to the operator's first write.
    #[arg(long, default_value_t = 5)]
    edits: usize,
    /// Upgrades, each against a bare DaemonSet rollout.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 3600)]
    phase_timeout: u64,
}

/// One upgrade of the operator's driver and the bare DaemonSet's rollout of
/// the same template.
struct Round {
    /// The bare DaemonSet rolled first this round.
    bare_first: bool,
    operator: Duration,
    /// CPU used during the operator's upgrade and during the bare rollout,
    /// by the operator, each cluster process and the whole machine.
    operator_cpu: CpuSample,
    bare_cpu: CpuSample,
    operator_pods: fleet::Progress,
    /// Where the operator's time went, from watches (see `rollout_clock`).
    operator_marks: (DaemonSetMarks, Vec<Mark>),
    bare: Duration,
    bare_pods: fleet::Progress,
    bare_marks: DaemonSetMarks,
    first_write: Duration,
    requests: ApiRequests,
}

impl Round {
    /// `DaemonSet edited 0.05 s, first new pod 0.31 s, rolled out 5.10 s;
    /// controller from 5.32 s; status done 6.20 s`, for the operator, and
    /// the bare DaemonSet's three.
    fn where_time_goes(&self, version: &str) -> (String, String) {
        let (ds, marks) = &self.operator_marks;
        let controller = rollout_clock::first(marks, "StatefulSet", |_| true);
        let done_state = format!("Running at {version}, step -");
        let done = rollout_clock::first(marks, "CSIDriverDeployment", |s| s == done_state);
        let daemonset = |m: &DaemonSetMarks| {
            format!(
                "DaemonSet edited {}, first new pod {}, rolled out {}",
                secs(m.edited),
                secs(m.first_pod),
                secs(m.done)
            )
        };
        (
            format!(
                "{}; controller from {}; status done {}",
                daemonset(ds),
                secs(controller),
                secs(done)
            ),
            daemonset(&self.bare_marks),
        )
    }
}

/// The operator's side of a round: `d` upgraded to `version`.
struct OperatorSide {
    time: Duration,
    /// CPU used meanwhile, by process and by the machine.
    cpu: CpuSample,
    pods: fleet::Progress,
    marks: (DaemonSetMarks, Vec<Mark>),
    first_write: Duration,
    requests: ApiRequests,
}

/// Upgrades `d` to `version` and waits until its status says so with no
/// rollout left.
async fn upgrade_operator(
    client: &kube::Client,
    operator: &OperatorProcess,
    procs: &[(String, u32)],
    d: &FleetDriver,
    version: &str,
    nodes: usize,
    limit: Duration,
) -> BenchResult<OperatorSide> {
    let poll = Duration::from_millis(250);
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), &d.namespace);
    let from = ds_api.get(&d.daemonset()).await?.metadata.generation;
    let clock = RolloutClock::watch(
        client,
        &d.namespace,
        &d.daemonset(),
        Some(&d.statefulset()),
        Some(&d.name),
    );
    clock.synced(Duration::from_secs(60)).await?;
    let before = operator.api_requests().await?;
    let cpu0 = CpuSample::take(procs);
    let t0 = Instant::now();
    clock.zero(t0, from);
    d.upgrade(client, version).await?;
    let first_write = operator.next_write(before.writes, t0).await?;
    // Its DaemonSet's progress, to compare with the bare one's.
    let pods = std::sync::Mutex::new(fleet::Progress::default());
    wait_for(limit, poll, || async {
        let ds = ds_api.get(&d.daemonset()).await.ok()?;
        pods.lock().ok()?.observe(&ds, from, t0.elapsed());
        // The object from the clock's watch, not a GET: the bare side's
        // wait polls only its DaemonSet, and the two sides should cost
        // the API server the same.
        let obj = clock.object()?;
        fleet::settled(&obj, version, nodes).then_some(())
    })
    .await
    .map_err(|_| format!("the upgrade to {version} did not complete"))?;
    let time = t0.elapsed();
    let cpu = CpuSample::take(procs).since(&cpu0);
    let after = operator.api_requests().await?;
    let pods = pods.into_inner()?;
    let done_state = format!("Running at {version}, step -");
    clock
        .seen(
            "CSIDriverDeployment",
            |s| s == done_state,
            Duration::from_secs(5),
        )
        .await;
    let marks = (clock.daemonset(), clock.marks());
    drop(clock);
    eprintln!(
        "  operator: {:.2} s\n{}",
        time.as_secs_f64(),
        rollout_clock::render(&marks.0, &marks.1)
    );
    Ok(OperatorSide {
        time,
        cpu,
        pods,
        marks,
        first_write,
        requests: ApiRequests {
            all: after.all - before.all,
            writes: after.writes - before.writes,
        },
    })
}

/// Rolls the bare DaemonSet `bare` to `d`'s node pod template as it is
/// now, marked with `version` (a template annotation) so that it always
/// rolls every pod, whichever side goes first.
async fn roll_bare(
    client: &kube::Client,
    procs: &[(String, u32)],
    d: &FleetDriver,
    bare: &str,
    version: &str,
    limit: Duration,
) -> BenchResult<(Duration, fleet::Progress, DaemonSetMarks, CpuSample)> {
    let poll = Duration::from_millis(250);
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), &d.namespace);
    let mut template = fleet::bare_daemonset(&ds_api.get(&d.daemonset()).await?, bare)?;
    if let Some(meta) = template
        .spec
        .as_mut()
        .and_then(|s| s.template.metadata.as_mut())
    {
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(BENCH_ROUND.to_string(), version.to_string());
    }
    let from = ds_api.get(bare).await?.metadata.generation;
    let clock = RolloutClock::watch(client, &d.namespace, bare, None, None);
    clock.synced(Duration::from_secs(60)).await?;
    let cpu0 = CpuSample::take(procs);
    let t0 = Instant::now();
    clock.zero(t0, from);
    fleet::apply_daemonset(client, &template).await?;
    let pods = fleet::wait_rolled_out(client, &d.namespace, bare, from, t0, poll, limit).await?;
    let time = t0.elapsed();
    let cpu = CpuSample::take(procs).since(&cpu0);
    let marks = clock.daemonset();
    drop(clock);
    eprintln!(
        "  bare: {:.2} s\n{}",
        time.as_secs_f64(),
        rollout_clock::render(&marks, &[])
    );
    Ok((time, pods, marks, cpu))
}

/// The bare DaemonSet's pod-template annotation that names the round.
const BENCH_ROUND: &str = "csiops.dev/bench-round";

/// One round: the operator's upgrade of `d` to `version` and the bare
/// DaemonSet's rollout, the bare one first when `bare_first` (rounds
/// alternate, so that neither side is always the first churn of the
/// nodes after a quiet spell).
#[allow(clippy::too_many_arguments)]
async fn round(
    client: &kube::Client,
    operator: &OperatorProcess,
    procs: &[(String, u32)],
    d: &FleetDriver,
    bare: &str,
    version: &str,
    nodes: usize,
    limit: Duration,
    bare_first: bool,
) -> BenchResult<Round> {
    // The operator settles before the other side starts and before the
    // next round.
    let quiet = || operator.wait_quiet(Duration::from_secs(5), limit);
    let (side, (bare_time, bare_pods, bare_marks, bare_cpu)) = if bare_first {
        let b = roll_bare(client, procs, d, bare, version, limit).await?;
        quiet().await?;
        (
            upgrade_operator(client, operator, procs, d, version, nodes, limit).await?,
            b,
        )
    } else {
        let o = upgrade_operator(client, operator, procs, d, version, nodes, limit).await?;
        quiet().await?;
        (o, roll_bare(client, procs, d, bare, version, limit).await?)
    };
    quiet().await?;
    Ok(Round {
        bare_first,
        operator: side.time,
        operator_cpu: side.cpu,
        bare_cpu,
        operator_pods: side.pods,
        operator_marks: side.marks,
        bare: bare_time,
        bare_pods,
        bare_marks,
        first_write: side.first_write,
        requests: side.requests,
    })
}

/// How much more CPU kwok may use on one side of a round than on the other
/// before the round counts as stalled. kwok, which plays every node's
/// kubelet, now and then stalls at a thousand nodes: it burns several times
/// its usual CPU and the roll's last pods come a minute or more late, on
/// whichever side it happens. Normal rounds stay within 1.4× of each other;
/// the stalls seen were 2.7× and more.
const KWOK_STALL_FACTOR: f64 = 2.0;

/// The side of a round on which kwok stalled, if it did: `"operator's"` or
/// `"bare"`.
fn kwok_stalled(operator: &CpuSample, bare: &CpuSample) -> Option<&'static str> {
    let (op, bare) = (operator.of("kwok"), bare.of("kwok"));
    if op > KWOK_STALL_FACTOR * bare {
        Some("operator's")
    } else if bare > KWOK_STALL_FACTOR * op {
        Some("bare")
    } else {
        None
    }
}

/// `operator 1.68 / 0.26, kube-apiserver 9.10 / 8.20, …; machine busy
/// 45.0 / 40.1, idle 5.2 / 3.0`: each process's CPU seconds on both sides.
fn cpu_pairs(operator: &CpuSample, bare: &CpuSample) -> String {
    let each: Vec<String> = operator
        .processes
        .iter()
        .map(|(name, secs)| format!("{name} {secs:.2} / {:.2}", bare.of(name)))
        .collect();
    format!(
        "{}; machine busy {:.1} / {:.1}, idle {:.1} / {:.1}",
        each.join(", "),
        operator.busy,
        bare.busy,
        operator.idle,
        bare.idle
    )
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::main]
async fn main() -> BenchResult<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let limit = Duration::from_secs(args.phase_timeout);
    let poll = Duration::from_millis(250);

    eprintln!("starting a control plane with {} kwok nodes", args.nodes);
    let cluster = Cluster::start(ClusterOptions {
        simulation: kwok::Simulation::FLEET,
        ..ClusterOptions::kwok(args.nodes)
    })
    .await?;
    eprintln!("  up in {:.0?}", cluster.startup_time());
    let client = cluster.client()?;
    testkit::install_crd(&cluster).await?;
    let drivers: Vec<FleetDriver> = (0..args.drivers).map(FleetDriver::new).collect();
    let names: Vec<String> = drivers.iter().map(|d| d.driver.clone()).collect();
    fleet::register_everywhere(&client, cluster.node_names(), &names).await?;

    let bin = operator_bin()?;
    eprintln!("operator: {}", bin.display());
    let operator = cluster.run_operator(&bin)?;
    let pid = operator.pid();
    // Whose CPU each side of a round costs: the operator and every cluster
    // process (API server, etcd, controller manager, scheduler, kwok).
    let procs: Vec<(String, u32)> = std::iter::once(("operator".to_string(), pid))
        .chain(cluster.pids())
        .collect();

    deploy_v1_and_settle(&args, &cluster, &client, &operator, &drivers, limit).await?;
    let rest = steady_state(&args, &operator, pid).await?;
    let edits = edits_to_first_write(&args, &client, &operator, &drivers, limit).await?;

    // --- 3. the bare DaemonSet at v1 ------------------------------------------------
    let d0 = &drivers[0];
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), &d0.namespace);
    let bare = "bare-node";
    let v1 = fleet::bare_daemonset(&ds_api.get(&d0.daemonset()).await?, bare)?;
    fleet::apply_daemonset(&client, &v1).await?;
    eprintln!("bare DaemonSet at v1 on every node");
    fleet::wait_rolled_out(
        &client,
        &d0.namespace,
        bare,
        None,
        Instant::now(),
        poll,
        limit,
    )
    .await?;
    operator.wait_quiet(Duration::from_secs(10), limit).await?;

    // --- 4. upgrades against the bare DaemonSet ---------------------------------------
    let mut rounds = Vec::new();
    for r in 0..args.rounds {
        let version = format!("v{}", r + 2);
        let bare_first = r % 2 == 1;
        eprintln!(
            "round {}: {} to {version} and the bare DaemonSet, {} first",
            r + 1,
            d0.name,
            if bare_first {
                "the bare one"
            } else {
                "the operator's"
            }
        );
        rounds.push(
            round(
                &client, &operator, &procs, d0, bare, &version, args.nodes, limit, bare_first,
            )
            .await?,
        );
    }

    let (rss_end, hwm_end) = memory_kib(pid).ok_or("operator gone")?;
    operator.stop().await;
    cluster.stop().await?;

    print_table(&args, &rest, edits, &rounds, rss_end, hwm_end);
    Ok(())
}

/// What the steady state measured: the operator's API requests (all,
/// writes, per driver and minute) and its VmRSS.
struct AtRest {
    per_driver: f64,
    idle_all: f64,
    idle_writes: f64,
    rss_idle: u64,
}

/// Every driver applied at v1, Running on every node, and the operator quiet.
async fn deploy_v1_and_settle(
    args: &Args,
    cluster: &Cluster,
    client: &kube::Client,
    operator: &OperatorProcess,
    drivers: &[FleetDriver],
    limit: Duration,
) -> BenchResult<()> {
    // --- deploy v1 and settle ---------------------------------------------------
    let manifests: String = drivers
        .iter()
        .map(|d| d.yaml("v1", &args.max_unavailable))
        .collect::<Vec<_>>()
        .join("---\n");
    let out = testkit::apply_yaml(cluster, "fleet-v1", &manifests).await?;
    if !out.status.success() {
        return Err(format!("apply: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let deployed = Instant::now();
    eprintln!("{} drivers applied; waiting for them to run", drivers.len());
    fleet::wait_settled(client, drivers, "v1", args.nodes, limit).await?;
    eprintln!("  all Running in {:.0?}", deployed.elapsed());
    operator.wait_quiet(Duration::from_secs(60), limit).await?;
    Ok(())
}

/// 1. The operator's own API requests over `--idle-seconds` at rest.
async fn steady_state(args: &Args, operator: &OperatorProcess, pid: u32) -> BenchResult<AtRest> {
    // --- 1. steady state ------------------------------------------------------------
    eprintln!("steady state: {} s", args.idle_seconds);
    let before = operator.api_requests().await?;
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let after = operator.api_requests().await?;
    let (rss_idle, _) = memory_kib(pid).ok_or("operator gone")?;
    let (idle_all, idle_writes) = (after.all - before.all, after.writes - before.writes);
    let minutes = args.idle_seconds as f64 / 60.0;
    let per_driver = idle_all / args.drivers as f64 / minutes;
    Ok(AtRest {
        per_driver,
        idle_all,
        idle_writes,
        rss_idle,
    })
}

/// 2. `--edits` CR edits, each timed to the operator's next write.
async fn edits_to_first_write(
    args: &Args,
    client: &kube::Client,
    operator: &OperatorProcess,
    drivers: &[FleetDriver],
    limit: Duration,
) -> BenchResult<Vec<Duration>> {
    // --- 2. edit → first write ----------------------------------------------------
    let mut edits = Vec::new();
    for (k, d) in drivers.iter().skip(1).take(args.edits).enumerate() {
        let writes = operator.api_requests().await?.writes;
        let t0 = Instant::now();
        d.patch_spec(client, json!({"rollout": {"stepTimeoutSeconds": 601 + k}}))
            .await?;
        edits.push(operator.next_write(writes, t0).await?);
        operator.wait_quiet(Duration::from_secs(3), limit).await?;
    }
    Ok(edits)
}

/// The table of results on stdout (the edits' times joined by the rounds'
/// first writes).
fn print_table(
    args: &Args,
    rest: &AtRest,
    mut edits: Vec<Duration>,
    rounds: &[Round],
    rss_end: u64,
    hwm_end: u64,
) {
    let AtRest {
        per_driver,
        idle_all,
        idle_writes,
        rss_idle,
    } = *rest;
    // --- the table -------------------------------------------------------------------
    edits.extend(rounds.iter().map(|r| r.first_write));
    edits.sort();
    let median = edits.get(edits.len() / 2).copied().unwrap_or_default();
    let max = edits.last().copied().unwrap_or_default();
    let secs = |f: fn(&Round) -> Duration| rounds.iter().map(|r| f(r).as_secs_f64()).sum::<f64>();
    let (operator_total, bare_total) = (secs(|r| r.operator), secs(|r| r.bare));
    let upgrade_requests: f64 = rounds.iter().map(|r| r.requests.all).sum();
    let upgrade_writes: f64 = rounds.iter().map(|r| r.requests.writes).sum();
    println!(
        "\n{} kwok nodes × {} CSIDriverDeployments, node.maxUnavailable {}\n",
        args.nodes, args.drivers, args.max_unavailable
    );
    println!("| measure | result | target |\n|---|---|---|");
    println!(
        "| operator API requests at rest ({} s) | {:.2} per driver per minute ({:.0} in all: {:.0} GET, {:.0} writes) | ≤ 1 |",
        args.idle_seconds,
        per_driver,
        idle_all,
        idle_all - idle_writes,
        idle_writes
    );
    println!(
        "| CR edit → operator's first write | median {:.0?}, max {:.0?} of {} edits ({} of them upgrades) | |",
        median,
        max,
        edits.len(),
        rounds.len()
    );
    println!(
        "| operator VmRSS (at rest / end), VmHWM | {:.1} / {:.1} MiB, peak {:.1} MiB | ≤ 64 MiB |",
        mib(rss_idle),
        mib(rss_end),
        mib(hwm_end)
    );
    println!(
        "| upgrade wall time: operator / bare DaemonSet, {} rounds | {:.1} s / {:.1} s = {:.2}× | ≤ 1.1× |",
        rounds.len(),
        operator_total,
        bare_total,
        operator_total / bare_total
    );
    let stalls: Vec<Option<&str>> = rounds
        .iter()
        .map(|r| kwok_stalled(&r.operator_cpu, &r.bare_cpu))
        .collect();
    let stalled = stalls.iter().filter(|s| s.is_some()).count();
    if stalled > 0 {
        let (op, bare) = rounds
            .iter()
            .zip(&stalls)
            .filter(|(_, s)| s.is_none())
            .fold((0.0, 0.0), |(o, b), (r, _)| {
                (o + r.operator.as_secs_f64(), b + r.bare.as_secs_f64())
            });
        println!(
            "| the same without the rounds in which kwok stalled ({} of {}, marked below) | {:.1} s / {:.1} s = {:.2}× | ≤ 1.1× |",
            stalled,
            rounds.len(),
            op,
            bare,
            op / bare
        );
    }
    for (i, (r, stall)) in rounds.iter().zip(&stalls).enumerate() {
        let stall = stall.map_or(String::new(), |side| {
            format!(
                "; **kwok stalled** on the {side} side ({:.1} / {:.1} CPU s)",
                r.operator_cpu.of("kwok"),
                r.bare_cpu.of("kwok")
            )
        });
        println!(
            "| round {} ({} first): operator {:.1} s, bare {:.1} s ({:.2}×){stall} | pods on the new template: operator's DaemonSet {} (rolled out at {:.1} s); bare {} | |",
            i + 1,
            if r.bare_first { "bare" } else { "operator" },
            r.operator.as_secs_f64(),
            r.bare.as_secs_f64(),
            r.operator.as_secs_f64() / r.bare.as_secs_f64(),
            r.operator_pods.summary(),
            r.operator_pods.done.unwrap_or_default().as_secs_f64(),
            r.bare_pods.summary()
        );
    }
    for (i, r) in rounds.iter().enumerate() {
        let (operator_marks, bare_marks) = r.where_time_goes(&format!("v{}", i + 2));
        println!(
            "| round {}, seconds after the edit (watched) | operator: {operator_marks}; bare: {bare_marks} | |",
            i + 1
        );
    }
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "| round {}, CPU seconds during the operator's upgrade / the bare rollout | {} | |",
            i + 1,
            cpu_pairs(&r.operator_cpu, &r.bare_cpu)
        );
    }
    let sum = |f: fn(&Round) -> &CpuSample| {
        rounds
            .iter()
            .map(f)
            .fold(CpuSample::default(), |mut all, s| {
                all.add(s);
                all
            })
    };
    println!(
        "| all rounds, CPU seconds during the operator's upgrades / the bare rollouts | {} | |",
        cpu_pairs(&sum(|r| &r.operator_cpu), &sum(|r| &r.bare_cpu))
    );
    println!(
        "| operator API requests during the upgrades | {:.0} ({:.0} writes), {:.1} a second | |",
        upgrade_requests,
        upgrade_writes,
        upgrade_requests / operator_total
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kwok(secs: f64) -> CpuSample {
        CpuSample {
            processes: vec![("operator".into(), 2.0), ("kwok".into(), secs)],
            ..CpuSample::default()
        }
    }

    /// kwok's CPU on both sides of rounds measured on 2026-11-29 (session
    /// 23): three stalls among rounds that stayed within 1.4×.
    #[test]
    fn a_round_is_stalled_when_kwok_burns_twice_the_other_sides_cpu() {
        assert_eq!(
            kwok_stalled(&kwok(110.25), &kwok(10.21)),
            Some("operator's")
        );
        assert_eq!(kwok_stalled(&kwok(59.04), &kwok(10.09)), Some("operator's"));
        assert_eq!(kwok_stalled(&kwok(8.07), &kwok(21.60)), Some("bare"));
        for (op, bare) in [(12.35, 8.93), (10.62, 12.39), (8.53, 7.18), (7.13, 7.43)] {
            assert_eq!(kwok_stalled(&kwok(op), &kwok(bare)), None, "{op} / {bare}");
        }
    }
}
