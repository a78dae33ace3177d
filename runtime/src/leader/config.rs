//! Where the Lease lives, who this replica is, and the election timings,
//! checked so that two replicas can never both believe they lead.

use std::collections::BTreeMap;
use std::time::Duration;

/// How long a lease stays valid after its last renewal (client-go default).
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long the leader keeps trying to renew before giving up (client-go default).
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// Interval between acquire/renew attempts (client-go default).
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Maximum extra random wait between acquire attempts, as a fraction of
/// `retry_period` (client-go's `JitterFactor`), so standbys do not hit the API
/// server in lockstep.
pub(super) const JITTER_FACTOR: f64 = 1.2;

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
    pub labels: BTreeMap<String, String>,
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
    pub(super) fn lease_duration_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LeaderConfig {
        LeaderConfig::new("csiops-leader", "csiops-system", "csiops-0")
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
}
