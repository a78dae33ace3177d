//! The two CSI calls only the attacher makes, through the shared driver
//! connection so they are timed into `csi_sidecar_operations_seconds` like
//! every other call, each with the `--timeout` deadline.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use csiops_proto::client::with_timeout;
use csiops_proto::csi::v1::{
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, ListVolumesRequest,
};
use csiops_proto::redact;
use tonic::Status;

use crate::common::driver::Driver;

pub const PUBLISH: &str = "/csi.v1.Controller/ControllerPublishVolume";
pub const UNPUBLISH: &str = "/csi.v1.Controller/ControllerUnpublishVolume";

/// ControllerPublishVolume; the publish context on success.
pub async fn publish(
    driver: &Driver,
    req: ControllerPublishVolumeRequest,
    timeout: Duration,
) -> Result<BTreeMap<String, String>, Status> {
    // Secrets are stripped from what is logged.
    tracing::debug!(request = %redact::redacted(&req), "ControllerPublishVolume");
    let mut c = driver.client().controller();
    let resp = driver
        .timed(
            PUBLISH,
            c.controller_publish_volume(with_timeout(req, timeout)),
        )
        .await?;
    Ok(resp.publish_context.into_iter().collect())
}

/// ControllerUnpublishVolume.
pub async fn unpublish(
    driver: &Driver,
    req: ControllerUnpublishVolumeRequest,
    timeout: Duration,
) -> Result<(), Status> {
    tracing::debug!(request = %redact::redacted(&req), "ControllerUnpublishVolume");
    let mut c = driver.client().controller();
    driver
        .timed(
            UNPUBLISH,
            c.controller_unpublish_volume(with_timeout(req, timeout)),
        )
        .await
        .map(drop)
}

/// Volume ID → the node IDs ListVolumes says it is published to.
pub type Published = HashMap<String, BTreeSet<String>>;

pub const LIST_VOLUMES: &str = "/csi.v1.Controller/ListVolumes";

/// Every volume's published node IDs, from ListVolumes, page by page
/// (`max_entries` per page; 0 lets the driver choose).
pub async fn list_published(
    driver: &Driver,
    timeout: Duration,
    max_entries: i32,
) -> Result<Published, Status> {
    let mut published = Published::new();
    let mut token = String::new();
    loop {
        let mut c = driver.client().controller();
        let req = ListVolumesRequest {
            max_entries,
            starting_token: token.clone(),
        };
        let resp = driver
            .timed(LIST_VOLUMES, c.list_volumes(with_timeout(req, timeout)))
            .await?;
        for entry in resp.entries {
            let Some(volume) = entry.volume else { continue };
            let nodes = entry
                .status
                .map(|s| s.published_node_ids)
                .unwrap_or_default();
            published.entry(volume.volume_id).or_default().extend(nodes);
        }
        // A driver that hands back the token it was given would loop forever.
        if resp.next_token.is_empty() || resp.next_token == token {
            return Ok(published);
        }
        token = resp.next_token;
    }
}
