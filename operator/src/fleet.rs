//! The node side judged node by node. Pure.
//!
//! The DaemonSet's own counters cannot tell a rollout that is progressing
//! from one that waits on nodes that are gone: a pod on a NotReady or
//! unreachable node counts as unavailable there for as long as the node is
//! lost, and the DaemonSet controller charges it against `maxUnavailable`
//! (its rolling update even counts a node whose old pod it deleted, and
//! whose kubelet never confirms the deletion, as unavailable forever). So
//! the operator looks at each node that runs one of the driver's node pods:
//!
//! - **lost**: the Node is NotReady or unreachable (or gone), or it is
//!   cordoned and its pod is not up. Lost nodes are named, counted once
//!   (`desired` and `lost`, nowhere else), never waited for, and given to
//!   the DaemonSet as extra `maxUnavailable` ([`Fleet::max_unavailable`])
//!   so they never hold the roll back. When such a node returns, the
//!   DaemonSet controller replaces its pod with the current one.
//! - **pending**: a healthy node whose pod is not yet the current template,
//!   Ready and (when the registrar runs) registered in its CSINode.
//! - **done**: everything else.
//!
//! A node step is complete when no healthy node is pending and no healthy
//! node that should run the driver is still without a pod.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::pods::{PodView, POD_TEMPLATE_GENERATION_LABEL};

/// Node readiness as its Ready condition says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    NotReady,
    /// No condition, or `Unknown` (the node lifecycle controller's verdict
    /// on a node whose kubelet stopped reporting).
    Unknown,
}

/// One taint of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaintInfo {
    pub key: String,
    pub value: Option<String>,
    pub effect: String,
}

/// What the operator keeps of a Node (see `reconcile::watch::nodes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub readiness: Readiness,
    /// The Ready condition's last transition (RFC 3339).
    pub ready_since: Option<String>,
    pub unschedulable: bool,
    pub taints: Vec<TaintInfo>,
}

/// The taint the node lifecycle controller puts on a node whose kubelet
/// stopped reporting.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// The taint it puts on a node whose kubelet reports NotReady.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// The annotation the API server keeps on a DaemonSet: bumped with each
/// template change, and copied by the DaemonSet controller into its pods'
/// `pod-template-generation` label.
pub const TEMPLATE_GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";

/// Why a node is lost, as status says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LostReason {
    /// Its kubelet stopped reporting (Ready Unknown, or the unreachable taint).
    Unreachable,
    /// Its kubelet reports NotReady.
    NotReady,
    /// Cordoned, and its node pod is not up.
    Cordoned,
    /// The Node object is gone; its pod is not yet.
    Deleted,
}

impl LostReason {
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::Unreachable => "Unreachable",
            LostReason::NotReady => "NotReady",
            LostReason::Cordoned => "Cordoned",
            LostReason::Deleted => "Deleted",
        }
    }
}

/// A lost node that hosts one of the driver's node pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    pub node: String,
    pub reason: LostReason,
    /// When the node's readiness last changed, when known.
    pub since: Option<String>,
    /// The node pod on it (a live one if any, else one being deleted).
    pub pod: Option<String>,
    /// Whether that pod runs the current template.
    pub current: bool,
}

/// The node side, node by node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fleet {
    /// Nodes that should run the driver: the healthy ones hosting a node pod,
    /// the lost ones hosting one, and healthy ones still waiting for theirs.
    pub desired: i32,
    /// Healthy nodes whose node pod is Ready.
    pub ready: i32,
    /// Healthy nodes whose node pod runs the current template.
    pub updated: i32,
    /// Healthy nodes whose current node pod is Ready (`minReadySeconds` is 0).
    pub available: i32,
    /// Healthy nodes hosting a node pod whose CSINode lists the driver.
    pub registered: i32,
    /// Healthy nodes not done yet, sorted, with what they wait for.
    pub pending: Vec<(String, &'static str)>,
    /// Of those, the ones whose pod is not the current template yet (the
    /// DaemonSet is still rolling there), as opposed to a current pod that
    /// is not Ready or not registered.
    pub rolling: i32,
    /// Healthy nodes that should run the driver and have no pod yet.
    pub missing: i32,
    /// Lost nodes hosting a node pod, sorted by name.
    pub lost: Vec<Lost>,
    /// Healthy nodes hosting a node pod that are cordoned (drained, under
    /// maintenance), sorted by name: told, not counted against the driver,
    /// while their pod serves.
    pub cordoned: Vec<String>,
    /// The DaemonSet carries the desired content and its controller has
    /// seen it (without this, "current" pods are the previous ones).
    pub daemonset_current: bool,
}

/// Inputs of [`assess`].
pub struct FleetInput<'a> {
    pub daemonset: Option<&'a DaemonSet>,
    /// The node hash the object asks for.
    pub desired_hash: &'a str,
    /// The workload annotation carrying a hash.
    pub hash_annotation: &'a str,
    /// This object's node pods.
    pub pods: &'a [&'a PodView],
    pub nodes: &'a BTreeMap<String, NodeInfo>,
    /// Nodes whose CSINode lists the driver.
    pub registered: &'a BTreeSet<&'a str>,
    pub registration_required: bool,
}

/// Tolerations every DaemonSet pod gets from the DaemonSet controller,
/// besides the template's own.
fn daemonset_default_tolerates(taint: &TaintInfo) -> bool {
    let no_execute = [TAINT_NOT_READY, TAINT_UNREACHABLE];
    let no_schedule = [
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/unschedulable",
    ];
    (taint.effect == "NoExecute" && no_execute.contains(&taint.key.as_str()))
        || (taint.effect == "NoSchedule" && no_schedule.contains(&taint.key.as_str()))
}

/// Whether `toleration` tolerates `taint`, as the scheduler matches them.
pub fn tolerates(toleration: &Toleration, taint: &TaintInfo) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty()) {
        if effect != taint.effect {
            return false;
        }
    }
    let key = toleration.key.as_deref().unwrap_or("");
    match toleration.operator.as_deref().unwrap_or("Equal") {
        // An empty key with Exists tolerates everything.
        "Exists" => key.is_empty() || key == taint.key,
        _ => key == taint.key && toleration.value.as_deref() == taint.value.as_deref(),
    }
}

/// Whether the DaemonSet controller wants a pod of `tolerations` on `node`
/// (taints only: a node hosting one of its pods already passed the node
/// selector).
pub fn daemonset_wants(node: &NodeInfo, tolerations: &[Toleration]) -> bool {
    node.taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| daemonset_default_tolerates(t) || tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// Why `node` is lost regardless of its pod, if it is.
fn node_lost(node: Option<&NodeInfo>) -> Option<LostReason> {
    let Some(n) = node else {
        return Some(LostReason::Deleted);
    };
    let tainted = |key: &str| n.taints.iter().any(|t| t.key == key);
    if n.readiness == Readiness::Unknown || tainted(TAINT_UNREACHABLE) {
        Some(LostReason::Unreachable)
    } else if n.readiness == Readiness::NotReady || tainted(TAINT_NOT_READY) {
        Some(LostReason::NotReady)
    } else {
        None
    }
}

/// The pods of one node, reduced to what matters.
#[derive(Default)]
struct OnNode<'p> {
    /// A live (not terminating) pod of the current template, else any live one.
    live: Option<&'p PodView>,
    live_current: bool,
    terminating: Option<&'p PodView>,
}

/// Judges every node hosting one of `input.pods`.
pub fn assess(input: &FleetInput<'_>) -> Fleet {
    let ds = input.daemonset;
    let annotations = ds.and_then(|d| d.metadata.annotations.as_ref());
    let template_generation = annotations
        .and_then(|a| a.get(TEMPLATE_GENERATION_ANNOTATION))
        .map(String::as_str);
    let status = ds.and_then(|d| d.status.as_ref());
    let daemonset_current = ds.is_some_and(|d| {
        annotations
            .and_then(|a| a.get(input.hash_annotation))
            .map(String::as_str)
            == Some(input.desired_hash)
            && status.and_then(|s| s.observed_generation).unwrap_or(0)
                >= d.metadata.generation.unwrap_or(0)
    });
    let is_current = |pod: &PodView| {
        daemonset_current
            && template_generation.is_some()
            && pod.label(POD_TEMPLATE_GENERATION_LABEL) == template_generation
    };
    let tolerations: &[Toleration] = ds
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or(&[]);

    let mut by_node: BTreeMap<&str, OnNode<'_>> = BTreeMap::new();
    for pod in input.pods {
        let Some(node) = pod.node.as_deref() else {
            continue;
        };
        let entry = by_node.entry(node).or_default();
        if pod.deleting() {
            entry.terminating.get_or_insert(pod);
            continue;
        }
        let current = is_current(pod);
        if entry.live.is_none() || (current && !entry.live_current) {
            entry.live = Some(pod);
            entry.live_current = current;
        }
    }

    let mut fleet = Fleet {
        daemonset_current,
        ..Fleet::default()
    };
    let mut healthy_hosting = 0;
    let mut lost_wanted = 0;
    for (name, on) in &by_node {
        let info = input.nodes.get(*name);
        let up = on.live.is_some_and(PodView::is_ready);
        let done_pod = on.live_current && up;
        let registered = input.registered.contains(name);
        // A cordoned node is rolled like any other (node pods tolerate
        // `unschedulable`); only one whose pod is not up is held for lost:
        // it is being drained or repaired, and may stay so for days.
        let lost = node_lost(info).or_else(|| {
            info.filter(|n| n.unschedulable && !up)
                .map(|_| LostReason::Cordoned)
        });
        if let Some(reason) = lost {
            if info.is_some_and(|n| daemonset_wants(n, tolerations)) {
                lost_wanted += 1;
            }
            fleet.lost.push(Lost {
                node: name.to_string(),
                reason,
                since: info.and_then(|n| n.ready_since.clone()),
                pod: on.live.or(on.terminating).map(|p| p.name().to_string()),
                current: on.live_current,
            });
            continue;
        }
        if on.live.is_some() {
            healthy_hosting += 1;
        }
        if info.is_some_and(|n| n.unschedulable) {
            fleet.cordoned.push(name.to_string());
        }
        fleet.ready += i32::from(up);
        fleet.updated += i32::from(on.live_current);
        fleet.available += i32::from(done_pod);
        fleet.registered += i32::from(registered && on.live.is_some());
        let waiting = if on.live.is_none() {
            Some("its pod is being replaced")
        } else if !on.live_current {
            Some("runs the previous node pod")
        } else if !up {
            Some("its node pod is not Ready")
        } else if input.registration_required && !registered {
            Some("the driver is not registered in its CSINode")
        } else {
            None
        };
        if let Some(why) = waiting {
            fleet.pending.push((name.to_string(), why));
            fleet.rolling += i32::from(!on.live_current);
        }
    }
    let ds_desired = status.map_or(0, |s| s.desired_number_scheduled);
    // Healthy nodes the DaemonSet wants that host no pod yet (a node whose
    // only pod is being deleted is pending above, not missing).
    let terminating_only = by_node
        .iter()
        .filter(|(n, on)| on.live.is_none() && !fleet.lost.iter().any(|l| l.node == **n))
        .count() as i32;
    fleet.missing = (ds_desired - healthy_hosting - terminating_only - lost_wanted).max(0);
    let healthy = healthy_hosting + terminating_only + fleet.missing;
    fleet.desired = healthy + fleet.lost.len() as i32;
    fleet
}

impl Fleet {
    /// Whether the DaemonSet is still rolling out its template on healthy nodes.
    pub fn is_rolling(&self) -> bool {
        !self.daemonset_current || self.rolling > 0 || self.missing > 0
    }

    /// Healthy nodes (lost ones aside).
    pub fn healthy(&self) -> i32 {
        self.desired - self.lost.len() as i32
    }

    /// What a node step still waits for, or `None` when every node that can
    /// run the current node pod runs it, Ready and registered.
    pub fn waiting_for(&self) -> Option<String> {
        if !self.daemonset_current {
            return Some("node DaemonSet: the new template is not observed yet".to_string());
        }
        if let Some((node, why)) = self.pending.first() {
            return Some(format!(
                "{} of {} node(s) done; next: {node} ({why})",
                self.healthy() - self.pending.len() as i32 - self.missing,
                self.healthy()
            ));
        }
        (self.missing > 0).then(|| {
            format!(
                "{} node(s) that should run the driver have no node pod yet",
                self.missing
            )
        })
    }

    /// The DaemonSet's `maxUnavailable` for `user`'s (unset: 1): the user's
    /// budget, over the healthy nodes, plus one per lost node (which the
    /// DaemonSet controller counts as unavailable for as long as it is
    /// lost). Without lost nodes, the user's value unchanged.
    pub fn max_unavailable(&self, user: Option<&IntOrString>) -> IntOrString {
        let user = user.cloned().unwrap_or(IntOrString::Int(1));
        if self.lost.is_empty() {
            return user;
        }
        IntOrString::Int(resolve_max_unavailable(&user, self.healthy()) + self.lost.len() as i32)
    }

    /// Healthy nodes whose pod is down beyond what a roll allows: more than
    /// `user`'s budget of healthy nodes without a Ready node pod.
    pub fn over_budget(&self, user: Option<&IntOrString>) -> bool {
        let user = user.cloned().unwrap_or(IntOrString::Int(1));
        let healthy = self.healthy();
        let down = healthy - self.ready;
        healthy == 0 || self.ready == 0 || down > resolve_max_unavailable(&user, healthy)
    }
}

/// A count or a percentage of `total`, rounded up as the DaemonSet
/// controller rounds it, and at least 1.
pub fn resolve_max_unavailable(value: &IntOrString, total: i32) -> i32 {
    let n = match value {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            ((pct * i64::from(total.max(0)) + 99) / 100) as i32
        }
    };
    n.max(1)
}

#[cfg(test)]
mod tests;
