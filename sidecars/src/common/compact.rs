//! The watch cache of the kinds that grow with the number of volumes
//! (claims, PVs, VolumeAttachments): each object is kept as its JSON,
//! LZ4-compressed, and decoded when read.
//!
//! A decoded k8s-openapi object is several times the size of its JSON: a
//! `PersistentVolume` is a 3 KB struct before any of its strings (its spec
//! holds every in-tree volume source inline), and every map is a B-tree of
//! separate allocations. A cache of decoded objects therefore costs about
//! what client-go's informers cost, per volume. The sidecars read one
//! object per sync, so decoding on read trades a few microseconds per read
//! for most of the memory (docs/benchmarks.md has the figures).
//!
//! Objects of one kind share most of their JSON (field names, the driver,
//! the class, annotations and finalizers), so each is compressed against a
//! dictionary: the JSON of the first object the cache was given. An object
//! unlike it still compresses, only less.
//!
//! Reads never hold the lock while decoding: [`Compact::iter`] takes a
//! snapshot of the entries (shared, not copied) and decodes one object at a
//! time, so a scan of every object never holds them all decoded at once.
//! A secondary index ([`Compact::indexed`]) answers "the objects whose
//! field is X" without a scan, as client-go's indexers do.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// What an index keys an object by, if anything.
pub type IndexFn<K> = fn(&K) -> Option<String>;

/// One cached object: its JSON compressed against the cache's dictionary,
/// and its index value, kept so that a removal needs no decode.
struct Entry {
    packed: Packed,
    indexed: Option<Box<str>>,
}

/// JSON compressed against a dictionary; shared by snapshots, never copied.
#[derive(Clone)]
struct Packed {
    bytes: Arc<[u8]>,
    /// The JSON's length.
    len: u32,
}

#[derive(Default)]
struct Maps {
    live: HashMap<Box<str>, Entry>,
    /// The objects of a re-list in progress; they replace `live` whole when
    /// it is done, so readers never see a half-listed cache.
    relist: Option<HashMap<Box<str>, Entry>>,
    /// Index value → keys, over `live`. A value has one key or a few (the
    /// attachments of one volume), so a list, not a set.
    index: HashMap<Box<str>, Vec<Box<str>>>,
}

struct Shared<K> {
    maps: RwLock<Maps>,
    /// The first object's JSON, set once: every entry is compressed with it.
    dict: OnceLock<Arc<[u8]>>,
    index: Option<IndexFn<K>>,
    ready: tokio::sync::watch::Sender<bool>,
}

/// A cache of one kind, fed by [`Compact::apply`] with its watch's events.
/// Clones share the cache.
pub struct Compact<K> {
    shared: Arc<Shared<K>>,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Compact {
            shared: self.shared.clone(),
            _kind: PhantomData,
        }
    }
}

impl<K> Default for Compact<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    fn default() -> Self {
        Self::build(None)
    }
}

/// The key of a namespaced or cluster-scoped object.
fn key_of(namespace: Option<&str>, name: &str) -> Box<str> {
    match namespace {
        Some(ns) => format!("{ns}/{name}").into_boxed_str(),
        None => name.into(),
    }
}

fn obj_key<K: Resource>(obj: &K) -> Box<str> {
    let meta = obj.meta();
    key_of(
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

impl<K> Compact<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    fn build(index: Option<IndexFn<K>>) -> Self {
        Compact {
            shared: Arc::new(Shared {
                maps: RwLock::new(Maps::default()),
                dict: OnceLock::new(),
                index,
                ready: tokio::sync::watch::Sender::new(false),
            }),
            _kind: PhantomData,
        }
    }

    /// An empty cache, not ready until its first list is applied.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache with an index: [`Self::by_index`] finds the objects
    /// `index` maps to a value.
    pub fn indexed(index: IndexFn<K>) -> Self {
        Self::build(Some(index))
    }

    /// A ready cache holding `objects` (fixed caches and tests).
    pub fn of(objects: impl IntoIterator<Item = K>) -> Self {
        let cache = Self::new();
        cache.apply(&watcher::Event::Init);
        for o in objects {
            cache.apply(&watcher::Event::InitApply(o));
        }
        cache.apply(&watcher::Event::InitDone);
        cache
    }

    fn read(&self) -> RwLockReadGuard<'_, Maps> {
        self.shared
            .maps
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Maps> {
        self.shared
            .maps
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn dict(&self) -> Arc<[u8]> {
        self.shared
            .dict
            .get()
            .cloned()
            .unwrap_or_else(|| Arc::from(&[][..]))
    }

    fn pack(&self, json: &[u8]) -> Option<Packed> {
        let dict = self.shared.dict.get_or_init(|| Arc::from(json));
        Some(Packed {
            bytes: lz4_flex::block::compress_with_dict(json, dict).into(),
            len: u32::try_from(json.len()).ok()?,
        })
    }

    fn entry(&self, obj: &K) -> Option<Entry> {
        let packed = serde_json::to_vec(obj)
            .map_err(|e| e.to_string())
            .and_then(|json| self.pack(&json).ok_or_else(|| "over 4 GiB".to_string()));
        match packed {
            Ok(packed) => Some(Entry {
                packed,
                indexed: self
                    .shared
                    .index
                    .and_then(|f| f(obj))
                    .map(String::into_boxed_str),
            }),
            Err(e) => {
                // A k8s-openapi object always encodes; were it not to, the
                // cache misses one object rather than the sidecar stopping.
                tracing::warn!(key = %obj_key(obj), error = %e, "cannot cache an object");
                None
            }
        }
    }

    /// Applies one watch event, as kube's reflector store does: a re-list
    /// (`Init` … `InitDone`) replaces the cache whole when it is done.
    pub fn apply(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Init => self.write().relist = Some(HashMap::new()),
            watcher::Event::InitApply(obj) => {
                if let Some(entry) = self.entry(obj) {
                    let mut maps = self.write();
                    let key = obj_key(obj);
                    match maps.relist.as_mut() {
                        Some(relist) => {
                            relist.insert(key, entry);
                        }
                        None => insert(&mut maps, key, entry),
                    }
                }
            }
            watcher::Event::InitDone => {
                let mut maps = self.write();
                if let Some(relist) = maps.relist.take() {
                    maps.index = HashMap::new();
                    for (key, entry) in &relist {
                        if let Some(v) = &entry.indexed {
                            maps.index.entry(v.clone()).or_default().push(key.clone());
                        }
                    }
                    maps.live = relist;
                }
                drop(maps);
                self.shared.ready.send_replace(true);
            }
            watcher::Event::Apply(obj) => {
                if let Some(entry) = self.entry(obj) {
                    insert(&mut self.write(), obj_key(obj), entry);
                }
            }
            watcher::Event::Delete(obj) => {
                let key = obj_key(obj);
                let mut maps = self.write();
                if let Some(old) = maps.live.remove(&key) {
                    unindex(&mut maps, &key, old.indexed.as_deref());
                }
            }
        }
    }

    fn decode<T: DeserializeOwned>(packed: &Packed, dict: &[u8]) -> Option<T> {
        let json =
            match lz4_flex::block::decompress_with_dict(&packed.bytes, packed.len as usize, dict) {
                Ok(json) => json,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot decompress a cached object");
                    return None;
                }
            };
        match serde_json::from_slice(&json) {
            Ok(obj) => Some(obj),
            Err(e) => {
                tracing::warn!(error = %e, "cannot decode a cached object");
                None
            }
        }
    }

    fn lookup(&self, key: &str) -> Option<Arc<K>> {
        let packed = self.read().live.get(key)?.packed.clone();
        Self::decode(&packed, &self.dict()).map(Arc::new)
    }

    /// The object at `key`.
    pub fn get(&self, key: &ObjectRef<K>) -> Option<Arc<K>> {
        self.lookup(&key_of(key.namespace.as_deref(), &key.name))
    }

    /// The cluster-scoped object `name`.
    pub fn get_named(&self, name: &str) -> Option<Arc<K>> {
        self.lookup(name)
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.read().live.len()
    }

    /// Whether the cache holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every object, decoded one at a time as the iterator is advanced.
    pub fn iter(&self) -> impl Iterator<Item = K> {
        self.view()
    }

    /// Every object read as `T`, a view with only the fields the caller
    /// needs (serde skips the rest), decoded one at a time.
    pub fn view<T: DeserializeOwned>(&self) -> impl Iterator<Item = T> {
        let snapshot: Vec<Packed> = self
            .read()
            .live
            .values()
            .map(|e| e.packed.clone())
            .collect();
        let dict = self.dict();
        snapshot
            .into_iter()
            .filter_map(move |p| Self::decode(&p, &dict))
    }

    /// The objects the index maps to `value` (none without an index).
    pub fn by_index(&self, value: &str) -> Vec<Arc<K>> {
        let packed: Vec<Packed> = {
            let maps = self.read();
            maps.index
                .get(value)
                .into_iter()
                .flatten()
                .filter_map(|k| maps.live.get(k).map(|e| e.packed.clone()))
                .collect()
        };
        let dict = self.dict();
        packed
            .iter()
            .filter_map(|p| Self::decode(p, &dict).map(Arc::new))
            .collect()
    }

    /// Whether the first list has been applied.
    pub fn is_ready(&self) -> bool {
        *self.shared.ready.borrow()
    }

    /// Waits until the first list has been applied.
    pub async fn ready(&self) {
        let mut rx = self.shared.ready.subscribe();
        // The sender lives as long as this cache: waiting cannot fail.
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// The index of VolumeAttachments by the PV they attach (both the
/// provisioner's wait for a detach and the attacher's PV finalizer ask it).
pub fn attached_volume(va: &k8s_openapi::api::storage::v1::VolumeAttachment) -> Option<String> {
    va.spec.source.persistent_volume_name.clone()
}

fn insert(maps: &mut Maps, key: Box<str>, entry: Entry) {
    let value = entry.indexed.clone();
    if let Some(old) = maps.live.insert(key.clone(), entry) {
        if old.indexed != value {
            unindex(maps, &key, old.indexed.as_deref());
        }
    }
    if let Some(v) = value {
        let keys = maps.index.entry(v).or_default();
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
}

fn unindex(maps: &mut Maps, key: &str, value: Option<&str>) {
    let Some(v) = value else { return };
    if let Some(keys) = maps.index.get_mut(v) {
        keys.retain(|k| &**k != key);
        if keys.is_empty() {
            maps.index.remove(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use serde_json::json;

    fn va(name: &str, pv: &str) -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": pv}},
        }))
        .expect("VolumeAttachment")
    }

    fn names(vas: Vec<Arc<VolumeAttachment>>) -> Vec<String> {
        let mut n: Vec<String> = vas.iter().filter_map(|v| v.metadata.name.clone()).collect();
        n.sort();
        n
    }

    #[test]
    fn objects_read_back_as_they_were_applied() {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "annotations": {"a": "b"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
        }))
        .expect("claim");
        let cache = Compact::of([claim.clone()]);
        assert!(cache.is_ready());
        assert_eq!(
            cache.get(&ObjectRef::new("c").within("ns")).as_deref(),
            Some(&claim)
        );
        assert!(
            cache.get(&ObjectRef::new("c")).is_none(),
            "namespace is part of the key"
        );
        assert_eq!(cache.iter().collect::<Vec<_>>(), vec![claim]);
    }

    #[test]
    fn objects_unlike_the_dictionary_read_back_too() {
        let first = va("a", "pv1");
        let mut other = va("b-with-a-much-longer-name-than-the-first", "pv-9");
        other.spec.attacher = "another.driver.example.com".into();
        other.metadata.annotations = Some([("x".repeat(300), "y".repeat(3000))].into());
        let cache = Compact::of([first.clone(), other.clone()]);
        assert_eq!(cache.get_named("a").as_deref(), Some(&first));
        assert_eq!(
            cache
                .get_named("b-with-a-much-longer-name-than-the-first")
                .as_deref(),
            Some(&other)
        );
    }

    #[test]
    fn the_index_follows_applies_deletes_and_relists() {
        let cache = Compact::indexed(attached_volume);
        cache.apply(&watcher::Event::Apply(va("a", "pv1")));
        cache.apply(&watcher::Event::Apply(va("b", "pv1")));
        assert_eq!(names(cache.by_index("pv1")), ["a", "b"]);
        // An object whose indexed field changes moves in the index.
        cache.apply(&watcher::Event::Apply(va("b", "pv2")));
        assert_eq!(names(cache.by_index("pv1")), ["a"]);
        assert_eq!(names(cache.by_index("pv2")), ["b"]);
        cache.apply(&watcher::Event::Delete(va("a", "pv1")));
        assert!(cache.by_index("pv1").is_empty());
        // A re-list serves the old objects until it is done, then only the
        // listed ones.
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(va("c", "pv3")));
        assert_eq!(names(cache.by_index("pv2")), ["b"]);
        assert!(cache.by_index("pv3").is_empty());
        cache.apply(&watcher::Event::InitDone);
        assert!(cache.by_index("pv2").is_empty());
        assert_eq!(names(cache.by_index("pv3")), ["c"]);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_view_reads_only_what_it_names() {
        #[derive(serde::Deserialize)]
        struct Names {
            metadata: Meta,
        }
        #[derive(serde::Deserialize)]
        struct Meta {
            name: String,
        }
        let cache = Compact::of([va("a", "pv1"), va("b", "pv2")]);
        let mut names: Vec<String> = cache.view::<Names>().map(|n| n.metadata.name).collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
    }

    #[tokio::test]
    async fn ready_waits_for_the_first_list() {
        let cache: Compact<VolumeAttachment> = Compact::new();
        assert!(!cache.is_ready());
        let waiter = tokio::spawn({
            let cache = cache.clone();
            async move { cache.ready().await }
        });
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitDone);
        waiter.await.expect("ready");
        assert!(cache.is_ready());
    }
}
