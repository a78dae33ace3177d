//! Claims whose CreateVolume the driver refused as InvalidArgument wait
//! `--retry-interval-max` before the next attempt, as upstream does since
//! v6.0 (sig-storage-lib-external-provisioner's "infeasible" retry): the
//! request itself is wrong (a parameter the driver refuses, a size it cannot
//! make), so retrying it on the ordinary backoff only floods the driver and
//! the claim's Events. The wait ends early when the claim's StorageClass is
//! re-created (a new UID), the usual way an admin fixes its parameters.
//!
//! Kept in memory, per claim UID: a restart retries at once, as upstream's.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// When a claim was refused, and under which StorageClass UID.
#[derive(Debug, Clone)]
struct Refused {
    at: Instant,
    class_uid: String,
}

/// The claims waiting out an InvalidArgument.
#[derive(Debug)]
pub struct Infeasible {
    wait: Duration,
    refused: Mutex<HashMap<String, Refused>>,
}

impl Infeasible {
    /// Refused claims wait `wait` (`--retry-interval-max`).
    pub fn new(wait: Duration) -> Self {
        Infeasible {
            wait,
            refused: Mutex::new(HashMap::new()),
        }
    }

    /// How long a refused claim waits.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Records a refusal of claim `claim_uid` under class `class_uid`. An
    /// earlier refusal still waiting keeps its time, as upstream's set does.
    pub fn refused(&self, claim_uid: &str, class_uid: &str, now: Instant) {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused.retain(|_, r| now.saturating_duration_since(r.at) < self.wait);
        refused
            .entry(claim_uid.to_string())
            .or_insert_with(|| Refused {
                at: now,
                class_uid: class_uid.to_string(),
            });
    }

    /// How much longer claim `claim_uid` waits before CreateVolume is tried
    /// again; `None` when it may be tried now (never refused, waited long
    /// enough, or its class was re-created since).
    pub fn remaining(&self, claim_uid: &str, class_uid: &str, now: Instant) -> Option<Duration> {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        let r = refused.get(claim_uid)?;
        let waited = now.saturating_duration_since(r.at);
        if r.class_uid != class_uid || waited >= self.wait {
            refused.remove(claim_uid);
            return None;
        }
        Some(self.wait - waited)
    }

    /// The claim is gone or provisioned.
    pub fn forget(&self, claim_uid: &str) {
        let mut refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused.remove(claim_uid);
    }
}

/// Whether the driver's answer marks the request infeasible: InvalidArgument
/// only, as upstream (OutOfRange and Unimplemented keep the ordinary
/// backoff there too).
pub fn is_infeasible(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::InvalidArgument
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_claim_waits_until_the_interval_or_a_new_class() {
        let set = Infeasible::new(Duration::from_secs(300));
        let t0 = Instant::now();
        assert_eq!(set.remaining("c1", "class-1", t0), None, "never refused");
        set.refused("c1", "class-1", t0);
        assert_eq!(
            set.remaining("c1", "class-1", t0 + Duration::from_secs(100)),
            Some(Duration::from_secs(200))
        );
        // Refused again while waiting: the first time stands.
        set.refused("c1", "class-1", t0 + Duration::from_secs(100));
        assert_eq!(
            set.remaining("c1", "class-1", t0 + Duration::from_secs(250)),
            Some(Duration::from_secs(50))
        );
        assert_eq!(
            set.remaining("c1", "class-1", t0 + Duration::from_secs(300)),
            None,
            "waited long enough"
        );
        // A re-created class (new UID) ends the wait at once.
        set.refused("c2", "class-1", t0);
        assert_eq!(set.remaining("c2", "class-2", t0), None);
        assert_eq!(set.remaining("c2", "class-1", t0), None, "and forgets it");
        // Other claims are not affected; forget ends a wait.
        set.refused("c3", "class-1", t0);
        assert_eq!(set.remaining("c4", "class-1", t0), None);
        set.forget("c3");
        assert_eq!(set.remaining("c3", "class-1", t0), None);
    }

    #[test]
    fn only_invalid_argument_is_infeasible() {
        use tonic::{Code, Status};
        assert!(is_infeasible(&Status::invalid_argument("bad parameter")));
        for code in [
            Code::OutOfRange,
            Code::Unimplemented,
            Code::ResourceExhausted,
            Code::Internal,
        ] {
            assert!(!is_infeasible(&Status::new(code, "x")), "{code:?}");
        }
    }
}
