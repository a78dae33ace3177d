//! Which nodes still carry a driver-readiness taint
//! (`csiops.dev/driver-not-ready.<driver>`), for `status.taintedNodes`.
//!
//! The operator watches every Node but keeps only the names of the readiness
//! taints each one carries: Node objects are large (images, conditions), and
//! nothing else of them is needed. A reconcile is triggered only when a node's
//! set of readiness taints changes, not on every status heartbeat.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

use csiops_crds::READINESS_TAINT_PREFIX;

/// Readiness taint keys per node name (nodes without one are absent).
#[derive(Clone, Debug, Default)]
pub struct NodeTaints(Arc<RwLock<BTreeMap<String, BTreeSet<String>>>>);

/// The readiness taint keys of `node`.
pub fn readiness_keys(node: &Node) -> BTreeSet<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.key.starts_with(READINESS_TAINT_PREFIX))
        .map(|t| t.key.clone())
        .collect()
}

/// The Node yielded after a relist changed the map: the mapper ignores
/// which node it is, but the controller makes an `ObjectRef` of it, which
/// needs a name (kube panics on a nameless object).
fn relist_trigger() -> Node {
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some("csiops-readiness-taints-relisted".to_string()),
            ..Default::default()
        },
        ..Default::default()
    }
}

impl NodeTaints {
    /// How many nodes carry `key`.
    pub fn count(&self, key: &str) -> i32 {
        let Ok(map) = self.0.read() else { return 0 };
        map.values().filter(|keys| keys.contains(key)).count() as i32
    }

    /// Records `node`'s keys; `true` when they changed.
    fn apply(&self, node: &Node) -> bool {
        let keys = readiness_keys(node);
        let Ok(mut map) = self.0.write() else {
            return false;
        };
        let name = node.name_any();
        let changed = map.get(&name).cloned().unwrap_or_default() != keys;
        if keys.is_empty() {
            map.remove(&name);
        } else {
            map.insert(name, keys);
        }
        changed
    }

    /// Forgets `node`; `true` when it had keys.
    fn delete(&self, node: &Node) -> bool {
        self.0
            .write()
            .map(|mut map| map.remove(&node.name_any()).is_some())
            .unwrap_or(false)
    }

    /// Replaces everything with a relist's result; `true` when it changed.
    fn replace(&self, fresh: BTreeMap<String, BTreeSet<String>>) -> bool {
        let Ok(mut map) = self.0.write() else {
            return false;
        };
        let changed = *map != fresh;
        *map = fresh;
        changed
    }

    /// Watches every Node, keeping the map current; yields a Node whenever
    /// the readiness taints of the cluster changed (the caller wakes the
    /// CSIDriverDeployments with it).
    pub fn watch(
        &self,
        client: Client,
    ) -> impl Stream<Item = Result<Node, watcher::Error>> + Send + 'static {
        let this = self.clone();
        let mut relist: Option<BTreeMap<String, BTreeSet<String>>> = None;
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
                        let keys = readiness_keys(&node);
                        if let (Some(fresh), false) = (relist.as_mut(), keys.is_empty()) {
                            fresh.insert(node.name_any(), keys);
                        }
                        None
                    }
                    Ok(Event::InitDone) => {
                        let fresh = relist.take().unwrap_or_default();
                        this.replace(fresh).then(|| Ok(relist_trigger()))
                    }
                };
                futures::future::ready(out)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use kube::api::ObjectMeta;

    fn node(name: &str, keys: &[&str]) -> Node {
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
            ..Default::default()
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
    fn counts_only_nodes_carrying_the_key_and_reports_changes() {
        let a = "csiops.dev/driver-not-ready.a.example.com";
        let b = "csiops.dev/driver-not-ready.b.example.com";
        let taints = NodeTaints::default();
        assert!(taints.apply(&node("n1", &[a, "node.kubernetes.io/not-ready"])));
        assert!(taints.apply(&node("n2", &[a, b])));
        assert!(!taints.apply(&node("n3", &["example.com/other"])));
        assert_eq!((taints.count(a), taints.count(b)), (2, 1));

        // A heartbeat that keeps the taints is no change.
        assert!(!taints.apply(&node("n1", &[a])));
        assert!(taints.apply(&node("n2", &[b])));
        assert_eq!((taints.count(a), taints.count(b)), (1, 1));
        assert!(taints.delete(&node("n2", &[])));
        assert!(!taints.delete(&node("n3", &[])));
        assert_eq!(taints.count(b), 0);

        let fresh = BTreeMap::from([("n9".to_string(), BTreeSet::from([b.to_string()]))]);
        assert!(taints.replace(fresh.clone()));
        assert!(!taints.replace(fresh));
        assert_eq!((taints.count(a), taints.count(b)), (0, 1));
    }
}
