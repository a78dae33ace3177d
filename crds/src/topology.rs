//! `spec.topology`: where the driver's controller service runs, and the
//! rules that keep a node-local object from asking for what cannot exist.
//!
//! The CEL rules of the CRD are built here from the same field lists that
//! the operator's own checks use ([`crate::node_local`]), so the API server
//! and the operator refuse exactly the same objects (the operator checks
//! again in case the schema was bypassed). This module names no spec type:
//! the spec uses its rules.

use kube::core::Rule;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the driver's controller service runs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Topology {
    /// The CSI design's recommended deployment: a controller workload
    /// (`spec.controller`: a StatefulSet or Deployment) runs the driver's
    /// controller service with the provisioner, the attacher (with
    /// `csiDriver.attachRequired`) and the enabled helpers; the node
    /// DaemonSet runs the driver's node service with the registrar and the
    /// liveness probe. For drivers whose controller service reaches every
    /// volume from anywhere (an array, a cloud API, a network filesystem).
    #[default]
    Central,
    /// Distributed provisioning, as upstream csi-driver-host-path's
    /// `deploy/kubernetes-distributed`: no controller workload. Each node's
    /// pod runs the driver (controller and node service in one process with
    /// one state), the bundled provisioner with `--node-deployment` (it
    /// provisions only claims scheduled to its node and deletes only its
    /// node's volumes), the registrar and the liveness probe. For drivers
    /// whose volumes live on one node: csi-driver-host-path, TopoLVM-style
    /// LVM, democratic-csi local-hostpath/zfs-local, OpenEBS local engines.
    /// Needs `csiDriver.attachRequired: false`; `spec.controller`, the
    /// resizer, snapshotter and health monitor, and extra containers of the
    /// controller pods are refused (there are none). StorageClasses should
    /// bind `WaitForFirstConsumer`, so a claim is provisioned on the node
    /// its pod was scheduled to.
    NodeLocal,
}

impl Topology {
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Central => "Central",
            Topology::NodeLocal => "NodeLocal",
        }
    }

    /// Whether a controller workload runs.
    pub fn has_controller(self) -> bool {
        self == Topology::Central
    }
}

/// How a field of `spec.controller` counts as set, for [`controller_fields_rule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldKind {
    /// Set when present.
    Value,
    /// Set when present and not empty (a list or map).
    Collection,
    /// Set when present and true.
    Flag,
}

/// The fields of `spec.controller` (with its flattened driver override and
/// pod settings) besides `kind` and `replicas`: what a node-local object
/// must leave unset.
pub const CONTROLLER_FIELDS: &[(&str, FieldKind)] = &[
    ("nodeSelector", FieldKind::Collection),
    ("tolerations", FieldKind::Collection),
    ("affinity", FieldKind::Value),
    ("priorityClassName", FieldKind::Value),
    ("disruptionBudget", FieldKind::Value),
    ("image", FieldKind::Value),
    ("args", FieldKind::Collection),
    ("env", FieldKind::Collection),
    ("resources", FieldKind::Value),
    ("volumeMounts", FieldKind::Collection),
    ("securityContext", FieldKind::Value),
    ("volumes", FieldKind::Collection),
    ("hostNetwork", FieldKind::Flag),
    ("dnsPolicy", FieldKind::Value),
    ("hostPID", FieldKind::Flag),
    ("podAnnotations", FieldKind::Collection),
    ("podLabels", FieldKind::Collection),
];

/// The upstream helpers under `spec.sidecars`, which run in controller pods only.
pub const CONTROLLER_HELPERS: &[&str] = &["resizer", "snapshotter", "healthMonitor"];

const NODE_LOCAL: &str = "has(self.topology) && self.topology == 'NodeLocal'";

/// Message of [`attach_rule`]; the operator's own check says the same.
pub const ATTACH_MESSAGE: &str = "spec.topology NodeLocal needs csiDriver.attachRequired: false: no controller runs an attacher, a node's driver can publish only its own volumes, and a node-local volume needs no attach";
/// Message of [`controller_fields_rule`].
pub const CONTROLLER_MESSAGE: &str = "spec.topology NodeLocal runs no controller workload: spec.controller must keep its defaults (kind StatefulSet, replicas 1) and set nothing else (nodeSelector, tolerations, affinity, priorityClassName, disruptionBudget, image, args, env, resources, volumeMounts, securityContext, volumes, hostNetwork, dnsPolicy, hostPID, podAnnotations, podLabels); the driver's pods are set in spec.node";
/// Message of [`helpers_rule`].
pub const HELPERS_MESSAGE: &str = "spec.topology NodeLocal runs no controller pods: the resizer, snapshotter and healthMonitor helpers cannot run (they have no per-node mode: one per node would act on every node's volumes through its own node's driver); disable them";
/// Message of [`extra_rule`].
pub const EXTRA_MESSAGE: &str = "spec.topology NodeLocal runs no controller pods: every spec.sidecars.extra container needs pod: Node";

/// NodeLocal needs `csiDriver.attachRequired: false`. A missing value is
/// true (the default), so it is refused too.
pub fn attach_rule() -> Rule {
    Rule::new(format!(
        "!({NODE_LOCAL}) || (has(self.csiDriver) && has(self.csiDriver.attachRequired) && !self.csiDriver.attachRequired)"
    ))
    .message(ATTACH_MESSAGE)
}

/// NodeLocal leaves `spec.controller` at its defaults.
pub fn controller_fields_rule() -> Rule {
    let c = "self.controller";
    let mut checks = vec![
        format!("(!has({c}.kind) || {c}.kind == 'StatefulSet')"),
        format!("(!has({c}.replicas) || {c}.replicas == 1)"),
    ];
    checks.extend(CONTROLLER_FIELDS.iter().map(|(f, kind)| match kind {
        FieldKind::Value => format!("!has({c}.{f})"),
        FieldKind::Collection => format!("(!has({c}.{f}) || size({c}.{f}) == 0)"),
        FieldKind::Flag => format!("(!has({c}.{f}) || !{c}.{f})"),
    }));
    Rule::new(format!(
        "!({NODE_LOCAL}) || !has({c}) || ({})",
        checks.join(" && ")
    ))
    .message(CONTROLLER_MESSAGE)
}

/// NodeLocal enables none of the controller helpers.
pub fn helpers_rule() -> Rule {
    let checks: Vec<String> = CONTROLLER_HELPERS
        .iter()
        .map(|h| {
            let s = format!("self.sidecars.{h}");
            format!("(!has({s}) || !has({s}.enabled) || !{s}.enabled)")
        })
        .collect();
    Rule::new(format!(
        "!({NODE_LOCAL}) || !has(self.sidecars) || ({})",
        checks.join(" && ")
    ))
    .message(HELPERS_MESSAGE)
}

/// NodeLocal puts every extra container into the node pods.
pub fn extra_rule() -> Rule {
    Rule::new(format!(
        "!({NODE_LOCAL}) || !has(self.sidecars) || !has(self.sidecars.extra) || self.sidecars.extra.all(e, has(e.pod) && e.pod == 'Node')"
    ))
    .message(EXTRA_MESSAGE)
}
