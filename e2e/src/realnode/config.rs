//! Configuration files and command lines of the real nodes' processes:
//! containerd, the CNI network, kubelet and kube-proxy. Pure functions of a
//! [`Layout`], so what a node runs with is testable without root.
//!
//! Every path is inside the node's own directory; the only host-wide things
//! the nodes create are node 0's bridge, the other nodes' network namespaces
//! (with their veth pair and host route), kube-proxy's iptables chains and
//! the pods' network namespaces, and teardown removes each of them.
//!
//! Node 0 runs in the host's network namespace on the bridge [`BRIDGE`]
//! (the apiserver listens on its address, [`HOST_IP`]). Node `i` ≥ 1 runs
//! in its own network namespace ([`Layout::netns`]) joined to the host by a
//! veth pair on the transit subnet `10.213.(100+i).0/24` (host `.1`, node
//! `.2`, the node's InternalIP), with its own bridge and pod subnet
//! `10.213.i.0/24`; the host routes that subnet to the node, and the node's
//! default route is the host. Every packet between two nodes' pods, or
//! from a pod of node `i` to the apiserver, is routed by the host (never
//! asymmetrically, so conntrack sees both directions).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Node 0's bridge, in the host's network namespace. One set of real nodes
/// runs on a machine at a time (see `host::NodeLock`), so fixed names are
/// safe and easy to find and clean.
pub const BRIDGE: &str = "csiops0";

/// Node 0's pod subnet: pods get addresses from it, the host is `.1` on it.
/// Clear of the Service range (10.96.0.0/16) and kwok's pod range
/// (10.244.0.0/16); node `i` uses `10.213.i.0/24` ([`pod_subnet`]).
pub const SUBNET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 213, 0, 0), 24);

/// The host's address on node 0's bridge: the apiserver listens and
/// advertises here so pods reach it through the `kubernetes` Service, and it
/// is node 0's InternalIP (kubelet's `--node-ip`).
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);

/// Node 0's name, next to kwok's `kwok-node-N` ([`node_name`] for others).
pub const NODE_NAME: &str = "csiops-node";

/// The most real nodes a cluster may have (subnets `10.213.0-9.0/24`).
pub const MAX_NODES: usize = 10;

/// containerd's Kubernetes namespace (the CRI plugin's).
pub const CRI_NAMESPACE: &str = "k8s.io";

/// Where Debian's containernetworking-plugins puts the plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// The name of real node `index`: [`NODE_NAME`], then `csiops-node-1`, ….
pub fn node_name(index: usize) -> String {
    if index == 0 {
        NODE_NAME.to_string()
    } else {
        format!("{NODE_NAME}-{index}")
    }
}

/// Pod subnet of node `index`: `10.213.<index>.0/24`.
pub fn pod_subnet(index: usize) -> (Ipv4Addr, u8) {
    (Ipv4Addr::new(10, 213, octet(index), 0), 24)
}

/// The gateway of node `index`'s pods: `.1` of its pod subnet (for node 0
/// the host itself, [`HOST_IP`]).
pub fn pod_gateway(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 213, octet(index), 1)
}

/// The transit subnet between the host and node `index` ≥ 1: the host's
/// end (`.1`) and the node's (`.2`, its InternalIP).
pub fn transit(index: usize) -> (Ipv4Addr, Ipv4Addr) {
    let o = 100 + octet(index);
    (Ipv4Addr::new(10, 213, o, 1), Ipv4Addr::new(10, 213, o, 2))
}

fn octet(index: usize) -> u8 {
    assert!(index < MAX_NODES, "at most {MAX_NODES} real nodes");
    index as u8
}

/// The network namespace of node `index` ≥ 1 (node 0 has none).
pub fn netns_name(index: usize) -> Option<String> {
    (index > 0).then(|| format!("{NODE_NAME}-{index}"))
}

/// The host's end of node `index`'s veth pair (`index` ≥ 1).
pub fn veth_host(index: usize) -> String {
    format!("csiops-h{index}")
}

/// The node's end of its veth pair, inside its network namespace.
pub const VETH_NODE: &str = "eth0";

/// Node `index`'s directory under the cluster dir: `node` (node 0, as
/// before there was more than one), `node-1`, ….
pub fn node_dir(cluster: &Path, index: usize) -> PathBuf {
    if index == 0 {
        cluster.join("node")
    } else {
        cluster.join(format!("node-{index}"))
    }
}

/// Paths and network of one node, all under `root`.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
    /// 0 for the node in the host's network namespace.
    pub index: usize,
}

impl Layout {
    /// Node 0's layout.
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        Layout::for_node(root, 0)
    }
    /// Node `index`'s layout, its files under `root`.
    pub fn for_node(root: impl Into<PathBuf>, index: usize) -> Layout {
        octet(index);
        Layout {
            root: root.into(),
            index,
        }
    }
    /// The Node's name.
    pub fn node_name(&self) -> String {
        node_name(self.index)
    }
    /// The node's InternalIP: [`HOST_IP`] for node 0, its transit address
    /// for the others.
    pub fn node_ip(&self) -> Ipv4Addr {
        if self.index == 0 {
            HOST_IP
        } else {
            transit(self.index).1
        }
    }
    /// The node's network namespace (`None`: the host's).
    pub fn netns(&self) -> Option<String> {
        netns_name(self.index)
    }
    /// The bridge of the node's pods (in the node's network namespace).
    pub fn bridge(&self) -> String {
        format!("csiops{}", self.index)
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
    pub fn containerd_config(&self) -> PathBuf {
        self.p("containerd.toml")
    }
    pub fn containerd_root(&self) -> PathBuf {
        self.p("containerd/root")
    }
    pub fn containerd_state(&self) -> PathBuf {
        self.p("containerd/state")
    }
    /// containerd's gRPC socket; `ctr -a` and kubelet use it.
    pub fn containerd_socket(&self) -> PathBuf {
        self.p("containerd/c.sock")
    }
    pub fn runc_root(&self) -> PathBuf {
        self.p("runc")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.p("cni/net.d")
    }
    /// host-local IPAM's allocations (default: /var/lib/cni/networks).
    pub fn cni_ipam_dir(&self) -> PathBuf {
        self.p("cni/ipam")
    }
    /// kubelet's `--root-dir`: the `node.kubeletDir` of a
    /// CSIDriverDeployment. The same path on every node, as on a real
    /// cluster (one DaemonSet serves them all): node 0's, which node `i` ≥ 1
    /// sees as its own [`Layout::kubelet_storage`] in its mount namespace.
    pub fn kubelet_dir(&self) -> PathBuf {
        match self.root.parent() {
            Some(cluster) if self.index > 0 => node_dir(cluster, 0).join("kubelet"),
            _ => self.p("kubelet"),
        }
    }
    /// Where the node's kubelet files really are on the host.
    pub fn kubelet_storage(&self) -> PathBuf {
        self.p("kubelet")
    }
    /// The file pinning node `i` ≥ 1's mount namespace (`None` for node 0,
    /// which uses the host's). It is in its own private bind mount
    /// ([`Layout::mount_ns_dir`]), as `unshare --mount=<file>` requires.
    pub fn mount_ns(&self) -> Option<PathBuf> {
        (self.index > 0).then(|| self.mount_ns_dir().join("mnt"))
    }
    pub fn mount_ns_dir(&self) -> PathBuf {
        self.p("mntns")
    }
    pub fn kubelet_config(&self) -> PathBuf {
        self.p("kubelet.yaml")
    }
    pub fn kubelet_certs(&self) -> PathBuf {
        self.p("kubelet-pki")
    }
    /// kubelet's `podLogsDir` (default: /var/log/pods).
    pub fn pod_logs(&self) -> PathBuf {
        self.p("pod-logs")
    }
    /// Every directory that must exist before the processes start.
    pub fn dirs(&self) -> Vec<PathBuf> {
        vec![
            self.containerd_root(),
            self.containerd_state(),
            self.runc_root(),
            self.cni_conf_dir(),
            self.cni_ipam_dir(),
            self.kubelet_storage(),
            self.kubelet_certs(),
            self.pod_logs(),
        ]
    }
}

fn d(p: &Path) -> String {
    p.display().to_string()
}

/// containerd's config (format version 2, understood by 1.6 and 1.7).
///
/// - `restrict_oom_score_adj`: this VM refuses a negative oom_score_adj, and
///   without the option runc fails with "can't get final child's PID from
///   pipe".
/// - The `opt` plugin is disabled: it would create /opt/containerd.
/// - runc's state goes under the node dir, not /run/containerd/runc.
pub fn containerd_toml(l: &Layout, sandbox_image: &str) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
"#,
        root = d(&l.containerd_root()),
        state = d(&l.containerd_state()),
        sock = d(&l.containerd_socket()),
        runc = d(&l.runc_root()),
        cni_bin = CNI_BIN_DIR,
        cni_conf = d(&l.cni_conf_dir()),
    )
}

/// The pod network: one bridge, host-local addresses, the host as gateway.
/// No masquerading and no portmap: pods only talk to the host and each other,
/// and neither adds iptables rules that would need cleaning up.
pub fn cni_conflist(l: &Layout) -> String {
    let (net, prefix) = pod_subnet(l.index);
    let o = net.octets();
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "csiops-e2e",
        "plugins": [{
            "type": "bridge",
            "bridge": l.bridge(),
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": d(&l.cni_ipam_dir()),
                "ranges": [[{
                    "subnet": format!("{net}/{prefix}"),
                    "rangeStart": format!("{}.{}.{}.10", o[0], o[1], o[2]),
                    "gateway": pod_gateway(l.index).to_string(),
                }]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    })
    .to_string()
}

/// kubelet's KubeletConfiguration, with the settings this VM needs
/// (cgroupfs, swap allowed, no QoS cgroups or node-allocatable enforcement,
/// oomScoreAdj 0, and cgroup v1 allowed: the VM's kernel mounts cgroup v1,
/// which kubelet refuses by default since 1.35) and every listener on the node's address or loopback (of
/// the node's network namespace).
/// The apiserver reaches kubelet (logs, exec) anonymously: a throwaway node
/// on a private bridge.
pub fn kubelet_yaml(
    l: &Layout,
    healthz_port: u16,
    kubelet_port: u16,
    feature_gates: &[(&str, bool)],
) -> String {
    let gates: String = if feature_gates.is_empty() {
        String::new()
    } else {
        let each: String = feature_gates
            .iter()
            .map(|(g, on)| format!("\n  {g}: {on}"))
            .collect();
        format!("featureGates:{each}\n")
    };
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {host}
port: {kubelet_port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupsPerQOS: false
failCgroupV1: false
enforceNodeAllocatable: []
failSwapOn: false
oomScoreAdj: 0
containerRuntimeEndpoint: unix://{socket}
podLogsDir: {pod_logs}
clusterDomain: cluster.local
registerNode: true
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
syncFrequency: 10s
fileCheckFrequency: 5s
{gates}"#,
        host = l.node_ip(),
        socket = d(&l.containerd_socket()),
        pod_logs = d(&l.pod_logs()),
    )
}

/// kubelet's command line.
pub fn kubelet_args(l: &Layout, kubeconfig: &Path, taints: &[String]) -> Vec<String> {
    let mut args = vec![
        format!("--config={}", d(&l.kubelet_config())),
        format!("--kubeconfig={}", d(kubeconfig)),
        format!("--root-dir={}", d(&l.kubelet_dir())),
        format!("--cert-dir={}", d(&l.kubelet_certs())),
        // Flexvolume's dir; its default is under /usr/libexec.
        format!("--volume-plugin-dir={}", d(&l.root.join("volume-plugins"))),
        format!("--hostname-override={}", l.node_name()),
        format!("--node-ip={}", l.node_ip()),
        "--v=2".into(),
    ];
    // Applied when kubelet creates its Node, as on a real cluster's new node.
    if !taints.is_empty() {
        args.push(format!("--register-with-taints={}", taints.join(",")));
    }
    args
}

/// kube-proxy's command line (iptables mode, in the node's network
/// namespace). Its listeners stay on loopback, and it leaves the host's
/// conntrack sysctls and oom_score_adj alone.
pub fn kube_proxy_args(
    l: &Layout,
    kubeconfig: &Path,
    healthz_port: u16,
    metrics_port: u16,
) -> Vec<String> {
    let (net, prefix) = pod_subnet(l.index);
    vec![
        format!("--kubeconfig={}", d(kubeconfig)),
        format!("--hostname-override={}", l.node_name()),
        "--proxy-mode=iptables".into(),
        format!("--cluster-cidr={net}/{prefix}"),
        format!("--healthz-bind-address=127.0.0.1:{healthz_port}"),
        format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0s".into(),
        "--conntrack-tcp-timeout-close-wait=0s".into(),
        "--oom-score-adj=0".into(),
        "--v=2".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new("/tmp/csiops-e2e-x/node")
    }

    #[test]
    fn containerd_stays_in_the_node_dir_and_restricts_oom_score_adj() {
        let l = layout();
        let toml = containerd_toml(&l, "localhost/csiops/pause:1");
        assert!(toml.contains("restrict_oom_score_adj = true"));
        assert!(toml.contains(r#"sandbox_image = "localhost/csiops/pause:1""#));
        assert!(toml.contains("io.containerd.internal.v1.opt"));
        for line in toml.lines() {
            if let Some((_, v)) = line.split_once("= \"/") {
                let path = format!("/{}", v.trim_end_matches('"'));
                assert!(
                    path.starts_with("/tmp/csiops-e2e-x/node/") || path == CNI_BIN_DIR,
                    "{line}"
                );
            }
        }
    }

    #[test]
    fn cni_uses_our_bridge_and_keeps_ipam_state_in_the_node_dir() {
        let l = layout();
        let v: serde_json::Value = serde_json::from_str(&cni_conflist(&l)).unwrap();
        let p = &v["plugins"][0];
        assert_eq!(p["bridge"], BRIDGE);
        assert_eq!(p["ipMasq"], false);
        assert_eq!(p["ipam"]["dataDir"], "/tmp/csiops-e2e-x/node/cni/ipam");
        assert_eq!(p["ipam"]["ranges"][0][0]["gateway"], HOST_IP.to_string());
        assert_eq!(v["plugins"].as_array().unwrap().len(), 1, "no portmap");
    }

    #[test]
    fn kubelet_has_the_settings_this_vm_needs() {
        let l = layout();
        let y = kubelet_yaml(&l, 1, 2, &[]);
        assert!(!y.contains("featureGates"), "{y}");
        let gated = kubelet_yaml(&l, 1, 2, &[("MutableCSINodeAllocatableCount", true)]);
        assert!(
            gated.ends_with("featureGates:\n  MutableCSINodeAllocatableCount: true\n"),
            "{gated}"
        );
        for want in [
            "cgroupDriver: cgroupfs",
            "failSwapOn: false",
            "cgroupsPerQOS: false",
            "failCgroupV1: false",
            "enforceNodeAllocatable: []",
            "oomScoreAdj: 0",
            "containerRuntimeEndpoint: unix:///tmp/csiops-e2e-x/node/containerd/c.sock",
            "podLogsDir: /tmp/csiops-e2e-x/node/pod-logs",
            "address: 10.213.0.1",
            "healthzBindAddress: 127.0.0.1",
        ] {
            assert!(y.contains(want), "missing {want:?} in\n{y}");
        }
        let args = kubelet_args(&l, Path::new("/k"), &[]);
        assert!(args.contains(&"--root-dir=/tmp/csiops-e2e-x/node/kubelet".to_string()));
        assert!(args.contains(&format!("--node-ip={HOST_IP}")));
    }

    #[test]
    fn a_second_node_has_its_own_network_and_files_and_node_0s_kubelet_path() {
        let l = Layout::for_node("/tmp/csiops-e2e-x/node-1", 1);
        assert_eq!(l.node_name(), "csiops-node-1");
        assert_eq!(l.node_ip(), Ipv4Addr::new(10, 213, 101, 2));
        assert_eq!(l.netns().as_deref(), Some("csiops-node-1"));
        assert_eq!(l.bridge(), "csiops1");
        assert_eq!(
            l.kubelet_dir(),
            Layout::new("/tmp/csiops-e2e-x/node").kubelet_dir()
        );
        assert_eq!(
            l.kubelet_storage(),
            PathBuf::from("/tmp/csiops-e2e-x/node-1/kubelet")
        );
        assert_eq!(
            l.mount_ns(),
            Some(PathBuf::from("/tmp/csiops-e2e-x/node-1/mntns/mnt"))
        );
        assert!(Layout::new("/tmp/csiops-e2e-x/node").mount_ns().is_none());
        let v: serde_json::Value = serde_json::from_str(&cni_conflist(&l)).unwrap();
        let p = &v["plugins"][0];
        assert_eq!(p["bridge"], "csiops1");
        assert_eq!(p["ipam"]["ranges"][0][0]["subnet"], "10.213.1.0/24");
        assert_eq!(p["ipam"]["ranges"][0][0]["gateway"], "10.213.1.1");
        assert_eq!(p["ipam"]["dataDir"], "/tmp/csiops-e2e-x/node-1/cni/ipam");
        assert!(kubelet_yaml(&l, 1, 2, &[]).contains("address: 10.213.101.2"));
        let args = kubelet_args(&l, Path::new("/k"), &[]);
        for want in [
            "--hostname-override=csiops-node-1",
            "--node-ip=10.213.101.2",
            "--root-dir=/tmp/csiops-e2e-x/node/kubelet",
            "--cert-dir=/tmp/csiops-e2e-x/node-1/kubelet-pki",
        ] {
            assert!(args.contains(&want.to_string()), "{want} in {args:?}");
        }
        let proxy = kube_proxy_args(&l, Path::new("/k"), 1, 2);
        assert!(proxy.contains(&"--hostname-override=csiops-node-1".to_string()));
        assert!(proxy.contains(&"--cluster-cidr=10.213.1.0/24".to_string()));
        // No two nodes share a directory the processes write.
        let zero = Layout::new("/tmp/csiops-e2e-x/node");
        for d in l.dirs() {
            assert!(d.starts_with("/tmp/csiops-e2e-x/node-1/"), "{d:?}");
            assert!(!zero.dirs().contains(&d));
        }
    }

    #[test]
    fn kube_proxy_listens_on_loopback_only() {
        let args = kube_proxy_args(&layout(), Path::new("/k"), 1, 2);
        for a in args.iter().filter(|a| a.contains("-bind-address")) {
            assert!(a.contains("=127.0.0.1:"), "{a}");
        }
        assert!(args.contains(&"--proxy-mode=iptables".to_string()));
    }
}
