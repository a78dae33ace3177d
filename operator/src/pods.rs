//! What the operator keeps of each of its pods.
//!
//! The operator watches every pod of every driver it deploys: on a
//! 1000-node cluster with 20 drivers, 20 000 pods. A `k8s_openapi` Pod is
//! 2.2 KB before any of its strings, and a running pod's container statuses
//! alone are several more, so the cache holds a [`PodView`] instead: read
//! straight from the API server's JSON (serde skips every field not named
//! here), with only what health and the rollout look at. It carries no
//! `ObjectMeta` (360 bytes empty, and a label map of its own): the strings
//! that repeat from pod to pod (namespace, node, phase, the kept labels) are
//! shared `Arc<str>`s once the cache interned them (see
//! `reconcile::watch::pod_cache`), so a pod costs a few hundred bytes.
//!
//! The watch reads pods in protobuf ([`wire`], `reconcile::watch::pod_watch`);
//! the JSON reading is kept for the tests and anything that has a pod as
//! JSON. Both go through one conversion.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;

use crate::render::labels::{COMPONENT, INSTANCE};

pub mod wire;

/// The StatefulSet's and DaemonSet's label with the pod's revision.
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// The label of a DaemonSet pod with its template generation.
pub const POD_TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

/// Labels kept of a pod: the rest is never read.
const KEPT_LABELS: [&str; 4] = [
    INSTANCE,
    COMPONENT,
    REVISION_LABEL,
    POD_TEMPLATE_GENERATION_LABEL,
];

/// A pod condition, as far as it is read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cond {
    pub status: bool,
    /// Seconds since the epoch.
    pub since: Option<i64>,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// A container waiting for a reason worth reporting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub container: String,
    pub reason: String,
    pub message: Option<String>,
}

/// One of the operator's pods, reduced.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "RawPod")]
pub struct PodView {
    pub name: Arc<str>,
    pub namespace: Arc<str>,
    /// It has a deletion timestamp.
    pub terminating: bool,
    /// The values of [`KEPT_LABELS`], in that order.
    labels: [Option<Arc<str>>; 4],
    pub node: Option<Arc<str>>,
    pub phase: Option<Arc<str>>,
    /// `status.message` (a Failed pod says why there).
    pub message: Option<String>,
    pub ready: Option<Cond>,
    pub scheduled: Option<Cond>,
    /// Containers waiting with a reason other than a plain start (the ones
    /// merely `ContainerCreating` are counted in `creating`).
    pub waiting: Vec<Waiting>,
    /// How many containers have a status, and how many of those wait in
    /// `ContainerCreating`.
    pub containers: u16,
    pub creating: u16,
}

impl PodView {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A kept label's value (`None` for every other label).
    pub fn label(&self, key: &str) -> Option<&str> {
        let i = KEPT_LABELS.iter().position(|k| *k == key)?;
        self.labels[i].as_deref()
    }

    /// Sets a kept label; other labels are not kept (returns false).
    pub fn set_label(&mut self, key: &str, value: &str) -> bool {
        match KEPT_LABELS.iter().position(|k| *k == key) {
            Some(i) => {
                self.labels[i] = Some(value.into());
                true
            }
            None => false,
        }
    }

    pub fn deleting(&self) -> bool {
        self.terminating
    }

    pub fn is_ready(&self) -> bool {
        self.ready.as_ref().is_some_and(|c| c.status)
    }

    /// The same pod with its repeated strings replaced by `intern`'s shared
    /// copies.
    pub fn interned(mut self, mut intern: impl FnMut(Arc<str>) -> Arc<str>) -> Self {
        self.namespace = intern(self.namespace);
        for slot in [&mut self.node, &mut self.phase]
            .into_iter()
            .chain(self.labels.iter_mut())
        {
            *slot = slot.take().map(&mut intern);
        }
        self
    }
}

// The wire shape, only the fields read.

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawMeta {
    name: Option<String>,
    namespace: Option<String>,
    deletion_timestamp: Option<Time>,
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawSpec {
    node_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    last_transition_time: Option<Time>,
    reason: Option<String>,
    message: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawWaiting {
    reason: Option<String>,
    message: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawTerminated {
    message: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawState {
    waiting: Option<RawWaiting>,
    terminated: Option<RawTerminated>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawContainerStatus {
    name: String,
    state: Option<RawState>,
    last_state: Option<RawState>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawStatus {
    phase: Option<String>,
    message: Option<String>,
    conditions: Vec<RawCondition>,
    container_statuses: Vec<RawContainerStatus>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawPod {
    metadata: RawMeta,
    spec: RawSpec,
    status: RawStatus,
}

fn cond(c: RawCondition) -> Cond {
    Cond {
        status: c.status == "True",
        since: c.last_transition_time.map(|t| t.0.as_second()),
        reason: c.reason,
        message: c.message,
    }
}

fn wire_time(t: Option<wire::Time>) -> Option<Time> {
    let seconds = t?.seconds?;
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .ok()
        .map(Time)
}

/// A string field as JSON has it: kube-apiserver's protobuf carries every
/// string, empty or not, where its JSON leaves the empty ones out.
fn given(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// The protobuf pod in the shape the JSON one is read into, so both go
/// through one conversion.
impl From<wire::Pod> for RawPod {
    fn from(pod: wire::Pod) -> Self {
        let meta = pod.metadata.unwrap_or_default();
        let status = pod.status.unwrap_or_default();
        let state = |s: Option<wire::ContainerState>| {
            s.map(|s| RawState {
                waiting: s.waiting.map(|w| RawWaiting {
                    reason: given(w.reason),
                    message: given(w.message),
                }),
                terminated: s.terminated.map(|t| RawTerminated {
                    message: given(t.message),
                }),
            })
        };
        RawPod {
            metadata: RawMeta {
                name: given(meta.name),
                namespace: given(meta.namespace),
                deletion_timestamp: wire_time(meta.deletion_timestamp),
                labels: meta.labels.into_iter().collect(),
            },
            spec: RawSpec {
                node_name: given(pod.spec.and_then(|s| s.node_name)),
            },
            status: RawStatus {
                phase: given(status.phase),
                message: given(status.message),
                conditions: status
                    .conditions
                    .into_iter()
                    .map(|c| RawCondition {
                        type_: c.r#type.unwrap_or_default(),
                        status: c.status.unwrap_or_default(),
                        last_transition_time: wire_time(c.last_transition_time),
                        reason: given(c.reason),
                        message: given(c.message),
                    })
                    .collect(),
                container_statuses: status
                    .container_statuses
                    .into_iter()
                    .map(|c| RawContainerStatus {
                        name: c.name.unwrap_or_default(),
                        state: state(c.state),
                        last_state: state(c.last_state),
                    })
                    .collect(),
            },
        }
    }
}

impl From<wire::Pod> for PodView {
    fn from(pod: wire::Pod) -> Self {
        RawPod::from(pod).into()
    }
}

impl From<RawPod> for PodView {
    fn from(raw: RawPod) -> Self {
        let RawPod {
            metadata,
            spec,
            status,
        } = raw;
        let mut labels = metadata.labels;
        let mut view = PodView {
            name: metadata.name.unwrap_or_default().into(),
            namespace: metadata.namespace.unwrap_or_default().into(),
            terminating: metadata.deletion_timestamp.is_some(),
            labels: KEPT_LABELS.map(|k| labels.remove(k).map(Arc::from)),
            node: spec.node_name.map(Arc::from),
            phase: status.phase.map(Arc::from),
            message: status.message,
            containers: status.container_statuses.len().min(u16::MAX as usize) as u16,
            ..PodView::default()
        };
        for c in status.conditions {
            match c.type_.as_str() {
                "Ready" => view.ready = Some(cond(c)),
                "PodScheduled" => view.scheduled = Some(cond(c)),
                _ => {}
            }
        }
        for cs in status.container_statuses {
            let Some(w) = cs.state.and_then(|s| s.waiting) else {
                continue;
            };
            // A crash-looping container's own words (its termination
            // message: what a sidecar that refuses its driver writes) say
            // more than kubelet's "back-off 5m0s".
            let last_words = cs
                .last_state
                .and_then(|s| s.terminated)
                .and_then(|t| t.message)
                .map(|m| m.trim().to_string())
                .filter(|m| !m.is_empty());
            match w.reason.as_deref() {
                Some("ContainerCreating") => view.creating += 1,
                Some(reason) => view.waiting.push(Waiting {
                    container: cs.name,
                    reason: reason.to_string(),
                    message: match (reason, last_words) {
                        ("CrashLoopBackOff", Some(words)) => Some(match w.message {
                            Some(m) => format!("{words} ({m})"),
                            None => words,
                        }),
                        _ => w.message,
                    },
                }),
                None => {}
            }
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_health_needs_from_a_full_pod() {
        let pod: PodView = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "x-node-abc", "namespace": "ns", "uid": "u1",
                "resourceVersion": "42",
                "labels": {INSTANCE: "x", COMPONENT: "node", POD_TEMPLATE_GENERATION_LABEL: "3",
                           "app": "dropped"},
                "annotations": {"big": "dropped"},
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "driver", "image": "i"}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-21T09:00:00Z"},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                {"type": "Initialized", "status": "True"}],
              "containerStatuses": [
                {"name": "driver", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"waiting": {"reason": "ContainerCreating"}}},
                {"name": "registrar", "image": "i", "imageID": "", "ready": false, "restartCount": 3,
                 "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}}},
                {"name": "probe", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-11-21T09:00:01Z"}}}]}
        }))
        .expect("a pod parses");
        assert_eq!(pod.name(), "x-node-abc");
        assert_eq!(pod.node.as_deref(), Some("n1"));
        assert_eq!(pod.label(POD_TEMPLATE_GENERATION_LABEL), Some("3"));
        assert_eq!(pod.label("app"), None);
        assert_eq!(&*pod.namespace, "ns");
        assert!(!pod.is_ready());
        assert_eq!(
            pod.scheduled.as_ref().and_then(|c| c.since),
            Some(1_795_251_600)
        );
        assert_eq!((pod.containers, pod.creating), (3, 1));
        assert_eq!(
            pod.waiting,
            vec![Waiting {
                container: "registrar".into(),
                reason: "CrashLoopBackOff".into(),
                message: Some("back-off 5m0s".into()),
            }]
        );
    }

    #[test]
    fn a_crash_looping_container_is_reported_in_its_own_words() {
        let pod: PodView = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "status": {"containerStatuses": [
                {"name": "node-driver-registrar",
                 "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
                 "lastState": {"terminated": {"exitCode": 1,
                    "message": "the driver reports the name \"a\" (GetPluginInfo) but its CSIDriverDeployment's spec.driverName is \"b\"\n"}}},
                {"name": "csi-driver",
                 "state": {"waiting": {"reason": "ImagePullBackOff", "message": "pull failed"}},
                 "lastState": {"terminated": {"message": "old words"}}}]}
        }))
        .expect("parses");
        assert_eq!(
            pod.waiting[0].message.as_deref(),
            Some("the driver reports the name \"a\" (GetPluginInfo) but its CSIDriverDeployment's spec.driverName is \"b\" (back-off 20s)")
        );
        // Only a crash loop takes the last words; other waits keep kubelet's.
        assert_eq!(pod.waiting[1].message.as_deref(), Some("pull failed"));
    }

    #[test]
    fn a_pod_with_nothing_but_a_name_parses() {
        let pod: PodView =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("parses");
        assert_eq!(pod.name(), "p");
        assert_eq!((pod.containers, pod.creating), (0, 0));
        assert_eq!(pod.label(INSTANCE), None);
        assert!(!pod.deleting());
    }

    #[test]
    fn interning_shares_the_repeated_strings() {
        let parse = |name: &str| -> PodView {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "labels": {INSTANCE: "x", COMPONENT: "node"}},
                "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}
            }))
            .expect("parses")
        };
        let mut pool: std::collections::HashSet<Arc<str>> = Default::default();
        let mut intern = |s: Arc<str>| match pool.get(&s) {
            Some(shared) => shared.clone(),
            None => {
                pool.insert(s.clone());
                s
            }
        };
        let a = parse("a").interned(&mut intern);
        let b = parse("b").interned(&mut intern);
        for (x, y) in [
            (&a.namespace, &b.namespace),
            (
                a.node.as_ref().expect("node"),
                b.node.as_ref().expect("node"),
            ),
            (
                a.phase.as_ref().expect("phase"),
                b.phase.as_ref().expect("phase"),
            ),
        ] {
            assert!(Arc::ptr_eq(x, y), "{x} is shared");
        }
        assert_eq!(
            (a.label(INSTANCE), b.label(COMPONENT)),
            (Some("x"), Some("node"))
        );
        assert_eq!(a.name(), "a");
        let mut c = a.clone();
        assert!(c.set_label(REVISION_LABEL, "r1"));
        assert!(!c.set_label("app", "dropped"));
        assert_eq!(
            (c.label(REVISION_LABEL), c.label("app")),
            (Some("r1"), None)
        );
    }
}
