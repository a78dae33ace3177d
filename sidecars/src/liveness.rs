//! `csiops-sidecar liveness-probe`: `/healthz` runs the driver's Probe over one
//! kept connection, so kubelet's liveness probe of the driver container checks
//! the driver itself, not just that a process exists.
//!
//! 200 `ok` when Probe succeeds and the driver is ready; 500 with the driver's
//! error, or `driver responded but is not ready`. The connection is made on the
//! first request and reused; if the driver restarts, the same channel
//! reconnects on the next call.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::sync::Mutex;

use std::net::SocketAddr;

use crate::common::args::{parse_duration, parse_endpoint, CommonArgs, FlagError};
use crate::common::driver::Driver;
use crate::common::metrics::Metrics;
use crate::common::role::Role;
use crate::SidecarError;
use csiops_runtime::admin::HealthCheck;
use csiops_runtime::chain;

/// Flags of `liveness-probe` (upstream livenessprobe's names).
#[derive(Debug, Clone, Args)]
pub struct LivenessArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Deadline of each Probe call (upstream's default, 3s).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub probe_timeout: Duration,

    /// Port of /healthz on every address when --http-endpoint is not set
    /// (upstream's default 9808; another value next to --http-endpoint is
    /// an error, as upstream).
    #[arg(long, default_value_t = DEFAULT_HEALTH_PORT)]
    pub health_port: u16,

    /// Deprecated upstream: a second server with the metrics on this
    /// `host:port` (and --metrics-path); not together with --http-endpoint.
    #[arg(long, default_value = "")]
    pub metrics_address: String,
}

/// livenessprobe's default `--health-port`.
pub const DEFAULT_HEALTH_PORT: u16 = 9808;

/// Where /healthz and the metrics are served, from the flags as
/// livenessprobe combines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    pub health: SocketAddr,
    pub metrics: Option<SocketAddr>,
}

impl LivenessArgs {
    /// The endpoints, or the flag combination upstream refuses.
    pub fn endpoints(&self) -> Result<Endpoints, FlagError> {
        let http = self.common.http_addr()?;
        let metrics = parse_endpoint(&self.metrics_address)
            .map_err(|e| FlagError::new("--metrics-address", e))?;
        if http.is_some() && self.health_port != DEFAULT_HEALTH_PORT {
            return Err(FlagError::new(
                "--health-port, --http-endpoint",
                "only one of --health-port and --http-endpoint can be explicitly set",
            ));
        }
        if http.is_some() && metrics.is_some() {
            return Err(FlagError::new(
                "--metrics-address, --http-endpoint",
                "only one of --metrics-address and --http-endpoint can be explicitly set",
            ));
        }
        Ok(Endpoints {
            health: http.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], self.health_port))),
            metrics,
        })
    }
}

/// The probe: a lazily made, kept driver connection.
pub struct Prober {
    address: String,
    connect_timeout: Duration,
    probe_timeout: Duration,
    metrics: Arc<Metrics>,
    driver: Mutex<Option<Driver>>,
}

impl Prober {
    pub fn new(
        address: &str,
        connect_timeout: Duration,
        probe_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            address: address.to_string(),
            connect_timeout,
            probe_timeout,
            metrics,
            driver: Mutex::new(None),
        }
    }

    async fn driver(&self) -> Result<Driver, String> {
        let mut slot = self.driver.lock().await;
        if let Some(d) = slot.as_ref() {
            return Ok(d.clone());
        }
        let d = Driver::connect(&self.address, self.connect_timeout, self.metrics.clone())
            .await
            .map_err(|e| chain(&e).to_string())?;
        if let Ok(info) = d.plugin_info().await {
            self.metrics.set_driver_name(&info.name);
        }
        *slot = Some(d.clone());
        Ok(d)
    }

    /// One health check.
    pub async fn check(&self) -> Result<(), String> {
        self.driver().await?.health(self.probe_timeout).await
    }
}

/// Runs until SIGTERM.
pub async fn run(args: LivenessArgs) -> Result<(), SidecarError> {
    let endpoints = args.endpoints()?;
    let mut role = Role::start();
    let metrics = Arc::new(Metrics::new());
    let prober = Arc::new(Prober::new(
        &args.common.csi_address,
        args.common.timeout,
        args.probe_timeout,
        metrics.clone(),
    ));
    let check: HealthCheck = Arc::new(move || {
        let p = prober.clone();
        Box::pin(async move { p.check().await })
    });
    // The separate metrics server of --metrics-address also answers
    // /healthz (with the same check): one kind of server, two ports. No
    // --kubeconfig here (upstream has none): with --metrics-auth the
    // client is in-cluster, or KUBECONFIG's.
    role.serve_admin(
        Some(endpoints.health),
        &args.common,
        &metrics,
        check.clone(),
        None,
    )
    .await?;
    if let Some(addr) = endpoints.metrics {
        role.serve_admin(Some(addr), &args.common, &metrics, check, None)
            .await?;
    }
    tracing::info!(csi_address = %args.common.csi_address, "liveness probe ready");
    role.shutdown.cancelled().await;
    role.finish(Ok(())).await
}
