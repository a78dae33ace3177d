//! Taking over a running deployment of the same driver (`spec.adoption`),
//! as a pure function of what the cluster has.
//!
//! The order, and why:
//! 1. **Refuse before anything changes** when the running CSIDriver cannot
//!    be kept: `attachRequired` is immutable, and deleting the CSIDriver of
//!    a driver in use would change how kubelet treats every one of its
//!    volumes.
//! 2. **Keep the CSIDriver**: it gets this object's owner label, and from
//!    then on is applied like one the operator created.
//! 3. **Nodes, one batch at a time** (`spec.node.maxUnavailable`). Every
//!    node that runs an old node pod is labelled `waiting`, then the old
//!    DaemonSet is confined to `waiting` nodes (and set to `OnDelete`, so
//!    the edit restarts none of its pods), then this object's DaemonSet is
//!    applied: it keeps off `waiting` and `leaving` nodes. Per node:
//!    `leaving` (the DaemonSet controller removes the old pod), and once no
//!    old pod is left there, `done` (the new pod starts). The next batch
//!    starts when the new pods of this one are Ready and, with the
//!    registrar, registered. The two plugins never run on one node at once:
//!    they would share its sockets, and a Go driver unlinks its socket when
//!    it exits. A lost node (NotReady, unreachable) is never waited for.
//!    Volumes mounted on a node keep serving I/O: a node plugin is not in
//!    the data path.
//! 4. **Controller**: this object's controller is applied beside the old
//!    one, and the old one is deleted once a new replica is Ready. The
//!    sidecars elect their leader on upstream's Lease names, in the same
//!    namespace, so the old and the new provisioner (and attacher) share
//!    one Lease and never act at once. Old sidecars that elect no leader,
//!    or elect it elsewhere ([`lease_sharing`]), are stopped first instead.
//! 5. **Clean up**: the old DaemonSet (it has no pod left), the objects
//!    `spec.adoption.remove` names, and the node labels.
//!
//! Every step is judged on live objects, so a restart or a lost write only
//! repeats it.

use std::collections::BTreeMap;

use csiops_crds::AdoptionStage;

/// The running CSIDriver of the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsiDriverObs {
    /// It carries this object's owner label already.
    pub ours: bool,
    /// Fields the API server would refuse to change, where the running
    /// CSIDriver and this object differ (see [`immutable_differences`]).
    pub differences: Vec<String>,
}

/// The CSIDriver fields an update may not change (attachRequired,
/// podInfoOnMount, fsGroupPolicy, volumeLifecycleModes), each as
/// `field: live → desired` where `live` (the running object's spec) and
/// `desired` (the rendered one) differ, defaults applied as the API server
/// applies them. The operator re-creates its own CSIDriver when such a field
/// changes; a taken-over one is kept, so a difference refuses the takeover.
pub fn immutable_differences(live: &serde_json::Value, desired: &serde_json::Value) -> Vec<String> {
    use serde_json::json;
    let fields = [
        ("attachRequired", json!(true)),
        ("podInfoOnMount", json!(false)),
        ("fsGroupPolicy", json!("ReadWriteOnceWithFSType")),
        ("volumeLifecycleModes", json!(["Persistent"])),
    ];
    fields
        .into_iter()
        .filter_map(|(field, default)| {
            let l = live.get(field).filter(|v| !v.is_null()).unwrap_or(&default);
            let d = desired
                .get(field)
                .filter(|v| !v.is_null())
                .unwrap_or(&default);
            (l != d).then(|| format!("{field}: {l} running, {d} asked"))
        })
        .collect()
}

/// The old node DaemonSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OldNodeObs {
    /// Its template is confined to `waiting` nodes and it updates `OnDelete`.
    pub confined: bool,
    /// It is being deleted.
    pub deleting: bool,
}

/// The old controller workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OldControllerObs {
    /// It is being deleted (foreground: it stays until its pods are gone).
    pub deleting: bool,
    /// Why its sidecars do not share this object's leader-election Leases
    /// (see [`lease_sharing`]); `None` when they do.
    pub unshared: Option<String>,
}

/// Whether the sidecars of an old controller pod (each container's
/// arguments, `namespace` the pod's) elect their leader on the Leases this
/// object's sidecars use: upstream's default names, in the pod's namespace.
/// `None` when they do; otherwise why not. A sidecar is a container with
/// `--csi-address`; the registrar and the liveness probe elect nothing.
/// Then the old controller is stopped before the new one starts: a short
/// pause in provisioning and attaching (mounted volumes keep serving)
/// rather than two provisioners acting at once.
pub fn lease_sharing(containers: &[(String, Vec<String>)], namespace: &str) -> Option<String> {
    let flag = |args: &[String], name: &str| -> Option<String> {
        args.iter().find_map(|a| {
            let body = a.strip_prefix("--").or_else(|| a.strip_prefix('-'))?;
            match body.split_once('=') {
                Some((n, v)) if n == name => Some(v.to_string()),
                None if body == name => Some("true".to_string()),
                _ => None,
            }
        })
    };
    for (name, args) in containers {
        let sidecar = flag(args, "csi-address").is_some()
            && flag(args, "kubelet-registration-path").is_none()
            && flag(args, "probe-timeout").is_none()
            && flag(args, "health-port").is_none();
        if !sidecar {
            continue;
        }
        match flag(args, "leader-election").as_deref() {
            Some("true") => {}
            _ => {
                return Some(format!(
                    "container {name} runs without --leader-election, so it would act beside this object's"
                ))
            }
        }
        if let Some(ns) = flag(args, "leader-election-namespace") {
            if ns != namespace && !ns.starts_with("$(") {
                return Some(format!(
                    "container {name} elects its leader in namespace {ns}, not {namespace}"
                ));
            }
        }
    }
    None
}

/// One node, as far as the takeover is concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeObs {
    /// The node's adoption label, if any (an unknown value counts as none).
    pub stage: Option<AdoptionStage>,
    /// Ready, or at least not lost: a lost node is never waited for.
    pub reachable: bool,
    /// An old node pod exists on it (terminating ones included).
    pub old_pod: bool,
    /// This object's node pod on it is Ready.
    pub new_pod_ready: bool,
    /// The driver is registered in the node's CSINode.
    pub registered: bool,
}

/// What the cluster has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub csi_driver: Option<CsiDriverObs>,
    pub old_node: Option<OldNodeObs>,
    pub old_controller: Option<OldControllerObs>,
    /// Ready replicas of this object's controller workload.
    pub new_controller_ready: i32,
    /// Nodes by name: every node carrying the label, and every node with an
    /// old pod.
    pub nodes: BTreeMap<String, NodeObs>,
    /// Objects of `spec.adoption.remove` that still exist.
    pub leftovers: usize,
}

/// What the object asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desired {
    /// A controller workload is rendered (topology Central).
    pub controller: bool,
    /// The registrar runs, so "registered" can be waited for.
    pub registration_required: bool,
    /// How many nodes move at once (at least 1).
    pub batch: usize,
}

/// One write the takeover needs now, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Put this object's owner label on the running CSIDriver.
    KeepCsiDriver,
    /// Set a node's adoption label.
    LabelNode(String, AdoptionStage),
    /// Confine the old DaemonSet to `waiting` nodes, `OnDelete`.
    ConfineOldNode,
    /// Apply this object's node DaemonSet (and what it needs).
    ApplyNode,
    /// Apply this object's controller workload.
    ApplyController,
    /// Delete the old controller workload, foreground.
    DeleteOldController,
    /// Delete the old node DaemonSet.
    DeleteOldNode,
    /// Delete what `spec.adoption.remove` names.
    RemoveLeftovers,
    /// Take a node's adoption label off.
    UnlabelNode(String),
}

/// The phase the takeover is in, for status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Nodes,
    Controller,
    Cleanup,
    Done,
}

/// The outcome of one pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub phase: Phase,
    /// What the takeover waits for, in words; `None` when it is done.
    pub waiting_for: Option<String>,
    /// Set when the takeover must not start: why, concretely. Nothing is
    /// written then.
    pub refused: Option<String>,
    /// Nodes whose plugin is the new one, of all nodes taken over.
    pub nodes_done: usize,
    pub nodes_total: usize,
}

/// Plans one pass of the takeover.
pub fn plan(desired: &Desired, observed: &Observed) -> Plan {
    let total = observed.nodes.len();
    let done = observed
        .nodes
        .values()
        .filter(|n| n.stage == Some(AdoptionStage::Done) && !n.old_pod)
        .count();
    let mut plan = Plan {
        actions: Vec::new(),
        phase: Phase::Nodes,
        waiting_for: None,
        refused: None,
        nodes_done: done,
        nodes_total: total,
    };

    if let Some(d) = observed.csi_driver.as_ref().filter(|d| !d.ours) {
        if !d.differences.is_empty() {
            plan.refused = Some(format!(
                "the running CSIDriver differs in fields that cannot change ({}); a CSIDriver \
                 in use is kept, not re-created, so set spec.csiDriver to match it \
                 (nothing was changed)",
                d.differences.join("; ")
            ));
            return plan;
        }
        plan.actions.push(Action::KeepCsiDriver);
    }

    if let Some(wait) = nodes(desired, observed, &mut plan.actions) {
        plan.waiting_for = Some(wait);
        return plan;
    }

    plan.phase = Phase::Controller;
    // Sidecars that do not share the Leases: the old controller goes
    // first, the new one starts once its pods are gone.
    if let Some(old) = observed
        .old_controller
        .as_ref()
        .filter(|o| o.unshared.is_some())
    {
        if !old.deleting {
            plan.actions.push(Action::DeleteOldController);
        }
        plan.waiting_for = Some(format!(
            "the old controller's pods to exit before this object's starts ({})",
            old.unshared.as_deref().unwrap_or_default()
        ));
        return plan;
    }
    if desired.controller {
        plan.actions.push(Action::ApplyController);
    }
    if let Some(old) = &observed.old_controller {
        if !old.deleting && desired.controller && observed.new_controller_ready < 1 {
            plan.waiting_for = Some(
                "this object's controller to have a Ready replica before the old controller goes"
                    .to_string(),
            );
            return plan;
        }
        if !old.deleting {
            plan.actions.push(Action::DeleteOldController);
        }
        plan.waiting_for = Some("the old controller's pods to exit".to_string());
        return plan;
    }

    plan.phase = Phase::Cleanup;
    match observed.old_node {
        Some(old) if !old.deleting => plan.actions.push(Action::DeleteOldNode),
        _ => {}
    }
    if observed.leftovers > 0 {
        plan.actions.push(Action::RemoveLeftovers);
    }
    for (name, node) in &observed.nodes {
        if node.stage.is_some() {
            plan.actions.push(Action::UnlabelNode(name.clone()));
        }
    }
    let remaining = usize::from(observed.old_node.is_some())
        + observed.leftovers
        + observed
            .nodes
            .values()
            .filter(|n| n.stage.is_some())
            .count();
    if remaining > 0 {
        plan.waiting_for = Some(format!(
            "the old deployment's last {remaining} object(s) and node label(s) to be removed"
        ));
        return plan;
    }
    plan.phase = Phase::Done;
    plan
}

/// The node phase: `None` once every node runs the new plugin (or is lost),
/// else what it waits for.
fn nodes(desired: &Desired, observed: &Observed, actions: &mut Vec<Action>) -> Option<String> {
    let Some(old) = observed.old_node else {
        // No old DaemonSet (never named, or already deleted): the new one
        // runs wherever it may.
        actions.push(Action::ApplyNode);
        return None;
    };
    if old.deleting {
        // Deleted in the cleanup of an earlier pass: every node moved.
        actions.push(Action::ApplyNode);
        return None;
    }
    // Every node with an old pod and no label yet waits, before the old
    // DaemonSet is confined (which would otherwise remove its pod at once)
    // and before the new one exists (which would otherwise start beside it).
    for (name, node) in &observed.nodes {
        if node.stage.is_none() && node.old_pod {
            actions.push(Action::LabelNode(name.clone(), AdoptionStage::Waiting));
        }
    }
    if !old.confined {
        actions.push(Action::ConfineOldNode);
    }
    actions.push(Action::ApplyNode);

    let mut in_flight = Vec::new();
    for (name, node) in &observed.nodes {
        match node.stage {
            Some(AdoptionStage::Leaving) if !node.old_pod || !node.reachable => {
                actions.push(Action::LabelNode(name.clone(), AdoptionStage::Done));
                if node.reachable {
                    in_flight.push(format!("{name}: the new node pod to be Ready"));
                }
            }
            Some(AdoptionStage::Leaving) => {
                in_flight.push(format!("{name}: the old node pod to exit"));
            }
            Some(AdoptionStage::Done) if node.old_pod && node.reachable => {
                // Labelled done while an old pod was still there (a new pod
                // created meanwhile by hand?): the DaemonSet controller
                // removes it, as for a leaving node.
                in_flight.push(format!("{name}: the old node pod to exit"));
            }
            Some(AdoptionStage::Done) if node.reachable && !new_pod_up(desired, node) => {
                in_flight.push(format!("{name}: the new node pod to be Ready"));
            }
            _ => {}
        }
    }
    let waiting: Vec<&String> = observed
        .nodes
        .iter()
        .filter(|(_, n)| {
            n.stage == Some(AdoptionStage::Waiting) || (n.stage.is_none() && n.old_pod)
        })
        .map(|(name, _)| name)
        .collect();
    // Lost nodes go first and never count against the batch: nothing can
    // be waited for there, and the old pod there serves nothing.
    for name in &waiting {
        if !observed.nodes[*name].reachable {
            actions.push(Action::LabelNode((*name).clone(), AdoptionStage::Done));
        }
    }
    let mut free = desired.batch.max(1).saturating_sub(in_flight.len());
    for name in waiting.iter().filter(|n| observed.nodes[**n].reachable) {
        if free == 0 {
            break;
        }
        actions.push(Action::LabelNode((*name).clone(), AdoptionStage::Leaving));
        in_flight.push(format!("{name}: the old node pod to exit"));
        free -= 1;
    }
    if in_flight.is_empty() {
        return None;
    }
    let done = observed
        .nodes
        .values()
        .filter(|n| n.stage == Some(AdoptionStage::Done) && !n.old_pod)
        .count();
    Some(format!(
        "moving the node plugin node by node ({done} of {} done); waiting for {}",
        observed.nodes.len(),
        in_flight.join(", ")
    ))
}

fn new_pod_up(desired: &Desired, node: &NodeObs) -> bool {
    node.new_pod_ready && (!desired.registration_required || node.registered)
}

/// The merge patch that confines the old DaemonSet (whose live template is
/// `affinity`, JSON or null) to `waiting` nodes and makes it update
/// `OnDelete`, so that the edit itself restarts none of its pods. The
/// requirement is added to each of its own required terms (terms are
/// ORed), or makes the only term when it has none.
pub fn confine_patch(driver_name: &str, affinity: &serde_json::Value) -> serde_json::Value {
    let requirement = serde_json::json!({
        "key": csiops_crds::adoption_label_key(driver_name),
        "operator": "In",
        "values": [AdoptionStage::Waiting.as_str()],
    });
    let mut affinity = if affinity.is_object() {
        affinity.clone()
    } else {
        serde_json::json!({})
    };
    let terms = affinity
        .pointer("/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(|t| t.as_array())
        .cloned()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| vec![serde_json::json!({})]);
    let terms: Vec<serde_json::Value> = terms
        .into_iter()
        .map(|mut term| {
            let exprs = term
                .get("matchExpressions")
                .and_then(|e| e.as_array())
                .cloned()
                .unwrap_or_default();
            let mut exprs: Vec<serde_json::Value> = exprs
                .into_iter()
                .filter(|e| e.get("key") != requirement.get("key"))
                .collect();
            exprs.push(requirement.clone());
            term["matchExpressions"] = serde_json::Value::Array(exprs);
            term
        })
        .collect();
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
        serde_json::json!({ "nodeSelectorTerms": terms });
    serde_json::json!({
        "spec": {
            "updateStrategy": {"type": "OnDelete", "rollingUpdate": null},
            "template": {"spec": {"affinity": affinity}},
        }
    })
}

/// Whether a live DaemonSet (its `spec` as JSON) is already confined.
pub fn is_confined(driver_name: &str, spec: &serde_json::Value) -> bool {
    let on_delete = spec
        .pointer("/updateStrategy/type")
        .and_then(|t| t.as_str())
        == Some("OnDelete");
    let key = csiops_crds::adoption_label_key(driver_name);
    let terms = spec
        .pointer("/template/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(|t| t.as_array());
    let confined = terms.is_some_and(|terms| {
        !terms.is_empty()
            && terms.iter().all(|term| {
                term.get("matchExpressions")
                    .and_then(|e| e.as_array())
                    .is_some_and(|exprs| {
                        exprs.iter().any(|e| {
                            e.get("key").and_then(|k| k.as_str()) == Some(key.as_str())
                                && e.get("operator").and_then(|o| o.as_str()) == Some("In")
                        })
                    })
            })
    });
    on_delete && confined
}

/// Names a built-in role or binding, which a takeover never deletes.
pub fn is_builtin(name: &str) -> bool {
    name.starts_with("system:")
}

#[cfg(test)]
mod tests;
