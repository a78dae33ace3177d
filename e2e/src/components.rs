//! Command lines of the control-plane processes. Everything listens on
//! 127.0.0.1 only (the apiserver on the real node's bridge address when
//! there is one) and writes only inside the cluster's temp dir.

use std::path::Path;

use crate::workdir::WorkDir;

fn p(path: &Path) -> String {
    path.display().to_string()
}

pub(crate) fn etcd_url(w: &WorkDir) -> String {
    format!("http://127.0.0.1:{}", w.ports.etcd_client)
}

pub(crate) fn etcd(w: &WorkDir) -> Vec<String> {
    let client = etcd_url(w);
    let peer = format!("http://127.0.0.1:{}", w.ports.etcd_peer);
    vec![
        "--name=e2e".into(),
        format!("--data-dir={}", p(&w.etcd_data)),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=e2e={peer}"),
        // Throwaway data: skipping fsync makes the apiserver much faster on
        // slow disks.
        "--unsafe-no-fsync=true".into(),
        "--log-level=warn".into(),
    ]
}

/// `--feature-gates=A=true,B=false`, or nothing for no gates.
pub(crate) fn feature_gates_flag(gates: &[(&str, bool)]) -> Option<String> {
    (!gates.is_empty()).then(|| {
        let list: Vec<String> = gates.iter().map(|(g, on)| format!("{g}={on}")).collect();
        format!("--feature-gates={}", list.join(","))
    })
}

pub(crate) fn kube_apiserver(w: &WorkDir, feature_gates: &[(&str, bool)]) -> Vec<String> {
    let pki = &w.pki;
    let mut args = vec![
        format!("--etcd-servers={}", etcd_url(w)),
        format!("--bind-address={}", w.host),
        format!("--advertise-address={}", w.host),
        format!("--secure-port={}", w.ports.apiserver),
        format!("--tls-cert-file={}", p(&pki.apiserver_cert)),
        format!("--tls-private-key-file={}", p(&pki.apiserver_key)),
        format!("--client-ca-file={}", p(&pki.ca_cert)),
        format!("--token-auth-file={}", p(&w.tokens)),
        "--authorization-mode=RBAC".into(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        // The public key (SPKI PEM), see `Pki::sa_pub`.
        format!("--service-account-key-file={}", p(&pki.sa_pub)),
        format!("--service-account-signing-key-file={}", p(&pki.sa_key)),
        "--service-cluster-ip-range=10.96.0.0/16".into(),
        // CSI node plugins are privileged DaemonSets.
        "--allow-privileged=true".into(),
        // Unused with --tls-cert-file, but its default is /var/run/kubernetes.
        format!("--cert-dir={}", p(&w.serving_certs.join("kube-apiserver"))),
        "--profiling=false".into(),
    ];
    args.extend(feature_gates_flag(feature_gates));
    if w.host.is_loopback() {
        // The `kubernetes` Endpoints would point at 127.0.0.1, which
        // Endpoints validation rejects (loopback); no pod runs for real.
        args.push("--endpoint-reconciler-type=none".into());
    } else {
        // A real node: pods reach the apiserver through the `kubernetes`
        // Service, whose endpoint is the advertised bridge address (the
        // default lease reconciler keeps it); logs and exec reach kubelet
        // on the node's InternalIP.
        args.push("--kubelet-preferred-address-types=InternalIP".into());
    }
    args
}

/// `grace_seconds`: how long a node may stay silent before it is NotReady.
pub(crate) fn kube_controller_manager(w: &WorkDir, grace_seconds: u32) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", p(&w.kubeconfig)),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", w.ports.controller_manager),
        // Its self-signed serving cert goes here.
        format!(
            "--cert-dir={}",
            p(&w.serving_certs.join("kube-controller-manager"))
        ),
        // Legacy token Secrets and the kube-root-ca.crt ConfigMaps.
        format!("--service-account-private-key-file={}", p(&w.pki.sa_key)),
        format!("--root-ca-file={}", p(&w.pki.ca_cert)),
        // All controllers act as the admin of the kubeconfig; no per-controller
        // ServiceAccount tokens to mint and wait for.
        "--use-service-account-credentials=false".into(),
        "--controllers=*".into(),
        // Its default, /usr/libexec/kubernetes/..., would be created on the host.
        format!("--flex-volume-plugin-dir={}", p(&w.root.join("flexvolume"))),
        // Client-side rate limits only slow the tests down.
        "--kube-api-qps=200".into(),
        "--kube-api-burst=400".into(),
        format!("--node-monitor-grace-period={grace_seconds}s"),
        "--profiling=false".into(),
    ]
}

pub(crate) fn kube_scheduler(w: &WorkDir) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", p(&w.kubeconfig)),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", w.ports.scheduler),
        format!("--cert-dir={}", p(&w.serving_certs.join("kube-scheduler"))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_is_on_loopback_and_in_the_temp_dir() {
        let w = WorkDir::create(std::net::Ipv4Addr::LOCALHOST).unwrap();
        let root = w.root.display().to_string();
        for args in [
            etcd(&w),
            kube_apiserver(&w, &[]),
            kube_controller_manager(&w, 50),
            kube_scheduler(&w),
        ] {
            for a in &args {
                assert!(!a.contains("0.0.0.0"), "{a}");
                let addr_flag = [
                    "--listen-",
                    "--advertise-",
                    "--initial-",
                    "--etcd-servers",
                    "--bind-address",
                ]
                .iter()
                .any(|f| a.starts_with(f));
                if addr_flag {
                    assert!(a.contains("127.0.0.1"), "{a}");
                }
                if let Some((_, v)) = a.split_once("=/") {
                    assert!(format!("/{v}").starts_with(&root), "{a}");
                }
            }
        }
    }

    #[test]
    fn feature_gates_reach_the_apiserver_only_when_asked_for() {
        let w = WorkDir::create(std::net::Ipv4Addr::LOCALHOST).unwrap();
        assert!(!kube_apiserver(&w, &[])
            .iter()
            .any(|a| a.starts_with("--feature-gates")));
        let args = kube_apiserver(
            &w,
            &[("MutableCSINodeAllocatableCount", true), ("X", false)],
        );
        assert!(
            args.contains(
                &"--feature-gates=MutableCSINodeAllocatableCount=true,X=false".to_string()
            ),
            "{args:?}"
        );
    }
}
