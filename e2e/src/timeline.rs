//! Records what happens to a driver's workloads, in the API server's order.
//!
//! Watches on the StatefulSet, the DaemonSet and the CSIDriver feed one list;
//! entries are ordered by resourceVersion (etcd's global revision), so the
//! order across kinds is the order in which the API server stored the changes,
//! not the order in which our watches happened to deliver them.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use tokio::task::JoinHandle;

const HASH: &str = "csiops.dev/template-hash";

/// One stored change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub revision: u64,
    pub kind: &'static str,
    pub name: String,
    pub deleted: bool,
    pub hash: Option<String>,
    pub generation: i64,
    pub observed_generation: i64,
    /// StatefulSet: spec.replicas; DaemonSet: desiredNumberScheduled.
    pub desired: i32,
    /// StatefulSet: status.replicas; DaemonSet: currentNumberScheduled.
    pub current: i32,
    pub ready: i32,
    pub updated: i32,
    /// DaemonSet: numberAvailable (StatefulSet: availableReplicas).
    pub available: i32,
}

fn revision<K: Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn sts_entry(s: &StatefulSet, deleted: bool) -> Entry {
    let st = s.status.as_ref();
    Entry {
        revision: revision(s),
        kind: "StatefulSet",
        name: s.name_any(),
        deleted,
        hash: s.annotations().get(HASH).cloned(),
        generation: s.metadata.generation.unwrap_or(0),
        observed_generation: st.and_then(|x| x.observed_generation).unwrap_or(0),
        desired: s.spec.as_ref().and_then(|x| x.replicas).unwrap_or(1),
        current: st.map_or(0, |x| x.replicas),
        ready: st.and_then(|x| x.ready_replicas).unwrap_or(0),
        updated: st.and_then(|x| x.updated_replicas).unwrap_or(0),
        available: st.and_then(|x| x.available_replicas).unwrap_or(0),
    }
}

fn ds_entry(d: &DaemonSet, deleted: bool) -> Entry {
    let st = d.status.as_ref();
    Entry {
        revision: revision(d),
        kind: "DaemonSet",
        name: d.name_any(),
        deleted,
        hash: d.annotations().get(HASH).cloned(),
        generation: d.metadata.generation.unwrap_or(0),
        observed_generation: st.and_then(|x| x.observed_generation).unwrap_or(0),
        desired: st.map_or(0, |x| x.desired_number_scheduled),
        current: st.map_or(0, |x| x.current_number_scheduled),
        ready: st.map_or(0, |x| x.number_ready),
        updated: st.and_then(|x| x.updated_number_scheduled).unwrap_or(0),
        available: st.and_then(|x| x.number_available).unwrap_or(0),
    }
}

fn csidriver_entry(c: &CSIDriver, deleted: bool) -> Entry {
    Entry {
        revision: revision(c),
        kind: "CSIDriver",
        name: c.name_any(),
        deleted,
        hash: None,
        generation: c.metadata.generation.unwrap_or(0),
        observed_generation: 0,
        desired: 0,
        current: 0,
        ready: 0,
        updated: 0,
        available: 0,
    }
}

/// The recording; stops watching on drop.
pub struct Timeline {
    entries: Arc<Mutex<Vec<Entry>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Timeline {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn record<K, F>(api: Api<K>, entries: Arc<Mutex<Vec<Entry>>>, to_entry: F) -> JoinHandle<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&K, bool) -> Entry + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            let new = match ev {
                Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => to_entry(&o, false),
                Ok(Event::Delete(o)) => to_entry(&o, true),
                _ => continue,
            };
            if let Ok(mut e) = entries.lock() {
                e.push(new);
            }
        }
    })
}

impl Timeline {
    /// Starts recording the StatefulSets and DaemonSets of `namespace` and every CSIDriver.
    pub fn start(client: &Client, namespace: &str) -> Self {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let tasks = vec![
            record(
                Api::<StatefulSet>::namespaced(client.clone(), namespace),
                entries.clone(),
                sts_entry,
            ),
            record(
                Api::<DaemonSet>::namespaced(client.clone(), namespace),
                entries.clone(),
                ds_entry,
            ),
            record(
                Api::<CSIDriver>::all(client.clone()),
                entries.clone(),
                csidriver_entry,
            ),
        ];
        Self { entries, tasks }
    }

    /// Everything recorded so far, in the API server's order, duplicates removed.
    pub fn entries(&self) -> Vec<Entry> {
        let mut all = self.entries.lock().map(|e| e.clone()).unwrap_or_default();
        all.sort_by_key(|e| (e.revision, e.kind));
        all.dedup();
        all
    }

    /// Index of the first entry matching `pred`.
    pub fn first(entries: &[Entry], pred: impl Fn(&Entry) -> bool) -> Option<usize> {
        entries.iter().position(pred)
    }

    /// A readable dump for assertion messages.
    pub fn render(entries: &[Entry]) -> String {
        entries
            .iter()
            .map(|e| {
                format!(
                    "{:>8} {:<11} {:<20} {} hash={} gen={}/{} desired={} current={} ready={} updated={} available={}",
                    e.revision,
                    e.kind,
                    e.name,
                    if e.deleted { "DELETED" } else { "       " },
                    e.hash.as_deref().unwrap_or("-"),
                    e.observed_generation,
                    e.generation,
                    e.desired,
                    e.current,
                    e.ready,
                    e.updated,
                    e.available
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
