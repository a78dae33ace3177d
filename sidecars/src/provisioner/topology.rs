//! `CreateVolumeRequest.accessibility_requirements`, as the README's table
//! says (when the driver has VOLUME_ACCESSIBILITY_CONSTRAINTS and topology is
//! enabled):
//!
//! | delayed binding | strict | allowedTopologies | requisite | preferred |
//! |---|---|---|---|---|
//! | yes | yes | irrelevant | selected node's topology | = requisite |
//! | yes | no  | no  | aggregated cluster topology | requisite, selected node's segment first |
//! | yes | no  | yes | allowed topologies | requisite, selected node's segment first |
//! | no  | irrelevant | no  | aggregated cluster topology | requisite, "randomly selected" segment first |
//! | no  | irrelevant | yes | allowed topologies | requisite, "randomly selected" segment first |
//!
//! Delayed binding means the claim carries `volume.kubernetes.io/selected-node`.
//! Everything is deterministic, as in current upstream: requisite is sorted
//! (fewer keys first, then by key/value pairs) and deduplicated; preferred is
//! requisite rotated. The "random" segment of immediate binding is upstream's
//! StatefulSet spreading: FNV-1 (32 bit) of the claim name's StatefulSet part
//! plus the ordinal, modulo the number of segments, so `data-web-0`,
//! `data-web-1`, … land on consecutive segments.
//!
//! Aggregation ("the provisioner will then iterate through all cached nodes
//! that contain a node ID from the driver, aggregating labels using those
//! keys", CSI design doc) takes every Node whose CSINode lists the driver and
//! which carries a label for each key. Delayed binding aggregates with the
//! selected node's keys. Immediate binding aggregates once per distinct key
//! set the driver registered on any node and takes the union, as upstream
//! does since external-provisioner#1582 (issue #1589): before it, upstream
//! took the keys of one node picked at random, so where nodes register
//! different key sets (an upgrade adding a zone key, a driver that knows a
//! rack on some nodes only) one claim's volume was pinned to the finer
//! segments and the next one's lost them, at random.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use csiops_proto::csi::v1::{Topology, TopologyRequirement};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, TopologySelectorTerm};
use k8s_openapi::api::storage::v1::CSINode;

/// Set by the scheduler on a claim with delayed binding: the chosen node.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
/// Its Kubernetes 1.11 name, still read by the provisioner library.
pub const ALPHA_SELECTED_NODE_ANNOTATION: &str = "volume.alpha.kubernetes.io/selected-node";

/// Why no requirement can be computed now. Every variant describes cluster
/// state that may still change (a node registering, labels appearing), so
/// provisioning is retried with backoff, never given up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("selected node {0:?} not found")]
    SelectedNodeNotFound(String),
    #[error("CSINode for selected node {0:?} not found")]
    NoCSINode(String),
    #[error("no topology key found for node {node:?}: driver {driver:?} is not registered there, or without topology")]
    NoTopologyKeys { node: String, driver: String },
    #[error("topology label {key:?} missing on selected node {node:?}")]
    MissingTopologyLabel { node: String, key: String },
    #[error("selected node {node:?} topology {topology} is not in allowed topologies")]
    NotAllowed { node: String, topology: String },
    #[error("topology {topology} from selected node {node:?} is not in requisite")]
    NotInRequisite { node: String, topology: String },
    #[error("topology keys {0:?} were not found on any node")]
    NoLabeledNodes(Vec<String>),
    #[error("no available topology found: driver {0:?} has registered topology keys on no node")]
    NoTopology(String),
}

/// Everything the requirement depends on.
#[derive(Debug, Clone, Copy)]
pub struct TopologyInputs<'a> {
    /// VOLUME_ACCESSIBILITY_CONSTRAINTS and the Topology feature enabled;
    /// without it there is no requirement at all.
    pub supports_topology: bool,
    pub driver: &'a str,
    /// The claim's name (StatefulSet spreading for immediate binding).
    pub pvc_name: &'a str,
    /// `--strict-topology` (matters only with a selected node).
    pub strict_topology: bool,
    /// `--immediate-topology` (upstream default true): whether immediate
    /// binding without allowedTopologies gets the aggregated topology or no
    /// requirement.
    pub immediate_topology: bool,
    /// The StorageClass's `allowedTopologies`.
    pub allowed_topologies: &'a [TopologySelectorTerm],
    /// The selected node (see [`selected_node`]); `None` = immediate binding.
    pub selected_node: Option<&'a str>,
    pub nodes: &'a [Arc<Node>],
    pub csi_nodes: &'a [Arc<CSINode>],
}

/// The claim's selected node, if the scheduler chose one.
pub fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    let annotations = claim.metadata.annotations.as_ref()?;
    [SELECTED_NODE_ANNOTATION, ALPHA_SELECTED_NODE_ANNOTATION]
        .iter()
        .filter_map(|k| annotations.get(*k))
        .map(String::as_str)
        .find(|v| !v.is_empty())
}

/// One segment: key/value pairs AND'ed (keys sorted by the map).
type Term = BTreeMap<String, String>;

/// Upstream's `topologyTerm.compare`: fewer pairs first, then pairwise by key
/// and value.
fn compare(a: &Term, b: &Term) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.iter().cmp(b.iter()))
}

/// Every pair of `t` is in `of`.
fn subset(t: &Term, of: &Term) -> bool {
    t.iter().all(|(k, v)| of.get(k) == Some(v))
}

fn show(t: &Term) -> String {
    let pairs: Vec<String> = t.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", pairs.join(","))
}

/// allowedTopologies (OR of terms, each an AND of key IN values) as an OR of
/// segments, by distributing each term's value lists:
/// `{zone: [z1, z2], rack: [a]}` → `{zone: z1, rack: a}`, `{zone: z2, rack: a}`.
fn flatten(allowed: &[TopologySelectorTerm]) -> Vec<Term> {
    let mut out = Vec::new();
    for term in allowed {
        let exprs = term.match_label_expressions.as_deref().unwrap_or_default();
        if exprs.is_empty() {
            continue;
        }
        let mut partial: Vec<Term> = vec![Term::new()];
        for e in exprs {
            partial = partial
                .iter()
                .flat_map(|p| {
                    e.values.iter().map(move |v| {
                        let mut t = p.clone();
                        t.insert(e.key.clone(), v.clone());
                        t
                    })
                })
                .collect();
        }
        out.extend(partial);
    }
    out
}

fn driver_keys<'c>(csi_node: &'c CSINode, driver: &str) -> Option<&'c [String]> {
    csi_node
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .and_then(|d| d.topology_keys.as_deref())
        .filter(|k| !k.is_empty())
}

fn has_driver(csi_node: &CSINode, driver: &str) -> bool {
    csi_node.spec.drivers.iter().any(|d| d.name == driver)
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// The node's segment for `keys`, or the first key it has no label for.
fn node_term<'k>(node: &Node, keys: &'k [String]) -> Result<Term, &'k str> {
    let labels = node.metadata.labels.as_ref();
    keys.iter()
        .map(|k| match labels.and_then(|l| l.get(k)) {
            Some(v) => Ok((k.clone(), v.clone())),
            None => Err(k.as_str()),
        })
        .collect()
}

/// FNV-1, 32 bit (Go's `hash/fnv.New32`).
fn fnv1_32(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5u32, |h, b| {
        h.wrapping_mul(0x0100_0193) ^ u32::from(*b)
    })
}

/// Upstream's `getPVCNameHashAndIndexOffset` (the in-tree GCE PD logic):
/// `ClaimName-StatefulSetName-Id` hashes only `StatefulSetName` and offsets
/// by `Id`; any other name hashes whole. An empty name (never seen; upstream
/// draws a random number) hashes as 0.
fn pvc_name_hash_and_index(name: &str) -> (u32, u32) {
    if name.is_empty() {
        return (0, 0);
    }
    let mut hashed = name;
    let mut index = 0;
    if let Some(dash) = name.rfind('-') {
        let id = &name[dash + 1..];
        if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(n) = id.parse::<u32>() {
                index = n;
                hashed = &name[..dash];
                if let Some(d2) = hashed.rfind('-') {
                    hashed = &hashed[d2 + 1..];
                }
            }
        }
    }
    (fnv1_32(hashed.as_bytes()), index)
}

/// Every distinct topology key set the driver registered, in a fixed
/// order (sorted), for immediate binding.
fn registered_key_sets<'c>(inputs: &TopologyInputs<'c>) -> Vec<&'c [String]> {
    let mut sets: Vec<&[String]> = inputs
        .csi_nodes
        .iter()
        .filter_map(|c| driver_keys(c, inputs.driver))
        .collect();
    sets.sort();
    sets.dedup();
    sets
}

/// Immediate binding: the union of [`aggregate`] over every registered key
/// set. A key set no registered node carries labels for adds nothing; only
/// when none adds anything is it an error.
fn aggregate_per_key_set(
    inputs: &TopologyInputs<'_>,
    sets: &[&[String]],
) -> Result<Vec<Term>, TopologyError> {
    let terms: Vec<Term> = sets
        .iter()
        .filter_map(|keys| aggregate(inputs, keys).ok())
        .flatten()
        .collect();
    if terms.is_empty() {
        let mut keys: Vec<String> = sets.iter().flat_map(|k| k.iter().cloned()).collect();
        keys.sort();
        keys.dedup();
        return Err(TopologyError::NoLabeledNodes(keys));
    }
    Ok(terms)
}

/// Every registered node's segment for `keys`.
fn aggregate(inputs: &TopologyInputs<'_>, keys: &[String]) -> Result<Vec<Term>, TopologyError> {
    let registered = |node: &str| {
        inputs
            .csi_nodes
            .iter()
            .any(|c| name_of(&c.metadata) == node && has_driver(c, inputs.driver))
    };
    let terms: Vec<Term> = inputs
        .nodes
        .iter()
        .filter(|n| registered(name_of(&n.metadata)))
        .filter_map(|n| node_term(n, keys).ok())
        .collect();
    if terms.is_empty() {
        return Err(TopologyError::NoLabeledNodes(keys.to_vec()));
    }
    Ok(terms)
}

fn to_csi(terms: &[Term]) -> Vec<Topology> {
    terms
        .iter()
        .filter(|t| !t.is_empty())
        .map(|t| Topology {
            segments: t.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        })
        .collect()
}

/// The accessibility requirement, `None` when there is none to pass (no
/// topology support; immediate binding without allowedTopologies and with
/// `--immediate-topology=false`; allowedTopologies without any expression).
pub fn accessibility_requirements(
    inputs: &TopologyInputs<'_>,
) -> Result<Option<TopologyRequirement>, TopologyError> {
    if !inputs.supports_topology {
        return Ok(None);
    }
    let mut requisite: Vec<Term> = Vec::new();
    // (name, segment, keys) of the selected node.
    let mut selected: Option<(&str, Term, &[String])> = None;

    if let Some(node_name) = inputs.selected_node {
        let node = inputs
            .nodes
            .iter()
            .find(|n| name_of(&n.metadata) == node_name)
            .ok_or_else(|| TopologyError::SelectedNodeNotFound(node_name.to_string()))?;
        let csi_node = inputs
            .csi_nodes
            .iter()
            .find(|c| name_of(&c.metadata) == node_name)
            .ok_or_else(|| TopologyError::NoCSINode(node_name.to_string()))?;
        let keys =
            driver_keys(csi_node, inputs.driver).ok_or_else(|| TopologyError::NoTopologyKeys {
                node: node_name.to_string(),
                driver: inputs.driver.to_string(),
            })?;
        let term = node_term(node, keys).map_err(|key| TopologyError::MissingTopologyLabel {
            node: node_name.to_string(),
            key: key.to_string(),
        })?;
        if inputs.strict_topology {
            if !inputs.allowed_topologies.is_empty()
                && !flatten(inputs.allowed_topologies)
                    .iter()
                    .any(|t| subset(t, &term))
            {
                return Err(TopologyError::NotAllowed {
                    node: node_name.to_string(),
                    topology: show(&term),
                });
            }
            requisite.push(term.clone());
        }
        selected = Some((node_name, term, keys));
    }

    if requisite.is_empty() {
        if !inputs.allowed_topologies.is_empty() {
            requisite = flatten(inputs.allowed_topologies);
        } else {
            requisite = match &selected {
                Some((_, _, keys)) => aggregate(inputs, keys)?,
                None if !inputs.immediate_topology => return Ok(None),
                None => {
                    let sets = registered_key_sets(inputs);
                    if sets.is_empty() {
                        return Err(TopologyError::NoTopology(inputs.driver.to_string()));
                    }
                    aggregate_per_key_set(inputs, &sets)?
                }
            };
        }
    }
    if requisite.is_empty() {
        return Ok(None);
    }
    requisite.sort_by(compare);
    requisite.dedup();

    let preferred: Vec<Term> = match &selected {
        None => {
            let (hash, index) = pvc_name_hash_and_index(inputs.pvc_name);
            let len = u32::try_from(requisite.len()).unwrap_or(u32::MAX);
            let shift = usize::try_from(hash.wrapping_add(index) % len).unwrap_or(0);
            let mut p = requisite.clone();
            p.rotate_left(shift);
            p
        }
        Some(_) if inputs.strict_topology => requisite.clone(),
        Some((node, term, _)) => {
            let first = requisite
                .iter()
                .position(|t| subset(t, term))
                .ok_or_else(|| TopologyError::NotInRequisite {
                    node: node.to_string(),
                    topology: show(term),
                })?;
            let mut p = requisite.clone();
            p.rotate_left(first);
            p
        }
    };
    Ok(Some(TopologyRequirement {
        requisite: to_csi(&requisite),
        preferred: to_csi(&preferred),
    }))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::TopologySelectorLabelRequirement;
    use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};

    use super::*;

    const DRIVER: &str = "hostpath.csi.k8s.io";
    const ZONE: &str = "topology.example.com/zone";
    const RACK: &str = "topology.example.com/rack";

    fn node(name: &str, labels: &[(&str, &str)]) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        Arc::new(n)
    }

    fn csi_node(name: &str, drivers: &[(&str, &[&str])]) -> Arc<CSINode> {
        let mut c = CSINode {
            spec: CSINodeSpec {
                drivers: drivers
                    .iter()
                    .map(|(d, keys)| CSINodeDriver {
                        name: d.to_string(),
                        node_id: name.to_string(),
                        topology_keys: (!keys.is_empty())
                            .then(|| keys.iter().map(|k| k.to_string()).collect()),
                        allocatable: None,
                    })
                    .collect(),
            },
            ..Default::default()
        };
        c.metadata.name = Some(name.into());
        Arc::new(c)
    }

    fn allowed(terms: &[&[(&str, &[&str])]]) -> Vec<TopologySelectorTerm> {
        terms
            .iter()
            .map(|exprs| TopologySelectorTerm {
                match_label_expressions: Some(
                    exprs
                        .iter()
                        .map(|(k, vs)| TopologySelectorLabelRequirement {
                            key: k.to_string(),
                            values: vs.iter().map(|v| v.to_string()).collect(),
                        })
                        .collect(),
                ),
            })
            .collect()
    }

    fn seg(pairs: &[(&str, &str)]) -> Topology {
        Topology {
            segments: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn zones(z: &[&str]) -> Vec<Topology> {
        z.iter().map(|z| seg(&[(ZONE, z)])).collect()
    }

    fn req(requisite: Vec<Topology>, preferred: Vec<Topology>) -> Option<TopologyRequirement> {
        Some(TopologyRequirement {
            requisite,
            preferred,
        })
    }

    /// Three zones, one node each, all with the driver; node-d is labelled but
    /// has no driver; node-e has the driver registered without topology.
    fn cluster() -> (Vec<Arc<Node>>, Vec<Arc<CSINode>>) {
        let nodes = vec![
            node("node-a", &[(ZONE, "a"), (RACK, "1")]),
            node("node-b", &[(ZONE, "b"), (RACK, "1")]),
            node("node-c", &[(ZONE, "c"), (RACK, "2")]),
            node("node-d", &[(ZONE, "d")]),
            node("node-e", &[]),
        ];
        let csi = vec![
            csi_node("node-a", &[(DRIVER, &[ZONE])]),
            csi_node("node-b", &[(DRIVER, &[ZONE]), ("other.csi", &[RACK])]),
            csi_node("node-c", &[(DRIVER, &[ZONE])]),
            csi_node("node-d", &[("other.csi", &[ZONE])]),
            csi_node("node-e", &[(DRIVER, &[])]),
        ];
        (nodes, csi)
    }

    fn inputs<'a>(
        nodes: &'a [Arc<Node>],
        csi_nodes: &'a [Arc<CSINode>],
        allowed_topologies: &'a [TopologySelectorTerm],
        selected_node: Option<&'a str>,
        strict_topology: bool,
    ) -> TopologyInputs<'a> {
        TopologyInputs {
            supports_topology: true,
            driver: DRIVER,
            pvc_name: "cache",
            strict_topology,
            immediate_topology: true,
            allowed_topologies,
            selected_node,
            nodes,
            csi_nodes,
        }
    }

    #[test]
    fn readme_table() {
        let (nodes, csi) = cluster();
        let allowed_bc = allowed(&[&[(ZONE, &["c", "b"])]]);
        let none: Vec<TopologySelectorTerm> = vec![];
        // `pvc_name` "cache": fnv1_32("cache") % 3 == 1 and % 2 == 1, so
        // immediate binding puts the second sorted segment first.
        assert_eq!(fnv1_32(b"cache") % 3, 1);
        assert_eq!(fnv1_32(b"cache") % 2, 1);
        type Case<'a> = (
            &'a str,
            TopologyInputs<'a>,
            Result<Option<TopologyRequirement>, TopologyError>,
        );
        let cases: Vec<Case> = vec![
            (
                // "Yes | Yes | Irrelevant | `Requisite` = `Preferred` = Selected node topology"
                "delayed, strict, no allowed topologies",
                inputs(&nodes, &csi, &none, Some("node-b"), true),
                Ok(req(zones(&["b"]), zones(&["b"]))),
            ),
            (
                "delayed, strict, selected node allowed",
                inputs(&nodes, &csi, &allowed_bc, Some("node-b"), true),
                Ok(req(zones(&["b"]), zones(&["b"]))),
            ),
            (
                // Upstream refuses a selected node outside allowedTopologies
                // under strict topology.
                "delayed, strict, selected node not allowed",
                inputs(&nodes, &csi, &allowed_bc, Some("node-a"), true),
                Err(TopologyError::NotAllowed {
                    node: "node-a".into(),
                    topology: format!("{{{ZONE}=a}}"),
                }),
            ),
            (
                // "Yes | No | No | `Requisite` = Aggregated cluster topology
                // `Preferred` = `Requisite` with selected node topology as first element"
                // node-d (labelled, no driver) and node-e (no topology) are left out.
                "delayed, not strict, aggregated",
                inputs(&nodes, &csi, &none, Some("node-b"), false),
                Ok(req(zones(&["a", "b", "c"]), zones(&["b", "c", "a"]))),
            ),
            (
                // "Yes | No | Yes | `Requisite` = Allowed topologies
                // `Preferred` = `Requisite` with selected node topology as first element"
                "delayed, not strict, allowed topologies",
                inputs(&nodes, &csi, &allowed_bc, Some("node-c"), false),
                Ok(req(zones(&["b", "c"]), zones(&["c", "b"]))),
            ),
            (
                "delayed, not strict, selected node outside allowed topologies",
                inputs(&nodes, &csi, &allowed_bc, Some("node-a"), false),
                Err(TopologyError::NotInRequisite {
                    node: "node-a".into(),
                    topology: format!("{{{ZONE}=a}}"),
                }),
            ),
            (
                // "No | Irrelevant | No | `Requisite` = Aggregated cluster topology
                // `Preferred` = `Requisite` with randomly selected node topology as first element"
                "immediate, aggregated",
                inputs(&nodes, &csi, &none, None, false),
                Ok(req(zones(&["a", "b", "c"]), zones(&["b", "c", "a"]))),
            ),
            (
                // --strict-topology: "This option has no effect if ...
                // `Immediate` volume binding mode is used."
                "immediate, strict is irrelevant",
                inputs(&nodes, &csi, &none, None, true),
                Ok(req(zones(&["a", "b", "c"]), zones(&["b", "c", "a"]))),
            ),
            (
                // "No | Irrelevant | Yes | `Requisite` = Allowed topologies
                // `Preferred` = `Requisite` with randomly selected node topology as first element"
                "immediate, allowed topologies",
                inputs(&nodes, &csi, &allowed_bc, None, false),
                Ok(req(zones(&["b", "c"]), zones(&["c", "b"]))),
            ),
            (
                "no topology support",
                TopologyInputs {
                    supports_topology: false,
                    ..inputs(&nodes, &csi, &allowed_bc, Some("node-b"), true)
                },
                Ok(None),
            ),
            (
                "immediate, --immediate-topology=false",
                TopologyInputs {
                    immediate_topology: false,
                    ..inputs(&nodes, &csi, &none, None, false)
                },
                Ok(None),
            ),
            (
                "--immediate-topology=false keeps allowed topologies",
                TopologyInputs {
                    immediate_topology: false,
                    ..inputs(&nodes, &csi, &allowed_bc, None, false)
                },
                Ok(req(zones(&["b", "c"]), zones(&["c", "b"]))),
            ),
        ];
        for (name, i, want) in cases {
            assert_eq!(accessibility_requirements(&i), want, "{name}");
        }
    }

    #[test]
    fn selected_node_problems() {
        let (nodes, csi) = cluster();
        let none: Vec<TopologySelectorTerm> = vec![];
        let mut unlabeled = nodes.clone();
        unlabeled[0] = node("node-a", &[(RACK, "1")]);
        let cases: Vec<(&str, TopologyInputs, TopologyError)> = vec![
            (
                "node gone",
                inputs(&nodes, &csi, &none, Some("node-x"), false),
                TopologyError::SelectedNodeNotFound("node-x".into()),
            ),
            (
                // The CSI design doc: the provisioner "must gracefully handle
                // the case where `CSINodeInfo` is not up-to-date".
                "no CSINode",
                inputs(&nodes, &csi[1..], &none, Some("node-a"), false),
                TopologyError::NoCSINode("node-a".into()),
            ),
            (
                "driver not on the node",
                inputs(&nodes, &csi, &none, Some("node-d"), false),
                TopologyError::NoTopologyKeys {
                    node: "node-d".into(),
                    driver: DRIVER.into(),
                },
            ),
            (
                "driver without topology keys",
                inputs(&nodes, &csi, &none, Some("node-e"), true),
                TopologyError::NoTopologyKeys {
                    node: "node-e".into(),
                    driver: DRIVER.into(),
                },
            ),
            (
                "label missing",
                inputs(&unlabeled, &csi, &none, Some("node-a"), true),
                TopologyError::MissingTopologyLabel {
                    node: "node-a".into(),
                    key: ZONE.into(),
                },
            ),
        ];
        for (name, i, want) in cases {
            assert_eq!(accessibility_requirements(&i), Err(want), "{name}");
        }
    }

    #[test]
    fn immediate_without_registered_topology() {
        let none: Vec<TopologySelectorTerm> = vec![];
        let nodes = vec![node("n1", &[(ZONE, "a")])];
        // No CSINode has keys for the driver: wait for a node to register.
        let csi = vec![csi_node("n1", &[(DRIVER, &[])])];
        assert_eq!(
            accessibility_requirements(&inputs(&nodes, &csi, &none, None, false)),
            Err(TopologyError::NoTopology(DRIVER.into()))
        );
        // Keys registered but no registered node carries the label.
        let csi = vec![csi_node("n1", &[(DRIVER, &[RACK])])];
        assert_eq!(
            accessibility_requirements(&inputs(&nodes, &csi, &none, None, false)),
            Err(TopologyError::NoLabeledNodes(vec![RACK.into()]))
        );
    }

    #[test]
    fn multi_key_segments_and_allowed_subsets() {
        let nodes = vec![
            node("n1", &[(ZONE, "a"), (RACK, "1")]),
            node("n2", &[(ZONE, "a"), (RACK, "2")]),
            node("n3", &[(ZONE, "b"), (RACK, "1")]),
            node("n4", &[(ZONE, "b"), (RACK, "1")]),
        ];
        let csi: Vec<Arc<CSINode>> = ["n1", "n2", "n3", "n4"]
            .iter()
            .map(|n| csi_node(n, &[(DRIVER, &[ZONE, RACK])]))
            .collect();
        let none: Vec<TopologySelectorTerm> = vec![];
        let s = |z: &str, r: &str| seg(&[(ZONE, z), (RACK, r)]);

        // Aggregation deduplicates n3/n4 and sorts by (rack, zone) pairs: keys
        // are compared in order, "…/rack" before "…/zone".
        let got = accessibility_requirements(&inputs(&nodes, &csi, &none, Some("n2"), false));
        assert_eq!(
            got,
            Ok(req(
                vec![s("a", "1"), s("b", "1"), s("a", "2")],
                vec![s("a", "2"), s("a", "1"), s("b", "1")],
            ))
        );

        // allowedTopologies with fewer keys than the node: the node's segment
        // matches the allowed segment it is a superset of; shorter terms sort first.
        let mixed = allowed(&[&[(ZONE, &["b"])], &[(ZONE, &["a"]), (RACK, &["2", "1"])]]);
        let got = accessibility_requirements(&inputs(&nodes, &csi, &mixed, Some("n3"), false));
        assert_eq!(
            got,
            Ok(req(
                vec![seg(&[(ZONE, "b")]), s("a", "1"), s("a", "2")],
                vec![seg(&[(ZONE, "b")]), s("a", "1"), s("a", "2")],
            ))
        );
        let got = accessibility_requirements(&inputs(&nodes, &csi, &mixed, Some("n3"), true));
        assert_eq!(got, Ok(req(vec![s("b", "1")], vec![s("b", "1")])));
        let got = accessibility_requirements(&inputs(&nodes, &csi, &mixed, Some("n2"), false));
        assert_eq!(
            got,
            Ok(req(
                vec![seg(&[(ZONE, "b")]), s("a", "1"), s("a", "2")],
                vec![s("a", "2"), seg(&[(ZONE, "b")]), s("a", "1")],
            ))
        );
    }

    #[test]
    fn flatten_distributes_values() {
        let t = |pairs: &[(&str, &str)]| -> Term {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let cases: Vec<(&str, Vec<TopologySelectorTerm>, Vec<Term>)> = vec![
            (
                "cartesian product",
                allowed(&[&[(ZONE, &["z1", "z2"]), (RACK, &["a", "b"])]]),
                vec![
                    t(&[(ZONE, "z1"), (RACK, "a")]),
                    t(&[(ZONE, "z1"), (RACK, "b")]),
                    t(&[(ZONE, "z2"), (RACK, "a")]),
                    t(&[(ZONE, "z2"), (RACK, "b")]),
                ],
            ),
            (
                "terms are OR'ed",
                allowed(&[&[(ZONE, &["z1"])], &[(RACK, &["a"])]]),
                vec![t(&[(ZONE, "z1")]), t(&[(RACK, "a")])],
            ),
            (
                "empty term and empty values contribute nothing",
                vec![
                    TopologySelectorTerm {
                        match_label_expressions: None,
                    },
                    allowed(&[&[(ZONE, &[]), (RACK, &["a"])]]).remove(0),
                ],
                vec![],
            ),
        ];
        for (name, input, want) in cases {
            assert_eq!(flatten(&input), want, "{name}");
        }
        // allowedTopologies made only of empty terms: no requirement
        // (upstream falls back to "topology disabled").
        let (nodes, csi) = cluster();
        let empty = vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![]),
        }];
        assert_eq!(
            accessibility_requirements(&inputs(&nodes, &csi, &empty, None, false)),
            Ok(None)
        );
    }

    #[test]
    fn statefulset_spreading() {
        // FNV-1 32-bit test vectors (Go hash/fnv New32).
        assert_eq!(fnv1_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1_32(b"a"), 0x050c_5d7e);
        assert_eq!(fnv1_32(b"foobar"), 0x31f0_b262);
        let cases: &[(&str, (u32, u32))] = &[
            ("data", (fnv1_32(b"data"), 0)),
            // ClaimName-StatefulSetName-Id: only the StatefulSet name is hashed.
            ("data-web-2", (fnv1_32(b"web"), 2)),
            ("logs-web-2", (fnv1_32(b"web"), 2)),
            // Name-Id: the name is hashed.
            ("web-7", (fnv1_32(b"web"), 7)),
            ("web-007", (fnv1_32(b"web"), 7)),
            // Not an ordinal.
            ("web-x", (fnv1_32(b"web-x"), 0)),
            ("web-+1", (fnv1_32(b"web-+1"), 0)),
            ("web-", (fnv1_32(b"web-"), 0)),
            ("web-99999999999", (fnv1_32(b"web-99999999999"), 0)),
            ("", (0, 0)),
        ];
        for (name, want) in cases {
            assert_eq!(pvc_name_hash_and_index(name), *want, "{name:?}");
        }

        // Consecutive replicas of one StatefulSet get consecutive segments.
        let (nodes, csi) = cluster();
        let none: Vec<TopologySelectorTerm> = vec![];
        let first = |pvc: &str| {
            let i = TopologyInputs {
                pvc_name: pvc,
                ..inputs(&nodes, &csi, &none, None, false)
            };
            accessibility_requirements(&i)
                .ok()
                .flatten()
                .and_then(|r| r.preferred.first().cloned())
        };
        let firsts: Vec<_> = (0..3).map(|i| first(&format!("data-web-{i}"))).collect();
        let base = (fnv1_32(b"web") % 3) as usize;
        let expected: Vec<_> = (0..3)
            .map(|i| Some(zones(&["a", "b", "c"])[(base + i) % 3].clone()))
            .collect();
        assert_eq!(firsts, expected);
        // Two claims of the same replica land together.
        assert_eq!(first("data-web-1"), first("logs-web-1"));
    }

    #[test]
    fn immediate_binding_aggregates_every_registered_key_set() {
        use std::collections::BTreeSet;
        // Nodes register different key sets (mid-upgrade): every claim gets
        // the segments of both sets, whatever its name, and a node with the
        // labels of the finer set is offered at both granularities.
        let nodes = vec![
            node("n1", &[(ZONE, "a"), (RACK, "1")]),
            node("n2", &[(ZONE, "b"), (RACK, "2")]),
            node("n3", &[(ZONE, "c")]),
        ];
        let csi = vec![
            csi_node("n1", &[(DRIVER, &[ZONE])]),
            csi_node("n2", &[(DRIVER, &[ZONE, RACK])]),
            csi_node("n3", &[(DRIVER, &[ZONE])]),
        ];
        let none: Vec<TopologySelectorTerm> = vec![];
        let want_requisite = vec![
            seg(&[(ZONE, "a")]),
            seg(&[(ZONE, "b")]),
            seg(&[(ZONE, "c")]),
            seg(&[(RACK, "1"), (ZONE, "a")]),
            seg(&[(RACK, "2"), (ZONE, "b")]),
        ];
        for pvc in ["data", "data-web-0", "x", "y"] {
            let i = TopologyInputs {
                pvc_name: pvc,
                ..inputs(&nodes, &csi, &none, None, false)
            };
            let req = accessibility_requirements(&i)
                .expect("requirement")
                .expect("some");
            assert_eq!(req.requisite, want_requisite, "{pvc}");
            // Preferred is requisite rotated by the claim's hash: the same
            // segments (compared as sorted maps: a segment's own map has no
            // order).
            let canonical = |v: &[Topology]| -> BTreeSet<BTreeMap<String, String>> {
                v.iter()
                    .map(|t| t.segments.clone().into_iter().collect())
                    .collect()
            };
            assert_eq!(req.preferred.len(), want_requisite.len(), "{pvc}");
            assert_eq!(
                canonical(&req.preferred),
                canonical(&want_requisite),
                "{pvc}"
            );
        }
        // A key set no registered node has labels for adds nothing; the
        // others still count.
        let csi = vec![
            csi_node("n1", &[(DRIVER, &[ZONE])]),
            csi_node("n3", &[(DRIVER, &["topology.example.com/row"])]),
        ];
        let req = accessibility_requirements(&inputs(&nodes, &csi, &none, None, false))
            .expect("requirement")
            .expect("some");
        assert_eq!(req.requisite, zones(&["a", "c"]));
        // No set with labels at all: wait, naming every key.
        let csi = vec![csi_node(
            "n3",
            &[(DRIVER, &["topology.example.com/row", RACK])],
        )];
        assert_eq!(
            accessibility_requirements(&inputs(&nodes, &csi, &none, None, false)),
            Err(TopologyError::NoLabeledNodes(vec![
                RACK.into(),
                "topology.example.com/row".into()
            ]))
        );
    }

    #[test]
    fn selected_node_annotation() {
        let claim = |pairs: &[(&str, &str)]| {
            let mut c = PersistentVolumeClaim::default();
            c.metadata.annotations = Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            c
        };
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
        let cases: &[Case] = &[
            (&[], None),
            (&[(SELECTED_NODE_ANNOTATION, "n1")], Some("n1")),
            (&[(ALPHA_SELECTED_NODE_ANNOTATION, "n2")], Some("n2")),
            (
                &[
                    (SELECTED_NODE_ANNOTATION, "n1"),
                    (ALPHA_SELECTED_NODE_ANNOTATION, "n2"),
                ],
                Some("n1"),
            ),
            (&[(SELECTED_NODE_ANNOTATION, "")], None),
        ];
        for (pairs, want) in cases {
            assert_eq!(selected_node(&claim(pairs)), *want, "{pairs:?}");
        }
        assert_eq!(selected_node(&PersistentVolumeClaim::default()), None);
    }
}
