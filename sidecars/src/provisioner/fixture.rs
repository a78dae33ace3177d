//! A [`Context`] for the sync tests: a mocked API client, a fake driver,
//! and caches holding what each test puts there.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::Event;
use serde_json::Value;
use tokio::sync::Semaphore;

use super::capabilities::DriverCapabilities;
use super::context::{Caches, Context, Queues};
use super::controller::fixed_store;
use super::journal::{Holds, Journal};
use super::metrics::OperationMetrics;
use super::node_deployment::{LocalNode, NodeDeployment, ThisNode};
use super::plan::ProvisionerConfig;
use crate::common::cache::Cached;
use crate::common::compact::Compact;
use crate::common::driver::Driver;
use crate::common::workqueue::Backoff;

/// A cache of either kind ([`Store`] or [`Compact`]) holding `objects`.
pub trait FromObjects<K> {
    fn from_objects(objects: Vec<K>) -> Self;
}

impl<K> FromObjects<K> for Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    fn from_objects(objects: Vec<K>) -> Self {
        let (reader, mut writer) = reflector::store();
        for obj in objects {
            writer.apply_watcher_event(&Event::Apply(obj));
        }
        reader
    }
}

impl<K> FromObjects<K> for Compact<K>
where
    K: kube::Resource + serde::Serialize + serde::de::DeserializeOwned,
{
    fn from_objects(objects: Vec<K>) -> Self {
        Compact::of(objects)
    }
}

/// A cache holding `objects` (JSON, as the API server returns them).
pub fn store<K, S>(objects: &[Value]) -> S
where
    K: serde::de::DeserializeOwned,
    S: FromObjects<K>,
{
    S::from_objects(
        objects
            .iter()
            .map(|o| serde_json::from_value(o.clone()).expect("a valid object"))
            .collect(),
    )
}

/// What a test chooses; everything else is the same in every sync test.
pub struct Fixture {
    pub client: kube::Client,
    pub driver: Driver,
    pub config: ProvisionerConfig,
    pub caps: DriverCapabilities,
    pub claims: Compact<PersistentVolumeClaim>,
    pub classes: Store<StorageClass>,
    pub volumes: Compact<PersistentVolume>,
    /// `None`: the claim-finalizer fallback.
    pub journal: Option<Arc<Journal>>,
}

impl Fixture {
    pub fn provisioner(self) -> Context {
        let queues = Queues::new(Backoff {
            start: Duration::from_secs(1),
            max: Duration::from_secs(10),
        });
        Context {
            client: self.client.clone(),
            critical: self.client.clone(),
            bookkeeping: self.client.clone(),
            driver: self.driver,
            config: self.config,
            caps: self.caps,
            timeout: Duration::from_secs(10),
            caches: Caches {
                claims: Arc::new(Cached::new(self.claims)),
                classes: self.classes,
                volumes: Arc::new(Cached::new(self.volumes)),
                csi_nodes: reflector::store().0,
                nodes: reflector::store().0,
                attachments: Compact::of([]),
                attributes_classes: fixed_store(Vec::new()),
            },
            claims: queues.claims,
            volumes: queues.volumes,
            intents: queues.intents,
            journal: self.journal,
            holds: Holds::default(),
            cloning: queues.cloning,
            infeasible: queues.infeasible,
            calls: Semaphore::new(1),
            recorder: Recorder::new(
                self.client,
                Reporter {
                    controller: "external-provisioner".into(),
                    instance: None,
                },
            ),
            metrics: Arc::new(OperationMetrics::default()),
            node: None,
            lease: csiops_runtime::leader::LeaseGuard::unconditional(),
        }
    }
}

/// Makes `p` node `name`'s provisioner (node deployment) whose driver
/// reports `segment`, with the Node and CSINode caches made from it and
/// immediate binding on. The race waits not at all (a zero base delay):
/// its timing is tested in `node_deployment`.
pub fn on_node(p: &mut Context, name: &str, segment: Option<&[(&str, &str)]>) -> Arc<ThisNode> {
    let local = LocalNode {
        name: name.into(),
        node_id: format!("{name}-id"),
        segment: segment.map(|s| {
            s.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        }),
    };
    let (node, csi_node) = local.objects(&p.config.driver_name);
    p.caches.nodes = fixed_store(vec![node]);
    p.caches.csi_nodes = fixed_store(vec![csi_node]);
    let this = Arc::new(ThisNode::new(
        &NodeDeployment {
            node_name: name.into(),
            immediate_binding: true,
            base_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
        },
        local,
    ));
    p.node = Some(this.clone());
    this
}
