//! What kubelet's node-info manager writes for a registered CSI driver, as pure
//! functions, so the registrar writes exactly the same and the two never fight:
//!
//! - CSINode `spec.drivers[]`: `{name, nodeID, topologyKeys (sorted keys of the
//!   accessible topology), allocatable.count (max_volumes_per_node, if > 0)}`;
//!   a missing CSINode is created owned by its Node. An entry is up to date
//!   when its node ID and topology keys are the driver's; its `allocatable`
//!   is kubelet's to keep (see [`with_driver`]).
//! - Node label per topology segment, refused (nothing written, not the
//!   CSINode entry either) when the Node already has that label with another
//!   value: kubelet refuses such a collision the same way, so a driver
//!   cannot relabel `kubernetes.io/hostname` or a zone the scheduler and
//!   other drivers rely on (see [`TopologyCollision`]).
//! - Node annotation `csi.volume.kubernetes.io/nodeid`: a JSON object of
//!   driver name → node ID, other drivers' keys preserved.
//!
//! Uninstall removes this driver's CSINode entry and annotation key only;
//! topology labels stay (kubelet leaves them too: other drivers may share them).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// Node annotation kubelet keeps the driver → node ID map in.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// NodeGetInfo's answer, reduced to what Kubernetes records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverNodeInfo {
    pub node_id: String,
    pub max_volumes_per_node: i64,
    pub topology: BTreeMap<String, String>,
}

/// The CSINode entry of a driver.
pub fn driver_entry(driver: &str, info: &DriverNodeInfo) -> CSINodeDriver {
    let keys: Vec<String> = info.topology.keys().cloned().collect();
    CSINodeDriver {
        name: driver.to_string(),
        node_id: info.node_id.clone(),
        topology_keys: (!keys.is_empty()).then_some(keys),
        allocatable: (info.max_volumes_per_node > 0).then(|| VolumeNodeResources {
            count: Some(info.max_volumes_per_node.min(i64::from(i32::MAX)) as i32),
        }),
    }
}

/// A new CSINode for `node` with only this driver, owned by the Node.
pub fn new_csinode(node: &Node, entry: CSINodeDriver) -> CSINode {
    let name = node.metadata.name.clone().unwrap_or_default();
    CSINode {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name,
                uid: node.metadata.uid.clone().unwrap_or_default(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: CSINodeSpec {
            drivers: vec![entry],
        },
    }
}

/// Whether `existing` registers what `entry` does: the same node ID and
/// the same set of topology keys (kubelet compares them as a set too).
/// `allocatable` is left out on purpose, see [`with_driver`].
fn same_registration(existing: &CSINodeDriver, entry: &CSINodeDriver) -> bool {
    let keys = |d: &CSINodeDriver| {
        d.topology_keys
            .iter()
            .flatten()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
    };
    existing.node_id == entry.node_id && keys(existing) == keys(entry)
}

/// `csinode` with this driver's entry set, or `None` when it already is.
///
/// The entry's `allocatable` is written only when this creates the entry
/// (as kubelet does at registration). An existing entry keeps its
/// `allocatable` whatever the driver answers now: kubelet owns it. With
/// KEP-4876 (MutableCSINodeAllocatableCount, GA in 1.36) kubelet re-asks
/// NodeGetInfo every `nodeAllocatableUpdatePeriodSeconds` of the CSIDriver,
/// and after a ResourceExhausted attach, and updates `allocatable.count`
/// itself; a second writer with its own timing would overwrite kubelet's
/// newer count with an older one, back and forth. Without that feature the
/// API server refuses any change of an existing entry (it is immutable), so
/// writing it could only fail. Keeping kubelet's value needs no read of the
/// CSIDriver (and no permission for it), and is right in both cases.
pub fn with_driver(csinode: &CSINode, entry: &CSINodeDriver) -> Option<CSINode> {
    let mut updated = csinode.clone();
    match updated
        .spec
        .drivers
        .iter_mut()
        .find(|d| d.name == entry.name)
    {
        Some(d) if same_registration(d, entry) => return None,
        Some(d) => {
            let allocatable = d.allocatable.take();
            *d = CSINodeDriver {
                allocatable,
                ..entry.clone()
            };
        }
        None => updated.spec.drivers.push(entry.clone()),
    }
    Some(updated)
}

/// `csinode` without this driver's entry, or `None` when it has none.
pub fn without_driver(csinode: &CSINode, driver: &str) -> Option<CSINode> {
    if !csinode.spec.drivers.iter().any(|d| d.name == driver) {
        return None;
    }
    let mut updated = csinode.clone();
    updated.spec.drivers.retain(|d| d.name != driver);
    Some(updated)
}

/// The change a Node needs: labels to set and the new annotation value
/// (`Some(None)` removes the annotation).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeChange {
    pub labels: BTreeMap<String, String>,
    pub node_id_annotation: Option<Option<String>>,
}

impl NodeChange {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.node_id_annotation.is_none()
    }

    /// A JSON merge patch carrying the change, guarded by `resource_version`.
    pub fn merge_patch(&self, resource_version: Option<&str>) -> serde_json::Value {
        let mut metadata = serde_json::Map::new();
        if !self.labels.is_empty() {
            metadata.insert("labels".into(), serde_json::json!(self.labels));
        }
        if let Some(value) = &self.node_id_annotation {
            metadata.insert(
                "annotations".into(),
                serde_json::json!({ NODE_ID_ANNOTATION: value }),
            );
        }
        if let Some(rv) = resource_version {
            metadata.insert("resourceVersion".into(), serde_json::json!(rv));
        }
        serde_json::json!({ "metadata": metadata })
    }
}

/// The annotation's map, tolerating a missing or malformed value (kubelet
/// would overwrite a malformed one too).
fn node_ids(node: &Node) -> BTreeMap<String, String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_ID_ANNOTATION))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

fn encode(ids: &BTreeMap<String, String>) -> Option<String> {
    if ids.is_empty() {
        None
    } else {
        serde_json::to_string(ids).ok()
    }
}

/// A topology segment whose key the Node already carries as a label with
/// another value. The message is kubelet's (`updateTopologyLabels` of its
/// node-info manager, which refuses the registration for it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "detected topology value collision: driver reported {key:?}:{reported:?} but existing label is {key:?}:{existing:?}"
)]
pub struct TopologyCollision {
    pub key: String,
    pub reported: String,
    pub existing: String,
}

/// What installing the driver changes on the Node, or the first (by key)
/// topology segment that would overwrite an existing label.
pub fn node_install(
    node: &Node,
    driver: &str,
    info: &DriverNodeInfo,
) -> Result<NodeChange, TopologyCollision> {
    let current = node.metadata.labels.clone().unwrap_or_default();
    if let Some((key, reported, existing)) = info.topology.iter().find_map(|(k, v)| {
        current
            .get(k)
            .filter(|cur| *cur != v)
            .map(|cur| (k, v, cur))
    }) {
        return Err(TopologyCollision {
            key: key.clone(),
            reported: reported.clone(),
            existing: existing.clone(),
        });
    }
    let labels = info
        .topology
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut ids = node_ids(node);
    let annotation = if ids.get(driver) == Some(&info.node_id) {
        None
    } else {
        ids.insert(driver.to_string(), info.node_id.clone());
        Some(encode(&ids))
    };
    Ok(NodeChange {
        labels,
        node_id_annotation: annotation,
    })
}

/// What uninstalling the driver changes on the Node.
pub fn node_uninstall(node: &Node, driver: &str) -> NodeChange {
    let mut ids = node_ids(node);
    let annotation = ids.remove(driver).map(|_| encode(&ids));
    NodeChange {
        labels: BTreeMap::new(),
        node_id_annotation: annotation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotation: Option<&str>, labels: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("node-1".into());
        n.metadata.uid = Some("uid-1".into());
        if let Some(a) = annotation {
            n.metadata.annotations = Some(BTreeMap::from([(
                NODE_ID_ANNOTATION.to_string(),
                a.to_string(),
            )]));
        }
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n
    }

    fn hostpath_info() -> DriverNodeInfo {
        DriverNodeInfo {
            node_id: "node-1".into(),
            max_volumes_per_node: 0,
            topology: BTreeMap::from([(
                "topology.hostpath.csi/node".to_string(),
                "node-1".to_string(),
            )]),
        }
    }

    #[test]
    fn entry_is_what_kubelet_writes() {
        let e = driver_entry("hostpath.csi.k8s.io", &hostpath_info());
        assert_eq!(e.node_id, "node-1");
        assert_eq!(
            e.topology_keys,
            Some(vec!["topology.hostpath.csi/node".to_string()])
        );
        assert_eq!(
            e.allocatable, None,
            "no count when the driver reports no limit"
        );
        let mut limited = hostpath_info();
        limited.max_volumes_per_node = 1 << 40;
        limited.topology.insert("a/zone".into(), "z".into());
        let e = driver_entry("d", &limited);
        assert_eq!(e.allocatable.and_then(|a| a.count), Some(i32::MAX));
        assert_eq!(
            e.topology_keys,
            Some(vec![
                "a/zone".to_string(),
                "topology.hostpath.csi/node".to_string()
            ])
        );
    }

    #[test]
    fn csinode_entries_of_other_drivers_survive_and_writes_are_idempotent() {
        let other = CSINodeDriver {
            name: "other.csi".into(),
            node_id: "x".into(),
            ..CSINodeDriver::default()
        };
        let n = node(None, &[]);
        let mut csinode = new_csinode(&n, other.clone());
        assert_eq!(
            csinode
                .metadata
                .owner_references
                .as_ref()
                .map(|o| o[0].uid.as_str()),
            Some("uid-1")
        );
        let entry = driver_entry("hostpath.csi.k8s.io", &hostpath_info());
        csinode = with_driver(&csinode, &entry).expect("added");
        assert_eq!(csinode.spec.drivers.len(), 2);
        assert!(
            with_driver(&csinode, &entry).is_none(),
            "no write when nothing changed"
        );
        let mut moved = hostpath_info();
        moved.node_id = "node-1b".into();
        let updated =
            with_driver(&csinode, &driver_entry("hostpath.csi.k8s.io", &moved)).expect("changed");
        assert_eq!(updated.spec.drivers.len(), 2);
        let removed = without_driver(&updated, "hostpath.csi.k8s.io").expect("removed");
        assert_eq!(removed.spec.drivers, vec![other]);
        assert!(without_driver(&removed, "hostpath.csi.k8s.io").is_none());
    }

    fn with_count(mut info: DriverNodeInfo, count: i64) -> DriverNodeInfo {
        info.max_volumes_per_node = count;
        info
    }

    #[test]
    fn allocatable_of_an_existing_entry_is_kubelets() {
        let driver = "hostpath.csi.k8s.io";
        let n = node(None, &[]);
        // Created by us: the driver's count, as kubelet would write it.
        let created = new_csinode(&n, driver_entry(driver, &with_count(hostpath_info(), 7)));
        let count = |c: &CSINode| c.spec.drivers[0].allocatable.as_ref().and_then(|a| a.count);
        assert_eq!(count(&created), Some(7));
        // kubelet updated it (KEP-4876) to 5, or the driver now says 9 or
        // nothing: no write either way.
        let mut kubelets = created.clone();
        kubelets.spec.drivers[0].allocatable = Some(VolumeNodeResources { count: Some(5) });
        for answer in [7, 9, 0] {
            let entry = driver_entry(driver, &with_count(hostpath_info(), answer));
            assert!(
                with_driver(&kubelets, &entry).is_none(),
                "the driver answering {answer} must not overwrite kubelet's 5"
            );
        }
        // Topology keys are compared as a set, as kubelet does.
        let mut reordered = kubelets.clone();
        reordered.spec.drivers[0].topology_keys =
            Some(vec!["b/zone".to_string(), "a/zone".to_string()]);
        let mut two_keys = hostpath_info();
        two_keys.topology = BTreeMap::from([
            ("a/zone".to_string(), "1".to_string()),
            ("b/zone".to_string(), "2".to_string()),
        ]);
        assert!(with_driver(&reordered, &driver_entry(driver, &two_keys)).is_none());
        // A new node ID is written, with kubelet's count kept.
        let mut moved = with_count(hostpath_info(), 9);
        moved.node_id = "node-1b".into();
        let updated = with_driver(&kubelets, &driver_entry(driver, &moved)).expect("changed");
        assert_eq!(updated.spec.drivers[0].node_id, "node-1b");
        assert_eq!(count(&updated), Some(5));
    }

    #[test]
    fn node_annotation_keeps_other_drivers_and_labels_follow_topology() {
        let n = node(Some(r#"{"other.csi":"x"}"#), &[]);
        let change =
            node_install(&n, "hostpath.csi.k8s.io", &hostpath_info()).expect("no collision");
        let value = change
            .node_id_annotation
            .clone()
            .flatten()
            .expect("annotation set");
        let ids: BTreeMap<String, String> = serde_json::from_str(&value).expect("json");
        assert_eq!(ids.get("other.csi").map(String::as_str), Some("x"));
        assert_eq!(
            ids.get("hostpath.csi.k8s.io").map(String::as_str),
            Some("node-1")
        );
        assert_eq!(
            change
                .labels
                .get("topology.hostpath.csi/node")
                .map(String::as_str),
            Some("node-1")
        );
        let patch = change.merge_patch(Some("42"));
        assert_eq!(patch["metadata"]["resourceVersion"], "42");

        let installed = node(Some(&value), &[("topology.hostpath.csi/node", "node-1")]);
        assert!(
            node_install(&installed, "hostpath.csi.k8s.io", &hostpath_info())
                .expect("no collision")
                .is_empty()
        );

        let change = node_uninstall(&installed, "hostpath.csi.k8s.io");
        assert_eq!(
            change.node_id_annotation,
            Some(Some(r#"{"other.csi":"x"}"#.to_string()))
        );
        let alone = node(Some(r#"{"hostpath.csi.k8s.io":"node-1"}"#), &[]);
        assert_eq!(
            node_uninstall(&alone, "hostpath.csi.k8s.io").node_id_annotation,
            Some(None)
        );
        let patch = node_uninstall(&alone, "hostpath.csi.k8s.io").merge_patch(None);
        assert!(patch["metadata"]["annotations"][NODE_ID_ANNOTATION].is_null());
        assert!(node_uninstall(&node(None, &[]), "hostpath.csi.k8s.io").is_empty());
    }

    #[test]
    fn a_segment_that_would_relabel_the_node_is_refused_as_kubelet_refuses_it() {
        // The driver claims the node is another host, in another zone.
        let n = node(
            None,
            &[
                ("kubernetes.io/hostname", "node-1"),
                ("topology.kubernetes.io/zone", "a"),
            ],
        );
        let mut info = hostpath_info();
        info.topology
            .insert("kubernetes.io/hostname".into(), "node-2".into());
        info.topology
            .insert("topology.kubernetes.io/zone".into(), "b".into());
        let err = node_install(&n, "d", &info).expect_err("a collision");
        assert_eq!(
            err,
            TopologyCollision {
                key: "kubernetes.io/hostname".into(),
                reported: "node-2".into(),
                existing: "node-1".into(),
            }
        );
        assert_eq!(
            err.to_string(),
            r#"detected topology value collision: driver reported "kubernetes.io/hostname":"node-2" but existing label is "kubernetes.io/hostname":"node-1""#
        );
        // The same values as the Node's, or new keys: no collision.
        let mut same = hostpath_info();
        same.topology
            .insert("kubernetes.io/hostname".into(), "node-1".into());
        let change = node_install(&n, "d", &same).expect("agrees with the Node");
        assert_eq!(
            change.labels.keys().collect::<Vec<_>>(),
            ["topology.hostpath.csi/node"]
        );
    }
}
