//! kubelet's own words about pods that do not start: a volume that will not
//! mount is reported only as a `FailedMount` Event on the pod, never in its
//! status. One watch of those Events (field-selected by reason, so only
//! failures travel) keeps the latest message per pod; the health report
//! reads it for the pods that have been creating their containers for too
//! long, with no request per pod, and a new failure wakes the pod's owner.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Event;
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

use super::pod_cache::PodCache;
use super::sync::SyncFlag;
use crate::health;
use crate::pods::PodView;

/// A pod: `(namespace, name)`.
pub type PodKey = (String, String);

/// The latest `FailedMount` message per pod, with its time.
#[derive(Clone, Debug, Default)]
pub struct MountFailures(Arc<RwLock<HashMap<PodKey, (i64, String)>>>);

/// The longest message kept of a mount failure (bytes).
const MAX_MESSAGE: usize = 1024;

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// When the Event last happened (seconds since the epoch).
fn event_time(e: &Event) -> i64 {
    e.last_timestamp
        .as_ref()
        .or(e.first_timestamp.as_ref())
        .or(e.metadata.creation_timestamp.as_ref())
        .map(|t| t.0.as_second())
        .or_else(|| e.event_time.as_ref().map(|t| t.0.as_second()))
        .unwrap_or(0)
}

fn pod_of(e: &Event) -> Option<PodKey> {
    let o = &e.involved_object;
    if o.kind.as_deref() != Some("Pod") {
        return None;
    }
    Some((o.namespace.clone()?, o.name.clone()?))
}

impl MountFailures {
    /// kubelet's latest `FailedMount` message for each of `pods` stuck
    /// creating (see [`health::stuck_creating`]), by pod name.
    pub fn for_stuck(&self, pods: &[PodView], now: DateTime<Utc>) -> BTreeMap<String, String> {
        let Ok(map) = self.0.read() else {
            return BTreeMap::new();
        };
        pods.iter()
            .filter(|p| health::stuck_creating(p, now))
            .filter_map(|p| {
                let key = (p.namespace.to_string(), p.name().to_string());
                map.get(&key)
                    .map(|(_, m)| (p.name().to_string(), m.clone()))
            })
            .collect()
    }

    /// Records `e` if it is newer than what is known of its pod; the pod
    /// when its message changed.
    fn record(&self, e: &Event) -> Option<PodKey> {
        let pod = pod_of(e)?;
        // kubelet's messages are a few hundred bytes; an Event's may be far
        // longer, and only its start is shown.
        let message = truncate(e.message.as_deref()?, MAX_MESSAGE);
        let at = event_time(e);
        let mut map = self.0.write().ok()?;
        match map.get(&pod) {
            Some((t, m)) if *t > at || (*t == at && *m == message) => None,
            _ => {
                map.insert(pod.clone(), (at, message));
                Some(pod)
            }
        }
    }

    /// Forgets the pod of an expired Event.
    fn expire(&self, e: &Event) {
        if let (Some(pod), Ok(mut map)) = (pod_of(e), self.0.write()) {
            if map.get(&pod).is_some_and(|(t, _)| *t <= event_time(e)) {
                map.remove(&pod);
            }
        }
    }

    /// Watches the cluster's `FailedMount` Events; yields each pod whose
    /// latest failure changed. Only the Events of the operator's own pods
    /// (those in `pods`) are kept: the others concern nobody here, and
    /// anyone may create Events in their namespace.
    pub fn watch(
        &self,
        client: Client,
        synced: SyncFlag,
        pods: PodCache,
    ) -> impl Stream<Item = Result<PodKey, watcher::Error>> + Send + 'static {
        let this = self.clone();
        let ours = move |e: &Event| {
            pod_of(e).is_some_and(|(ns, name)| pods.owner_of(&ns, &name).is_some())
        };
        let config = watcher::Config::default()
            .fields("reason=FailedMount,involvedObject.kind=Pod")
            .page_size(super::paging::LIST_PAGE);
        watcher::watcher(Api::<Event>::all(client), config)
            .default_backoff()
            .filter_map(move |event| {
                let out = match event {
                    Err(e) => Some(Err(e)),
                    Ok(WatchEvent::Apply(e)) if ours(&e) => this.record(&e).map(Ok),
                    Ok(WatchEvent::InitApply(e)) if ours(&e) => {
                        this.record(&e);
                        None
                    }
                    Ok(WatchEvent::Apply(_) | WatchEvent::InitApply(_)) => None,
                    Ok(WatchEvent::Delete(e)) => {
                        this.expire(&e);
                        None
                    }
                    Ok(WatchEvent::Init) => None,
                    Ok(WatchEvent::InitDone) => {
                        synced.mark();
                        None
                    }
                };
                futures::future::ready(out)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(pod: &str, t: &str, m: &str) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{pod}.{m}")},
            "involvedObject": {"kind": "Pod", "namespace": "ns", "name": pod},
            "reason": "FailedMount", "lastTimestamp": t, "message": m
        }))
        .expect("event fixture")
    }

    fn stuck(name: &str) -> PodView {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "status": {"phase": "Pending",
              "conditions": [{"type": "PodScheduled", "status": "True",
                              "lastTransitionTime": "2026-11-21T09:00:00Z"}],
              "containerStatuses": [{"name": "driver",
                  "state": {"waiting": {"reason": "ContainerCreating"}}}]}
        }))
        .expect("pod fixture")
    }

    #[test]
    fn the_latest_failure_per_pod_is_kept_and_read_for_stuck_pods_only() {
        let failures = MountFailures::default();
        let a = ("ns".to_string(), "a".to_string());
        assert_eq!(
            failures.record(&ev("a", "2026-11-21T10:00:00Z", "older")),
            Some(a.clone())
        );
        assert_eq!(
            failures.record(&ev("a", "2026-11-21T10:00:05Z", "newer")),
            Some(a.clone())
        );
        // An older Event arriving late changes nothing; nor does a repeat.
        assert_eq!(
            failures.record(&ev("a", "2026-11-21T10:00:01Z", "older")),
            None
        );
        assert_eq!(
            failures.record(&ev("a", "2026-11-21T10:00:05Z", "newer")),
            None
        );
        failures.record(&ev("b", "2026-11-21T10:00:00Z", "b fails"));

        let now = DateTime::parse_from_rfc3339("2026-11-21T10:01:00Z")
            .map(|t| t.with_timezone(&Utc))
            .expect("time");
        let mut running = stuck("b");
        running.phase = Some("Running".into());
        let got = failures.for_stuck(&[stuck("a"), running], now);
        assert_eq!(
            got,
            BTreeMap::from([("a".to_string(), "newer".to_string())])
        );

        failures.expire(&ev("a", "2026-11-21T10:00:05Z", "newer"));
        assert!(failures.for_stuck(&[stuck("a")], now).is_empty());
    }
}
