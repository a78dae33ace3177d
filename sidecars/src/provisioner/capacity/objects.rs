//! The pure part of capacity publishing: what should exist, what exists
//! and is ours, and what to write. Every function is a function of its
//! inputs (cache snapshots), tested with exact expectations.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use csiops_proto::csi::v1::{GetCapacityRequest, GetCapacityResponse, Topology};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use crate::provisioner::quantity;

/// Label naming the driver of an object (upstream's `DriverNameLabel`).
pub const DRIVER_NAME_LABEL: &str = "csi.storage.k8s.io/drivername";
/// Label naming the instance managing an object (upstream's `ManagedByLabel`).
pub const MANAGED_BY_LABEL: &str = "csi.storage.k8s.io/managed-by";
/// Upstream's managed-by value for a central (non node-deployment)
/// provisioner; keeping it lets either implementation adopt the other's
/// objects when a manifest swaps the image.
pub const MANAGED_BY: &str = "external-provisioner";

/// The managed-by value of this instance: [`MANAGED_BY`] centrally,
/// `external-provisioner-<node>` for a node's provisioner, within a label
/// value's 63 characters exactly as upstream cuts it
/// ([`bounded_name`](crate::provisioner::naming::bounded_name)), so that
/// each node manages its own objects and ours and upstream's agree.
pub fn managed_by(node: Option<&str>) -> String {
    match node {
        None => MANAGED_BY.to_string(),
        Some(node) => crate::provisioner::naming::bounded_name(MANAGED_BY, node, 63),
    }
}
/// `generateName` of created objects, as upstream.
pub const GENERATE_NAME: &str = "csisc-";
/// Reserved StorageClass parameter prefix, never passed to the driver.
const RESERVED_PREFIX: &str = "csi.storage.k8s.io/";

/// A topology segment: the driver's topology keys and one node's values.
/// Empty for a driver without topology: one segment, every node.
pub type Segment = BTreeMap<String, String>;

/// One (segment, class) pair whose capacity is published.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkItem {
    pub segment: Segment,
    pub class: String,
}

/// The segments to publish for, as upstream's `nodeTopology.sync`: for every
/// CSINode that lists `driver`, the values of the driver's topology keys in
/// the labels of the Node of the same name; a node missing a label (the
/// registrar has not written it yet) or a CSINode without a Node is skipped.
/// Without topology (no VOLUME_ACCESSIBILITY_CONSTRAINTS, or the Topology
/// gate off) the storage is the same from every node: one empty segment,
/// whatever the nodes.
pub fn segments(
    driver: &str,
    topology: bool,
    csi_nodes: &[Arc<CSINode>],
    node: impl Fn(&str) -> Option<Arc<Node>>,
) -> BTreeSet<Segment> {
    if !topology {
        return BTreeSet::from([Segment::new()]);
    }
    let mut out = BTreeSet::new();
    'nodes: for csi_node in csi_nodes {
        let Some(entry) = csi_node.spec.drivers.iter().find(|d| d.name == driver) else {
            continue;
        };
        let Some(name) = csi_node.metadata.name.as_deref() else {
            continue;
        };
        let Some(node) = node(name) else { continue };
        let labels = node.metadata.labels.as_ref();
        let mut segment = Segment::new();
        for key in entry.topology_keys.iter().flatten() {
            match labels.and_then(|l| l.get(key)) {
                Some(value) => {
                    segment.insert(key.clone(), value.clone());
                }
                None => continue 'nodes,
            }
        }
        out.insert(segment);
    }
    out
}

/// The driver's classes to publish for, with their parameters: those with
/// `provisioner: driver` and WaitForFirstConsumer binding, or any binding
/// with `--capacity-for-immediate-binding`. An unset mode is Immediate (the
/// API server's default).
pub fn tracked_classes(
    driver: &str,
    immediate: bool,
    classes: &[Arc<StorageClass>],
) -> BTreeMap<String, BTreeMap<String, String>> {
    classes
        .iter()
        .filter(|c| c.provisioner == driver)
        .filter(|c| immediate || c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"))
        .filter_map(|c| {
            let name = c.metadata.name.clone()?;
            Some((name, c.parameters.clone().unwrap_or_default()))
        })
        .collect()
}

/// Every pair to publish: segments × classes.
pub fn desired(
    segments: &BTreeSet<Segment>,
    classes: &BTreeMap<String, BTreeMap<String, String>>,
) -> BTreeSet<WorkItem> {
    segments
        .iter()
        .flat_map(|s| {
            classes.keys().map(|c| WorkItem {
                segment: s.clone(),
                class: c.clone(),
            })
        })
        .collect()
}

/// Whether this instance (`managed_by`, see [`managed_by`]) manages `obj`:
/// both labels, as upstream's `isManaged`. The owner is not part of it: an
/// object of ours whose owner changed (a new Deployment) is adopted and gets
/// the new owner added.
pub fn is_managed(obj: &CSIStorageCapacity, driver: &str, managed_by: &str) -> bool {
    let labels = obj.metadata.labels.as_ref();
    labels
        .and_then(|l| l.get(DRIVER_NAME_LABEL))
        .map(String::as_str)
        == Some(driver)
        && labels
            .and_then(|l| l.get(MANAGED_BY_LABEL))
            .map(String::as_str)
            == Some(managed_by)
}

/// The pair an object serves: its class and its node topology's
/// `matchLabels` (an unset or empty map is the empty segment). An object
/// with `matchExpressions` or without a node topology serves none of ours.
pub fn item_of(obj: &CSIStorageCapacity) -> Option<WorkItem> {
    let topology = obj.node_topology.as_ref()?;
    if topology
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return None;
    }
    Some(WorkItem {
        segment: topology.match_labels.clone().unwrap_or_default(),
        class: obj.storage_class_name.clone(),
    })
}

/// Existing managed objects matched with the pairs to publish.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Assignment {
    /// The object that serves each pair that has one.
    pub objects: HashMap<WorkItem, Arc<CSIStorageCapacity>>,
    /// Names of managed objects that serve no pair (class or segment gone,
    /// or a duplicate): to delete.
    pub obsolete: BTreeSet<String>,
}

/// Matches `managed` (objects [`is_managed`] accepted) with `desired`. Of
/// duplicates for one pair the oldest is kept (then the first by name), so
/// every pass picks the same one.
pub fn assign(desired: &BTreeSet<WorkItem>, managed: &[Arc<CSIStorageCapacity>]) -> Assignment {
    let mut sorted: Vec<&Arc<CSIStorageCapacity>> = managed.iter().collect();
    sorted.sort_by(|a, b| {
        let key = |o: &CSIStorageCapacity| {
            (
                o.metadata.creation_timestamp.as_ref().map(|t| t.0),
                o.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut out = Assignment::default();
    for obj in sorted {
        let Some(name) = obj.metadata.name.clone() else {
            continue;
        };
        match item_of(obj).filter(|i| desired.contains(i)) {
            Some(item) if !out.objects.contains_key(&item) => {
                out.objects.insert(item, obj.clone());
            }
            _ => {
                out.obsolete.insert(name);
            }
        }
    }
    out
}

/// The GetCapacity request for a pair: the class's parameters without the
/// reserved `csi.storage.k8s.io/` keys (the same parameters CreateVolume
/// gets; secrets' names are not the driver's business), and the segment as
/// accessible topology unless it is empty (a driver without topology gets
/// none). No volume capabilities: capacity is assumed independent of them,
/// as upstream.
pub fn request(item: &WorkItem, params: &BTreeMap<String, String>) -> GetCapacityRequest {
    GetCapacityRequest {
        volume_capabilities: Vec::new(),
        parameters: params
            .iter()
            .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        accessible_topology: (!item.segment.is_empty()).then(|| Topology {
            segments: item.segment.clone().into_iter().collect(),
        }),
    }
}

/// What GetCapacity answered, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    pub capacity: i64,
    pub maximum_volume_size: Option<i64>,
}

impl From<&GetCapacityResponse> for Reported {
    fn from(r: &GetCapacityResponse) -> Self {
        Reported {
            capacity: r.available_capacity,
            maximum_volume_size: r.maximum_volume_size,
        }
    }
}

/// A new object for a pair, named by the API server from `csisc-`.
pub fn render(
    driver: &str,
    managed_by: &str,
    namespace: &str,
    owner: Option<&OwnerReference>,
    item: &WorkItem,
    reported: Reported,
) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta {
            generate_name: Some(GENERATE_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (DRIVER_NAME_LABEL.to_string(), driver.to_string()),
                (MANAGED_BY_LABEL.to_string(), managed_by.to_string()),
            ])),
            owner_references: owner.map(|o| vec![o.clone()]),
            ..Default::default()
        },
        storage_class_name: item.class.clone(),
        node_topology: Some(LabelSelector {
            match_labels: Some(item.segment.clone()),
            match_expressions: None,
        }),
        capacity: Some(quantity::from_bytes(reported.capacity)),
        maximum_volume_size: reported.maximum_volume_size.map(quantity::from_bytes),
    }
}

/// Whether `owner` controls `obj` (`IsControlledBy` by UID, as upstream).
fn owned_by(obj: &CSIStorageCapacity, owner: &OwnerReference) -> bool {
    obj.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == owner.uid)
}

/// The existing object updated to `reported`, or `None` when it already
/// says that (sizes compared as numbers, so `1Gi` equals `1073741824`) and
/// has the owner. A missing owner is added next to the others, as upstream.
pub fn updated(
    obj: &CSIStorageCapacity,
    owner: Option<&OwnerReference>,
    reported: Reported,
) -> Option<CSIStorageCapacity> {
    let bytes = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.map(|q| quantity::to_bytes(q).ok())
    };
    let same_capacity = bytes(obj.capacity.as_ref()) == Some(Some(reported.capacity));
    let same_max =
        bytes(obj.maximum_volume_size.as_ref()) == reported.maximum_volume_size.map(Some);
    let owned = owner.is_none_or(|o| owned_by(obj, o));
    if same_capacity && same_max && owned {
        return None;
    }
    let mut new = obj.clone();
    new.capacity = Some(quantity::from_bytes(reported.capacity));
    new.maximum_volume_size = reported.maximum_volume_size.map(quantity::from_bytes);
    if let Some(o) = owner.filter(|o| !owned_by(obj, o)) {
        new.metadata
            .owner_references
            .get_or_insert_with(Vec::new)
            .push(o.clone());
    }
    // Managed fields are not ours to send back.
    new.metadata.managed_fields = None;
    Some(new)
}

/// Which published pairs a new or deleted volume may have changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    /// The segments of the PV's node affinity (each term one segment).
    Segments(Vec<Segment>),
    /// A PV without node affinity: its class's pairs (a driver without
    /// topology whose classes select pools).
    Class(String),
    /// Nothing to tell.
    Unknown,
}

/// What a PV of the driver touches: upstream refreshes by node affinity
/// after a provision or delete, and by class when there is none. A term
/// that is not `key In [one value]` only (not what a provisioner writes) is
/// skipped.
pub fn touched(pv: &PersistentVolume) -> Touched {
    let spec = pv.spec.as_ref();
    let terms = spec
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    if terms.is_empty() {
        return match spec.and_then(|s| s.storage_class_name.clone()) {
            Some(c) if !c.is_empty() => Touched::Class(c),
            _ => Touched::Unknown,
        };
    }
    let segments = terms
        .iter()
        .filter(|t| t.match_fields.as_ref().is_none_or(Vec::is_empty))
        .filter_map(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .map(|e| match e.values.as_deref() {
                    Some([value]) if e.operator == "In" => Some((e.key.clone(), value.clone())),
                    _ => None,
                })
                .collect::<Option<Segment>>()
        })
        .collect();
    Touched::Segments(segments)
}

/// The desired pairs `touched` names.
pub fn to_refresh<'a>(
    desired: &'a BTreeSet<WorkItem>,
    touched: &'a Touched,
) -> impl Iterator<Item = &'a WorkItem> + 'a {
    desired.iter().filter(move |i| match touched {
        Touched::Segments(s) => s.contains(&i.segment),
        Touched::Class(c) => &i.class == c,
        Touched::Unknown => false,
    })
}

/// What the planner saw on its previous pass.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Seen {
    pub started: bool,
    /// Desired pairs without an object.
    pub missing: BTreeSet<WorkItem>,
    /// Names of obsolete objects.
    pub obsolete: BTreeSet<String>,
    /// The driver's PVs and what each touches.
    pub volumes: HashMap<String, Touched>,
}

/// What one planner pass queues.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Queued {
    pub sync: BTreeSet<WorkItem>,
    pub delete: BTreeSet<String>,
}

/// The work of one planner pass, and what it saw for the next. `poll`
/// (the first pass and every `--capacity-poll-interval`) syncs every pair.
/// Otherwise only changes are queued: a pair newly without an object (new
/// class or segment, or its object deleted by someone), an object newly
/// obsolete, the pairs a PV that appeared or went touches. A pair whose
/// sync keeps failing stays missing and is retried by its backoff, not
/// queued again every pass; the first pass takes the PVs as they are.
pub fn changes(
    desired: &BTreeSet<WorkItem>,
    assignment: &Assignment,
    volumes: HashMap<String, Touched>,
    poll: bool,
    seen: &Seen,
) -> (Queued, Seen) {
    let missing: BTreeSet<WorkItem> = desired
        .iter()
        .filter(|i| !assignment.objects.contains_key(*i))
        .cloned()
        .collect();
    let mut sync: BTreeSet<WorkItem> = if poll {
        desired.clone()
    } else {
        missing.difference(&seen.missing).cloned().collect()
    };
    if seen.started {
        let appeared = volumes
            .iter()
            .filter(|(name, _)| !seen.volumes.contains_key(*name));
        let went = seen
            .volumes
            .iter()
            .filter(|(name, _)| !volumes.contains_key(*name));
        for (_, t) in appeared.chain(went) {
            sync.extend(to_refresh(desired, t).cloned());
        }
    }
    let delete = assignment
        .obsolete
        .difference(&seen.obsolete)
        .cloned()
        .collect();
    let next = Seen {
        started: true,
        missing,
        obsolete: assignment.obsolete.clone(),
        volumes,
    };
    (Queued { sync, delete }, next)
}

#[cfg(test)]
mod tests;
