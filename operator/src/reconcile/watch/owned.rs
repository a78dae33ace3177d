//! What the operator knows of the objects it applies, from watches, so an
//! unchanged object costs no request at all.
//!
//! Every object csiops applies carries its `managed-by` label and the
//! [`APPLIED_HASH`] annotation of what was last applied. A label-filtered
//! watch per kind (metadata only for the supporting objects; the workloads
//! come from their full watches) keeps, per object, that hash and its
//! `metadata.generation`. [`apply`](crate::reconcile::write::apply::apply) then skips an object whose
//! live hash is what it would apply (and, for a workload, whose generation
//! is still the one our last apply produced: nobody edited its spec since),
//! and a change or deletion by anyone else wakes the owner's reconcile,
//! which puts the object back.
//!
//! An object absent here is looked up once before it is written: the watch
//! only sees objects with our label, and a same-named object of someone
//! else's must be refused, never taken over.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::render::labels::{
    INSTANCE, MANAGED_BY, MANAGED_BY_VALUE, OWNER_NAME, OWNER_NAMESPACE, OWNER_UID,
};

/// Annotation with the hash of what was last applied to a supporting object,
/// so an unchanged object costs a read and no write. Written by
/// [`apply`](crate::reconcile::write::apply), read back here.
pub const APPLIED_HASH: &str = "csiops.dev/applied-hash";

/// One owned object: `(kind, namespace or "", name)`.
pub type Key = (&'static str, String, String);

/// What is kept of one object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Known {
    pub applied_hash: Option<String>,
    pub generation: Option<i64>,
    /// The generation our own last apply left (unknown after a restart).
    pub applied_generation: Option<i64>,
    /// The `csiops.dev/owner-uid` label (cluster-scoped objects).
    pub owner_uid: Option<String>,
}

fn owner_uid(meta: &kube::api::ObjectMeta) -> Option<String> {
    meta.labels.as_ref().and_then(|l| l.get(OWNER_UID)).cloned()
}

/// The known objects of every kind, shared by the watches and the reconciles.
#[derive(Clone, Debug, Default)]
pub struct Owned(Arc<RwLock<HashMap<Key, Known>>>);

fn key_of(kind: &'static str, meta: &kube::api::ObjectMeta) -> Key {
    (
        kind,
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl Owned {
    pub fn get(&self, kind: &'static str, namespace: &str, name: &str) -> Option<Known> {
        let map = self.0.read().ok()?;
        map.get(&(kind, namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Records what our apply of the object left.
    pub fn applied(&self, kind: &'static str, meta: &kube::api::ObjectMeta) {
        if let Ok(mut map) = self.0.write() {
            let entry = map.entry(key_of(kind, meta)).or_default();
            entry.applied_hash = meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(APPLIED_HASH))
                .cloned();
            entry.generation = meta.generation;
            entry.applied_generation = meta.generation;
        }
    }

    /// Forgets an object we deleted.
    pub fn forget(&self, kind: &'static str, namespace: &str, name: &str) {
        if let Ok(mut map) = self.0.write() {
            map.remove(&(kind, namespace.to_string(), name.to_string()));
        }
    }

    /// Records a watched object; `true` when its hash or generation changed.
    fn seen(&self, kind: &'static str, meta: &kube::api::ObjectMeta) -> bool {
        let Ok(mut map) = self.0.write() else {
            return false;
        };
        let hash = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(APPLIED_HASH))
            .cloned();
        let entry = map.entry(key_of(kind, meta)).or_default();
        let uid = owner_uid(meta);
        let changed = entry.applied_hash != hash
            || entry.generation != meta.generation
            || entry.owner_uid != uid;
        entry.applied_hash = hash;
        entry.generation = meta.generation;
        entry.owner_uid = uid;
        changed
    }

    fn gone(&self, kind: &'static str, meta: &kube::api::ObjectMeta) -> bool {
        self.0
            .write()
            .map(|mut map| map.remove(&key_of(kind, meta)).is_some())
            .unwrap_or(false)
    }

    /// Feeds the map from one event of a full watch of `kind` (the
    /// workloads, whose watches also drive the controller).
    pub fn observe<K: Resource>(&self, kind: &'static str, event: &Event<K>) {
        match event {
            Event::Apply(o) | Event::InitApply(o) => {
                self.seen(kind, o.meta());
            }
            Event::Delete(o) => {
                self.gone(kind, o.meta());
            }
            Event::Init | Event::InitDone => {}
        }
    }

    /// Feeds the map from a watch of `kind` (any event stream of objects),
    /// yielding the owner `(namespace, name)` of every object that changed
    /// or went away, and `None` once the first list is complete.
    pub fn track<K, S>(
        &self,
        kind: &'static str,
        events: S,
    ) -> impl Stream<Item = Result<Option<(String, String)>, watcher::Error>> + Send + 'static
    where
        K: Resource + Send + 'static,
        S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    {
        let this = self.clone();
        events.filter_map(move |event| {
            // Cluster-scoped objects name their owner in labels; namespaced
            // ones live in its namespace and carry its instance label.
            let owner = |meta: &kube::api::ObjectMeta| {
                let labels = meta.labels.as_ref()?;
                match (labels.get(OWNER_NAMESPACE), labels.get(OWNER_NAME)) {
                    (Some(ns), Some(name)) => Some((ns.clone(), name.clone())),
                    _ => Some((meta.namespace.clone()?, labels.get(INSTANCE)?.clone())),
                }
            };
            let out = match event {
                Err(e) => Some(Err(e)),
                Ok(Event::Apply(o)) => this
                    .seen(kind, o.meta())
                    .then(|| owner(o.meta()))
                    .flatten()
                    .map(|o| Ok(Some(o))),
                Ok(Event::Delete(o)) => this
                    .gone(kind, o.meta())
                    .then(|| owner(o.meta()))
                    .flatten()
                    .map(|o| Ok(Some(o))),
                Ok(Event::InitApply(o)) => {
                    this.seen(kind, o.meta());
                    None
                }
                Ok(Event::Init) => None,
                Ok(Event::InitDone) => Some(Ok(None)),
            };
            futures::future::ready(out)
        })
    }

    /// A metadata-only watch of our objects of kind `K`, fed into the map.
    pub fn watch_meta<K>(
        &self,
        client: &Client,
        kind: &'static str,
    ) -> impl Stream<Item = Result<Option<(String, String)>, watcher::Error>> + Send + 'static
    where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let api: Api<PartialObjectMeta<K>> = Api::all(client.clone());
        let config = watcher::Config::default().labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}"));
        self.track(
            kind,
            watcher::watcher(api, config)
                .default_backoff()
                .modify(|m| m.managed_fields_mut().clear()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn sa(name: &str, hash: &str, generation: Option<i64>) -> ServiceAccount {
        ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                generation,
                labels: Some(BTreeMap::from([
                    (OWNER_NAMESPACE.to_string(), "ns".to_string()),
                    (OWNER_NAME.to_string(), "hp".to_string()),
                ])),
                annotations: Some(BTreeMap::from([(
                    APPLIED_HASH.to_string(),
                    hash.to_string(),
                )])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn tracks_hashes_and_wakes_the_owner_on_changes_and_deletions() {
        let owned = Owned::default();
        let events = futures::stream::iter(vec![
            Ok(Event::Init),
            Ok(Event::InitApply(sa("a", "h1", None))),
            Ok(Event::InitDone),
            // Our own apply, seen again: no change, nobody woken.
            Ok(Event::Apply(sa("a", "h1", None))),
            // Someone edits it.
            Ok(Event::Apply(sa("a", "other", None))),
            Ok(Event::Delete(sa("a", "other", None))),
        ]);
        let out: Vec<_> = owned
            .track::<ServiceAccount, _>("ServiceAccount", events)
            .map(|r| r.expect("no error"))
            .collect()
            .await;
        let hp = Some(("ns".to_string(), "hp".to_string()));
        assert_eq!(out, vec![None, hp.clone(), hp]);
        assert_eq!(owned.get("ServiceAccount", "ns", "a"), None);
    }

    #[test]
    fn our_apply_records_the_generation_it_left() {
        let owned = Owned::default();
        owned.applied("DaemonSet", &sa("d", "h", Some(4)).metadata);
        let k = owned.get("DaemonSet", "ns", "d").expect("known");
        assert_eq!(
            (
                k.applied_hash.as_deref(),
                k.generation,
                k.applied_generation
            ),
            (Some("h"), Some(4), Some(4))
        );
        // An edit by someone else bumps the generation; ours stays.
        assert!(owned.seen("DaemonSet", &sa("d", "h", Some(5)).metadata));
        let k = owned.get("DaemonSet", "ns", "d").expect("known");
        assert_eq!((k.generation, k.applied_generation), (Some(5), Some(4)));
        owned.forget("DaemonSet", "ns", "d");
        assert_eq!(owned.get("DaemonSet", "ns", "d"), None);
    }
}
