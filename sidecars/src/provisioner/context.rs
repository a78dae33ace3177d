//! The provisioner's shared context: what every handler reads and writes
//! through. It knows no handler: the handlers import it, and the
//! controller wires them together, so the decisions below it and the
//! handlers above it form no cycle.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use csiops_proto::csi::v1::{CreateVolumeRequest, Volume};
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Resource;
use tokio::sync::Semaphore;
use tonic::Status;

use super::capabilities::DriverCapabilities;
use super::cloning::Cloning;
use super::decide::{self, ClaimKey};
use super::infeasible::Infeasible;
use super::journal::{Holds, Journal};
use super::metrics::OperationMetrics;
use super::node_deployment::{self, ThisNode};
use super::plan::{self, Cluster, PrepareError, Prepared, ProvisionerConfig};
use super::{attributes_class, csi};
use crate::common::cache::Cached;
#[cfg(doc)]
use crate::common::compact::attached_volume;
use crate::common::compact::Compact;
use crate::common::driver::Driver;
use crate::common::ratelimit;
use crate::common::workqueue::{Backoff, WorkQueue};
use csiops_runtime::chain;
use csiops_runtime::error::ellipsize;
use csiops_runtime::leader::LeaseGuard;

/// The informer caches.
/// Claims and PVs are read through [`Cached`]: what this process wrote or
/// deleted wins until the watch shows it, so a sync right after our own
/// write neither provisions nor deletes a second time.
pub struct Caches {
    pub claims: Arc<Cached<PersistentVolumeClaim>>,
    pub classes: Store<StorageClass>,
    pub volumes: Arc<Cached<PersistentVolume>>,
    pub csi_nodes: Store<CSINode>,
    pub nodes: Store<Node>,
    /// Indexed by the PV they attach ([`attached_volume`]).
    pub attachments: Compact<VolumeAttachment>,
    /// Watched with the `VolumeAttributesClass` gate on (else always
    /// empty). Not waited for at start: without RBAC to list them the
    /// provisioner still works, reading a claim's class on its own as
    /// upstream does (see `claim`).
    pub attributes_classes: Store<VolumeAttributesClass>,
}

/// The queues, made before the metrics registry is shared.
pub struct Queues {
    pub claims: Arc<WorkQueue<ClaimKey>>,
    pub volumes: Arc<WorkQueue<String>>,
    /// Volume names whose journal intent the sweep looks at.
    pub intents: Arc<WorkQueue<String>>,
    /// Clone sources whose cloning-protection finalizer may come off.
    pub cloning: Arc<Cloning>,
    /// Claims the driver refused as infeasible, waiting the maximum interval.
    pub infeasible: Arc<Infeasible>,
}

impl Queues {
    pub fn new(backoff: Backoff) -> Self {
        Queues {
            infeasible: Arc::new(Infeasible::new(backoff.max)),
            claims: Arc::new(WorkQueue::new(backoff)),
            volumes: Arc::new(WorkQueue::new(backoff)),
            intents: Arc::new(WorkQueue::new(backoff)),
            cloning: Arc::new(Cloning::new(backoff)),
        }
    }
}

/// Everything a sync needs: the clients, the configuration, the caches and
/// the queues the handlers share. Plain data with a few helpers over it;
/// the handlers ([`super::claim`], [`super::volume`], [`super::sweep`], ...)
/// are functions of it, and [`super::controller`] builds it and runs them.
pub struct Context {
    /// Reads, watches, and writes on the way to a volume.
    pub client: kube::Client,
    /// PV create and delete (and the PV finalizer that holds a delete):
    /// served first by the rate limiter (see `common::ratelimit`).
    pub critical: kube::Client,
    /// Claim finalizers and journal trims, after the fact: served last but
    /// Events.
    pub bookkeeping: kube::Client,
    pub driver: Driver,
    pub config: ProvisionerConfig,
    pub caps: DriverCapabilities,
    /// `--timeout` of each CreateVolume/DeleteVolume.
    pub timeout: Duration,
    pub caches: Caches,
    pub claims: Arc<WorkQueue<ClaimKey>>,
    pub volumes: Arc<WorkQueue<String>>,
    pub intents: Arc<WorkQueue<String>>,
    /// The intent journal; `None` when the provisioner may not write it
    /// (then each claim carries a finalizer instead, see `super::journal`).
    pub journal: Option<Arc<Journal>>,
    /// Volume names a claim sync or the sweep works on right now.
    pub holds: Holds,
    /// See [`super::cloning`].
    pub cloning: Arc<Cloning>,
    /// See [`super::infeasible`].
    pub infeasible: Arc<Infeasible>,
    /// `--worker-threads` permits for CSI calls.
    pub calls: Semaphore,
    pub recorder: Recorder,
    pub metrics: Arc<OperationMetrics>,
    /// Node deployment: this node and its races; `None` centrally.
    pub node: Option<Arc<ThisNode>>,
    /// Held while this replica leads (always on a node): consulted before
    /// every CreateVolume and DeleteVolume (the clients consult it before
    /// every write).
    pub lease: LeaseGuard,
}

impl Context {
    /// The claim finalizer of this provisioner: [`decide::CLAIM_FINALIZER`],
    /// or this node's own in node deployment.
    pub fn claim_finalizer(&self) -> &str {
        match &self.node {
            Some(node) => &node.finalizer,
            None => decide::CLAIM_FINALIZER,
        }
    }

    /// The VolumeAttributesClass the claim names (`None` when it names
    /// none, or it does not exist): from the cache once it has listed;
    /// before that, or when the provisioner may not list classes (its
    /// watch keeps failing), read from the API server, as upstream always
    /// does.
    pub async fn attributes_class(
        &self,
        claim: &PersistentVolumeClaim,
    ) -> Result<Option<Arc<VolumeAttributesClass>>, kube::Error> {
        let Some(name) = attributes_class::requested(claim, self.config.volume_attributes_class)
        else {
            return Ok(None);
        };
        let cache = &self.caches.attributes_classes;
        if cache.wait_until_ready().now_or_never().is_some() {
            return Ok(cache.get(&ObjectRef::new(name)));
        }
        let api: Api<VolumeAttributesClass> = Api::all(self.client.clone());
        Ok(api.get_opt(name).await?.map(Arc::new))
    }

    /// The CreateVolume request for the claim. On a node, always with this
    /// node selected: a claim raced for has none yet, and one cleaned up
    /// after it moved names another. `attributes_class`: see
    /// [`Self::attributes_class`].
    pub fn prepare(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
        attributes_class: Option<&VolumeAttributesClass>,
    ) -> Result<Prepared, PrepareError> {
        let claim = match &self.node {
            Some(node) if node_deployment::selected_node(claim) != Some(node.name()) => {
                Cow::Owned(node.as_selected(claim))
            }
            _ => Cow::Borrowed(claim),
        };
        let nodes = self.caches.nodes.state();
        let csi_nodes = self.caches.csi_nodes.state();
        plan::prepare(
            &claim,
            class,
            attributes_class,
            &self.config,
            self.caps,
            Cluster {
                nodes: &nodes,
                csi_nodes: &csi_nodes,
            },
        )
    }

    /// Publishes an Event; a refused Event is logged, never fatal.
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(ellipsize(&note, 1000)),
            action: reason.to_string(),
            secondary: None,
        };
        // Sent on its own: nobody waits on an Event, and under pressure it
        // waits for a token behind every other write, or is dropped.
        let (recorder, reference, reason) = (
            self.recorder.clone(),
            obj.object_ref(&()),
            reason.to_string(),
        );
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                if ratelimit::was_shed(&e) {
                    tracing::debug!(%reason, "Event dropped by the API rate limit");
                } else {
                    tracing::warn!(%reason, error = %chain(&e), "cannot publish event");
                }
            }
        });
    }

    pub async fn warn<K: Resource<DynamicType = ()>>(&self, obj: &K, reason: &str, note: String) {
        self.event(obj, EventType::Warning, reason, note).await;
    }

    /// CreateVolume with `--timeout`, only while this replica leads: a
    /// refusal is `Aborted` (never sent, so nothing is known of the volume:
    /// the journal keeps its intent).
    pub async fn create_volume(&self, request: CreateVolumeRequest) -> Result<Volume, Status> {
        self.leading()?;
        csi::create_volume(&self.driver, request, self.timeout).await
    }

    /// DeleteVolume with `--timeout`, only while this replica leads.
    pub async fn delete_volume(
        &self,
        volume_id: &str,
        secrets: HashMap<String, String>,
    ) -> Result<(), Status> {
        self.leading()?;
        csi::delete_volume(&self.driver, volume_id, secrets, self.timeout).await
    }

    fn leading(&self) -> Result<(), Status> {
        self.lease
            .check()
            .map_err(|e| Status::aborted(format!("not sent: {e}")))
    }
}
