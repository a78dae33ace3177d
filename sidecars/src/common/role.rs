//! The start-up every role shares: the shutdown signal, the admin server,
//! the driver connection and, for the controllers, running under the Lease.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use csiops_runtime::admin::{self, AdminError, AdminState, HealthCheck};
use csiops_runtime::leader::{run_as_leader, LeadError, LeaderError, LeaseGuard};
use csiops_runtime::shutdown::{on_signals, CancellationToken};

use super::args::CommonArgs;
use super::controller::ControllerArgs;
use super::driver::Driver;
use super::kube::{self as kube_client, KubeArgs, KubeError};
use super::metrics::Metrics;

/// How long the admin server may take to stop once the role is done.
const ADMIN_STOP: Duration = Duration::from_secs(2);

/// A role being run: its shutdown token (SIGTERM, SIGINT) and its admin
/// servers once started (the liveness probe's deprecated
/// `--metrics-address` is a second one).
#[derive(Debug)]
pub struct Role {
    pub shutdown: CancellationToken,
    admin: Vec<admin::Server>,
}

/// How far [`Role::driver`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until the driver's socket answers.
    Connected,
    /// Until it also answers Probe with ready (the controller sidecars).
    Ready,
}

impl Role {
    /// Starts a role: the shutdown token follows SIGTERM and SIGINT.
    pub fn start() -> Self {
        Role {
            shutdown: on_signals(),
            admin: Vec::new(),
        }
    }

    /// Serves `/healthz` (answered by `health`) and the metrics at
    /// `--metrics-path` on `addr`, if there is one, until shutdown. A taken
    /// port is an error at once. With `--metrics-auth`, over HTTPS and
    /// checking metrics callers with a client of `kubeconfig` (the role's
    /// `--kubeconfig`; else in-cluster or `KUBECONFIG`).
    pub async fn serve_admin(
        &mut self,
        addr: Option<SocketAddr>,
        common: &CommonArgs,
        metrics: &Arc<Metrics>,
        health: HealthCheck,
        kubeconfig: Option<&Path>,
    ) -> Result<(), AdminError> {
        let Some(addr) = addr else { return Ok(()) };
        // Bound before the client is made: a taken port fails first.
        let listener = admin::bind(addr).await?;
        let state = AdminState::new(metrics.clone())
            .metrics_path(&common.metrics_path)
            .health(health);
        let state = common.metrics_auth.secure(state, kubeconfig).await?;
        self.admin
            .push(admin::serve_on(listener, state, self.shutdown.clone()));
        Ok(())
    }

    /// The driver at `--csi-address`, waited for as `wait` says, and its
    /// name (GetPluginInfo, retried until it answers one), which from then
    /// on labels the metrics. `None` when shutdown came first.
    pub async fn driver(
        &self,
        common: &CommonArgs,
        metrics: &Arc<Metrics>,
        wait: Wait,
    ) -> Option<(Driver, String)> {
        let driver = self.connect(common, metrics, wait).await?;
        let name = driver.driver_name_waiting(&self.shutdown).await?;
        metrics.set_driver_name(&name);
        Some((driver, name))
    }

    /// [`Role::driver`], refusing a driver whose name is not the one the
    /// operator deployed it as (see `driver::check_name`).
    pub async fn checked_driver(
        &self,
        common: &CommonArgs,
        metrics: &Arc<Metrics>,
        wait: Wait,
    ) -> Result<Option<(Driver, String)>, crate::common::driver::NameMismatch> {
        let Some((driver, name)) = self.driver(common, metrics, wait).await else {
            return Ok(None);
        };
        crate::common::driver::check_name_from_env(&name)?;
        Ok(Some((driver, name)))
    }

    /// The driver at `--csi-address`, waited for as `wait` says. `None`
    /// when shutdown came first.
    pub async fn connect(
        &self,
        common: &CommonArgs,
        metrics: &Arc<Metrics>,
        wait: Wait,
    ) -> Option<Driver> {
        let (address, timeout, metrics) = (&common.csi_address, common.timeout, metrics.clone());
        match wait {
            Wait::Connected => {
                Driver::connect_waiting(address, timeout, metrics, &self.shutdown).await
            }
            Wait::Ready => Driver::connect_ready(address, timeout, metrics, &self.shutdown).await,
        }
    }

    /// Ends the role with `outcome`: stops the admin servers and waits a
    /// little for each. A server's own failure is the error when the role
    /// had none. Generic over the role's error so that this shared start-up
    /// knows no role.
    pub async fn finish<E: From<AdminError>>(self, outcome: Result<(), E>) -> Result<(), E> {
        self.shutdown.cancel();
        let mut outcome = outcome;
        for server in self.admin {
            if let Ok(Err(e)) = tokio::time::timeout(ADMIN_STOP, server.wait()).await {
                if outcome.is_ok() {
                    outcome = Err(e.into());
                }
            }
        }
        outcome
    }
}

/// `/healthz` of a controller sidecar: the driver answers Probe with ready.
pub fn probe_check(driver: &Driver, timeout: Duration) -> HealthCheck {
    let driver = driver.clone();
    Arc::new(move || {
        let driver = driver.clone();
        Box::pin(async move { driver.health(timeout).await })
    })
}

/// The guard of a controller sidecar's actions: held while it leads with
/// `--leader-election`, always without.
pub fn lease_guard(controller_args: &ControllerArgs) -> LeaseGuard {
    if controller_args.leader_election {
        LeaseGuard::new()
    } else {
        LeaseGuard::unconditional()
    }
}

/// Runs `controller` under the Lease `lease` when `--leader-election` is
/// on (else at once), electing with a client of its own that the QPS limit
/// does not slow down (see [`kube_client::election_client`]). `guard` (from
/// [`lease_guard`], given to the clients and the CSI calls before) is held
/// exactly while the controller may act; on a loss the controller is
/// dropped at once, aborting the tasks it owns. `R` is the role's error,
/// which wraps the controller's `E` and the election's failures.
pub async fn lead<F, Fut, E, R>(
    kube: &KubeArgs,
    controller_args: &ControllerArgs,
    lease: &str,
    guard: LeaseGuard,
    shutdown: &CancellationToken,
    controller: F,
) -> Result<(), R>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
    R: From<E> + From<KubeError> + From<LeaderError>,
{
    let election = controller_args
        .leader_election
        .then(|| controller_args.leader_config(lease));
    let client = kube_client::election_client(kube).await?;
    match run_as_leader(client, election, guard, shutdown, |_| {}, controller).await {
        Ok(()) => Ok(()),
        Err(LeadError::Leader(e)) => Err(R::from(e)),
        Err(LeadError::Controller(e)) => Err(R::from(e)),
    }
}
