//! Which drivers each node's CSINode lists, for registration in status.
//!
//! A CSINode carries every driver of its node (20 drivers on 1000 nodes:
//! 20 000 entries with their topology keys and allocatable counts), and
//! changes whenever any driver's registrar or kubelet touches it. The watch
//! keeps only the driver names per node and wakes only the objects whose
//! driver was added to or removed from a node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::storage::v1::CSINode;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

use super::sync::SyncFlag;

/// What changed: the drivers added to or removed from some node, or
/// everything (after a relist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    Drivers(BTreeSet<String>),
    All,
}

/// Driver names per node.
#[derive(Clone, Debug, Default)]
pub struct CsiNodeDrivers(Arc<RwLock<BTreeMap<String, BTreeSet<String>>>>);

fn drivers(csinode: &CSINode) -> BTreeSet<String> {
    csinode
        .spec
        .drivers
        .iter()
        .map(|d| d.name.clone())
        .collect()
}

impl CsiNodeDrivers {
    /// The nodes whose CSINode lists `driver`.
    pub fn registered(&self, driver: &str) -> BTreeSet<String> {
        self.0
            .read()
            .map(|m| {
                m.iter()
                    .filter(|(_, ds)| ds.contains(driver))
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Records `node`'s drivers; the ones added or removed.
    fn set(&self, node: String, now: BTreeSet<String>) -> BTreeSet<String> {
        let Ok(mut map) = self.0.write() else {
            return BTreeSet::new();
        };
        let before = map.get(&node).cloned().unwrap_or_default();
        let changed: BTreeSet<String> = before.symmetric_difference(&now).cloned().collect();
        if now.is_empty() {
            map.remove(&node);
        } else {
            map.insert(node, now);
        }
        changed
    }

    /// Watches every CSINode; yields what changed.
    pub fn watch(
        &self,
        client: Client,
        synced: SyncFlag,
    ) -> impl Stream<Item = Result<Changed, watcher::Error>> + Send + 'static {
        let this = self.clone();
        let mut relist: Option<BTreeMap<String, BTreeSet<String>>> = None;
        watcher::watcher(Api::<CSINode>::all(client), watcher::Config::default())
            .default_backoff()
            .filter_map(move |event| {
                let out = match event {
                    Err(e) => Some(Err(e)),
                    Ok(Event::Apply(c)) => {
                        let changed = this.set(c.name_any(), drivers(&c));
                        (!changed.is_empty()).then_some(Ok(Changed::Drivers(changed)))
                    }
                    Ok(Event::Delete(c)) => {
                        let changed = this.set(c.name_any(), BTreeSet::new());
                        (!changed.is_empty()).then_some(Ok(Changed::Drivers(changed)))
                    }
                    Ok(Event::Init) => {
                        relist = Some(BTreeMap::new());
                        None
                    }
                    Ok(Event::InitApply(c)) => {
                        if let Some(fresh) = relist.as_mut() {
                            fresh.insert(c.name_any(), drivers(&c));
                        }
                        None
                    }
                    Ok(Event::InitDone) => {
                        let fresh = relist.take().unwrap_or_default();
                        let changed = this
                            .0
                            .write()
                            .map(|mut m| {
                                let changed = *m != fresh;
                                *m = fresh;
                                changed
                            })
                            .unwrap_or(false);
                        synced.mark();
                        changed.then_some(Ok(Changed::All))
                    }
                };
                futures::future::ready(out)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn reports_only_the_drivers_that_came_or_went() {
        let c = CsiNodeDrivers::default();
        assert_eq!(c.set("n1".into(), names(&["a", "b"])), names(&["a", "b"]));
        // The same drivers again (an allocatable or topology update): nothing.
        assert!(c.set("n1".into(), names(&["a", "b"])).is_empty());
        assert_eq!(c.set("n1".into(), names(&["a", "c"])), names(&["b", "c"]));
        c.set("n2".into(), names(&["c"]));
        assert_eq!(c.registered("c"), names(&["n1", "n2"]));
        assert_eq!(c.registered("b"), BTreeSet::new());
        assert_eq!(c.set("n2".into(), BTreeSet::new()), names(&["c"]));
        assert_eq!(c.registered("c"), names(&["n1"]));
    }
}
