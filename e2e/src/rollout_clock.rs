//! Where an upgrade's time goes, as the fleet bench sees it: watches on a
//! driver's node DaemonSet, its controller StatefulSet and its
//! CSIDriverDeployment note, on the bench's own clock, when each of them
//! changed in a way that matters to the upgrade's length.
//!
//! Watches rather than the bench's 250 ms polls: the steps after the node
//! roll (the controller's surge, the status saying it is done) take well
//! under a second each, finer than a poll can tell apart.
//!
//! The DaemonSet is reduced to [`DaemonSetMarks`] (its status changes a few
//! hundred times in a 1000-node roll); the StatefulSet and the object's
//! status change a handful of times, so each distinct state is kept as a
//! line of the timeline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::fleet::rolled_out;

/// When a DaemonSet edited past generation `from` reached each point of
/// its roll, counted from the edit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DaemonSetMarks {
    /// The new spec stored (a generation past `from`).
    pub edited: Option<Duration>,
    /// Its controller observed the new generation.
    pub observed: Option<Duration>,
    /// The first pod on the new template.
    pub first_pod: Option<Duration>,
    /// Every pod updated and available ([`rolled_out`]).
    pub done: Option<Duration>,
}

impl DaemonSetMarks {
    /// Notes what `ds` shows `at` after the edit.
    pub fn observe(&mut self, ds: &DaemonSet, from: Option<i64>, at: Duration) {
        let generation = ds.metadata.generation;
        if generation <= from {
            return;
        }
        self.edited.get_or_insert(at);
        let Some(s) = ds.status.as_ref() else {
            return;
        };
        if s.observed_generation < generation {
            return;
        }
        self.observed.get_or_insert(at);
        if s.updated_number_scheduled.unwrap_or(0) > 0 {
            self.first_pod.get_or_insert(at);
        }
        if rolled_out(ds) {
            self.done.get_or_insert(at);
        }
    }
}

/// A controller StatefulSet as one line: what is asked (replicas,
/// partition) and what runs (replicas, ready, updated, whether every pod is
/// at the update revision).
pub fn statefulset_state(sts: &StatefulSet) -> String {
    let spec = sts.spec.as_ref();
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
    let partition = spec
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0);
    let st = sts.status.as_ref();
    let observed =
        st.and_then(|s| s.observed_generation).unwrap_or(0) >= sts.metadata.generation.unwrap_or(0);
    format!(
        "asks {replicas} (partition {partition}){}; has {} ready {} updated {}",
        if observed { "" } else { ", not observed yet" },
        st.map_or(0, |s| s.replicas),
        st.and_then(|s| s.ready_replicas).unwrap_or(0),
        st.and_then(|s| s.updated_replicas).unwrap_or(0),
    )
}

/// A CSIDriverDeployment's status as one line: its phase, current
/// version and rollout step (`-` when none runs).
pub fn object_state(obj: &Value) -> String {
    let s = &obj["status"];
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    format!(
        "{} at {}, step {}",
        text(&s["phase"]),
        text(&s["currentVersion"]),
        text(&s["rollout"]["step"])
    )
}

/// One change seen: when (from the edit), what, and its new state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub at: Duration,
    pub kind: &'static str,
    pub state: String,
}

#[derive(Default)]
struct Shared {
    /// The edit's moment: nothing is noted before it is set.
    zero: Option<Instant>,
    /// The DaemonSet's generation before the edit.
    from: Option<i64>,
    ds: DaemonSetMarks,
    marks: Vec<Mark>,
    /// The object as last seen after the zero.
    object: Option<Value>,
    /// Watches that have listed their object once.
    synced: usize,
}

/// The watches of one upgrade; they stop on drop.
pub struct RolloutClock {
    shared: Arc<Mutex<Shared>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RolloutClock {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// `csiops.dev/v1alpha1` CSIDriverDeployments.
fn csidd_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("csiops.dev", "v1alpha1", "CSIDriverDeployment"),
        "csidriverdeployments",
    )
}

fn named(name: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("metadata.name={name}"))
}

/// Runs a watch of one named object, handing each version to `note` with
/// the time since the zero (once it is set).
fn watch<K, F>(api: Api<K>, name: &str, shared: Arc<Mutex<Shared>>, mut note: F) -> JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut(&mut Shared, &K, Duration) + Send + 'static,
{
    let config = named(name);
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, config).boxed();
        let mut listed = false;
        while let Some(ev) = stream.next().await {
            let Ok(mut s) = shared.lock() else {
                return;
            };
            let o = match ev {
                Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => o,
                Ok(Event::InitDone) if !listed => {
                    listed = true;
                    s.synced += 1;
                    continue;
                }
                _ => continue,
            };
            if let Some(zero) = s.zero {
                let at = zero.elapsed();
                note(&mut s, &o, at);
            }
        }
    })
}

/// Adds a [`Mark`] when `state` differs from the last one of `kind`.
fn push_changed(s: &mut Shared, kind: &'static str, state: String, at: Duration) {
    let last = s.marks.iter().rev().find(|m| m.kind == kind);
    if last.is_none_or(|m| m.state != state) {
        s.marks.push(Mark { at, kind, state });
    }
}

impl RolloutClock {
    /// Starts watching, in `namespace`, the DaemonSet `daemonset`, and
    /// (when named) the StatefulSet `statefulset` and the
    /// CSIDriverDeployment `object`. Nothing is noted before [`Self::zero`].
    pub fn watch(
        client: &kube::Client,
        namespace: &str,
        daemonset: &str,
        statefulset: Option<&str>,
        object: Option<&str>,
    ) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let mut tasks = vec![watch(
            Api::<DaemonSet>::namespaced(client.clone(), namespace),
            daemonset,
            shared.clone(),
            |s, ds: &DaemonSet, at| {
                let from = s.from;
                s.ds.observe(ds, from, at);
            },
        )];
        if let Some(name) = statefulset {
            tasks.push(watch(
                Api::<StatefulSet>::namespaced(client.clone(), namespace),
                name,
                shared.clone(),
                |s, sts: &StatefulSet, at| {
                    push_changed(s, "StatefulSet", statefulset_state(sts), at)
                },
            ));
        }
        if let Some(name) = object {
            tasks.push(watch(
                Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &csidd_resource()),
                name,
                shared.clone(),
                |s, o: &DynamicObject, at| {
                    let value = serde_json::to_value(o);
                    let state = value
                        .as_ref()
                        .map(object_state)
                        .unwrap_or_else(|e| format!("unreadable: {e}"));
                    s.object = value.ok();
                    push_changed(s, "CSIDriverDeployment", state, at)
                },
            ));
        }
        RolloutClock { shared, tasks }
    }

    /// Waits until every watch has listed its object once (at most
    /// `limit`), so that no change after the edit goes unseen.
    pub async fn synced(&self, limit: Duration) -> crate::Result<()> {
        let all = self.tasks.len();
        crate::wait_for(limit, Duration::from_millis(20), || async {
            let s = self.shared.lock().ok()?;
            (s.synced >= all).then_some(())
        })
        .await
        .map_err(|_| {
            crate::Error::Other(format!(
                "the rollout clock's watches did not list within {limit:?}"
            ))
        })
    }

    /// Sets the edit's moment, `from` being the DaemonSet's generation
    /// before it; every change seen from now on is noted.
    pub fn zero(&self, at: Instant, from: Option<i64>) {
        if let Ok(mut s) = self.shared.lock() {
            s.zero = Some(at);
            s.from = from;
        }
    }

    /// Waits (at most `limit`) until a change of `kind` whose state
    /// `matches` has been seen: a poll may see the end before the watch
    /// delivers it. `None` when it was not seen in time.
    pub async fn seen(
        &self,
        kind: &str,
        matches: impl Fn(&str) -> bool,
        limit: Duration,
    ) -> Option<Duration> {
        crate::wait_for(limit, Duration::from_millis(10), || async {
            first(&self.marks(), kind, &matches)
        })
        .await
        .ok()
    }

    /// The CSIDriverDeployment as its watch last delivered it after the
    /// zero: read instead of a GET, so that timing the operator's side
    /// puts no more load on the API server than timing the bare side.
    pub fn object(&self) -> Option<Value> {
        self.shared.lock().ok()?.object.clone()
    }

    /// The DaemonSet's marks so far.
    pub fn daemonset(&self) -> DaemonSetMarks {
        self.shared.lock().map(|s| s.ds.clone()).unwrap_or_default()
    }

    /// The StatefulSet's and the object's changes so far, in the order seen.
    pub fn marks(&self) -> Vec<Mark> {
        self.shared
            .lock()
            .map(|s| s.marks.clone())
            .unwrap_or_default()
    }
}

/// When the first change of `kind` whose state `matches` was seen.
pub fn first(marks: &[Mark], kind: &str, matches: impl Fn(&str) -> bool) -> Option<Duration> {
    marks
        .iter()
        .find(|m| m.kind == kind && matches(&m.state))
        .map(|m| m.at)
}

/// `12.3 s`, or `-` for a moment not reached.
pub fn secs(d: Option<Duration>) -> String {
    d.map_or("-".to_string(), |d| format!("{:.2} s", d.as_secs_f64()))
}

/// The timeline as text: the DaemonSet's marks, then every other change.
pub fn render(ds: &DaemonSetMarks, marks: &[Mark]) -> String {
    let mut lines = vec![format!(
        "  DaemonSet: edited {}, observed {}, first pod {}, rolled out {}",
        secs(ds.edited),
        secs(ds.observed),
        secs(ds.first_pod),
        secs(ds.done)
    )];
    lines.extend(marks.iter().map(|m| {
        format!(
            "  {:>8.2} s  {:<19} {}",
            m.at.as_secs_f64(),
            m.kind,
            m.state
        )
    }));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(generation: i64, observed: i64, updated: i32, available: i32) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "x", "generation": generation},
            "status": {"observedGeneration": observed, "desiredNumberScheduled": 4,
                "currentNumberScheduled": 4, "numberMisscheduled": 0, "numberReady": available,
                "updatedNumberScheduled": updated, "numberAvailable": available}
        }))
        .expect("a DaemonSet")
    }

    #[test]
    fn daemonset_marks_follow_the_edit_its_observation_and_its_pods() {
        let ms = Duration::from_millis;
        let mut m = DaemonSetMarks::default();
        m.observe(&ds(1, 1, 4, 4), Some(1), ms(10));
        assert_eq!(m, DaemonSetMarks::default(), "before the edit");
        m.observe(&ds(2, 1, 4, 4), Some(1), ms(20));
        assert_eq!((m.edited, m.observed), (Some(ms(20)), None));
        m.observe(&ds(2, 2, 0, 3), Some(1), ms(30));
        assert_eq!((m.observed, m.first_pod), (Some(ms(30)), None));
        m.observe(&ds(2, 2, 1, 3), Some(1), ms(40));
        m.observe(&ds(2, 2, 4, 3), Some(1), ms(50));
        assert_eq!((m.first_pod, m.done), (Some(ms(40)), None));
        m.observe(&ds(2, 2, 4, 4), Some(1), ms(60));
        m.observe(&ds(3, 3, 4, 4), Some(1), ms(70));
        assert_eq!(
            m,
            DaemonSetMarks {
                edited: Some(ms(20)),
                observed: Some(ms(30)),
                first_pod: Some(ms(40)),
                done: Some(ms(60)),
            },
            "first moments are kept"
        );
    }

    #[test]
    fn a_statefulset_line_says_what_is_asked_and_what_runs() {
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "c", "generation": 4},
            "spec": {"replicas": 2, "selector": {}, "serviceName": "c", "template": {},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}},
            "status": {"observedGeneration": 3, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 0}
        }))
        .expect("a StatefulSet");
        assert_eq!(
            statefulset_state(&sts),
            "asks 2 (partition 1), not observed yet; has 1 ready 1 updated 0"
        );
    }

    #[test]
    fn an_object_line_says_phase_version_and_step() {
        let obj = json!({"status": {"phase": "Upgrading", "currentVersion": "v1",
            "rollout": {"step": "ControllerRoll"}}});
        assert_eq!(object_state(&obj), "Upgrading at v1, step ControllerRoll");
        assert_eq!(
            object_state(&json!({"status": {"phase": "Running", "currentVersion": "v2"}})),
            "Running at v2, step -"
        );
    }

    #[test]
    fn only_changed_states_are_kept() {
        let mut s = Shared::default();
        let ms = Duration::from_millis;
        push_changed(&mut s, "StatefulSet", "a".into(), ms(1));
        push_changed(&mut s, "CSIDriverDeployment", "x".into(), ms(2));
        push_changed(&mut s, "StatefulSet", "a".into(), ms(3));
        push_changed(&mut s, "StatefulSet", "b".into(), ms(4));
        let kept: Vec<_> = s.marks.iter().map(|m| (m.at, m.state.as_str())).collect();
        assert_eq!(kept, vec![(ms(1), "a"), (ms(2), "x"), (ms(4), "b")]);
        assert_eq!(first(&s.marks, "StatefulSet", |_| true), Some(ms(1)));
        assert_eq!(first(&s.marks, "StatefulSet", |x| x == "b"), Some(ms(4)));
        assert_eq!(first(&s.marks, "StatefulSet", |x| x == "x"), None);
        let text = render(&DaemonSetMarks::default(), &s.marks);
        assert!(text.contains("rolled out -"), "{text}");
        assert!(text.contains("0.00 s  StatefulSet"), "{text}");
    }
}
