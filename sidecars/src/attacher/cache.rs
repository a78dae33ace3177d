//! Read-your-own-writes on top of the reflector caches.
//!
//! A worker that just patched an object gets the new object back from the
//! API server, but the watch event bringing it into the cache may come
//! later. Without this, the key queued again by the event of the first
//! write (say the finalizer) would be processed against the older cached
//! copy, and publish and patch the status a second time. The worker keeps
//! what its writes returned here; a lookup takes whichever of the cached and
//! the written copy is newer, and forgets the written copy once the cache
//! has caught up, so this map only holds objects whose events are in flight.
//!
//! "Newer" compares resourceVersions as integers, which is what they are on
//! every API server backed by etcd; an unparsable one falls back to the cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;

/// A reflector store with the objects this process wrote since.
pub struct Cached<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    store: Store<K>,
    written: Mutex<HashMap<String, Arc<K>>>,
}

fn version<K: Resource>(obj: &K) -> Option<u64> {
    obj.meta().resource_version.as_deref()?.parse().ok()
}

/// Whether `a` is strictly newer than `b`.
fn newer<K: Resource>(a: &K, b: &K) -> bool {
    matches!((version(a), version(b)), (Some(x), Some(y)) if x > y)
}

impl<K> Cached<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    pub fn new(store: Store<K>) -> Self {
        Cached {
            store,
            written: Mutex::new(HashMap::new()),
        }
    }

    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// The newest copy of cluster-scoped object `name` this process knows.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        let cached = self.store.get(&ObjectRef::new(name));
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(mine) = written.get(name).cloned() else {
            return cached;
        };
        match cached {
            Some(c) if !newer(mine.as_ref(), c.as_ref()) => {
                // The cache has caught up (or moved past): stop overlaying.
                written.remove(name);
                Some(c)
            }
            // Not in the cache: either the creation event is in flight, or
            // the object is gone. Deletion is reported by `forget`.
            Some(_) | None => Some(mine),
        }
    }

    /// Records what a write returned.
    pub fn wrote(&self, obj: K) {
        let Some(name) = obj.meta().name.clone() else {
            return;
        };
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        match written.get(&name) {
            Some(prev) if !newer(&obj, prev.as_ref()) => {}
            _ => {
                written.insert(name, Arc::new(obj));
            }
        }
    }

    /// Drops the written copy (the object was deleted).
    pub fn forget(&self, name: &str) {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    /// Objects overlaid right now (for tests and debugging).
    pub fn overlaid(&self) -> usize {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;

    fn pv(name: &str, rv: &str, label: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                labels: Some([("v".to_string(), label.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn label(p: &PersistentVolume) -> String {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("v"))
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn newer_copy_wins_until_the_cache_catches_up() {
        let (reader, mut writer) = store::<PersistentVolume>();
        writer.apply_watcher_event(&Event::Apply(pv("a", "10", "cached")));
        let c = Cached::new(reader);
        assert_eq!(c.get("a").map(|p| label(&p)).as_deref(), Some("cached"));

        c.wrote(pv("a", "12", "mine"));
        assert_eq!(c.get("a").map(|p| label(&p)).as_deref(), Some("mine"));
        // An older write does not replace a newer one.
        c.wrote(pv("a", "11", "older"));
        assert_eq!(c.get("a").map(|p| label(&p)).as_deref(), Some("mine"));

        writer.apply_watcher_event(&Event::Apply(pv("a", "12", "cached-12")));
        assert_eq!(c.get("a").map(|p| label(&p)).as_deref(), Some("cached-12"));
        assert_eq!(c.overlaid(), 0, "overlay dropped once the cache caught up");

        // Unparsable versions: the cache wins.
        c.wrote(pv("a", "x", "mine"));
        assert_eq!(c.get("a").map(|p| label(&p)).as_deref(), Some("cached-12"));

        c.wrote(pv("b", "5", "only-mine"));
        assert_eq!(c.get("b").map(|p| label(&p)).as_deref(), Some("only-mine"));
        c.forget("b");
        assert!(c.get("b").is_none());
    }
}
