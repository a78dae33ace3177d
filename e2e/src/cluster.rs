//! A real control plane on 127.0.0.1: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kwok as local processes, and
//! optionally real nodes (containerd, kubelet, kube-proxy each; see
//! [`crate::realnode`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::realnode::{self, HostNetwork, ImageSet, NodeEnv, RealNode, RealNodes};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::bins;
use crate::components;
use crate::error::{io, Error, Result};
use crate::kwok;
use crate::operator::OperatorProcess;
use crate::process::{self, ManagedProcess, DEFAULT_GRACE};
use crate::workdir::{Ports, WorkDir};

mod upgrade;
pub use upgrade::{kubelet_version, Replaced, CONTROL_PLANE_ORDER};

/// How long `Cluster::start` may take before it gives up with the log tails.
/// Override with `CSIOPS_E2E_START_TIMEOUT_SECS` (slow CI machines).
pub const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Start attempts when a picked port was taken by someone else meanwhile.
const START_ATTEMPTS: usize = 3;

/// Poll interval of the readiness checks.
const POLL: Duration = Duration::from_millis(200);

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of kwok-simulated Nodes, `kwok-node-0..N-1`.
    pub nodes: usize,
    /// One real node ([`realnode::NODE_NAME`]) running the images of
    /// `make images`; the kwok Nodes then carry [`kwok::SIMULATED_TAINT`].
    /// Needs root and the packages of `make node-prereqs`;
    /// without them `start` fails saying what is missing. One real node runs
    /// on a machine at a time: a second cluster asking for one waits.
    pub real_node: bool,
    /// Taints the real node registers with (kubelet's
    /// `--register-with-taints`, `key[=value]:Effect`).
    pub real_node_taints: Vec<String>,
    /// Feature gates set on kube-apiserver and the real node's kubelet
    /// (`--feature-gates`, KubeletConfiguration `featureGates`), e.g.
    /// [`ALLOCATABLE_COUNT_GATE`]. Empty: the pinned release's defaults, as
    /// on a stock cluster.
    pub feature_gates: Vec<(&'static str, bool)>,
    /// How kwok plays the simulated nodes (heartbeats, pod stages).
    pub simulation: kwok::Simulation,
    /// How many real nodes when `real_node` is set (default 1): node 0,
    /// [`realnode::NODE_NAME`], in the host's network namespace, and
    /// `csiops-node-1`, … each in its own (see [`realnode::config`]).
    pub real_node_count: usize,
    /// More OCI archives to import into every real node's containerd (the
    /// storage e2e suite's images).
    pub extra_images: Vec<PathBuf>,
    /// The bin dir to run the control plane and the real nodes from: an
    /// older minor's (`CSIOPS_K8S_MINOR=1.36 e2e/cluster-bins/build.sh`) for
    /// a cluster that is then upgraded ([`Cluster::upgrade_control_plane`]).
    /// `None`: [`bins::bin_dir`], the pinned release.
    pub bin_dir: Option<PathBuf>,
}

/// KEP-4876's gate (beta and on by default in Kubernetes 1.35, GA and
/// locked on from 1.36; named so that a test needing it says so): with it,
/// kube-apiserver stores `CSIDriver.spec.nodeAllocatableUpdatePeriodSeconds`
/// and lets `CSINode` `allocatable.count` change, and kubelet updates the
/// count from NodeGetInfo.
pub const ALLOCATABLE_COUNT_GATE: (&str, bool) = ("MutableCSINodeAllocatableCount", true);

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nodes: 3,
            real_node: false,
            real_node_taints: Vec::new(),
            feature_gates: Vec::new(),
            simulation: kwok::Simulation::DEFAULT,
            real_node_count: 1,
            extra_images: Vec::new(),
            bin_dir: None,
        }
    }
}

impl ClusterOptions {
    /// `nodes` kwok nodes and no real node.
    pub fn kwok(nodes: usize) -> ClusterOptions {
        ClusterOptions {
            nodes,
            ..ClusterOptions::default()
        }
    }
}

/// A running local cluster. Dropping it (or [`Cluster::stop`]) kills every
/// process and removes its temp dir; set `CSIOPS_E2E_KEEP=1` to keep the dir
/// (logs, certs, kubeconfig) for a post-mortem.
pub struct Cluster {
    /// `None` once stopped.
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    bin_dir: PathBuf,
    kubeconfig: PathBuf,
    logs: PathBuf,
    config: kube::Config,
    api_port: u16,
    /// Where the apiserver listens (127.0.0.1, or the real node's bridge address).
    host: Ipv4Addr,
    nodes: Vec<String>,
    /// In start order; etcd first.
    procs: Vec<ManagedProcess>,
    /// The arguments each of `procs` was started with, by name: an upgrade
    /// starts the new binary with the same ones.
    args: BTreeMap<String, Vec<String>>,
    /// The ports the control plane listens on (its health endpoints).
    ports: Ports,
    real: Option<RealNodes>,
    started_in: Duration,
    operator_runs: AtomicUsize,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("root", &self.root)
            .field("api_port", &self.api_port)
            .field("nodes", &self.nodes)
            .field("pids", &self.pids())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Starts a cluster and waits until the apiserver is ready, the `default`
    /// ServiceAccount exists (so Pods can be created) and all Nodes are Ready.
    pub async fn start(opts: ClusterOptions) -> Result<Cluster> {
        let chosen = opts.bin_dir.clone();
        let bin_dir = blocking("resolving the bin dir", move || match chosen {
            Some(dir) => bins::checked_bin_dir(dir),
            None => bins::bin_dir(),
        })
        .await?;
        // Before the start deadline: a cold image build takes minutes.
        let images = if opts.real_node {
            let extra = opts.extra_images.clone();
            Some(
                blocking("resolving images", move || {
                    Ok(ImageSet::resolve()?.with_extra(extra))
                })
                .await?,
            )
        } else {
            None
        };
        let mut attempt = 1;
        loop {
            match Cluster::start_once(&opts, &bin_dir, images.clone()).await {
                Err(e) if attempt < START_ATTEMPTS && is_port_conflict(&e) => {
                    tracing::warn!(
                        attempt,
                        "port conflict while starting the cluster, retrying: {e}"
                    );
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    async fn start_once(
        opts: &ClusterOptions,
        bin_dir: &Path,
        images: Option<ImageSet>,
    ) -> Result<Cluster> {
        let timeout = std::env::var("CSIOPS_E2E_START_TIMEOUT_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(START_TIMEOUT);

        // The bridge exists before the apiserver, which listens on it. Its
        // creation waits for the machine-wide real-node lock, as long as
        // another test's real node runs: the start deadline counts from when
        // the lock is held, or a test queued behind another one times out
        // before its etcd even starts.
        let net = match images {
            Some(_) => {
                let count = opts.real_node_count;
                Some(
                    blocking("creating the real nodes' network", move || {
                        HostNetwork::create(count)
                    })
                    .await?,
                )
            }
            None => None,
        };
        let t0 = Instant::now();
        let deadline = t0 + timeout;
        let host = if net.is_some() {
            realnode::HOST_IP
        } else {
            Ipv4Addr::LOCALHOST
        };
        let w = WorkDir::create(host)?;
        let config = kube::Config::from_custom_kubeconfig(
            Kubeconfig::read_from(&w.kubeconfig)?,
            &KubeConfigOptions::default(),
        )
        .await?;
        let (etcd, apiserver, kcm, scheduler) = (
            components::etcd(&w),
            components::kube_apiserver(&w, &opts.feature_gates),
            components::kube_controller_manager(&w, opts.simulation.grace_seconds),
            components::kube_scheduler(&w),
        );
        let stages = kwok::stages_file(bin_dir, &w.root, opts.simulation)?;
        let kwok_args = kwok::args(&w.kubeconfig, &stages, opts.simulation);
        let etcd_port = w.ports.etcd_client;

        let mut cluster = Cluster {
            root: w.root.clone(),
            bin_dir: bin_dir.to_path_buf(),
            kubeconfig: w.kubeconfig.clone(),
            logs: w.logs.clone(),
            config,
            api_port: w.ports.apiserver,
            host,
            nodes: (0..opts.nodes).map(kwok::node_name).collect(),
            procs: Vec::new(),
            args: BTreeMap::new(),
            ports: w.ports,
            real: None,
            started_in: Duration::ZERO,
            operator_runs: AtomicUsize::new(0),
            dir: Some(w.dir),
        };

        cluster.spawn("etcd", etcd)?;
        cluster
            .poll_until("etcd to accept connections", deadline, || async {
                TcpStream::connect_timeout(
                    &SocketAddr::from((Ipv4Addr::LOCALHOST, etcd_port)),
                    POLL,
                )
                .map(drop)
                .map_err(|e| format!("connect: {e}"))
            })
            .await?;

        cluster.spawn("kube-apiserver", apiserver)?;
        let client = cluster.client()?;
        cluster
            .poll_until("kube-apiserver /readyz", deadline, || {
                health_ok(&client, "/readyz")
            })
            .await?;

        // Started only now: both exit if the apiserver stays unreachable
        // for long, and they would only fill their logs with retries.
        cluster.spawn("kube-controller-manager", kcm)?;
        cluster.spawn("kube-scheduler", scheduler)?;
        cluster.spawn("kwok", kwok_args)?;

        let nodes_api: Api<Node> = Api::all(client.clone());
        for name in &cluster.nodes {
            nodes_api
                .create(&PostParams::default(), &kwok::node(name, opts.real_node))
                .await?;
        }

        let sa_api: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        cluster
            .poll_until(
                "the default ServiceAccount (kube-controller-manager)",
                deadline,
                || async {
                    match sa_api.get_opt("default").await {
                        Ok(Some(_)) => Ok(()),
                        Ok(None) => Err("not created yet".into()),
                        Err(e) => Err(e.to_string()),
                    }
                },
            )
            .await?;

        let want = cluster.nodes.len();
        let selector = format!("{}={}", kwok::NODE_TYPE_LABEL.0, kwok::NODE_TYPE_LABEL.1);
        cluster
            .poll_until("all kwok Nodes Ready", deadline, || async {
                let list = nodes_api
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = list.items.iter().filter(|n| kwok::node_ready(n)).count();
                if ready == want {
                    Ok(())
                } else {
                    Err(format!("{ready}/{want} Ready"))
                }
            })
            .await?;

        if let (Some(net), Some(images)) = (net, images) {
            cluster
                .start_real_nodes(net, images, opts, deadline)
                .await?;
        }

        cluster.started_in = t0.elapsed();
        tracing::info!(
            dir = %cluster.root.display(),
            api = %cluster.api_url(),
            took = ?cluster.started_in,
            "cluster ready"
        );
        Ok(cluster)
    }

    async fn start_real_nodes(
        &mut self,
        net: HostNetwork,
        images: ImageSet,
        opts: &ClusterOptions,
        deadline: Instant,
    ) -> Result<()> {
        let env = NodeEnv {
            cluster_root: self.root.clone(),
            bin_dir: self.bin_dir.clone(),
            kubeconfig: self.kubeconfig.clone(),
            logs: self.logs.clone(),
            feature_gates: opts.feature_gates.clone(),
        };
        let taints = opts.real_node_taints.clone();
        let nodes = blocking("starting the real nodes", move || {
            RealNodes::start(net, env, images, taints)
        })
        .await?;
        let names: Vec<String> = nodes.nodes().iter().map(RealNode::name).collect();
        self.real = Some(nodes);
        let nodes_api: Api<Node> = Api::all(self.client()?);
        for name in names {
            self.poll_until(&format!("the real node {name} Ready"), deadline, || async {
                match nodes_api.get_opt(&name).await {
                    Ok(Some(n)) if kwok::node_ready(&n) => Ok(()),
                    Ok(Some(_)) => Err("registered, not Ready".into()),
                    Ok(None) => Err("not registered yet".into()),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await?;
        }
        Ok(())
    }

    /// The first real node ([`realnode::NODE_NAME`]), if the cluster was
    /// started with real nodes.
    pub fn real_node(&self) -> Option<&RealNode> {
        self.real.as_ref().and_then(|r| r.nodes().first())
    }

    /// The first real node, to restart its kubelet.
    pub fn real_node_mut(&mut self) -> Option<&mut RealNode> {
        self.real_node_at_mut(0)
    }

    /// Real node `index` (0: [`realnode::NODE_NAME`]), to restart or
    /// upgrade its kubelet.
    pub fn real_node_at_mut(&mut self, index: usize) -> Option<&mut RealNode> {
        self.real.as_mut().and_then(|r| r.node_mut(index))
    }

    /// Every real node, node 0 first.
    pub fn real_nodes(&self) -> Option<&RealNodes> {
        self.real.as_ref()
    }

    fn spawn(&mut self, name: &str, args: Vec<String>) -> Result<()> {
        let program = self.bin_dir.join(name);
        let log = self.logs.join(format!("{name}.log"));
        self.procs
            .push(ManagedProcess::spawn(name, &program, &args, &log)?);
        self.args.insert(name.to_string(), args);
        Ok(())
    }

    /// Polls `check` until it succeeds, failing fast if any process died and
    /// with every log tail at the deadline. `check`'s error is the last
    /// observation, quoted in the timeout error.
    async fn poll_until<T, F, Fut>(
        &mut self,
        what: &str,
        deadline: Instant,
        mut check: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        let started = Instant::now();
        loop {
            self.check_running()?;
            let last = match check().await {
                Ok(v) => {
                    tracing::debug!(what, took = ?started.elapsed(), "ready");
                    return Ok(v);
                }
                Err(last) => last,
            };
            if Instant::now() >= deadline {
                self.check_running()?;
                return Err(Error::Timeout {
                    what: what.to_string(),
                    after: started.elapsed(),
                    last: format!(" (last: {last})"),
                    logs: self.log_tails(30),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// `Err(ProcessExited)` with its log tail if any cluster process died.
    pub fn check_running(&mut self) -> Result<()> {
        self.procs
            .iter_mut()
            .try_for_each(ManagedProcess::check_running)?;
        match self.real.as_mut() {
            Some(node) => node.check_running(),
            None => Ok(()),
        }
    }

    /// The last `lines` lines of every process log, one section each.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut tails: String = self
            .procs
            .iter()
            .map(|p| {
                format!(
                    "--- {} ({}) ---\n{}\n",
                    p.name(),
                    p.log_path().display(),
                    p.log_tail(lines)
                )
            })
            .collect();
        if let Some(node) = &self.real {
            tails.push_str(&node.log_tails(lines));
        }
        tails
    }

    /// A new client for the cluster (admin, `system:masters`). Cheap; make
    /// one per runtime, since a client is bound to the runtime it was made in.
    pub fn client(&self) -> Result<kube::Client> {
        Ok(kube::Client::try_from(self.config.clone())?)
    }

    /// The API server's minor version (`37` for v1.37.2), for tests whose
    /// expectations differ across the supported minors.
    pub async fn server_minor(&self) -> Result<u32> {
        let info = self.client()?.apiserver_version().await?;
        info.minor
            .trim_end_matches('+')
            .parse()
            .map_err(|_| Error::Other(format!("API server minor {:?} is no number", info.minor)))
    }

    /// The client configuration behind [`Cluster::client`].
    pub fn kube_config(&self) -> &kube::Config {
        &self.config
    }

    /// The kubeconfig file (admin token, CA by path, namespace `default`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://<host>:<port>`: 127.0.0.1, or the bridge address with a real node.
    pub fn api_url(&self) -> String {
        format!("https://{}:{}", self.host, self.api_port)
    }

    /// The cluster's temp dir; tests may put their own files (sockets, logs) here.
    pub fn work_dir(&self) -> &Path {
        &self.root
    }

    /// Where the process logs are (`<name>.log`).
    pub fn log_dir(&self) -> &Path {
        &self.logs
    }

    /// The bin dir the cluster was started from (kwok, and the real nodes'
    /// kube-proxy, keep running from it after an upgrade).
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The simulated Nodes, `kwok-node-0..N-1`.
    pub fn node_names(&self) -> &[String] {
        &self.nodes
    }

    /// (name, pid) of every cluster process.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.procs
            .iter()
            .map(|p| (p.name().to_string(), p.pid()))
            .collect()
    }

    /// How long `start` took until everything was ready.
    pub fn startup_time(&self) -> Duration {
        self.started_in
    }

    /// Runs the machine's `kubectl` (or `$KUBECTL`) against this cluster.
    pub async fn kubectl<I, S>(&self, args: I) -> Result<std::process::Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
        let mut cmd = std::process::Command::new(&kubectl);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(std::process::Stdio::null());
        // std's Command on the blocking pool rather than tokio's: tokio's
        // "process" feature would change the workspace-wide tokio build.
        tokio::task::spawn_blocking(move || cmd.output())
            .await
            .map_err(|e| Error::Other(format!("kubectl task: {e}")))?
            .map_err(io("running", PathBuf::from(kubectl)))
    }

    /// [`Cluster::kubectl`], failing on a non-zero exit; returns stdout.
    pub async fn kubectl_ok<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let args: Vec<_> = args
            .into_iter()
            .map(|a| a.as_ref().to_os_string())
            .collect();
        let out = self.kubectl(&args).await?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "kubectl {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `csiops-operator` against this cluster (see [`bins::operator_bin`]).
    pub fn run_operator(&self, operator_bin: &Path) -> Result<OperatorProcess> {
        self.run_operator_with(operator_bin, &[])
    }

    /// [`Cluster::run_operator`] with extra flags appended.
    pub fn run_operator_with(
        &self,
        operator_bin: &Path,
        extra_args: &[String],
    ) -> Result<OperatorProcess> {
        let n = self.operator_runs.fetch_add(1, Ordering::Relaxed);
        let log = self.log_dir().join(format!("csiops-operator-{n}.log"));
        OperatorProcess::spawn(operator_bin, &self.kubeconfig, &log, extra_args)
    }

    /// Starts `csiops-operator` as the ServiceAccount `namespace/name`: the
    /// admin credentials impersonate it (user and the groups the API server
    /// gives a ServiceAccount), so every call the operator makes is
    /// authorized by that account's RBAC alone (apply install.yaml's RBAC
    /// first: [`crate::testkit::install_operator_rbac`]).
    pub fn run_operator_as(
        &self,
        operator_bin: &Path,
        namespace: &str,
        name: &str,
        extra_args: &[String],
    ) -> Result<OperatorProcess> {
        let kubeconfig = self.impersonating_kubeconfig(namespace, name)?;
        let n = self.operator_runs.fetch_add(1, Ordering::Relaxed);
        let log = self.log_dir().join(format!("csiops-operator-{n}.log"));
        OperatorProcess::spawn(operator_bin, &kubeconfig, &log, extra_args)
    }

    /// A copy of the admin kubeconfig that impersonates the ServiceAccount
    /// `namespace/name`; its path.
    pub fn impersonating_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf> {
        let mut config = Kubeconfig::read_from(&self.kubeconfig)?;
        for named in &mut config.auth_infos {
            if let Some(auth) = named.auth_info.as_mut() {
                auth.impersonate = Some(format!("system:serviceaccount:{namespace}:{name}"));
                auth.impersonate_groups = Some(vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{namespace}"),
                    "system:authenticated".into(),
                ]);
            }
        }
        let path = self.root.join(format!("kubeconfig-{namespace}-{name}"));
        let yaml = serde_yaml::to_string(&config)
            .map_err(|e| Error::Other(format!("serializing a kubeconfig: {e}")))?;
        std::fs::write(&path, yaml).map_err(io("writing", path.clone()))?;
        Ok(path)
    }

    /// Stops every process (SIGTERM, SIGKILL after a grace period) and
    /// removes the temp dir. Dropping the cluster does the same, blocking.
    pub async fn stop(self) -> Result<()> {
        self.stop_and_report().await.map(drop)
    }

    /// [`Cluster::stop`], returning what the real nodes left on the host
    /// ([`realnode::leftovers`]; empty without a real node).
    pub async fn stop_and_report(mut self) -> Result<Vec<String>> {
        let procs = std::mem::take(&mut self.procs);
        let (real, dir) = (self.real.take(), self.dir.take());
        tokio::task::spawn_blocking(move || shutdown(procs, real, dir))
            .await
            .map_err(|e| Error::Other(format!("stopping the cluster: {e}")))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        shutdown(
            std::mem::take(&mut self.procs),
            self.real.take(),
            self.dir.take(),
        );
    }
}

/// The controllers and kwok first (nothing recreates pods after that); then
/// the real nodes, whose teardown still needs the apiserver; then the
/// apiserver, whose graceful shutdown still reaches its storage; then etcd;
/// then the temp dir, which is never removed while anything is mounted in
/// it (a mount could lead into the host's own directories).
fn shutdown(
    mut procs: Vec<ManagedProcess>,
    real: Option<RealNodes>,
    dir: Option<tempfile::TempDir>,
) -> Vec<String> {
    let mut controllers = procs.split_off(procs.len().min(2));
    process::terminate_all(&mut controllers, DEFAULT_GRACE);
    let left = real.map(RealNodes::stop).unwrap_or_default();
    let mut apiserver = procs.split_off(procs.len().min(1));
    process::terminate_all(&mut apiserver, DEFAULT_GRACE);
    process::terminate_all(&mut procs, DEFAULT_GRACE);
    if let Some(dir) = dir {
        let stuck = realnode::host::unmount_all_under(dir.path());
        if !stuck.is_empty() {
            let kept = dir.keep();
            eprintln!(
                "csiops-e2e: not removing {}: still mounted: {stuck:?}",
                kept.display()
            );
        } else if std::env::var_os("CSIOPS_E2E_KEEP").is_some_and(|v| !v.is_empty() && v != "0") {
            let kept = dir.keep();
            eprintln!("csiops-e2e: kept {}", kept.display());
        }
    }
    left
}

/// Runs blocking set-up work off the async runtime.
async fn blocking<T, F>(what: &str, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Other(format!("{what}: {e}")))?
}

/// `Ok` when `GET path` (`/readyz`, `/healthz`) through `client` answers
/// `ok`; the body or the error otherwise (a poll's last observation).
async fn health_ok(client: &kube::Client, path: &str) -> Result<(), String> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match client.request_text(req).await {
        Ok(body) if body.trim() == "ok" => Ok(()),
        Ok(body) => Err(body),
        Err(e) => Err(e.to_string()),
    }
}

fn is_port_conflict(e: &Error) -> bool {
    let text = match e {
        Error::ProcessExited { tail, .. } => tail,
        Error::Timeout { logs, .. } => logs,
        _ => return false,
    };
    text.contains("address already in use")
}
