//! The CSI Controller service of `csi-test-driver`: volumes (create,
//! delete, modify, list, capacity), their publication to nodes
//! (`--enable-attach`) and, in [`snapshots`], snapshots.

use std::collections::{BTreeMap, HashMap};

use csiops_proto::csi::v1::{
    controller_server::Controller, list_volumes_response, validate_volume_capabilities_response,
    volume_content_source, ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerServiceCapability, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
    DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest, GetCapacityResponse,
    GetSnapshotRequest, GetSnapshotResponse, ListSnapshotsRequest, ListSnapshotsResponse,
    ListVolumesRequest, ListVolumesResponse, Topology, ValidateVolumeCapabilitiesRequest,
    ValidateVolumeCapabilitiesResponse, VolumeContentSource,
};
use tonic::Status;

use super::config::DEFAULT_VOLUME_SIZE;
use super::node_local;
use super::service::{
    capability, csi_service, none, require, required_capabilities, required_capability,
    secret_keys, Driver,
};
use super::state::{ContentSource, ControllerPublication, DeletedVolume, State, Volume};
use super::volume_data::{create_data, remove_data, source_data};

mod snapshots;

impl Driver {
    pub(super) fn create_volume(
        &self,
        req: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, Status> {
        require(&req.name, "name")?;
        let caps = required_capabilities(&req.volume_capabilities)?;
        let content_source = match req
            .volume_content_source
            .as_ref()
            .and_then(|c| c.r#type.as_ref())
        {
            None => None,
            Some(volume_content_source::Type::Snapshot(s)) if !s.snapshot_id.is_empty() => {
                Some(ContentSource::Snapshot(s.snapshot_id.clone()))
            }
            Some(volume_content_source::Type::Volume(v)) if !v.volume_id.is_empty() => {
                Some(ContentSource::Volume(v.volume_id.clone()))
            }
            Some(_) => {
                return Err(Status::invalid_argument(
                    "volume_content_source needs a snapshot_id or a volume_id",
                ))
            }
        };
        let (required, limit) = match req.capacity_range {
            Some(r) => (r.required_bytes, r.limit_bytes),
            None => (0, 0),
        };
        if required < 0 || limit < 0 {
            return Err(Status::invalid_argument(
                "capacity_range must not be negative",
            ));
        }
        if limit > 0 && limit < required {
            return Err(Status::invalid_argument(format!(
                "capacity_range: limit_bytes {limit} < required_bytes {required}"
            )));
        }
        let size = if required > 0 {
            required
        } else if limit > 0 {
            limit.min(DEFAULT_VOLUME_SIZE)
        } else {
            DEFAULT_VOLUME_SIZE
        };
        let parameters: BTreeMap<String, String> = req.parameters.clone().into_iter().collect();
        let topology = if self.is_node_local() {
            // Created here, usable here only: this node's topology, whatever
            // was preferred.
            if !self.ignore_accessibility_requirements {
                node_local::check_requirements(
                    req.accessibility_requirements.as_ref(),
                    &self.topology_key,
                    &self.node_id,
                )?;
            }
            self.this_node_topology()
        } else {
            req.accessibility_requirements
                .as_ref()
                .and_then(|r| r.preferred.first().or(r.requisite.first()))
                .cloned()
                .unwrap_or_else(|| self.this_node_topology())
        };
        let capacity = self.capacity;
        self.tx(|s| {
            if let Some(v) = s.volume_by_name(&req.name) {
                let fits = v.capacity_bytes >= required && (limit == 0 || v.capacity_bytes <= limit);
                let same_type = caps
                    .iter()
                    .all(|c| v.volume_capabilities.iter().any(|e| e.access_type == c.access_type));
                if !fits {
                    return Err(Status::already_exists(format!(
                        "volume {:?} ({}) exists with capacity {}, incompatible with required {required} limit {limit}",
                        req.name, v.id, v.capacity_bytes
                    )));
                }
                if !same_type {
                    return Err(Status::already_exists(format!(
                        "volume {:?} ({}) exists with other access types",
                        req.name, v.id
                    )));
                }
                if v.parameters != parameters {
                    return Err(Status::already_exists(format!(
                        "volume {:?} ({}) exists with other parameters",
                        req.name, v.id
                    )));
                }
                if v.content_source != content_source {
                    return Err(Status::already_exists(format!(
                        "volume {:?} ({}) exists with another content source ({:?})",
                        req.name, v.id, v.content_source
                    )));
                }
                return Ok(Self::csi_volume(v));
            }
            // The source must exist, and the new volume hold all of it
            // (CSI: OUT_OF_RANGE when the capacity is smaller).
            let source_size = match &content_source {
                None => 0,
                Some(ContentSource::Snapshot(id)) => s
                    .snapshots
                    .get(id)
                    .map(|snap| snap.size_bytes)
                    .ok_or_else(|| Status::not_found(format!("snapshot {id} does not exist")))?,
                Some(ContentSource::Volume(id)) => s
                    .volumes
                    .get(id)
                    .map(|v| v.capacity_bytes)
                    .ok_or_else(|| {
                        if self.is_node_local() {
                            self.unknown_volume(id)
                        } else {
                            Status::not_found(format!("volume {id} does not exist"))
                        }
                    })?,
            };
            if required > 0 && required < source_size {
                return Err(Status::out_of_range(format!(
                    "requested {required} bytes, the source has {source_size}"
                )));
            }
            if limit > 0 && limit < source_size {
                return Err(Status::out_of_range(format!(
                    "limit {limit} bytes, the source has {source_size}"
                )));
            }
            let size = if required == 0 { size.max(source_size) } else { size };
            if size > capacity {
                return Err(Status::out_of_range(format!(
                    "requested {size} bytes, the pool has {capacity}"
                )));
            }
            let available = capacity - s.used_bytes();
            if size > available {
                return Err(Status::resource_exhausted(format!(
                    "requested {size} bytes, {available} available"
                )));
            }
            let id = new_volume_id()?;
            let seq = s.next_seq;
            s.next_seq += 1;
            let v = Volume {
                id: id.clone(),
                name: req.name.clone(),
                seq,
                capacity_bytes: size,
                parameters: parameters.clone(),
                mutable_parameters: req.mutable_parameters.clone().into_iter().collect(),
                modifications: 0,
                modify_secret_keys: Vec::new(),
                secret_keys: secret_keys(&req.secrets),
                volume_capabilities: caps.clone(),
                accessible_topology: vec![topology.segments.clone().into_iter().collect()],
                published_nodes: BTreeMap::new(),
                node_publications: BTreeMap::new(),
                node_stagings: BTreeMap::new(),
                content_source: content_source.clone(),
                node_id: self.node_id.clone(),
            };
            if let Some(dir) = &self.data_dir {
                let source = content_source.as_ref().map(|c| source_data(dir, c));
                create_data(dir, &v, source.as_deref(), self.is_node_local())?;
            }
            let out = Self::csi_volume(&v);
            s.volumes.insert(id, v);
            Ok(out)
        })
        .map(|volume| CreateVolumeResponse {
            volume: Some(volume),
        })
    }

    pub(super) fn delete_volume(
        &self,
        req: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, Status> {
        require(&req.volume_id, "volume_id")?;
        self.tx(|s| {
            let Some(v) = s.volumes.get(&req.volume_id) else {
                // Already gone: idempotent success (CSI spec).
                return Ok(());
            };
            if !v.published_nodes.is_empty()
                || !v.node_publications.is_empty()
                || !v.node_stagings.is_empty()
            {
                return Err(Status::failed_precondition(format!(
                    "volume {} is in use: controller-published to {:?}, node-published at {:?}, \
                     staged at {:?}",
                    v.id,
                    v.published_node_ids(),
                    v.node_publications.keys().collect::<Vec<_>>(),
                    v.node_stagings.keys().collect::<Vec<_>>()
                )));
            }
            if let Some(dir) = &self.data_dir {
                remove_data(dir, &v.id)?;
            }
            let v = s.volumes.remove(&req.volume_id).expect("checked above");
            s.push_tombstone(DeletedVolume {
                id: v.id,
                name: v.name,
                seq: v.seq,
                secret_keys: secret_keys(&req.secrets),
            });
            Ok(())
        })?;
        Ok(DeleteVolumeResponse {})
    }

    /// ControllerModifyVolume (`--enable-modify`): the mutable parameters
    /// are merged into the volume's (a key given again takes the new
    /// value), and the call's secret keys recorded.
    pub(super) fn controller_modify(
        &self,
        req: ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse, Status> {
        if !self.enable_modify {
            return Err(Status::unimplemented(
                "ControllerModifyVolume: modify is disabled (--enable-modify)",
            ));
        }
        require(&req.volume_id, "volume_id")?;
        if req.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument("mutable_parameters is required"));
        }
        self.tx(|s| {
            let v = self.volume_mut(s, &req.volume_id)?;
            v.mutable_parameters.extend(req.mutable_parameters.clone());
            v.modifications += 1;
            v.modify_secret_keys = secret_keys(&req.secrets);
            Ok(())
        })?;
        Ok(ControllerModifyVolumeResponse {})
    }

    pub(super) fn controller_publish(
        &self,
        req: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, Status> {
        if !self.enable_attach {
            return Err(Status::unimplemented(
                "ControllerPublishVolume: attach is disabled (--enable-attach)",
            ));
        }
        require(&req.volume_id, "volume_id")?;
        require(&req.node_id, "node_id")?;
        let cap = required_capability(req.volume_capability.as_ref())?;
        // Node-local: checked before the volume, as hostpathplugin does.
        self.require_this_node(&req.node_id)?;
        let max = self.max_volumes()?;
        self.tx(|s| {
            let attached_to_node = s
                .volumes
                .values()
                .filter(|v| v.published_nodes.contains_key(&req.node_id))
                .count() as i64;
            let known_node = s.nodes.contains(&req.node_id);
            let v = self.volume_mut(s, &req.volume_id)?;
            if !known_node {
                return Err(Status::not_found(format!("node {} not found", req.node_id)));
            }
            if let Some(p) = v.published_nodes.get(&req.node_id) {
                if p.readonly == req.readonly && p.capability == cap {
                    return Ok(p.publish_context.clone());
                }
                return Err(Status::already_exists(format!(
                    "volume {} is published to node {} with another capability or readonly flag",
                    v.id, req.node_id
                )));
            }
            if !is_multi_node(&cap.access_mode) {
                if let Some(other) = v.published_nodes.keys().next() {
                    return Err(Status::failed_precondition(format!(
                        "volume {} is already published to node {other}",
                        v.id
                    )));
                }
            }
            if max > 0 && attached_to_node >= max {
                return Err(Status::resource_exhausted(format!(
                    "node {} has {attached_to_node} volumes attached, the maximum is {max}",
                    req.node_id
                )));
            }
            let ctx = BTreeMap::from([("devicePath".to_owned(), format!("/dev/test-{}", v.id))]);
            v.published_nodes.insert(
                req.node_id.clone(),
                ControllerPublication {
                    readonly: req.readonly,
                    capability: cap.clone(),
                    secret_keys: secret_keys(&req.secrets),
                    publish_context: ctx.clone(),
                },
            );
            Ok(ctx)
        })
        .map(|ctx| ControllerPublishVolumeResponse {
            publish_context: ctx.into_iter().collect(),
        })
    }

    pub(super) fn controller_unpublish(
        &self,
        req: ControllerUnpublishVolumeRequest,
    ) -> Result<ControllerUnpublishVolumeResponse, Status> {
        if !self.enable_attach {
            return Err(Status::unimplemented(
                "ControllerUnpublishVolume: attach is disabled (--enable-attach)",
            ));
        }
        require(&req.volume_id, "volume_id")?;
        // Node-local: another node is NOT_FOUND, as in hostpathplugin (an
        // empty node_id, "every node", is fine).
        if !req.node_id.is_empty() {
            self.require_this_node(&req.node_id)?;
        }
        // A volume or node that does not exist is not published there, so
        // this is success ("not attached → 0 OK"; csi-sanity's cleanup
        // relies on it after DeleteVolume).
        self.tx(|s| {
            if let Some(v) = s.volumes.get_mut(&req.volume_id) {
                if req.node_id.is_empty() {
                    // Unset node_id: unpublish from every node (CSI spec).
                    v.published_nodes.clear();
                } else {
                    v.published_nodes.remove(&req.node_id);
                }
            }
            Ok(())
        })?;
        Ok(ControllerUnpublishVolumeResponse {})
    }

    pub(super) fn validate_capabilities(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, Status> {
        require(&req.volume_id, "volume_id")?;
        let caps = required_capabilities(&req.volume_capabilities)?;
        let v = self.known_volume(&req.volume_id)?;
        let unsupported = caps.iter().find(|c| {
            !v.volume_capabilities
                .iter()
                .any(|e| e.access_type == c.access_type)
        });
        if let Some(c) = unsupported {
            return Ok(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: format!(
                    "volume {} does not support access type {}",
                    v.id, c.access_type
                ),
            });
        }
        Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: Some(validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: req.mutable_parameters,
            }),
            message: String::new(),
        })
    }

    pub(super) fn list_volumes(
        &self,
        req: ListVolumesRequest,
    ) -> Result<ListVolumesResponse, Status> {
        let state = self.tx(|s| Ok(s.clone()))?;
        let start = page_start(req.max_entries, &req.starting_token, state.next_seq)?;
        let mut vols: Vec<&Volume> = state
            .volumes_by_seq()
            .into_iter()
            .filter(|v| v.seq >= start)
            .collect();
        let next_token = cut_page(&mut vols, req.max_entries, |v| v.seq);
        Ok(ListVolumesResponse {
            entries: vols
                .into_iter()
                .map(|v| list_volumes_response::Entry {
                    volume: Some(Self::csi_volume(v)),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids: v.published_node_ids(),
                        volume_condition: None,
                    }),
                })
                .collect(),
            next_token,
        })
    }

    pub(super) fn get_capacity(
        &self,
        req: GetCapacityRequest,
    ) -> Result<GetCapacityResponse, Status> {
        for c in &req.volume_capabilities {
            capability(c)?;
        }
        let segment = req.accessible_topology.as_ref().map(|t| &t.segments);
        if self.is_node_local()
            && !node_local::serves_segment(segment, &self.topology_key, &self.node_id)
        {
            // Another node's capacity is that node's instance's to tell.
            return Ok(GetCapacityResponse {
                available_capacity: 0,
                maximum_volume_size: Some(0),
                minimum_volume_size: None,
            });
        }
        let used = self.tx(|s| Ok(used_bytes_in(s, segment)))?;
        let available = (self.capacity - used).max(0);
        Ok(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: None,
        })
    }

    pub(super) fn controller_capabilities(&self) -> ControllerGetCapabilitiesResponse {
        use csiops_proto::csi::v1::controller_service_capability::{rpc::Type, Rpc, Type as T};
        let mut types = vec![
            Type::CreateDeleteVolume,
            Type::ListVolumes,
            Type::GetCapacity,
            Type::CreateDeleteSnapshot,
            Type::ListSnapshots,
            Type::CloneVolume,
        ];
        if self.enable_attach {
            types.push(Type::PublishUnpublishVolume);
            types.push(Type::ListVolumesPublishedNodes);
        }
        if self.enable_modify {
            types.push(Type::ModifyVolume);
        }
        ControllerGetCapabilitiesResponse {
            capabilities: types
                .into_iter()
                .map(|t| ControllerServiceCapability {
                    r#type: Some(T::Rpc(Rpc { r#type: t as i32 })),
                })
                .collect(),
        }
    }

    pub(super) fn controller_get_capabilities(
        &self,
        _: ControllerGetCapabilitiesRequest,
    ) -> Result<ControllerGetCapabilitiesResponse, Status> {
        Ok(self.controller_capabilities())
    }

    pub(super) fn csi_volume(v: &Volume) -> csiops_proto::csi::v1::Volume {
        csiops_proto::csi::v1::Volume {
            capacity_bytes: v.capacity_bytes,
            volume_id: v.id.clone(),
            volume_context: v
                .parameters
                .iter()
                .map(|(k, val)| (k.clone(), val.clone()))
                .collect(),
            content_source: v.content_source.as_ref().map(content_source_of),
            accessible_topology: v
                .accessible_topology
                .iter()
                .map(|seg| Topology {
                    segments: seg.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                })
                .collect(),
        }
    }
}

csi_service!(Controller {
    create_volume(CreateVolumeRequest -> CreateVolumeResponse) = "CreateVolume" => Driver::create_volume;
    delete_volume(DeleteVolumeRequest -> DeleteVolumeResponse) = "DeleteVolume" => Driver::delete_volume;
    controller_publish_volume(ControllerPublishVolumeRequest -> ControllerPublishVolumeResponse) = "ControllerPublishVolume" => Driver::controller_publish;
    controller_unpublish_volume(ControllerUnpublishVolumeRequest -> ControllerUnpublishVolumeResponse) = "ControllerUnpublishVolume" => Driver::controller_unpublish;
    validate_volume_capabilities(ValidateVolumeCapabilitiesRequest -> ValidateVolumeCapabilitiesResponse) = "ValidateVolumeCapabilities" => Driver::validate_capabilities;
    list_volumes(ListVolumesRequest -> ListVolumesResponse) = "ListVolumes" => Driver::list_volumes;
    get_capacity(GetCapacityRequest -> GetCapacityResponse) = "GetCapacity" => Driver::get_capacity;
    controller_get_capabilities(ControllerGetCapabilitiesRequest -> ControllerGetCapabilitiesResponse) = "ControllerGetCapabilities" => Driver::controller_get_capabilities;
    create_snapshot(CreateSnapshotRequest -> CreateSnapshotResponse) = "CreateSnapshot" => Driver::create_snapshot;
    delete_snapshot(DeleteSnapshotRequest -> DeleteSnapshotResponse) = "DeleteSnapshot" => Driver::delete_snapshot;
    list_snapshots(ListSnapshotsRequest -> ListSnapshotsResponse) = "ListSnapshots" => Driver::list_snapshots;
    get_snapshot(GetSnapshotRequest -> GetSnapshotResponse) = "GetSnapshot" => none("GetSnapshot");
    controller_expand_volume(ControllerExpandVolumeRequest -> ControllerExpandVolumeResponse) = "ControllerExpandVolume" => none("ControllerExpandVolume");
    controller_get_volume(ControllerGetVolumeRequest -> ControllerGetVolumeResponse) = "ControllerGetVolume" => none("ControllerGetVolume");
    controller_modify_volume(ControllerModifyVolumeRequest -> ControllerModifyVolumeResponse) = "ControllerModifyVolume" => Driver::controller_modify;
});

/// A volume's content source as CSI has it.
fn content_source_of(c: &ContentSource) -> VolumeContentSource {
    VolumeContentSource {
        r#type: Some(match c {
            ContentSource::Snapshot(id) => {
                volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
                    snapshot_id: id.clone(),
                })
            }
            ContentSource::Volume(id) => {
                volume_content_source::Type::Volume(volume_content_source::VolumeSource {
                    volume_id: id.clone(),
                })
            }
        }),
    }
}

/// Bytes GetCapacity counts as used: every volume's without a segment;
/// with one (a pool per segment, e.g. per node), the volumes accessible
/// from it — one of whose accessible segments has every requested pair.
fn used_bytes_in(s: &State, segment: Option<&HashMap<String, String>>) -> i64 {
    let Some(segment) = segment.filter(|m| !m.is_empty()) else {
        return s.used_bytes();
    };
    s.volumes
        .values()
        .filter(|v| {
            v.accessible_topology
                .iter()
                .any(|t| segment.iter().all(|(k, val)| t.get(k) == Some(val)))
        })
        .map(|v| v.capacity_bytes)
        .sum()
}

/// Whether an access mode lets more than one node publish the volume.
fn is_multi_node(mode: &str) -> bool {
    mode.starts_with("MULTI_NODE")
}

/// A random UUID v4, from getrandom(2): no `/dev` needed (a controller
/// container may lack it, which node-local tests reproduce).
pub(super) fn new_volume_id() -> Result<String, Status> {
    let mut b = [0u8; 16];
    let mut filled = 0;
    while filled < b.len() {
        let rest = &mut b[filled..];
        // SAFETY: writes at most `rest.len()` bytes into `rest`.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Status::internal(format!("getrandom: {e}")));
            }
            continue;
        }
        filled += n as usize;
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

/// Where a ListVolumes/ListSnapshots page starts. The token is the creation
/// sequence number to continue from, so deleting entries between pages never
/// shifts the next page.
pub(super) fn page_start(max_entries: i32, token: &str, next_seq: u64) -> Result<u64, Status> {
    if max_entries < 0 {
        return Err(Status::invalid_argument("max_entries must not be negative"));
    }
    if token.is_empty() {
        return Ok(0);
    }
    match token.parse::<u64>() {
        Ok(n) if n <= next_seq => Ok(n),
        _ => Err(Status::aborted(format!("invalid starting_token {token:?}"))),
    }
}

/// Cuts `entries` (in sequence order) to `max_entries` (0: all); returns the
/// token of the next page, empty when this is the last.
pub(super) fn cut_page<T>(
    entries: &mut Vec<T>,
    max_entries: i32,
    seq: impl Fn(&T) -> u64,
) -> String {
    let max = usize::try_from(max_entries).unwrap_or(0);
    if max > 0 && entries.len() > max {
        let next = seq(&entries[max]).to_string();
        entries.truncate(max);
        next
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use csiops_proto::csi::v1::{
        NodeExpandVolumeRequest, NodeGetVolumeStatsRequest, NodeStageVolumeRequest,
    };
    use tonic::Code;

    use super::super::config::Config;
    use super::super::service::fixtures::{create, mount_cap, node_local_cfg};
    use super::*;

    #[test]
    fn volume_ids_are_uuid_v4() {
        let a = new_volume_id().unwrap();
        let b = new_volume_id().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_eq!(a.matches('-').count(), 4);
    }

    #[test]
    fn capacity_is_used_per_segment_when_asked_with_one() {
        let mut s = State::default();
        for (id, node, bytes) in [
            ("a", "n1", 1 << 30),
            ("b", "n1", 2 << 30),
            ("c", "n2", 4 << 30),
        ] {
            s.volumes.insert(
                id.into(),
                Volume {
                    id: id.into(),
                    capacity_bytes: bytes,
                    accessible_topology: vec![BTreeMap::from([
                        ("zone".to_string(), "z".to_string()),
                        ("node".to_string(), node.to_string()),
                    ])],
                    ..Default::default()
                },
            );
        }
        let seg = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(used_bytes_in(&s, None), 7 << 30);
        assert_eq!(used_bytes_in(&s, Some(&seg(&[]))), 7 << 30);
        assert_eq!(used_bytes_in(&s, Some(&seg(&[("node", "n1")]))), 3 << 30);
        assert_eq!(
            used_bytes_in(&s, Some(&seg(&[("node", "n2"), ("zone", "z")]))),
            4 << 30
        );
        assert_eq!(used_bytes_in(&s, Some(&seg(&[("zone", "z")]))), 7 << 30);
        assert_eq!(used_bytes_in(&s, Some(&seg(&[("node", "n3")]))), 0);
    }

    #[test]
    fn node_local_volumes_are_this_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let d = Driver::new(&node_local_cfg("node-a", dir.path())).unwrap();
        let this = vec![BTreeMap::from([(
            d.topology_key.clone(),
            "node-a".to_owned(),
        )])];

        // Preferred another node, requisite allows this one: this node.
        let v = create(&d, "pvc-1", &["node-b", "node-a"]).unwrap();
        assert_eq!(v.accessible_topology, this);
        assert_eq!(v.node_id, "node-a");
        let err = create(&d, "pvc-2", &["node-b"]).unwrap_err();
        assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
        assert!(d.tx(|s| Ok(s.volume_by_name("pvc-2").is_none())).unwrap());

        // Unknown volume: NOT_FOUND in hostpathplugin's words, even for
        // NodeStageVolume without --data-dir (which has nothing to stage).
        let err = d
            .node_stage(NodeStageVolumeRequest {
                volume_id: "nope".into(),
                staging_target_path: "/stage".into(),
                volume_capability: Some(mount_cap()),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert_eq!(
            err.message(),
            "volume id nope does not exist in the volumes list"
        );
        let err = d
            .node_expand(NodeExpandVolumeRequest {
                volume_id: "nope".into(),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound);

        // Known volume, stats at a path that exists.
        let stats = d
            .node_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: v.id.clone(),
                volume_path: dir.path().to_str().unwrap().into(),
                staging_target_path: String::new(),
            })
            .unwrap();
        assert_eq!(stats.usage.len(), 2);
    }

    #[test]
    fn ignoring_requirements_creates_here_anyway() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = node_local_cfg("node-a", dir.path());
        cfg.ignore_accessibility_requirements = true;
        let d = Driver::new(&cfg).unwrap();
        let v = create(&d, "pvc-1", &["node-b"]).unwrap();
        assert_eq!(
            v.accessible_topology,
            vec![BTreeMap::from([(
                d.topology_key.clone(),
                "node-a".to_owned()
            )])]
        );
    }

    #[test]
    fn shared_mode_keeps_its_answers() {
        let dir = tempfile::tempdir().unwrap();
        let d = Driver::new(&Config::new("/unused.sock", "n1", dir.path())).unwrap();
        // The preferred topology, as before; no stats.
        let v = create(&d, "pvc-1", &["node-b"]).unwrap();
        assert_eq!(v.accessible_topology[0][&d.topology_key], "node-b");
        let err = d
            .node_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: v.id,
                volume_path: "/".into(),
                staging_target_path: String::new(),
            })
            .unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented);
        assert_eq!(d.unknown_volume("x").message(), "volume x not found");
    }

    #[test]
    fn modify_merges_mutable_parameters_only_when_enabled() {
        use csiops_proto::csi::v1::controller_service_capability::{rpc::Type, Type as T};
        let advertises = |d: &Driver| {
            d.controller_capabilities().capabilities.iter().any(
                |c| matches!(&c.r#type, Some(T::Rpc(r)) if r.r#type == Type::ModifyVolume as i32),
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let off = Driver::new(&Config::new("/unused.sock", "n1", dir.path())).unwrap();
        assert!(!advertises(&off));
        let err = off
            .controller_modify(ControllerModifyVolumeRequest {
                volume_id: "x".into(),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented);
        drop(off);

        let mut cfg = Config::new("/unused.sock", "n1", dir.path());
        cfg.enable_modify = true;
        let d = Driver::new(&cfg).unwrap();
        assert!(advertises(&d));
        let req = CreateVolumeRequest {
            name: "pvc-1".into(),
            volume_capabilities: vec![mount_cap()],
            mutable_parameters: HashMap::from([
                ("iops".to_string(), "100".to_string()),
                ("tier".to_string(), "gold".to_string()),
            ]),
            ..Default::default()
        };
        let id = d.create_volume(req).unwrap().volume.unwrap().volume_id;
        assert_eq!(
            d.known_volume(&id).unwrap().mutable_parameters["iops"],
            "100"
        );
        d.controller_modify(ControllerModifyVolumeRequest {
            volume_id: id.clone(),
            secrets: HashMap::from([("token".to_string(), "s3cr3t".to_string())]),
            mutable_parameters: HashMap::from([("iops".to_string(), "500".to_string())]),
        })
        .unwrap();
        let v = d.known_volume(&id).unwrap();
        assert_eq!(
            v.mutable_parameters,
            BTreeMap::from([
                ("iops".to_string(), "500".to_string()),
                ("tier".to_string(), "gold".to_string()),
            ])
        );
        assert_eq!(v.modifications, 1);
        assert_eq!(v.modify_secret_keys, ["token"]);
        for (req, code) in [
            (
                ControllerModifyVolumeRequest {
                    volume_id: "nope".into(),
                    mutable_parameters: HashMap::from([("a".to_string(), "b".to_string())]),
                    ..Default::default()
                },
                Code::NotFound,
            ),
            (
                ControllerModifyVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                },
                Code::InvalidArgument,
            ),
            (
                ControllerModifyVolumeRequest {
                    mutable_parameters: HashMap::from([("a".to_string(), "b".to_string())]),
                    ..Default::default()
                },
                Code::InvalidArgument,
            ),
        ] {
            assert_eq!(d.controller_modify(req).unwrap_err().code(), code);
        }
    }
}
