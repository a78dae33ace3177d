//! `--node-local`: csi-test-driver as a node-local driver, the way upstream
//! csi-driver-host-path (`hostpathplugin`) is one.
//!
//! A node-local driver's controller and node services must be one process
//! with one state on the node that holds the volumes. Deployed as a central
//! controller plus a node DaemonSet, it fails: the node process never saw
//! the volume the controller process created (NodeStageVolume answers
//! NOT_FOUND, so kubelet reports `MountVolume.MountDevice failed … code =
//! NotFound desc = volume id … does not exist in the volumes list`), and a
//! controller pod without `/dev` cannot create the loop device of a block
//! volume (`losetup -f … failed`). This module holds the decisions that make
//! csi-test-driver fail the same way, so the operator's deployments are
//! checked against them without building hostpathplugin:
//!
//! - [`claim`]: one process owns a state dir (an `flock` held for the
//!   process's lifetime) and [`check_state`] refuses a state dir another
//!   node used. hostpathplugin would start and silently overwrite the other
//!   process's `state.json` (each keeps the file in memory from startup), so
//!   volumes get lost later; refusing at startup names the mistake instead.
//! - [`NodeLocalError`]: the answers for a volume this process does not know,
//!   a ControllerPublishVolume to another node, requirements excluding this
//!   node and a loop device that cannot be set up, with the codes
//!   hostpathplugin gives.
//! - [`check_requirements`], [`serves_segment`]: this node's topology only.
//! - [`attach_at_create`]: a block volume's loop device exists from
//!   CreateVolume to DeleteVolume, as hostpathplugin's `createVolume`.
//! - [`volume_usage`]: the answer of NodeGetVolumeStats.

use std::collections::{BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use csiops_proto::csi::v1::{volume_usage, TopologyRequirement, VolumeUsage};
use tonic::{Code, Status};

use super::mounts;
use super::state::State;

/// The lock file a node-local instance holds for as long as it runs.
pub const OWNER_LOCK: &str = "node-local.lock";

/// A refused node-local call. Each variant is what hostpathplugin answers in
/// the same situation (`pkg/hostpath` and `pkg/state` of
/// kubernetes-csi/csi-driver-host-path), so kubelet's and the sidecars'
/// events read the same.
#[derive(Debug, thiserror::Error)]
pub enum NodeLocalError {
    /// A call names a volume this process did not create (hostpathplugin:
    /// `state.GetVolumeByID`, NOT_FOUND, from every node call).
    #[error("volume id {0} does not exist in the volumes list")]
    UnknownVolume(String),
    /// ControllerPublish/UnpublishVolume for another node (hostpathplugin
    /// answers NOT_FOUND before it looks at the volume).
    #[error("node ID {requested} does not match the node ID {ours} of this node-local driver")]
    OtherNode { requested: String, ours: String },
    /// CreateVolume whose requisite topology does not include this node.
    /// hostpathplugin ignores the requirements and answers with its own
    /// node (`--ignore-accessibility-requirements` does that); the CSI spec
    /// asks for RESOURCE_EXHAUSTED, which also makes external-provisioner
    /// give the claim back to the scheduler.
    #[error(
        "requisite topology {requisite} does not include this node ({key}={node}): \
         a node-local driver creates volumes only on its own node"
    )]
    Excluded {
        requisite: String,
        key: String,
        node: String,
    },
    /// The loop device of a new block volume could not be set up. The
    /// message has the shape of hostpathplugin's (`createVolume`:
    /// `failed to attach device <path>: losetup -f --show <path> failed:
    /// …`); we do what `losetup -f --show` does with the loop ioctls.
    #[error(
        "failed to attach device {}: losetup -f --show {} failed: {source}",
        image.display(),
        image.display()
    )]
    LoopAttach {
        image: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl From<NodeLocalError> for Status {
    fn from(e: NodeLocalError) -> Status {
        let code = match &e {
            NodeLocalError::UnknownVolume(_) | NodeLocalError::OtherNode { .. } => Code::NotFound,
            NodeLocalError::Excluded { .. } => Code::ResourceExhausted,
            // hostpathplugin returns a plain Go error, which gRPC sends as
            // UNKNOWN (external-provisioner: a final ProvisioningFailed).
            NodeLocalError::LoopAttach { .. } => Code::Unknown,
        };
        Status::new(code, e.to_string())
    }
}

/// Why a node-local instance does not start on a state dir.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    #[error(
        "state dir {} is in use by another node-local csi-test-driver ({holder}): \
         --node-local needs a state dir of its own per process and node",
        dir.display()
    )]
    Held { dir: PathBuf, holder: String },
    #[error(
        "state dir {} holds the state of node(s) {others:?}, not of {node}: \
         --node-local needs a state dir of its own per node",
        dir.display()
    )]
    OtherNodes {
        dir: PathBuf,
        others: Vec<String>,
        node: String,
    },
    #[error(
        "state dir {} belongs to the node-local instance of node {owner}: \
         it cannot be shared with other instances",
        dir.display()
    )]
    OwnedByNodeLocal { dir: PathBuf, owner: String },
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A node-local instance's hold on its state dir: an exclusive `flock` on
/// [`OWNER_LOCK`], released by the kernel when the process ends however it
/// ends (so a restart after `kill -9` takes it again).
#[derive(Debug)]
pub struct Ownership {
    _lock: File,
}

/// Takes the state dir `dir` (which must exist) for the node-local instance
/// of `node_id`, or says who holds it. The lock file names the holder
/// (node, pid, host name: the pod's name in Kubernetes) for that message.
pub fn claim(dir: &Path, node_id: &str) -> Result<Ownership, OwnershipError> {
    let path = dir.join(OWNER_LOCK);
    let io_err = |context| {
        let path = path.clone();
        move |source| OwnershipError::Io {
            context,
            path,
            source,
        }
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err("opening"))?;
    // SAFETY: flock on a valid open fd has no memory-safety preconditions.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io_err("locking")(err));
        }
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = match holder.trim() {
            "" => "holder unknown".to_owned(),
            h => h.to_owned(),
        };
        return Err(OwnershipError::Held {
            dir: dir.to_path_buf(),
            holder,
        });
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let text = format!(
        "node={node_id} pid={} host={}\n",
        std::process::id(),
        host.trim()
    );
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(text.as_bytes()))
        .map_err(io_err("writing"))?;
    Ok(Ownership { _lock: file })
}

/// A node-local instance of `node_id` refuses a state that another node
/// used: its volumes live on that node, and claiming them here would make
/// them reachable from the wrong node.
pub fn check_state(state: &State, dir: &Path, node_id: &str) -> Result<(), OwnershipError> {
    let others: BTreeSet<&str> = state
        .nodes
        .iter()
        .map(String::as_str)
        .chain(state.node_local_owner.as_deref())
        .chain(state.volumes.values().map(|v| v.node_id.as_str()))
        .filter(|n| !n.is_empty() && *n != node_id)
        .collect();
    if others.is_empty() {
        Ok(())
    } else {
        Err(OwnershipError::OtherNodes {
            dir: dir.to_path_buf(),
            others: others.into_iter().map(str::to_owned).collect(),
            node: node_id.to_owned(),
        })
    }
}

/// A shared-mode instance refuses a state dir a node-local instance owns.
pub fn check_not_owned(state: &State, dir: &Path) -> Result<(), OwnershipError> {
    match &state.node_local_owner {
        None => Ok(()),
        Some(owner) => Err(OwnershipError::OwnedByNodeLocal {
            dir: dir.to_path_buf(),
            owner: owner.clone(),
        }),
    }
}

/// Whether a topology segment describes this node: it names at least one
/// pair and each is (`key`, `node`). A segment with keys this driver does
/// not report (a zone, another driver's key) cannot be satisfied here.
pub fn segment_is_this_node(segment: &HashMap<String, String>, key: &str, node: &str) -> bool {
    !segment.is_empty() && segment.iter().all(|(k, v)| k == key && v == node)
}

/// CreateVolume's accessibility requirements in node-local mode: the volume
/// will be accessible from this node only, so a requisite list (the
/// topologies it MUST be accessible from, one at least) without this node
/// is refused. `preferred` alone constrains nothing (CSI: without
/// requisite, the plugin may choose any topology).
pub fn check_requirements(
    req: Option<&TopologyRequirement>,
    key: &str,
    node: &str,
) -> Result<(), NodeLocalError> {
    let Some(req) = req.filter(|r| !r.requisite.is_empty()) else {
        return Ok(());
    };
    if req
        .requisite
        .iter()
        .any(|t| segment_is_this_node(&t.segments, key, node))
    {
        return Ok(());
    }
    let requisite: Vec<String> = req
        .requisite
        .iter()
        .map(|t| {
            let mut pairs: Vec<String> =
                t.segments.iter().map(|(k, v)| format!("{k}={v}")).collect();
            pairs.sort();
            format!("{{{}}}", pairs.join(","))
        })
        .collect();
    Err(NodeLocalError::Excluded {
        requisite: format!("[{}]", requisite.join(", ")),
        key: key.to_owned(),
        node: node.to_owned(),
    })
}

/// GetCapacity in node-local mode: this instance has capacity only for its
/// own node (or when no segment is asked), none for any other segment, so
/// CSIStorageCapacity objects a central deployment publishes for other
/// nodes say 0.
pub fn serves_segment(segment: Option<&HashMap<String, String>>, key: &str, node: &str) -> bool {
    match segment {
        None => true,
        Some(s) if s.is_empty() => true,
        Some(s) => segment_is_this_node(s, key, node),
    }
}

/// CreateVolume of a block volume: the loop device of `image` is set up now
/// (hostpathplugin's `createVolume` runs `losetup -f --show` there), so a
/// controller without `/dev/loop-control` or the privilege to use it fails
/// here. On failure `image` is removed, as hostpathplugin removes its file.
pub fn attach_at_create(image: &Path) -> Result<PathBuf, NodeLocalError> {
    mounts::attach_loop(image).map_err(|source| {
        if let Err(e) = std::fs::remove_file(image) {
            tracing::warn!(image = %image.display(), error = %e, "removing the backing file after a failed attach");
        }
        NodeLocalError::LoopAttach {
            image: image.to_path_buf(),
            source,
        }
    })
}

/// NodeGetVolumeStats of the volume published (or staged) at `path`:
/// bytes and inodes of the filesystem there, or for a block device the
/// volume's size. A missing path is NOT_FOUND (CSI).
pub fn volume_usage(path: &Path, capacity_bytes: i64) -> Result<Vec<VolumeUsage>, Status> {
    let meta = std::fs::metadata(path).map_err(|e| {
        Status::not_found(format!(
            "could not get file information from {}: {e}",
            path.display()
        ))
    })?;
    if meta.file_type().is_block_device() {
        return Ok(vec![VolumeUsage {
            total: capacity_bytes,
            unit: volume_usage::Unit::Bytes as i32,
            ..VolumeUsage::default()
        }]);
    }
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Status::invalid_argument("volume_path contains a NUL byte"))?;
    // SAFETY: all-zero is a valid `struct statvfs`.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        let e = io::Error::last_os_error();
        return Err(Status::internal(format!("statvfs {}: {e}", path.display())));
    }
    Ok(usage_of(&st))
}

/// The two usages (bytes, inodes) of a `statvfs` result (its counts are
/// `u64` on the 64-bit Linux targets this runs on).
fn usage_of(st: &libc::statvfs) -> Vec<VolumeUsage> {
    let n = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
    let frsize = st.f_frsize;
    let blocks = st.f_blocks;
    let bfree = st.f_bfree;
    let bavail = st.f_bavail;
    let files = st.f_files;
    let ffree = st.f_ffree;
    vec![
        VolumeUsage {
            available: n(bavail.saturating_mul(frsize)),
            total: n(blocks.saturating_mul(frsize)),
            used: n(blocks.saturating_sub(bfree).saturating_mul(frsize)),
            unit: volume_usage::Unit::Bytes as i32,
        },
        VolumeUsage {
            available: n(ffree),
            total: n(files),
            used: n(files.saturating_sub(ffree)),
            unit: volume_usage::Unit::Inodes as i32,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use csiops_proto::csi::v1::Topology;

    const KEY: &str = "topology.test.csi.csiops.dev/node";

    fn topo(pairs: &[(&str, &str)]) -> Topology {
        Topology {
            segments: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn requisite_must_name_this_node() {
        let req = |requisite: Vec<Topology>, preferred: Vec<Topology>| TopologyRequirement {
            requisite,
            preferred,
        };
        assert!(check_requirements(None, KEY, "a").is_ok());
        // Preferred alone constrains nothing.
        let r = req(vec![], vec![topo(&[(KEY, "b")])]);
        assert!(check_requirements(Some(&r), KEY, "a").is_ok());
        // One requisite entry for this node is enough.
        let r = req(
            vec![topo(&[(KEY, "b")]), topo(&[(KEY, "a")])],
            vec![topo(&[(KEY, "b")])],
        );
        assert!(check_requirements(Some(&r), KEY, "a").is_ok());

        let r = req(vec![topo(&[(KEY, "b")]), topo(&[(KEY, "c")])], vec![]);
        let err = check_requirements(Some(&r), KEY, "a").unwrap_err();
        assert!(matches!(err, NodeLocalError::Excluded { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("{{{KEY}=b}}, {{{KEY}=c}}")), "{msg}");
        assert!(msg.contains(&format!("({KEY}=a)")), "{msg}");
        assert_eq!(Status::from(err).code(), Code::ResourceExhausted);

        // Another key, or this node plus a key we do not report: excluded.
        for seg in [
            topo(&[("zone", "a")]),
            topo(&[(KEY, "a"), ("zone", "z1")]),
            topo(&[]),
        ] {
            let r = req(vec![seg.clone()], vec![]);
            assert!(check_requirements(Some(&r), KEY, "a").is_err(), "{seg:?}");
        }
    }

    #[test]
    fn capacity_only_for_this_node() {
        let seg = |pairs: &[(&str, &str)]| topo(pairs).segments;
        assert!(serves_segment(None, KEY, "a"));
        assert!(serves_segment(Some(&seg(&[])), KEY, "a"));
        assert!(serves_segment(Some(&seg(&[(KEY, "a")])), KEY, "a"));
        assert!(!serves_segment(Some(&seg(&[(KEY, "b")])), KEY, "a"));
        assert!(!serves_segment(Some(&seg(&[("zone", "z")])), KEY, "a"));
    }

    #[test]
    fn errors_carry_hostpaths_codes_and_wording() {
        let s = Status::from(NodeLocalError::UnknownVolume("v-1".into()));
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(
            s.message(),
            "volume id v-1 does not exist in the volumes list"
        );
        let s = Status::from(NodeLocalError::OtherNode {
            requested: "b".into(),
            ours: "a".into(),
        });
        assert_eq!(s.code(), Code::NotFound);
        assert!(s.message().contains("node ID b"), "{}", s.message());
        let s = Status::from(NodeLocalError::LoopAttach {
            image: "/d/v.img".into(),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        });
        assert_eq!(s.code(), Code::Unknown);
        assert!(
            s.message().starts_with(
                "failed to attach device /d/v.img: losetup -f --show /d/v.img failed: "
            ),
            "{}",
            s.message()
        );
    }

    #[test]
    fn a_state_dir_is_held_by_one_process_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let first = claim(dir.path(), "node-a").unwrap();
        // flock conflicts between open file descriptions, even in one process.
        let err = claim(dir.path(), "node-b").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, OwnershipError::Held { .. }), "{msg}");
        assert!(msg.contains("node=node-a"), "{msg}");
        assert!(
            msg.contains(&format!("pid={}", std::process::id())),
            "{msg}"
        );
        drop(first);
        let _again = claim(dir.path(), "node-b").unwrap();
    }

    #[test]
    fn a_state_of_other_nodes_is_refused() {
        let dir = Path::new("/s");
        let mut s = State::default();
        assert!(check_state(&s, dir, "a").is_ok());
        s.nodes.insert("a".into());
        s.node_local_owner = Some("a".into());
        assert!(check_state(&s, dir, "a").is_ok());
        assert!(check_not_owned(&s, dir).is_err());

        let mut other = s.clone();
        other.nodes.insert("ctrl-0".into());
        let err = check_state(&other, dir, "a").unwrap_err();
        assert!(err.to_string().contains("[\"ctrl-0\"]"), "{err}");

        // A volume another node created, even if that node is not listed.
        let mut other = s.clone();
        other.volumes.insert(
            "v".into(),
            super::super::state::Volume {
                id: "v".into(),
                node_id: "b".into(),
                ..Default::default()
            },
        );
        assert!(check_state(&other, dir, "a").is_err());
        assert!(check_state(&other, dir, "b").is_err(), "a owns the dir");
    }

    #[test]
    fn usage_in_bytes_and_inodes() {
        // SAFETY: all-zero is a valid `struct statvfs`.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        st.f_frsize = 4096;
        st.f_blocks = 100;
        st.f_bfree = 40;
        st.f_bavail = 30;
        st.f_files = 10;
        st.f_ffree = 4;
        let u = usage_of(&st);
        assert_eq!(
            (u[0].total, u[0].used, u[0].available),
            (409_600, 245_760, 122_880)
        );
        assert_eq!(u[0].unit, volume_usage::Unit::Bytes as i32);
        assert_eq!((u[1].total, u[1].used, u[1].available), (10, 6, 4));
        assert_eq!(u[1].unit, volume_usage::Unit::Inodes as i32);
    }

    #[test]
    fn usage_of_a_missing_path_is_not_found() {
        let err = volume_usage(Path::new("/nonexistent/csi-target"), 1).unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        let dir = tempfile::tempdir().unwrap();
        let u = volume_usage(dir.path(), 1).unwrap();
        assert!(u[0].total > 0);
    }
}
