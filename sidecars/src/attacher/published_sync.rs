//! The published sync (`--reconcile-sync`, upstream's name for it):
//! attachments the driver no longer has. (Not a reconcile in the
//! operator's sense: a periodic comparison with ListVolumes.)
//!
//! A VolumeAttachment says `attached: true` from the moment
//! ControllerPublishVolume succeeded; the storage backend can still lose the
//! attachment afterwards (a failover, an admin's detach on the array). For a
//! driver with LIST_VOLUMES_PUBLISHED_NODES, every `--reconcile-sync` the
//! attacher asks ListVolumes which nodes each volume is published to. An
//! attached VolumeAttachment whose node is not among them is marked
//! `attached: false`, as upstream's reconciler does, and queued: the attach
//! path then publishes it again (its finalizers are already in place).
//!
//! The decision is [`lost_attachments`], a pure function of the caches and
//! the driver's answer; [`Controller::sync_published`] does the I/O.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use tonic::Status;

use super::controller::Controller;
use super::decide::Volume;
use super::metrics::Write;
use crate::common::migration::{self, Plugin};
use csiops_runtime::chain;
use csiops_runtime::shutdown::CancellationToken;

pub use super::csi::Published;

/// An attachment the driver does not report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub va: String,
    pub volume_id: String,
    pub node_id: String,
}

/// The attachments of `driver` marked attached, not being deleted, whose
/// volume ListVolumes does not report as published to their node (a volume
/// missing from the list altogether is not published anywhere). One whose
/// volume handle or node ID cannot be told is left alone: the attach path
/// reports those. A migrated volume's handle is that of its CSI
/// translation, completed from the node ID where the translation leaves
/// parts unknown (GCE PD's project and zone), as upstream compares them.
pub fn lost_attachments<'a>(
    vas: impl IntoIterator<Item = &'a VolumeAttachment>,
    driver: &str,
    get_pv: impl Fn(&str) -> Option<&'a PersistentVolume>,
    node_id: impl Fn(&VolumeAttachment) -> Option<String>,
    published: &Published,
) -> Vec<Lost> {
    let mut lost = Vec::new();
    for va in vas {
        let attached = va.status.as_ref().is_some_and(|s| s.attached);
        if va.spec.attacher != driver || !attached || va.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let volume = Volume::of(va, &get_pv);
        let Some(volume_id) = volume
            .csi_spec()
            .ok()
            .flatten()
            .and_then(|s| s.csi.as_ref().map(|c| c.volume_handle.clone()))
        else {
            continue;
        };
        let Some(node_id) = node_id(va) else { continue };
        let volume_id = if volume.migrated() && Plugin::for_driver(driver).is_some() {
            match migration::repair_volume_handle(driver, &volume_id, &node_id) {
                Ok(id) => id,
                Err(_) => continue,
            }
        } else {
            volume_id
        };
        if published
            .get(&volume_id)
            .is_some_and(|nodes| nodes.contains(&node_id))
        {
            continue;
        }
        lost.push(Lost {
            va: va.name_any(),
            volume_id,
            node_id,
        });
    }
    lost
}

impl Controller {
    /// Every `--reconcile-sync`: ListVolumes, then re-attach what it lost.
    /// Does nothing (but wait) when the interval is 0 or the driver cannot
    /// say where volumes are published.
    pub(super) async fn published_sync_loop(self: Arc<Self>, shutdown: CancellationToken) {
        if self.cfg.reconcile_sync.is_zero() || !self.cfg.list_published {
            return shutdown.cancelled().await;
        }
        let mut tick = tokio::time::interval(self.cfg.reconcile_sync);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if let Err(status) = self.sync_published().await {
                tracing::warn!(code = ?status.code(), message = %status.message(), "ListVolumes failed; attachments are checked again at the next --reconcile-sync");
            }
        }
    }

    /// One pass; the number of attachments marked detached.
    pub(super) async fn sync_published(&self) -> Result<usize, Status> {
        let published =
            super::csi::list_published(&self.driver, self.cfg.timeout, self.cfg.max_entries)
                .await?;
        // One attachment decoded at a time, with its PV: a pass never
        // holds every cached object decoded at once.
        let mut lost = Vec::new();
        for va in self.vas.store().iter() {
            let pv = (va.spec.source.persistent_volume_name.as_deref())
                .and_then(|name| self.pvs.get_named(name));
            lost.extend(lost_attachments(
                [&va],
                &self.cfg.driver_name,
                |_| pv.as_deref(),
                |va| self.node_id(va, false).ok(),
                &published,
            ));
        }
        let mut marked = 0;
        for l in &lost {
            let Some(va) = self.vas.get_named(&l.va) else {
                continue;
            };
            tracing::info!(va = %l.va, volume = %l.volume_id, node = %l.node_id, "ListVolumes does not report the volume published to the node; marking the attachment detached to attach it again");
            match self.mark_detached_for_reattach(&va).await {
                Ok(()) => marked += 1,
                // Changed since the cache saw it (a conflict) or gone: the
                // next pass looks again.
                Err(e) => {
                    tracing::warn!(va = %l.va, error = %chain(&e), "could not mark the attachment detached")
                }
            }
        }
        Ok(marked)
    }

    /// `attached: false`, guarded by the resourceVersion the decision was
    /// made on, then queued for the attach path.
    async fn mark_detached_for_reattach(&self, va: &VolumeAttachment) -> Result<(), kube::Error> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": va.resource_version()},
            "status": {"attached": false},
        });
        let patched = api
            .patch_status(
                &va.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        self.metrics.wrote(Write::VaStatus);
        self.vas.wrote(patched.clone());
        self.enqueue_va(&patched);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};
    use k8s_openapi::api::storage::v1::{
        VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;
    use std::collections::BTreeSet;

    const DRIVER: &str = "csi.example.com";

    fn pv(name: &str, handle: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.into(),
                    volume_handle: handle.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn va(name: &str, pv: &str, node: &str, attached: bool) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: DRIVER.into(),
                node_name: node.into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some(pv.into()),
                    ..Default::default()
                },
            },
            status: Some(VolumeAttachmentStatus {
                attached,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn only_attached_attachments_the_driver_does_not_report_are_lost() {
        let pvs = [
            pv("pv-a", "vol-a"),
            pv("pv-b", "vol-b"),
            pv("pv-c", "vol-c"),
        ];
        let get_pv = |n: &str| pvs.iter().find(|p| p.name_any() == n);
        let node_id = |va: &VolumeAttachment| match va.spec.node_name.as_str() {
            "node-1" => Some("id-1".to_string()),
            "node-2" => Some("id-2".to_string()),
            _ => None,
        };
        let published: Published = [
            ("vol-a".to_string(), BTreeSet::from(["id-1".to_string()])),
            ("vol-b".to_string(), BTreeSet::from(["id-1".to_string()])),
        ]
        .into();
        let mut deleting = va("va-deleting", "pv-c", "node-1", true);
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        let mut other_driver = va("va-other", "pv-c", "node-1", true);
        other_driver.spec.attacher = "other.example.com".into();
        let vas = [
            va("va-ok", "pv-a", "node-1", true),
            // Published, but to another node.
            va("va-moved", "pv-b", "node-2", true),
            // Not in the list at all.
            va("va-gone", "pv-c", "node-1", true),
            // Not attached yet: the attach path's business.
            va("va-pending", "pv-c", "node-1", false),
            deleting,
            other_driver,
            // Unknown node ID or PV: left to the attach path.
            va("va-no-node", "pv-c", "node-9", true),
            va("va-no-pv", "pv-x", "node-1", true),
        ];
        let lost = lost_attachments(vas.iter(), DRIVER, get_pv, node_id, &published);
        let names: Vec<_> = lost.iter().map(|l| l.va.as_str()).collect();
        assert_eq!(names, ["va-moved", "va-gone"]);
        assert_eq!(
            lost[0],
            Lost {
                va: "va-moved".into(),
                volume_id: "vol-b".into(),
                node_id: "id-2".into()
            }
        );
    }

    /// A migrated GCE PD volume: its translated handle leaves project and
    /// zone unknown; the node ID completes it before the comparison.
    #[test]
    fn migrated_handles_are_repaired_before_the_comparison() {
        use k8s_openapi::api::core::v1::GCEPersistentDiskVolumeSource;
        const GCE: &str = "pd.csi.storage.gke.io";
        const NODE_ID: &str = "projects/p1/zones/us-central1-a/instances/n1";
        let in_tree = |name: &str, disk: &str| PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    [(
                        "topology.kubernetes.io/zone".to_string(),
                        "us-central1-a".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                    pd_name: disk.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pvs = [in_tree("pv-a", "d1"), in_tree("pv-b", "d2")];
        let get_pv = |n: &str| pvs.iter().find(|p| p.name_any() == n);
        let published: Published = [(
            "projects/p1/zones/us-central1-a/disks/d1".to_string(),
            BTreeSet::from([NODE_ID.to_string()]),
        )]
        .into();
        let mut vas = [
            va("va-a", "pv-a", "node-1", true),
            va("va-b", "pv-b", "node-1", true),
        ];
        for v in &mut vas {
            v.spec.attacher = GCE.into();
        }
        let lost = lost_attachments(
            vas.iter(),
            GCE,
            get_pv,
            |_| Some(NODE_ID.to_string()),
            &published,
        );
        assert_eq!(
            lost,
            vec![Lost {
                va: "va-b".into(),
                volume_id: "projects/p1/zones/us-central1-a/disks/d2".into(),
                node_id: NODE_ID.into(),
            }]
        );
    }
}
