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

use std::convert::Infallible;
use std::future::ready;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::chain;

/// How long a lease stays valid after its last renewal (client-go default).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long the leader keeps trying to renew before giving up (client-go default).
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Interval between acquire/renew attempts (client-go default).
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Maximum extra random wait between acquire attempts, as a fraction of
/// `retry_period` (client-go's `JitterFactor`), so standbys do not hit the API
/// server in lockstep.
const JITTER_FACTOR: f64 = 1.2;

/// Where the lease lives, who we are, and the election timings.
///
/// The timings must satisfy `lease_duration > renew_deadline >
/// retry_period * 1.2` (see [`LeaderConfig::validate`]): the leader must give
/// up (after `renew_deadline`) strictly before standbys may take the lease over
/// (after `lease_duration`), or two leaders could overlap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Name of the Lease object.
    pub lease_name: String,
    /// Namespace of the Lease object.
    pub namespace: String,
    /// This replica's unique identity (typically the pod name); written to
    /// `holderIdentity`.
    pub identity: String,
    /// Validity of the lease after each renewal; written as
    /// `leaseDurationSeconds` (rounded up to whole seconds).
    pub lease_duration: Duration,
    /// How long the leader may fail to renew before it considers leadership lost.
    pub renew_deadline: Duration,
    /// Interval between attempts to acquire or renew.
    pub retry_period: Duration,
    /// Labels the leader puts on the Lease with every write, as client-go's
    /// `LeaseLock.Labels` (`--leader-election-labels`): tools can find the
    /// Leases of one component by label.
    pub labels: std::collections::BTreeMap<String, String>,
}

impl LeaderConfig {
    /// A config with client-go's default timings (15s / 10s / 2s).
    pub fn new(
        lease_name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            lease_name: lease_name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            labels: Default::default(),
        }
    }

    /// Rejects configs under which two replicas could both believe they lead,
    /// or that cannot be written to a Lease.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.lease_name.is_empty() {
            return Err(ConfigError::Empty("lease name"));
        }
        if self.namespace.is_empty() {
            return Err(ConfigError::Empty("lease namespace"));
        }
        if self.identity.is_empty() {
            return Err(ConfigError::Empty("identity"));
        }
        if self.retry_period.is_zero() {
            return Err(ConfigError::ZeroRetryPeriod);
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(ConfigError::LeaseNotAboveDeadline {
                lease_duration: self.lease_duration,
                renew_deadline: self.renew_deadline,
            });
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * JITTER_FACTOR {
            return Err(ConfigError::DeadlineNotAboveRetry {
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            });
        }
        if i32::try_from(self.lease_duration.as_secs()).is_err() {
            return Err(ConfigError::LeaseTooLong(self.lease_duration));
        }
        Ok(())
    }

    /// `lease_duration` as `leaseDurationSeconds`, rounded up so others never
    /// consider the lease expired earlier than we do.
    fn lease_duration_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// What to do with the lease, given its current state. Computed by [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No lease exists: create it with us as holder.
    Create,
    /// The lease was released (no holder) or has expired: take it over.
    /// `previous_holder` is `None` when it was released.
    TakeOver {
        /// The expired holder, for logging.
        previous_holder: Option<String>,
    },
    /// We hold the lease: renew it.
    Renew,
    /// Someone else holds a valid lease: wait and retry.
    Wait {
        /// The current holder.
        holder: String,
    },
}

/// The lease record as this process last saw it change, and when: client-go's
/// `observedRecord` and `observedTime`. `at` is on the local monotonic clock,
/// so it means the same to this process whatever the wall clocks say.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    record: Option<LeaseSpec>,
    at: Instant,
}

impl Observation {
    /// What is known after reading `lease` at `now`: `previous`, if the
    /// record is unchanged (metadata such as the resourceVersion aside), else
    /// a new observation at `now`.
    pub fn update(previous: Option<&Observation>, lease: &Lease, now: Instant) -> Observation {
        match previous {
            Some(p) if p.record == lease.spec => p.clone(),
            _ => Observation {
                record: lease.spec.clone(),
                at: now,
            },
        }
    }

    /// When the record was last seen to change.
    pub fn at(&self) -> Instant {
        self.at
    }
}

/// Decides how `identity` should act on `lease` at `now`, the record having
/// last changed (as far as this process saw) at `observed_at`.
///
/// Pure, so the election rules can be tested without a cluster. The lease
/// has expired once its `leaseDurationSeconds` (else `cfg.lease_duration`)
/// have passed since `observed_at`: a holder that renews changes the record
/// every retry period, one that stopped does not. `renewTime` is not read.
pub fn decide(
    lease: Option<&Lease>,
    identity: &str,
    observed_at: Instant,
    now: Instant,
    cfg: &LeaderConfig,
) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty());
    let (Some(holder), Some(spec)) = (holder, spec) else {
        return Decision::TakeOver {
            previous_holder: None,
        };
    };
    if holder == identity {
        return Decision::Renew;
    }
    let duration_secs = spec
        .lease_duration_seconds
        .unwrap_or_else(|| cfg.lease_duration_seconds())
        .max(0);
    let duration = Duration::from_secs(u64::from(duration_secs.unsigned_abs()));
    // client-go: valid while observedTime + duration is after now. A sum
    // past the clock's range never comes.
    let expired = observed_at
        .checked_add(duration)
        .is_some_and(|expiry| expiry <= now);
    if expired {
        Decision::TakeOver {
            previous_holder: Some(holder.to_owned()),
        }
    } else {
        Decision::Wait {
            holder: holder.to_owned(),
        }
    }
}

/// The lease to write for `decision`, or `None` for [`Decision::Wait`].
///
/// Metadata (including `resourceVersion`) is copied from `current`, so the
/// write fails with a conflict if someone changed the lease since it was read.
fn build_lease(
    current: Option<&Lease>,
    decision: &Decision,
    now: DateTime<Utc>,
    cfg: &LeaderConfig,
) -> Result<Option<Lease>, LeaderError> {
    let now = micro_time(now)?;
    let lease = match (decision, current) {
        (Decision::Wait { .. }, _) => return Ok(None),
        (Decision::Create, _) | (_, None) => Lease {
            metadata: ObjectMeta {
                name: Some(cfg.lease_name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(cfg.lease_duration_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        },
        (Decision::TakeOver { .. }, Some(current)) => {
            let mut lease = current.clone();
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(cfg.identity.clone());
            spec.lease_duration_seconds = Some(cfg.lease_duration_seconds());
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            lease
        }
        (Decision::Renew, Some(current)) => {
            let mut lease = current.clone();
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(cfg.identity.clone());
            spec.lease_duration_seconds = Some(cfg.lease_duration_seconds());
            if spec.acquire_time.is_none() {
                spec.acquire_time = Some(now.clone());
            }
            spec.renew_time = Some(now);
            lease
        }
    };
    Ok(Some(with_labels(lease, cfg)))
}

/// `lease` with [`LeaderConfig::labels`] set (others' labels kept).
fn with_labels(mut lease: Lease, cfg: &LeaderConfig) -> Lease {
    if !cfg.labels.is_empty() {
        let labels = lease.metadata.labels.get_or_insert_with(Default::default);
        labels.extend(cfg.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    lease
}

/// `current` with the holder cleared and a 1s duration, so a standby can take
/// it over on its next attempt instead of waiting for expiry.
fn released_lease(current: &Lease, now: DateTime<Utc>) -> Result<Lease, LeaderError> {
    let now = micro_time(now)?;
    let mut lease = current.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now);
    Ok(lease)
}

fn micro_time(t: DateTime<Utc>) -> Result<MicroTime, LeaderError> {
    k8s_openapi::jiff::Timestamp::from_microsecond(t.timestamp_micros())
        .map(MicroTime)
        .map_err(LeaderError::Time)
}

/// What makes a [`LeaderConfig`] unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is empty")]
    Empty(&'static str),
    #[error("retry period must be positive")]
    ZeroRetryPeriod,
    #[error(
        "lease duration {lease_duration:?} must be greater than renew deadline {renew_deadline:?}"
    )]
    LeaseNotAboveDeadline {
        lease_duration: Duration,
        renew_deadline: Duration,
    },
    #[error("renew deadline {renew_deadline:?} must be greater than retry period {retry_period:?} * {JITTER_FACTOR}")]
    DeadlineNotAboveRetry {
        renew_deadline: Duration,
        retry_period: Duration,
    },
    #[error("lease duration {0:?} is too long")]
    LeaseTooLong(Duration),
}

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

/// Whether this replica may act as the leader now: consulted before each
/// action with effects outside the process (an API write, a CreateVolume or
/// DeleteVolume), as kubert's lease claim is. Cheap to clone; every clone
/// sees the same state.
///
/// Held from each successful Lease write until the renew deadline after it
/// (the leader gives up then, and standbys wait longer than that), and no
/// longer once leadership is lost or released. Without election
/// ([`LeaseGuard::unconditional`]) it is always held.
#[derive(Clone, Debug)]
pub struct LeaseGuard(Arc<Mutex<Held>>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    No,
    Until(Instant),
    Always,
}

/// An action refused because this replica does not hold the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not the leader: this replica does not hold the leader Lease (any more)")]
pub struct NotLeading;

impl Default for LeaseGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseGuard {
    /// A guard not held until a [`LeaderElector`] made with it leads.
    pub fn new() -> Self {
        LeaseGuard(Arc::new(Mutex::new(Held::No)))
    }

    /// A guard that is always held: a replica that runs without election.
    pub fn unconditional() -> Self {
        LeaseGuard(Arc::new(Mutex::new(Held::Always)))
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        // Every update is one assignment: a poisoned lock is consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this replica may act now.
    pub fn is_held(&self) -> bool {
        match *self.held() {
            Held::No => false,
            Held::Always => true,
            Held::Until(t) => Instant::now() < t,
        }
    }

    /// `Ok` when this replica may act now.
    pub fn check(&self) -> Result<(), NotLeading> {
        if self.is_held() {
            Ok(())
        } else {
            Err(NotLeading)
        }
    }

    /// Held until `until` (a renewal); an unconditional guard stays so.
    fn renewed(&self, until: Instant) {
        let mut held = self.held();
        if *held != Held::Always {
            *held = Held::Until(until);
        }
    }

    /// Not held any more (lost or released); an unconditional guard stays so.
    fn revoke(&self) {
        let mut held = self.held();
        if *held != Held::Always {
            *held = Held::No;
        }
    }
}

#[cfg(any(test, feature = "testing"))]
impl LeaseGuard {
    /// A guard held until `until`, as after a renewal (tests of code that
    /// consults one).
    pub fn held_until(until: Instant) -> Self {
        let guard = Self::new();
        guard.renewed(until);
        guard
    }

    /// Leadership lost, as [`LeaderElector`] revokes it (tests).
    pub fn lose(&self) {
        self.revoke();
    }
}

/// What a watch of the Lease shows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LeaseSeen {
    /// Held by this identity.
    Held(String),
    /// No holder: released.
    Free,
    /// The Lease was deleted.
    Gone,
}

/// The holder a watched Lease names.
fn seen(lease: &Lease) -> LeaseSeen {
    match lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
    {
        Some(h) => LeaseSeen::Held(h.to_owned()),
        None => LeaseSeen::Free,
    }
}

/// Whether a watch failed because it is not allowed (RBAC without `watch`
/// on Leases): then election goes on by polling alone.
fn watch_forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.is_forbidden(),
        watcher::Error::WatchError(s) => s.is_forbidden(),
        _ => false,
    }
}

/// Result of one acquire-or-renew attempt.
#[derive(Debug)]
enum Attempt {
    /// We hold the lease (just created, taken over or renewed).
    Held,
    /// Someone else holds a valid lease.
    Wait { holder: String },
}

/// Mutable election state, behind a mutex that is never held across `.await`.
#[derive(Debug, Default)]
struct State {
    /// The lease as we last wrote it (with its new `resourceVersion`), for the
    /// fast renew path that skips the GET. `None` forces a re-read.
    written: Option<Lease>,
    /// When we started the last successful write. The `renewTime` we wrote is
    /// no earlier than this, so `renew_deadline` measured from here is safe.
    /// `None` when we are not the leader.
    last_renew: Option<Instant>,
    /// Holder seen on the last read, to log only changes.
    observed_holder: Option<String>,
    /// The record as last seen to change, and when (see [`decide`]).
    observed: Option<Observation>,
}

/// Runs leader election for one replica. Share it via `Arc` if `renew_loop`
/// and `release` are called from different tasks.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaderConfig,
    state: Mutex<State>,
    guard: LeaseGuard,
}

impl LeaderElector {
    /// Validates `cfg` and prepares to elect on its Lease.
    pub fn new(client: Client, cfg: LeaderConfig) -> Result<Self, LeaderError> {
        Self::with_guard(client, cfg, LeaseGuard::new())
    }

    /// [`new`](Self::new), keeping `guard` held exactly while this replica
    /// leads (made before, for the clients that consult it).
    pub fn with_guard(
        client: Client,
        cfg: LeaderConfig,
        guard: LeaseGuard,
    ) -> Result<Self, LeaderError> {
        cfg.validate()?;
        guard.revoke();
        Ok(Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            state: Mutex::new(State::default()),
            guard,
        })
    }

    /// The guard held while this replica leads.
    pub fn guard(&self) -> LeaseGuard {
        self.guard.clone()
    }

    /// The configuration in use.
    pub fn config(&self) -> &LeaderConfig {
        &self.cfg
    }

    /// Waits until this replica holds the lease, retrying every `retry_period`
    /// (plus jitter). Transient API errors are logged and retried; permanent
    /// ones (see [`LeaderError::is_permanent`]) are returned. Cancel-safe: drop
    /// the future to stop waiting (then call [`release`](Self::release) in case
    /// a write landed).
    pub async fn acquire(&self) -> Result<(), LeaderError> {
        tracing::info!(
            lease = %self.lease_ref(),
            identity = %self.cfg.identity,
            "waiting to acquire leader lease"
        );
        // A release (or deletion) of the Lease is acted on at once, not at
        // the next attempt.
        let mut changes = self.lease_changes();
        loop {
            match tokio::time::timeout(self.cfg.renew_deadline, self.attempt()).await {
                Ok(Ok(Attempt::Held)) => return Ok(()),
                Ok(Ok(Attempt::Wait { .. })) | Ok(Err(LeaderError::Conflict)) => {}
                Ok(Err(error)) if error.is_permanent() => {
                    tracing::error!(lease = %self.lease_ref(), error = %chain(&error), "cannot acquire leader lease");
                    return Err(error);
                }
                Ok(Err(error)) => {
                    tracing::warn!(lease = %self.lease_ref(), error = %chain(&error), "failed to acquire leader lease, retrying");
                }
                Err(_) => {
                    tracing::warn!(lease = %self.lease_ref(), "leader lease request timed out, retrying");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(jittered(self.cfg.retry_period)) => {}
                () = next_free(&mut changes) => {
                    tracing::debug!(lease = %self.lease_ref(), "leader lease released; trying to take it now");
                }
            }
        }
    }

    /// Keeps renewing the lease every `retry_period` while we lead. Returns
    /// only when leadership is lost: another replica took the lease
    /// ([`LeaderError::Lost`]) — seen by a renewal, or at once by the watch
    /// of the Lease — or no renewal succeeded within `renew_deadline`
    /// ([`LeaderError::RenewDeadlineExceeded`]). The guard is no longer held
    /// by then. The caller must stop acting at once, normally by dropping
    /// the controller and exiting the process.
    pub async fn renew_loop(&self) -> Result<Infallible, LeaderError> {
        let mut changes = self.lease_changes();
        tokio::select! {
            lost = self.renew_periodically() => lost,
            holder = next_taken(&mut changes, &self.cfg.identity) => {
                self.forget_leadership();
                tracing::error!(lease = %self.lease_ref(), %holder, "leadership lost: the Lease was taken over");
                Err(LeaderError::Lost { holder })
            }
        }
    }

    /// The renewals of [`renew_loop`](Self::renew_loop).
    async fn renew_periodically(&self) -> Result<Infallible, LeaderError> {
        let mut last_error: Option<LeaderError> = None;
        loop {
            let last_renew = self.state().last_renew.ok_or(LeaderError::NotLeader)?;
            let deadline = last_renew + self.cfg.renew_deadline;
            let next = (Instant::now() + self.cfg.retry_period).min(deadline);
            tokio::time::sleep_until(next).await;
            if Instant::now() >= deadline {
                return Err(self.lost_deadline(last_error));
            }
            match tokio::time::timeout_at(deadline, self.attempt()).await {
                Ok(Ok(Attempt::Held)) => {
                    if last_error.take().is_some() {
                        tracing::info!(lease = %self.lease_ref(), "leader lease renewed again");
                    }
                }
                Ok(Ok(Attempt::Wait { holder })) => {
                    self.forget_leadership();
                    tracing::error!(lease = %self.lease_ref(), %holder, "leadership lost to another replica");
                    return Err(LeaderError::Lost { holder });
                }
                Ok(Err(error)) => {
                    tracing::warn!(lease = %self.lease_ref(), error = %chain(&error), "failed to renew leader lease");
                    last_error = Some(error);
                }
                Err(_) => return Err(self.lost_deadline(Some(LeaderError::Timeout))),
            }
        }
    }

    /// Gives the lease up if we still hold it, so a standby takes over at once
    /// instead of after `lease_duration`. Call on graceful shutdown, after
    /// reconciling has stopped. Best effort: failures are logged, and the
    /// lease then simply expires.
    pub async fn release(&self) {
        self.forget_leadership();
        match tokio::time::timeout(self.cfg.renew_deadline, self.try_release()).await {
            Ok(Ok(true)) => {
                tracing::info!(lease = %self.lease_ref(), identity = %self.cfg.identity, "released leader lease");
            }
            Ok(Ok(false)) => {
                tracing::debug!(lease = %self.lease_ref(), "leader lease not held, nothing to release");
            }
            Ok(Err(error)) => {
                tracing::warn!(lease = %self.lease_ref(), error = %chain(&error), "failed to release leader lease; it will expire");
            }
            Err(_) => {
                tracing::warn!(lease = %self.lease_ref(), "releasing leader lease timed out; it will expire");
            }
        }
    }

    /// Returns whether we released the lease (false: it was not ours).
    async fn try_release(&self) -> Result<bool, LeaderError> {
        let Some(current) = self
            .api
            .get_opt(&self.cfg.lease_name)
            .await
            .map_err(kube_err("get"))?
        else {
            return Ok(false);
        };
        let ours = current
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(self.cfg.identity.as_str());
        if !ours {
            return Ok(false);
        }
        let lease = released_lease(&current, Utc::now())?;
        match self
            .api
            .replace(&self.cfg.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            // Someone wrote after our read; whatever they wrote, it is not our
            // claim any more (only we renew our own lease).
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(kube_err("replace")(e)),
        }
    }

    /// One acquire-or-renew step. While leading, first tries to renew the lease
    /// as we last wrote it (no GET); on any failure of that, or when not
    /// leading, reads the lease and acts on [`decide`].
    async fn attempt(&self) -> Result<Attempt, LeaderError> {
        let pp = PostParams::default();
        let name = self.cfg.lease_name.as_str();

        let cached = self.state().written.take();
        if let Some(written) = cached {
            let started = Instant::now();
            let lease = build_lease(Some(&written), &Decision::Renew, Utc::now(), &self.cfg)?;
            if let Some(lease) = lease {
                match self.api.replace(name, &pp, &lease).await {
                    Ok(new) => {
                        self.record_write(new, started);
                        return Ok(Attempt::Held);
                    }
                    Err(e) if is_conflict(&e) => {
                        tracing::debug!(lease = %self.lease_ref(), "lease changed since our last write, re-reading");
                    }
                    Err(e) => return Err(kube_err("replace")(e)),
                }
            }
        }

        let current = self.api.get_opt(name).await.map_err(kube_err("get"))?;
        let started = Instant::now();
        let observed_at = self.observe(current.as_ref(), started);
        let decision = decide(
            current.as_ref(),
            &self.cfg.identity,
            observed_at,
            started,
            &self.cfg,
        );
        let now = Utc::now();
        if let Decision::Wait { holder } = &decision {
            self.observe_holder(holder);
            return Ok(Attempt::Wait {
                holder: holder.clone(),
            });
        }
        let Some(lease) = build_lease(current.as_ref(), &decision, now, &self.cfg)? else {
            return Err(LeaderError::Conflict);
        };
        let written = match decision {
            Decision::Create => self.api.create(&pp, &lease).await.map_err(|e| {
                if is_conflict(&e) {
                    LeaderError::Conflict
                } else {
                    kube_err("create")(e)
                }
            })?,
            _ => self.api.replace(name, &pp, &lease).await.map_err(|e| {
                if is_conflict(&e) {
                    LeaderError::Conflict
                } else {
                    kube_err("replace")(e)
                }
            })?,
        };
        let was_leader = self.record_write(written, started);
        if !was_leader {
            let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
            match decision {
                Decision::TakeOver {
                    previous_holder: Some(previous),
                } => tracing::info!(
                    lease = %self.lease_ref(), identity = %self.cfg.identity, %previous, ?transitions,
                    "acquired leadership: took over expired lease"
                ),
                Decision::TakeOver {
                    previous_holder: None,
                } => tracing::info!(
                    lease = %self.lease_ref(), identity = %self.cfg.identity, ?transitions,
                    "acquired leadership: took over released lease"
                ),
                Decision::Create => tracing::info!(
                    lease = %self.lease_ref(), identity = %self.cfg.identity,
                    "acquired leadership: created lease"
                ),
                Decision::Renew | Decision::Wait { .. } => tracing::info!(
                    lease = %self.lease_ref(), identity = %self.cfg.identity,
                    "acquired leadership: lease was already ours"
                ),
            }
        }
        Ok(Attempt::Held)
    }

    /// Remembers the record read at `now`; returns when it last changed.
    fn observe(&self, lease: Option<&Lease>, now: Instant) -> Instant {
        let mut state = self.state();
        match lease {
            Some(lease) => {
                let observed = Observation::update(state.observed.as_ref(), lease, now);
                let at = observed.at();
                state.observed = Some(observed);
                at
            }
            None => {
                state.observed = None;
                now
            }
        }
    }

    /// Remembers a successful write; returns whether we were already leading.
    fn record_write(&self, written: Lease, started: Instant) -> bool {
        let mut state = self.state();
        state.observed = Some(Observation::update(None, &written, started));
        state.written = Some(written);
        state.observed_holder = Some(self.cfg.identity.clone());
        // Held until the moment renew_loop would give up: standbys wait a
        // lease duration (longer) from when they see this write.
        self.guard.renewed(started + self.cfg.renew_deadline);
        state.last_renew.replace(started).is_some()
    }

    fn forget_leadership(&self) {
        self.guard.revoke();
        let mut state = self.state();
        state.written = None;
        state.last_renew = None;
    }

    /// What a watch of our Lease shows, change by change; ends (and the
    /// election goes on by polling alone) when watching is not allowed.
    /// Other watch errors are retried with backoff.
    fn lease_changes(&self) -> BoxStream<'static, LeaseSeen> {
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", self.cfg.lease_name));
        let lease = self.lease_ref();
        watcher(self.api.clone(), config)
            .default_backoff()
            .take_while(move |event| {
                let forbidden = matches!(event, Err(e) if watch_forbidden(e));
                if forbidden {
                    tracing::info!(%lease, "may not watch the leader lease; changes are seen at each attempt only");
                }
                ready(!forbidden)
            })
            .filter_map(|event| {
                ready(match event {
                    Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => Some(seen(&l)),
                    Ok(watcher::Event::Delete(_)) => Some(LeaseSeen::Gone),
                    Ok(_) => None,
                    Err(e) => {
                        tracing::debug!(error = %chain(&e), "watch of the leader lease failed; retrying");
                        None
                    }
                })
            })
            .boxed()
    }

    fn observe_holder(&self, holder: &str) {
        let mut state = self.state();
        if state.observed_holder.as_deref() != Some(holder) {
            tracing::info!(lease = %self.lease_ref(), %holder, "leader lease held by another replica, standing by");
            state.observed_holder = Some(holder.to_owned());
        }
    }

    fn lost_deadline(&self, last_error: Option<LeaderError>) -> LeaderError {
        self.forget_leadership();
        tracing::error!(
            lease = %self.lease_ref(),
            deadline = ?self.cfg.renew_deadline,
            "leadership lost: could not renew lease in time"
        );
        LeaderError::RenewDeadlineExceeded {
            deadline: self.cfg.renew_deadline,
            last_error: last_error.map(Box::new),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked mid-update
        // (each field is written whole), so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lease_ref(&self) -> String {
        format!("{}/{}", self.cfg.namespace, self.cfg.lease_name)
    }
}

/// Waits for a Lease change showing it free (released or deleted); never
/// returns once the watch ended.
async fn next_free(changes: &mut BoxStream<'static, LeaseSeen>) {
    loop {
        match changes.next().await {
            Some(LeaseSeen::Free | LeaseSeen::Gone) => return,
            Some(LeaseSeen::Held(_)) => {}
            None => std::future::pending::<()>().await,
        }
    }
}

/// Waits for a Lease change showing it not ours any more; returns the new
/// holder (empty: released or deleted). Never returns once the watch ended.
async fn next_taken(changes: &mut BoxStream<'static, LeaseSeen>, identity: &str) -> String {
    loop {
        match changes.next().await {
            Some(LeaseSeen::Held(h)) if h == identity => {}
            Some(LeaseSeen::Held(h)) => return h,
            Some(LeaseSeen::Free | LeaseSeen::Gone) => return String::new(),
            None => std::future::pending::<()>().await,
        }
    }
}

fn kube_err(op: &'static str) -> impl FnOnce(kube::Error) -> LeaderError {
    move |source| LeaderError::Kube { op, source }
}

/// 409 from the API server: a stale `resourceVersion` on replace, or
/// `AlreadyExists` on create. Both mean another writer won the race.
fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.is_conflict() || status.is_already_exists())
}

/// `period` plus up to `JITTER_FACTOR * period` of randomness.
fn jittered(period: Duration) -> Duration {
    use std::hash::BuildHasher;
    // RandomState is seeded randomly per instance: good enough for jitter,
    // without a dependency on a RNG crate.
    let bits = std::collections::hash_map::RandomState::new().hash_one(0u8);
    let unit = (bits >> 11) as f64 / (1u64 << 53) as f64;
    period + period.mul_f64(JITTER_FACTOR * unit)
}

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
pub async fn run_as_leader<F, Fut, E>(
    client: Client,
    election: Option<LeaderConfig>,
    shutdown: &CancellationToken,
    role: impl Fn(Role),
    controller: F,
) -> Result<(), LeadError<E>>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    run_as_leader_guarded(
        client,
        election,
        LeaseGuard::new(),
        shutdown,
        role,
        controller,
    )
    .await
}

/// [`run_as_leader`], keeping `guard` held exactly while `controller` may
/// act (always without election). On a loss the guard is revoked and the
/// controller future dropped at once, before anything else: whatever it
/// spawned must be owned by it (a `JoinSet`, not a detached task or a
/// `TaskTracker`) so that its dropping aborts it, and whatever acts outside
/// the process should consult `guard` first.
pub async fn run_as_leader_guarded<F, Fut, E>(
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
        *guard.held() = Held::Always;
        role(Role::Leading);
        return controller().await.map_err(LeadError::Controller);
    };
    let elector = LeaderElector::with_guard(client, cfg, guard)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const ME: &str = "csiops-0";
    const OTHER: &str = "csiops-1";

    fn cfg() -> LeaderConfig {
        LeaderConfig::new("csiops-leader", "csiops-system", ME)
    }

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
    }

    fn lease(holder: Option<&str>, renewed: Option<DateTime<Utc>>, duration: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("csiops-leader".into()),
                namespace: Some("csiops-system".into()),
                resource_version: Some("42".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                renew_time: renewed.map(|r| micro_time(r).unwrap()),
                acquire_time: renewed
                    .map(|r| micro_time(r - chrono::Duration::seconds(100)).unwrap()),
                lease_duration_seconds: duration,
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    /// A monotonic instant `secs` after a fixed origin.
    fn at(origin: Instant, secs: u64) -> Instant {
        origin + Duration::from_secs(secs)
    }

    #[test]
    fn no_lease_means_create() {
        let o = Instant::now();
        assert_eq!(decide(None, ME, o, o, &cfg()), Decision::Create);
    }

    #[test]
    fn own_lease_is_renewed_even_if_expired() {
        let o = Instant::now();
        let l = lease(Some(ME), Some(t(0)), Some(15));
        assert_eq!(decide(Some(&l), ME, o, at(o, 5), &cfg()), Decision::Renew);
        assert_eq!(decide(Some(&l), ME, o, at(o, 100), &cfg()), Decision::Renew);
    }

    #[test]
    fn foreign_lease_expires_a_lease_duration_after_its_last_change() {
        let o = Instant::now();
        let l = lease(Some(OTHER), Some(t(0)), Some(15));
        let wait = Decision::Wait {
            holder: OTHER.into(),
        };
        assert_eq!(decide(Some(&l), ME, o, at(o, 1), &cfg()), wait);
        assert_eq!(
            decide(
                Some(&l),
                ME,
                o,
                at(o, 15) - Duration::from_micros(1),
                &cfg()
            ),
            wait
        );
        // client-go: valid while observedTime + duration is after now.
        assert_eq!(
            decide(Some(&l), ME, o, at(o, 15), &cfg()),
            Decision::TakeOver {
                previous_holder: Some(OTHER.into())
            }
        );
    }

    /// The holder's clock is hours off ours, either way. Its renewTime says
    /// nothing to us: only whether the record keeps changing does.
    #[test]
    fn skewed_renew_times_neither_cut_a_live_lease_short_nor_keep_a_dead_one() {
        let o = Instant::now();
        let c = cfg();
        for skew in [-3600 * 24 * 365, -3600, 3600, 3600 * 24 * 365] {
            // First sight of a lease renewed "a year ago" (or "in a year"):
            // a live holder, to be waited for.
            let first = lease(Some(OTHER), Some(t(skew)), Some(15));
            let seen = Observation::update(None, &first, o);
            assert!(
                matches!(
                    decide(Some(&first), ME, seen.at(), at(o, 10), &c),
                    Decision::Wait { .. }
                ),
                "skew {skew}: taken over at first sight"
            );
            // It renews every 5 s (its clock still off): still alive at 40 s.
            let mut last = seen;
            let mut current = first;
            for i in 1..=8 {
                current = lease(Some(OTHER), Some(t(skew + 5 * i)), Some(15));
                let now = at(o, 5 * i as u64);
                last = Observation::update(Some(&last), &current, now);
                assert!(
                    matches!(
                        decide(Some(&current), ME, last.at(), now, &c),
                        Decision::Wait { .. }
                    ),
                    "skew {skew}: a renewing holder lost its lease at {}s",
                    5 * i
                );
            }
            // Then it stops: the same record, read again and again, expires
            // one lease duration after it last changed, and not before.
            let before = at(o, 40 + 14);
            let unchanged = Observation::update(Some(&last), &current.clone(), before);
            assert_eq!(unchanged.at(), at(o, 40), "skew {skew}");
            assert!(matches!(
                decide(Some(&current), ME, unchanged.at(), before, &c),
                Decision::Wait { .. }
            ));
            assert_eq!(
                decide(Some(&current), ME, unchanged.at(), at(o, 40 + 15), &c),
                Decision::TakeOver {
                    previous_holder: Some(OTHER.into())
                },
                "skew {skew}: a dead holder's lease kept"
            );
        }
    }

    #[test]
    fn metadata_changes_are_not_renewals() {
        let o = Instant::now();
        let l = lease(Some(OTHER), Some(t(0)), Some(15));
        let seen = Observation::update(None, &l, o);
        let mut touched = l.clone();
        touched.metadata.resource_version = Some("43".into());
        touched.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert_eq!(Observation::update(Some(&seen), &touched, at(o, 9)).at(), o);
        let mut renewed = l;
        if let Some(spec) = renewed.spec.as_mut() {
            spec.renew_time = Some(micro_time(t(-1)).unwrap());
        }
        assert_eq!(
            Observation::update(Some(&seen), &renewed, at(o, 9)).at(),
            at(o, 9),
            "any change of the record counts, even to an older renewTime"
        );
    }

    #[test]
    fn lease_duration_falls_back_to_config() {
        let o = Instant::now();
        let l = lease(Some(OTHER), Some(t(0)), None);
        let mut c = cfg();
        c.lease_duration = Duration::from_secs(30);
        assert!(matches!(
            decide(Some(&l), ME, o, at(o, 20), &c),
            Decision::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&l), ME, o, at(o, 31), &c),
            Decision::TakeOver { .. }
        ));
    }

    #[test]
    fn foreign_lease_without_renew_time_is_judged_like_any_other() {
        let o = Instant::now();
        let l = lease(Some(OTHER), None, Some(15));
        assert!(matches!(
            decide(Some(&l), ME, o, o, &cfg()),
            Decision::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&l), ME, o, at(o, 15), &cfg()),
            Decision::TakeOver { .. }
        ));
    }

    #[test]
    fn released_lease_is_taken_over() {
        let o = Instant::now();
        let released = Decision::TakeOver {
            previous_holder: None,
        };
        // Holder cleared, renewed just now: still free to take.
        let l = lease(None, Some(t(0)), Some(1));
        assert_eq!(decide(Some(&l), ME, o, o, &cfg()), released);
        // Empty-string holder, as client-go writes it.
        let l = lease(Some(""), Some(t(0)), Some(15));
        assert_eq!(decide(Some(&l), ME, o, o, &cfg()), released);
        // Lease object without a spec.
        let l = Lease::default();
        assert_eq!(decide(Some(&l), ME, o, o, &cfg()), released);
    }

    #[test]
    fn create_builds_a_fresh_lease() {
        let l = build_lease(None, &Decision::Create, t(0), &cfg())
            .unwrap()
            .unwrap();
        assert_eq!(l.metadata.name.as_deref(), Some("csiops-leader"));
        assert_eq!(l.metadata.namespace.as_deref(), Some("csiops-system"));
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.acquire_time, Some(micro_time(t(0)).unwrap()));
        assert_eq!(spec.renew_time, Some(micro_time(t(0)).unwrap()));
    }

    #[test]
    fn takeover_increments_transitions_and_sets_acquire_time() {
        let old = lease(Some(OTHER), Some(t(0)), Some(15));
        let o = Instant::now();
        let decision = decide(Some(&old), ME, o, at(o, 20), &cfg());
        let l = build_lease(Some(&old), &decision, t(20), &cfg())
            .unwrap()
            .unwrap();
        assert_eq!(l.metadata.resource_version.as_deref(), Some("42"));
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(micro_time(t(20)).unwrap()));
        assert_eq!(spec.renew_time, Some(micro_time(t(20)).unwrap()));
    }

    #[test]
    fn renew_only_moves_renew_time() {
        let old = lease(Some(ME), Some(t(0)), Some(15));
        let l = build_lease(Some(&old), &Decision::Renew, t(2), &cfg())
            .unwrap()
            .unwrap();
        assert_eq!(l.metadata.resource_version.as_deref(), Some("42"));
        let old_spec = old.spec.unwrap();
        let spec = l.spec.unwrap();
        assert_eq!(spec.lease_transitions, old_spec.lease_transitions);
        assert_eq!(spec.acquire_time, old_spec.acquire_time);
        assert_eq!(spec.renew_time, Some(micro_time(t(2)).unwrap()));
    }

    #[test]
    fn every_write_carries_the_configured_labels() {
        let labelled = LeaderConfig {
            labels: [("app".to_string(), "csi".to_string())].into(),
            ..cfg()
        };
        let created = build_lease(None, &Decision::Create, t(0), &labelled)
            .unwrap()
            .unwrap();
        assert_eq!(
            created.metadata.labels,
            Some([("app".to_string(), "csi".to_string())].into())
        );
        let mut old = lease(Some(ME), Some(t(0)), Some(15));
        old.metadata.labels = Some([("other".to_string(), "kept".to_string())].into());
        let renewed = build_lease(Some(&old), &Decision::Renew, t(2), &labelled)
            .unwrap()
            .unwrap();
        let labels = renewed.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("app").map(String::as_str), Some("csi"));
        assert_eq!(labels.get("other").map(String::as_str), Some("kept"));
        // Without labels configured, none are added.
        let plain = build_lease(None, &Decision::Create, t(0), &cfg())
            .unwrap()
            .unwrap();
        assert_eq!(plain.metadata.labels, None);
    }

    #[test]
    fn wait_builds_nothing() {
        let old = lease(Some(OTHER), Some(t(0)), Some(15));
        let decision = Decision::Wait {
            holder: OTHER.into(),
        };
        assert!(build_lease(Some(&old), &decision, t(1), &cfg())
            .unwrap()
            .is_none());
    }

    #[test]
    fn release_clears_holder_so_others_take_over() {
        let old = lease(Some(ME), Some(t(0)), Some(15));
        let l = released_lease(&old, t(1)).unwrap();
        let spec = l.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity, None);
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.lease_transitions, Some(3));
        let o = Instant::now();
        assert_eq!(
            decide(Some(&l), OTHER, o, o, &cfg()),
            Decision::TakeOver {
                previous_holder: None
            }
        );
    }

    #[test]
    fn micro_time_serializes_with_microseconds() {
        let at = t(0) + chrono::Duration::microseconds(123_456);
        let json = serde_json::to_value(micro_time(at).unwrap()).unwrap();
        assert_eq!(json, serde_json::json!("2023-11-14T22:13:20.123456Z"));
    }

    #[test]
    fn config_validation() {
        assert!(cfg().validate().is_ok());
        let mut c = cfg();
        c.renew_deadline = c.lease_duration;
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.retry_period = Duration::from_secs(9);
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.identity.clear();
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.retry_period = Duration::ZERO;
        assert!(c.validate().is_err());
    }

    #[test]
    fn lease_duration_rounds_up() {
        let mut c = cfg();
        c.lease_duration = Duration::from_millis(15_500);
        assert_eq!(c.lease_duration_seconds(), 16);
    }

    #[tokio::test(start_paused = true)]
    async fn the_guard_is_held_from_a_renewal_until_the_renew_deadline() {
        let guard = LeaseGuard::new();
        assert_eq!(guard.check(), Err(NotLeading));
        guard.renewed(Instant::now() + Duration::from_secs(2));
        let clone = guard.clone();
        assert!(clone.is_held(), "every clone sees the renewal");
        tokio::time::advance(Duration::from_millis(1999)).await;
        assert!(guard.is_held());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!guard.is_held(), "not renewed within the deadline");
        guard.renewed(Instant::now() + Duration::from_secs(2));
        assert!(guard.is_held());
        clone.revoke();
        assert!(!guard.is_held(), "a loss ends it at once, in every clone");

        let always = LeaseGuard::unconditional();
        always.revoke();
        assert_eq!(always.check(), Ok(()), "no election: always held");
    }

    fn changes(seen: Vec<LeaseSeen>) -> BoxStream<'static, LeaseSeen> {
        futures::stream::iter(seen).boxed()
    }

    #[tokio::test(start_paused = true)]
    async fn the_watch_tells_a_taken_or_freed_lease() {
        use LeaseSeen::{Free, Gone, Held};
        let me = || Held(ME.to_string());
        let other = || Held(OTHER.to_string());
        // The leader: our own renewals go by, another holder or none ends it.
        let mut c = changes(vec![me(), me(), other(), me()]);
        assert_eq!(next_taken(&mut c, ME).await, OTHER);
        assert_eq!(next_taken(&mut changes(vec![me(), Free]), ME).await, "");
        assert_eq!(next_taken(&mut changes(vec![Gone]), ME).await, "");
        // A watch that ended (not allowed) never ends the leadership.
        let mut only_mine = changes(vec![me()]);
        let ended = tokio::time::timeout(Duration::from_secs(3600), next_taken(&mut only_mine, ME));
        assert!(ended.await.is_err());

        // A standby: a holder change is nothing, a release or deletion is.
        next_free(&mut changes(vec![other(), me(), Free])).await;
        next_free(&mut changes(vec![other(), Gone])).await;
        let mut only_held = changes(vec![other()]);
        let ended = tokio::time::timeout(Duration::from_secs(3600), next_free(&mut only_held));
        assert!(ended.await.is_err());
    }

    #[test]
    fn a_watched_lease_shows_its_holder() {
        assert_eq!(
            seen(&lease(Some(ME), None, None)),
            LeaseSeen::Held(ME.into())
        );
        assert_eq!(seen(&lease(None, None, None)), LeaseSeen::Free);
        assert_eq!(seen(&lease(Some(""), None, None)), LeaseSeen::Free);
        assert_eq!(seen(&Lease::default()), LeaseSeen::Free);
    }

    #[test]
    fn elector_and_its_futures_are_send() {
        fn is_send_sync<T: Send + Sync>() {}
        fn is_send<T: Send>(_: T) {}
        is_send_sync::<LeaderElector>();
        // Type-checked only: the futures must be spawnable on tokio.
        let _ = |e: &LeaderElector| {
            is_send(e.acquire());
            is_send(e.renew_loop());
            is_send(e.release());
        };
    }

    #[test]
    fn jitter_stays_in_range() {
        let p = Duration::from_secs(2);
        for _ in 0..100 {
            let j = jittered(p);
            assert!(j >= p && j <= p.mul_f64(1.0 + JITTER_FACTOR), "{j:?}");
        }
    }
}
