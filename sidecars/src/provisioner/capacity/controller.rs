//! The capacity controller: a planner that, every second, compares what
//! should be published (from the provisioner's caches of classes, CSINodes
//! and Nodes) with the managed objects (a watch of CSIStorageCapacity in
//! `NAMESPACE` filtered by our labels), and workers (`--capacity-threads`)
//! that call GetCapacity and create, update or delete objects.
//!
//! What gets queued, as upstream: every pair at start and every
//! `--capacity-poll-interval`; a pair as soon as it becomes desired or
//! loses its object (someone deleted it); an object as soon as it becomes
//! obsolete (its class or segment is gone, or it duplicates another); and
//! the pairs of a volume's segments (or class) when a PV of the driver
//! appears or goes, which is when capacity moves. Failures are retried per
//! key with `--retry-interval-start`/`--retry-interval-max` backoff. It
//! runs in the provisioner's leader section, so only the leader writes.
//!
//! In node deployment every node's provisioner publishes for its own
//! segment only (the driver's NodeGetInfo topology, upstream's fixed
//! topology), and labels and watches its objects with its own managed-by
//! value (`external-provisioner-<node>`, see [`objects::managed_by`]).
//!
//! The planner polls the caches instead of hooking their events: a pass
//! over the cached objects costs microseconds per node, and it keeps this
//! module independent of the provisioner's controller.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use csiops_proto::client::with_timeout;
use csiops_proto::csi::v1::controller_service_capability::rpc::Type as Rpc;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

use super::args::{CapacityArgs, CapacityEnv};
use super::objects::{self, Assignment, Reported, Touched, WorkItem};
use super::owner;
use super::CapacityError;
use crate::common::cache::Cached;
use crate::common::driver::{code_name, Driver};
use crate::common::kube::{self as kube_client, ApiRequests, KubeArgs};
use crate::common::ratelimit::{Limiter, Priority, PriorityLayer};
use crate::common::watch::drive;
use crate::common::workqueue::{Backoff, QueueMetrics, WorkQueue};
use csiops_runtime::chain;
use csiops_runtime::leader::LeaseGuard;
use csiops_runtime::shutdown::CancellationToken;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

/// How often the planner compares desired and existing objects.
const PLAN_EVERY: Duration = Duration::from_secs(1);
/// How long an object we created is counted as existing before the watch
/// shows it; past that it is presumed deleted meanwhile and made again.
const CREATED_GRACE: Duration = Duration::from_secs(60);

/// A unit of work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// Ask GetCapacity for the pair; create or update its object.
    Sync(WorkItem),
    /// Delete the obsolete object of this name.
    Delete(String),
}

/// Why one sync or delete failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("GetCapacity for class {class:?} in segment {segment:?} failed: {code}: {message}")]
    GetCapacity {
        class: String,
        segment: objects::Segment,
        code: &'static str,
        message: String,
    },
    #[error("cannot {verb} CSIStorageCapacity {name}")]
    Write {
        verb: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// The capacity queue and upstream's three gauges
/// (`csistoragecapacities_desired_goal`, `…_desired_current`,
/// `csistoragecapacities_obsolete`), made before the metrics registry is
/// shared; the queue shows in `workqueue_*{name="csistoragecapacity"}`.
#[derive(Clone)]
pub struct CapacityMetrics {
    pub queue: Arc<WorkQueue<Key>>,
    goal: Gauge,
    current: Gauge,
    obsolete: Gauge,
}

impl CapacityMetrics {
    pub fn new(backoff: Backoff) -> Self {
        CapacityMetrics {
            queue: Arc::new(WorkQueue::new(backoff)),
            goal: Gauge::default(),
            current: Gauge::default(),
            obsolete: Gauge::default(),
        }
    }

    pub fn register(&self, registry: &mut Registry, queues: &mut QueueMetrics) {
        registry.register(
            "csistoragecapacities_desired_goal",
            "Number of CSIStorageCapacity objects that are supposed to be managed automatically.",
            self.goal.clone(),
        );
        registry.register(
            "csistoragecapacities_desired_current",
            "Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.",
            self.current.clone(),
        );
        registry.register(
            "csistoragecapacities_obsolete",
            "Number of CSIStorageCapacity objects that exist and will be deleted automatically.",
            self.obsolete.clone(),
        );
        queues.add("csistoragecapacity", self.queue.clone());
    }
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Inputs of [`CapacityController::prepare`].
pub struct CapacitySetup<'a> {
    pub args: &'a CapacityArgs,
    pub env: CapacityEnv,
    pub kube: &'a KubeArgs,
    pub requests: &'a ApiRequests,
    pub driver: &'a Driver,
    pub driver_name: &'a str,
    /// The driver has VOLUME_ACCESSIBILITY_CONSTRAINTS (and the gate is on).
    pub topology: bool,
    /// `--timeout` of each GetCapacity.
    pub timeout: Duration,
    pub metrics: CapacityMetrics,
    /// Held while this replica leads: no write without it.
    pub lease: LeaseGuard,
    /// The managed-by label value ([`objects::managed_by`]).
    pub managed_by: String,
    /// Node deployment: the one segment to publish for (this node's, empty
    /// when the driver reports no topology); `None` centrally, where the
    /// segments come from the Nodes and CSINodes.
    pub fixed_segment: Option<objects::Segment>,
}

/// What the planner last decided, read by the workers.
#[derive(Default)]
struct Plan {
    desired: BTreeSet<WorkItem>,
    params: BTreeMap<String, BTreeMap<String, String>>,
    assignment: Assignment,
    /// Objects we created that the watch has not shown yet, by name.
    created: HashMap<String, (Instant, Arc<CSIStorageCapacity>)>,
}

/// See the module documentation.
pub struct CapacityController {
    api: Api<CSIStorageCapacity>,
    driver: Driver,
    driver_name: String,
    managed_by: String,
    fixed_segment: Option<objects::Segment>,
    namespace: String,
    owner: Option<OwnerReference>,
    topology: bool,
    immediate: bool,
    poll: Duration,
    threads: usize,
    timeout: Duration,
    queue: Arc<WorkQueue<Key>>,
    metrics: CapacityMetrics,
    plan: Mutex<Plan>,
}

impl CapacityController {
    /// Checks that the driver has GET_CAPACITY, makes the capacity client
    /// (its own `--kube-api-capacity-qps`/`-burst` bucket, as upstream) and
    /// finds the owner. `Ok(None)` when the driver lacks the capability:
    /// logged as an error, provisioning goes on without publishing. An
    /// owner that cannot be found ends the process, as upstream.
    pub async fn prepare(s: CapacitySetup<'_>) -> Result<Option<Arc<Self>>, CapacityError> {
        match s.driver.controller_capabilities().await {
            Ok(caps) if caps.contains(&Rpc::GetCapacity) => {}
            Ok(_) => {
                tracing::error!(
                    driver = %s.driver_name,
                    "--enable-capacity: the driver does not advertise the GET_CAPACITY controller capability; no CSIStorageCapacity objects are published"
                );
                return Ok(None);
            }
            Err(e) => {
                tracing::error!(
                    driver = %s.driver_name,
                    code = code_name(e.code()),
                    message = e.message(),
                    "--enable-capacity: ControllerGetCapabilities failed; no CSIStorageCapacity objects are published"
                );
                return Ok(None);
            }
        }
        let config = kube_client::config(s.kube).await?;
        let layer = PriorityLayer {
            limiter: Limiter::new(
                s.args.kube_api_capacity_qps,
                s.args.kube_api_capacity_burst,
                s.requests.limiter.clone(),
            ),
            priority: Priority::Normal,
            requests: s.requests.clone(),
            lease: s.lease.clone(),
        };
        let client = kube::client::ClientBuilder::try_from(config)
            .map_err(kube_client::KubeError::Client)?
            .with_layer(&layer)
            .build();
        let owner = match &s.env.pod_name {
            Some(pod) => {
                owner::lookup(
                    &client,
                    &s.env.namespace,
                    pod,
                    s.args.capacity_ownerref_level,
                )
                .await?
            }
            None => None,
        };
        match &owner {
            Some(o) => tracing::info!(
                owner = %format!("{}/{} {}", o.api_version, o.kind, o.name),
                namespace = %s.env.namespace,
                "publishing CSIStorageCapacity objects"
            ),
            None => tracing::info!(
                namespace = %s.env.namespace,
                "publishing CSIStorageCapacity objects without an owner"
            ),
        }
        Ok(Some(Arc::new(CapacityController {
            api: Api::namespaced(client, &s.env.namespace),
            driver: s.driver.clone(),
            driver_name: s.driver_name.to_string(),
            managed_by: s.managed_by,
            fixed_segment: s.fixed_segment,
            namespace: s.env.namespace,
            owner,
            topology: s.topology,
            immediate: s.args.capacity_for_immediate_binding,
            poll: s.args.capacity_poll_interval,
            threads: s.args.capacity_threads,
            timeout: s.timeout,
            queue: s.metrics.queue.clone(),
            metrics: s.metrics,
            plan: Mutex::new(Plan::default()),
        })))
    }

    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs until `shutdown`, reading the provisioner's caches.
    pub async fn run(self: Arc<Self>, caches: Inputs, shutdown: CancellationToken) {
        let selector = format!(
            "{}={},{}={}",
            objects::DRIVER_NAME_LABEL,
            self.driver_name,
            objects::MANAGED_BY_LABEL,
            self.managed_by
        );
        let (store, writer) = reflector::store();
        let stream = watcher(
            self.api.clone(),
            watcher::Config::default().labels(&selector),
        )
        .default_backoff()
        .modify(|o| o.managed_fields_mut().clear())
        .reflect(writer);
        // Owned by this future, as the workers below: dropping it (a lost
        // Lease) aborts them all at once.
        let mut tasks = JoinSet::new();
        tasks.spawn(drive(stream, "CSIStorageCapacity", |_| {}));

        let ready = async {
            ready(&store).await;
            ready(&caches.classes).await;
            ready(&caches.csi_nodes).await;
            ready(&caches.nodes).await;
            caches.volumes.store().ready().await;
        };
        tokio::select! {
            () = ready => {}
            () = shutdown.cancelled() => return,
        }
        tracing::info!(existing = store.len(), "capacity caches synced; publishing");

        let mut workers = JoinSet::new();
        for _ in 0..self.threads {
            workers.spawn(self.clone().worker());
        }

        let mut poll = tokio::time::interval(self.poll);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut tick = tokio::time::interval(PLAN_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut seen = objects::Seen::default();
        loop {
            let all = tokio::select! {
                _ = poll.tick() => true,
                _ = tick.tick() => false,
                () = shutdown.cancelled() => break,
            };
            self.plan_pass(&caches, &store, &mut seen, all);
        }
        self.queue.shut_down();
        while workers.join_next().await.is_some() {}
        tasks.abort_all();
    }

    /// One planner pass; `all` queues every desired pair (the poll).
    fn plan_pass(
        &self,
        caches: &Inputs,
        store: &Store<CSIStorageCapacity>,
        seen: &mut objects::Seen,
        all: bool,
    ) {
        let driver = self.driver_name.as_str();
        let segments = match &self.fixed_segment {
            Some(segment) => BTreeSet::from([segment.clone()]),
            None => objects::segments(driver, self.topology, &caches.csi_nodes.state(), |name| {
                caches.nodes.get(&ObjectRef::new(name))
            }),
        };
        let params = objects::tracked_classes(driver, self.immediate, &caches.classes.state());
        let desired = objects::desired(&segments, &params);

        let volumes: HashMap<String, Touched> = caches
            .volumes
            .store()
            .iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.driver == driver)
            })
            .map(|pv| (pv.name_any(), objects::touched(&pv)))
            .collect();

        let mut plan = self.plan();
        let now = Instant::now();
        let mut existing: Vec<Arc<CSIStorageCapacity>> = store
            .state()
            .into_iter()
            .filter(|o| objects::is_managed(o, driver, &self.managed_by))
            .collect();
        let listed: BTreeSet<String> = existing.iter().map(|o| o.name_any()).collect();
        plan.created.retain(|name, (at, _)| {
            !listed.contains(name) && now.duration_since(*at) < CREATED_GRACE
        });
        existing.extend(plan.created.values().map(|(_, o)| o.clone()));
        let assignment = objects::assign(&desired, &existing);

        let (queued, next) = objects::changes(&desired, &assignment, volumes, all, seen);
        if desired != plan.desired {
            tracing::debug!(
                segments = segments.len(),
                classes = params.len(),
                pairs = desired.len(),
                "what to publish changed"
            );
        }
        self.metrics.goal.set(count(desired.len()));
        self.metrics.current.set(count(assignment.objects.len()));
        self.metrics.obsolete.set(count(assignment.obsolete.len()));
        *seen = next;
        plan.desired = desired;
        plan.params = params;
        plan.assignment = assignment;
        drop(plan);
        for item in queued.sync {
            self.queue.add(Key::Sync(item));
        }
        for name in queued.delete {
            self.queue.add(Key::Delete(name));
        }
    }

    async fn worker(self: Arc<Self>) {
        while let Some(key) = self.queue.next().await {
            let span = match &key {
                Key::Sync(i) => {
                    tracing::debug_span!("capacity", class = %i.class, segment = ?i.segment)
                }
                Key::Delete(n) => tracing::debug_span!("capacity", delete = %n),
            };
            let result = match &key {
                Key::Sync(item) => self.sync(item).instrument(span).await,
                Key::Delete(name) => self.delete(name).instrument(span).await,
            };
            match result {
                Ok(()) => self.queue.forget(&key),
                Err(e) => {
                    tracing::warn!(error = %chain(&e), "capacity update failed; will retry");
                    self.queue.add_rate_limited(key.clone());
                }
            }
            self.queue.done(&key);
        }
    }

    /// GetCapacity for the pair, then its object created or updated.
    async fn sync(&self, item: &WorkItem) -> Result<(), SyncError> {
        let (params, existing) = {
            let plan = self.plan();
            if !plan.desired.contains(item) {
                // Its class or segment went while it waited.
                return Ok(());
            }
            (
                plan.params.get(&item.class).cloned().unwrap_or_default(),
                plan.assignment.objects.get(item).cloned(),
            )
        };
        let request = objects::request(item, &params);
        let mut c = self.driver.client().controller();
        let call = self.driver.timed(
            "/csi.v1.Controller/GetCapacity",
            c.get_capacity(with_timeout(request, self.timeout)),
        );
        let response = match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded("GetCapacity timed out")),
        }
        .map_err(|s| SyncError::GetCapacity {
            class: item.class.clone(),
            segment: item.segment.clone(),
            code: code_name(s.code()),
            message: s.message().to_string(),
        })?;
        let reported = Reported::from(&response);
        match existing {
            None => {
                let obj = objects::render(
                    &self.driver_name,
                    &self.managed_by,
                    &self.namespace,
                    self.owner.as_ref(),
                    item,
                    reported,
                );
                let created = self
                    .api
                    .create(&PostParams::default(), &obj)
                    .await
                    .map_err(|source| SyncError::Write {
                        verb: "create",
                        name: format!("{}… for class {}", objects::GENERATE_NAME, item.class),
                        source,
                    })?;
                let name = created.name_any();
                tracing::debug!(%name, capacity = reported.capacity, "created");
                let mut plan = self.plan();
                let created = Arc::new(created);
                // Until the watch shows it, so the next pass adopts it
                // instead of creating another.
                plan.created.insert(name, (Instant::now(), created.clone()));
                plan.assignment.objects.insert(item.clone(), created);
            }
            Some(obj) => {
                let Some(new) = objects::updated(&obj, self.owner.as_ref(), reported) else {
                    return Ok(());
                };
                let name = obj.name_any();
                // resourceVersion is the cached one: a concurrent change
                // is a conflict, retried on the next cache.
                let written = self
                    .api
                    .replace(&name, &PostParams::default(), &new)
                    .await
                    .map_err(|source| SyncError::Write {
                        verb: "update",
                        name: name.clone(),
                        source,
                    })?;
                tracing::debug!(%name, capacity = reported.capacity, "updated");
                let mut plan = self.plan();
                if plan
                    .assignment
                    .objects
                    .get(item)
                    .is_some_and(|o| o.name_any() == name)
                {
                    plan.assignment
                        .objects
                        .insert(item.clone(), Arc::new(written));
                }
            }
        }
        Ok(())
    }

    /// Deletes an obsolete object, unless it serves a pair again.
    async fn delete(&self, name: &str) -> Result<(), SyncError> {
        if !self.plan().assignment.obsolete.contains(name) {
            return Ok(());
        }
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::debug!(%name, "deleted obsolete object");
                self.plan().created.remove(name);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(SyncError::Write {
                verb: "delete",
                name: name.to_string(),
                source,
            }),
        }
    }
}

/// The provisioner's caches the planner reads.
pub struct Inputs {
    pub classes: Store<StorageClass>,
    pub csi_nodes: Store<CSINode>,
    pub nodes: Store<Node>,
    pub volumes: Arc<Cached<PersistentVolume>>,
}

/// Waits until `store` has its first list. Re-polled: kube's readiness
/// wakes only the last of concurrent waiters, and the provisioner's
/// controller waits on the same stores.
async fn ready<K>(store: &Store<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        if let Ok(r) =
            tokio::time::timeout(Duration::from_millis(200), store.wait_until_ready()).await
        {
            let _ = r;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::fake_csi::FakeController;
    use csiops_runtime::testing::Log;

    /// A driver that cannot tell its capabilities (or lacks GET_CAPACITY)
    /// gets no publishing and no failure: provisioning goes on. Nothing is
    /// asked of the API server (the kubeconfig does not exist).
    #[tokio::test]
    async fn without_get_capacity_nothing_is_published_and_nothing_fails() {
        let dir = tempfile::tempdir().expect("dir");
        let log = Log::default();
        let driver = FakeController::new(log.clone()).serve(dir.path()).await;
        let kube = KubeArgs {
            kubeconfig: Some(dir.path().join("none")),
            master: None,
            kube_api_qps: 5.0,
            kube_api_burst: 10,
        };
        let args = {
            use clap::Parser;
            #[derive(Parser)]
            struct T {
                #[command(flatten)]
                a: CapacityArgs,
            }
            T::parse_from(["t", "--enable-capacity"]).a
        };
        let backoff = Backoff {
            start: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        let got = CapacityController::prepare(CapacitySetup {
            args: &args,
            env: CapacityEnv {
                namespace: "ns".into(),
                pod_name: Some("pod".into()),
            },
            kube: &kube,
            requests: &ApiRequests::default(),
            driver: &driver,
            driver_name: "d",
            topology: true,
            timeout: Duration::from_secs(5),
            metrics: CapacityMetrics::new(backoff),
            lease: LeaseGuard::unconditional(),
            managed_by: objects::MANAGED_BY.into(),
            fixed_segment: None,
        })
        .await
        .expect("not an error");
        assert!(got.is_none());
        assert!(log.lines().is_empty(), "{:?}", log.lines());
    }
}
