//! The driver's node ID for a VolumeAttachment's node, from the caches:
//! the node's CSINode entry for the driver first (what the registrar and
//! kubelet write), then the Node's `csi.volume.kubernetes.io/nodeid`
//! annotation (a JSON map driver → node ID). For a detach only, last the
//! `csi.alpha.kubernetes.io/node-id` annotation this attacher stored on the
//! VolumeAttachment when it attached, so a volume can still be detached from
//! a node that is gone or whose driver is unregistered.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};

/// Node annotation: JSON map of driver name → node ID.
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
/// VolumeAttachment annotation with the node ID used to attach (upstream's key).
pub const VA_NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIdError {
    #[error("node {node}: neither its CSINode nor its {NODE_ID_ANNOTATION} annotation has a node ID for driver {driver}")]
    Unknown { node: String, driver: String },
}

/// The driver's entry in a CSINode.
pub fn from_csinode(csinode: &CSINode, driver: &str) -> Option<String> {
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .map(|d| d.node_id.clone())
        .filter(|id| !id.is_empty())
}

/// The driver's key in a Node's node-ID annotation (invalid JSON: none).
pub fn from_node_annotations(
    annotations: Option<&BTreeMap<String, String>>,
    driver: &str,
) -> Option<String> {
    let raw = annotations?.get(NODE_ID_ANNOTATION)?;
    let ids: BTreeMap<String, String> = serde_json::from_str(raw).ok()?;
    ids.get(driver).cloned().filter(|id| !id.is_empty())
}

/// The node ID, trying the CSINode, the Node annotation and (`va`: detach
/// only) the attachment's own annotation, in that order.
pub fn node_id(
    driver: &str,
    node: &str,
    csinode: Option<&CSINode>,
    node_annotations: Option<&BTreeMap<String, String>>,
    va: Option<&VolumeAttachment>,
) -> Result<String, NodeIdError> {
    csinode
        .and_then(|c| from_csinode(c, driver))
        .or_else(|| from_node_annotations(node_annotations, driver))
        .or_else(|| {
            va.and_then(|va| va.metadata.annotations.as_ref())
                .and_then(|a| a.get(VA_NODE_ID_ANNOTATION))
                .filter(|id| !id.is_empty())
                .cloned()
        })
        .ok_or_else(|| NodeIdError::Unknown {
            node: node.to_string(),
            driver: driver.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const D: &str = "test.csi.csiops.dev";

    fn csinode(entries: &[(&str, &str)]) -> CSINode {
        CSINode {
            metadata: ObjectMeta::default(),
            spec: CSINodeSpec {
                drivers: entries
                    .iter()
                    .map(|(name, id)| CSINodeDriver {
                        name: name.to_string(),
                        node_id: id.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            },
        }
    }

    fn ann(k: &str, v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(k.to_string(), v.to_string())])
    }

    fn va_with(id: &str) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                annotations: Some(ann(VA_NODE_ID_ANNOTATION, id)),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn lookup_order() {
        let node_ann = ann(
            NODE_ID_ANNOTATION,
            r#"{"test.csi.csiops.dev":"from-node","x":"y"}"#,
        );
        let other_ann = ann(NODE_ID_ANNOTATION, r#"{"x":"y"}"#);
        let broken = ann(NODE_ID_ANNOTATION, "not json");
        let va = va_with("from-va");
        let cn = csinode(&[("x", "1"), (D, "from-csinode")]);
        let cn_other = csinode(&[("x", "1")]);
        type Case<'a> = (
            Option<&'a CSINode>,
            Option<&'a BTreeMap<String, String>>,
            Option<&'a VolumeAttachment>,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (Some(&cn), Some(&node_ann), Some(&va), Some("from-csinode")),
            (
                Some(&cn_other),
                Some(&node_ann),
                Some(&va),
                Some("from-node"),
            ),
            (None, Some(&node_ann), None, Some("from-node")),
            (
                Some(&cn_other),
                Some(&other_ann),
                Some(&va),
                Some("from-va"),
            ),
            (None, Some(&broken), Some(&va), Some("from-va")),
            // Attach passes no VA: its annotation is only a detach fallback.
            (Some(&cn_other), Some(&other_ann), None, None),
            (None, None, None, None),
        ];
        for (i, (c, a, v, want)) in cases.into_iter().enumerate() {
            let got = node_id(D, "n1", c, a, v);
            match want {
                Some(w) => assert_eq!(got.as_deref(), Ok(w), "case {i}"),
                None => assert_eq!(
                    got,
                    Err(NodeIdError::Unknown {
                        node: "n1".into(),
                        driver: D.into()
                    }),
                    "case {i}"
                ),
            }
        }
    }

    #[test]
    fn empty_ids_do_not_count() {
        let cn = csinode(&[(D, "")]);
        let a = ann(NODE_ID_ANNOTATION, r#"{"test.csi.csiops.dev":"n"}"#);
        assert_eq!(
            node_id(D, "n1", Some(&cn), Some(&a), None).as_deref(),
            Ok("n")
        );
    }
}
