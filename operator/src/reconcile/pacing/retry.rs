//! Backoff and reporting of writes that keep failing.
//!
//! A write the API server fails (not refuses) may be a blip, so the first
//! failure is only retried. When it repeats, the user gets a Degraded
//! `ApplyFailed` condition with the API server's message and a Warning Event,
//! and the operator keeps retrying, further apart each time, until the write
//! succeeds (which clears the condition).

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

/// Consecutive failed reconciliations of one object (kept with the
/// object's other state).
#[derive(Debug, Default)]
pub struct Failures(u32);

impl Failures {
    /// Counts one more failure; returns the count.
    pub fn record(&mut self) -> u32 {
        self.0 = self.0.saturating_add(1);
        self.0
    }

    /// Forgets the failures (after a success or a deletion).
    pub fn clear(&mut self) {
        self.0 = 0;
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
        let (mut a, mut b) = (Failures::default(), Failures::default());
        assert_eq!(a.record(), 1);
        assert_eq!(a.record(), 2);
        assert_eq!(b.record(), 1);
        a.clear();
        assert_eq!(a.record(), 1);
    }
}
