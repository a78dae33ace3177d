//! `csiops-sidecar attacher`: the external-attacher behaviour of the CSI
//! design doc and the upstream README.
//!
//! Pure decision logic, each a function of its inputs with table tests:
//! - [`finalizer`]: upstream's finalizer name;
//! - [`node`]: the driver's node ID of a node, from the caches;
//! - [`request`]: ControllerPublish/Unpublish requests from the PV;
//! - [`decide`]: what a VolumeAttachment or PV needs;
//! - [`status`]: the patch bodies.

pub mod cache;
pub mod controller;
pub mod csi;
pub mod decide;
pub mod finalizer;
pub mod metrics;
pub mod node;
pub mod request;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use csiops_proto::csi::v1::controller_service_capability::rpc::Type as Cap;

use crate::common::args::{parse_duration, CommonArgs};
use crate::common::controller::{lease_name, run_as_leader, ControllerArgs, LeadError};
use crate::common::driver::Driver;
use crate::common::http::{self, HealthCheck};
use crate::common::kube::{KubeArgs, KubeError};
use crate::common::metrics::Metrics;
use crate::common::shutdown::Shutdown;
use crate::SidecarError;

/// Flags of `attacher`: upstream external-attacher's names and defaults.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("timeout", |a| a.default_value("15s")))]
pub struct AttacherArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    #[command(flatten)]
    pub kube: KubeArgs,

    #[command(flatten)]
    pub controller: ControllerArgs,

    /// Workers of the attach queue, and as many of the detach queue (which
    /// upstream shares with attaches) and of the PV queue.
    #[arg(long, default_value_t = 10)]
    pub worker_threads: usize,

    /// Filesystem type published for a mount volume whose PV has no `csi.fsType`.
    #[arg(long, default_value = "")]
    pub default_fstype: String,

    /// How often every VolumeAttachment is queued again (0 disables).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub resync: Duration,

    /// Accepted for compatibility: upstream's interval of re-checking attached
    /// volumes with LIST_VOLUMES_PUBLISHED_NODES, which this attacher does not do.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub reconcile_sync: Duration,

    /// Deprecated upstream alias of `--http-endpoint` (used only when that is empty).
    #[arg(long, default_value = "")]
    pub metrics_address: String,

    /// Accepted and ignored (upstream: page size of ListVolumes for the reconciler).
    #[arg(long, default_value_t = 0, hide = true)]
    pub max_entries: i64,

    /// Accepted and ignored (upstream: truncation of logged gRPC responses).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, hide = true)]
    pub max_grpc_log_length: i64,

    /// Accepted and ignored (older upstream flag; the driver is waited for without limit).
    #[arg(long, value_parser = parse_duration, hide = true)]
    pub connection_timeout: Option<Duration>,
}

/// Why the attacher stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AttacherError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("ControllerGetCapabilities: {0}")]
    Capabilities(tonic::Status),
    #[error(transparent)]
    Lead(#[from] LeadError<controller::ControllerError>),
}

/// Runs until SIGTERM (or lost leadership, an error).
pub async fn run(args: AttacherArgs) -> Result<(), SidecarError> {
    // Flags first: nothing below may wait (for the driver, the API server)
    // before a wrong flag is reported.
    let backoff = args.controller.check().map_err(SidecarError::Flag)?;
    args.kube
        .check()
        .map_err(|e| SidecarError::Flag(e.to_string()))?;
    let http_endpoint = if args.common.http_endpoint.is_empty() {
        args.metrics_address.clone()
    } else {
        args.common.http_endpoint.clone()
    };
    let http_addr = crate::common::args::parse_endpoint(&http_endpoint)
        .map_err(|e| SidecarError::Flag(format!("--http-endpoint: {e}")))?;
    let (shutdown, _trigger) = Shutdown::on_signals();
    let requests = crate::common::kube::ApiRequests::default();
    let client = crate::common::kube::client(&args.kube, &requests)
        .await
        .map_err(AttacherError::from)?;
    let queues = controller::Queues::new(backoff);
    let writes = metrics::Writes::default();
    let mut registry = Metrics::new();
    requests.register(registry.registry_mut());
    registry
        .registry_mut()
        .register_collector(Box::new(queues.metrics()));
    writes.register(registry.registry_mut());
    let metrics = Arc::new(registry);

    let Some(driver) = Driver::connect_ready(
        &args.common.csi_address,
        args.common.timeout,
        metrics.clone(),
        &shutdown,
    )
    .await
    else {
        return Ok(());
    };
    let Some(driver_name) = driver.driver_name_waiting(&shutdown).await else {
        return Ok(());
    };
    metrics.set_driver_name(&driver_name);
    let caps = driver
        .controller_capabilities()
        .await
        .map_err(AttacherError::Capabilities)?;
    let mode = if caps.contains(&Cap::PublishUnpublishVolume) {
        decide::Mode::Real
    } else {
        decide::Mode::Trivial
    };
    let publish_caps = request::PublishCaps {
        publish_readonly: caps.contains(&Cap::PublishReadonly),
        single_node_multi_writer: caps.contains(&Cap::SingleNodeMultiWriter),
    };
    tracing::info!(driver = %driver_name, ?mode, ?publish_caps, "driver found");

    let health_driver = driver.clone();
    let probe_timeout = args.common.timeout;
    let check: HealthCheck = Arc::new(move || {
        let driver = health_driver.clone();
        Box::pin(async move {
            match driver.probe(probe_timeout).await {
                Ok(true) => Ok(()),
                Ok(false) => Err("driver not ready".to_string()),
                Err(s) => Err(format!("driver unreachable: {}", s.message())),
            }
        })
    });
    let http_task = match http_addr {
        Some(addr) => {
            let stop = shutdown.clone();
            Some(
                http::serve(
                    addr,
                    http::router(metrics.clone(), &args.common.metrics_path, check),
                    async move { stop.wait().await },
                )
                .await
                .map_err(|source| SidecarError::Bind { addr, source })?,
            )
        }
        None => None,
    };

    let cfg = controller::Config {
        driver_name: driver_name.clone(),
        mode,
        caps: publish_caps,
        default_fs_type: args.default_fstype.clone(),
        timeout: args.common.timeout,
        workers: args.worker_threads,
        resync: args.resync,
    };
    let (ctrl, watches) = controller::Controller::new(cfg, client.clone(), driver, queues, writes);
    let election = args.controller.leader_election.then(|| {
        args.controller
            .leader_config(&lease_name("external-attacher-leader-", &driver_name))
    });
    let stop = shutdown.clone();
    let lead_client = crate::common::kube::election_client(&args.kube)
        .await
        .map_err(AttacherError::from)?;
    let outcome = run_as_leader(lead_client, election, &shutdown, move || {
        ctrl.run(watches, stop)
    })
    .await;
    if let Some(task) = http_task {
        let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
    }
    outcome.map_err(|e| SidecarError::from(AttacherError::from(e)))
}
