//! Running a controller only while this replica leads.

use kube::Client;
use tokio_util::sync::CancellationToken;

use super::{LeaderConfig, LeaderElector, LeaderError, LeaseGuard};

/// What [`run_as_leader`] tells the caller about this replica's role, for
/// readiness and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Waiting for the Lease: a healthy standby.
    Standby,
    /// Holding the Lease (or running without election): acting.
    Leading,
    /// The Lease was lost: no longer acting.
    Lost,
}

/// How a controller run under [`run_as_leader`] failed: leadership, or the
/// controller's own error `E`.
#[derive(Debug, thiserror::Error)]
pub enum LeadError<E: std::error::Error + 'static> {
    #[error("leader election failed")]
    Leader(
        #[from]
        #[source]
        LeaderError,
    ),
    #[error("controller failed")]
    Controller(#[source] E),
}

/// Runs `controller` — at once without election, else once this replica
/// holds the Lease, and only as long as it does. Losing the Lease ends the
/// run with an error (the process should exit and be restarted: another
/// replica may already act), and so does the controller's own error. A
/// shutdown while standing by returns `Ok` without running it. The Lease is
/// released on the way out. `role` hears every change of this replica's role.
///
/// `guard` is held exactly while `controller` may act (always without
/// election); a caller whose actions need no guard passes a fresh
/// [`LeaseGuard::new`]. On a loss the guard is revoked and the controller
/// future dropped at once, before anything else: whatever it spawned must
/// be owned by it (a `JoinSet`, not a detached task or a `TaskTracker`) so
/// that its dropping aborts it, and whatever acts outside the process
/// should consult `guard` first.
pub async fn run_as_leader<F, Fut, E>(
    client: Client,
    election: Option<LeaderConfig>,
    guard: LeaseGuard,
    shutdown: &CancellationToken,
    role: impl Fn(Role),
    controller: F,
) -> Result<(), LeadError<E>>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    let Some(cfg) = election else {
        guard.hold_always();
        role(Role::Leading);
        return controller().await.map_err(LeadError::Controller);
    };
    let elector = LeaderElector::new(client, cfg, guard)?;
    role(Role::Standby);
    tracing::info!(lease = %elector.lease_ref(), identity = %elector.config().identity, "waiting for leadership");
    tokio::select! {
        res = elector.acquire() => res?,
        () = shutdown.cancelled() => {
            elector.release().await;
            return Ok(());
        }
    }
    tracing::info!(lease = %elector.lease_ref(), identity = %elector.config().identity, "leading");
    role(Role::Leading);
    let result = tokio::select! {
        res = controller() => res.map_err(LeadError::Controller),
        lost = elector.renew_loop() => {
            role(Role::Lost);
            match lost {
                Err(e) => Err(LeadError::Leader(e)),
                Ok(never) => match never {},
            }
        }
    };
    elector.release().await;
    result
}
