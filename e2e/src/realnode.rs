//! Real Kubernetes nodes next to the kwok ones: containerd (with runc and
//! the CNI bridge), kubelet and kube-proxy per node, all built or installed
//! locally, running our images for real. Node 0 runs in the host's network
//! namespace; node `i` ≥ 1 in its own (see [`config`]), with its own
//! directory, containerd (root, state, socket), kubelet root dir and CNI
//! config, joined to the same control plane.
//!
//! Life cycle, driven by [`crate::Cluster`]:
//! 1. [`HostNetwork::create`] takes the machine-wide lock, checks the
//!    prerequisites and creates node 0's bridge and the other nodes'
//!    network namespaces, before the apiserver starts (it listens on the
//!    bridge address so pods can reach it).
//! 2. [`RealNodes::start`] starts the watchdog (below), then each node:
//!    containerd, the images, kubelet and kube-proxy; the cluster then waits
//!    for every Node to be Ready.
//! 3. [`RealNodes::stop`] (also on drop): force-deletes every node's pods so
//!    kubelet stops them (CNI teardown included), stops the kubelets and
//!    kube-proxies, deletes what each containerd still has and stops it, then
//!    runs `reaper.sh` once for what is still there on any node: shims,
//!    containers, network namespaces, mounts, iptables chains, the nodes'
//!    namespaces and the bridge. The same script, started before the first
//!    node, waits for the test process and does this if it dies without a
//!    teardown. [`leftovers`] says what, if anything, survived.

pub mod config;
pub mod host;
pub mod images;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{io, Error, Result};
use crate::process::{self, ManagedProcess};
pub use config::{node_name, Layout, HOST_IP, NODE_NAME};
pub use images::ImageSet;

/// How long kubelet gets to stop the node's pods at teardown before the
/// leftovers are removed by force.
const POD_DRAIN: Duration = Duration::from_secs(45);

/// The machine-wide lock, node 0's bridge and the other nodes' network
/// namespaces; all released on drop.
#[derive(Debug)]
pub struct HostNetwork {
    lock: Option<host::NodeLock>,
    nodes: usize,
    before: HostBefore,
}

impl HostNetwork {
    /// Waits for the machine's real-node lock, checks the prerequisites and
    /// creates the network of `nodes` real nodes (at least one).
    pub fn create(nodes: usize) -> Result<HostNetwork> {
        if nodes == 0 || nodes > config::MAX_NODES {
            return Err(Error::Other(format!(
                "{nodes} real nodes asked for; 1 to {} are possible",
                config::MAX_NODES
            )));
        }
        host::check_prerequisites()?;
        let lock = host::NodeLock::acquire()?;
        // What a run that died may have left (its watchdog removes them;
        // under the lock anything of these names is stale).
        for i in 1..config::MAX_NODES {
            host::delete_node_network(i);
        }
        let net = HostNetwork {
            lock: Some(lock),
            nodes,
            before: HostBefore::now(),
        };
        // On an error `net` is dropped: the bridge and namespaces go.
        host::create_bridge()?;
        for i in 1..nodes {
            host::create_node_network(i)?;
        }
        Ok(net)
    }

    /// How many real nodes this network is for.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    fn lock_fd(&self) -> Option<std::os::fd::RawFd> {
        self.lock.as_ref().map(host::NodeLock::raw_fd)
    }
}

impl Drop for HostNetwork {
    fn drop(&mut self) {
        if self.lock.take().is_some() {
            for i in 1..self.nodes {
                host::delete_node_network(i);
            }
            host::delete_bridge();
        }
    }
}

/// Where the nodes' processes run from and report to.
#[derive(Debug, Clone)]
pub struct NodeEnv {
    /// The cluster dir: node `i`'s files are in [`config::node_dir`].
    pub cluster_root: PathBuf,
    pub bin_dir: PathBuf,
    pub kubeconfig: PathBuf,
    /// The cluster's log dir (`kubelet.log`, `kubelet-1.log`, …).
    pub logs: PathBuf,
    /// Feature gates every kubelet runs with (KubeletConfiguration
    /// `featureGates`); empty: the release's defaults.
    pub feature_gates: Vec<(&'static str, bool)>,
}

/// The real nodes of one cluster.
#[derive(Debug)]
pub struct RealNodes {
    env: NodeEnv,
    nodes: Vec<RealNode>,
    /// Cleans up if the test process dies without tearing the nodes down.
    watchdog: Option<std::process::Child>,
    /// Dropped last, after everything else is gone.
    net: Option<HostNetwork>,
}

impl RealNodes {
    /// Starts the watchdog, then every node of `net` in index order
    /// (containerd, `images`, kubelet, kube-proxy). Each registers with
    /// `taints`. The caller waits for the Nodes to become Ready.
    pub fn start(
        net: HostNetwork,
        env: NodeEnv,
        images: ImageSet,
        taints: Vec<String>,
    ) -> Result<RealNodes> {
        let count = net.nodes();
        let mut set = RealNodes {
            env,
            nodes: Vec::new(),
            watchdog: None,
            net: Some(net),
        };
        // kubelet creates /var/lib/kubelet/device-plugins whatever its
        // --root-dir; the reaper removes it if it was not there before.
        if !set.before().var_lib_kubelet {
            write(&set.env.cluster_root.join("created-var-lib-kubelet"), "")?;
        }
        set.watchdog = Some(set.spawn_watchdog()?);
        for index in 0..count {
            let layout = Layout::for_node(config::node_dir(&set.env.cluster_root, index), index);
            let node = RealNode::start(layout, &set.env, images.clone(), taints.clone())?;
            set.nodes.push(node);
        }
        Ok(set)
    }

    /// The nodes, in index order (node 0 first).
    pub fn nodes(&self) -> &[RealNode] {
        &self.nodes
    }

    /// Node `index`.
    pub fn node_mut(&mut self, index: usize) -> Option<&mut RealNode> {
        self.nodes.get_mut(index)
    }

    /// The host's state before the nodes started (for [`leftovers`]).
    pub fn host_before(&self) -> &HostBefore {
        &self
            .net
            .as_ref()
            .expect("the network lives as long as the nodes")
            .before
    }

    fn before(&self) -> &HostBefore {
        self.host_before()
    }

    /// `Err(ProcessExited)` with its log tail if a node process died.
    pub fn check_running(&mut self) -> Result<()> {
        self.nodes.iter_mut().try_for_each(RealNode::check_running)
    }

    /// The last `lines` lines of each node process's log.
    pub fn log_tails(&self, lines: usize) -> String {
        self.nodes.iter().map(|n| n.log_tails(lines)).collect()
    }

    fn roots(&self) -> Vec<PathBuf> {
        (0..self.net.as_ref().map_or(0, HostNetwork::nodes))
            .map(|i| config::node_dir(&self.env.cluster_root, i))
            .collect()
    }

    /// `reaper.sh` for these nodes (see the script): `bash -c`, parameters
    /// by environment, so its command line never names a node dir.
    fn reaper(&self, parent: Option<u32>) -> Result<std::process::Command> {
        let count = self.net.as_ref().map_or(0, HostNetwork::nodes);
        let before = self.env.cluster_root.join("netns-before");
        let names: Vec<&str> = self.before().netns.iter().map(String::as_str).collect();
        write(&before, &names.join("\n"))?;
        let lines = |v: Vec<String>| v.join("\n");
        let roots = self
            .roots()
            .iter()
            .map(|r| r.display().to_string())
            .collect();
        let mut cmd = std::process::Command::new("bash");
        cmd.args(["-c", include_str!("realnode/reaper.sh"), "csiops-reaper"])
            .env(
                "REAPER_PARENT",
                parent.map(|p| p.to_string()).unwrap_or_default(),
            )
            .env("REAPER_CLUSTER", &self.env.cluster_root)
            .env("REAPER_NODES", lines(roots))
            .env(
                "REAPER_NODE_NETNS",
                lines((1..count).filter_map(config::netns_name).collect()),
            )
            .env(
                "REAPER_NODE_LINKS",
                lines((1..count).map(config::veth_host).collect()),
            )
            .env("REAPER_KUBE_PROXY", self.env.bin_dir.join("kube-proxy"))
            .env("REAPER_NETNS_BEFORE", &before)
            .env("REAPER_BRIDGE", config::BRIDGE)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        Ok(cmd)
    }

    /// Starts the watchdog: the reaper waiting for this process to die, in
    /// its own process group (a terminal's Ctrl-C does not reach it), holding
    /// the machine lock as fd 9 so no other real node starts (and makes a
    /// bridge of the same name) while it cleans.
    fn spawn_watchdog(&self) -> Result<std::process::Child> {
        use std::os::unix::process::CommandExt;
        let lock = self
            .net
            .as_ref()
            .and_then(HostNetwork::lock_fd)
            .ok_or_else(|| Error::Other("the real nodes have no lock".into()))?;
        let mut cmd = self.reaper(Some(std::process::id()))?;
        // SAFETY: dup2 and fcntl are async-signal-safe. dup2's new fd has no
        // CLOEXEC, but dup2 onto itself changes nothing: clear it then.
        unsafe {
            cmd.pre_exec(move || {
                let rc = if lock == 9 {
                    libc::fcntl(9, libc::F_SETFD, 0)
                } else {
                    libc::dup2(lock, 9)
                };
                if rc < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.process_group(0)
            .spawn()
            .map_err(io("starting the reaper", "bash"))
    }

    /// Tears the nodes down (see the module docs) and returns what they
    /// left behind ([`leftovers`], checked while the machine lock is still
    /// held, so another cluster's nodes starting cannot be mistaken for
    /// leftovers). Needs the apiserver, so the cluster stops its
    /// controllers first and the apiserver after.
    pub fn stop(mut self) -> Vec<String> {
        self.teardown()
    }

    fn teardown(&mut self) -> Vec<String> {
        if self.net.is_none() {
            return Vec::new();
        }
        let mut nodes = std::mem::take(&mut self.nodes);
        delete_pods(&self.env.kubeconfig, &nodes);
        let deadline = Instant::now() + POD_DRAIN;
        for n in &nodes {
            n.wait_drained(deadline);
        }
        // kubelet and kube-proxy first, containerd last, the last node first.
        for n in nodes.iter_mut().rev() {
            n.stop_processes();
        }
        // The forced part: shims, containers, netns, mounts, chains, bridge.
        match self
            .reaper(None)
            .and_then(|mut c| c.status().map_err(io("running", "reaper")))
        {
            Ok(st) if st.success() => {}
            other => tracing::warn!(?other, "the reaper failed"),
        }
        // Checked while the machine lock is still ours: afterwards another
        // node may start, and its bridge is not our leftover.
        let left = leftovers(&self.roots(), self.before());
        // The watchdog holds the lock too: it goes before the lock does.
        if let Some(mut reaper) = self.watchdog.take() {
            let _ = reaper.kill();
            let _ = reaper.wait();
        }
        drop(self.net.take());
        left
    }
}

impl Drop for RealNodes {
    fn drop(&mut self) {
        let left = self.teardown();
        if !left.is_empty() {
            tracing::warn!(?left, "the real nodes left things behind");
        }
    }
}

/// Force-deletes every pod bound to one of `nodes`, without waiting.
fn delete_pods(kubeconfig: &Path, nodes: &[RealNode]) {
    let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
    for n in nodes {
        let out = std::process::Command::new(&kubectl)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                "delete",
                "pods",
                "--all-namespaces",
                "--field-selector",
                &format!("spec.nodeName={}", n.name()),
                "--force",
                "--grace-period=0",
                "--wait=false",
                "--request-timeout=10s",
            ])
            .stdin(std::process::Stdio::null())
            .output();
        if let Ok(o) = &out {
            if !o.status.success() {
                tracing::warn!(
                    "deleting the pods of {}: {}",
                    n.name(),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
    }
}

/// One running real node.
#[derive(Debug)]
pub struct RealNode {
    layout: Layout,
    kubeconfig: PathBuf,
    bin_dir: PathBuf,
    /// The kubelet binary: `bin_dir`'s, until an upgrade
    /// ([`RealNode::restart_kubelet_from`]) names another one.
    kubelet: PathBuf,
    logs: PathBuf,
    /// containerd, kubelet, kube-proxy (start order).
    procs: Vec<ManagedProcess>,
    images: ImageSet,
    /// kubelet's `--register-with-taints`.
    taints: Vec<String>,
}

impl RealNode {
    /// Starts containerd, imports `images`, starts kubelet and kube-proxy,
    /// all in the node's namespaces (node `i` ≥ 1: its network and mount
    /// namespaces, see [`host::create_mount_ns`]).
    fn start(
        layout: Layout,
        env: &NodeEnv,
        images: ImageSet,
        taints: Vec<String>,
    ) -> Result<RealNode> {
        for d in layout.dirs() {
            std::fs::create_dir_all(&d).map_err(io("creating dir", &d))?;
        }
        host::create_mount_ns(&layout)?;
        write(
            &layout.containerd_config(),
            &config::containerd_toml(&layout, images.pause()?),
        )?;
        write(
            &layout.cni_conf_dir().join("10-csiops.conflist"),
            &config::cni_conflist(&layout),
        )?;
        let p = crate::ports::free_ports(4)?;
        write(
            &layout.kubelet_config(),
            &config::kubelet_yaml(&layout, p[0], p[1], &env.feature_gates),
        )?;

        let mut node = RealNode {
            layout,
            kubeconfig: env.kubeconfig.clone(),
            bin_dir: env.bin_dir.clone(),
            kubelet: env.bin_dir.join("kubelet"),
            logs: env.logs.clone(),
            procs: Vec::new(),
            images,
            taints,
        };
        let containerd = host::which("containerd")
            .ok_or_else(|| Error::Other("containerd is not on PATH".into()))?;
        let args = vec![format!(
            "--config={}",
            node.layout.containerd_config().display()
        )];
        node.spawn("containerd", &containerd, &args)?;
        node.wait_for_containerd()?;
        node.images.import(&node.layout.containerd_socket())?;

        let kubelet_args = config::kubelet_args(&node.layout, &node.kubeconfig, &node.taints);
        let kubelet = node.kubelet.clone();
        node.spawn("kubelet", &kubelet, &kubelet_args)?;
        let proxy_args = config::kube_proxy_args(&node.layout, &node.kubeconfig, p[2], p[3]);
        let proxy = node.bin_dir.join("kube-proxy");
        node.spawn("kube-proxy", &proxy, &proxy_args)?;
        Ok(node)
    }

    /// The Node's name.
    pub fn name(&self) -> String {
        self.layout.node_name()
    }

    /// `name` (node 0) or `name-<index>`: the process's name in errors and
    /// its log file's name.
    fn proc_name(&self, name: &str) -> String {
        match self.layout.index {
            0 => name.to_string(),
            i => format!("{name}-{i}"),
        }
    }

    /// Spawns `program args` in the node's namespaces.
    fn spawn(&mut self, name: &str, program: &Path, args: &[String]) -> Result<()> {
        let name = self.proc_name(name);
        let log = self.logs.join(format!("{name}.log"));
        let (program, args) = host::in_node(&self.layout, program, args);
        self.procs
            .push(ManagedProcess::spawn(&name, &program, &args, &log)?);
        Ok(())
    }

    fn wait_for_containerd(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.check_running()?;
            if self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "containerd did not answer on {} within 30s\n{}",
                    self.layout.containerd_socket().display(),
                    self.log_tails(30)
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs `ctr` against this node's containerd in the CRI namespace.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        ctr(&self.layout.containerd_socket(), args)
    }

    /// The node's paths (its kubelet dir is what a CSIDriverDeployment's
    /// `node.kubeletDir` must name).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The images imported into the node.
    pub fn images(&self) -> &ImageSet {
        &self.images
    }

    /// Stops kubelet (SIGTERM, as systemd would) and starts it again with
    /// the same flags, appending to the same log. Containers and mounts
    /// stay; plugins must register again.
    pub fn restart_kubelet(&mut self) -> Result<()> {
        let program = self.kubelet.clone();
        self.replace_kubelet(&program)
    }

    /// [`RealNode::restart_kubelet`] with `<bin_dir>/kubelet`, as a node
    /// upgrade does: the same flags, config file and root dir, so the new
    /// kubelet finds the old one's pods, checkpoints and plugin sockets.
    /// Later restarts keep the new binary.
    pub fn restart_kubelet_from(&mut self, bin_dir: &Path) -> Result<()> {
        let program = bin_dir.join("kubelet");
        if !program.is_file() {
            return Err(Error::Bins(format!("{} has no kubelet", bin_dir.display())));
        }
        self.replace_kubelet(&program)?;
        self.kubelet = program;
        Ok(())
    }

    /// Stops the running kubelet and starts `program` with its flags.
    fn replace_kubelet(&mut self, program: &Path) -> Result<()> {
        let name = self.proc_name("kubelet");
        let i = self
            .procs
            .iter()
            .position(|p| p.name() == name)
            .ok_or_else(|| Error::Other("the node runs no kubelet".into()))?;
        let mut old = self.procs.remove(i);
        old.terminate(process::DEFAULT_GRACE);
        let args = config::kubelet_args(&self.layout, &self.kubeconfig, &self.taints);
        self.spawn("kubelet", program, &args)
    }

    /// `Err(ProcessExited)` with its log tail if a node process died.
    pub fn check_running(&mut self) -> Result<()> {
        self.procs
            .iter_mut()
            .try_for_each(ManagedProcess::check_running)
    }

    /// The last `lines` lines of each node process's log.
    pub fn log_tails(&self, lines: usize) -> String {
        self.procs
            .iter()
            .map(|p| format!("--- {} ---\n{}\n", p.name(), p.log_tail(lines)))
            .collect()
    }

    /// The mount points of the node's mount namespace (`/proc/<pid>/mountinfo`
    /// of its containerd): node `i` ≥ 1's volume mounts are not in the
    /// host's.
    pub fn mount_points(&self) -> Result<Vec<PathBuf>> {
        let containerd = self.proc_name("containerd");
        let pid = self
            .procs
            .iter()
            .find(|p| p.name() == containerd)
            .map(ManagedProcess::pid)
            .ok_or_else(|| Error::Other(format!("{} runs no containerd", self.name())))?;
        let path = PathBuf::from(format!("/proc/{pid}/mountinfo"));
        let text = std::fs::read_to_string(&path).map_err(io("reading", &path))?;
        Ok(crate::testdriver::mounts::mount_points(&text))
    }

    /// IDs of the containers (sandboxes included) containerd knows about.
    pub fn container_ids(&self) -> Result<Vec<String>> {
        Ok(self
            .ctr(&["containers", "ls", "-q"])?
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// Waits (until `deadline`) for kubelet to have stopped every container
    /// and sandbox of the deleted pods, which is what runs the CNI teardown.
    fn wait_drained(&self, deadline: Instant) {
        while Instant::now() < deadline {
            match self.ctr(&["tasks", "ls", "-q"]) {
                Ok(t) if t.trim().is_empty() => return,
                Err(_) => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
        tracing::warn!(
            "kubelet of {} did not stop every container within {POD_DRAIN:?}",
            self.name()
        );
    }

    /// kubelet and kube-proxy, then what containerd still runs, then
    /// containerd.
    fn stop_processes(&mut self) {
        let mut procs = std::mem::take(&mut self.procs);
        let containerd = self.proc_name("containerd");
        let mut runtime: Vec<ManagedProcess> = procs
            .iter()
            .position(|p| p.name() == containerd)
            .map(|i| vec![procs.remove(i)])
            .unwrap_or_default();
        process::terminate_all(&mut procs, process::DEFAULT_GRACE);
        self.remove_containers();
        process::terminate_all(&mut runtime, process::DEFAULT_GRACE);
    }

    /// Kills and deletes whatever tasks and containers containerd still has.
    fn remove_containers(&self) {
        let Ok(tasks) = self.ctr(&["tasks", "ls", "-q"]) else {
            return;
        };
        for id in tasks.lines().filter(|l| !l.is_empty()) {
            let _ = self.ctr(&["tasks", "kill", "-a", "-s", "SIGKILL", id]);
            let _ = self.ctr(&["tasks", "delete", "-f", id]);
        }
        if let Ok(ids) = self.ctr(&["containers", "ls", "-q"]) {
            for id in ids.lines().filter(|l| !l.is_empty()) {
                let _ = self.ctr(&["containers", "delete", id]);
            }
        }
    }
}

/// `ctr --address <socket> --namespace k8s.io <args>`.
pub fn ctr(socket: &Path, args: &[&str]) -> Result<String> {
    let sock = socket.display().to_string();
    let mut all = vec!["--address", &sock, "--namespace", config::CRI_NAMESPACE];
    all.extend_from_slice(args);
    host::run("ctr", &all)
}

/// What of the host's state a node may change, as it was before the node
/// started: what [`leftovers`] compares with.
#[derive(Debug, Clone)]
pub struct HostBefore {
    /// The network namespaces in /run/netns.
    pub netns: BTreeSet<String>,
    /// Whether /var/lib/kubelet existed (kubelet makes its device-plugins
    /// dir there whatever its --root-dir).
    pub var_lib_kubelet: bool,
}

impl HostBefore {
    pub fn now() -> HostBefore {
        HostBefore {
            netns: host::netns_names(),
            var_lib_kubelet: Path::new(host::KUBELET_DEFAULT_DIR).exists(),
        }
    }
}

/// What stopped nodes left on the host, one line each; empty when clean.
/// `roots` are the nodes' directories.
pub fn leftovers(roots: &[PathBuf], before: &HostBefore) -> Vec<String> {
    let mut left = Vec::new();
    let mut procs = BTreeSet::new();
    for root in roots {
        procs.extend(host::processes_mentioning(&root.display().to_string()));
        for m in host::mounts_under(root) {
            left.push(format!("mount {}", m.display()));
        }
    }
    for (pid, cmd) in procs {
        left.push(format!("process {pid}: {cmd}"));
    }
    for i in 1..config::MAX_NODES {
        let link = config::veth_host(i);
        if host::link_exists(&link) {
            left.push(format!("link {link}"));
        }
    }
    for ns in host::netns_names().difference(&before.netns) {
        left.push(format!("network namespace {ns}"));
    }
    if !before.var_lib_kubelet && Path::new(host::KUBELET_DEFAULT_DIR).exists() {
        left.push(format!("directory {}", host::KUBELET_DEFAULT_DIR));
    }
    if host::bridge_exists() {
        left.push(format!("bridge {}", config::BRIDGE));
    }
    for c in host::kube_chains() {
        left.push(format!("iptables chain {c}"));
    }
    left
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(io("writing", path))
}
