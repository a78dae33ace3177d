//! Node deployment's race for a claim with immediate binding and no
//! selected node (upstream's `checkNode` and `becomeOwner`, see
//! [`super::node_deployment`] for the rules): wait this claim's turn, check
//! that the volume fits here, then write this node into the claim's
//! `volume.kubernetes.io/selected-node` with an update at the version seen.
//!
//! The wait does not hold a worker: the claim is queued again for when it
//! ends, and any update of the claim meanwhile (another node's win) brings
//! it back sooner, to be dropped.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tokio::time::Instant;

use csiops_proto::csi::v1::GetCapacityRequest;

use super::capabilities::STORAGE;
use super::claim::error::ClaimError;
use super::context::Context;
use super::csi::{self, rpc};
use super::node_deployment::{self, ThisNode, Turn, RECHECK};
use super::plan::{Cluster, PrepareError};
use super::quantity;
use super::topology::SELECTED_NODE_ANNOTATION;

/// Why the capacity check could not answer (the race goes on regardless,
/// as upstream's: provisioning then reports the problem on the claim).
#[derive(Debug, thiserror::Error)]
pub enum RoomError {
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error("GetCapacity: {}", rpc(.0))]
    GetCapacity(tonic::Status),
    #[error("cannot read the claim's VolumeAttributesClass")]
    AttributesClass(#[source] Box<ClaimError>),
}

/// One look at a claim this node may race for.
pub async fn become_owner(
    cx: &Context,
    node: &ThisNode,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<(), ClaimError> {
    let key = ObjectRef::from_obj(claim);
    let uid = claim.uid().unwrap_or_default();
    let fits = {
        let nodes = cx.caches.nodes.state();
        let csi_nodes = cx.caches.csi_nodes.state();
        node_deployment::fits_allowed_topologies(
            claim,
            class,
            &cx.config,
            cx.caps,
            Cluster {
                nodes: &nodes,
                csi_nodes: &csi_nodes,
            },
            node.name(),
        )
    };
    if !fits {
        tracing::debug!(
            "the class's allowedTopologies exclude this node; not racing for the claim"
        );
        node.races.forget(&uid);
        return Ok(());
    }
    let now = Instant::now();
    match node.races.turn(&uid, now) {
        Turn::Start => {
            let wait = node.races.wait(&uid, now);
            tracing::debug!(?wait, "will try to become the claim's owner");
            cx.claims.add_after(key, wait);
            return Ok(());
        }
        Turn::Wait(left) => {
            cx.claims.add_after(key, left);
            return Ok(());
        }
        Turn::Now => {}
    }
    // As late as possible, being the costliest step.
    match room_here(cx, node, claim, class).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::debug!("not enough capacity on this node for the claim; staying out");
            cx.claims.add_after(key, RECHECK);
            return Ok(());
        }
        // Claiming lets provisioning fail with an Event the user sees;
        // staying out everywhere would fail in silence.
        Err(e) => {
            tracing::info!(error = %csiops_runtime::chain(&e), "capacity check failed; trying to become the claim's owner anyway")
        }
    }
    let mut mine = claim.clone();
    mine.metadata.annotations.get_or_insert_default().insert(
        SELECTED_NODE_ANNOTATION.to_string(),
        node.name().to_string(),
    );
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(cx.client.clone(), &claim.namespace().unwrap_or_default());
    // An update (upstream's verb) at the version seen: two nodes never
    // both win.
    match api
        .replace(&claim.name_any(), &PostParams::default(), &mine)
        .await
    {
        Ok(written) => {
            node.races.forget(&uid);
            cx.caches.claims.wrote(written);
            tracing::info!(node = %node.name(), "became the claim's owner");
            // Provisioned by the next sync, not after the watch.
            cx.claims.add(key);
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            let wait = node.races.wait(&uid, Instant::now());
            tracing::debug!(
                ?wait,
                "the claim changed meanwhile (another node's win?); looking again later"
            );
            cx.claims.add_after(key, wait);
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => {
            node.races.forget(&uid);
            Ok(())
        }
        Err(source) => Err(ClaimError::BecomeOwner {
            node: node.name().to_string(),
            source,
        }),
    }
}

/// Whether the driver here has room for the claim now (upstream's
/// `checkCapacity`): GetCapacity with the request's capabilities and
/// parameters, for each requisite topology (or none), until one has
/// room. A claim without a size fits.
async fn room_here(
    cx: &Context,
    node: &ThisNode,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<bool, RoomError> {
    let size = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(STORAGE))
        .and_then(|q| quantity::to_bytes(q).ok())
        .unwrap_or(0);
    if size == 0 {
        return Ok(true);
    }
    let attributes_class = cx
        .attributes_class(claim)
        .await
        .map_err(|e| RoomError::AttributesClass(Box::new(ClaimError::from(e))))?;
    let prepared = cx.prepare(&node.as_selected(claim), class, attributes_class.as_deref())?;
    let request = &prepared.request;
    let topologies: Vec<_> = match &request.accessibility_requirements {
        Some(r) if !r.requisite.is_empty() => r.requisite.iter().cloned().map(Some).collect(),
        _ => vec![None],
    };
    let _permit = cx.calls.acquire().await;
    for topology in topologies {
        let ask = GetCapacityRequest {
            volume_capabilities: request.volume_capabilities.clone(),
            parameters: request.parameters.clone(),
            accessible_topology: topology,
        };
        let answer = csi::get_capacity(&cx.driver, ask, cx.timeout)
            .await
            .map_err(RoomError::GetCapacity)?;
        if size <= answer.available_capacity {
            return Ok(true);
        }
    }
    Ok(false)
}
