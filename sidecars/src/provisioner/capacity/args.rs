//! The capacity flags, with external-provisioner v6.3.0's names and
//! defaults, and the environment upstream reads for them.

use std::time::Duration;

use clap::Args;

use super::CapacityError;
use crate::common::args::{parse_duration, FlagError};

/// Flags of CSIStorageCapacity publishing.
#[derive(Debug, Clone, Args)]
pub struct CapacityArgs {
    /// Publish CSIStorageCapacity objects from the driver's GetCapacity
    /// (needs GET_CAPACITY, and NAMESPACE/POD_NAME in the environment).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub enable_capacity: bool,

    /// Also publish for StorageClasses with Immediate binding (the
    /// scheduler does not use them; for other consumers).
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub capacity_for_immediate_binding: bool,

    /// How often every published capacity is asked again.
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub capacity_poll_interval: Duration,

    /// Owner of the objects, levels up from the pod POD_NAME: -1 none, 0 the
    /// pod, 1 its controller (StatefulSet, ReplicaSet), 2 that one's
    /// (Deployment)…
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub capacity_ownerref_level: i64,

    /// Workers creating and updating CSIStorageCapacity objects.
    #[arg(long, default_value_t = 1)]
    pub capacity_threads: usize,

    /// Requests per second of the capacity client (its own rate limit).
    #[arg(long, default_value_t = 1.0)]
    pub kube_api_capacity_qps: f64,

    /// Burst of the capacity client.
    #[arg(long, default_value_t = 5)]
    pub kube_api_capacity_burst: u32,
}

/// Where the objects go and whose pod this is: `NAMESPACE` and `POD_NAME`
/// (upstream's names; its README's `POD_NAMESPACE` is not what it reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityEnv {
    pub namespace: String,
    /// Needed when the owner level is 0 or more.
    pub pod_name: Option<String>,
}

impl CapacityArgs {
    /// The flags' values, when publishing is on (a manifest that sets a
    /// capacity flag without `--enable-capacity` keeps working, as upstream).
    pub fn check(&self) -> Result<(), FlagError> {
        if !self.enable_capacity {
            return Ok(());
        }
        if self.capacity_poll_interval.is_zero() {
            return Err(FlagError::new(
                "--capacity-poll-interval",
                "must be longer than 0s",
            ));
        }
        if self.capacity_threads == 0 {
            return Err(FlagError::new("--capacity-threads", "must be at least 1"));
        }
        if self.capacity_ownerref_level < -1 {
            return Err(FlagError::new(
                "--capacity-ownerref-level",
                "must be -1 (no owner) or more",
            ));
        }
        if !(self.kube_api_capacity_qps > 0.0 && self.kube_api_capacity_qps.is_finite())
            || self.kube_api_capacity_burst == 0
        {
            return Err(FlagError::new(
                "--kube-api-capacity-qps, --kube-api-capacity-burst",
                format!(
                    "QPS must be positive and burst at least 1 (got {}, {})",
                    self.kube_api_capacity_qps, self.kube_api_capacity_burst
                ),
            ));
        }
        Ok(())
    }

    /// The environment publishing needs, from `var` (the process
    /// environment in `run`): `None` when publishing is off.
    pub fn env(
        &self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<CapacityEnv>, CapacityError> {
        if !self.enable_capacity {
            return Ok(None);
        }
        let namespace = var("NAMESPACE")
            .filter(|s| !s.is_empty())
            .ok_or(CapacityError::NoNamespace)?;
        let pod_name = var("POD_NAME").filter(|s| !s.is_empty());
        if self.capacity_ownerref_level >= 0 && pod_name.is_none() {
            return Err(CapacityError::NoPodName {
                level: self.capacity_ownerref_level,
            });
        }
        Ok(Some(CapacityEnv {
            namespace,
            pod_name,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: CapacityArgs,
    }

    fn parse(argv: &[&str]) -> CapacityArgs {
        let mut all = vec!["t"];
        all.extend_from_slice(argv);
        T::parse_from(all).a
    }

    #[test]
    fn upstream_defaults() {
        let a = parse(&[]);
        assert!(!a.enable_capacity);
        assert!(!a.capacity_for_immediate_binding);
        assert_eq!(a.capacity_poll_interval, Duration::from_secs(60));
        assert_eq!(a.capacity_ownerref_level, 1);
        assert_eq!(a.capacity_threads, 1);
        assert_eq!(a.kube_api_capacity_qps, 1.0);
        assert_eq!(a.kube_api_capacity_burst, 5);
        assert!(a.check().is_ok());
    }

    #[test]
    fn bad_values_are_refused_only_when_enabled() {
        assert!(parse(&["--capacity-threads=0"]).check().is_ok());
        let err = parse(&["--enable-capacity", "--capacity-threads=0"])
            .check()
            .unwrap_err();
        assert_eq!(err.flag, "--capacity-threads");
        let err = parse(&["--enable-capacity", "--capacity-ownerref-level=-2"])
            .check()
            .unwrap_err();
        assert_eq!(err.flag, "--capacity-ownerref-level");
        assert!(
            parse(&["--enable-capacity", "--capacity-ownerref-level=-1"])
                .check()
                .is_ok()
        );
    }

    #[test]
    fn environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(parse(&[]).env(env(&[])).unwrap(), None);
        let on = parse(&["--enable-capacity"]);
        assert!(matches!(
            on.env(env(&[("POD_NAME", "p")])),
            Err(CapacityError::NoNamespace)
        ));
        assert!(matches!(
            on.env(env(&[("NAMESPACE", "ns")])),
            Err(CapacityError::NoPodName { level: 1 })
        ));
        assert_eq!(
            on.env(env(&[("NAMESPACE", "ns"), ("POD_NAME", "p")]))
                .unwrap(),
            Some(CapacityEnv {
                namespace: "ns".into(),
                pod_name: Some("p".into())
            })
        );
        let no_owner = parse(&["--enable-capacity", "--capacity-ownerref-level=-1"]);
        assert_eq!(
            no_owner.env(env(&[("NAMESPACE", "ns")])).unwrap(),
            Some(CapacityEnv {
                namespace: "ns".into(),
                pod_name: None
            })
        );
    }
}
