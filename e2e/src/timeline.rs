//! Records what happens to a driver's workloads, in the API server's order.
//!
//! Watches on the StatefulSets, the DaemonSets, the DaemonSets' pods and the
//! CSIDrivers feed one list;
//! entries are ordered by resourceVersion (etcd's global revision), so the
//! order across kinds is the order in which the API server stored the changes,
//! not the order in which our watches happened to deliver them.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use tokio::task::JoinHandle;

const HASH: &str = "csiops.dev/template-hash";
/// The DaemonSet's template generation (the API server bumps it with each
/// template change) and the label with which its controller stamps its pods.
const DS_TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";
const POD_TEMPLATE_GENERATION: &str = "pod-template-generation";

/// One stored change. Fields a kind has no value for are 0 or `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    /// Pod: 1 when its Ready condition is True.
    pub available: i32,
    /// DaemonSet: its template generation; Pod: the one it was made from.
    pub template_generation: i64,
    /// Pod: the DaemonSet that owns it.
    pub owner: Option<String>,
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
        ..Entry::default()
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
        template_generation: number_in(d.annotations().get(DS_TEMPLATE_GENERATION)),
        ..Entry::default()
    }
}

fn csidriver_entry(c: &CSIDriver, deleted: bool) -> Entry {
    Entry {
        revision: revision(c),
        kind: "CSIDriver",
        name: c.name_any(),
        deleted,
        generation: c.metadata.generation.unwrap_or(0),
        ..Entry::default()
    }
}

fn number_in(text: Option<&String>) -> i64 {
    text.and_then(|t| t.parse().ok()).unwrap_or(0)
}

/// A DaemonSet's pod; other pods give `None`. A pod being deleted counts as
/// gone: it no longer serves its node.
fn pod_entry(p: &Pod, deleted: bool) -> Option<Entry> {
    let owner = p
        .owner_references()
        .iter()
        .find(|o| o.kind == "DaemonSet")?
        .name
        .clone();
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Some(Entry {
        revision: revision(p),
        kind: "Pod",
        name: p.name_any(),
        deleted: deleted || p.metadata.deletion_timestamp.is_some(),
        ready: i32::from(ready),
        available: i32::from(ready),
        template_generation: number_in(p.labels().get(POD_TEMPLATE_GENERATION)),
        owner: Some(owner),
        ..Entry::default()
    })
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
    F: Fn(&K, bool) -> Option<Entry> + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            let new = match ev {
                Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => to_entry(&o, false),
                Ok(Event::Delete(o)) => to_entry(&o, true),
                _ => None,
            };
            let Some(new) = new else { continue };
            if let Ok(mut e) = entries.lock() {
                e.push(new);
            }
        }
    })
}

impl Timeline {
    /// Starts recording the StatefulSets, DaemonSets and DaemonSet pods of
    /// `namespace` and every CSIDriver.
    pub fn start(client: &Client, namespace: &str) -> Self {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let tasks = vec![
            record(
                Api::<StatefulSet>::namespaced(client.clone(), namespace),
                entries.clone(),
                |s, deleted| Some(sts_entry(s, deleted)),
            ),
            record(
                Api::<DaemonSet>::namespaced(client.clone(), namespace),
                entries.clone(),
                |d, deleted| Some(ds_entry(d, deleted)),
            ),
            record(
                Api::<Pod>::namespaced(client.clone(), namespace),
                entries.clone(),
                pod_entry,
            ),
            record(
                Api::<CSIDriver>::all(client.clone()),
                entries.clone(),
                |c, deleted| Some(csidriver_entry(c, deleted)),
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

    /// How many of `daemonset`'s pods were Ready and made from its template
    /// generation `template_generation` just before entry `at`: what the
    /// operator's node-by-node check sees, which the DaemonSet's own counters
    /// report a moment later.
    pub fn current_ready_pods(
        entries: &[Entry],
        at: usize,
        daemonset: &str,
        template_generation: i64,
    ) -> usize {
        let mut latest = std::collections::BTreeMap::new();
        for e in entries[..at.min(entries.len())]
            .iter()
            .filter(|e| e.kind == "Pod" && e.owner.as_deref() == Some(daemonset))
        {
            latest.insert(e.name.as_str(), e);
        }
        latest
            .values()
            .filter(|e| !e.deleted && e.ready == 1 && e.template_generation == template_generation)
            .count()
    }

    /// A readable dump for assertion messages.
    pub fn render(entries: &[Entry]) -> String {
        entries
            .iter()
            .map(|e| {
                if e.kind == "Pod" {
                    return format!(
                        "{:>8} {:<11} {:<20} {} template={} ready={}",
                        e.revision,
                        e.kind,
                        e.name,
                        if e.deleted { "DELETED" } else { "       " },
                        e.template_generation,
                        e.ready
                    );
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(revision: u64, name: &str, template: i64, ready: bool, deleted: bool) -> Entry {
        Entry {
            revision,
            kind: "Pod",
            name: name.to_string(),
            deleted,
            ready: i32::from(ready),
            available: i32::from(ready),
            template_generation: template,
            owner: Some("ds".to_string()),
            ..Entry::default()
        }
    }

    #[test]
    fn current_ready_pods_counts_each_pods_latest_state_before_the_entry() {
        let entries = vec![
            pod(1, "a", 1, true, false),
            pod(2, "b", 1, true, false),
            pod(3, "a", 1, true, true),
            pod(4, "c", 2, false, false),
            pod(5, "c", 2, true, false),
            pod(6, "b", 2, true, false),
        ];
        assert_eq!(Timeline::current_ready_pods(&entries, 2, "ds", 1), 2);
        // "a" is being deleted, "c" is not Ready yet.
        assert_eq!(Timeline::current_ready_pods(&entries, 4, "ds", 1), 1);
        assert_eq!(Timeline::current_ready_pods(&entries, 4, "ds", 2), 0);
        assert_eq!(Timeline::current_ready_pods(&entries, 6, "ds", 2), 2);
        assert_eq!(Timeline::current_ready_pods(&entries, 6, "other", 2), 0);
        assert_eq!(Timeline::current_ready_pods(&entries, 99, "ds", 1), 0);
    }
}
