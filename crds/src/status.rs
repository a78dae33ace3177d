//! The observed state of a `CSIDriverDeployment`, written by the operator only.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// High-level state shown in `kubectl get csidd`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum Phase {
    /// Seen, nothing deployed yet.
    #[default]
    Pending,
    /// First installation in progress.
    Deploying,
    /// An ordered rollout of a change is in progress.
    Upgrading,
    /// Everything deployed, ready and registered.
    Running,
    /// Something is wrong; the Degraded condition says what.
    Degraded,
    /// Ordered teardown in progress.
    Deleting,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Deploying => "Deploying",
            Phase::Upgrading => "Upgrading",
            Phase::Running => "Running",
            Phase::Degraded => "Degraded",
            Phase::Deleting => "Deleting",
        }
    }
}

/// What kind of rollout is in progress.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RolloutKind {
    /// First deployment: node DaemonSet, then controller.
    Install,
    /// Node-side change: the DaemonSet rolled, then the controller (with
    /// `rollout.strategy: StopController`, the controller is stopped first).
    Upgrade,
    /// Controller-only change: only the controller is rolled.
    ControllerUpdate,
    /// Ordered teardown: controller, DaemonSet, cluster-scoped objects.
    Delete,
}

/// One step of a rollout. The step is persisted so a restarted operator
/// resumes where the previous one stopped.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RolloutStep {
    /// Apply the node DaemonSet; wait until it is available and registered.
    NodeInstall,
    /// Scale the controller to 0; wait until its pods are gone.
    ControllerScaleDown,
    /// Roll the node DaemonSet; wait until every node that can run the new
    /// pod runs it, Ready and registered (lost nodes are named, not waited for).
    NodeRoll,
    /// Apply the controller workload (with a surge replica when one is
    /// serving); wait until it is ready.
    ControllerRoll,
    /// Delete the controller StatefulSet; wait until its pods are gone.
    ControllerDelete,
    /// Delete the node DaemonSet; wait until its pods are gone.
    NodeDelete,
    /// Delete the CSIDriver, cluster RBAC and StorageClasses.
    ClusterCleanup,
}

impl RolloutStep {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutStep::NodeInstall => "NodeInstall",
            RolloutStep::ControllerScaleDown => "ControllerScaleDown",
            RolloutStep::NodeRoll => "NodeRoll",
            RolloutStep::ControllerRoll => "ControllerRoll",
            RolloutStep::ControllerDelete => "ControllerDelete",
            RolloutStep::NodeDelete => "NodeDelete",
            RolloutStep::ClusterCleanup => "ClusterCleanup",
        }
    }
}

impl std::fmt::Display for RolloutStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The rollout in progress.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// What the rollout does: `Install`, `Upgrade` (a node-side change),
    /// `ControllerUpdate` or `Delete`.
    pub kind: RolloutKind,
    /// The step it is at; kept here so a restarted operator resumes it.
    pub step: RolloutStep,
    /// When the rollout started (RFC 3339).
    pub started_at: String,
    /// When the current step started (RFC 3339); the step deadline counts from here.
    pub step_started_at: String,
    /// Hash of the node DaemonSet this rollout brings out.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target_node_hash: String,
    /// Hash of the controller StatefulSet this rollout brings out.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target_controller_hash: String,
}

/// A condition, in the shape of `metav1.Condition`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Available`, `Progressing` or `Degraded`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase reason, e.g. `AllReady`, `RolloutInProgress`,
    /// `RenderFailed`.
    pub reason: String,
    /// What the reason means for this object, in words.
    pub message: String,
    /// The `metadata.generation` the condition was computed for.
    #[serde(default)]
    pub observed_generation: i64,
    /// When `status` last changed (RFC 3339).
    pub last_transition_time: String,
}

/// Counts of the controller StatefulSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerCounts {
    /// Replicas asked for (`spec.controller.replicas`), one more while a
    /// surge replica runs.
    pub desired: i32,
    /// Controller replicas that are Ready.
    pub ready: i32,
    /// Controller replicas at the current template.
    pub updated: i32,
}

/// Counts of the node side, one per node: the nodes that should run the
/// driver (lost ones included), and of those, how many run a node pod that
/// is Ready, runs the current template, is available, or are lost.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// Nodes that should run the driver, lost ones included.
    pub desired: i32,
    /// Healthy nodes whose node pod is Ready.
    pub ready: i32,
    /// Healthy nodes whose node pod runs the current template.
    pub updated: i32,
    /// Healthy nodes whose node pod runs the current template and is Ready.
    pub available: i32,
    /// Nodes that should run the driver but are lost (see `lostNodes`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost: i32,
}

/// A node that should run the driver but cannot now. It is named here and
/// never holds a rollout back; it gets the current node pod when it returns.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LostNode {
    /// Name of the Node.
    pub name: String,
    /// `NotReady`, `Unreachable` (its kubelet stopped reporting), `Cordoned`
    /// (unschedulable, and its node pod is not up) or `Deleted` (the Node
    /// object is gone, its pod is not).
    pub reason: String,
    /// Since when (RFC 3339), when known: the Node's Ready transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Name of the node pod on it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Whether its node pod runs the current template (`false`: it gets
    /// the new one when the node returns).
    #[serde(default)]
    pub current: bool,
}

/// At most this many lost nodes are named in status (`node.lost` counts them all).
pub const MAX_LOST_NODES_LISTED: usize = 20;

/// Preformatted `ready/desired` strings for the printer columns.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// `ready/desired` controller replicas (CONTROLLER column); `-` for a
    /// `NodeLocal` driver, which has no controller.
    pub controller: String,
    /// `ready/desired` node pods (NODES column).
    pub nodes: String,
    /// `registered/desired` nodes (REGISTERED column).
    pub registered: String,
}

/// A pod of this driver that is not healthy, with the reason.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyPod {
    /// Name of the pod.
    pub name: String,
    /// Node it runs on, if scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `CrashLoopBackOff`, `ImagePullBackOff`, `NotRegistered`, `Unschedulable`, …
    pub reason: String,
    /// kubelet's or the scheduler's message, or what to check (for
    /// `NotRegistered` and `FailedMount`: `spec.node.kubeletDir`).
    pub message: String,
}

/// Status of a `CSIDriverDeployment`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CSIDriverDeploymentStatus {
    /// `Pending`, `Deploying`, `Upgrading`, `Running`, `Degraded` or
    /// `Deleting` (the PHASE column).
    #[serde(default)]
    pub phase: Phase,
    /// One-line explanation of the phase.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// `Available` (the driver serves: `kubectl wait
    /// --for=condition=Available`), `Progressing` (a rollout runs) and
    /// `Degraded` (something needs attention; its reason says what).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default)]
    pub observed_generation: i64,
    /// Version fully rolled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// Version the spec asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    /// The rollout in progress, absent when none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// Controller replicas: desired, ready, updated.
    #[serde(default)]
    pub controller: ControllerCounts,
    /// The node side, counted per node: desired, ready, updated,
    /// available, lost.
    #[serde(default)]
    pub node: NodeCounts,
    /// Healthy nodes running a node pod whose CSINode lists this driver
    /// (never more than `node.desired`).
    #[serde(default)]
    pub registered_nodes: i32,
    /// Nodes still carrying this driver's readiness taint
    /// (`csiops.dev/driver-not-ready.<driverName>`, see
    /// `spec.node.readinessTaint`); absent when none does.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tainted_nodes: i32,
    /// The counts as `kubectl get csidd` prints them.
    #[serde(default)]
    pub summary: Summary,
    /// Pods of this driver that are not healthy, with the reason (pods on
    /// lost nodes are in `lostNodes` instead).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_pods: Vec<UnhealthyPod>,
    /// Nodes that should run the driver but are lost, sorted by name; at
    /// most 20 (`node.lost` is the full count).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_nodes: Vec<LostNode>,
    /// Nodes that run the driver and are cordoned (`kubectl drain`, a
    /// cluster upgrade, maintenance), sorted by name; at most 20. Their
    /// node pod still serves, so they count as healthy; a cordoned node
    /// whose node pod is down is in `lostNodes` (reason `Cordoned`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cordoned_nodes: Vec<String>,
}

impl CSIDriverDeploymentStatus {
    /// The condition of the given type, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}
