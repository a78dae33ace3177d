//! The operator's pods, compact: [`PodView`]s by namespace and name, kept by
//! a watch of the pods labelled as ours, the strings that repeat from pod
//! to pod (namespace, node, phase, kept labels) shared.
//!
//! Not kube's reflector store: it keeps an `ObjectMeta` per pod and a second
//! copy of name, namespace, uid and resource version in its key, four
//! times what a pod costs here (20 000 pods on a 1000-node cluster with 20
//! drivers). And a relist (the watch restarted from scratch) is marked and
//! swept in place rather than built in a second map, so the cache never
//! doubles: pods seen again are replaced, the ones not seen are removed at
//! its end (until then a reconcile may still see a pod deleted meanwhile,
//! as it may before a watch event arrives).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;

use super::super::scope::Namespaces;
use super::sync::SyncFlag;
use crate::pods::PodView;
use crate::render::labels::{INSTANCE, MANAGED_BY, MANAGED_BY_VALUE};

/// The pods, shared by every reconcile.
#[derive(Clone, Debug, Default)]
pub struct PodCache(Arc<RwLock<Inner>>);

#[derive(Debug, Default)]
struct Inner {
    /// By (namespace, name); the key shares the view's strings. Boxed: a
    /// table keeps spare slots (a third to half of them), which should not
    /// be pod-sized.
    pods: HashMap<(Arc<str>, Arc<str>), Box<Kept>>,
    /// One copy of each repeated string.
    strings: HashSet<Arc<str>>,
    /// Incremented by each relist; a pod carries the one it was last seen in.
    epoch: u64,
}

#[derive(Debug)]
struct Kept {
    pod: PodView,
    seen: u64,
}

impl Inner {
    fn intern(&mut self, s: Arc<str>) -> Arc<str> {
        match self.strings.get(&s) {
            Some(shared) => shared.clone(),
            None => {
                self.strings.insert(s.clone());
                s
            }
        }
    }

    fn insert(&mut self, pod: PodView) {
        let pod = pod.interned(|s| self.intern(s));
        let key = (pod.namespace.clone(), pod.name.clone());
        let seen = self.epoch;
        self.pods.insert(key, Box::new(Kept { pod, seen }));
    }

    fn remove(&mut self, pod: &PodView) {
        // A key of borrowed strings would need a wrapper type; an owned
        // one costs two reference-count increments.
        self.pods.remove(&(pod.namespace.clone(), pod.name.clone()));
    }

    /// Ends a relist: what it did not see is gone, and so are the strings
    /// no pod uses any more.
    fn sweep(&mut self) {
        let epoch = self.epoch;
        self.pods.retain(|_, k| k.seen == epoch);
        self.strings.retain(|s| Arc::strong_count(s) > 1);
    }
}

impl PodCache {
    /// Applies one watch event; the pod it concerns, if any.
    pub fn apply(&self, event: Event<PodView>) -> Option<PodView> {
        let mut inner = self.0.write().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Apply(pod) | Event::InitApply(pod) => {
                inner.insert(pod.clone());
                Some(pod)
            }
            Event::Delete(pod) => {
                inner.remove(&pod);
                Some(pod)
            }
            Event::Init => {
                inner.epoch += 1;
                None
            }
            Event::InitDone => {
                inner.sweep();
                None
            }
        }
    }

    /// The pods of the object `instance` in `namespace`.
    pub fn pods_of(&self, namespace: &str, instance: &str) -> Vec<PodView> {
        let inner = self.0.read().unwrap_or_else(|p| p.into_inner());
        inner
            .pods
            .values()
            .map(|k| &k.pod)
            .filter(|p| &*p.namespace == namespace && p.label(INSTANCE) == Some(instance))
            .cloned()
            .collect()
    }

    /// The object (its name) the pod `namespace/name` belongs to.
    pub fn owner_of(&self, namespace: &str, name: &str) -> Option<String> {
        let inner = self.0.read().unwrap_or_else(|p| p.into_inner());
        let key = (Arc::from(namespace), Arc::from(name));
        inner
            .pods
            .get(&key)?
            .pod
            .label(INSTANCE)
            .map(str::to_string)
    }

    /// How many pods are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.read().map(|i| i.pods.len()).unwrap_or(0)
    }

    /// Watches the operator's pods into the cache, marking `synced` at the
    /// first complete list; yields every pod that changed or went.
    pub fn watch(
        &self,
        client: Client,
        synced: SyncFlag,
        scope: Namespaces,
    ) -> impl Stream<Item = Result<PodView, watcher::Error>> + Send + 'static {
        let this = self.clone();
        super::pod_watch::watch(client, format!("{MANAGED_BY}={MANAGED_BY_VALUE}"))
            .default_backoff()
            .filter_map(move |event| {
                let out = match event {
                    Err(e) => Some(Err(e)),
                    // Pods elsewhere are anyone's: the label is not proof.
                    Ok(Event::Apply(p) | Event::InitApply(p)) if !scope.allows(&p.namespace) => {
                        None
                    }
                    Ok(event) => {
                        let done = matches!(event, Event::InitDone);
                        let pod = this.apply(event);
                        if done {
                            synced.mark();
                        }
                        pod.map(Ok)
                    }
                };
                futures::future::ready(out)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::labels::COMPONENT;
    use serde_json::json;

    fn watched(ns: &str, name: &str, instance: &str, node: &str) -> PodView {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "1",
                "labels": {INSTANCE: instance, COMPONENT: "node"}},
            "spec": {"nodeName": node},
            "status": {"phase": "Running"}
        }))
        .expect("a pod")
    }

    fn names(pods: &[PodView]) -> Vec<String> {
        let mut n: Vec<String> = pods.iter().map(|p| p.name().to_string()).collect();
        n.sort();
        n
    }

    #[test]
    fn keeps_pods_by_owner_and_forgets_deleted_ones() {
        let cache = PodCache::default();
        assert!(cache.apply(Event::Init).is_none());
        cache.apply(Event::InitApply(watched("ns", "a-1", "a", "n1")));
        cache.apply(Event::InitApply(watched("ns", "a-2", "a", "n2")));
        cache.apply(Event::InitApply(watched("other", "a-3", "a", "n1")));
        cache.apply(Event::InitDone);
        let b = cache.apply(Event::Apply(watched("ns", "b-1", "b", "n1")));
        assert_eq!(b.map(|p| p.name().to_string()).as_deref(), Some("b-1"));

        assert_eq!(names(&cache.pods_of("ns", "a")), ["a-1", "a-2"]);
        assert_eq!(names(&cache.pods_of("ns", "b")), ["b-1"]);
        assert_eq!(cache.owner_of("ns", "b-1").as_deref(), Some("b"));
        assert_eq!(cache.owner_of("ns", "nope"), None);

        let gone = cache.apply(Event::Delete(watched("ns", "a-1", "a", "n1")));
        assert!(gone.is_some(), "a deletion wakes the owner too");
        assert_eq!(names(&cache.pods_of("ns", "a")), ["a-2"]);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn a_relist_replaces_what_it_sees_and_drops_the_rest_at_its_end() {
        let cache = PodCache::default();
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(watched("ns", "a-1", "a", "n1")));
        cache.apply(Event::InitApply(watched("ns", "a-2", "a", "n2")));
        cache.apply(Event::InitDone);

        cache.apply(Event::Init);
        cache.apply(Event::InitApply(watched("ns", "a-2", "a", "n9")));
        // Until the relist ends, the pods not seen yet are still there.
        assert_eq!(cache.len(), 2);
        cache.apply(Event::InitDone);
        let pods = cache.pods_of("ns", "a");
        assert_eq!(names(&pods), ["a-2"]);
        assert_eq!(pods[0].node.as_deref(), Some("n9"));
    }

    #[test]
    fn repeated_strings_are_kept_once() {
        let cache = PodCache::default();
        for i in 0..3 {
            cache.apply(Event::Apply(watched("ns", &format!("a-{i}"), "a", "n1")));
        }
        let pods = cache.pods_of("ns", "a");
        let node = |i: usize| pods[i].node.clone().expect("a node");
        assert!(Arc::ptr_eq(&node(0), &node(1)) && Arc::ptr_eq(&node(1), &node(2)));
        assert!(Arc::ptr_eq(&pods[0].namespace, &pods[2].namespace));
        // Strings no pod uses any more go at the end of a relist.
        drop(pods);
        cache.apply(Event::Init);
        cache.apply(Event::InitApply(watched("ns", "a-0", "a", "n2")));
        cache.apply(Event::InitDone);
        let inner = cache.0.read().expect("lock");
        assert!(!inner.strings.contains("n1"), "{:?}", inner.strings);
        assert!(inner.strings.contains("n2"));
    }
}
