//! Read-your-own-writes on top of the reflector caches, for every
//! controller sidecar.
//!
//! A worker that just wrote an object gets the new object back from the API
//! server, but the watch event bringing it into the cache may come later.
//! Without this, the key queued again by the event of the first write (say
//! the finalizer) would be processed against the older cached copy, and
//! publish and patch the status a second time, or provision or delete a
//! second time. The worker records what its writes returned ([`Cached::wrote`])
//! and what it deleted ([`Cached::deleted`]); a lookup prefers that record
//! until the cache shows it, and then forgets it, so the record only holds
//! objects whose events are in flight.
//!
//! resourceVersions are opaque: the API only promises that equal versions
//! mean the same object, so "the cache shows our write" is equality of the
//! cached version with the written one, never a comparison: the watch
//! handler passes every event to [`Cached::observe`], and the one carrying
//! our version ends the record even if a later event has replaced it in the
//! cache by the time anyone looks. A deletion is
//! shown once the cache no longer has the object (or has another one under
//! the name). The event of a write can even come before the write's
//! response, and be replaced in the cache by a later one (another
//! controller's update) before we record it: the versions of the last
//! [`SEEN_WINDOW`] events are remembered (as hashes), and a write whose
//! version was seen is not recorded at all. Were it recorded, its stale copy
//! would hide the later state for [`STALE_AFTER`], and a sync in that time
//! would decide on it (a Released PV left undeleted was seen that way).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use super::compact::Compact;

/// How long a written copy may wait for the cache to show it. Watch events
/// take milliseconds; this only bounds the rare copy the cache skipped over.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// How many recent watch events' versions are remembered.
pub const SEEN_WINDOW: usize = 4096;

/// Hashes of (key, version) of the last [`SEEN_WINDOW`] events.
#[derive(Default)]
struct Seen {
    order: VecDeque<u64>,
    set: HashSet<u64>,
}

impl Seen {
    fn add(&mut self, h: u64) {
        if self.set.insert(h) {
            self.order.push_back(h);
            if self.order.len() > SEEN_WINDOW {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

fn seen_hash<K: Resource>(key: &ObjectRef<K>, version: &str) -> u64
where
    K::DynamicType: Hash,
{
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    version.hash(&mut h);
    h.finish()
}

/// What this process did to one object.
enum Mine<K> {
    /// The object as our write returned it.
    Wrote { copy: Arc<K>, at: Instant },
    /// We deleted the object with this UID.
    Deleted { uid: Option<String> },
}

/// A watch cache with what this process wrote since.
pub struct Cached<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    store: Compact<K>,
    mine: Mutex<HashMap<ObjectRef<K>, Mine<K>>>,
    seen: Mutex<Seen>,
}

fn version<K: Resource>(obj: &K) -> Option<&str> {
    obj.meta().resource_version.as_deref()
}

impl<K> Cached<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    pub fn new(store: Compact<K>) -> Self {
        Cached {
            store,
            mine: Mutex::new(HashMap::new()),
            seen: Mutex::new(Seen::default()),
        }
    }

    /// The cache itself, for listing and readiness.
    pub fn store(&self) -> &Compact<K> {
        &self.store
    }

    fn mine(&self) -> MutexGuard<'_, HashMap<ObjectRef<K>, Mine<K>>> {
        self.mine.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The newest copy of the object at `key` this process knows; `None`
    /// for one it deleted, until the cache shows it gone.
    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        let cached = self.store.get(key);
        let mut mine = self.mine();
        match mine.get(key) {
            None => return cached,
            Some(Mine::Wrote { copy, at }) => {
                let shown = cached.as_ref().is_some_and(|c| {
                    version(c.as_ref()).is_some() && version(c.as_ref()) == version(copy.as_ref())
                });
                if !shown && at.elapsed() < STALE_AFTER {
                    // Not in the cache yet (or its creation event is in
                    // flight): ours is the newer copy.
                    return Some(copy.clone());
                }
            }
            Some(Mine::Deleted { uid }) => {
                let gone = cached
                    .as_ref()
                    .is_none_or(|c| c.meta().uid.is_some() && c.meta().uid != *uid);
                if !gone {
                    return None;
                }
            }
        }
        // The cache shows what we did (or our copy went stale): stop overlaying.
        mine.remove(key);
        cached
    }

    /// The cluster-scoped object `name` (see [`get`](Self::get)).
    pub fn get_named(&self, name: &str) -> Option<Arc<K>> {
        self.get(&ObjectRef::new(name))
    }

    /// Records what a write returned. Writes of one key come from the one
    /// worker holding it, in order: the last one recorded is the newest.
    pub fn wrote(&self, obj: K) {
        let key = ObjectRef::from_obj(&obj);
        let shown = self
            .store
            .get(&key)
            .is_some_and(|c| version(c.as_ref()).is_some() && version(c.as_ref()) == version(&obj));
        let seen = version(&obj).is_some_and(|v| {
            self.seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .set
                .contains(&seen_hash(&key, v))
        });
        if shown || seen {
            // Its event came first: the cache has it already.
            self.mine().remove(&key);
            return;
        }
        self.mine().insert(
            key,
            Mine::Wrote {
                copy: Arc::new(obj),
                at: Instant::now(),
            },
        );
    }

    /// Records that we deleted `obj` (or that it is gone when we looked).
    pub fn deleted(&self, obj: &K) {
        let key = ObjectRef::from_obj(obj);
        self.mine().insert(
            key,
            Mine::Deleted {
                uid: obj.meta().uid.clone(),
            },
        );
    }

    /// Hands the cache's watch `event` over: the event that carries our
    /// write, or the object's deletion, ends what we recorded of it. Call it
    /// for every event: a written copy whose event went by unseen would be
    /// kept until [`STALE_AFTER`], hiding whatever came after it.
    pub fn observe(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                let key = ObjectRef::from_obj(obj);
                if let Some(v) = version(obj) {
                    self.seen
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .add(seen_hash(&key, v));
                }
                let mut mine = self.mine();
                if let Some(Mine::Wrote { copy, .. }) = mine.get(&key) {
                    if version(obj).is_some() && version(obj) == version(copy.as_ref()) {
                        mine.remove(&key);
                    }
                }
            }
            watcher::Event::Delete(obj) => self.forget(&ObjectRef::from_obj(obj)),
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// Drops what we recorded of `key` (the watch reported it deleted).
    pub fn forget(&self, key: &ObjectRef<K>) {
        self.mine().remove(key);
    }

    /// Objects recorded right now (for tests and debugging).
    pub fn overlaid(&self) -> usize {
        self.mine().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
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

    fn get(c: &Cached<PersistentVolume>, name: &str) -> Option<String> {
        c.get_named(name).map(|p| label(&p))
    }

    #[test]
    fn our_copy_wins_until_the_cache_shows_its_version() {
        let writer = Compact::<PersistentVolume>::new();
        let reader = writer.clone();
        writer.apply(&Event::Apply(pv("a", "10", "cached")));
        let c = Cached::new(reader);
        assert_eq!(get(&c, "a").as_deref(), Some("cached"));

        c.wrote(pv("a", "12", "mine"));
        assert_eq!(get(&c, "a").as_deref(), Some("mine"));
        // An event older than our write does not end the overlay, whatever
        // its version looks like: versions are opaque, only equality counts.
        let apply = |writer: &Compact<PersistentVolume>, p| {
            let e = Event::Apply(p);
            writer.apply(&e);
            c.observe(&e);
        };
        apply(&writer, pv("a", "99", "in-flight"));
        assert_eq!(get(&c, "a").as_deref(), Some("mine"));

        apply(&writer, pv("a", "12", "cached-12"));
        assert_eq!(
            c.overlaid(),
            0,
            "the event carrying our write ends the overlay"
        );
        // Someone else's write right after ours is not hidden by it.
        apply(&writer, pv("a", "13", "theirs"));
        assert_eq!(get(&c, "a").as_deref(), Some("theirs"));

        // The event came before we recorded the write: nothing to overlay.
        c.wrote(pv("a", "13", "mine-13"));
        assert_eq!(c.overlaid(), 0);

        // Not in the cache at all (creation in flight): ours.
        c.wrote(pv("b", "5", "only-mine"));
        assert_eq!(get(&c, "b").as_deref(), Some("only-mine"));
        c.forget(&ObjectRef::new("b"));
        assert!(get(&c, "b").is_none());
    }

    #[test]
    fn a_deletion_hides_the_object_until_the_cache_drops_it() {
        let writer = Compact::<PersistentVolume>::new();
        let reader = writer.clone();
        let mut old = pv("a", "10", "cached");
        old.metadata.uid = Some("u1".into());
        writer.apply(&Event::Apply(old.clone()));
        let c = Cached::new(reader);
        c.deleted(&old);
        assert!(get(&c, "a").is_none());
        writer.apply(&Event::Delete(old));
        assert!(get(&c, "a").is_none());
        assert_eq!(c.overlaid(), 0);
        // A new object under the name is not hidden by the old deletion.
        let mut new = pv("a", "20", "new");
        new.metadata.uid = Some("u2".into());
        c.deleted(&pv("a", "10", "x"));
        writer.apply(&Event::Apply(new));
        assert_eq!(get(&c, "a").as_deref(), Some("new"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_copy_the_cache_skipped_over_goes_stale() {
        let writer = Compact::<PersistentVolume>::new();
        let reader = writer.clone();
        writer.apply(&Event::Apply(pv("a", "13", "after-ours")));
        let c = Cached::new(reader);
        c.wrote(pv("a", "12", "mine"));
        assert_eq!(get(&c, "a").as_deref(), Some("mine"));
        tokio::time::advance(STALE_AFTER).await;
        assert_eq!(get(&c, "a").as_deref(), Some("after-ours"));
        assert_eq!(c.overlaid(), 0);
    }

    #[test]
    fn a_write_whose_event_came_first_and_was_replaced_is_not_recorded() {
        let writer = Compact::<PersistentVolume>::new();
        let reader = writer.clone();
        let c = Cached::new(reader);
        // Our create's event, then another controller's update, both before
        // the create's response is recorded.
        for (rv, label) in [("12", "mine"), ("13", "bound-by-kcm")] {
            let e = Event::Apply(pv("a", rv, label));
            c.observe(&e);
            writer.apply(&e);
        }
        c.wrote(pv("a", "12", "mine"));
        assert_eq!(c.overlaid(), 0);
        assert_eq!(get(&c, "a").as_deref(), Some("bound-by-kcm"));
    }

    #[test]
    fn only_the_last_events_are_remembered() {
        let mut seen = Seen::default();
        for h in 0..(SEEN_WINDOW as u64 + 10) {
            seen.add(h);
        }
        assert_eq!(seen.set.len(), SEEN_WINDOW);
        assert!(!seen.set.contains(&0));
        assert!(seen.set.contains(&(SEEN_WINDOW as u64 + 9)));
    }
}
