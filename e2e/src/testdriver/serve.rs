//! Serving the driver on its unix socket until SIGTERM/SIGINT.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csiops_proto::csi::v1::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tonic::transport::Server;

use super::config::Config;
use super::service::{Driver, DriverHandle};

/// How long in-flight calls get after SIGTERM before the process exits anyway.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The socket path of `--endpoint`: `unix:///p`, `unix:/p` or a plain path.
pub fn endpoint_path(endpoint: &str) -> Result<PathBuf, String> {
    csiops_proto::client::socket_path(endpoint).map_err(|e| format!("--endpoint {endpoint:?}: {e}"))
}

/// Binds `path`: creates the parent dir, removes a stale socket; a socket
/// that still accepts connections, or a non-socket file, is an error.
pub fn bind(path: &Path) -> Result<UnixListener, String> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(format!("{} is in use by a running server", path.display()));
            }
            std::fs::remove_file(path)
                .map_err(|e| format!("removing stale socket {}: {e}", path.display()))?;
        }
        Ok(_) => return Err(format!("{} exists and is not a socket", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    UnixListener::bind(path).map_err(|e| format!("binding {}: {e}", path.display()))
}

/// Serves Identity, Controller and Node on `--endpoint` until SIGTERM or
/// SIGINT, then removes the socket. Needs a tokio runtime.
pub async fn run(cfg: Config) -> Result<(), String> {
    let endpoint = cfg.endpoint.as_deref().ok_or("--endpoint is required")?;
    let path = endpoint_path(endpoint)?;
    let driver = Arc::new(Driver::new(&cfg)?);
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    let listener = bind(&path)?;
    tracing::info!(
        endpoint = %path.display(),
        driver = %driver.name,
        version = %driver.version,
        node_id = %driver.node_id,
        state_dir = %driver.state_dir().display(),
        enable_attach = driver.enable_attach,
        enable_modify = driver.enable_modify,
        node_local = driver.is_node_local(),
        "serving"
    );
    let handle = DriverHandle(driver);
    let server = Server::builder()
        .add_service(IdentityServer::new(handle.clone()))
        .add_service(ControllerServer::new(handle.clone()))
        .add_service(NodeServer::new(handle))
        // Clients that dial by path send it as `:authority`; see
        // csiops_proto::authority.
        .serve_with_incoming(csiops_proto::authority::incoming(listener));
    let result = tokio::select! {
        r = server => r.map_err(|e| format!("gRPC server: {e}")),
        _ = term.recv() => { tracing::info!("SIGTERM: stopping"); Ok(()) }
        _ = int.recv() => { tracing::info!("SIGINT: stopping"); Ok(()) }
    };
    // Dropping the server future closes the listener and every connection;
    // calls still running finish their state transaction on the blocking
    // pool (the runtime waits SHUTDOWN_GRACE for them on drop).
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "removing socket");
        }
    }
    result
}
