//! Health of a deployed driver, computed from the live workloads, the driver's
//! pods and the cluster's CSINode objects. Pure: the reconciler hands in what
//! its caches hold.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use csiops_crds::{ControllerCounts, NodeCounts, UnhealthyPod};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};

use crate::fleet::{self, Fleet, NodeInfo};
use crate::pods::PodView;
use crate::render::labels::COMPONENT;

/// Degraded reason when the node DaemonSet matches no node.
pub const NO_MATCHING_NODES: &str = "NoMatchingNodes";

/// Says plainly that the node DaemonSet runs nowhere, once the DaemonSet
/// controller has looked at the current spec and scheduled it on 0 nodes
/// (rather than leaving the user to decode "node pods 0/0 available").
pub fn no_matching_nodes(
    ds: Option<&DaemonSet>,
    node_selector: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    let ds = ds?;
    let status = ds.status.as_ref()?;
    let generation = ds.metadata.generation.unwrap_or(0);
    if status.observed_generation.unwrap_or(0) < generation || status.desired_number_scheduled > 0 {
        return None;
    }
    Some(if node_selector.is_empty() {
        "no node can run the node DaemonSet (0 nodes scheduled): check spec.node.tolerations \
         against the nodes' taints; without node pods the driver is available nowhere"
            .to_string()
    } else {
        let selector = node_selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        format!(
            "no node matches spec.node.nodeSelector {selector} (0 nodes scheduled): label the \
             nodes that should run the driver, or change the selector; without node pods the \
             driver is available nowhere"
        )
    })
}

/// A Ready node pod gets this long to be registered before it is reported:
/// registration follows readiness by a few seconds on a healthy node.
pub const REGISTRATION_GRACE_SECONDS: i64 = 30;

/// A pod still creating its containers this long after it was scheduled is
/// looked into: kubelet's mount failures are reported after this.
pub const CREATING_GRACE_SECONDS: i64 = 10;

/// Container waiting reasons that mean the pod will not come up by itself.
const BAD_WAITING_REASONS: &[&str] = &[
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Inputs of [`assess`].
pub struct HealthInput<'a> {
    pub driver_name: &'a str,
    pub kubelet_dir: &'a str,
    pub registration_required: bool,
    /// `spec.controller.replicas`.
    pub controller_replicas: i32,
    /// `spec.node.maxUnavailable`.
    pub max_unavailable: Option<&'a k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    /// The controller workload of the kind the spec asks for: a StatefulSet…
    pub statefulset: Option<&'a StatefulSet>,
    /// …or a Deployment.
    pub deployment: Option<&'a Deployment>,
    pub daemonset: Option<&'a DaemonSet>,
    /// The node hash the object asks for, to tell current node pods.
    pub node_hash: &'a str,
    /// This object's pods (controller and node).
    pub pods: &'a [PodView],
    /// What is known of every Node (see `reconcile::watch::nodes`).
    pub nodes: &'a std::collections::BTreeMap<String, NodeInfo>,
    /// Nodes whose CSINode lists the driver.
    pub registered: &'a BTreeSet<String>,
    /// Nodes carrying this driver's readiness taint (see
    /// `reconcile::watch::nodes`), passed through to status.
    pub tainted_nodes: i32,
    /// kubelet's latest `FailedMount` message per pod name, for the pods
    /// [`stuck_creating`] named (see `reconcile::watch::pod_events`).
    pub mount_failures: &'a std::collections::BTreeMap<String, String>,
    pub now: DateTime<Utc>,
}

/// Whether `pod` has been creating its containers for longer than
/// [`CREATING_GRACE_SECONDS`]: its volumes may not mount (kubelet says why
/// only in an Event, which the caller then reads).
pub fn stuck_creating(pod: &PodView, now: DateTime<Utc>) -> bool {
    if pod.deleting() || pod.phase.as_deref() != Some("Pending") {
        return false;
    }
    let scheduled_since = pod
        .scheduled
        .as_ref()
        .filter(|c| c.status)
        .and_then(|c| c.since)
        .and_then(|t| DateTime::from_timestamp(t, 0));
    // A pod with no container status yet is not creating anything: it has
    // not reached a kubelet (or runs on a simulated node, which never
    // reports any). Counting it would look up its Events forever.
    let creating = pod.containers > 0 && pod.creating == pod.containers;
    creating
        && scheduled_since.is_some_and(|t| now - t >= Duration::seconds(CREATING_GRACE_SECONDS))
}

/// Result of [`assess`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    pub controller: ControllerCounts,
    /// Counted node by node from [`Health::fleet`].
    pub node: NodeCounts,
    /// Healthy nodes running a node pod whose CSINode lists the driver.
    pub registered_nodes: i32,
    /// Nodes still carrying the driver's readiness taint.
    pub tainted_nodes: i32,
    pub controller_pods: usize,
    pub node_pods: usize,
    pub unhealthy: Vec<UnhealthyPod>,
    /// The node side, node by node.
    pub fleet: Fleet,
    /// Healthy nodes run Ready node pods, short of no more than the node
    /// roll's budget (`spec.node.maxUnavailable`).
    pub nodes_serving: bool,
}

/// Computes counts, registration and the unhealthy pods with their reasons.
pub fn assess(input: &HealthInput<'_>) -> Health {
    let registered: BTreeSet<&str> = input.registered.iter().map(String::as_str).collect();

    let mut health = Health {
        registered_nodes: registered.len() as i32,
        tainted_nodes: input.tainted_nodes,
        ..Health::default()
    };

    // The controller counts: desired is what the object asks for, or more
    // while a surge replica runs; never the 0 of a scale-down, which would
    // read as "0/0 ready", all well.
    let counts =
        |spec_replicas: Option<i32>, ready: Option<i32>, updated: Option<i32>| ControllerCounts {
            desired: spec_replicas.unwrap_or(1).max(input.controller_replicas),
            ready: ready.unwrap_or(0),
            updated: updated.unwrap_or(0),
        };
    if let Some(sts) = input.statefulset {
        let status = sts.status.as_ref();
        health.controller = counts(
            sts.spec.as_ref().and_then(|s| s.replicas),
            status.and_then(|s| s.ready_replicas),
            status.and_then(|s| s.updated_replicas),
        );
    } else if let Some(d) = input.deployment {
        let status = d.status.as_ref();
        health.controller = counts(
            d.spec.as_ref().and_then(|s| s.replicas),
            status.and_then(|s| s.ready_replicas),
            status.and_then(|s| s.updated_replicas),
        );
    } else {
        health.controller.desired = input.controller_replicas;
    }

    let node_pods: Vec<&PodView> = input
        .pods
        .iter()
        .filter(|p| component_of(p) == Some("node"))
        .collect();
    health.fleet = fleet::assess(&fleet::FleetInput {
        daemonset: input.daemonset,
        desired_hash: input.node_hash,
        hash_annotation: crate::render::labels::TEMPLATE_HASH,
        pods: &node_pods,
        nodes: input.nodes,
        registered: &registered,
        registration_required: input.registration_required,
    });
    let f = &health.fleet;
    health.node = NodeCounts {
        desired: f.desired,
        ready: f.ready,
        updated: f.updated,
        available: f.available,
        lost: f.lost.len() as i32,
    };
    health.registered_nodes = f.registered;
    health.nodes_serving = !f.over_budget(input.max_unavailable);
    let lost_nodes: BTreeSet<&str> = f.lost.iter().map(|l| l.node.as_str()).collect();

    for pod in input.pods {
        let component = component_of(pod);
        match component {
            Some("controller") => health.controller_pods += 1,
            Some("node") => health.node_pods += 1,
            _ => continue,
        }
        if pod.deleting() {
            continue;
        }
        // A pod on a lost node is reported with its node (status.lostNodes),
        // not again as an unhealthy pod.
        let node = pod.node.as_deref();
        if node.is_some_and(|n| lost_nodes.contains(n)) {
            continue;
        }
        if let Some(u) = pod_problem(pod, component == Some("node"), &registered, input) {
            health.unhealthy.push(u);
        }
    }
    health.unhealthy.sort_by(|a, b| a.name.cmp(&b.name));
    health
}

fn component_of(pod: &PodView) -> Option<&str> {
    pod.label(COMPONENT)
}

fn pod_problem(
    pod: &PodView,
    is_node_pod: bool,
    registered: &BTreeSet<&str>,
    input: &HealthInput<'_>,
) -> Option<UnhealthyPod> {
    let name = pod.name().to_string();
    let node = pod.node.as_deref().map(str::to_string);
    let unhealthy = |reason: &str, message: String| UnhealthyPod {
        name: name.clone(),
        node: node.clone(),
        reason: reason.to_string(),
        message,
    };

    for w in &pod.waiting {
        if BAD_WAITING_REASONS.contains(&w.reason.as_str()) {
            let msg = w.message.as_deref().unwrap_or("no message");
            return Some(unhealthy(
                &w.reason,
                format!("container {}: {msg}", w.container),
            ));
        }
    }
    if pod.phase.as_deref() == Some("Failed") {
        let msg = pod.message.clone().unwrap_or_else(|| "pod failed".into());
        return Some(unhealthy("Failed", msg));
    }
    // Volumes that do not mount: kubelet's own words, and for a node pod the
    // usual cause (its hostPaths live under kubeletDir).
    if let Some(msg) = input.mount_failures.get(&name) {
        let message = if is_node_pod {
            format!(
                "{msg}; check that spec.node.kubeletDir ({}) is the kubelet's root directory",
                input.kubelet_dir
            )
        } else {
            msg.clone()
        };
        return Some(unhealthy("FailedMount", message));
    }
    if let Some(c) = pod.scheduled.as_ref().filter(|c| !c.status) {
        let reason = c.reason.as_deref().unwrap_or("Unschedulable");
        let msg = c.message.clone().unwrap_or_default();
        return Some(unhealthy(reason, msg));
    }

    // A node pod that is Ready but whose node's CSINode lacks the driver: the
    // kubelet never saw the registration socket, usually a wrong kubeletDir.
    if is_node_pod && input.registration_required {
        let ready_since = pod.ready.as_ref().filter(|c| c.status).map(|c| {
            c.since
                .and_then(|t| DateTime::from_timestamp(t, 0))
                .unwrap_or(input.now)
        });
        if let (Some(since), Some(node_name)) = (ready_since, node.as_deref()) {
            let grace = Duration::seconds(REGISTRATION_GRACE_SECONDS);
            if !registered.contains(node_name) && input.now - since >= grace {
                return Some(unhealthy(
                    "NotRegistered",
                    format!(
                        "pod is Ready but CSINode {node_name} does not list driver {}; \
                         check that spec.node.kubeletDir ({}) is the kubelet's root directory",
                        input.driver_name, input.kubelet_dir
                    ),
                ));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
