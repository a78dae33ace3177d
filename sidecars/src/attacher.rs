//! `csiops-sidecar attacher`: the external-attacher behaviour of the CSI
//! design doc and the upstream README.
//!
//! Pure decision logic, each a function of its inputs with table tests:
//! - [`finalizer`]: upstream's finalizer name;
//! - [`node`]: the driver's node ID of a node, from the caches;
//! - [`request`]: ControllerPublish/Unpublish requests from the PV;
//! - [`decide`]: what a VolumeAttachment or PV needs;
//! - [`status`]: the patch bodies.

pub mod controller;
pub mod csi;
pub mod decide;
pub mod finalizer;
pub mod metrics;
pub mod node;
pub mod published_sync;
pub mod request;
pub mod status;
pub mod sync;

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use csiops_proto::csi::v1::controller_service_capability::rpc::Type as Cap;

use std::net::SocketAddr;

use crate::common::args::{parse_duration, CommonArgs, FlagError};
use crate::common::controller::{lease_name, ControllerArgs};
use crate::common::goflags::IGNORED_HEADING;
use crate::common::kube::KubeArgs;
use crate::common::metrics::Metrics;
use crate::common::role::{lead, lease_guard, probe_check, Role, Wait};
use crate::common::workqueue::Backoff;
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

    /// How often attached volumes are checked against the driver's
    /// ListVolumes (drivers with LIST_VOLUMES_PUBLISHED_NODES); an attachment
    /// the driver lost is attached again. 0 disables.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub reconcile_sync: Duration,

    /// Page size of the published sync's ListVolumes (0: the driver decides).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    pub max_entries: i32,

    /// Deprecated upstream alias of `--http-endpoint` (only one may be set).
    #[arg(long, default_value = "")]
    pub metrics_address: String,

    /// Upstream feature gates (`Key=bool,...`): `ReleaseLeaderElectionOnExit`
    /// (the Lease is always released on exit here) and
    /// `MutableCSINodeAllocatableCount` (kubelet's business; the attacher
    /// only reports errors) are accepted and change nothing; others are refused.
    #[arg(long, default_value = "", value_parser = attacher_gates)]
    pub feature_gates: String,

    /// Ignored: gRPC responses are not logged, so there is nothing to truncate.
    #[arg(long, allow_negative_numbers = true, help_heading = IGNORED_HEADING)]
    pub max_grpc_log_length: Option<i64>,
}

/// Parses external-attacher's `--feature-gates`.
fn attacher_gates(s: &str) -> Result<String, String> {
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not Key=true|false"))?;
        if crate::common::goflags::go_bool(value.trim()).is_none() {
            return Err(format!("{item:?}: value must be true or false"));
        }
        if !matches!(
            key.trim(),
            "ReleaseLeaderElectionOnExit" | "MutableCSINodeAllocatableCount"
        ) {
            return Err(format!("unknown gate {:?}", key.trim()));
        }
    }
    Ok(s.to_string())
}

/// Why the attacher stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AttacherError {
    #[error("ControllerGetCapabilities failed")]
    Capabilities(#[source] tonic::Status),
    #[error(transparent)]
    Controller(#[from] controller::ControllerError),
}

impl AttacherArgs {
    /// Checks every flag clap cannot check alone; returns the backoff and
    /// the admin endpoint.
    pub fn check(&self) -> Result<(Backoff, Option<SocketAddr>), FlagError> {
        let backoff = self.controller.check()?;
        self.kube.check()?;
        let http_addr = self.common.http_or_metrics_addr(&self.metrics_address)?;
        Ok((backoff, http_addr))
    }
}

/// Runs until SIGTERM (or lost leadership, an error).
pub async fn run(args: AttacherArgs) -> Result<(), SidecarError> {
    // Flags first: nothing below may wait (for the driver, the API server)
    // before a wrong flag is reported.
    let (backoff, http_addr) = args.check()?;
    let mut role = Role::start();
    let requests = crate::common::kube::ApiRequests::default();
    // No API write without the Lease (see `common::ratelimit`).
    let guard = lease_guard(&args.controller);
    let clients = crate::common::kube::clients(&args.kube, &requests, &guard).await?;
    let queues = controller::Queues::new(backoff);
    let writes = metrics::Writes::default();
    let mut registry = Metrics::new();
    requests.register(registry.registry_mut());
    registry
        .registry_mut()
        .register_collector(Box::new(queues.metrics()));
    writes.register(registry.registry_mut());
    let metrics = Arc::new(registry);

    let found = role
        .checked_driver(&args.common, &metrics, Wait::Ready)
        .await;
    let Some((driver, driver_name)) = (match found {
        Ok(found) => found,
        Err(e) => return role.finish(Err(e.into())).await,
    }) else {
        return role.finish(Ok(())).await;
    };
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
    if let Some(plugin) = crate::common::migration::Plugin::for_driver(&driver_name) {
        tracing::info!(
            in_tree = plugin.in_tree_name(),
            "CSI migration target: PVs with the plugin's in-tree source are attached through their CSI translation"
        );
    }
    let check = probe_check(&driver, args.common.timeout);
    role.serve_admin(
        http_addr,
        &args.common,
        &metrics,
        check,
        args.kube.kubeconfig.as_deref(),
    )
    .await?;

    let cfg = controller::Config {
        driver_name: driver_name.clone(),
        mode,
        caps: publish_caps,
        default_fs_type: args.default_fstype.clone(),
        timeout: args.common.timeout,
        workers: args.worker_threads,
        resync: args.resync,
        reconcile_sync: args.reconcile_sync,
        list_published: mode == decide::Mode::Real
            && caps.contains(&Cap::ListVolumes)
            && caps.contains(&Cap::ListVolumesPublishedNodes),
        max_entries: args.max_entries,
    };
    let (ctrl, watches) = controller::Controller::new(
        cfg,
        clients.normal.clone(),
        clients.events.clone(),
        driver,
        queues,
        writes,
    );
    let stop = role.shutdown.clone();
    let lease = lease_name("external-attacher-leader-", &driver_name);
    let outcome = lead(
        &args.kube,
        &args.controller,
        &lease,
        guard,
        &role.shutdown,
        move || async move { ctrl.run(watches, stop).await.map_err(AttacherError::from) },
    )
    .await;
    role.finish(outcome).await
}
