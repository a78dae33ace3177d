//! The core of `csi-test-driver`'s CSI services: the [`Driver`] and the
//! plumbing every RPC goes through. The services themselves are in
//! [`super::identity`], [`super::controller`] and [`super::node`].
//!
//! Every RPC goes through [`Driver::call`]: a [`RECEIVED`] log line,
//! injected failure (`--fail`), delay (`--delay`), the work itself as one state transaction in a
//! detached blocking task (so it completes even if the caller hangs up),
//! `--fail-after`, `--delay-after`, and one log line with the redacted
//! request, the code and the response.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use csiops_proto::csi::v1::{volume_capability, Topology, VolumeCapability};
use csiops_proto::redact::redacted_debug;
use tonic::{Code, Request, Response, Status};

use super::config::{Config, DelaySpec, FaultSpec};
use super::node_local::{self, NodeLocalError, Ownership};
use super::state::{Capability, State, StateStore, Volume};

pub(super) type Reply<T> = Result<Response<T>, Status>;

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
    pub(super) data_dir: Option<PathBuf>,
    /// `--node-local` (see [`super::node_local`]): the hold on the state
    /// dir, kept for the process's lifetime.
    node_local: Option<Ownership>,
    /// `--ignore-accessibility-requirements`.
    pub(super) ignore_accessibility_requirements: bool,
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
        let store = if cfg.in_memory {
            StateStore::in_memory(state_dir)
        } else {
            StateStore::open(state_dir)
        }
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
    pub(super) fn unknown_volume(&self, id: &str) -> Status {
        if self.is_node_local() {
            NodeLocalError::UnknownVolume(id.to_owned()).into()
        } else {
            Status::not_found(format!("volume {id} not found"))
        }
    }

    /// The volume `id`, or [`Self::unknown_volume`].
    pub(super) fn known_volume(&self, id: &str) -> Result<Volume, Status> {
        self.tx(|s| {
            s.volumes
                .get(id)
                .cloned()
                .ok_or_else(|| self.unknown_volume(id))
        })
    }

    /// Node-local: ControllerPublish/UnpublishVolume only for this node.
    pub(super) fn require_this_node(&self, node_id: &str) -> Result<(), Status> {
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
    pub(super) async fn call<Req, Resp, F>(
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
    pub(super) fn tx<T>(
        &self,
        f: impl FnOnce(&mut State) -> Result<T, Status>,
    ) -> Result<T, Status> {
        self.store
            .transaction(f)
            .map_err(|e| Status::internal(format!("state store: {e}")))?
    }

    pub(super) fn this_node_topology(&self) -> Topology {
        Topology {
            segments: HashMap::from([(self.topology_key.clone(), self.topology_value.clone())]),
        }
    }

    pub(super) fn inside_state_dir(&self, target: &str) -> bool {
        let p = Path::new(target);
        p.is_absolute()
            && !p.components().any(|c| matches!(c, Component::ParentDir))
            && p.starts_with(&self.state_dir)
            && p != self.state_dir
    }

    /// The volume `id` in `s`, to change, or [`Self::unknown_volume`].
    pub(super) fn volume_mut<'s>(
        &self,
        s: &'s mut State,
        id: &str,
    ) -> Result<&'s mut Volume, Status> {
        s.volumes.get_mut(id).ok_or_else(|| self.unknown_volume(id))
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
        impl $service for $crate::testdriver::service::DriverHandle {
            $(
                async fn $rpc(
                    &self,
                    r: ::tonic::Request<$req>,
                ) -> $crate::testdriver::service::Reply<$resp> {
                    self.0.call($method, r, $handler).await
                }
            )*
        }
    };
}
pub(super) use csi_service;

/// A handler for an RPC csi-test-driver does not implement.
pub(super) fn none<Req, Resp>(
    method: &'static str,
) -> impl Fn(&Driver, Req) -> Result<Resp, Status> + Send + 'static {
    move |_, _| unimplemented(method)
}

/// UNIMPLEMENTED for `method`, in the words of every RPC csi-test-driver
/// lacks.
pub(super) fn unimplemented<T>(method: &str) -> Result<T, Status> {
    Err(Status::new(
        Code::Unimplemented,
        format!("{method} is not implemented by csi-test-driver"),
    ))
}

/// INVALID_ARGUMENT `<field> is required` when a required string field is
/// empty (proto3 cannot tell empty from unset).
pub(super) fn require(value: &str, field: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(())
}

/// The flattened form of a request's `VolumeCapability`; `INVALID_ARGUMENT`
/// without access type or access mode.
pub(super) fn capability(c: &VolumeCapability) -> Result<Capability, Status> {
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

/// The required single `volume_capability` of a publish or stage call.
pub(super) fn required_capability(c: Option<&VolumeCapability>) -> Result<Capability, Status> {
    c.ok_or_else(|| Status::invalid_argument("volume_capability is required"))
        .and_then(capability)
}

/// The required, non-empty `volume_capabilities` of CreateVolume and
/// ValidateVolumeCapabilities, each flattened.
pub(super) fn required_capabilities(caps: &[VolumeCapability]) -> Result<Vec<Capability>, Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities are required"));
    }
    caps.iter().map(capability).collect()
}

/// Sorted keys of a secrets map. The values never leave the request.
pub(super) fn secret_keys(secrets: &HashMap<String, String>) -> Vec<String> {
    let mut keys: Vec<String> = secrets.keys().cloned().collect();
    keys.sort();
    keys
}

/// Fixtures the unit tests of the services share.
#[cfg(test)]
pub(super) mod fixtures {
    use std::collections::HashMap;
    use std::path::Path;

    use csiops_proto::csi::v1::{
        volume_capability, volume_content_source, CreateVolumeRequest, Topology, VolumeCapability,
        VolumeContentSource,
    };
    use tonic::Status;

    use super::super::config::Config;
    use super::super::state::{load_state, Volume};
    use super::Driver;

    /// A SINGLE_NODE_WRITER capability of `access_type`.
    fn cap(access_type: volume_capability::AccessType) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(access_type),
        }
    }

    pub fn block_cap() -> VolumeCapability {
        cap(volume_capability::AccessType::Block(
            volume_capability::BlockVolume::default(),
        ))
    }

    pub fn mount_cap() -> VolumeCapability {
        cap(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        ))
    }

    pub fn node_local_cfg(node: &str, dir: &Path) -> Config {
        let mut cfg = Config::new("/unused.sock", node, dir);
        cfg.node_local = true;
        cfg
    }

    pub fn create_from(
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
        load_state(d.state_dir())
            .unwrap()
            .volumes
            .remove(&v.volume_id)
            .unwrap()
    }

    pub fn create(d: &Driver, name: &str, requisite: &[&str]) -> Result<Volume, Status> {
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
}

#[cfg(test)]
mod tests {
    use super::fixtures::node_local_cfg;
    use super::*;

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
}
