//! Health of a deployed driver, computed from the live workloads, the driver's
//! pods and the cluster's CSINode objects. Pure: the reconciler hands in what
//! its caches hold.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, Utc};
use csiops_crds::{ControllerCounts, NodeCounts, UnhealthyPod};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSINode;

use crate::fleet::{self, Fleet, NodeInfo};
use crate::render::labels::COMPONENT;
use crate::rollout::{ControllerObs, NodeObs};

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
    pub pods: &'a [Pod],
    /// What is known of every Node (see `reconcile::nodes`).
    pub nodes: &'a std::collections::BTreeMap<String, NodeInfo>,
    /// The cluster's CSINodes, as the shared cache holds them (not copied).
    pub csinodes: &'a [std::sync::Arc<CSINode>],
    /// Nodes carrying this driver's readiness taint (see
    /// `reconcile::node_taints`), passed through to status.
    pub tainted_nodes: i32,
    /// kubelet's latest `FailedMount` message per pod name, for the pods
    /// [`stuck_creating`] named (see `reconcile::pod_events`).
    pub mount_failures: &'a std::collections::BTreeMap<String, String>,
    pub now: DateTime<Utc>,
}

/// Whether `pod` has been creating its containers for longer than
/// [`CREATING_GRACE_SECONDS`]: its volumes may not mount (kubelet says why
/// only in an Event, which the caller then reads).
pub fn stuck_creating(pod: &Pod, now: DateTime<Utc>) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if pod.metadata.deletion_timestamp.is_some() || status.phase.as_deref() != Some("Pending") {
        return false;
    }
    let scheduled_since = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0));
    // A pod with no container status yet is not creating anything: it has
    // not reached a kubelet (or runs on a simulated node, which never
    // reports any). Counting it would look up its Events forever.
    let statuses = status.container_statuses.as_deref().unwrap_or(&[]);
    let creating = !statuses.is_empty()
        && statuses.iter().all(|cs| {
            cs.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .is_some_and(|w| w.reason.as_deref() == Some("ContainerCreating"))
        });
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

/// Whether the CSINode lists the driver.
pub fn csinode_has_driver(csinode: &CSINode, driver: &str) -> bool {
    csinode.spec.drivers.iter().any(|d| d.name == driver)
}

/// Computes counts, registration and the unhealthy pods with their reasons.
pub fn assess(input: &HealthInput<'_>) -> Health {
    let registered: BTreeSet<&str> = input
        .csinodes
        .iter()
        .filter(|c| csinode_has_driver(c, input.driver_name))
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();

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

    let node_pods: Vec<&Pod> = input
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
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        // A pod on a lost node is reported with its node (status.lostNodes),
        // not again as an unhealthy pod.
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
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

fn component_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(COMPONENT))
        .map(String::as_str)
}

fn pod_problem(
    pod: &Pod,
    is_node_pod: bool,
    registered: &BTreeSet<&str>,
    input: &HealthInput<'_>,
) -> Option<UnhealthyPod> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let status = pod.status.as_ref()?;
    let unhealthy = |reason: &str, message: String| UnhealthyPod {
        name: name.clone(),
        node: node.clone(),
        reason: reason.to_string(),
        message,
    };

    for cs in status.container_statuses.iter().flatten() {
        let waiting = cs.state.as_ref().and_then(|s| s.waiting.as_ref());
        if let Some(w) = waiting {
            let reason = w.reason.as_deref().unwrap_or("");
            if BAD_WAITING_REASONS.contains(&reason) {
                let msg = w.message.as_deref().unwrap_or("no message");
                return Some(unhealthy(reason, format!("container {}: {msg}", cs.name)));
            }
        }
    }
    if status.phase.as_deref() == Some("Failed") {
        let msg = status
            .message
            .clone()
            .unwrap_or_else(|| "pod failed".into());
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
    let conditions = status.conditions.iter().flatten();
    for c in conditions.clone() {
        if c.type_ == "PodScheduled" && c.status == "False" {
            let reason = c.reason.as_deref().unwrap_or("Unschedulable");
            let msg = c.message.clone().unwrap_or_default();
            return Some(unhealthy(reason, msg));
        }
    }

    // A node pod that is Ready but whose node's CSINode lacks the driver: the
    // kubelet never saw the registration socket, usually a wrong kubeletDir.
    if is_node_pod && input.registration_required {
        let ready_since = conditions
            .clone()
            .find(|c| c.type_ == "Ready" && c.status == "True")
            .map(|c| {
                c.last_transition_time
                    .as_ref()
                    .and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0))
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

/// The live StatefulSet as the rollout state machine sees it.
pub fn controller_obs(sts: &StatefulSet, hash_annotation: &str) -> ControllerObs {
    let status = sts.status.as_ref();
    ControllerObs {
        hash: annotation(&sts.metadata, hash_annotation),
        generation: sts.metadata.generation.unwrap_or(0),
        observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
        spec_replicas: sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        replicas: status.map_or(0, |s| s.replicas),
        ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        updated: status.and_then(|s| s.updated_replicas).unwrap_or(0),
        partition: sts
            .spec
            .as_ref()
            .and_then(|s| s.update_strategy.as_ref())
            .and_then(|u| u.rolling_update.as_ref())
            .and_then(|r| r.partition)
            .unwrap_or(0),
        updated_ready: 0,
    }
}

/// How many of `pods` (the controller's) run the StatefulSet's update
/// revision and are Ready: the surge replica's progress, which the
/// StatefulSet's own counters do not give (readyReplicas mixes revisions).
pub fn statefulset_updated_ready(sts: &StatefulSet, pods: &[Pod]) -> i32 {
    let Some(revision) = sts
        .status
        .as_ref()
        .and_then(|s| s.update_revision.as_deref())
    else {
        return 0;
    };
    pods.iter()
        .filter(|p| component_of(p) == Some("controller"))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("controller-revision-hash"))
                .map(String::as_str)
                == Some(revision)
        })
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count() as i32
}

/// The live controller Deployment as the rollout state machine sees it.
pub fn deployment_obs(d: &Deployment, hash_annotation: &str) -> ControllerObs {
    let status = d.status.as_ref();
    ControllerObs {
        hash: annotation(&d.metadata, hash_annotation),
        generation: d.metadata.generation.unwrap_or(0),
        observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
        spec_replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        replicas: status.and_then(|s| s.replicas).unwrap_or(0),
        ready: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        updated: status.and_then(|s| s.updated_replicas).unwrap_or(0),
        partition: 0,
        updated_ready: 0,
    }
}

/// The live DaemonSet as the rollout state machine sees it.
pub fn node_obs(ds: &DaemonSet, hash_annotation: &str) -> NodeObs {
    let status = ds.status.as_ref();
    NodeObs {
        hash: annotation(&ds.metadata, hash_annotation),
        generation: ds.metadata.generation.unwrap_or(0),
        observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
    }
}

fn annotation(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<String> {
    meta.annotations.as_ref().and_then(|a| a.get(key)).cloned()
}

#[cfg(test)]
mod tests;
