//! One real Kubernetes node next to the kwok ones: containerd (with runc and
//! the CNI bridge), kubelet and kube-proxy, all built or installed locally,
//! running our images for real.
//!
//! Life cycle, driven by [`crate::Cluster`]:
//! 1. [`HostNetwork::create`] takes the machine-wide lock, checks the
//!    prerequisites and creates the bridge, before the apiserver starts (it
//!    listens on the bridge address so pods can reach it).
//! 2. [`RealNode::start`] starts containerd, imports the images, starts
//!    kubelet and kube-proxy; the cluster then waits for the Node to be Ready.
//! 3. [`RealNode::stop`] (also on drop): force-deletes the node's pods so
//!    kubelet stops them (CNI teardown included), stops kubelet and
//!    kube-proxy, deletes what containerd still has and stops it, then runs
//!    `reaper.sh` for what is still there: shims, containers, network
//!    namespaces, mounts, iptables chains and the bridge. The same script,
//!    started with the node, waits for the test process and does this if it
//!    dies without a teardown. [`leftovers`] says what, if anything, survived.

pub mod config;
pub mod host;
pub mod images;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{io, Error, Result};
use crate::process::{self, ManagedProcess};
pub use config::{Layout, HOST_IP, NODE_NAME};
pub use images::ImageSet;

/// How long kubelet gets to stop the node's pods at teardown before the
/// leftovers are removed by force.
const POD_DRAIN: Duration = Duration::from_secs(45);

/// The machine-wide lock and the bridge; both released on drop.
#[derive(Debug)]
pub struct HostNetwork {
    lock: Option<host::NodeLock>,
}

impl HostNetwork {
    /// Waits for the machine's real-node lock, checks the prerequisites and
    /// creates the bridge.
    pub fn create() -> Result<HostNetwork> {
        host::check_prerequisites()?;
        let lock = host::NodeLock::acquire()?;
        host::create_bridge()?;
        Ok(HostNetwork { lock: Some(lock) })
    }

    fn lock_fd(&self) -> Option<std::os::fd::RawFd> {
        self.lock.as_ref().map(host::NodeLock::raw_fd)
    }
}

impl Drop for HostNetwork {
    fn drop(&mut self) {
        if self.lock.take().is_some() {
            host::delete_bridge();
        }
    }
}

/// A running real node.
#[derive(Debug)]
pub struct RealNode {
    layout: Layout,
    kubeconfig: PathBuf,
    bin_dir: PathBuf,
    logs: PathBuf,
    /// containerd, kubelet, kube-proxy (start order).
    procs: Vec<ManagedProcess>,
    before: HostBefore,
    images: ImageSet,
    /// kubelet's `--register-with-taints`.
    taints: Vec<String>,
    /// Cleans up if the test process dies without tearing the node down.
    reaper: Option<std::process::Child>,
    /// Dropped last, after everything else is gone.
    net: Option<HostNetwork>,
}

impl RealNode {
    /// Starts containerd, imports `images`, starts kubelet (registering
    /// with `taints`, with `feature_gates` set) and kube-proxy. The caller
    /// waits for the Node to become Ready.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        net: HostNetwork,
        root: &Path,
        bin_dir: &Path,
        kubeconfig: &Path,
        logs: &Path,
        images: ImageSet,
        taints: Vec<String>,
        feature_gates: Vec<(&'static str, bool)>,
    ) -> Result<RealNode> {
        let layout = Layout::new(root);
        for d in layout.dirs() {
            std::fs::create_dir_all(&d).map_err(io("creating dir", &d))?;
        }
        write(
            &layout.containerd_config(),
            &config::containerd_toml(&layout, images.pause()?),
        )?;
        write(
            &layout.cni_conf_dir().join("10-csiops.conflist"),
            &config::cni_conflist(&layout),
        )?;
        // kubelet creates /var/lib/kubelet/device-plugins whatever its
        // --root-dir; the reaper removes it if it was not there before.
        let before = HostBefore::now();
        if !before.var_lib_kubelet {
            write(&layout.root.join("created-var-lib-kubelet"), "")?;
        }
        let p = crate::ports::free_ports(4)?;
        write(
            &layout.kubelet_config(),
            &config::kubelet_yaml(&layout, p[0], p[1], &feature_gates),
        )?;

        let mut node = RealNode {
            layout,
            kubeconfig: kubeconfig.to_path_buf(),
            bin_dir: bin_dir.to_path_buf(),
            logs: logs.to_path_buf(),
            procs: Vec::new(),
            before,
            images,
            taints,
            reaper: None,
            net: Some(net),
        };
        node.reaper = Some(node.spawn_reaper()?);

        let containerd = host::which("containerd")
            .ok_or_else(|| Error::Other("containerd is not on PATH".into()))?;
        let args = vec![format!(
            "--config={}",
            node.layout.containerd_config().display()
        )];
        node.spawn("containerd", &containerd, &args)?;
        node.wait_for_containerd()?;
        node.images.import(&node.layout.containerd_socket())?;

        let kubelet_args = config::kubelet_args(&node.layout, kubeconfig, &node.taints);
        node.spawn("kubelet", &bin_dir.join("kubelet"), &kubelet_args)?;
        let proxy_args = config::kube_proxy_args(kubeconfig, p[2], p[3]);
        node.spawn("kube-proxy", &bin_dir.join("kube-proxy"), &proxy_args)?;
        Ok(node)
    }

    /// `reaper.sh` for this node (see the script): `bash -c`, parameters
    /// by environment, so its command line never names the node dir.
    fn reaper(&self, parent: Option<u32>) -> Result<std::process::Command> {
        let before = self.layout.root.join("netns-before");
        let names: Vec<&str> = self.before.netns.iter().map(String::as_str).collect();
        write(&before, &names.join("\n"))?;
        let mut cmd = std::process::Command::new("bash");
        cmd.args(["-c", include_str!("reaper.sh"), "csiops-reaper"])
            .env(
                "REAPER_PARENT",
                parent.map(|p| p.to_string()).unwrap_or_default(),
            )
            .env("REAPER_NODE", &self.layout.root)
            .env("REAPER_KUBE_PROXY", self.bin_dir.join("kube-proxy"))
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
    fn spawn_reaper(&self) -> Result<std::process::Child> {
        use std::os::unix::process::CommandExt;
        let lock = self
            .net
            .as_ref()
            .and_then(HostNetwork::lock_fd)
            .ok_or_else(|| Error::Other("the real node has no lock".into()))?;
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

    fn spawn(&mut self, name: &str, program: &Path, args: &[String]) -> Result<()> {
        let log = self.logs.join(format!("{name}.log"));
        self.procs
            .push(ManagedProcess::spawn(name, program, args, &log)?);
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
        let i = self
            .procs
            .iter()
            .position(|p| p.name() == "kubelet")
            .ok_or_else(|| Error::Other("the node runs no kubelet".into()))?;
        let mut old = self.procs.remove(i);
        old.terminate(process::DEFAULT_GRACE);
        let args = config::kubelet_args(&self.layout, &self.kubeconfig, &self.taints);
        let program = self.bin_dir.join("kubelet");
        self.spawn("kubelet", &program, &args)
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

    /// IDs of the containers (sandboxes included) containerd knows about.
    pub fn container_ids(&self) -> Result<Vec<String>> {
        Ok(self
            .ctr(&["containers", "ls", "-q"])?
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// Tears the node down (see the module docs) and returns what it left
    /// behind ([`leftovers`], checked while this node still holds the
    /// machine lock, so another node starting cannot be mistaken for a
    /// leftover). Needs the apiserver, so the cluster stops its controllers
    /// first and the apiserver after.
    pub fn stop(mut self) -> Vec<String> {
        self.teardown()
    }

    fn teardown(&mut self) -> Vec<String> {
        if self.net.is_none() {
            return Vec::new();
        }
        self.drain_pods();
        let mut procs = std::mem::take(&mut self.procs);
        // kubelet and kube-proxy first, containerd last.
        let containerd = procs.iter().position(|p| p.name() == "containerd");
        let mut runtime: Vec<ManagedProcess> = containerd
            .map(|i| vec![procs.remove(i)])
            .unwrap_or_default();
        process::terminate_all(&mut procs, process::DEFAULT_GRACE);
        self.remove_containers();
        process::terminate_all(&mut runtime, process::DEFAULT_GRACE);

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
        let left = leftovers(&self.layout.root, &self.before);
        // The watchdog holds the lock too: it goes before the lock does.
        if let Some(mut reaper) = self.reaper.take() {
            let _ = reaper.kill();
            let _ = reaper.wait();
        }
        drop(self.net.take());
        left
    }

    /// Force-deletes every pod bound to this node and waits (bounded) until
    /// kubelet has stopped their containers and sandboxes, which is what
    /// runs the CNI teardown.
    fn drain_pods(&self) {
        let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
        let out = std::process::Command::new(kubectl)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args([
                "delete",
                "pods",
                "--all-namespaces",
                "--field-selector",
                &format!("spec.nodeName={NODE_NAME}"),
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
                    "deleting the real node's pods: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
        let deadline = Instant::now() + POD_DRAIN;
        while Instant::now() < deadline {
            match self.ctr(&["tasks", "ls", "-q"]) {
                Ok(t) if t.trim().is_empty() => return,
                Err(_) => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
        tracing::warn!("kubelet did not stop every container within {POD_DRAIN:?}");
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

impl Drop for RealNode {
    fn drop(&mut self) {
        let left = self.teardown();
        if !left.is_empty() {
            tracing::warn!(?left, "the real node left things behind");
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

/// What a stopped node left on the host, one line each; empty when clean.
/// `root` is the node's directory.
pub fn leftovers(root: &Path, before: &HostBefore) -> Vec<String> {
    let mut left = Vec::new();
    let needle = root.display().to_string();
    for (pid, cmd) in host::processes_mentioning(&needle) {
        left.push(format!("process {pid}: {cmd}"));
    }
    for m in host::mounts_under(root) {
        left.push(format!("mount {}", m.display()));
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

impl RealNode {
    /// The host's state before the node started (for [`leftovers`]).
    pub fn host_before(&self) -> &HostBefore {
        &self.before
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(io("writing", path))
}
