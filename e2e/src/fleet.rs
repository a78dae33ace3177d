//! A fleet of CSIDriverDeployments on many kwok nodes, for the fleet
//! benchmark (`csiops-bench-fleet`): the drivers' manifests and edits, the
//! CSINodes the nodes' kubelets would write, their status as the bench reads
//! it, and a bare DaemonSet of a driver's node pod template to compare its
//! rollout with the operator's upgrade.
//!
//! kwok pods run nothing, so no driver runs on the nodes; what the rollout
//! waits for on a node besides its pod is the driver's CSINode entry, which
//! [`register_everywhere`] writes once for every node and driver, as the
//! kubelets would after the first registration (an entry outlives a pod
//! replacement that re-registers the same driver).

use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{json, Value};

use crate::testkit::DriverCr;
use crate::{wait_for, Error, Result};

/// Requests in flight while the bench writes its own objects.
const PARALLEL_WRITES: usize = 16;

/// The label value that keeps the bare DaemonSet's pods out of the
/// operator's watches (they select `managed-by=csiops-operator`).
pub const BARE_MANAGED_BY: &str = "csiops-bench";

/// The `i`-th driver of the fleet: its own namespace and driver name.
#[derive(Clone, Debug)]
pub struct FleetDriver {
    pub namespace: String,
    pub name: String,
    pub driver: String,
}

impl FleetDriver {
    pub fn new(i: usize) -> Self {
        FleetDriver {
            namespace: format!("fleet-{i:02}"),
            name: format!("d{i:02}"),
            driver: format!("d{i:02}.fleet.csiops.dev"),
        }
    }

    /// Its node DaemonSet, as the operator names it.
    pub fn daemonset(&self) -> String {
        format!("{}-node", self.name)
    }

    /// Its controller StatefulSet, as the operator names it.
    pub fn statefulset(&self) -> String {
        format!("{}-controller", self.name)
    }

    /// The Namespace and the CSIDriverDeployment at `version` (also the
    /// driver image's tag, as a release would bump both), rolling
    /// `max_unavailable` node pods at a time (`"10%"` or `"1"`).
    pub fn yaml(&self, version: &str, max_unavailable: &str) -> String {
        // An int-or-string: a count is an int, a percentage a string.
        let max_unavailable = match max_unavailable.parse::<u32>() {
            Ok(n) => json!(n),
            Err(_) => json!(max_unavailable),
        };
        DriverCr::new(&self.namespace, &self.name, &self.driver, version)
            .image(&format!("example.invalid/fleet-driver:{version}"))
            .driver_args(["--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(KUBE_NODE_NAME)"])
            .with("node.maxUnavailable", max_unavailable)
            .with("csiDriver.attachRequired", false)
            .yaml()
    }

    fn api(&self, client: &kube::Client) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), &self.namespace, &csidd_resource())
    }

    /// The object as the API server has it.
    pub async fn get(&self, client: &kube::Client) -> Result<Value> {
        let obj = self
            .api(client)
            .get(&self.name)
            .await
            .map_err(|e| Error::Other(format!("get {}/{}: {e}", self.namespace, self.name)))?;
        serde_json::to_value(obj).map_err(|e| Error::Other(format!("JSON: {e}")))
    }

    /// A merge patch of its spec.
    pub async fn patch_spec(&self, client: &kube::Client, spec: Value) -> Result<()> {
        self.api(client)
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await
            .map(drop)
            .map_err(|e| Error::Other(format!("patch {}/{}: {e}", self.namespace, self.name)))
    }

    /// The version edit of an upgrade (see [`FleetDriver::yaml`]).
    pub async fn upgrade(&self, client: &kube::Client, version: &str) -> Result<()> {
        let image = format!("example.invalid/fleet-driver:{version}");
        self.patch_spec(
            client,
            json!({"version": version, "driver": {"image": image}}),
        )
        .await
    }
}

fn csidd_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("csiops.dev", "v1alpha1", "CSIDriverDeployment"),
        "csidriverdeployments",
    )
}

/// Whether a CSIDriverDeployment (as JSON) is Running at `version` on all
/// `nodes`, with no rollout left.
pub fn settled(obj: &Value, version: &str, nodes: usize) -> bool {
    let status = &obj["status"];
    let count = |field: &str| status["node"][field].as_u64().unwrap_or(0) as usize;
    status["phase"] == "Running"
        && status["currentVersion"] == version
        && status["rollout"].is_null()
        && count("desired") == nodes
        && count("updated") == nodes
        && count("available") == nodes
}

/// Writes every node's CSINode with an entry for each of `drivers` (node
/// ID = node name). Existing CSINodes are left as they are.
pub async fn register_everywhere(
    client: &kube::Client,
    nodes: &[String],
    drivers: &[String],
) -> Result<()> {
    let api: Api<CSINode> = Api::all(client.clone());
    futures::stream::iter(nodes.iter().map(Ok))
        .try_for_each_concurrent(PARALLEL_WRITES, |node| {
            let api = api.clone();
            async move {
                match api
                    .create(&PostParams::default(), &csinode(node, drivers))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
                    Err(e) => Err(Error::Other(format!("CSINode {node}: {e}"))),
                }
            }
        })
        .await
}

fn csinode(node: &str, drivers: &[String]) -> CSINode {
    CSINode {
        metadata: ObjectMeta {
            name: Some(node.to_string()),
            ..Default::default()
        },
        spec: CSINodeSpec {
            drivers: drivers
                .iter()
                .map(|d| CSINodeDriver {
                    name: d.clone(),
                    node_id: node.to_string(),
                    ..Default::default()
                })
                .collect(),
        },
    }
}

/// A DaemonSet named `name` beside `live` (an operator's node DaemonSet)
/// with `live`'s spec: the same pod template, update strategy and node
/// placement, only relabelled so that neither the operator nor `live`'s
/// selector sees its pods. Applying it again with a later `live` rolls its
/// pods to that template.
pub fn bare_daemonset(live: &DaemonSet, name: &str) -> Result<DaemonSet> {
    let mut spec = live
        .spec
        .clone()
        .ok_or_else(|| Error::Other("the DaemonSet has no spec".into()))?;
    let relabel = |labels: &mut BTreeMap<String, String>| {
        for (k, v) in labels.iter_mut() {
            if k == "app.kubernetes.io/managed-by" {
                *v = BARE_MANAGED_BY.to_string();
            }
            if k == "app.kubernetes.io/instance" {
                *v = name.to_string();
            }
        }
    };
    if let Some(labels) = spec.selector.match_labels.as_mut() {
        relabel(labels);
    }
    if let Some(labels) = spec
        .template
        .metadata
        .as_mut()
        .and_then(|m| m.labels.as_mut())
    {
        relabel(labels);
    }
    Ok(DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: live.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                BARE_MANAGED_BY.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// Server-side apply of a DaemonSet the bench owns.
pub async fn apply_daemonset(client: &kube::Client, ds: &DaemonSet) -> Result<()> {
    let ns = ds.metadata.namespace.as_deref().unwrap_or("default");
    let name = ds.metadata.name.as_deref().unwrap_or_default();
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    api.patch(
        name,
        &PatchParams::apply(BARE_MANAGED_BY).force(),
        &Patch::Apply(ds),
    )
    .await
    .map(drop)
    .map_err(|e| Error::Other(format!("apply DaemonSet {ns}/{name}: {e}")))
}

/// Whether a DaemonSet's controller has rolled its current template out to
/// every node it schedules on, every pod available: what `kubectl rollout
/// status` waits for.
pub fn rolled_out(ds: &DaemonSet) -> bool {
    let generation = ds.metadata.generation.unwrap_or(0);
    let Some(s) = &ds.status else {
        return false;
    };
    s.observed_generation.unwrap_or(0) >= generation
        && s.desired_number_scheduled > 0
        && s.updated_number_scheduled.unwrap_or(0) == s.desired_number_scheduled
        && s.number_available.unwrap_or(0) == s.desired_number_scheduled
        && s.number_unavailable.unwrap_or(0) == 0
}

/// Waits until every one of `drivers` is [`settled`] at `version` on
/// `nodes` nodes, saying how many are every 30 s.
pub async fn wait_settled(
    client: &kube::Client,
    drivers: &[FleetDriver],
    version: &str,
    nodes: usize,
    limit: Duration,
) -> Result<()> {
    let started = Instant::now();
    let reported = std::sync::Mutex::new(Instant::now());
    wait_for(limit, Duration::from_secs(2), || async {
        let mut done = 0;
        for d in drivers {
            if d.get(client)
                .await
                .is_ok_and(|o| settled(&o, version, nodes))
            {
                done += 1;
            }
        }
        let mut reported = reported.lock().ok()?;
        if reported.elapsed() >= Duration::from_secs(30) {
            eprintln!(
                "  {done}/{} drivers Running at {version} after {:.0?}",
                drivers.len(),
                started.elapsed()
            );
            *reported = Instant::now();
        }
        (done == drivers.len()).then_some(())
    })
    .await
    .map_err(|_| {
        Error::Other(format!(
            "not every driver Running at {version} within {limit:?}"
        ))
    })
}

/// How a DaemonSet's rollout of a new template went: when a quarter, half,
/// three quarters and all of its pods ran the new template
/// (`updatedNumberScheduled`), and when it was [`rolled_out`], counted
/// from the edit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub quarters: [Option<Duration>; 4],
    pub done: Option<Duration>,
}

impl Progress {
    /// Notes what `ds` shows `elapsed` after the edit that took it past
    /// generation `from` (`None`: a new DaemonSet).
    pub fn observe(&mut self, ds: &DaemonSet, from: Option<i64>, elapsed: Duration) {
        let generation = ds.metadata.generation;
        let Some(s) = ds.status.as_ref() else {
            return;
        };
        if generation <= from || s.observed_generation < generation {
            return;
        }
        let (desired, updated) = (
            i64::from(s.desired_number_scheduled),
            i64::from(s.updated_number_scheduled.unwrap_or(0)),
        );
        for (i, q) in self.quarters.iter_mut().enumerate() {
            if q.is_none() && desired > 0 && 4 * updated >= desired * (i as i64 + 1) {
                *q = Some(elapsed);
            }
        }
        if self.done.is_none() && rolled_out(ds) {
            self.done = Some(elapsed);
        }
    }

    /// `25% 4.1 s, 50% 8.0 s, 75% 12.2 s, 100% 16.0 s`.
    pub fn summary(&self) -> String {
        let at = |d: Option<Duration>| {
            d.map_or("-".to_string(), |d| format!("{:.1} s", d.as_secs_f64()))
        };
        ["25%", "50%", "75%", "100%"]
            .iter()
            .zip(self.quarters)
            .map(|(pct, d)| format!("{pct} {}", at(d)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Waits until the DaemonSet `ns/name`, edited at `since` past generation
/// `from`, has [`rolled_out`] its template, reading it every `poll`.
pub async fn wait_rolled_out(
    client: &kube::Client,
    ns: &str,
    name: &str,
    from: Option<i64>,
    since: Instant,
    poll: Duration,
    limit: Duration,
) -> Result<Progress> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    let progress = std::sync::Mutex::new(Progress::default());
    wait_for(limit, poll, || async {
        let ds = api.get(name).await.ok()?;
        let mut p = progress.lock().ok()?;
        p.observe(&ds, from, since.elapsed());
        p.done.map(|_| p.clone())
    })
    .await
    .map_err(|_| {
        Error::Other(format!(
            "DaemonSet {ns}/{name} not rolled out within {limit:?}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_carries_version_image_and_budget() {
        let d = FleetDriver::new(3);
        let yaml = d.yaml("v2", "10%");
        assert!(yaml.contains("namespace: fleet-03"), "{yaml}");
        assert!(yaml.contains("driverName: d03.fleet.csiops.dev"), "{yaml}");
        assert!(yaml.contains("version: v2"), "{yaml}");
        assert!(yaml.contains("fleet-driver:v2"), "{yaml}");
        assert!(yaml.contains("maxUnavailable: \"10%\""), "{yaml}");
        assert!(d.yaml("v1", "1").contains("maxUnavailable: 1\n"));
        assert_eq!(d.daemonset(), "d03-node");
        assert_eq!(d.statefulset(), "d03-controller");
    }

    #[test]
    fn settled_needs_every_count_and_no_rollout() {
        let mut obj = json!({"status": {
            "phase": "Running", "currentVersion": "v2",
            "node": {"desired": 5, "updated": 5, "available": 5},
        }});
        assert!(settled(&obj, "v2", 5));
        assert!(!settled(&obj, "v1", 5));
        assert!(!settled(&obj, "v2", 6));
        obj["status"]["rollout"] = json!({"step": "ControllerRoll"});
        assert!(!settled(&obj, "v2", 5));
        obj["status"]["rollout"] = Value::Null;
        obj["status"]["node"]["available"] = json!(4);
        assert!(!settled(&obj, "v2", 5));
    }

    #[test]
    fn the_bare_daemonset_keeps_the_template_under_other_labels() {
        let live: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "d00-node", "namespace": "fleet-00",
                "ownerReferences": [{"apiVersion": "csiops.dev/v1alpha1", "kind": "CSIDriverDeployment",
                    "name": "d00", "uid": "u", "controller": true}],
                "annotations": {"csiops.dev/applied-hash": "abc"}},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/managed-by": "csiops-operator",
                    "app.kubernetes.io/instance": "d00", "app.kubernetes.io/component": "node"}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
                "template": {
                    "metadata": {"labels": {"app.kubernetes.io/managed-by": "csiops-operator",
                        "app.kubernetes.io/instance": "d00", "app.kubernetes.io/component": "node"},
                        "annotations": {"csiops.dev/version": "v1"}},
                    "spec": {"containers": [{"name": "driver", "image": "x:v1"}]}
                }
            }
        }))
        .expect("a DaemonSet");
        let bare = bare_daemonset(&live, "bare-node").expect("bare");
        assert_eq!(bare.metadata.name.as_deref(), Some("bare-node"));
        assert_eq!(bare.metadata.namespace.as_deref(), Some("fleet-00"));
        assert!(bare.metadata.owner_references.is_none());
        assert!(bare.metadata.annotations.is_none());
        let spec = bare.spec.expect("spec");
        let selector = spec.selector.match_labels.expect("selector");
        assert_eq!(selector["app.kubernetes.io/managed-by"], BARE_MANAGED_BY);
        assert_eq!(selector["app.kubernetes.io/instance"], "bare-node");
        assert_eq!(selector["app.kubernetes.io/component"], "node");
        let template = spec.template;
        let meta = template.metadata.expect("template metadata");
        assert_eq!(
            meta.labels.expect("labels")["app.kubernetes.io/instance"],
            "bare-node"
        );
        assert_eq!(
            meta.annotations.expect("annotations")["csiops.dev/version"],
            "v1"
        );
        assert_eq!(
            template.spec.expect("pod spec").containers[0]
                .image
                .as_deref(),
            Some("x:v1")
        );
        assert_eq!(
            serde_json::to_value(spec.update_strategy).expect("JSON"),
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}})
        );
    }

    #[test]
    fn progress_counts_the_pods_on_the_new_template_from_the_edit_on() {
        let ds = |generation: i64, observed: i64, updated: i32, available: i32| {
            serde_json::from_value::<DaemonSet>(json!({
                "metadata": {"name": "x", "generation": generation},
                "status": {"observedGeneration": observed, "desiredNumberScheduled": 8,
                    "currentNumberScheduled": 8, "numberMisscheduled": 0, "numberReady": available,
                    "updatedNumberScheduled": updated, "numberAvailable": available}
            }))
            .expect("a DaemonSet")
        };
        let s = Duration::from_secs;
        let mut p = Progress::default();
        p.observe(&ds(1, 1, 8, 8), Some(1), s(1));
        p.observe(&ds(2, 1, 8, 8), Some(1), s(2));
        assert_eq!(p, Progress::default(), "the edit is not observed yet");
        p.observe(&ds(2, 2, 3, 7), Some(1), s(3));
        p.observe(&ds(2, 2, 6, 6), Some(1), s(4));
        assert_eq!(p.quarters, [Some(s(3)), Some(s(4)), Some(s(4)), None]);
        p.observe(&ds(2, 2, 8, 7), Some(1), s(5));
        assert_eq!((p.quarters[3], p.done), (Some(s(5)), None));
        p.observe(&ds(2, 2, 8, 8), Some(1), s(6));
        assert_eq!(p.done, Some(s(6)));
        assert_eq!(p.summary(), "25% 3.0 s, 50% 4.0 s, 75% 4.0 s, 100% 5.0 s");
    }

    #[test]
    fn rolled_out_waits_for_every_pod_of_the_current_generation() {
        let ds = |generation: i64, observed: i64, desired: i32, updated: i32, available: i32| {
            serde_json::from_value::<DaemonSet>(json!({
                "metadata": {"name": "x", "generation": generation},
                "status": {"observedGeneration": observed, "desiredNumberScheduled": desired,
                    "currentNumberScheduled": desired, "numberMisscheduled": 0, "numberReady": available,
                    "updatedNumberScheduled": updated, "numberAvailable": available}
            }))
            .expect("a DaemonSet")
        };
        assert!(rolled_out(&ds(2, 2, 10, 10, 10)));
        assert!(!rolled_out(&ds(2, 1, 10, 10, 10)), "the edit not seen yet");
        assert!(!rolled_out(&ds(2, 2, 10, 9, 10)));
        assert!(!rolled_out(&ds(2, 2, 10, 10, 9)));
        assert!(!rolled_out(&ds(2, 2, 0, 0, 0)), "no node at all");
    }
}
