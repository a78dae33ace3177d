//! Flags of `csiops-sidecar provisioner`, with external-provisioner's names
//! and defaults.

use std::net::SocketAddr;

use clap::Args;

use std::time::Duration;

use crate::common::args::{parse_duration, CommonArgs, FlagError};
use crate::common::controller::ControllerArgs;
use crate::common::kube::KubeArgs;
use crate::common::workqueue::Backoff;

use super::naming::{NamingError, VolumeNamer};
use super::node_deployment::{NodeDeployment, NodeDeploymentError, NODE_NAME_ENV};
use super::plan::ProvisionerConfig;

/// Flags of `provisioner`.
#[derive(Debug, Clone, Args)]
pub struct ProvisionerArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub controller: ControllerArgs,

    /// Concurrent CreateVolume/DeleteVolume calls (and workers per queue).
    #[arg(long, default_value_t = 100)]
    pub worker_threads: usize,

    /// Prefix of volume and PV names: `<prefix>-<claim UID>`.
    #[arg(long, default_value = "pvc")]
    pub volume_name_prefix: String,

    /// Truncates the claim UID in names to this many characters (-1: whole).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub volume_name_uuid_length: i64,

    /// Adds `csi.storage.k8s.io/pvc/name`, `pvc/namespace` and `pv/name` to
    /// the CreateVolume parameters.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub extra_create_metadata: bool,

    /// Delayed binding: require the selected node's topology only, not the
    /// other nodes' segments the class allows.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub strict_topology: bool,

    /// Immediate binding without allowedTopologies: pass the aggregated
    /// topology of the nodes that run the driver (false: no requirement).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub immediate_topology: bool,

    /// fsType when the StorageClass names none (empty: let the driver choose).
    #[arg(long, default_value = "")]
    pub default_fstype: String,

    /// A claim whose only access mode is ReadOnlyMany gets a read-only PV.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub controller_publish_readonly: bool,

    /// Upstream feature gates; `Topology=true|false` is honoured (default
    /// true), `HonorPVReclaimPolicy=true|false` switches the PV finalizer
    /// (default true), `CrossNamespaceVolumeDataSource=true|false` allows a
    /// `dataSourceRef` into another namespace that a ReferenceGrant there
    /// permits (default false), `VolumeAttributesClass=true|false` passes
    /// the parameters of a claim's VolumeAttributesClass to CreateVolume
    /// (default true, turned off at start when the API server serves no
    /// `storage.k8s.io/v1` VolumeAttributesClass and the gate was not set);
    /// `ReleaseLeaderElectionOnExit` is accepted and changes nothing (see
    /// [`IGNORED_GATES`]); other gates are refused.
    #[arg(long, default_value = "")]
    pub feature_gates: String,

    /// Deprecated upstream alias of `--http-endpoint` (only one may be set).
    #[arg(long, default_value = "")]
    pub metrics_address: String,

    /// Workers removing the cloning-protection finalizer from clone
    /// sources (see `cloning`).
    #[arg(long, default_value_t = 1)]
    pub cloning_protection_threads: usize,

    /// Refuse to restore a snapshot into a claim of another volume mode
    /// unless its VolumeSnapshotContent carries
    /// `snapshot.storage.kubernetes.io/allow-volume-mode-change: "true"`.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub prevent_volume_mode_conversion: bool,

    /// How often VolumeSnapshots still carrying our source-protection
    /// finalizer with no pending restore of them lose it; 0 turns the
    /// sweep off (see `snapshot_protection`).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub snapshot_orphan_sweep_interval: Duration,

    /// Node deployment: one provisioner per node beside its driver, for
    /// node-local volumes; it handles only the claims whose selected node
    /// is its own (`NODE_NAME`), see `node_deployment`.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub node_deployment: bool,

    /// With `--node-deployment`: claims of classes with Immediate binding
    /// are claimed by one node's provisioner (false: they are left to
    /// whoever sets their selected node).
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub node_deployment_immediate_binding: bool,

    /// With `--node-deployment`: the first wait before claiming an
    /// Immediate claim, and the jitter taken off every wait.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub node_deployment_base_delay: Duration,

    /// With `--node-deployment`: the longest wait before claiming an
    /// Immediate claim (the wait doubles with each lost attempt).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub node_deployment_max_delay: Duration,

    /// CSIStorageCapacity publishing (`--enable-capacity` and its flags).
    #[command(flatten)]
    pub capacity: super::capacity::CapacityArgs,
}

/// Upstream gates accepted with no effect here:
/// `ReleaseLeaderElectionOnExit` (the Lease is always released on exit).
pub const IGNORED_GATES: &[&str] = &["ReleaseLeaderElectionOnExit"];

/// Upstream gates this provisioner understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    pub topology: bool,
    pub honor_pv_reclaim_policy: bool,
    /// `CrossNamespaceVolumeDataSource` (default false, as upstream): a
    /// `dataSourceRef` with a namespace, allowed by a ReferenceGrant there.
    pub cross_namespace_volume_data_source: bool,
    /// `VolumeAttributesClass` (GA upstream, default on): `None` when not
    /// set, which means on unless the API server lacks the v1 API (see
    /// [`FeatureGates::attributes_class_enabled`]).
    pub volume_attributes_class: Option<bool>,
}

impl FeatureGates {
    /// Whether the `VolumeAttributesClass` gate is on, given whether the
    /// API server serves `storage.k8s.io/v1` VolumeAttributesClass
    /// (`None`: discovery failed). As upstream: a gate set on the command
    /// line stands; unset, it is on unless discovery said the API is absent.
    pub fn attributes_class_enabled(&self, served: Option<bool>) -> bool {
        match self.volume_attributes_class {
            Some(set) => set,
            None => served != Some(false),
        }
    }
}

/// Parses `Key=bool,Key=bool`.
pub fn feature_gates(s: &str) -> Result<FeatureGates, String> {
    let mut gates = FeatureGates {
        topology: true,
        honor_pv_reclaim_policy: true,
        cross_namespace_volume_data_source: false,
        volume_attributes_class: None,
    };
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not Key=true|false"))?;
        let value: bool = value
            .trim()
            .parse()
            .map_err(|_| format!("{item:?}: value must be true or false"))?;
        match key.trim() {
            "Topology" => gates.topology = value,
            "HonorPVReclaimPolicy" => gates.honor_pv_reclaim_policy = value,
            "CrossNamespaceVolumeDataSource" => gates.cross_namespace_volume_data_source = value,
            "VolumeAttributesClass" => gates.volume_attributes_class = Some(value),
            k if IGNORED_GATES.contains(&k) => {}
            other => return Err(format!("unknown gate {other:?}")),
        }
    }
    Ok(gates)
}

/// The flags after [`ProvisionerArgs::check`]: what the later steps need
/// parsed.
#[derive(Debug, Clone)]
pub struct Checked {
    pub gates: FeatureGates,
    pub namer: VolumeNamer,
    pub backoff: Backoff,
    pub http_addr: Option<SocketAddr>,
}

impl ProvisionerArgs {
    /// Checks every flag clap cannot check alone. Called first thing, before
    /// the driver is dialled or a client made, so a wrong flag ends the
    /// process at once with its name instead of behind "waiting for the CSI
    /// driver".
    pub fn check(&self) -> Result<Checked, FlagError> {
        let gates =
            feature_gates(&self.feature_gates).map_err(|e| FlagError::new("--feature-gates", e))?;
        let namer = VolumeNamer::new(&self.volume_name_prefix, self.volume_name_uuid_length)
            .map_err(|e| {
                let flag = match e {
                    NamingError::UuidLength(_) => "--volume-name-uuid-length",
                    _ => "--volume-name-prefix",
                };
                FlagError::new(flag, e)
            })?;
        if self.worker_threads == 0 {
            return Err(FlagError::new("--worker-threads", "must be at least 1"));
        }
        if self.cloning_protection_threads == 0 {
            return Err(FlagError::new(
                "--cloning-protection-threads",
                "must be at least 1",
            ));
        }
        let backoff = self.controller.check()?;
        self.kube.check()?;
        let http_addr = self.common.http_or_metrics_addr(&self.metrics_address)?;
        self.capacity.check()?;
        Ok(Checked {
            gates,
            namer,
            backoff,
            http_addr,
        })
    }

    /// Node deployment's settings with the node named by `var`
    /// (`NODE_NAME` of the process environment in `run`); `None` without
    /// `--node-deployment`. Upstream refuses to start without the variable,
    /// as here. The delays are taken as given, as upstream: a zero base
    /// races at once, a max below the base caps every wait.
    pub fn node_deployment(
        &self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<NodeDeployment>, NodeDeploymentError> {
        if !self.node_deployment {
            return Ok(None);
        }
        let node_name = var(NODE_NAME_ENV)
            .filter(|n| !n.is_empty())
            .ok_or(NodeDeploymentError::NoNodeName)?;
        Ok(Some(NodeDeployment {
            node_name,
            immediate_binding: self.node_deployment_immediate_binding,
            base_delay: self.node_deployment_base_delay,
            max_delay: self.node_deployment_max_delay,
        }))
    }

    /// The decision config for `driver`, from the checked flags; `node` is
    /// the node in node deployment.
    pub fn config(&self, driver: &str, checked: &Checked, node: Option<&str>) -> ProvisionerConfig {
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        ProvisionerConfig {
            driver_name: driver.to_string(),
            namer: checked.namer.clone(),
            default_fs_type: Some(self.default_fstype.clone()).filter(|s| !s.is_empty()),
            extra_create_metadata: self.extra_create_metadata,
            strict_topology: self.strict_topology,
            immediate_topology: self.immediate_topology,
            controller_publish_read_only: self.controller_publish_readonly,
            pv_protection_finalizer: checked.gates.honor_pv_reclaim_policy,
            cross_namespace_data_source: checked.gates.cross_namespace_volume_data_source,
            prevent_volume_mode_conversion: self.prevent_volume_mode_conversion,
            cloning_protection_threads: self.cloning_protection_threads,
            snapshot_orphan_sweep_interval: self.snapshot_orphan_sweep_interval,
            // Discovery may still turn an unset gate off (see `run`).
            volume_attributes_class: checked.gates.attributes_class_enabled(None),
            // Upstream's "<start time>-<random>-<driver>[-<node>]"; the pid
            // stands in for the random part.
            identity: Some(match node {
                Some(node) => format!("{millis}-{}-{driver}-{node}", std::process::id()),
                None => format!("{millis}-{}-{driver}", std::process::id()),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_is_checked_together() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: ProvisionerArgs,
        }
        let parse = |extra: &[&str]| {
            let mut argv = vec!["t"];
            argv.extend_from_slice(extra);
            T::parse_from(argv).a.check()
        };
        assert!(parse(&[]).is_ok());
        for (flag, argv) in [
            ("--feature-gates", &["--feature-gates=Bogus=true"][..]),
            (
                "--volume-name-uuid-length",
                &["--volume-name-uuid-length=0"],
            ),
            ("--volume-name-prefix", &["--volume-name-prefix="]),
            ("--worker-threads", &["--worker-threads=0"]),
            (
                "--cloning-protection-threads",
                &["--cloning-protection-threads=0"],
            ),
            ("--retry-interval-start", &["--retry-interval-start=0s"]),
            ("--kube-api-qps", &["--kube-api-qps=0"]),
            ("--http-endpoint", &["--http-endpoint=nohost"]),
            (
                "--metrics-address",
                &["--http-endpoint=:1", "--metrics-address=:2"],
            ),
            (
                "--capacity-poll-interval",
                &["--enable-capacity", "--capacity-poll-interval=0s"],
            ),
            (
                "--capacity-threads",
                &["--enable-capacity", "--capacity-threads=0"],
            ),
            (
                "--capacity-ownerref-level",
                &["--enable-capacity", "--capacity-ownerref-level=-2"],
            ),
            (
                "--kube-api-capacity-qps",
                &["--enable-capacity", "--kube-api-capacity-qps=0"],
            ),
            ("--master", &["--master=nohost"]),
            (
                "--leader-election-lease-duration",
                &["--leader-election", "--leader-election-lease-duration=1s"],
            ),
        ] {
            let err = parse(argv).expect_err(flag);
            let err = csiops_runtime::chain(&err).to_string();
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }

    #[test]
    fn node_deployment_flags_and_environment() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: ProvisionerArgs,
        }
        let parse = |extra: &[&str]| {
            let mut argv = vec!["t"];
            argv.extend_from_slice(extra);
            T::parse_from(argv).a
        };
        let node = |k: &str| (k == NODE_NAME_ENV).then(|| "worker-1".to_string());
        let none = |_: &str| None;
        let empty = |_: &str| Some(String::new());
        // Off: the environment is not looked at.
        let off = parse(&[]);
        assert!(off.check().is_ok());
        assert_eq!(off.node_deployment(none).expect("off"), None);
        // On, upstream's defaults.
        let on = parse(&["--node-deployment"]);
        assert!(on.check().is_ok(), "accepted now");
        assert_eq!(
            on.node_deployment(node).expect("on"),
            Some(NodeDeployment {
                node_name: "worker-1".into(),
                immediate_binding: true,
                base_delay: Duration::from_secs(20),
                max_delay: Duration::from_secs(60),
            })
        );
        for env in [none, empty] {
            let err = on.node_deployment(env).expect_err("no NODE_NAME");
            assert!(err.to_string().contains("NODE_NAME"), "{err}");
        }
        let tuned = parse(&[
            "--node-deployment=true",
            "--node-deployment-immediate-binding=false",
            "--node-deployment-base-delay=1s",
            "--node-deployment-max-delay=2m",
        ]);
        assert_eq!(
            tuned.node_deployment(node).expect("on"),
            Some(NodeDeployment {
                node_name: "worker-1".into(),
                immediate_binding: false,
                base_delay: Duration::from_secs(1),
                max_delay: Duration::from_secs(120),
            })
        );
        // The node ends upstream's identity.
        let checked = tuned.check().expect("checked");
        let identity = tuned
            .config("d", &checked, Some("worker-1"))
            .identity
            .expect("identity");
        assert!(identity.ends_with("-d-worker-1"), "{identity}");
        let identity = off.config("d", &checked, None).identity.expect("identity");
        assert!(identity.ends_with("-d"), "{identity}");
    }

    #[test]
    fn gates() {
        assert_eq!(
            feature_gates(""),
            Ok(FeatureGates {
                topology: true,
                honor_pv_reclaim_policy: true,
                cross_namespace_volume_data_source: false,
                volume_attributes_class: None,
            })
        );
        assert_eq!(
            feature_gates(
                "Topology=false, HonorPVReclaimPolicy=false,CrossNamespaceVolumeDataSource=true"
            ),
            Ok(FeatureGates {
                topology: false,
                honor_pv_reclaim_policy: false,
                cross_namespace_volume_data_source: true,
                volume_attributes_class: None,
            })
        );
        assert!(feature_gates("Topology").unwrap_err().contains("Key=true"));
        assert!(feature_gates("Topology=yes")
            .unwrap_err()
            .contains("true or false"));
        assert!(feature_gates("ReleaseLeaderElectionOnExit=false").is_ok());
        // VolumeAttributesClass: unset follows discovery (on when the API
        // is served or discovery failed), set stands whatever discovery says.
        let unset = feature_gates("").expect("gates");
        assert!(unset.attributes_class_enabled(Some(true)));
        assert!(unset.attributes_class_enabled(None));
        assert!(!unset.attributes_class_enabled(Some(false)));
        let on = feature_gates("VolumeAttributesClass=true").expect("gates");
        assert_eq!(on.volume_attributes_class, Some(true));
        assert!(on.attributes_class_enabled(Some(false)));
        let off = feature_gates("VolumeAttributesClass=false").expect("gates");
        assert!(!off.attributes_class_enabled(Some(true)));
        assert!(feature_gates("CSIStorageCapacity=true")
            .unwrap_err()
            .contains("unknown gate"));
    }
}
