//! Configuration files and command lines of the real node's processes:
//! containerd, the CNI network, kubelet and kube-proxy. Pure functions of a
//! [`Layout`], so what the node runs with is testable without root.
//!
//! Every path is inside the node's own directory; the only host-wide things
//! a node creates are its bridge, kube-proxy's iptables chains and the pods'
//! network namespaces, and teardown removes each of them.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The node's bridge. One real node runs on a machine at a time (see
/// `host::NodeLock`), so a fixed name is safe and easy to find and clean.
pub const BRIDGE: &str = "csiops0";

/// The bridge's subnet: pods get addresses from it, the host is `.1` on it.
/// Clear of the Service range (10.96.0.0/16) and kwok's pod range
/// (10.244.0.0/16).
pub const SUBNET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 213, 0, 0), 24);

/// The host's address on the bridge: the apiserver listens and advertises
/// here so pods reach it through the `kubernetes` Service, and it is the
/// node's InternalIP (kubelet's `--node-ip`).
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);

/// The real node's name, next to kwok's `kwok-node-N`.
pub const NODE_NAME: &str = "csiops-node";

/// containerd's Kubernetes namespace (the CRI plugin's).
pub const CRI_NAMESPACE: &str = "k8s.io";

/// Where Debian's containernetworking-plugins puts the plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// Paths of one node, all under `root`.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        Layout { root: root.into() }
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
    /// kubelet's `--root-dir`: the node's `kubeletDir` in a CSIDriverDeployment.
    pub fn kubelet_dir(&self) -> PathBuf {
        self.p("kubelet")
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
            self.kubelet_dir(),
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
    let (net, prefix) = SUBNET;
    let o = net.octets();
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "csiops-e2e",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": d(&l.cni_ipam_dir()),
                "ranges": [[{
                    "subnet": format!("{net}/{prefix}"),
                    "rangeStart": format!("{}.{}.{}.10", o[0], o[1], o[2]),
                    "gateway": HOST_IP.to_string(),
                }]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    })
    .to_string()
}

/// kubelet's KubeletConfiguration, with the settings this VM needs
/// (cgroupfs, swap allowed, no QoS cgroups or node-allocatable enforcement,
/// oomScoreAdj 0) and every listener on the bridge address or loopback.
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
        host = HOST_IP,
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
        format!("--hostname-override={NODE_NAME}"),
        format!("--node-ip={HOST_IP}"),
        "--v=2".into(),
    ];
    // Applied when kubelet creates its Node, as on a real cluster's new node.
    if !taints.is_empty() {
        args.push(format!("--register-with-taints={}", taints.join(",")));
    }
    args
}

/// kube-proxy's command line (iptables mode). Its listeners stay on
/// loopback, and it leaves the host's conntrack sysctls and oom_score_adj
/// alone.
pub fn kube_proxy_args(kubeconfig: &Path, healthz_port: u16, metrics_port: u16) -> Vec<String> {
    let (net, prefix) = SUBNET;
    vec![
        format!("--kubeconfig={}", d(kubeconfig)),
        format!("--hostname-override={NODE_NAME}"),
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
    fn kube_proxy_listens_on_loopback_only() {
        let args = kube_proxy_args(Path::new("/k"), 1, 2);
        for a in args.iter().filter(|a| a.contains("-bind-address")) {
            assert!(a.contains("=127.0.0.1:"), "{a}");
        }
        assert!(args.contains(&"--proxy-mode=iptables".to_string()));
    }
}
