//! Backoff and reporting of writes that keep failing.
//!
//! A write the API server fails (not refuses) may be a blip, so the first
//! failure is only retried. When it repeats, the user gets a Degraded
//! `ApplyFailed` condition with the API server's message and a Warning Event,
//! and the operator keeps retrying, further apart each time, until the write
//! succeeds (which clears the condition).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Consecutive failures after which a failing write is reported.
pub const REPORT_AFTER: u32 = 2;
/// First retry delay.
const BASE: Duration = Duration::from_secs(5);
/// Longest retry delay.
const MAX: Duration = Duration::from_secs(300);

/// Delay before retry number `failures` (1 = after the first failure):
/// 5s, 10s, 20s… up to 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BASE.saturating_mul(1u32 << doublings).min(MAX)
}

/// Consecutive failed reconciliations per object (`namespace/name`).
#[derive(Default)]
pub struct Failures {
    counts: Mutex<HashMap<String, u32>>,
}

impl Failures {
    /// Counts one more failure of `key`; returns the count.
    pub fn record(&self, key: &str) -> u32 {
        // A poisoned lock only means another reconciliation panicked while
        // counting; the counts are still usable.
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// Forgets the failures of `key` (after a success or a deletion).
    pub fn clear(&self, key: &str) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        assert_eq!(backoff(1), Duration::from_secs(5));
        assert_eq!(backoff(2), Duration::from_secs(10));
        assert_eq!(backoff(4), Duration::from_secs(40));
        assert_eq!(backoff(7), Duration::from_secs(300));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(300));
        assert_eq!(backoff(0), Duration::from_secs(5));
    }

    #[test]
    fn failures_count_per_object_and_clear() {
        let f = Failures::default();
        assert_eq!(f.record("a/x"), 1);
        assert_eq!(f.record("a/x"), 2);
        assert_eq!(f.record("b/x"), 1);
        f.clear("a/x");
        assert_eq!(f.record("a/x"), 1);
    }
}
