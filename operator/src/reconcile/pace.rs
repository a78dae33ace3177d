//! At most one reconcile of an object per [`MIN_INTERVAL`], however many
//! watch events arrive.
//!
//! During a node roll every pod change of a driver wakes its object, a few
//! per second on a large cluster; each reconcile reads the object and may
//! write its status. kube's own debounce delays a reconcile until events
//! stop for a while, which on a busy object means never. This pacer limits
//! the rate instead: a reconcile that comes too soon after the last one
//! does nothing and asks to run again when the interval is over, and the
//! events that arrive meanwhile all fold into that one run.
//!
//! The interval is short (a quarter second): every step of a rollout that
//! waits on the cluster (a controller replica Ready, the last node pod up)
//! is noticed at the next paced reconcile, and the controller's surge roll
//! alone is three such steps. At a second, the fleet benchmark's 1000-node
//! upgrade spent three seconds on them, a tenth of the node roll; at a
//! quarter second a busy object still costs at most four reads (and status
//! writes, when its counts moved) a second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest time between two reconciles of one object.
pub const MIN_INTERVAL: Duration = Duration::from_millis(250);

/// When each object's last reconcile started.
#[derive(Debug)]
pub struct Pacer {
    interval: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::new(MIN_INTERVAL)
    }
}

impl Pacer {
    /// A pacer of `interval` (zero: never holds).
    pub fn new(interval: Duration) -> Self {
        Pacer {
            interval,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// `None`: go ahead (recorded as started now). `Some(wait)`: too soon,
    /// come back after `wait`.
    pub fn hold(&self, key: &str, now: Instant) -> Option<Duration> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = last.get(key) {
            let since = now.saturating_duration_since(*at);
            if since < self.interval {
                return Some(self.interval - since);
            }
        }
        last.insert(key.to_string(), now);
        None
    }

    /// Forgets a deleted object.
    pub fn forget(&self, key: &str) {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_reconcile_within_the_interval_waits_for_the_rest_of_it() {
        let pacer = Pacer::new(Duration::from_secs(1));
        let t = Instant::now();
        assert_eq!(pacer.hold("ns/a", t), None);
        let wait = pacer.hold("ns/a", t + Duration::from_millis(300));
        assert_eq!(wait, Some(Duration::from_millis(700)));
        // Other objects are not held.
        assert_eq!(pacer.hold("ns/b", t + Duration::from_millis(300)), None);
        assert_eq!(pacer.hold("ns/a", t + Duration::from_secs(1)), None);
        let pacer = Pacer::default();
        assert_eq!(pacer.hold("ns/a", t), None);
        assert!(pacer.hold("ns/a", t + MIN_INTERVAL / 2).is_some());
        assert_eq!(pacer.hold("ns/a", t + MIN_INTERVAL), None);
        pacer.forget("ns/a");
        assert_eq!(pacer.hold("ns/a", t + MIN_INTERVAL), None);
        let off = Pacer::new(Duration::ZERO);
        assert_eq!((off.hold("x", t), off.hold("x", t)), (None, None));
    }
}
