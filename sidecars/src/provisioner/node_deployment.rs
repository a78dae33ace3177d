//! Node deployment (`--node-deployment`): one provisioner per node, beside
//! the driver instance that owns that node's volumes, as external-provisioner
//! v6.3.0 runs it (`cmd/csi-provisioner/csi-provisioner.go`,
//! `pkg/controller/controller.go`). This module holds the decisions, as pure
//! functions; [`super::become_owner`] does the one write they lead to.
//!
//! - **Which claims.** An instance provisions only claims whose
//!   `volume.kubernetes.io/selected-node` names its node (`NODE_NAME`, which
//!   must be set: start-up fails without it). Another node's claim is left
//!   alone, without an Event ([`claim_action`], upstream's `checkNode`).
//! - **Immediate binding.** A claim of a class with `Immediate` binding and
//!   no selected node (with `--node-deployment-immediate-binding`, on by
//!   default) is raced for: every instance whose node fits the class's
//!   `allowedTopologies` waits a per-claim delay ([`owner_delay`]: base ×
//!   2^attempts up to the max, minus a random jitter of up to the base, so the
//!   first wait is 0–20s by default), gives up early once it sees another
//!   node selected, asks its driver whether the volume fits (GetCapacity;
//!   not enough means it stays out, an error means it goes ahead), then
//!   writes its node into the annotation with an update of the claim at the
//!   version it saw. A conflict means someone was faster (or the claim
//!   changed): it waits again, longer. The winner's write brings the claim
//!   back as its own to provision.
//! - **Topology and watches.** Nodes and CSINodes are not watched: the
//!   topology code sees one Node and one CSINode made from the driver's
//!   NodeGetInfo ([`LocalNode::objects`]), so requirements name this node's
//!   segment only (upstream does the same: a Node watch on every node of a
//!   large cluster is what it avoids). VolumeAttachments are watched only
//!   for a driver with PUBLISH_UNPUBLISH_VOLUME ([`watches_attachments`]).
//!   Claims, PVs and classes are watched whole, as upstream: no selector
//!   can tell a node's claims (an annotation) or PVs (an affinity).
//! - **Capacity** (`--enable-capacity`): for this node's segment only,
//!   with managed-by `external-provisioner-<node>` (see
//!   `capacity::objects::managed_by`); the owner is found from `POD_NAME`
//!   by `--capacity-ownerref-level` as centrally (upstream's README
//!   suggests 1, the DaemonSet; 0 makes it the pod).
//! - **Deletion.** A Released PV is deleted only by the instance whose
//!   driver's accessible topology satisfies the PV's node affinity
//!   ([`LocalNode::holds`], upstream's `VolumeIsAccessible`): not the Node's
//!   labels, the driver's own NodeGetInfo answer. A driver that reports no
//!   topology, or a PV without affinity, is everybody's, as upstream.
//! - **No leader election**: every instance works at once; a
//!   `--leader-election` given anyway is ignored with a warning.
//! - **Leak-free per node.** Each node keeps its own intent journal (see
//!   [`super::journal::node_journal_name`]) and its own claim finalizer for
//!   the fallback without one ([`claim_finalizer`]); a node's sweep only
//!   reads its own journal, and cleans up what its own driver may hold.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use csiops_proto::csi::v1::NodeGetInfoResponse;
use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::time::Instant;

use super::capabilities::DriverCapabilities;
use super::decide::{ClaimAction, VolumeAction};
use super::naming::bounded_name;
use super::plan::{Cluster, ProvisionerConfig};
use super::topology::{self, TopologyInputs, SELECTED_NODE_ANNOTATION};
use crate::common::workqueue::Backoff;

/// The environment variable naming the node (upstream's).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// How long a claim this node stayed out of (its driver had no room) waits
/// before the next look: upstream looks again when its claim informer
/// resyncs, every 15 minutes.
pub const RECHECK: Duration = Duration::from_secs(15 * 60);

/// Why node deployment cannot start.
#[derive(Debug, thiserror::Error)]
pub enum NodeDeploymentError {
    #[error("--node-deployment needs the {NODE_NAME_ENV} environment variable: the name of the node this provisioner runs on (set it from the downward API, spec.nodeName)")]
    NoNodeName,
}

/// The `--node-deployment*` flags with the node's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDeployment {
    pub node_name: String,
    /// `--node-deployment-immediate-binding` (default true).
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay` (default 20s).
    pub base_delay: Duration,
    /// `--node-deployment-max-delay` (default 60s).
    pub max_delay: Duration,
}

/// A node's provisioner at work: its node as the driver describes it, its
/// flags, and the races it is in.
pub struct ThisNode {
    pub local: LocalNode,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// This node's claim finalizer ([`claim_finalizer`]).
    pub finalizer: String,
    pub races: Races,
}

impl ThisNode {
    pub fn new(deployment: &NodeDeployment, local: LocalNode) -> ThisNode {
        ThisNode {
            finalizer: claim_finalizer(&local.name),
            local,
            immediate_binding: deployment.immediate_binding,
            races: Races::new(deployment.base_delay, deployment.max_delay),
        }
    }

    pub fn name(&self) -> &str {
        &self.local.name
    }

    /// Where the cached PV is. One whose affinity cannot be read is not
    /// taken for this node's (the clean-up then reads it again, and says
    /// why it cannot go on).
    pub fn pv_seen(&self, pv: Option<&PersistentVolume>) -> PvSeen {
        match pv.map(|pv| self.local.holds(pv)) {
            None => PvSeen::Absent,
            Some(Ok(true)) => PvSeen::Here,
            Some(_) => PvSeen::Elsewhere,
        }
    }

    pub fn view(&self, pv: PvSeen) -> View<'_> {
        View {
            node: self.name(),
            immediate_binding: self.immediate_binding,
            finalizer: &self.finalizer,
            pv,
        }
    }

    /// `claim` as if this node were selected: what the requests made here
    /// (the capacity check before claiming, the clean-up of a claim that
    /// moved away) are computed from, as upstream passes its own node.
    pub fn as_selected(&self, claim: &PersistentVolumeClaim) -> PersistentVolumeClaim {
        let mut claim = claim.clone();
        claim
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                SELECTED_NODE_ANNOTATION.to_string(),
                self.name().to_string(),
            );
        claim
    }
}

/// Whether the class's `allowedTopologies` admit this node, as upstream
/// finds out before racing for a claim: by computing the requirement with
/// this node selected. Without allowed topologies or topology support
/// there is nothing to check.
pub fn fits_allowed_topologies(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    config: &ProvisionerConfig,
    caps: DriverCapabilities,
    cluster: Cluster<'_>,
    node: &str,
) -> bool {
    let allowed = class.allowed_topologies.as_deref().unwrap_or_default();
    if allowed.is_empty() || !caps.topology {
        return true;
    }
    topology::accessibility_requirements(&TopologyInputs {
        supports_topology: true,
        driver: &config.driver_name,
        pvc_name: claim.metadata.name.as_deref().unwrap_or_default(),
        strict_topology: config.strict_topology,
        immediate_topology: config.immediate_topology,
        allowed_topologies: allowed,
        selected_node: Some(node),
        nodes: cluster.nodes,
        csi_nodes: cluster.csi_nodes,
    })
    .is_ok()
}

/// Whether the provisioner watches VolumeAttachments (to hold a deletion
/// until the volume is detached). On a node only when the driver has
/// PUBLISH_UNPUBLISH_VOLUME, as upstream decides it everywhere: without it
/// there is nothing to wait for, and a thousand nodes need not each watch
/// every attachment of the cluster. Centrally always, as before.
pub fn watches_attachments(on_node: bool, caps: DriverCapabilities) -> bool {
    !on_node || caps.publish_unpublish
}

/// A topology segment: the driver's keys and this node's values.
pub type Segment = BTreeMap<String, String>;

/// This node as its driver describes it (NodeGetInfo): all a node's
/// provisioner knows of topology.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LocalNode {
    pub name: String,
    pub node_id: String,
    /// The accessible topology; `None` when the driver reports none.
    pub segment: Option<Segment>,
}

impl LocalNode {
    pub fn new(name: &str, info: &NodeGetInfoResponse) -> LocalNode {
        LocalNode {
            name: name.to_string(),
            node_id: info.node_id.clone(),
            segment: info
                .accessible_topology
                .as_ref()
                .map(|t| t.segments.clone().into_iter().collect()),
        }
    }

    /// The Node and CSINode the topology code sees in place of the cluster's
    /// (upstream's static objects): the Node labelled with the segment, the
    /// CSINode listing the driver with the segment's keys.
    pub fn objects(&self, driver: &str) -> (Node, CSINode) {
        let segment = self.segment.clone().unwrap_or_default();
        let keys: Vec<String> = segment.keys().cloned().collect();
        let meta = ObjectMeta {
            name: Some(self.name.clone()),
            ..Default::default()
        };
        let node = Node {
            metadata: ObjectMeta {
                labels: self.segment.is_some().then_some(segment),
                ..meta.clone()
            },
            ..Default::default()
        };
        let csi_node = CSINode {
            metadata: meta,
            spec: CSINodeSpec {
                drivers: vec![CSINodeDriver {
                    name: driver.to_string(),
                    node_id: self.node_id.clone(),
                    topology_keys: (!keys.is_empty()).then_some(keys),
                    allocatable: None,
                }],
            },
        };
        (node, csi_node)
    }

    /// Whether the PV's volume lives here: its node affinity holds for this
    /// node's segment. No segment, or no required affinity: yes (upstream's
    /// `VolumeIsAccessible`).
    pub fn holds(&self, pv: &PersistentVolume) -> Result<bool, AffinityError> {
        let Some(segment) = &self.segment else {
            return Ok(true);
        };
        let required = pv
            .spec
            .as_ref()
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref());
        match required {
            None => Ok(true),
            Some(selector) => matches_terms(&selector.node_selector_terms, segment),
        }
    }
}

/// A node affinity term that cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid node affinity of the PV: {0}")]
pub struct AffinityError(String);

/// The Node's labels against the PV's terms (ORed; each term's requirements
/// ANDed), as `MatchNodeSelectorTerms` evaluates them for upstream's
/// nameless Node: an empty term matches nothing, `matchFields` are checked
/// for form but match (the Node has no name to compare), a malformed term
/// is an error unless another term matches.
fn matches_terms(
    terms: &[k8s_openapi::api::core::v1::NodeSelectorTerm],
    labels: &Segment,
) -> Result<bool, AffinityError> {
    let mut errors = Vec::new();
    for term in terms {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            continue;
        }
        let mut bad: Vec<String> = exprs.iter().filter_map(label_error).collect();
        bad.extend(fields.iter().filter_map(field_error));
        if !bad.is_empty() {
            errors.extend(bad);
            continue;
        }
        if exprs.iter().all(|r| label_matches(r, labels)) {
            return Ok(true);
        }
    }
    if errors.is_empty() {
        Ok(false)
    } else {
        Err(AffinityError(errors.join("; ")))
    }
}

fn values(r: &NodeSelectorRequirement) -> &[String] {
    r.values.as_deref().unwrap_or_default()
}

/// What `labels.NewRequirement` refuses (key syntax aside).
fn label_error(r: &NodeSelectorRequirement) -> Option<String> {
    let n = values(r).len();
    let ok = match r.operator.as_str() {
        "In" | "NotIn" => n > 0,
        "Exists" | "DoesNotExist" => n == 0,
        "Gt" | "Lt" => n == 1 && values(r)[0].parse::<i64>().is_ok(),
        _ => false,
    };
    (!ok).then(|| format!("{} {} {:?}", r.key, r.operator, values(r)))
}

fn field_error(r: &NodeSelectorRequirement) -> Option<String> {
    let ok = matches!(r.operator.as_str(), "In" | "NotIn") && values(r).len() == 1;
    (!ok).then(|| format!("field {} {} {:?}", r.key, r.operator, values(r)))
}

fn label_matches(r: &NodeSelectorRequirement, labels: &Segment) -> bool {
    let value = labels.get(&r.key);
    let number = |s: &str| s.parse::<i64>().ok();
    let bound = values(r).first().and_then(|v| number(v));
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values(r).contains(v)),
        "NotIn" => value.is_none_or(|v| !values(r).contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!((value.and_then(|v| number(v)), bound), (Some(v), Some(b)) if v > b),
        "Lt" => matches!((value.and_then(|v| number(v)), bound), (Some(v), Some(b)) if v < b),
        _ => false,
    }
}

/// The claim finalizer of this node's provisioner (the fallback without a
/// journal): one per node, so that only the node that may hold a volume
/// cleans up after it. The name part stays within a qualified name's 63
/// characters ([`bounded_name`]).
pub fn claim_finalizer(node: &str) -> String {
    format!(
        "csiops.dev/{}",
        bounded_name("volume-provisioning", node, 63)
    )
}

/// The claim's selected node as upstream's `checkNode` reads it: the GA
/// annotation only.
pub fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(SELECTED_NODE_ANNOTATION)
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// Where the claim's PV is, as far as the cache tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PvSeen {
    /// Not in the cache.
    Absent,
    /// Its affinity holds for this node: it carries this node's volume.
    Here,
    /// Another node's driver made it.
    Elsewhere,
}

/// What a node's provisioner sees of a claim besides the claim and class.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub node: &'a str,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// This node's claim finalizer ([`claim_finalizer`]).
    pub finalizer: &'a str,
    pub pv: PvSeen,
}

/// The node deployment's decision for a claim, from the one a central
/// provisioner would take (`central`, computed with the PV found anywhere
/// and this node's finalizer):
/// - with this node's finalizer on the claim, a volume may exist here:
///   the claim is provisioned on if it is still this node's, else cleaned up
///   (which reads claim and PV from the server first);
/// - a claim selected for this node is provisioned as centrally;
/// - another node's claim is left alone;
/// - an unselected claim of an Immediate class is raced for
///   ([`ClaimAction::BecomeOwner`]) when immediate binding is on;
/// - a missing class is retried without an Event unless the claim is this
///   node's: upstream retries it quietly on every node, and an Event from
///   each would flood the claim.
pub fn claim_action(
    central: ClaimAction,
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    view: View<'_>,
) -> ClaimAction {
    let ours = claim
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == view.finalizer));
    let selected = selected_node(claim);
    let here = selected == Some(view.node);
    match central {
        ClaimAction::Nothing(why) => ClaimAction::Nothing(why),
        ClaimAction::CleanUp => ClaimAction::CleanUp,
        // Only a PV of this node's volume lets the finalizer go unasked.
        ClaimAction::ReleaseClaim if view.pv == PvSeen::Here => ClaimAction::ReleaseClaim,
        ClaimAction::ReleaseClaim => ClaimAction::CleanUp,
        ClaimAction::Provision | ClaimAction::ClassMissing(_) if ours && !here => {
            ClaimAction::CleanUp
        }
        action @ (ClaimAction::Provision | ClaimAction::ClassMissing(_)) if here => action,
        ClaimAction::Provision | ClaimAction::ClassMissing(_) if selected.is_some() => {
            ClaimAction::Nothing("another node is selected")
        }
        ClaimAction::ClassMissing(_) => {
            ClaimAction::RetryQuietly("the StorageClass is missing (no node selected yet)")
        }
        ClaimAction::Provision => {
            let immediate = class
                .and_then(|c| c.volume_binding_mode.as_deref())
                .is_some_and(|m| m == "Immediate");
            if immediate && view.immediate_binding {
                ClaimAction::BecomeOwner
            } else {
                ClaimAction::Nothing("no node selected")
            }
        }
        action @ (ClaimAction::BecomeOwner | ClaimAction::RetryQuietly(_)) => action,
    }
}

/// The node deployment's decision for a PV, from the central one and
/// whether this node's driver holds its volume ([`LocalNode::holds`]): only
/// that node deletes it (upstream's `Delete`). Taking the protection
/// finalizer off a Retain PV is left to any node, as upstream's library
/// does it on every instance: the volume is not touched, and a PV of a node
/// that is gone still loses it.
pub fn volume_action(central: VolumeAction, here: bool) -> VolumeAction {
    match central {
        VolumeAction::Delete if !here => VolumeAction::Nothing("the volume is on another node"),
        action => action,
    }
}

/// The wait before attempt number `attempts + 1` to become a claim's owner
/// (upstream's rate limiter with jitter): `base × 2^attempts`, at most
/// `max`, minus `jitter × base` (`jitter` in [0, 1)), never below zero.
pub fn owner_delay(attempts: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let delay = Backoff { start: base, max }.delay(attempts);
    let off = base.mul_f64(jitter.clamp(0.0, 1.0));
    delay.saturating_sub(off)
}

/// A number in [0, 1) that differs per call and per process (std's
/// randomly keyed hasher; the jitter needs no stronger randomness).
fn jitter() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    // 53 bits: exactly representable, and below 1.
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// One claim's race.
#[derive(Debug, Clone, Copy, Default)]
struct Race {
    /// Attempts so far (the delay doubles with each).
    attempts: u32,
    /// When the current wait ends.
    due: Option<Instant>,
}

/// Where a claim's race stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// No wait started: start one ([`Races::wait`]).
    Start,
    /// Waiting; look again in this long.
    Wait(Duration),
    /// The wait is over: try now.
    Now,
}

/// The races this node is in, by claim UID. Instead of holding a worker
/// for the wait (upstream sleeps in its worker), the claim is queued again
/// for when its wait ends; an update meanwhile (another node selected) ends
/// the race early.
pub struct Races {
    base: Duration,
    max: Duration,
    claims: Mutex<HashMap<String, Race>>,
}

impl Races {
    pub fn new(base: Duration, max: Duration) -> Races {
        Races {
            base,
            max,
            claims: Mutex::new(HashMap::new()),
        }
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, Race>> {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the race for `uid` stands at `now`; a wait that is over is
    /// cleared (the attempt count stays).
    pub fn turn(&self, uid: &str, now: Instant) -> Turn {
        let mut claims = self.claims();
        let Some(race) = claims.get_mut(uid) else {
            return Turn::Start;
        };
        match race.due {
            None => Turn::Start,
            Some(due) if now < due => Turn::Wait(due - now),
            Some(_) => {
                race.due = None;
                Turn::Now
            }
        }
    }

    /// Starts the next wait for `uid`, returns its length.
    pub fn wait(&self, uid: &str, now: Instant) -> Duration {
        self.wait_with(uid, now, jitter())
    }

    fn wait_with(&self, uid: &str, now: Instant, jitter: f64) -> Duration {
        let mut claims = self.claims();
        let race = claims.entry(uid.to_string()).or_default();
        let delay = owner_delay(race.attempts, self.base, self.max, jitter);
        race.attempts = race.attempts.saturating_add(1);
        race.due = Some(now + delay);
        delay
    }

    /// Ends the race for `uid`: won, lost, or the claim is gone. The next
    /// race for it starts from the base delay again.
    pub fn forget(&self, uid: &str) {
        self.claims().remove(uid);
    }

    /// How many waits the race for `uid` has started (0: none).
    pub fn attempts(&self, uid: &str) -> u32 {
        self.claims().get(uid).map_or(0, |r| r.attempts)
    }

    /// Races in progress (for tests and debugging).
    pub fn len(&self) -> usize {
        self.claims().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod sync_tests;

#[cfg(test)]
mod tests;
