//! kubelet's plugin registration API: kubelet calls GetInfo, then tells the
//! outcome through NotifyRegistrationStatus.

use csiops_proto::pluginregistration::registration_server::Registration;
use csiops_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

/// Plugin type kubelet expects from a CSI driver.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// Versions of the kubelet ↔ driver protocol we speak.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// The service, with a channel that reports kubelet's refusals.
pub struct RegistrationService {
    pub driver_name: String,
    /// The driver socket as kubelet sees it (`--kubelet-registration-path`).
    pub endpoint: String,
    pub refusals: mpsc::Sender<String>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::info!(driver = %self.driver_name, "kubelet asked for plugin info");
        Ok(Response::new(PluginInfo {
            r#type: CSI_PLUGIN.to_string(),
            name: self.driver_name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.driver_name, "kubelet registered the driver");
        } else {
            tracing::error!(driver = %self.driver_name, error = %status.error, "kubelet refused the registration");
            let _ = self.refusals.send(status.error).await;
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
