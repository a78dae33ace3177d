//! kubelet's own words about pods that do not start: a volume that will not
//! mount is reported only as a `FailedMount` Event on the pod, never in its
//! status, so the health report reads those Events for the pods that have
//! been creating their containers for too long.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use tracing::warn;

use crate::health;
use csiops_runtime::chain;

/// kubelet's latest `FailedMount` message for each of `pods` stuck creating
/// (see [`health::stuck_creating`]); one list call per such pod. A failed
/// read leaves the pod out: health is reported again on the next reconcile.
pub async fn mount_failures(
    client: &kube::Client,
    namespace: &str,
    pods: &[Pod],
    now: DateTime<Utc>,
) -> BTreeMap<String, String> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let mut failures = BTreeMap::new();
    for pod in pods.iter().filter(|p| health::stuck_creating(p, now)) {
        let Some(uid) = pod.uid() else { continue };
        let params =
            ListParams::default().fields(&format!("involvedObject.uid={uid},reason=FailedMount"));
        match api.list(&params).await {
            Ok(list) => {
                if let Some(msg) = latest_message(&list.items) {
                    failures.insert(pod.name_any(), msg);
                }
            }
            Err(e) => warn!(pod = %pod.name_any(), error = %chain(&e), "reading the pod's Events"),
        }
    }
    failures
}

/// The message of the most recent Event (last seen, else first, else created).
fn latest_message(events: &[Event]) -> Option<String> {
    events
        .iter()
        .max_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .or(e.first_timestamp.as_ref())
                .or(e.metadata.creation_timestamp.as_ref())
                .map(|t| t.0)
        })
        .and_then(|e| e.message.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_latest_event_wins() {
        let ev = |t: &str, m: &str| -> Event {
            serde_json::from_value(json!({
                "metadata": {"name": m}, "involvedObject": {},
                "lastTimestamp": t, "message": m
            }))
            .expect("event fixture")
        };
        let events = [
            ev("2026-11-21T10:00:05Z", "newer"),
            ev("2026-11-21T10:00:00Z", "older"),
        ];
        assert_eq!(latest_message(&events).as_deref(), Some("newer"));
        assert_eq!(latest_message(&[]), None);
    }
}
