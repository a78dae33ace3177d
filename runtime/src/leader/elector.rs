//! The I/O of the election: reads and writes of the Lease, the watch of
//! it, and the timing of attempts and renewals.

use std::convert::Infallible;
use std::future::ready;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::Utc;
use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use tokio::time::Instant;

use super::config::JITTER_FACTOR;
use super::decision::{
    build_lease, decide, released_lease, seen, Decision, LeaseSeen, Observation,
};
use super::{LeaderConfig, LeaderError, LeaseGuard};
use crate::error::chain;

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
    /// Validates `cfg` and prepares to elect on its Lease, keeping `guard`
    /// held exactly while this replica leads (`guard` is made first so that
    /// the clients which consult it can be built before the election).
    pub fn new(client: Client, cfg: LeaderConfig, guard: LeaseGuard) -> Result<Self, LeaderError> {
        cfg.validate()?;
        guard.revoke();
        Ok(Self {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            state: Mutex::new(State::default()),
            guard,
        })
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
            Decision::Create => self
                .api
                .create(&pp, &lease)
                .await
                .map_err(write_err("create")),
            _ => self
                .api
                .replace(name, &pp, &lease)
                .await
                .map_err(write_err("replace")),
        }?;
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

    pub(super) fn lease_ref(&self) -> String {
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

/// [`kube_err`] for a write that claims the Lease, where losing the race to
/// another writer is [`LeaderError::Conflict`]: decide again, not an error.
fn write_err(op: &'static str) -> impl FnOnce(kube::Error) -> LeaderError {
    move |source| {
        if is_conflict(&source) {
            LeaderError::Conflict
        } else {
            kube_err(op)(source)
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "csiops-0";
    const OTHER: &str = "csiops-1";

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
