//! Restart of a node's registrar with many nodes' CSINodes in the
//! cluster: `--csinodes` CSINodes are laid out, the registrar of kwok node
//! 0 is started, registered as kubelet's plugin watcher does, and once its
//! CSINode entry is there it is killed and started again. Counted over the
//! restart (start, registration, 10 s of running): kube-apiserver's LISTs
//! of the sidecars' resources and the objects they returned. A node
//! sidecar that reads only its own node lists one CSINode and one Node.
//! Upstream's node-driver-registrar has no API client (kubelet writes the
//! CSINode): it is run the same way when given, to show the same window.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;

use super::{ApiCount, Args, Bed, DRIVER};
use crate::bench::objects;
use crate::node_side::{
    register_when_ready, registration_socket, start_mock_driver, start_registrar,
};
use crate::process::ManagedProcess;
use crate::{sidecar_bin, Error, Result};

/// Starts a registrar (ours, or upstream's `bin`), registers it; its process.
async fn start(
    bed: &Bed,
    upstream: Option<&Path>,
    socket: &Path,
    registry: &Path,
    node: &str,
    log: &Path,
) -> Result<ManagedProcess> {
    let _ = std::fs::remove_file(registration_socket(registry, DRIVER));
    let p = match upstream {
        None => start_registrar(
            &sidecar_bin()?,
            bed.cluster.kubeconfig_path(),
            socket,
            registry,
            DRIVER,
            node,
            log,
        )?,
        Some(bin) => ManagedProcess::spawn(
            "upstream-registrar",
            bin,
            &[
                format!("--csi-address={}", socket.display()),
                format!("--kubelet-registration-path=/var/lib/kubelet/plugins/{DRIVER}/csi.sock"),
                format!("--plugin-registration-path={}", registry.display()),
            ],
            log,
        )?,
    };
    let socket = registration_socket(registry, DRIVER);
    register_when_ready(&socket)
        .await
        .map_err(|_| Error::Other(format!("no registration on {}", socket.display())))?;
    Ok(p)
}

pub async fn run(bed: &Bed, args: &Args) -> Result<String> {
    eprintln!("registrar: laying out {} CSINodes", args.csinodes);
    let t0 = Instant::now();
    objects::csinodes(
        &bed.client,
        "scale-node",
        args.csinodes,
        "other.bench.csiops.dev",
    )
    .await?;
    let laid = t0.elapsed();
    let node = bed.set.nodes[0].clone();
    let dir = bed.dir.join("registrar");
    std::fs::create_dir_all(&dir).map_err(|e| Error::Other(e.to_string()))?;
    let bin_dir = crate::bins::bin_dir()?;
    let socket = dir.join("mock.sock");
    let _driver = start_mock_driver(&bin_dir, &socket, DRIVER, &node, &dir.join("mock.log"))?;
    crate::wait_for(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { socket.exists().then_some(()) },
    )
    .await
    .map_err(|_| Error::Other("csi-mock-driver made no socket".into()))?;

    let mut rows = String::new();
    let mut sides: Vec<(&str, Option<&Path>)> = vec![("csiops registrar", None)];
    let up = super::given(&args.upstream_registrar);
    if let Some(up) = &up {
        sides.push(("upstream node-driver-registrar", Some(up.as_path())));
    }
    for (name, upstream) in sides {
        eprintln!("registrar: {name}");
        let registry = dir.join(if upstream.is_some() {
            "reg-upstream"
        } else {
            "reg"
        });
        std::fs::create_dir_all(&registry).map_err(|e| Error::Other(e.to_string()))?;
        let log = dir.join(format!("{}.log", name.replace(' ', "-")));
        let mut first = start(bed, upstream, &socket, &registry, &node, &log).await?;
        if upstream.is_none() {
            // Ours writes its entry into the node's CSINode.
            let csinodes: Api<CSINode> = Api::all(bed.client.clone());
            crate::wait_for(
                Duration::from_secs(60),
                Duration::from_millis(200),
                || async {
                    csinodes
                        .get_opt(&node)
                        .await
                        .ok()
                        .flatten()
                        .filter(|c| c.spec.drivers.iter().any(|d| d.name == DRIVER))
                },
            )
            .await
            .map_err(|_| {
                Error::Other(format!(
                    "{name} never wrote its CSINode entry\n{}",
                    first.log_tail(20)
                ))
            })?;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        first.kill9();
        let a0 = ApiCount::take(&bed.client).await?;
        let mut again = start(bed, upstream, &socket, &registry, &node, &log).await?;
        tokio::time::sleep(Duration::from_secs(10)).await;
        again.check_running()?;
        let d = ApiCount::take(&bed.client).await?.since(&a0);
        rows += &format!(
            "| {name} | {} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            args.csinodes, d.list, d.listed_objects, d.get, d.writes
        );
        drop(again);
    }
    if up.is_none() {
        rows += &super::no_upstream("node-driver-registrar", "UPSTREAM_REGISTRAR");
    }
    Ok(format!(
        "### Restart of a node's registrar among {n} nodes' CSINodes\n\n\
         {n} CSINodes laid out in {laid:.0} s; the registrar of {node} killed and started again, \
         counted from the restart to 10 s after its registration (kube-apiserver's count over the sidecars' \
         resources, Leases apart; nothing else runs then but the control plane and kwok).\n\n\
         | registrar | CSINodes in the cluster | LIST requests | objects the lists returned | GETs | writes |\n\
         |---|---|---|---|---|---|\n{rows}\n",
        n = args.csinodes,
        laid = laid.as_secs_f64(),
    ))
}
