//! Plays kubelet's part in driver registration for the simulated nodes.
//!
//! On a real node, kubelet's plugin watcher finds the registrar's socket,
//! calls GetInfo, then NodeGetInfo on the driver, and writes the driver's
//! entry into the node's CSINode. kwok nodes have no kubelet, so until the
//! csiops registrar and a real driver run per node (issue 4), this task
//! writes that entry the way kubelet does, for every node that runs a Ready
//! node pod of the driver — and only then, so "registered" still depends on
//! the DaemonSet really being up.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::task::JoinHandle;

/// A driver whose node pods get registered.
#[derive(Clone, Debug)]
pub struct DriverRegistration {
    pub namespace: String,
    /// Label selector of the driver's node pods.
    pub pod_selector: String,
    pub driver: String,
    /// Topology key kubelet copies from NodeGetInfo (hostpath: `topology.hostpath.csi/node`).
    pub topology_key: Option<String>,
}

/// The background registration loop; stops on drop.
pub struct KubeletSim {
    task: JoinHandle<()>,
}

impl Drop for KubeletSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KubeletSim {
    /// Starts registering the given drivers every `period`.
    pub fn spawn(client: Client, drivers: Vec<DriverRegistration>, period: Duration) -> Self {
        let task = tokio::spawn(async move {
            loop {
                for d in &drivers {
                    if let Err(e) = register_ready_nodes(&client, d).await {
                        tracing::debug!(driver = %d.driver, error = %e, "kubelet sim pass failed");
                    }
                }
                tokio::time::sleep(period).await;
            }
        });
        Self { task }
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// One pass: every node with a Ready node pod gets the driver in its CSINode.
pub async fn register_ready_nodes(
    client: &Client,
    d: &DriverRegistration,
) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &d.namespace);
    let list = pods
        .list(&ListParams::default().labels(&d.pod_selector))
        .await?;
    for pod in list.items.iter().filter(|p| pod_ready(p)) {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            register(client, &node, d).await?;
        }
    }
    Ok(())
}

/// Adds the driver to the node's CSINode (creating it, owned by the Node, as kubelet does).
pub async fn register(
    client: &Client,
    node: &str,
    d: &DriverRegistration,
) -> Result<(), kube::Error> {
    let api: Api<CSINode> = Api::all(client.clone());
    let entry = CSINodeDriver {
        name: d.driver.clone(),
        node_id: node.to_string(),
        topology_keys: d.topology_key.clone().map(|k| vec![k]),
        allocatable: None,
    };
    match api.get_opt(node).await? {
        Some(mut csinode) => {
            if csinode.spec.drivers.iter().any(|x| x.name == d.driver) {
                return Ok(());
            }
            csinode.spec.drivers.push(entry);
            api.replace(node, &PostParams::default(), &csinode).await?;
        }
        None => {
            let nodes: Api<Node> = Api::all(client.clone());
            let owner = nodes.get(node).await?;
            let csinode = CSINode {
                metadata: ObjectMeta {
                    name: Some(node.to_string()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: node.to_string(),
                        uid: owner.uid().unwrap_or_default(),
                        ..OwnerReference::default()
                    }]),
                    ..ObjectMeta::default()
                },
                spec: CSINodeSpec {
                    drivers: vec![entry],
                },
            };
            api.create(&PostParams::default(), &csinode).await?;
        }
    }
    if let Some(key) = &d.topology_key {
        let nodes: Api<Node> = Api::all(client.clone());
        let patch = serde_json::json!({"metadata": {"labels": BTreeMap::from([(key.clone(), node.to_string())])}});
        nodes
            .patch(
                node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
    }
    Ok(())
}
