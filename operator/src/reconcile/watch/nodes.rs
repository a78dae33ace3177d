//! What the operator knows of each Node: whether it is Ready, cordoned, and
//! which taints it carries (the driver-readiness taints for
//! `status.taintedNodes`; all of them to tell a lost node, and whether the
//! node DaemonSet still wants to run there).
//!
//! Node objects are large (images, conditions, addresses) and a 1000-node
//! cluster sends a heartbeat per node every few seconds, so the watch keeps
//! only a small [`NodeInfo`] per node, and a reconcile is triggered only when
//! that changes (a node lost or back, cordoned, tainted), never on a
//! heartbeat.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

use super::sync::SyncFlag;
use crate::fleet::{NodeInfo, Readiness, TaintInfo};

/// [`NodeInfo`] per node name.
#[derive(Clone, Debug, Default)]
pub struct NodeCache(Arc<RwLock<BTreeMap<String, NodeInfo>>>);

/// The part of `node` the operator uses.
pub fn node_info(node: &Node) -> NodeInfo {
    let spec = node.spec.as_ref();
    let taints = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| TaintInfo {
            key: t.key.clone(),
            value: t.value.clone().filter(|v| !v.is_empty()),
            effect: t.effect.clone(),
        })
        .collect();
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    NodeInfo {
        readiness: match ready.map(|c| c.status.as_str()) {
            Some("True") => Readiness::Ready,
            Some("False") => Readiness::NotReady,
            // A node whose kubelet never reported, or stopped reporting
            // (the node lifecycle controller sets Unknown).
            _ => Readiness::Unknown,
        },
        ready_since: ready
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| crate::rollout::rfc3339_of(&t.0)),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        taints,
    }
}

/// The Node yielded after a relist changed the map: the mapper ignores
/// which node it is, but the controller makes an `ObjectRef` of it, which
/// needs a name (kube panics on a nameless object).
fn relist_trigger() -> Node {
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some("csiops-nodes-relisted".to_string()),
            ..Default::default()
        },
        ..Default::default()
    }
}

impl NodeCache {
    /// How many nodes carry the taint `key`.
    pub fn count_tainted(&self, key: &str) -> i32 {
        let Ok(map) = self.0.read() else { return 0 };
        map.values()
            .filter(|n| n.taints.iter().any(|t| t.key == key))
            .count() as i32
    }

    /// A copy of what is known of every node (a few hundred bytes each).
    pub fn snapshot(&self) -> BTreeMap<String, NodeInfo> {
        self.0.read().map(|m| m.clone()).unwrap_or_default()
    }

    /// Records `node`; `true` when what is kept of it changed.
    fn apply(&self, node: &Node) -> bool {
        let info = node_info(node);
        let Ok(mut map) = self.0.write() else {
            return false;
        };
        let name = node.name_any();
        if map.get(&name) == Some(&info) {
            return false;
        }
        map.insert(name, info);
        true
    }

    /// Forgets `node`; `true` when it was known.
    fn delete(&self, node: &Node) -> bool {
        self.0
            .write()
            .map(|mut map| map.remove(&node.name_any()).is_some())
            .unwrap_or(false)
    }

    /// Replaces everything with a relist's result; `true` when it changed.
    fn replace(&self, fresh: BTreeMap<String, NodeInfo>) -> bool {
        let Ok(mut map) = self.0.write() else {
            return false;
        };
        let changed = *map != fresh;
        *map = fresh;
        changed
    }

    /// Watches every Node, keeping the map current; yields a Node whenever
    /// what is kept of the cluster's nodes changed (the caller wakes the
    /// CSIDriverDeployments with it).
    pub fn watch(
        &self,
        client: Client,
        synced: SyncFlag,
    ) -> impl Stream<Item = Result<Node, watcher::Error>> + Send + 'static {
        let this = self.clone();
        let mut relist: Option<BTreeMap<String, NodeInfo>> = None;
        watcher::watcher(Api::<Node>::all(client), watcher::Config::default())
            .default_backoff()
            .filter_map(move |event| {
                let out = match event {
                    Err(e) => Some(Err(e)),
                    Ok(Event::Apply(node)) => this.apply(&node).then_some(Ok(node)),
                    Ok(Event::Delete(node)) => this.delete(&node).then_some(Ok(node)),
                    Ok(Event::Init) => {
                        relist = Some(BTreeMap::new());
                        None
                    }
                    Ok(Event::InitApply(node)) => {
                        if let Some(fresh) = relist.as_mut() {
                            fresh.insert(node.name_any(), node_info(&node));
                        }
                        None
                    }
                    Ok(Event::InitDone) => {
                        let fresh = relist.take().unwrap_or_default();
                        let changed = this.replace(fresh);
                        synced.mark();
                        changed.then(|| Ok(relist_trigger()))
                    }
                };
                futures::future::ready(out)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csiops_crds::READINESS_TAINT_PREFIX;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;

    /// Whether `key` is a driver-readiness taint (any driver's).
    fn is_readiness_taint(key: &str) -> bool {
        key.starts_with(READINESS_TAINT_PREFIX)
    }

    fn node(name: &str, keys: &[&str], ready: &str, heartbeat: i64) -> Node {
        let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("time"));
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(
                    keys.iter()
                        .map(|k| Taint {
                            key: k.to_string(),
                            effect: "NoSchedule".into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    last_heartbeat_time: Some(at(heartbeat)),
                    last_transition_time: Some(at(1_000)),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_relist_trigger_can_be_referenced() {
        // kube's controller makes an ObjectRef of every trigger; a nameless
        // Node made the operator panic on a cluster with a tainted node.
        let r = kube::runtime::reflector::ObjectRef::from_obj(&relist_trigger());
        assert!(!r.name.is_empty());
    }

    #[test]
    fn counts_tainted_nodes_and_reports_changes_but_not_heartbeats() {
        let a = "csiops.dev/driver-not-ready.a.example.com";
        let b = "csiops.dev/driver-not-ready.b.example.com";
        let cache = NodeCache::default();
        assert!(cache.apply(&node("n1", &[a, "node.kubernetes.io/not-ready"], "True", 1)));
        assert!(cache.apply(&node("n2", &[a, b], "True", 1)));
        assert!(cache.apply(&node("n3", &["example.com/other"], "True", 1)));
        assert_eq!((cache.count_tainted(a), cache.count_tainted(b)), (2, 1));

        // A heartbeat changes nothing that is kept.
        assert!(!cache.apply(&node("n3", &["example.com/other"], "True", 99)));
        // A node going NotReady does.
        assert!(cache.apply(&node("n3", &["example.com/other"], "False", 99)));
        assert_eq!(cache.snapshot()["n3"].readiness, Readiness::NotReady);
        assert!(cache.apply(&node("n2", &[b], "True", 2)));
        assert_eq!((cache.count_tainted(a), cache.count_tainted(b)), (1, 1));
        assert!(cache.delete(&node("n2", &[], "True", 3)));
        assert!(!cache.delete(&node("n2", &[], "True", 3)));
        assert_eq!(cache.count_tainted(b), 0);

        let fresh =
            BTreeMap::from([("n9".to_string(), node_info(&node("n9", &[b], "Unknown", 5)))]);
        assert!(cache.replace(fresh.clone()));
        assert!(!cache.replace(fresh));
        assert_eq!((cache.count_tainted(a), cache.count_tainted(b)), (0, 1));
        assert_eq!(cache.snapshot()["n9"].readiness, Readiness::Unknown);
        assert!(is_readiness_taint(b) && !is_readiness_taint("node.kubernetes.io/not-ready"));
    }
}
