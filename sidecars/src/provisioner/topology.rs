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
mod tests;
