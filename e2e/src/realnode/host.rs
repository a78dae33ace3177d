//! What the real nodes change on the host: creating node 0's bridge and the
//! other nodes' network namespaces, and reading back what is left (mounts,
//! network namespaces, links, processes, iptables chains) for the leftover
//! check; `reaper.sh` removes them. Also the machine-wide lock (one set of
//! real nodes at a time) and the prerequisite check.
//!
//! Everything here runs external commands or syscalls synchronously: it is
//! called from `Drop` as well as from async code (through `spawn_blocking`).

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::config::{
    netns_name, pod_subnet, transit, veth_host, Layout, BRIDGE, CNI_BIN_DIR, HOST_IP, SUBNET,
    VETH_NODE,
};
use crate::error::{io, Error, Result};

/// kubelet's default root dir: it keeps its device-plugin socket there
/// whatever its `--root-dir`.
pub const KUBELET_DEFAULT_DIR: &str = "/var/lib/kubelet";

/// Where CNI (through containerd) pins pods' network namespaces.
const NETNS_DIR: &str = "/run/netns";

/// Holds the machine-wide real-node lock until dropped. The bridge name,
/// kubelet's ports and kube-proxy's iptables chains are per machine, so two
/// real nodes (two tests in one binary, or two test binaries) take turns.
#[derive(Debug)]
pub struct NodeLock {
    _file: File,
}

impl NodeLock {
    /// Blocks until the lock is free.
    pub fn acquire() -> Result<NodeLock> {
        let path = std::env::temp_dir().join("csiops-e2e-real-node.lock");
        let file = File::create(&path).map_err(io("creating lock file", &path))?;
        // SAFETY: flock on an fd we own; it is released when the fd closes.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io("locking", &path)(std::io::Error::last_os_error()));
        }
        Ok(NodeLock { _file: file })
    }

    /// The locked descriptor: a child that inherits it (the reaper) keeps
    /// the machine locked until it, too, has exited.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self._file.as_raw_fd()
    }
}

/// Fails, naming what is missing and how to get it, unless this machine can
/// run a real node. A test that needs one fails with this; it never skips.
pub fn check_prerequisites() -> Result<()> {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root (kubelet, containerd and the bridge need it)".to_string());
    }
    for cmd in [
        "containerd",
        "ctr",
        "runc",
        "iptables",
        "iptables-save",
        "ip",
        "nsenter",
        "unshare",
        "mount",
        "mountpoint",
    ] {
        if which(cmd).is_none() {
            missing.push(format!("the `{cmd}` command"));
        }
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        let p = Path::new(CNI_BIN_DIR).join(plugin);
        if !p.is_file() {
            missing.push(format!("the CNI plugin {}", p.display()));
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::Other(format!(
        "this machine cannot run the real node; missing: {}. `make node-prereqs` installs \
         Debian's containerd, runc, containernetworking-plugins and iptables",
        missing.join(", ")
    )))
}

/// The full path of `cmd` on PATH.
pub fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(cmd))
        .find(|p| p.is_file())
}

/// Runs a command, returning stdout; a non-zero exit is an error quoting stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(io("running", program))?;
    if !out.status.success() {
        return Err(Error::Other(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates the bridge with the host's address, replacing one left by a run
/// that died. It exists before the apiserver starts, which listens on it.
pub fn create_bridge() -> Result<()> {
    delete_bridge();
    let (_, prefix) = SUBNET;
    run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    run(
        "ip",
        &["addr", "add", &format!("{HOST_IP}/{prefix}"), "dev", BRIDGE],
    )?;
    run("ip", &["link", "set", BRIDGE, "up"])?;
    Ok(())
}

/// Removes the bridge if it exists; the pods' veths went with their netns.
pub fn delete_bridge() {
    if bridge_exists() {
        if let Err(e) = run("ip", &["link", "delete", BRIDGE]) {
            tracing::warn!("deleting bridge {BRIDGE}: {e}");
        }
    }
}

pub fn bridge_exists() -> bool {
    link_exists(BRIDGE)
}

/// Whether the host's network namespace has a link of that name.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// The network of node `index` ≥ 1: its network namespace, a veth pair to
/// the host on the transit subnet, its default route via the host, the
/// host's route to its pod subnet, and forwarding on both sides (see
/// `config`'s module docs). Replaces one left by a run that died.
pub fn create_node_network(index: usize) -> Result<()> {
    delete_node_network(index);
    let ns = netns_name(index).ok_or_else(|| Error::Other("node 0 has no netns".into()))?;
    let veth = veth_host(index);
    let (host, node) = transit(index);
    let (subnet, prefix) = pod_subnet(index);
    run("ip", &["netns", "add", &ns])?;
    run(
        "ip",
        &[
            "link", "add", &veth, "type", "veth", "peer", "name", VETH_NODE, "netns", &ns,
        ],
    )?;
    run("ip", &["addr", "add", &format!("{host}/24"), "dev", &veth])?;
    run("ip", &["link", "set", &veth, "up"])?;
    let in_ns = |args: &[&str]| -> Result<String> {
        let mut all = vec!["-n", ns.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    };
    in_ns(&["link", "set", "lo", "up"])?;
    in_ns(&["addr", "add", &format!("{node}/24"), "dev", VETH_NODE])?;
    in_ns(&["link", "set", VETH_NODE, "up"])?;
    in_ns(&["route", "add", "default", "via", &host.to_string()])?;
    run(
        "ip",
        &[
            "route",
            "add",
            &format!("{subnet}/{prefix}"),
            "via",
            &node.to_string(),
        ],
    )?;
    // The host routes between the nodes (node 0's CNI bridge plugin turns
    // this on as well, as a gateway); /proc/sys/net is per network
    // namespace, so the node's is written from inside it.
    enable_forwarding(None)?;
    enable_forwarding(Some(&ns))?;
    Ok(())
}

/// `net.ipv4.ip_forward = 1` in the host's or the named network namespace.
fn enable_forwarding(netns: Option<&str>) -> Result<()> {
    const KEY: &str = "/proc/sys/net/ipv4/ip_forward";
    match netns {
        None => std::fs::write(KEY, "1").map_err(io("writing", Path::new(KEY))),
        Some(ns) => run(
            "nsenter",
            &[
                &format!("--net={NETNS_DIR}/{ns}"),
                "--",
                "sh",
                "-c",
                &format!("echo 1 > {KEY}"),
            ],
        )
        .map(drop),
    }
}

/// Removes node `index`'s network namespace (its veth pair and the host's
/// route go with it) if it exists.
pub fn delete_node_network(index: usize) {
    if let Some(ns) = netns_name(index) {
        if netns_names().contains(&ns) {
            if let Err(e) = run("ip", &["netns", "delete", &ns]) {
                tracing::warn!("deleting network namespace {ns}: {e}");
            }
        }
    }
    let veth = veth_host(index);
    if link_exists(&veth) {
        if let Err(e) = run("ip", &["link", "delete", &veth]) {
            tracing::warn!("deleting link {veth}: {e}");
        }
    }
}

/// Creates node `i` ≥ 1's mount namespace, pinned at `layout.mount_ns()`:
/// a copy of the host's (so the host's files are there) in which the
/// node's own kubelet dir is bind-mounted at the path every node's kubelet
/// uses ([`Layout::kubelet_dir`]), and its own kubelet device-plugin dir
/// at `/var/lib/kubelet/device-plugins`. kubelet, containerd, the shims and the
/// pods' containers run in it, so the node's volume mounts stay inside
/// and vanish with it; that dir is an rshared mount there, as kubelet makes
/// its root dir.
pub fn create_mount_ns(layout: &Layout) -> Result<()> {
    let Some(pin) = layout.mount_ns() else {
        return Ok(());
    };
    let dir = layout.mount_ns_dir();
    let d = |p: &Path| p.display().to_string();
    std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
    std::fs::create_dir_all(layout.kubelet_dir()).map_err(io("creating", &layout.kubelet_dir()))?;
    // `unshare --mount=<file>` needs the file on a mount that is not shared.
    run("mount", &["--bind", &d(&dir), &d(&dir)])?;
    run("mount", &["--make-private", &d(&dir)])?;
    std::fs::write(&pin, "").map_err(io("creating", &pin))?;
    run(
        "unshare",
        &[
            &format!("--mount={}", d(&pin)),
            "--propagation=slave",
            "true",
        ],
    )?;
    let bind = |from: &Path, to: &Path| {
        run(
            "nsenter",
            &[
                &format!("--mount={}", d(&pin)),
                "--",
                "mount",
                "--bind",
                &d(from),
                &d(to),
            ],
        )
    };
    // Node 0's kubelet has made its root dir an rshared mount of itself,
    // and the copy here would lie under ours: containerd judges a
    // Bidirectional mount by the first mount listed at the path, so only
    // ours may be there, and shared.
    let kubelet_dir = d(&layout.kubelet_dir());
    run(
        "nsenter",
        &[
            &format!("--mount={}", d(&pin)),
            "--",
            "sh",
            "-c",
            r#"while mountpoint -q "$1"; do umount -l "$1" || exit 1; done"#,
            "sh",
            &kubelet_dir,
        ],
    )?;
    bind(&layout.kubelet_storage(), &layout.kubelet_dir())?;
    run(
        "nsenter",
        &[
            &format!("--mount={}", d(&pin)),
            "--",
            "mount",
            "--make-rshared",
            &kubelet_dir,
        ],
    )?;
    // kubelet keeps its device-plugin socket and checkpoint here whatever
    // its --root-dir; each node gets its own (the reaper removes the host
    // dir if the nodes made it).
    let plugins = Path::new(KUBELET_DEFAULT_DIR).join("device-plugins");
    let own = layout.root.join("device-plugins");
    for dir in [&plugins, &own] {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    }
    bind(&own, &plugins)?;
    Ok(())
}

/// `program args…` run in node `layout`'s namespaces (none for node 0):
/// `nsenter --mount=… --net=… -- program args…`. nsenter execs the program,
/// so the pid is the program's.
pub fn in_node(layout: &Layout, program: &Path, args: &[String]) -> (PathBuf, Vec<String>) {
    let mut ns = Vec::new();
    if let Some(pin) = layout.mount_ns() {
        ns.push(format!("--mount={}", pin.display()));
    }
    if let Some(net) = layout.netns() {
        ns.push(format!("--net={NETNS_DIR}/{net}"));
    }
    if ns.is_empty() {
        return (program.to_path_buf(), args.to_vec());
    }
    ns.push("--".to_string());
    ns.push(program.display().to_string());
    ns.extend_from_slice(args);
    (PathBuf::from("nsenter"), ns)
}

/// Mount points at or below `root`, deepest first, from /proc/self/mountinfo.
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mount_path(m)))
        .filter(|m| m.starts_with(root))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            let parsed = std::str::from_utf8(oct)
                .ok()
                .filter(|o| o.bytes().all(|c| (b'0'..=b'7').contains(&c)))
                .and_then(|o| u8::from_str_radix(o, 8).ok());
            if let Some(v) = parsed {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Detaches every mount at or below `root`, deepest first, repeating while
/// stacked mounts remain. Returns the ones that would not go.
pub fn unmount_all_under(root: &Path) -> Vec<PathBuf> {
    for _ in 0..5 {
        let mounts = mounts_under(root);
        if mounts.is_empty() {
            return mounts;
        }
        for m in &mounts {
            let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: a valid NUL-terminated path; MNT_DETACH never blocks.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    mounts_under(root)
}

/// The network namespaces pinned in /run/netns now.
pub fn netns_names() -> BTreeSet<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Processes whose command line mentions `needle` (a path of this node):
/// the containerd shims and anything else started for the node.
pub fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmd.contains(needle).then(|| (pid, cmd.trim().to_string()))
        })
        .collect()
}

/// The executable a running container runs, as the container sees it
/// (`/proc/<pid>/exe` of a process in the container's cgroup, which kubelet
/// names after the container ID). `container_id` is the pod status's
/// `containerID` (`containerd://<id>`) or the bare ID.
pub fn container_exe(container_id: &str) -> Option<String> {
    let id = container_id.rsplit("://").next()?;
    if id.is_empty() {
        return None;
    }
    let rd = std::fs::read_dir("/proc").ok()?;
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find_map(|pid| {
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            if !cgroup.contains(id) {
                return None;
            }
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
            Some(exe.to_string_lossy().into_owned())
        })
}

/// The `KUBE-*` chains in the IPv4 and IPv6 tables.
pub fn kube_chains() -> Vec<String> {
    ["iptables-save", "ip6tables-save"]
        .iter()
        .filter(|c| which(c).is_some())
        .filter_map(|c| run(c, &[]).ok())
        .flat_map(|out| {
            out.lines()
                .filter(|l| l.starts_with(":KUBE-"))
                .filter_map(|l| l[1..].split(' ').next().map(String::from))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/a\040b/c"), "/a b/c");
        assert_eq!(unescape_mount_path(r"/plain"), "/plain");
        assert_eq!(unescape_mount_path(r"/trailing\"), r"/trailing\");
        assert_eq!(unescape_mount_path(r"/x\09"), r"/x\09");
    }

    #[test]
    fn which_finds_sh_and_not_nonsense() {
        assert!(which("sh").is_some());
        assert!(which("no-such-command-csiops").is_none());
    }

    #[test]
    fn processes_mentioning_finds_a_child_by_its_argument() {
        let mut child = Command::new("sleep")
            .arg("30.123456")
            .spawn()
            .expect("sleep");
        // Polled briefly: under a loaded parallel test run the new
        // process's /proc entry has been seen to lag.
        let mut found = Vec::new();
        for _ in 0..50 {
            found = processes_mentioning("30.123456");
            if !found.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.iter().any(|(pid, _)| *pid == child.id()), "{found:?}");
    }
}
