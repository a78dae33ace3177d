//! kwok: stands in for the kubelets.
//!
//! kwok v0.8 is one controller process that watches the Nodes it manages and
//! the Pods bound to them and plays *Stages* on them: node-initialize makes a
//! Node Ready, node-heartbeat-with-lease keeps it so (renewing its Lease in
//! kube-node-lease, which is why `--node-lease-duration-seconds` must be set),
//! pod-ready moves a bound Pod to Running/Ready, pod-complete finishes Job
//! pods, pod-delete removes Pods being deleted (a kubelet's job). Without any
//! Stage the controller refuses to start ("no stages found"); they come from
//! `--config` files (kind: Stage), not from flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::{io, Result};

/// The annotation kwok is told to select its Nodes by.
pub const NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// Label on every simulated Node.
pub const NODE_TYPE_LABEL: (&str, &str) = ("type", "kwok");

/// The taint simulated Nodes carry when a real node runs next to them, so
/// that a workload lands on a simulated Node only if it tolerates that
/// (`kubectl apply -f manifests/install.yaml` then runs the operator for real).
pub const SIMULATED_TAINT: (&str, &str) = ("csiops.dev/simulated-node", "NoSchedule");

const FALLBACK_STAGES: &str = include_str!("kwok-stages.yaml");

/// Our own stage, after kwok's: a Running pod marked NotReady while its node
/// was lost turns Ready again once the node is back (see the file).
const READY_AGAIN_STAGE: &str = include_str!("kwok-stage-ready-again.yaml");

/// The pod stages of [`Simulation::FLEET`] (no pod IPs; see the file).
const FLEET_POD_STAGES: &str = include_str!("kwok-pod-stages-fleet.yaml");

/// How kwok plays the simulated nodes and their pods, and how soon
/// kube-controller-manager takes a silent node for NotReady.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Simulation {
    /// Duration of the nodes' heartbeat Leases; kwok renews each at a
    /// quarter of it.
    pub lease_seconds: u32,
    /// kube-controller-manager's `--node-monitor-grace-period`: a node whose
    /// Lease was not renewed for this long turns NotReady (Unknown).
    pub grace_seconds: u32,
    /// Pods get IP addresses (kwok's own pod stages) or none
    /// (`kwok-pod-stages-fleet.yaml`).
    pub pod_ips: bool,
}

impl Simulation {
    /// The e2e tests': kwokctl's Lease (40 s, renewed every 10 s),
    /// Kubernetes' grace period (50 s), kwok's own stages.
    pub const DEFAULT: Simulation = Simulation {
        lease_seconds: 40,
        grace_seconds: 50,
        pod_ips: true,
    };

    /// A thousand nodes and tens of thousands of pods on two shared cores.
    /// At the default, 1000 nodes renew 100 Leases a second, and a busy
    /// machine delays renewals past the 50 s grace: nodes flap NotReady and
    /// their DaemonSet pods stop counting. Here Leases are renewed every
    /// 40 s (25 a second) and a node is NotReady after 5 minutes of silence;
    /// pods get no IPs (see the stages file). Node status heartbeats stay
    /// kwok's (every 10-20 minutes per node).
    pub const FLEET: Simulation = Simulation {
        lease_seconds: 160,
        grace_seconds: 300,
        pod_ips: false,
    };
}

impl Default for Simulation {
    fn default() -> Self {
        Simulation::DEFAULT
    }
}

/// The Stage config for `kwok --config`, written to `work_dir`: the bin
/// dir's `kwok-stages.yaml` (assembled by build.sh from the pinned kwok
/// module) or, when the bin dir has none, an embedded copy; without pod IPs
/// its node stages and the fleet pod stages; then [`READY_AGAIN_STAGE`].
pub fn stages_file(bin_dir: &Path, work_dir: &Path, sim: Simulation) -> Result<PathBuf> {
    let built = bin_dir.join("kwok-stages.yaml");
    let stages = if built.is_file() {
        std::fs::read_to_string(&built).map_err(io("reading kwok stages", &built))?
    } else {
        FALLBACK_STAGES.to_string()
    };
    let kwoks = if sim.pod_ips {
        stages
    } else {
        format!("{}\n{FLEET_POD_STAGES}", node_stages(&stages))
    };
    let text = format!("{}\n---\n{READY_AGAIN_STAGE}", kwoks.trim_end());
    let path = work_dir.join("kwok-stages.yaml");
    std::fs::write(&path, text).map_err(io("writing kwok stages", &path))?;
    Ok(path)
}

/// The Stages of a stages file that play Nodes.
fn node_stages(stages: &str) -> String {
    stages
        .split("\n---")
        .filter(|doc| doc.contains("kind: Stage") && doc.contains("    kind: Node\n"))
        .map(|doc| format!("---{}\n", doc.trim_start_matches('-').trim_end()))
        .collect()
}

/// Arguments of the kwok controller. No `--server-address`/`--node-port`:
/// without them kwok opens no listener at all (its kubelet-like API for
/// logs/exec is not needed).
pub fn args(kubeconfig: &Path, stages: &Path, sim: Simulation) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--config={}", stages.display()),
        "--manage-all-nodes=false".into(),
        format!(
            "--manage-nodes-with-annotation-selector={}={}",
            NODE_ANNOTATION.0, NODE_ANNOTATION.1
        ),
        format!("--node-lease-duration-seconds={}", sim.lease_seconds),
        // Pod IPs handed out; large enough for any test.
        "--cidr=10.244.0.0/16".into(),
        "--node-ip=127.0.0.1".into(),
    ]
}

/// Name of the i-th simulated node.
pub fn node_name(i: usize) -> String {
    format!("kwok-node-{i}")
}

/// A Node object for kwok to manage. Status (capacity/allocatable) is set at
/// creation: there is no kubelet to report it, and the apiserver keeps the
/// status of a created Node; kwok's node-initialize stage then adds the
/// conditions, addresses and node info.
pub fn node(name: &str, tainted: bool) -> Node {
    let labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        (
            "kubernetes.io/arch".to_string(),
            std::env::consts::ARCH
                .replace("x86_64", "amd64")
                .replace("aarch64", "arm64"),
        ),
        ("kubernetes.io/role".to_string(), "agent".to_string()),
        ("node-role.kubernetes.io/agent".to_string(), String::new()),
        (NODE_TYPE_LABEL.0.to_string(), NODE_TYPE_LABEL.1.to_string()),
    ]);
    let annotations = BTreeMap::from([
        (NODE_ANNOTATION.0.to_string(), NODE_ANNOTATION.1.to_string()),
        ("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string()),
    ]);
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity("32".into())),
        ("memory".to_string(), Quantity("256Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
        ("ephemeral-storage".to_string(), Quantity("1Ti".into())),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: tainted.then(|| NodeSpec {
            taints: Some(vec![Taint {
                key: SIMULATED_TAINT.0.to_string(),
                effect: SIMULATED_TAINT.1.to_string(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            ..Default::default()
        }),
    }
}

/// The holder the tests write into a simulated node's Lease to lose it.
pub const LOST_HOLDER: &str = "csiops-e2e-lost-node";

/// Makes the simulated node `name` lost, as a node whose kubelet stopped
/// reporting: its Lease in `kube-node-lease` is taken by another holder for
/// a day, so kwok (which manages only nodes whose Lease it holds) stops
/// renewing it and stops reporting its status and playing its pods. After
/// kube-controller-manager's node grace period (50 s) the node is
/// `Ready=Unknown` with the `unreachable` taints, and its pods are NotReady.
pub async fn lose_node(client: &kube::Client, name: &str) -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, Patch, PatchParams};
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let patch = serde_json::json!({"spec": {
        "holderIdentity": LOST_HOLDER,
        "leaseDurationSeconds": 86_400,
        "renewTime": now,
    }});
    leases
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| crate::error::Error::Other(format!("taking the Lease of node {name}: {e}")))?;
    Ok(())
}

/// Gives a node lost by [`lose_node`] back to kwok: its Lease is deleted,
/// kwok creates and renews a new one, and the node turns Ready again.
pub async fn return_node(client: &kube::Client, name: &str) -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, DeleteParams};
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    match leases.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(crate::error::Error::Other(format!(
            "deleting the Lease of node {name}: {e}"
        ))),
    }
}

/// Whether the Node's Ready condition is True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_is_selected_by_kwok() {
        let n = node("kwok-node-0", false);
        assert!(n.spec.is_none());
        let tainted = node("kwok-node-1", true).spec.unwrap().taints.unwrap();
        assert_eq!(tainted[0].key, SIMULATED_TAINT.0);
        let ann = n.metadata.annotations.unwrap();
        assert_eq!(ann[NODE_ANNOTATION.0], NODE_ANNOTATION.1);
        assert_eq!(
            n.metadata.labels.unwrap()["kubernetes.io/hostname"],
            "kwok-node-0"
        );
        assert!(!node_ready(&node("x", false)));
    }

    #[test]
    fn the_fleet_simulation_plays_nodes_with_kwok_and_pods_without_ips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin_dir = dir.path().join("bin");
        std::fs::create_dir(&bin_dir).expect("mkdir");
        let default = stages_file(&bin_dir, dir.path(), Simulation::DEFAULT).expect("stages");
        let text = std::fs::read_to_string(default).expect("read");
        assert_eq!(
            text,
            format!("{}\n---\n{READY_AGAIN_STAGE}", FALLBACK_STAGES.trim_end())
        );
        let fleet = stages_file(&bin_dir, dir.path(), Simulation::FLEET).expect("stages");
        let text = std::fs::read_to_string(fleet).expect("read");
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("  name: "))
            .collect();
        assert_eq!(
            names,
            [
                "node-initialize",
                "node-heartbeat-with-lease",
                "fleet-pod-ready",
                "fleet-pod-delete",
                "csiops-pod-ready-again"
            ]
        );
        assert!(!text.contains("PodIPsWith"), "{text}");
        // Every document is YAML kwok can read.
        for doc in text.split("\n---").filter(|d| d.contains("kind: Stage")) {
            let v: serde_yaml::Value = serde_yaml::from_str(doc).expect("a YAML document");
            assert_eq!(v["kind"], "Stage", "{doc}");
        }
        assert!(args(Path::new("k"), Path::new("s"), Simulation::FLEET)
            .contains(&"--node-lease-duration-seconds=160".to_string()));
    }

    #[test]
    fn fallback_stages_cover_nodes_and_pods() {
        for stage in [
            "node-initialize",
            "node-heartbeat-with-lease",
            "pod-ready",
            "pod-delete",
        ] {
            assert!(
                FALLBACK_STAGES.contains(&format!("name: {stage}\n")),
                "{stage}"
            );
        }
    }

    #[test]
    fn ready_again_plays_running_pods_only() {
        // Where it goes (after kwok's own stages) is checked by
        // the_fleet_simulation_plays_nodes_with_kwok_and_pods_without_ips;
        // Pending pods stay kwok's pod-ready's.
        assert!(READY_AGAIN_STAGE.contains("name: csiops-pod-ready-again\n"));
        assert!(
            READY_AGAIN_STAGE.contains("- 'Running'") && !READY_AGAIN_STAGE.contains("- 'Pending'")
        );
    }
}
