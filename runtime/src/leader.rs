//! Leader election on a `coordination.k8s.io/v1` Lease, modelled on client-go's
//! `leaderelection` package.
//!
//! Several replicas of the operator, the provisioner or the attacher may run
//! for availability, but only one may act at a time: two operators driving the
//! same rollout, or two provisioners racing on one claim, would fight.
//! The replica whose identity is in the Lease's `holderIdentity`, and which
//! keeps renewing it, is the leader; the others wait until the lease expires
//! or is released, then take it over. Every write is a `replace` carrying the `resourceVersion` that was
//! read, so the API server serialises competing writers: a `409 Conflict` means
//! someone else wrote first, and we re-read and decide again.
//!
//! Expiry is judged as client-go does, without comparing clocks: a standby
//! remembers when it last *saw the record change* (its `observedTime`, on the
//! local monotonic clock), and the lease has expired once
//! `leaseDurationSeconds` have passed since then without a change. The
//! holder's `renewTime` is never compared with the local clock, so a holder
//! whose clock is hours off (ours or a Go replica sharing the Lease) is
//! neither cut short nor waited for beyond the lease duration. A standby that
//! starts sees every record as new and so waits one lease duration first.
//!
//! Usage: [`LeaderElector::acquire`], then run the controller alongside
//! [`LeaderElector::renew_loop`] and exit the process when the latter returns;
//! on graceful shutdown call [`LeaderElector::release`].
//!
//! **Acting only while leading.** Losing the Lease must stop every action at
//! once, not at the next renewal: the leader also *watches* its Lease, so a
//! Lease taken over (an admin, a replica that judged it expired) ends
//! [`LeaderElector::renew_loop`] as soon as the API server says so, and
//! [`run_as_leader`] then drops the controller (which must own its tasks, so
//! that dropping it aborts them). And a [`LeaseGuard`], as kubert's lease
//! claim, is consulted before each action with effects outside the process
//! (an API write, a CreateVolume): it is held only while the last renewal is
//! younger than the renew deadline, and never once leadership is lost.
//! Standbys watch the Lease too, so a released Lease is taken over at once.
//!
//! The pieces: `config` (the Lease, the identity, the timings and their
//! checks), `decision` (pure: what to do with the Lease as read, and what to
//! write, so the rules are tested without a cluster), `guard` (the
//! [`LeaseGuard`]), `elector` (the API calls, the watch and the timing of
//! [`LeaderElector`]) and `runner` ([`run_as_leader`]).

mod config;
mod decision;
mod elector;
mod guard;
mod runner;

use std::time::Duration;

pub use config::{
    ConfigError, LeaderConfig, DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD,
};
pub use decision::{decide, Decision, Observation};
pub use elector::LeaderElector;
pub use guard::{LeaseGuard, NotLeading};
pub use runner::{run_as_leader, LeadError, Role};

/// Why leader election failed or leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The [`LeaderConfig`] is unusable; fix the flags.
    #[error("invalid leader election config")]
    InvalidConfig(#[from] ConfigError),
    /// A call to the API server failed.
    #[error("lease {op} failed")]
    Kube {
        /// What we were doing: "get", "create", "replace".
        op: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Someone else wrote the lease between our read and our write.
    #[error("lease was modified concurrently")]
    Conflict,
    /// An API call did not complete in time.
    #[error("lease request timed out")]
    Timeout,
    /// The clock reading cannot be expressed as a Kubernetes MicroTime.
    #[error("current time cannot be written to the lease")]
    Time(#[source] k8s_openapi::jiff::Error),
    /// Another replica now holds the lease; we must stop acting as leader.
    #[error("leadership lost: lease is now held by {holder:?}")]
    Lost {
        /// The new holder.
        holder: String,
    },
    /// We could not renew within `renew_deadline`; another replica may take
    /// over soon, so we must stop acting as leader.
    #[error("leadership lost: lease not renewed within {deadline:?}")]
    RenewDeadlineExceeded {
        /// The configured renew deadline.
        deadline: Duration,
        /// The last renewal failure, if any.
        #[source]
        last_error: Option<Box<LeaderError>>,
    },
    /// [`LeaderElector::renew_loop`] was called while not holding the lease.
    #[error("not the leader")]
    NotLeader,
}

impl LeaderError {
    /// Errors that retrying cannot fix (missing RBAC, an invalid object or
    /// config). `acquire` returns these instead of retrying forever, so the
    /// pod fails visibly.
    pub fn is_permanent(&self) -> bool {
        match self {
            LeaderError::InvalidConfig(_) | LeaderError::Time(_) => true,
            LeaderError::Kube {
                source: kube::Error::Api(status),
                ..
            } => status.is_forbidden() || status.is_invalid(),
            _ => false,
        }
    }
}
