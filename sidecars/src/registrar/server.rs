//! kubelet's plugin registration API: kubelet calls GetInfo, then tells the
//! outcome through NotifyRegistrationStatus. The outcome is published as a
//! [`Verdict`]: the CSINode maintenance writes only once kubelet accepted the
//! driver, and a refusal ends the process.

use csiops_proto::pluginregistration::registration_server::Registration;
use csiops_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// Plugin type kubelet expects from a CSI driver.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// Versions of the kubelet ↔ driver protocol we speak.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// What kubelet last said about this registration socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No NotifyRegistrationStatus yet (or a new socket kubelet has not
    /// registered again).
    Pending,
    /// `plugin_registered = true`.
    Registered,
    /// `plugin_registered = false`, with kubelet's error.
    Refused(String),
}

/// The service; kubelet's verdicts go to `verdict`.
pub struct RegistrationService {
    pub driver_name: String,
    /// The driver socket as kubelet sees it (`--kubelet-registration-path`).
    pub endpoint: String,
    pub verdict: watch::Sender<Verdict>,
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
        let verdict = if status.plugin_registered {
            tracing::info!(driver = %self.driver_name, "kubelet registered the driver");
            Verdict::Registered
        } else {
            tracing::error!(driver = %self.driver_name, error = %status.error, "kubelet refused the registration");
            Verdict::Refused(status.error)
        };
        // send_replace: the value must land even when nobody watches yet.
        self.verdict.send_replace(verdict);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
