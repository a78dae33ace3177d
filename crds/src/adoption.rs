//! `spec.adoption`: taking over a running deployment of the same driver.
//!
//! A storage admin who already runs a driver from its vendor's manifests, a
//! Helm chart or another operator names the running workloads here; the
//! operator then replaces them without a volume outage (see
//! `docs/adoption.md`): it keeps the CSIDriver, moves the node plugin node by
//! node, starts its controller beside the old one (the sidecars share
//! upstream's leader-election Leases, so one provisioner and one attacher
//! act at a time) and removes the old objects once nothing runs from them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a CSIDriverDeployment takes over. Every workload named here must be
/// in the object's own namespace: the sidecars' leader-election Leases live
/// in their pods' namespace, and only a shared Lease keeps the old and the
/// new provisioner from acting at once.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionSpec {
    /// The running controller workload (the pod with the provisioner and
    /// the attacher). It is deleted once this object's controller has a
    /// Ready replica. Gone already: nothing to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<AdoptedWorkload>,

    /// Name of the running node DaemonSet (the pod with the registrar). Its
    /// pods are replaced node by node; it is deleted once none is left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub node_daemon_set: Option<String>,

    /// Further objects of the old deployment, deleted once its workloads are
    /// gone: its ServiceAccounts, RoleBindings and Services (in this
    /// namespace) and ClusterRoleBindings. An object that is already gone is
    /// skipped; one owned by something else (an owner reference), or a
    /// built-in binding (`system:` names), is never deleted. Roles,
    /// ClusterRoles and ConfigMaps are not among them: the operator holds
    /// no verb on those (docs/security.md); a role grants nothing once its
    /// bindings are gone, and the takeover's Event names what is left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub remove: Vec<AdoptedObject>,
}

/// A running controller workload.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptedWorkload {
    pub kind: AdoptedWorkloadKind,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The kind of a running controller workload.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AdoptedWorkloadKind {
    Deployment,
    StatefulSet,
}

impl AdoptedWorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AdoptedWorkloadKind::Deployment => "Deployment",
            AdoptedWorkloadKind::StatefulSet => "StatefulSet",
        }
    }
}

/// One more object of the old deployment.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptedObject {
    pub kind: AdoptedObjectKind,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The kinds `spec.adoption.remove` may name.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum AdoptedObjectKind {
    ServiceAccount,
    RoleBinding,
    Service,
    ClusterRoleBinding,
}

impl AdoptedObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AdoptedObjectKind::ServiceAccount => "ServiceAccount",
            AdoptedObjectKind::RoleBinding => "RoleBinding",
            AdoptedObjectKind::Service => "Service",
            AdoptedObjectKind::ClusterRoleBinding => "ClusterRoleBinding",
        }
    }

    /// Whether objects of this kind are cluster-scoped.
    pub fn cluster_scoped(self) -> bool {
        matches!(self, AdoptedObjectKind::ClusterRoleBinding)
    }
}

/// The node label that moves one node's plugin from the old DaemonSet to
/// this object's (see [`AdoptionStage`]); one key per driver.
pub fn adoption_label_key(driver_name: &str) -> String {
    format!("adopt.csiops.dev/{driver_name}")
}

/// Where a node is in the takeover, as the value of its
/// [`adoption_label_key`] label. The old DaemonSet runs only on `Waiting`
/// nodes; this object's runs on every node that is neither `Waiting` nor
/// `Leaving` (so a node without the label, e.g. one that joins later, gets
/// only the new plugin, and the label can go when the takeover is done).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AdoptionStage {
    /// The old plugin runs here; the new one waits.
    Waiting,
    /// The old plugin is being removed; the new one waits until it is gone
    /// (two plugins of one driver on a node would share its sockets).
    Leaving,
    /// The new plugin runs here.
    Done,
}

impl AdoptionStage {
    pub const ALL: [AdoptionStage; 3] = [
        AdoptionStage::Waiting,
        AdoptionStage::Leaving,
        AdoptionStage::Done,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AdoptionStage::Waiting => "waiting",
            AdoptionStage::Leaving => "leaving",
            AdoptionStage::Done => "done",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == value)
    }
}
