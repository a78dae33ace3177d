//! Whether this replica may act now, consulted before each action with
//! effects outside the process.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

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
    /// A guard not held until a [`LeaderElector`](super::LeaderElector) made with it leads.
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
    pub(super) fn renewed(&self, until: Instant) {
        let mut held = self.held();
        if *held != Held::Always {
            *held = Held::Until(until);
        }
    }

    /// Held from now on: this replica runs without election.
    pub(super) fn hold_always(&self) {
        *self.held() = Held::Always;
    }

    /// Not held any more (lost or released); an unconditional guard stays so.
    pub(super) fn revoke(&self) {
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

    /// Leadership lost, as [`LeaderElector`](super::LeaderElector) revokes it (tests).
    pub fn lose(&self) {
        self.revoke();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
}
