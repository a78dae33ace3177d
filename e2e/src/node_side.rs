//! The node side of a simulated node: a real CSI driver process on a unix
//! socket, and kubelet's plugin watcher talking to a registration socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csiops_proto::client;
use csiops_proto::pluginregistration::registration_client::RegistrationClient;
use csiops_proto::pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus};

use crate::process::ManagedProcess;
use crate::{Error, Result};

/// Starts `csi-mock-driver` (Kubernetes' e2e CSI driver) on `socket`.
pub fn start_mock_driver(
    bin_dir: &Path,
    socket: &Path,
    driver: &str,
    node_id: &str,
    log: &Path,
) -> Result<ManagedProcess> {
    let args = vec![
        format!("--endpoint={}", socket.display()),
        format!("--drivername={driver}"),
        format!("--nodeid={node_id}"),
        "--attach-limit=10".to_string(),
        "--enable-topology".to_string(),
    ];
    ManagedProcess::spawn(
        "csi-mock-driver",
        &bin_dir.join("csi-mock-driver"),
        &args,
        log,
    )
}

/// The registration socket of `driver` in a plugins_registry directory.
pub fn registration_socket(registry: &Path, driver: &str) -> PathBuf {
    registry.join(format!("{driver}-reg.sock"))
}

async fn registration_client(socket: &Path) -> Result<RegistrationClient<client::CsiChannel>> {
    let channel = client::connect(&socket.to_string_lossy(), Duration::from_secs(5))
        .await
        .map_err(|e| Error::Other(e.to_string()))?;
    Ok(RegistrationClient::new(channel))
}

/// What kubelet's plugin watcher does with a new socket: GetInfo, then
/// NotifyRegistrationStatus with the outcome (`Ok` registers).
pub async fn kubelet_register(
    socket: &Path,
    outcome: std::result::Result<(), String>,
) -> Result<PluginInfo> {
    let mut c = registration_client(socket).await?;
    let info = c
        .get_info(InfoRequest {})
        .await
        .map_err(|s| Error::Other(format!("GetInfo: {s}")))?
        .into_inner();
    let status = match outcome {
        Ok(()) => RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        },
        Err(e) => RegistrationStatus {
            plugin_registered: false,
            error: e,
        },
    };
    c.notify_registration_status(status)
        .await
        .map_err(|s| Error::Other(format!("NotifyRegistrationStatus: {s}")))?;
    Ok(info)
}
