//! `csiops-sidecar registrar`: registers the driver with kubelet through the
//! plugin registration API and keeps this node's CSINode entry (node ID,
//! topology keys, volume limit), topology labels and node-ID annotation.
//!
//! 1. Connect to the driver and ask GetPluginInfo, retrying while it starts.
//! 2. Serve `Registration` on `<plugin-registration-path>/<driver>-reg.sock`,
//!    bound privately; re-create the socket if something removes it.
//!    Connections go through `csiops_proto::authority`, because kubelet
//!    sends the socket path as `:authority`, which tonic's HTTP/2 layer
//!    rejects.
//! 3. Once kubelet reports the registration accepted (NotifyRegistrationStatus
//!    with `plugin_registered`), keep the CSINode (see `sync`); nothing is
//!    written before, so a CSINode entry means kubelet can use the driver.
//!    With `--readiness-taint-key`, the node's driver-readiness taint is
//!    removed once that entry is written (see `taint`).
//!    This maintenance needs a node name and API permission (see `access`);
//!    without them it is off, said once, and steps 1, 2 and 4 work as
//!    upstream's node-driver-registrar, which has no Kubernetes access.
//! 4. kubelet refusing the registration ends the process non-zero; SIGTERM
//!    removes the socket and, unless `--keep-registration-on-exit`, this
//!    driver's CSINode entry and annotation key.

pub mod access;
pub mod health;
pub mod nodeinfo;
pub mod server;
pub mod socket;
pub mod sync;
pub mod taint;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use csiops_proto::pluginregistration::registration_server::RegistrationServer;
use tokio::sync::watch;

use crate::common::args::{CommonArgs, FlagError};
use crate::common::metrics::Metrics;
use crate::common::role::{Role, Wait};
use crate::SidecarError;
use csiops_runtime::chain;

/// How often the registration socket is checked for removal.
const SOCKET_CHECK: Duration = Duration::from_secs(2);
/// How long cleanup on SIGTERM may take.
const CLEANUP_DEADLINE: Duration = Duration::from_secs(10);

/// Flags of `registrar` (upstream node-driver-registrar's names, plus CSINode maintenance).
///
/// `--timeout` defaults to 10s here (upstream's registrar: 1s, for its
/// GetPluginInfo only): it is also the deadline of the NodeGetInfo the CSINode
/// maintenance asks every `--node-info-interval`, and a driver busy for a
/// second is not a failing one (kubelet gives its own NodeGetInfo minutes).
#[derive(Debug, Clone, Args)]
#[command(mut_arg("timeout", |a| a.default_value("10s")))]
pub struct RegistrarArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Path of the driver socket on the host, as kubelet must dial it.
    #[arg(long)]
    pub kubelet_registration_path: String,

    /// Directory kubelet's plugin watcher watches (plugins_registry mounted here).
    #[arg(long, default_value = "/registration")]
    pub plugin_registration_path: PathBuf,

    /// Upstream's deprecated port of /healthz on every address (0: none);
    /// not together with --http-endpoint.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub health_port: i64,

    /// Upstream's deprecated mode: `kubelet-registration-probe` exits 0 at
    /// once (as upstream, which no longer needs that probe); any other value
    /// registers.
    #[arg(long, default_value = "")]
    pub mode: String,

    /// This node's name, for CSINode maintenance; else `KUBE_NODE_NAME`,
    /// else `NODE_NAME`. Without one, maintenance is off (registration works).
    #[arg(long)]
    pub node_name: Option<String>,

    /// Keep this driver's CSINode entry and node ID on SIGTERM (upgrades).
    #[arg(long)]
    pub keep_registration_on_exit: bool,

    /// How often NodeGetInfo is re-asked, so a changed answer reaches
    /// CSINode. A failing call is retried with backoff and removes nothing;
    /// the entry goes only once the driver's socket has been absent for three
    /// intervals (the driver is gone).
    #[arg(long, default_value = "10s", value_parser = crate::common::args::parse_duration)]
    pub node_info_interval: Duration,

    /// Kubeconfig (out of cluster); default: in-cluster or KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// Taint key to remove from this node once kubelet has accepted the
    /// registration and the CSINode entry is written (the operator passes
    /// `csiops.dev/driver-not-ready.<driver>`). Other taints are never
    /// touched. Empty: taints are left alone.
    #[arg(long, default_value = "")]
    pub readiness_taint_key: String,
}

/// upstream's `--mode` that only probed the registration.
pub const MODE_REGISTRATION_PROBE: &str = "kubelet-registration-probe";

impl RegistrarArgs {
    /// The admin endpoint: `:<--health-port>` when positive, else
    /// `--http-endpoint`; both is an error, as upstream.
    pub fn admin_addr(&self) -> Result<Option<std::net::SocketAddr>, FlagError> {
        if self.health_port > 0 && !self.common.http_endpoint.is_empty() {
            return Err(FlagError::new(
                "--health-port, --http-endpoint",
                "only one of --health-port and --http-endpoint can be set",
            ));
        }
        if self.health_port > 0 {
            let port = u16::try_from(self.health_port)
                .map_err(|_| FlagError::new("--health-port", "not a TCP port"))?;
            return Ok(Some(std::net::SocketAddr::from(([0, 0, 0, 0], port))));
        }
        self.common.http_addr()
    }
}

/// Why the registrar stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RegistrarError {
    #[error("kubelet refused the registration: {error}")]
    Refused { error: String },
    #[error("cannot create the registration socket {path}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One generation of the registration server on one socket.
struct Served {
    task: tokio::task::JoinHandle<()>,
    identity: (u64, u64),
}

fn serve_registration(
    path: &std::path::Path,
    driver_name: &str,
    endpoint: &str,
    verdict: &watch::Sender<server::Verdict>,
) -> Result<Served, RegistrarError> {
    let (listener, identity) =
        socket::bind_private(path).map_err(|source| RegistrarError::Socket {
            path: path.to_path_buf(),
            source,
        })?;
    let service = server::RegistrationService {
        driver_name: driver_name.to_string(),
        endpoint: endpoint.to_string(),
        verdict: verdict.clone(),
    };
    let task = tokio::spawn(async move {
        let res = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming(csiops_proto::authority::incoming(listener))
            .await;
        if let Err(e) = res {
            tracing::error!(error = %chain(&e), "registration server stopped");
        }
    });
    tracing::info!(path = %path.display(), "serving plugin registration");
    Ok(Served { task, identity })
}

/// Runs until SIGTERM or a refused registration.
pub async fn run(args: RegistrarArgs) -> Result<(), SidecarError> {
    let http_addr = args.admin_addr()?;
    if args.mode == MODE_REGISTRATION_PROBE {
        tracing::info!(mode = %args.mode, "--mode={MODE_REGISTRATION_PROBE} is no longer needed; exiting successfully, as upstream");
        return Ok(());
    }
    let node_name = access::node_name(args.node_name.as_deref(), |k| std::env::var(k).ok());
    let mut role = Role::start();
    let metrics = Arc::new(Metrics::new());

    let found = role
        .checked_driver(&args.common, &metrics, Wait::Connected)
        .await;
    let Some((driver, driver_name)) = (match found {
        Ok(found) => found,
        Err(e) => return role.finish(Err(e.into())).await,
    }) else {
        return role.finish(Ok(())).await;
    };
    tracing::info!(driver = %driver_name, node = ?node_name, "driver found");

    let path = socket::socket_path(&args.plugin_registration_path, &driver_name);
    let (verdict_tx, mut verdict) = watch::channel(server::Verdict::Pending);
    let mut served = serve_registration(
        &path,
        &driver_name,
        &args.kubelet_registration_path,
        &verdict_tx,
    )?;

    let check = health::check(path.clone(), driver_name.clone(), args.common.timeout);
    role.serve_admin(
        http_addr,
        &args.common,
        &metrics,
        check,
        args.kubeconfig.as_deref(),
    )
    .await?;
    let shutdown = role.shutdown.clone();

    // CSINode maintenance, if it can run (see `access`); decided beside the
    // registration, which never waits for the API server.
    let maintained: Arc<std::sync::Mutex<Option<sync::NodeInfoSync>>> = Arc::default();
    let sync_task = {
        let maintained = maintained.clone();
        let (driver, driver_name) = (driver.clone(), driver_name.clone());
        let (kubeconfig, interval) = (args.kubeconfig.clone(), args.node_info_interval);
        let driver_socket = csiops_proto::client::socket_path(&args.common.csi_address).ok();
        let kubelet = verdict.clone();
        let taint_key = Some(args.readiness_taint_key.clone()).filter(|k| !k.is_empty());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            match access::decide(node_name, kubeconfig.as_deref(), &stop).await {
                None => {}
                Some(Err(off)) => {
                    tracing::info!(
                        "CSINode maintenance is off: {}; registering with kubelet is unaffected, and kubelet writes this node's CSINode entry itself",
                        chain(&off)
                    );
                    if let Some(key) = &taint_key {
                        tracing::warn!(taint = %key, "the readiness taint cannot be removed from this node without CSINode maintenance");
                    }
                }
                Some(Ok((client, node))) => {
                    tracing::info!(node = %node, "CSINode maintenance is on");
                    let sync = sync::NodeInfoSync::new(
                        client,
                        node,
                        driver_name,
                        driver,
                        interval,
                        kubelet,
                    )
                    .with_readiness_taint(taint_key)
                    .with_driver_socket(driver_socket);
                    if let Ok(mut slot) = maintained.lock() {
                        *slot = Some(sync.clone());
                    }
                    sync.run(&stop).await;
                }
            }
        })
    };

    let mut check_socket = tokio::time::interval(SOCKET_CHECK);
    let outcome = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            Ok(()) = verdict.changed() => {
                if let server::Verdict::Refused(error) = &*verdict.borrow_and_update() {
                    break Err(RegistrarError::Refused { error: error.clone() });
                }
            }
            _ = check_socket.tick() => {
                if socket::identity(&path) != Some(served.identity) {
                    tracing::warn!(path = %path.display(), "registration socket was removed; re-creating it");
                    served.task.abort();
                    // kubelet deregisters a removed socket and registers the
                    // new one afresh: its earlier verdict no longer holds.
                    verdict_tx.send_replace(server::Verdict::Pending);
                    served = serve_registration(&path, &driver_name, &args.kubelet_registration_path, &verdict_tx)?;
                }
            }
        }
    };

    // Teardown: stop serving, remove our socket (kubelet then deregisters),
    // and unless kept, this driver's CSINode entry.
    served.task.abort();
    sync_task.abort();
    if socket::identity(&path) == Some(served.identity) {
        let _ = std::fs::remove_file(&path);
    }
    let sync = maintained.lock().ok().and_then(|mut s| s.take());
    if let (Some(sync), true) = (sync, outcome.is_ok() && !args.keep_registration_on_exit) {
        match tokio::time::timeout(CLEANUP_DEADLINE, sync.uninstall()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %chain(&e), "could not remove the CSINode entry on exit")
            }
            Err(_) => tracing::warn!("removing the CSINode entry on exit timed out"),
        }
    }
    role.finish(outcome.map_err(SidecarError::from)).await
}
