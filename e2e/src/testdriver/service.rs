//! The CSI Identity, Controller and Node services of `csi-test-driver`.
//!
//! Every RPC goes through [`Driver::call`]: a [`RECEIVED`] log line,
//! injected failure (`--fail`), delay (`--delay`), the work itself as one state transaction in a
//! detached blocking task (so it completes even if the caller hangs up),
//! `--fail-after`, `--delay-after`, and one log line with the redacted
//! request, the code and the response.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use csiops_proto::csi::v1::{
    controller_server::Controller, identity_server::Identity, list_snapshots_response,
    list_volumes_response, node_server::Node, plugin_capability,
    validate_volume_capabilities_response, volume_capability, volume_content_source,
    ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
    ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerModifyVolumeRequest,
    ControllerModifyVolumeResponse, ControllerPublishVolumeRequest,
    ControllerPublishVolumeResponse, ControllerServiceCapability, ControllerUnpublishVolumeRequest,
    ControllerUnpublishVolumeResponse, CreateSnapshotRequest, CreateSnapshotResponse,
    CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest, DeleteSnapshotResponse,
    DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest, GetCapacityResponse,
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, GetSnapshotRequest, GetSnapshotResponse, ListSnapshotsRequest,
    ListSnapshotsResponse, ListVolumesRequest, ListVolumesResponse, NodeExpandVolumeRequest,
    NodeExpandVolumeResponse, NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, PluginCapability, ProbeRequest,
    ProbeResponse, Topology, ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse,
    VolumeCapability, VolumeContentSource,
};
use csiops_proto::redact::redacted_debug;
use tonic::{Code, Request, Response, Status};

use super::config::{Config, DelaySpec, FaultSpec, DEFAULT_VOLUME_SIZE};
use super::copy;
use super::mounts;
use super::node_local::{self, NodeLocalError, Ownership};
use super::state::{
    Capability, ContentSource, ControllerPublication, DeletedVolume, NodePublication, Snapshot,
    State, StateStore, Volume,
};

type Reply<T> = Result<Response<T>, Status>;

/// The message of the line logged when a call's detached work begins
/// (before `--fail`/`--delay`): from then on the call completes even if the
/// caller goes away.
pub const RECEIVED: &str = "call received";

/// The driver: configuration, state store and fault injection. Implements
/// the three CSI services (clone the `Arc` into each tonic server).
#[derive(Debug)]
pub struct Driver {
    pub name: String,
    pub version: String,
    pub node_id: String,
    pub topology_key: String,
    /// `--topology-value`, else the node ID.
    pub topology_value: String,
    pub max_volumes_per_node: i64,
    /// `--max-volumes-per-node-file`: read at every use (see [`Driver::max_volumes`]).
    max_volumes_per_node_file: Option<PathBuf>,
    pub capacity: i64,
    pub enable_attach: bool,
    /// `--enable-modify`: MODIFY_VOLUME and ControllerModifyVolume.
    pub enable_modify: bool,
    store: StateStore,
    /// Canonical state dir: target paths inside it are really created.
    state_dir: PathBuf,
    /// `--data-dir`: real volumes and real mounts (see [`super::mounts`]).
    data_dir: Option<PathBuf>,
    /// `--node-local` (see [`super::node_local`]): the hold on the state
    /// dir, kept for the process's lifetime.
    node_local: Option<Ownership>,
    /// `--ignore-accessibility-requirements`.
    ignore_accessibility_requirements: bool,
    fail: Vec<FaultSpec>,
    fail_after: Vec<FaultSpec>,
    delay: Vec<DelaySpec>,
    delay_after: Vec<DelaySpec>,
    /// `--numbered-failures`: the count of injected failures so far.
    failure_numbers: Option<AtomicU64>,
}

/// Clonable handle to a [`Driver`], what the tonic servers hold.
#[derive(Clone, Debug)]
pub struct DriverHandle(pub Arc<Driver>);

impl Driver {
    /// Opens the state dir and records `nodeid` as a known node.
    pub fn new(cfg: &Config) -> Result<Driver, String> {
        let state_dir = cfg.state_dir.as_deref().ok_or("--state-dir is required")?;
        let node_id = cfg
            .nodeid
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or("--nodeid is required")?;
        if cfg.capacity < 0 || cfg.max_volumes_per_node < 0 {
            return Err("--capacity and --max-volumes-per-node must not be negative".into());
        }
        let store = StateStore::open(state_dir)
            .map_err(|e| format!("state dir {}: {e}", state_dir.display()))?;
        let state_dir = state_dir
            .canonicalize()
            .map_err(|e| format!("state dir {}: {e}", state_dir.display()))?;
        // Node-local: hold the dir before reading it, so no other instance
        // writes it between the check and the serving.
        let node_local = cfg
            .node_local
            .then(|| node_local::claim(&state_dir, &node_id))
            .transpose()
            .map_err(|e| e.to_string())?;
        let owner = node_local.is_some();
        store
            .transaction(|s| {
                if owner {
                    node_local::check_state(s, &state_dir, &node_id)?;
                    s.node_local_owner = Some(node_id.clone());
                } else {
                    node_local::check_not_owned(s, &state_dir)?;
                }
                s.nodes.insert(node_id.clone());
                Ok(())
            })
            .map_err(|e| format!("state dir {}: {e}", state_dir.display()))?
            .map_err(|e: node_local::OwnershipError| e.to_string())?;
        if let Some(d) = &cfg.data_dir {
            std::fs::create_dir_all(d).map_err(|e| format!("data dir {}: {e}", d.display()))?;
        } else if owner {
            // Still node-local in every answer, but nothing fails for want
            // of /dev or privilege, unlike hostpathplugin.
            tracing::warn!(
                "--node-local without --data-dir: volumes are only recorded, \
                 no loop devices or mounts are made"
            );
        }
        let topology_value = cfg
            .topology_value
            .clone()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| node_id.clone());
        Ok(Driver {
            name: cfg.drivername.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            node_id,
            topology_key: cfg.topology_key.clone(),
            topology_value,
            max_volumes_per_node: cfg.max_volumes_per_node,
            max_volumes_per_node_file: cfg.max_volumes_per_node_file.clone(),
            capacity: cfg.capacity,
            enable_attach: cfg.enable_attach,
            enable_modify: cfg.enable_modify,
            store,
            state_dir,
            data_dir: cfg.data_dir.clone(),
            node_local,
            ignore_accessibility_requirements: cfg.ignore_accessibility_requirements,
            fail: cfg.fail.clone(),
            fail_after: cfg.fail_after.clone(),
            delay: cfg.delay.clone(),
            delay_after: cfg.delay_after.clone(),
            failure_numbers: cfg.numbered_failures.then(|| AtomicU64::new(0)),
        })
    }

    /// The limit of volumes per node now: the count in
    /// `--max-volumes-per-node-file` if that file exists, else
    /// `--max-volumes-per-node` (0: none).
    pub fn max_volumes(&self) -> Result<i64, Status> {
        let Some(path) = &self.max_volumes_per_node_file else {
            return Ok(self.max_volumes_per_node);
        };
        match std::fs::read_to_string(path) {
            Ok(text) => text
                .trim()
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    Status::internal(format!(
                        "{} holds {:?}, not a count of volumes",
                        path.display(),
                        text.trim()
                    ))
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(self.max_volumes_per_node),
            Err(e) => Err(Status::internal(format!("reading {}: {e}", path.display()))),
        }
    }

    /// The canonical state dir.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// `--node-local`.
    pub fn is_node_local(&self) -> bool {
        self.node_local.is_some()
    }

    /// NOT_FOUND for a volume this state does not hold; node-local mode
    /// words it as hostpathplugin does.
    fn unknown_volume(&self, id: &str) -> Status {
        if self.is_node_local() {
            NodeLocalError::UnknownVolume(id.to_owned()).into()
        } else {
            Status::not_found(format!("volume {id} not found"))
        }
    }

    /// The volume `id`, or [`Self::unknown_volume`].
    fn known_volume(&self, id: &str) -> Result<Volume, Status> {
        self.tx(|s| {
            s.volumes
                .get(id)
                .cloned()
                .ok_or_else(|| self.unknown_volume(id))
        })
    }

    /// Node-local: ControllerPublish/UnpublishVolume only for this node.
    fn require_this_node(&self, node_id: &str) -> Result<(), Status> {
        if self.is_node_local() && node_id != self.node_id {
            return Err(NodeLocalError::OtherNode {
                requested: node_id.to_owned(),
                ours: self.node_id.clone(),
            }
            .into());
        }
        Ok(())
    }

    fn injected(&self, specs: &[FaultSpec], method: &str) -> Option<Status> {
        let f = specs.iter().find(|f| f.method == method && f.take())?;
        let mut message = format!("injected failure: {method}={:?}", f.code);
        if let Some(n) = &self.failure_numbers {
            message.push_str(&format!(" (#{})", n.fetch_add(1, Ordering::SeqCst) + 1));
        }
        Some(Status::new(f.code, message))
    }

    fn delay_of(specs: &[DelaySpec], method: &str) -> Duration {
        specs
            .iter()
            .filter(|d| d.method == method)
            .map(|d| d.delay)
            .sum()
    }

    /// Runs one RPC (see the module docs). `op` runs on the blocking pool.
    async fn call<Req, Resp, F>(
        self: &Arc<Self>,
        method: &'static str,
        request: Request<Req>,
        op: F,
    ) -> Reply<Resp>
    where
        Req: prost::Message + prost::Name + Send + 'static,
        Resp: prost::Message + prost::Name + Send + 'static,
        F: FnOnce(&Driver, Req) -> Result<Resp, Status> + Send + 'static,
    {
        let req = request.into_inner();
        let req_text = redacted_debug(&req);
        let started = Instant::now();
        let this = self.clone();
        // Detached: if the caller hangs up or its deadline passes, the work
        // still completes (and is logged), as a real storage backend's would.
        let task = tokio::spawn(async move {
            // From this line on the call completes whatever the caller does:
            // tests wait for it before killing a caller (see
            // TestDriverProcess::received).
            tracing::info!(method, request = %req_text, "{RECEIVED}");
            let result = async {
                if let Some(status) = this.injected(&this.fail, method) {
                    return Err(status);
                }
                let delay = Self::delay_of(&this.delay, method);
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let worker = this.clone();
                let resp = tokio::task::spawn_blocking(move || op(&worker, req))
                    .await
                    .map_err(|e| Status::internal(format!("{method} panicked: {e}")))??;
                if let Some(status) = this.injected(&this.fail_after, method) {
                    return Err(status);
                }
                let delay = Self::delay_of(&this.delay_after, method);
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok(resp)
            }
            .await;
            let ms = started.elapsed().as_millis() as u64;
            match &result {
                Ok(resp) => tracing::info!(
                    method,
                    code = %"OK",
                    duration_ms = ms,
                    request = %req_text,
                    response = %redacted_debug(resp),
                    "call"
                ),
                Err(status) => tracing::info!(
                    method,
                    code = ?status.code(),
                    message = status.message(),
                    duration_ms = ms,
                    request = %req_text,
                    "call"
                ),
            }
            result
        });
        let result = task
            .await
            .unwrap_or_else(|e| Err(Status::internal(format!("{method} failed: {e}"))));
        result.map(Response::new)
    }

    /// A state transaction; store I/O errors become `INTERNAL`.
    fn tx<T>(&self, f: impl FnOnce(&mut State) -> Result<T, Status>) -> Result<T, Status> {
        self.store
            .transaction(f)
            .map_err(|e| Status::internal(format!("state store: {e}")))?
    }

    fn this_node_topology(&self) -> Topology {
        Topology {
            segments: HashMap::from([(self.topology_key.clone(), self.topology_value.clone())]),
        }
    }

    fn inside_state_dir(&self, target: &str) -> bool {
        let p = Path::new(target);
        p.is_absolute()
            && !p.components().any(|c| matches!(c, Component::ParentDir))
            && p.starts_with(&self.state_dir)
            && p != self.state_dir
    }

    fn csi_volume(v: &Volume) -> csiops_proto::csi::v1::Volume {
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

    // ---- Controller operations (sync, run inside `call`) ----

    fn create_volume(&self, req: CreateVolumeRequest) -> Result<CreateVolumeResponse, Status> {
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities are required"));
        }
        let caps = req
            .volume_capabilities
            .iter()
            .map(capability)
            .collect::<Result<Vec<_>, _>>()?;
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

    fn delete_volume(&self, req: DeleteVolumeRequest) -> Result<DeleteVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
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
    fn controller_modify(
        &self,
        req: ControllerModifyVolumeRequest,
    ) -> Result<ControllerModifyVolumeResponse, Status> {
        if !self.enable_modify {
            return Err(Status::unimplemented(
                "ControllerModifyVolume: modify is disabled (--enable-modify)",
            ));
        }
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument("mutable_parameters is required"));
        }
        self.tx(|s| {
            let Some(v) = s.volumes.get_mut(&req.volume_id) else {
                return Err(self.unknown_volume(&req.volume_id));
            };
            v.mutable_parameters.extend(req.mutable_parameters.clone());
            v.modifications += 1;
            v.modify_secret_keys = secret_keys(&req.secrets);
            Ok(())
        })?;
        Ok(ControllerModifyVolumeResponse {})
    }

    fn controller_publish(
        &self,
        req: ControllerPublishVolumeRequest,
    ) -> Result<ControllerPublishVolumeResponse, Status> {
        if !self.enable_attach {
            return Err(Status::unimplemented(
                "ControllerPublishVolume: attach is disabled (--enable-attach)",
            ));
        }
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.node_id.is_empty() {
            return Err(Status::invalid_argument("node_id is required"));
        }
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))
            .and_then(capability)?;
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
            let v = s
                .volumes
                .get_mut(&req.volume_id)
                .ok_or_else(|| self.unknown_volume(&req.volume_id))?;
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

    fn controller_unpublish(
        &self,
        req: ControllerUnpublishVolumeRequest,
    ) -> Result<ControllerUnpublishVolumeResponse, Status> {
        if !self.enable_attach {
            return Err(Status::unimplemented(
                "ControllerUnpublishVolume: attach is disabled (--enable-attach)",
            ));
        }
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
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

    fn validate_capabilities(
        &self,
        req: ValidateVolumeCapabilitiesRequest,
    ) -> Result<ValidateVolumeCapabilitiesResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities are required"));
        }
        let caps = req
            .volume_capabilities
            .iter()
            .map(capability)
            .collect::<Result<Vec<_>, _>>()?;
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

    fn list_volumes(&self, req: ListVolumesRequest) -> Result<ListVolumesResponse, Status> {
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

    fn get_capacity(&self, req: GetCapacityRequest) -> Result<GetCapacityResponse, Status> {
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

    fn create_snapshot(
        &self,
        req: CreateSnapshotRequest,
    ) -> Result<CreateSnapshotResponse, Status> {
        if req.name.is_empty() {
            return Err(Status::invalid_argument("name is required"));
        }
        if req.source_volume_id.is_empty() {
            return Err(Status::invalid_argument("source_volume_id is required"));
        }
        let parameters: BTreeMap<String, String> = req.parameters.clone().into_iter().collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let snapshot = self.tx(|s| {
            if let Some(existing) = s.snapshots.values().find(|x| x.name == req.name) {
                if existing.source_volume_id != req.source_volume_id {
                    return Err(Status::already_exists(format!(
                        "snapshot {:?} ({}) exists for another source volume {}",
                        req.name, existing.id, existing.source_volume_id
                    )));
                }
                return Ok(existing.clone());
            }
            let source = s.volumes.get(&req.source_volume_id).ok_or_else(|| {
                Status::not_found(format!("volume {} does not exist", req.source_volume_id))
            })?;
            let snap = Snapshot {
                id: new_volume_id()?,
                name: req.name.clone(),
                source_volume_id: req.source_volume_id.clone(),
                size_bytes: source.capacity_bytes,
                seq: s.next_seq,
                creation_seconds: now,
                parameters: parameters.clone(),
            };
            s.next_seq += 1;
            if let Some(dir) = &self.data_dir {
                snapshot_data(dir, &req.source_volume_id, &snap.id)?;
            }
            s.snapshots.insert(snap.id.clone(), snap.clone());
            Ok(snap)
        })?;
        Ok(CreateSnapshotResponse {
            snapshot: Some(csi_snapshot(&snapshot)),
        })
    }

    fn delete_snapshot(
        &self,
        req: DeleteSnapshotRequest,
    ) -> Result<DeleteSnapshotResponse, Status> {
        if req.snapshot_id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is required"));
        }
        // Gone already is success (CSI spec).
        self.tx(|s| {
            if let Some(dir) = &self.data_dir {
                remove_snapshot_data(dir, &req.snapshot_id)?;
            }
            s.snapshots.remove(&req.snapshot_id);
            Ok(())
        })?;
        Ok(DeleteSnapshotResponse {})
    }

    fn list_snapshots(&self, req: ListSnapshotsRequest) -> Result<ListSnapshotsResponse, Status> {
        let state = self.tx(|s| Ok(s.clone()))?;
        let start = page_start(req.max_entries, &req.starting_token, state.next_seq)?;
        let mut snaps: Vec<&Snapshot> = state
            .snapshots
            .values()
            .filter(|x| req.snapshot_id.is_empty() || x.id == req.snapshot_id)
            .filter(|x| {
                req.source_volume_id.is_empty() || x.source_volume_id == req.source_volume_id
            })
            .filter(|x| x.seq >= start)
            .collect();
        snaps.sort_by_key(|x| x.seq);
        let next_token = cut_page(&mut snaps, req.max_entries, |x| x.seq);
        Ok(ListSnapshotsResponse {
            entries: snaps
                .into_iter()
                .map(|x| list_snapshots_response::Entry {
                    snapshot: Some(csi_snapshot(x)),
                })
                .collect(),
            next_token,
        })
    }

    fn controller_capabilities(&self) -> ControllerGetCapabilitiesResponse {
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

    // ---- Node operations ----

    fn node_publish(
        &self,
        req: NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is required"));
        }
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))
            .and_then(capability)?;
        let create_dir = self.inside_state_dir(&req.target_path);
        let node_id = self.node_id.clone();
        self.tx(|s| {
            let v = s
                .volumes
                .get_mut(&req.volume_id)
                .ok_or_else(|| self.unknown_volume(&req.volume_id))?;
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
    fn node_stage(&self, req: NodeStageVolumeRequest) -> Result<NodeStageVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.staging_target_path.is_empty() {
            return Err(Status::invalid_argument("staging_target_path is required"));
        }
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))
            .and_then(capability)?;
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
            let v = s
                .volumes
                .get_mut(&req.volume_id)
                .ok_or_else(|| self.unknown_volume(&req.volume_id))?;
            v.node_stagings
                .insert(req.staging_target_path.clone(), node_id);
            Ok(())
        })?;
        Ok(NodeStageVolumeResponse {})
    }

    /// NodeUnstageVolume: unmounts the staging path (idempotent).
    fn node_unstage(
        &self,
        req: NodeUnstageVolumeRequest,
    ) -> Result<NodeUnstageVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.staging_target_path.is_empty() {
            return Err(Status::invalid_argument("staging_target_path is required"));
        }
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

    fn node_unpublish(
        &self,
        req: NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Status> {
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.target_path.is_empty() {
            return Err(Status::invalid_argument("target_path is required"));
        }
        let remove_dir = self.inside_state_dir(&req.target_path);
        self.tx(|s| {
            let v = s
                .volumes
                .get_mut(&req.volume_id)
                .ok_or_else(|| self.unknown_volume(&req.volume_id))?;
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
    fn node_volume_stats(
        &self,
        req: NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        if !self.is_node_local() {
            return unimplemented("NodeGetVolumeStats");
        }
        if req.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if req.volume_path.is_empty() {
            return Err(Status::invalid_argument("volume_path is required"));
        }
        let v = self.known_volume(&req.volume_id)?;
        Ok(NodeGetVolumeStatsResponse {
            usage: node_local::volume_usage(Path::new(&req.volume_path), v.capacity_bytes)?,
            volume_condition: None,
        })
    }

    /// NodeExpandVolume is not implemented (nor advertised); node-local
    /// answers NOT_FOUND first for a volume it does not know, as
    /// hostpathplugin (with expansion on, its default) does.
    fn node_expand(
        &self,
        req: NodeExpandVolumeRequest,
    ) -> Result<NodeExpandVolumeResponse, Status> {
        if self.is_node_local() {
            if req.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is required"));
            }
            self.known_volume(&req.volume_id)?;
        }
        unimplemented("NodeExpandVolume")
    }
}

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

/// A snapshot as CSI has it; it is ready at once (nothing is copied).
fn csi_snapshot(x: &Snapshot) -> csiops_proto::csi::v1::Snapshot {
    csiops_proto::csi::v1::Snapshot {
        size_bytes: x.size_bytes,
        snapshot_id: x.id.clone(),
        source_volume_id: x.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: x.creation_seconds,
            nanos: 0,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    }
}

/// The data of a new volume under `--data-dir`: a directory, or for a
/// block-only volume a sparse file of its capacity.
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

/// With `source` (a snapshot's or a volume's data, see [`source_data`]),
/// the new volume starts as a copy of it: an image is copied with its holes
/// and grown to the volume's capacity, a directory tree copied into the new
/// directory; a source of the other kind, or none on disk, leaves it empty.
///
/// `node_local`: a block volume's loop device is set up now too, and stays
/// until DeleteVolume ([`node_local::attach_at_create`]); otherwise the node
/// service sets it up at publish.
fn create_data(
    dir: &Path,
    v: &Volume,
    source: Option<&Path>,
    node_local: bool,
) -> Result<(), Status> {
    let block = v
        .volume_capabilities
        .iter()
        .all(|c| c.access_type == "block");
    let image = dir.join(format!("{}.img", v.id));
    let size = u64::try_from(v.capacity_bytes).unwrap_or(0);
    let source_image = source
        .map(|p| p.with_extension("img"))
        .filter(|p| p.is_file());
    let source_dir = source.filter(|p| p.is_dir());
    let result = if block {
        match source_image {
            Some(src) => copy::copy_sparse(&src, &image).and_then(|()| {
                let f = std::fs::OpenOptions::new().write(true).open(&image)?;
                f.set_len(size.max(f.metadata()?.len()))
            }),
            None => std::fs::File::create(&image).and_then(|f| f.set_len(size)),
        }
    } else {
        let vol = dir.join(&v.id);
        std::fs::create_dir_all(&vol).and_then(|()| match source_dir {
            Some(src) => copy::copy_tree(src, &vol),
            None => Ok(()),
        })
    };
    result.map_err(|e| Status::internal(format!("creating the data of {}: {e}", v.id)))?;
    if block && node_local {
        let dev = node_local::attach_at_create(&image)?;
        tracing::info!(volume = %v.id, device = %dev.display(), "loop device set up");
    }
    Ok(())
}

/// Where a content source's data is: `<dir>/snapshots/<id>` for a
/// snapshot, `<dir>/<id>` for a volume, each with `.img` for a block one.
fn source_data(dir: &Path, c: &ContentSource) -> PathBuf {
    match c {
        ContentSource::Snapshot(id) => dir.join(SNAPSHOTS).join(id),
        ContentSource::Volume(id) => dir.join(id),
    }
}

/// The snapshots' data dir inside `--data-dir` (volume IDs are UUIDs).
const SNAPSHOTS: &str = "snapshots";

/// A snapshot's data: a copy of its source volume's image or directory as
/// it is now (point in time), kept until DeleteSnapshot.
fn snapshot_data(dir: &Path, volume_id: &str, snapshot_id: &str) -> Result<(), Status> {
    let snaps = dir.join(SNAPSHOTS);
    let err = |e: std::io::Error| {
        Status::internal(format!(
            "copying the data of {volume_id} into snapshot {snapshot_id}: {e}"
        ))
    };
    std::fs::create_dir_all(&snaps).map_err(err)?;
    remove_snapshot_data(dir, snapshot_id)?;
    let image = dir.join(format!("{volume_id}.img"));
    if image.is_file() {
        copy::copy_sparse(&image, &snaps.join(format!("{snapshot_id}.img"))).map_err(err)
    } else {
        let to = snaps.join(snapshot_id);
        std::fs::create_dir(&to)
            .and_then(|()| copy::copy_tree(&dir.join(volume_id), &to))
            .map_err(err)
    }
}

/// Removes a snapshot's data (either form; absent is fine).
fn remove_snapshot_data(dir: &Path, id: &str) -> Result<(), Status> {
    let snaps = dir.join(SNAPSHOTS);
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Status::internal(format!(
            "removing the data of snapshot {id}: {e}"
        ))),
        _ => Ok(()),
    };
    gone(std::fs::remove_file(snaps.join(format!("{id}.img"))))?;
    gone(std::fs::remove_dir_all(snaps.join(id)))
}

/// Removes a deleted volume's data (either form; absent is fine).
fn remove_data(dir: &Path, id: &str) -> Result<(), Status> {
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Status::internal(format!("removing the data of {id}: {e}")))
        }
        _ => Ok(()),
    };
    let image = dir.join(format!("{id}.img"));
    if image.exists() {
        gone(mounts::detach_loop(&image))?;
    }
    gone(std::fs::remove_file(image))?;
    gone(std::fs::remove_dir_all(dir.join(id)))
}

/// The real mount of NodePublishVolume under `--data-dir`: the staging path
/// (or the volume's directory) on a target directory, or the loop device of
/// a block volume on a target file.
fn publish_data(
    dir: &Path,
    v: &Volume,
    req: &NodePublishVolumeRequest,
    cap: &Capability,
) -> Result<(), Status> {
    let target = Path::new(&req.target_path);
    let result = if cap.access_type == "block" {
        mounts::publish_block(&dir.join(format!("{}.img", v.id)), target, req.readonly)
    } else {
        let source = if req.staging_target_path.is_empty() {
            dir.join(&v.id)
        } else {
            PathBuf::from(&req.staging_target_path)
        };
        std::fs::create_dir_all(target).and_then(|()| mounts::bind(&source, target, req.readonly))
    };
    result.map_err(|e| Status::internal(format!("publishing at {}: {e}", req.target_path)))
}

/// The flattened form of a request's `VolumeCapability`; `INVALID_ARGUMENT`
/// without access type or access mode.
fn capability(c: &VolumeCapability) -> Result<Capability, Status> {
    let mode = c
        .access_mode
        .as_ref()
        .map(|m| m.mode)
        .ok_or_else(|| Status::invalid_argument("volume capability without access_mode"))?;
    let mode = volume_capability::access_mode::Mode::try_from(mode)
        .ok()
        .filter(|m| *m != volume_capability::access_mode::Mode::Unknown)
        .ok_or_else(|| Status::invalid_argument(format!("unknown access mode {mode}")))?;
    let (access_type, fs_type, mount_flags) = match &c.access_type {
        Some(volume_capability::AccessType::Mount(m)) => {
            ("mount", m.fs_type.clone(), m.mount_flags.clone())
        }
        Some(volume_capability::AccessType::Block(_)) => ("block", String::new(), Vec::new()),
        None => {
            return Err(Status::invalid_argument(
                "volume capability without access_type (mount or block)",
            ))
        }
    };
    Ok(Capability {
        access_type: access_type.to_owned(),
        access_mode: mode.as_str_name().to_owned(),
        fs_type,
        mount_flags,
    })
}

fn is_multi_node(mode: &str) -> bool {
    mode.starts_with("MULTI_NODE")
}

/// Sorted keys of a secrets map. The values never leave the request.
fn secret_keys(secrets: &HashMap<String, String>) -> Vec<String> {
    let mut keys: Vec<String> = secrets.keys().cloned().collect();
    keys.sort();
    keys
}

/// A random UUID v4, from getrandom(2): no `/dev` needed (a controller
/// container may lack it, which node-local tests reproduce).
fn new_volume_id() -> Result<String, Status> {
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

fn unimplemented<T>(method: &str) -> Result<T, Status> {
    Err(Status::new(
        Code::Unimplemented,
        format!("{method} is not implemented by csi-test-driver"),
    ))
}

/// The Identity and Node answers that need no state.
impl Driver {
    fn plugin_info(&self, _: GetPluginInfoRequest) -> Result<GetPluginInfoResponse, Status> {
        Ok(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: self.version.clone(),
            manifest: HashMap::new(),
        })
    }

    fn plugin_capabilities(
        &self,
        _: GetPluginCapabilitiesRequest,
    ) -> Result<GetPluginCapabilitiesResponse, Status> {
        use plugin_capability::{service::Type, Service, Type as T};
        Ok(GetPluginCapabilitiesResponse {
            capabilities: [
                Type::ControllerService,
                Type::VolumeAccessibilityConstraints,
            ]
            .into_iter()
            .map(|t| PluginCapability {
                r#type: Some(T::Service(Service { r#type: t as i32 })),
            })
            .collect(),
        })
    }

    fn probe(&self, _: ProbeRequest) -> Result<ProbeResponse, Status> {
        Ok(ProbeResponse { ready: Some(true) })
    }

    fn controller_get_capabilities(
        &self,
        _: ControllerGetCapabilitiesRequest,
    ) -> Result<ControllerGetCapabilitiesResponse, Status> {
        Ok(self.controller_capabilities())
    }

    /// STAGE_UNSTAGE_VOLUME only with `--data-dir` (real mounts);
    /// GET_VOLUME_STATS with `--node-local` (hostpathplugin has it).
    fn node_capabilities(
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

    fn node_info(&self, _: NodeGetInfoRequest) -> Result<NodeGetInfoResponse, Status> {
        Ok(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.max_volumes()?,
            accessible_topology: Some(self.this_node_topology()),
        })
    }
}

/// One tonic service impl for [`DriverHandle`]: each RPC runs its handler
/// through [`Driver::call`] under its CSI method name, or answers
/// UNIMPLEMENTED. (The impl is generated whole so `async_trait` sees the
/// methods.)
macro_rules! csi_service {
    ($service:ident {
        $($rpc:ident($req:ident -> $resp:ident) = $method:literal => $handler:expr;)*
    }) => {
        #[tonic::async_trait]
        impl $service for DriverHandle {
            $(
                async fn $rpc(&self, r: Request<$req>) -> Reply<$resp> {
                    self.0.call($method, r, $handler).await
                }
            )*
        }
    };
}

/// A handler for an RPC csi-test-driver does not implement.
fn none<Req, Resp>(
    method: &'static str,
) -> impl Fn(&Driver, Req) -> Result<Resp, Status> + Send + 'static {
    move |_, _| unimplemented(method)
}

csi_service!(Identity {
    get_plugin_info(GetPluginInfoRequest -> GetPluginInfoResponse) = "GetPluginInfo" => Driver::plugin_info;
    get_plugin_capabilities(GetPluginCapabilitiesRequest -> GetPluginCapabilitiesResponse) = "GetPluginCapabilities" => Driver::plugin_capabilities;
    probe(ProbeRequest -> ProbeResponse) = "Probe" => Driver::probe;
});

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

/// Where a ListVolumes/ListSnapshots page starts. The token is the creation
/// sequence number to continue from, so deleting entries between pages never
/// shifts the next page.
fn page_start(max_entries: i32, token: &str, next_seq: u64) -> Result<u64, Status> {
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
fn cut_page<T>(entries: &mut Vec<T>, max_entries: i32, seq: impl Fn(&T) -> u64) -> String {
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
    fn inside_state_dir_is_lexical_and_strict() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config::new("/unused.sock", "n1", dir.path());
        let d = Driver::new(&cfg).unwrap();
        let base = d.state_dir().to_path_buf();
        assert!(d.inside_state_dir(base.join("t/target").to_str().unwrap()));
        assert!(!d.inside_state_dir(base.to_str().unwrap()));
        assert!(!d.inside_state_dir(base.join("../x").to_str().unwrap()));
        assert!(!d.inside_state_dir("/tmp/csi-mount/target"));
        assert!(!d.inside_state_dir("relative/target"));
        // The node ID is recorded as known.
        let s = super::super::state::load_state(dir.path()).unwrap();
        assert!(s.nodes.contains("n1"));
    }

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

    fn block_cap() -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(volume_capability::AccessType::Block(
                volume_capability::BlockVolume::default(),
            )),
        }
    }

    fn create_from(
        d: &Driver,
        name: &str,
        cap: VolumeCapability,
        bytes: i64,
        source: Option<volume_content_source::Type>,
    ) -> Volume {
        let v = d
            .create_volume(CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(csiops_proto::csi::v1::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap],
                volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
                ..Default::default()
            })
            .unwrap()
            .volume
            .unwrap();
        super::super::state::load_state(d.state_dir())
            .unwrap()
            .volumes
            .remove(&v.volume_id)
            .unwrap()
    }

    fn snapshot_of(d: &Driver, name: &str, volume: &str) -> String {
        d.create_snapshot(CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: volume.into(),
            ..Default::default()
        })
        .unwrap()
        .snapshot
        .unwrap()
        .snapshot_id
    }

    #[test]
    fn with_a_data_dir_snapshots_and_clones_carry_the_data() {
        use volume_content_source::{SnapshotSource, Type, VolumeSource};
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut cfg = Config::new("/unused.sock", "n1", &dir.path().join("state"));
        cfg.data_dir = Some(data.clone());
        let d = Driver::new(&cfg).unwrap();

        // A filesystem volume: the snapshot is a copy as of its creation.
        let fs = create_from(&d, "fs", mount_cap(), 1 << 20, None);
        std::fs::write(data.join(&fs.id).join("f"), "before").unwrap();
        let snap = snapshot_of(&d, "s1", &fs.id);
        std::fs::write(data.join(&fs.id).join("f"), "after").unwrap();
        let restored = create_from(
            &d,
            "restored",
            mount_cap(),
            1 << 20,
            Some(Type::Snapshot(SnapshotSource {
                snapshot_id: snap.clone(),
            })),
        );
        let read = |id: &str| std::fs::read_to_string(data.join(id).join("f")).unwrap();
        assert_eq!(read(&restored.id), "before");
        let clone = create_from(
            &d,
            "clone",
            mount_cap(),
            1 << 20,
            Some(Type::Volume(VolumeSource {
                volume_id: fs.id.clone(),
            })),
        );
        assert_eq!(read(&clone.id), "after");

        // A block volume: its image is copied, holes kept, grown to the
        // new volume's size.
        let blk = create_from(&d, "blk", block_cap(), 4 << 20, None);
        let image = |id: &str| data.join(format!("{id}.img"));
        {
            use std::io::{Seek, Write};
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(image(&blk.id))
                .unwrap();
            f.seek(std::io::SeekFrom::Start(1 << 20)).unwrap();
            f.write_all(b"block data").unwrap();
        }
        let bsnap = snapshot_of(&d, "s2", &blk.id);
        let bigger = create_from(
            &d,
            "bigger",
            block_cap(),
            8 << 20,
            Some(Type::Snapshot(SnapshotSource {
                snapshot_id: bsnap.clone(),
            })),
        );
        let bytes = std::fs::read(image(&bigger.id)).unwrap();
        assert_eq!(bytes.len(), 8 << 20);
        assert_eq!(&bytes[1 << 20..(1 << 20) + 10], b"block data");

        // DeleteSnapshot removes its data.
        for id in [&snap, &bsnap] {
            d.delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: id.to_string(),
                ..Default::default()
            })
            .unwrap();
        }
        let left: Vec<_> = std::fs::read_dir(data.join(SNAPSHOTS))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
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

    fn node_local_cfg(node: &str, dir: &Path) -> Config {
        let mut cfg = Config::new("/unused.sock", node, dir);
        cfg.node_local = true;
        cfg
    }

    #[test]
    fn a_node_local_instance_owns_its_state_dir() {
        // A dir a shared-mode instance of another node used is refused.
        let used = tempfile::tempdir().unwrap();
        drop(Driver::new(&Config::new("/unused.sock", "ctrl-0", used.path())).unwrap());
        let err = Driver::new(&node_local_cfg("node-a", used.path())).unwrap_err();
        assert!(err.contains("\"ctrl-0\""), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let first = Driver::new(&node_local_cfg("node-a", dir.path())).unwrap();
        assert!(first.is_node_local());
        let err = Driver::new(&node_local_cfg("node-a", dir.path())).unwrap_err();
        assert!(err.contains("in use by another node-local"), "{err}");
        let err = Driver::new(&Config::new("/unused.sock", "ctrl-0", dir.path())).unwrap_err();
        assert!(
            err.contains("belongs to the node-local instance of node node-a"),
            "{err}"
        );
        drop(first);
        // Released with the process (here: the driver); the same node again.
        let again = Driver::new(&node_local_cfg("node-a", dir.path())).unwrap();
        let err = Driver::new(&node_local_cfg("node-b", dir.path())).unwrap_err();
        assert!(err.contains("in use"), "{err}");
        drop(again);
        let err = Driver::new(&node_local_cfg("node-b", dir.path())).unwrap_err();
        assert!(
            err.contains("holds the state of node(s) [\"node-a\"]"),
            "{err}"
        );
        let s = super::super::state::load_state(dir.path()).unwrap();
        assert_eq!(s.node_local_owner.as_deref(), Some("node-a"));
        assert_eq!(s.nodes.iter().collect::<Vec<_>>(), ["node-a"]);
    }

    fn mount_cap() -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume::default(),
            )),
        }
    }

    fn create(d: &Driver, name: &str, requisite: &[&str]) -> Result<Volume, Status> {
        let topo = |n: &&str| Topology {
            segments: HashMap::from([(d.topology_key.clone(), n.to_string())]),
        };
        let req = CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: vec![mount_cap()],
            accessibility_requirements: Some(csiops_proto::csi::v1::TopologyRequirement {
                requisite: requisite.iter().map(topo).collect(),
                preferred: requisite.iter().map(topo).collect(),
            }),
            ..Default::default()
        };
        let id = d.create_volume(req)?.volume.unwrap().volume_id;
        d.known_volume(&id)
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
