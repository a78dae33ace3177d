//! What the controller sidecars (provisioner, attacher) share besides the
//! work queue: retry and leader-election flags with the upstream names.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use csiops_runtime::leader::LeaderConfig;

use super::args::{parse_duration, FlagError};
use super::workqueue::Backoff;

/// Retry and leader-election flags.
#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    /// First retry delay of a failed object; doubles on every failure.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub retry_interval_start: Duration,

    /// Longest retry delay of a failed object.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub retry_interval_max: Duration,

    /// Only one replica acts at a time, elected with a Lease.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the Lease; default: the pod's namespace (in cluster),
    /// else `default`.
    #[arg(long, default_value = "")]
    pub leader_election_namespace: String,

    /// How long a Lease stays valid after its last renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader retries renewing before it gives up.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_election_renew_deadline: Duration,

    /// Interval between attempts to acquire or renew the Lease.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub leader_election_retry_period: Duration,

    /// Labels the leader puts on the Lease: `key:value,key:value`.
    #[arg(long, default_value = "", value_parser = parse_lease_labels)]
    pub leader_election_labels: LeaseLabels,
}

/// The labels of `--leader-election-labels`.
pub type LeaseLabels = BTreeMap<String, String>;

/// csi-lib-utils' format of `--leader-election-labels`: comma-separated
/// `key:value` items, each with exactly one colon; empty is none.
pub fn parse_lease_labels(s: &str) -> Result<LeaseLabels, String> {
    if s.is_empty() {
        return Ok(LeaseLabels::new());
    }
    s.split(',')
        .map(|item| match item.split(':').collect::<Vec<_>>()[..] {
            [k, v] => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("malformed item in list of labels: {item}")),
        })
        .collect()
}

impl ControllerArgs {
    pub fn backoff(&self) -> Result<Backoff, FlagError> {
        if self.retry_interval_start.is_zero()
            || self.retry_interval_max < self.retry_interval_start
        {
            return Err(FlagError::new(
                "--retry-interval-start",
                format!(
                    "--retry-interval-start ({:?}) must be positive and at most --retry-interval-max ({:?})",
                    self.retry_interval_start, self.retry_interval_max
                ),
            ));
        }
        Ok(Backoff {
            start: self.retry_interval_start,
            max: self.retry_interval_max,
        })
    }

    /// Every flag of this group that clap cannot check alone: the retry
    /// bounds and, with `--leader-election`, the election timings (which
    /// would otherwise be refused only once the driver answered). Returns
    /// the backoff.
    pub fn check(&self) -> Result<Backoff, FlagError> {
        let backoff = self.backoff()?;
        if self.leader_election {
            let timings = LeaderConfig {
                lease_duration: self.leader_election_lease_duration,
                renew_deadline: self.leader_election_renew_deadline,
                retry_period: self.leader_election_retry_period,
                // Placeholders: only the timings are checked here.
                ..LeaderConfig::new("lease", "namespace", "identity")
            };
            timings.validate().map_err(|e| {
                FlagError::new(
                    "--leader-election-lease-duration, --leader-election-renew-deadline, \
                     --leader-election-retry-period",
                    e,
                )
            })?;
        }
        Ok(backoff)
    }

    /// The Lease config for `lease_name`, with the pod name (or host name)
    /// as identity.
    pub fn leader_config(&self, lease_name: &str) -> LeaderConfig {
        let namespace = self.namespace();
        LeaderConfig {
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
            labels: self.leader_election_labels.clone(),
            ..LeaderConfig::new(lease_name, namespace, csiops_runtime::kube::identity(None))
        }
    }
}

impl ControllerArgs {
    /// The namespace of the Lease and of what the leader keeps beside it
    /// (the provisioner's journal): `--leader-election-namespace`, else the
    /// pod's namespace, else `default`.
    pub fn namespace(&self) -> String {
        if self.leader_election_namespace.is_empty() {
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .map(|s| s.trim().to_string())
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".to_string())
        } else {
            self.leader_election_namespace.clone()
        }
    }
}

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// csi-lib-utils' sanitising of a driver name into a name part (used for
/// Lease names and the attacher's finalizer, so ours and upstream's agree):
/// every character outside `[A-Za-z0-9-]` becomes `-`, and a trailing `-`
/// gets an `X` (such names may not end with `-`).
pub fn sanitize_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if out.ends_with('-') {
        out.push('X');
    }
    out
}

/// A Lease name from a driver name, as csi-lib-utils makes it (so our
/// sidecar and an upstream one of the same driver share one Lease).
pub fn lease_name(prefix: &str, driver: &str) -> String {
    sanitize_name(&format!("{prefix}{driver}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn lease_labels_as_csi_lib_utils_parses_them() {
        use super::parse_lease_labels;
        assert!(parse_lease_labels("").expect("empty").is_empty());
        let l = parse_lease_labels("a:b,c.io/d:e").expect("labels");
        assert_eq!(l.get("a").map(String::as_str), Some("b"));
        assert_eq!(l.get("c.io/d").map(String::as_str), Some("e"));
        for bad in ["a", "a:b:c", "a:b,", ","] {
            assert!(parse_lease_labels(bad).is_err(), "{bad}");
        }
    }

    use super::*;
    use csiops_runtime::chain;

    #[test]
    fn lease_names_are_sanitized_like_upstream() {
        assert_eq!(
            lease_name("external-attacher-leader-", "hostpath.csi.k8s.io"),
            "external-attacher-leader-hostpath-csi-k8s-io"
        );
        assert_eq!(lease_name("", "vendor.io/block_"), "vendor-io-block-X");
    }

    #[test]
    fn backoff_bounds_are_checked() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            c: ControllerArgs,
        }
        let t = T::parse_from(["t"]);
        assert_eq!(
            t.c.backoff().expect("the defaults are valid"),
            (Backoff {
                start: Duration::from_secs(1),
                max: Duration::from_secs(300)
            })
        );
        assert!(!t.c.leader_election);
        let t = T::parse_from(["t", "--leader-election", "--retry-interval-start=10m"]);
        assert!(t.c.leader_election);
        assert!(chain(&t.c.backoff().unwrap_err())
            .to_string()
            .contains("at most"));
        let t = T::parse_from(["t", "--leader-election=false"]);
        assert!(!t.c.leader_election);
        let cfg = t.c.leader_config("lease");
        assert_eq!(cfg.lease_name, "lease");
        assert!(cfg.validate().is_ok(), "{:?}", cfg.validate());
    }

    #[test]
    fn election_timings_are_checked_up_front() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            c: ControllerArgs,
        }
        let ok = T::parse_from(["t", "--leader-election"]);
        assert!(ok.c.check().is_ok(), "{:?}", ok.c.check());
        let bad = T::parse_from([
            "t",
            "--leader-election",
            "--leader-election-lease-duration=5s",
        ]);
        let err = bad
            .c
            .check()
            .expect_err("lease shorter than the renew deadline");
        let err = chain(&err).to_string();
        assert!(err.contains("--leader-election-lease-duration"), "{err}");
        // Without election the timings are unused, and not judged.
        let off = T::parse_from(["t", "--leader-election-lease-duration=5s"]);
        assert!(off.c.check().is_ok());
        let err = T::parse_from(["t", "--retry-interval-start=0s"])
            .c
            .check()
            .expect_err("zero retry start");
        let err = chain(&err).to_string();
        assert!(err.contains("--retry-interval-start"), "{err}");
    }
}
