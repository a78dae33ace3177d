//! The CSI driver as the sidecars see it: one kept connection, per-call
//! deadlines, every call timed into `csi_sidecar_operations_seconds`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csiops_proto::client::{self, ConnectError, CsiClient};
use csiops_proto::csi::v1::controller_service_capability::rpc::Type as ControllerCapability;
use csiops_proto::csi::v1::controller_service_capability::Type as ControllerCapabilityType;
use csiops_proto::csi::v1::plugin_capability::service::Type as PluginServiceType;
use csiops_proto::csi::v1::plugin_capability::Type as PluginCapabilityType;
use csiops_proto::csi::v1::{
    ControllerGetCapabilitiesRequest, GetPluginCapabilitiesRequest, GetPluginInfoRequest,
    GetPluginInfoResponse, NodeGetInfoRequest, NodeGetInfoResponse, ProbeRequest,
};
use tonic::{Code, Status};

use super::metrics::Metrics;
use csiops_runtime::chain;
use csiops_runtime::shutdown::CancellationToken;

/// A connected driver.
#[derive(Clone)]
pub struct Driver {
    client: CsiClient,
    metrics: Arc<Metrics>,
}

/// Upstream's label value of a gRPC code (`OK`, `DeadlineExceeded`, …).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

impl Driver {
    /// Connects once (no retry).
    pub async fn connect(
        address: &str,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ConnectError> {
        let client = CsiClient::connect(address, timeout).await?;
        Ok(Self { client, metrics })
    }

    /// Connects, retrying with backoff (1s doubling to 10s) until the driver's
    /// socket answers or `shutdown` fires (`None`).
    pub async fn connect_waiting(
        address: &str,
        timeout: Duration,
        metrics: Arc<Metrics>,
        shutdown: &CancellationToken,
    ) -> Option<Self> {
        retrying(Duration::from_secs(1), shutdown, || async {
            match Self::connect(address, timeout, metrics.clone()).await {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::warn!(error = %chain(&e), "waiting for the CSI driver");
                    None
                }
            }
        })
        .await
    }

    /// Connects (retrying) and Probes until the driver says it is ready: how
    /// the controller sidecars start. `None` when `shutdown` fires first.
    pub async fn connect_ready(
        address: &str,
        timeout: Duration,
        metrics: Arc<Metrics>,
        shutdown: &CancellationToken,
    ) -> Option<Self> {
        let driver = Self::connect_waiting(address, timeout, metrics, shutdown).await?;
        driver
            .probe_until_ready(timeout, shutdown)
            .await
            .then_some(driver)
    }

    /// The gRPC client, for the calls a role makes through [`Self::timed`].
    pub fn client(&self) -> &CsiClient {
        &self.client
    }

    /// Runs one call and records it under `method` (the full gRPC method
    /// name, e.g. `/csi.v1.Controller/CreateVolume`, as upstream labels it).
    pub async fn timed<T, F>(&self, method: &'static str, call: F) -> Result<T, Status>
    where
        F: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let start = Instant::now();
        let res = call.await;
        let code = match &res {
            Ok(_) => Code::Ok,
            Err(s) => s.code(),
        };
        self.metrics
            .observe(method, code_name(code), start.elapsed());
        res.map(tonic::Response::into_inner)
    }

    pub async fn plugin_info(&self) -> Result<GetPluginInfoResponse, Status> {
        let mut c = self.client.identity();
        self.timed(
            "/csi.v1.Identity/GetPluginInfo",
            c.get_plugin_info(GetPluginInfoRequest {}),
        )
        .await
    }

    /// Probe with its own deadline; `Ok(false)` when the driver says it is not ready.
    pub async fn probe(&self, timeout: Duration) -> Result<bool, Status> {
        let mut c = self.client.identity();
        let req = client::with_timeout(ProbeRequest {}, timeout);
        let resp = self.timed("/csi.v1.Identity/Probe", c.probe(req)).await?;
        // An absent `ready` means ready (CSI spec).
        Ok(resp.ready.unwrap_or(true))
    }

    pub async fn node_get_info(&self) -> Result<NodeGetInfoResponse, Status> {
        let mut c = self.client.node();
        self.timed(
            "/csi.v1.Node/NodeGetInfo",
            c.node_get_info(NodeGetInfoRequest {}),
        )
        .await
    }

    /// The plugin's service capabilities (CONTROLLER_SERVICE,
    /// VOLUME_ACCESSIBILITY_CONSTRAINTS, …); unknown values are skipped.
    pub async fn plugin_capabilities(&self) -> Result<Vec<PluginServiceType>, Status> {
        let mut c = self.client.identity();
        let resp = self
            .timed(
                "/csi.v1.Identity/GetPluginCapabilities",
                c.get_plugin_capabilities(GetPluginCapabilitiesRequest {}),
            )
            .await?;
        Ok(resp
            .capabilities
            .into_iter()
            .filter_map(|cap| match cap.r#type? {
                PluginCapabilityType::Service(s) => PluginServiceType::try_from(s.r#type).ok(),
                _ => None,
            })
            .collect())
    }

    /// The controller's RPC capabilities (CREATE_DELETE_VOLUME,
    /// PUBLISH_UNPUBLISH_VOLUME, …); unknown values are skipped.
    pub async fn controller_capabilities(&self) -> Result<Vec<ControllerCapability>, Status> {
        let mut c = self.client.controller();
        let resp = self
            .timed(
                "/csi.v1.Controller/ControllerGetCapabilities",
                c.controller_get_capabilities(ControllerGetCapabilitiesRequest {}),
            )
            .await?;
        Ok(resp
            .capabilities
            .into_iter()
            .filter_map(|cap| match cap.r#type? {
                ControllerCapabilityType::Rpc(rpc) => {
                    ControllerCapability::try_from(rpc.r#type).ok()
                }
            })
            .collect())
    }

    /// A health check's verdict of one Probe: `Err` with the reason a
    /// `/healthz` answers with.
    pub async fn health(&self, timeout: Duration) -> Result<(), String> {
        match self.probe(timeout).await {
            Ok(true) => Ok(()),
            Ok(false) => Err("driver responded but is not ready".to_string()),
            Err(s) => Err(format!(
                "probe failed: {}: {}",
                code_name(s.code()),
                s.message()
            )),
        }
    }

    /// Probe until the driver says it is ready, retrying with backoff
    /// (`false` when `shutdown` fires first).
    pub async fn probe_until_ready(&self, timeout: Duration, shutdown: &CancellationToken) -> bool {
        retrying(Duration::from_millis(500), shutdown, || async {
            match self.probe(timeout).await {
                Ok(true) => Some(()),
                Ok(false) => {
                    tracing::info!("driver not ready yet");
                    None
                }
                Err(e) => {
                    tracing::warn!(code = ?e.code(), message = %e.message(), "Probe failed; retrying");
                    None
                }
            }
        })
        .await
        .is_some()
    }

    /// GetPluginInfo, retried with backoff until it answers with a name or
    /// `shutdown` fires. A driver still starting refuses or times out first.
    pub async fn driver_name_waiting(&self, shutdown: &CancellationToken) -> Option<String> {
        retrying(Duration::from_millis(500), shutdown, || async {
            match self.plugin_info().await {
                Ok(info) if !info.name.is_empty() => Some(info.name),
                Ok(_) => {
                    tracing::warn!("driver answered GetPluginInfo with an empty name");
                    None
                }
                Err(e) => {
                    tracing::warn!(code = ?e.code(), message = %e.message(), "GetPluginInfo failed; retrying");
                    None
                }
            }
        })
        .await
    }
}

/// Runs `attempt` until it gives `Some`, waiting `first` between tries,
/// doubling up to 10s; `None` once `shutdown` fires. Each attempt logs its
/// own failure.
async fn retrying<T, F, Fut>(
    first: Duration,
    shutdown: &CancellationToken,
    mut attempt: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let mut delay = first;
    loop {
        if let Some(v) = attempt().await {
            return Some(v);
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return None,
        }
        delay = (delay * 2).min(Duration::from_secs(10));
    }
}

/// Set by the operator in every bundled sidecar: the CSIDriverDeployment's
/// `spec.driverName`, which the CSIDriver object, the StorageClasses'
/// provisioner and REGISTERED are all keyed on.
pub const EXPECTED_NAME_ENV: &str = "CSIOPS_DRIVER_NAME";

/// The driver reports another name than the one it is deployed as.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the driver reports the name {reported:?} (GetPluginInfo) but its CSIDriverDeployment's \
     spec.driverName is {expected:?}: kubelet would register it, and the sidecars serve it, \
     under a name that its CSIDriver object and StorageClasses do not use; set spec.driverName \
     to {reported:?} or configure the driver to report {expected:?}"
)]
pub struct NameMismatch {
    pub reported: String,
    pub expected: String,
}

/// Checks GetPluginInfo's `reported` name against `expected` (the value of
/// [`EXPECTED_NAME_ENV`]; unset or empty: a drop-in outside the operator,
/// nothing to compare with).
pub fn check_name(reported: &str, expected: Option<&str>) -> Result<(), NameMismatch> {
    match expected.map(str::trim).filter(|e| !e.is_empty()) {
        Some(expected) if expected != reported => Err(NameMismatch {
            reported: reported.to_string(),
            expected: expected.to_string(),
        }),
        _ => Ok(()),
    }
}

/// [`check_name`] against this process's environment.
pub fn check_name_from_env(reported: &str) -> Result<(), NameMismatch> {
    check_name(reported, std::env::var(EXPECTED_NAME_ENV).ok().as_deref())
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn a_driver_must_report_the_name_it_is_deployed_as() {
        assert_eq!(check_name("a.csi", Some("a.csi")), Ok(()));
        // Not deployed by the operator: nothing to compare with.
        assert_eq!(check_name("a.csi", None), Ok(()));
        assert_eq!(check_name("a.csi", Some(" ")), Ok(()));
        let err = check_name("hostpath.csi.k8s.io", Some("a.csi")).expect_err("mismatch");
        let msg = err.to_string();
        assert!(
            msg.contains("\"hostpath.csi.k8s.io\" (GetPluginInfo)")
                && msg.contains("spec.driverName is \"a.csi\""),
            "{msg}"
        );
    }
}
