//! The CSI Node service of `csi-test-driver`: publish and unpublish,
//! stage and unstage (with `--data-dir`, real mounts; see
//! [`super::volume_data`]), the node's ID, topology and volume limit.

use std::path::Path;

use csiops_proto::csi::v1::{
    node_server::Node, NodeExpandVolumeRequest, NodeExpandVolumeResponse,
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse,
};
use tonic::Status;

use super::mounts;
use super::node_local;
use super::service::{
    csi_service, require, required_capability, secret_keys, unimplemented, Driver,
};
use super::state::{NodePublication, Volume};
use super::volume_data::publish_data;

impl Driver {
    pub(super) fn node_publish(
        &self,
        req: NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, Status> {
        require(&req.volume_id, "volume_id")?;
        require(&req.target_path, "target_path")?;
        let cap = required_capability(req.volume_capability.as_ref())?;
        let create_dir = self.inside_state_dir(&req.target_path);
        let node_id = self.node_id.clone();
        self.tx(|s| {
            let v = self.volume_mut(s, &req.volume_id)?;
            if let Some(p) = v.node_publications.get(&req.target_path) {
                if p.readonly == req.readonly && p.capability == cap && p.node_id == node_id {
                    return Ok(());
                }
                return Err(Status::already_exists(format!(
                    "volume {} is published at {} with another capability or readonly flag",
                    v.id, req.target_path
                )));
            }
            self.require_published_here(v)?;
            if let Some(dir) = &self.data_dir {
                publish_data(dir, v, &req, &cap)?;
            } else if create_dir {
                std::fs::create_dir_all(&req.target_path)
                    .map_err(|e| Status::internal(format!("creating {}: {e}", req.target_path)))?;
            }
            v.node_publications.insert(
                req.target_path.clone(),
                NodePublication {
                    node_id: node_id.clone(),
                    readonly: req.readonly,
                    capability: cap.clone(),
                    secret_keys: secret_keys(&req.secrets),
                    publish_context: req.publish_context.clone().into_iter().collect(),
                    created_dir: create_dir,
                },
            );
            Ok(())
        })?;
        Ok(NodePublishVolumeResponse {})
    }

    /// With `--enable-attach`, node operations need the volume
    /// controller-published to this node first (FAILED_PRECONDITION).
    fn require_published_here(&self, v: &Volume) -> Result<(), Status> {
        if self.enable_attach && !v.published_nodes.contains_key(&self.node_id) {
            return Err(Status::failed_precondition(format!(
                "volume {} is not controller-published to node {}",
                v.id, self.node_id
            )));
        }
        Ok(())
    }

    /// NodeStageVolume: with `--data-dir`, bind-mounts a filesystem
    /// volume's directory on the staging path (a block volume needs no
    /// staging: its loop device is set up at publish).
    pub(super) fn node_stage(
        &self,
        req: NodeStageVolumeRequest,
    ) -> Result<NodeStageVolumeResponse, Status> {
        require(&req.volume_id, "volume_id")?;
        require(&req.staging_target_path, "staging_target_path")?;
        let cap = required_capability(req.volume_capability.as_ref())?;
        // Node-local: an unknown volume is NOT_FOUND whatever else holds
        // (kubelet's `MountVolume.MountDevice failed` of a central deployment).
        let known = self
            .is_node_local()
            .then(|| self.known_volume(&req.volume_id))
            .transpose()?;
        let Some(dir) = &self.data_dir else {
            return unimplemented("NodeStageVolume");
        };
        let v = match known {
            Some(v) => v,
            None => self.known_volume(&req.volume_id)?,
        };
        self.require_published_here(&v)?;
        if cap.access_type == "mount" {
            let staging = Path::new(&req.staging_target_path);
            std::fs::create_dir_all(staging)
                .and_then(|()| mounts::bind(&dir.join(&v.id), staging, false))
                .map_err(|e| {
                    Status::internal(format!("staging at {}: {e}", req.staging_target_path))
                })?;
        }
        // Recorded after the mount: a crash in between leaves a mount the
        // retried call finds (bind is idempotent) and records.
        let node_id = self.node_id.clone();
        self.tx(|s| {
            let v = self.volume_mut(s, &req.volume_id)?;
            v.node_stagings
                .insert(req.staging_target_path.clone(), node_id);
            Ok(())
        })?;
        Ok(NodeStageVolumeResponse {})
    }

    /// NodeUnstageVolume: unmounts the staging path (idempotent).
    pub(super) fn node_unstage(
        &self,
        req: NodeUnstageVolumeRequest,
    ) -> Result<NodeUnstageVolumeResponse, Status> {
        require(&req.volume_id, "volume_id")?;
        require(&req.staging_target_path, "staging_target_path")?;
        if self.is_node_local() {
            // hostpathplugin: NOT_FOUND for a volume it does not know.
            self.known_volume(&req.volume_id)?;
        }
        let Some(dir) = &self.data_dir else {
            return unimplemented("NodeUnstageVolume");
        };
        mounts::unmount(Path::new(&req.staging_target_path))
            .map_err(|e| Status::internal(format!("unstaging {}: {e}", req.staging_target_path)))?;
        // The block volume's loop device goes once nothing uses the volume
        // here; node-local keeps it until DeleteVolume (it came with
        // CreateVolume).
        let image = dir.join(format!("{}.img", req.volume_id));
        if !self.is_node_local() && image.exists() {
            mounts::detach_loop(&image)
                .map_err(|e| Status::internal(format!("detaching {}: {e}", image.display())))?;
        }
        self.tx(|s| {
            if let Some(v) = s.volumes.get_mut(&req.volume_id) {
                v.node_stagings.remove(&req.staging_target_path);
            }
            Ok(())
        })?;
        Ok(NodeUnstageVolumeResponse {})
    }

    pub(super) fn node_unpublish(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Status> {
        require(&req.volume_id, "volume_id")?;
        require(&req.target_path, "target_path")?;
        let remove_dir = self.inside_state_dir(&req.target_path);
        self.tx(|s| {
            let v = self.volume_mut(s, &req.volume_id)?;
            if self.data_dir.is_some() {
                // Unmount even without a record: a publish may have mounted
                // and died before persisting it.
                let target = Path::new(&req.target_path);
                mounts::unmount(target)
                    .and_then(|()| mounts::remove_target(target))
                    .map_err(|e| {
                        Status::internal(format!("unpublishing {}: {e}", req.target_path))
                    })?;
            } else if v.node_publications.contains_key(&req.target_path) && remove_dir {
                // Remove before the record goes, so a crash in between is
                // repaired by the retried call.
                match std::fs::remove_dir_all(&req.target_path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(Status::internal(format!(
                            "removing {}: {e}",
                            req.target_path
                        )))
                    }
                }
            }
            v.node_publications.remove(&req.target_path);
            Ok(())
        })?;
        Ok(NodeUnpublishVolumeResponse {})
    }

    /// NodeGetVolumeStats: node-local only (elsewhere UNIMPLEMENTED, not
    /// advertised). NOT_FOUND for a volume this process does not know or a
    /// path that does not exist.
    pub(super) fn node_volume_stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        if !self.is_node_local() {
            return unimplemented("NodeGetVolumeStats");
        }
        require(&req.volume_id, "volume_id")?;
        require(&req.volume_path, "volume_path")?;
        let v = self.known_volume(&req.volume_id)?;
        Ok(NodeGetVolumeStatsResponse {
            usage: node_local::volume_usage(Path::new(&req.volume_path), v.capacity_bytes)?,
            volume_condition: None,
        })
    }

    /// NodeExpandVolume is not implemented (nor advertised); node-local
    /// answers NOT_FOUND first for a volume it does not know, as
    /// hostpathplugin (with expansion on, its default) does.
    pub(super) fn node_expand(
        &self,
        req: NodeExpandVolumeRequest,
    ) -> Result<NodeExpandVolumeResponse, Status> {
        if self.is_node_local() {
            require(&req.volume_id, "volume_id")?;
            self.known_volume(&req.volume_id)?;
        }
        unimplemented("NodeExpandVolume")
    }

    /// STAGE_UNSTAGE_VOLUME only with `--data-dir` (real mounts);
    /// GET_VOLUME_STATS with `--node-local` (hostpathplugin has it).
    pub(super) fn node_capabilities(
        &self,
        _: NodeGetCapabilitiesRequest,
    ) -> Result<NodeGetCapabilitiesResponse, Status> {
        use csiops_proto::csi::v1::node_service_capability::{rpc::Type, Rpc, Type as T};
        let stage = self.data_dir.as_ref().map(|_| Type::StageUnstageVolume);
        let stats = self.is_node_local().then_some(Type::GetVolumeStats);
        let capabilities = stage
            .into_iter()
            .chain(stats)
            .map(|t| csiops_proto::csi::v1::NodeServiceCapability {
                r#type: Some(T::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect();
        Ok(NodeGetCapabilitiesResponse { capabilities })
    }

    pub(super) fn node_info(&self, _: NodeGetInfoRequest) -> Result<NodeGetInfoResponse, Status> {
        Ok(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.max_volumes()?,
            accessible_topology: Some(self.this_node_topology()),
        })
    }
}

csi_service!(Node {
    node_stage_volume(NodeStageVolumeRequest -> NodeStageVolumeResponse) = "NodeStageVolume" => Driver::node_stage;
    node_unstage_volume(NodeUnstageVolumeRequest -> NodeUnstageVolumeResponse) = "NodeUnstageVolume" => Driver::node_unstage;
    node_publish_volume(NodePublishVolumeRequest -> NodePublishVolumeResponse) = "NodePublishVolume" => Driver::node_publish;
    node_unpublish_volume(NodeUnpublishVolumeRequest -> NodeUnpublishVolumeResponse) = "NodeUnpublishVolume" => Driver::node_unpublish;
    node_get_volume_stats(NodeGetVolumeStatsRequest -> NodeGetVolumeStatsResponse) = "NodeGetVolumeStats" => Driver::node_volume_stats;
    node_expand_volume(NodeExpandVolumeRequest -> NodeExpandVolumeResponse) = "NodeExpandVolume" => Driver::node_expand;
    node_get_capabilities(NodeGetCapabilitiesRequest -> NodeGetCapabilitiesResponse) = "NodeGetCapabilities" => Driver::node_capabilities;
    node_get_info(NodeGetInfoRequest -> NodeGetInfoResponse) = "NodeGetInfo" => Driver::node_info;
});

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use csiops_proto::csi::v1::DeleteVolumeRequest;
    use tonic::Code;

    use super::super::config::Config;
    use super::super::service::fixtures::{block_cap, create, create_from};
    use super::*;

    #[test]
    fn the_volume_limit_file_is_read_at_every_use() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("max-volumes");
        let mut cfg = Config::new("/unused.sock", "n1", &dir.path().join("state"));
        cfg.max_volumes_per_node = 3;
        cfg.max_volumes_per_node_file = Some(file.clone());
        let d = Driver::new(&cfg).unwrap();
        assert_eq!(d.max_volumes().unwrap(), 3, "no file: the flag");
        std::fs::write(&file, "7\n").unwrap();
        assert_eq!(d.max_volumes().unwrap(), 7);
        std::fs::write(&file, "5").unwrap();
        assert_eq!(d.max_volumes().unwrap(), 5, "changed while running");
        let info = d.node_info(NodeGetInfoRequest {}).unwrap();
        assert_eq!(info.max_volumes_per_node, 5);
        for bad in ["many", "-1", ""] {
            std::fs::write(&file, bad).unwrap();
            let err = d.max_volumes().unwrap_err();
            assert_eq!(err.code(), tonic::Code::Internal, "{bad:?}");
            assert!(err.message().contains("not a count"), "{err:?}");
        }
    }

    #[test]
    fn a_staged_volume_is_not_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::new("/unused.sock", "n1", &dir.path().join("state"));
        cfg.data_dir = Some(dir.path().join("data"));
        let d = Driver::new(&cfg).unwrap();
        // A block volume: staging records it and mounts nothing.
        let v = create_from(&d, "v", block_cap(), 1 << 20, None);
        let staging = dir.path().join("staging").display().to_string();
        d.node_stage(NodeStageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: staging.clone(),
            volume_capability: Some(block_cap()),
            ..Default::default()
        })
        .unwrap();
        let delete = || {
            d.delete_volume(DeleteVolumeRequest {
                volume_id: v.id.clone(),
                ..Default::default()
            })
        };
        let err = delete().unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains(&staging), "{err:?}");
        d.node_unstage(NodeUnstageVolumeRequest {
            volume_id: v.id.clone(),
            staging_target_path: staging,
        })
        .unwrap();
        delete().unwrap();
    }

    #[test]
    fn a_topology_value_makes_one_segment_for_every_node() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::new("/unused.sock", "n1", dir.path());
        cfg.topology_key = "zone".into();
        cfg.topology_value = Some("shared".into());
        let d = Driver::new(&cfg).unwrap();
        let info = d.node_info(NodeGetInfoRequest::default()).unwrap();
        assert_eq!(info.node_id, "n1");
        assert_eq!(
            info.accessible_topology.unwrap().segments,
            HashMap::from([("zone".to_string(), "shared".to_string())])
        );
        let v = create(&d, "v", &[]).unwrap();
        assert_eq!(v.accessible_topology[0]["zone"], "shared");
    }
}
