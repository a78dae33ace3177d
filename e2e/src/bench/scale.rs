//! `csiops-bench-scale`: the controller sidecars and the registrar at
//! cluster scale, ours and upstream's side by side in one run (issue 39).
//!
//! One control plane with kwok nodes and one `csi-test-driver --in-memory`
//! (CreateVolume answers after `--create-delay`, 50 ms by default) for the
//! measures on N existing volumes:
//!
//! 1. [`steady`]: N claims Bound to their PVs and N VolumeAttachments
//!    attached on the kwok nodes, laid out through the API as a long-running
//!    cluster has them ([`objects::BoundSet`]); then each side's provisioner,
//!    then its attacher, alone, settles and rests: RSS, requests a minute,
//!    CPU seconds a minute.
//! 2. [`failover`]: two replicas with leader election; the leader is
//!    killed (SIGKILL: the standby waits out the Lease, or the same replica
//!    restarts) or stopped (SIGTERM: it releases the Lease) and a new claim
//!    (a new VolumeAttachment) created: time to the new leader's Lease, its
//!    first PV (attach), the claim Bound, the requests it made before, its
//!    peak RSS.
//! 3. [`registrar`]: CSINodes of many nodes; a node's registrar restarted:
//!    the lists it made and the objects they returned.
//!
//! Around the layout, [`operator`]: the operator reconciles a
//! CSIDriverDeployment of the bench's driver before the N volumes exist,
//! while they are laid out and restarted beside them: its requests and
//! RSS, which must not grow with the volumes.
//!
//! Then [`burst`], on a fresh control plane per side (so neither side's
//! caches hold the other's 50,000 claims): M claims created at once, RSS
//! and claims Bound over time, and the latency of another client's GETs.
//!
//! [`objects::BoundSet`]: super::objects::BoundSet

pub mod burst;
pub mod failover;
pub mod operator;
pub mod registrar;
pub mod steady;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::objects::{self, BoundSet};
use super::sidecar::{self, Flags, Role, Side};
use crate::process::ManagedProcess;
use crate::testdriver::test_driver_bin;
use crate::{apimetrics, free_port, sidecar_bin, Cluster, ClusterOptions, Error, Result};

/// The driver name of the bench (the same for both sides: they take
/// turns on the same objects).
pub const DRIVER: &str = "scale.bench.csiops.dev";
/// The StorageClass of the bench's claims.
pub const CLASS: &str = "scale";

#[derive(clap::Parser, Debug, Clone)]
pub struct Args {
    /// Bound volumes (claims, PVs, attached VolumeAttachments) for the
    /// steady state and the failover.
    #[arg(long, env = "BENCH_VOLUMES", default_value_t = 10_000)]
    pub volumes: usize,
    /// Claims created at once in the burst (0: no burst).
    #[arg(long, env = "BENCH_BURST_CLAIMS", default_value_t = 50_000)]
    pub burst_claims: usize,
    /// CSINodes (nodes' worth) for the registrar's restart (0: skip it).
    #[arg(long, default_value_t = 10_000)]
    pub csinodes: usize,
    /// kwok nodes the VolumeAttachments are spread over.
    #[arg(long, default_value_t = 20)]
    pub nodes: usize,
    /// Upstream csi-provisioner binary.
    #[arg(long, env = "UPSTREAM_PROVISIONER")]
    pub upstream_provisioner: Option<PathBuf>,
    /// Upstream csi-attacher binary.
    #[arg(long, env = "UPSTREAM_ATTACHER")]
    pub upstream_attacher: Option<PathBuf>,
    /// Upstream csi-node-driver-registrar binary.
    #[arg(long, env = "UPSTREAM_REGISTRAR")]
    pub upstream_registrar: Option<PathBuf>,
    /// `--kube-api-qps` of every sidecar.
    #[arg(long, default_value_t = 200.0)]
    pub qps: f64,
    /// `--kube-api-burst` of every sidecar.
    #[arg(long, default_value_t = 400)]
    pub burst: u32,
    /// `--worker-threads` of every sidecar.
    #[arg(long, default_value_t = 100)]
    pub workers: usize,
    /// CreateVolume's delay in the driver.
    #[arg(long, default_value = "50ms")]
    pub create_delay: String,
    /// Seconds a sidecar is given to settle before it is measured at rest
    /// (default: 20 + 2 per 1000 volumes).
    #[arg(long)]
    pub settle: Option<u64>,
    /// Seconds at rest measured.
    #[arg(long, default_value_t = 60)]
    pub rest: u64,
    /// Give up a burst after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub burst_timeout: u64,
    /// A burst is stalled when no claim got Bound for this many seconds.
    #[arg(long, default_value_t = 120)]
    pub stall: u64,
    /// Seconds between two samples of the burst's timeline.
    #[arg(long, default_value_t = 5)]
    pub sample_every: u64,
    /// How the failover's leader ends: crash (SIGKILL, the standby waits
    /// out the Lease), restart (SIGKILL and the same replica started
    /// again, as kubelet restarts a container), release (SIGTERM).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "crash,restart,release"
    )]
    pub failovers: Vec<failover::How>,
    /// The measures to run (operator, steady, failover, registrar, burst).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "operator,steady,failover,registrar,burst"
    )]
    pub phases: Vec<String>,
}

impl Args {
    fn settle(&self) -> Duration {
        Duration::from_secs(self.settle.unwrap_or(20 + 2 * self.volumes as u64 / 1000))
    }

    fn runs(&self, phase: &str) -> bool {
        self.phases.iter().any(|p| p == phase)
    }

    /// The sides of `role`: ours, and upstream's when given.
    fn sides(&self, role: Role) -> Result<Vec<Side>> {
        let up = match role {
            Role::Provisioner => &self.upstream_provisioner,
            Role::Attacher => &self.upstream_attacher,
        };
        let mut v = vec![Side::ours(sidecar_bin()?)];
        v.extend(given(up).map(Side::upstream));
        Ok(v)
    }
}

/// A path flag given and not empty (the Makefile passes empty ones).
fn given(p: &Option<PathBuf>) -> Option<PathBuf> {
    p.clone().filter(|p| !p.as_os_str().is_empty())
}

/// The resources the sidecars read and write: the API server's requests
/// to them are what a sidecar costs it (the bench's own are subtracted
/// where it makes any).
pub const RESOURCES: &[&str] = &[
    "persistentvolumes",
    "persistentvolumeclaims",
    "volumeattachments",
    "csinodes",
    "nodes",
    "storageclasses",
    "volumeattributesclasses",
    "csidrivers",
    "configmaps",
    "events",
    "leases",
];

/// The API server's request counters by verb over [`RESOURCES`] (Leases
/// apart: kwok renews every node's), and the objects its lists returned.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ApiCount {
    pub list: f64,
    pub get: f64,
    pub watch: f64,
    pub writes: f64,
    pub leases: f64,
    pub listed_objects: f64,
}

impl ApiCount {
    pub async fn take(client: &kube::Client) -> Result<ApiCount> {
        Ok(ApiCount::parse(&apimetrics::text(client).await?))
    }

    fn parse(text: &str) -> ApiCount {
        let by = |verbs: &[&str], lease: bool| {
            apimetrics::sum_where(text, "apiserver_request_total", |l| {
                let r = l.get("resource");
                RESOURCES.contains(&r) && (r == "leases") == lease && verbs.contains(&l.get("verb"))
            })
        };
        ApiCount {
            list: by(&["LIST"], false),
            get: by(&["GET"], false),
            watch: by(&["WATCH"], false),
            writes: by(
                &["POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION"],
                false,
            ),
            leases: by(&["GET", "PUT", "POST", "PATCH", "LIST", "WATCH"], true),
            listed_objects: listed_objects(text, RESOURCES),
        }
    }

    pub fn since(&self, before: &ApiCount) -> ApiCount {
        ApiCount {
            list: self.list - before.list,
            get: self.get - before.get,
            watch: self.watch - before.watch,
            writes: self.writes - before.writes,
            leases: self.leases - before.leases,
            listed_objects: self.listed_objects - before.listed_objects,
        }
    }

    /// Every request but the Leases'.
    pub fn total(&self) -> f64 {
        self.list + self.get + self.watch + self.writes
    }
}

/// The objects kube-apiserver's lists of `resources` returned, from its
/// watch cache and from etcd.
fn listed_objects(text: &str, resources: &[&str]) -> f64 {
    let listed = |name| {
        apimetrics::sum_where(text, name, |l| {
            let r = l.get("resource_prefix").trim_start_matches('/');
            let r = if r.is_empty() { l.get("resource") } else { r };
            resources
                .iter()
                .any(|x| r == *x || r.starts_with(&format!("{x}.")))
        })
    };
    listed("apiserver_cache_list_returned_objects_total")
        + listed("apiserver_storage_list_returned_objects_total")
}

/// The shared bed of the steady-state, failover and registrar measures.
pub struct Bed {
    pub cluster: Cluster,
    pub client: kube::Client,
    pub set: BoundSet,
    pub socket: PathBuf,
    pub dir: PathBuf,
    _driver: ManagedProcess,
    /// Seconds it took to lay the objects out, and until all were Bound.
    pub laid_out: Duration,
}

/// Volumes of the driver kept unpublished for the failovers' new attachments.
const EXTRA_VOLUMES: usize = 16;

impl Bed {
    /// The control plane, the driver, the nodes registered and the class;
    /// no volume yet ([`Bed::lay_out`]).
    async fn start(args: &Args) -> Result<Bed> {
        let cluster = Cluster::start(ClusterOptions::kwok(args.nodes)).await?;
        let client = cluster.client()?;
        let dir = cluster.work_dir().join("scale");
        std::fs::create_dir_all(&dir).map_err(|e| Error::Other(e.to_string()))?;
        let nodes = cluster.node_names().to_vec();
        let set = BoundSet {
            driver: DRIVER.into(),
            class: CLASS.into(),
            namespace: "default".into(),
            prefix: "steady".into(),
            count: args.volumes,
            nodes: nodes.clone(),
        };
        set.write_driver_state(&dir.join("state"), EXTRA_VOLUMES)?;
        let socket = dir.join("csi.sock");
        let driver = start_driver(&dir, &socket, args, true).await?;
        register_nodes(&client, &nodes).await?;
        objects::storage_class(&client, CLASS, DRIVER).await?;
        Ok(Bed {
            cluster,
            client,
            set,
            socket,
            dir,
            _driver: driver,
            laid_out: Duration::ZERO,
        })
    }

    /// The N bound claims, PVs and attached VolumeAttachments.
    async fn lay_out(&mut self, args: &Args) -> Result<()> {
        let t0 = Instant::now();
        eprintln!(
            "laying out {} bound claims, PVs and attachments",
            args.volumes
        );
        self.set.create(&self.client).await?;
        wait_all_bound(&self.client, &self.set).await?;
        self.laid_out = t0.elapsed();
        eprintln!("laid out and Bound in {:.0}s", self.laid_out.as_secs_f64());
        Ok(())
    }

    fn flags(&self, args: &Args, leader_election: bool) -> Result<Flags> {
        Ok(Flags {
            socket: self.socket.clone(),
            kubeconfig: self.cluster.kubeconfig_path().to_path_buf(),
            qps: args.qps,
            burst: args.burst,
            workers: args.workers,
            timeout: "15s".into(),
            leader_election,
            http_port: free_port()?,
        })
    }
}

/// The nodes as the registrar leaves them: the driver's topology label
/// (its value the node's name) and CSINode entry.
async fn register_nodes(client: &kube::Client, nodes: &[String]) -> Result<()> {
    use crate::testdriver::config::DEFAULT_TOPOLOGY_KEY;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    for node in nodes {
        let labels = serde_json::json!({"metadata": {"labels": {DEFAULT_TOPOLOGY_KEY: node}}});
        api.patch(node, &PatchParams::default(), &Patch::Merge(&labels))
            .await?;
        crate::attach::register_driver(client, node, DRIVER, node, &[DEFAULT_TOPOLOGY_KEY]).await?;
    }
    Ok(())
}

/// `csi-test-driver --in-memory` for [`DRIVER`] on `socket`, with
/// `--enable-attach` when `attach`.
async fn start_driver(
    dir: &Path,
    socket: &Path,
    args: &Args,
    attach: bool,
) -> Result<ManagedProcess> {
    let mut argv = vec![
        format!("--endpoint={}", socket.display()),
        format!("--state-dir={}", dir.join("state").display()),
        "--in-memory".to_string(),
        format!("--drivername={DRIVER}"),
        "--nodeid=controller".to_string(),
        "--capacity=1000Ti".to_string(),
        format!("--delay=CreateVolume={}", args.create_delay),
    ];
    if attach {
        argv.push("--enable-attach".into());
    }
    let p = ManagedProcess::spawn(
        "csi-test-driver",
        &test_driver_bin()?,
        &argv,
        &dir.join("driver.log"),
    )?;
    crate::wait_for(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { socket.exists().then_some(()) },
    )
    .await
    .map_err(|_| {
        Error::Other(format!(
            "csi-test-driver made no socket\n{}",
            p.log_tail(20)
        ))
    })?;
    Ok(p)
}

/// Until every claim of `set` is Bound (kube-controller-manager binds the
/// laid-out pairs).
async fn wait_all_bound(client: &kube::Client, set: &BoundSet) -> Result<()> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let api: kube::Api<PersistentVolumeClaim> =
        kube::Api::namespaced(client.clone(), &set.namespace);
    let prefix = format!("{}-", set.prefix);
    let t0 = Instant::now();
    loop {
        let bound = api
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .filter(|c| objects::is_bound(c))
            .count();
        if bound >= set.count {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(900) {
            return Err(Error::Other(format!(
                "{bound}/{} laid-out claims Bound after 900s",
                set.count
            )));
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// Prints a measure's table as soon as it is done: a later failure keeps it.
fn emit(section: &str) {
    use std::io::Write;
    println!("{section}");
    let _ = std::io::stdout().flush();
}

/// Until a replica whose host name starts with `prefix` holds `lease`.
pub(crate) async fn until_holder(client: &kube::Client, lease: &str, prefix: &str) -> Result<()> {
    crate::wait_for(
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async {
            sidecar::holder(client, lease)
                .await
                .ok()
                .flatten()
                .filter(|h| h.starts_with(prefix))
        },
    )
    .await
    .map_err(|_| Error::Other(format!("{prefix} never held Lease {lease}")))?;
    Ok(())
}

/// Runs the chosen measures and prints their tables.
pub async fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    if ["operator", "steady", "failover", "registrar"]
        .iter()
        .any(|p| args.runs(p))
    {
        let mut bed = Bed::start(&args).await?;
        let operator = match args.runs("operator") {
            true => Some(operator::before_layout(&bed, &args).await?),
            false => None,
        };
        bed.lay_out(&args).await?;
        emit(&format!(
            "{} Bound claims with their PVs and {} attached VolumeAttachments on {} kwok nodes (laid out and Bound in {:.0} s); QPS {} / burst {}, {} workers\n\n",
            args.volumes, args.volumes, args.nodes, bed.laid_out.as_secs_f64(), args.qps, args.burst, args.workers
        ));
        if let Some(before) = operator {
            emit(&operator::after_layout(&bed, &args, before).await?);
        }
        if args.runs("steady") {
            emit(&steady::run(&bed, &args).await?);
        }
        if args.runs("failover") {
            emit(&failover::run(&bed, &args).await?);
        }
        if args.runs("registrar") && args.csinodes > 0 {
            emit(&registrar::run(&bed, &args).await?);
        }
        bed.cluster.stop().await?;
    }
    if args.runs("burst") && args.burst_claims > 0 {
        emit(&burst::run(&args).await?);
    }
    eprintln!("bench took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// A table row's "no upstream" line, when no upstream binary was given.
fn no_upstream(role: &str, flag: &str) -> String {
    format!("| upstream {role} | not run: no `{flag}` given |\n")
}

/// Starts `side`'s `role` alone against the bed.
fn spawn_on(
    bed: &Bed,
    side: &Side,
    role: Role,
    flags: &Flags,
    replica: Option<&str>,
) -> Result<ManagedProcess> {
    let log = bed.dir.join(format!(
        "{}-{}{}.log",
        side.name,
        role.subcommand(),
        replica.map_or(String::new(), |r| format!("-{r}"))
    ));
    sidecar::spawn(side, role, flags, replica, &log)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_count_splits_verbs_and_leases() {
        let text = r#"apiserver_request_total{code="200",resource="persistentvolumes",scope="cluster",verb="LIST"} 2
apiserver_request_total{code="200",resource="persistentvolumes",scope="resource",verb="GET"} 5
apiserver_request_total{code="201",resource="configmaps",scope="namespace",verb="POST"} 1
apiserver_request_total{code="200",resource="leases",scope="resource",verb="PUT"} 40
apiserver_request_total{code="200",resource="pods",scope="cluster",verb="LIST"} 9
apiserver_cache_list_returned_objects_total{resource_prefix="/persistentvolumes"} 10000
apiserver_cache_list_returned_objects_total{resource_prefix="/pods"} 7
"#;
        let c = ApiCount::parse(text);
        assert_eq!(c.list, 2.0);
        assert_eq!(c.get, 5.0);
        assert_eq!(c.writes, 1.0);
        assert_eq!(c.leases, 40.0);
        assert_eq!(c.listed_objects, 10000.0);
        assert_eq!(c.total(), 8.0);
    }
}
