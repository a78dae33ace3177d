//! The driver's persistent state: one JSON file, `<state-dir>/state.json`.
//!
//! Every mutation is a transaction: take the process lock and an exclusive
//! `flock` on `<state-dir>/state.lock`, read the file, change it, write it
//! to a temp file, fsync, rename over `state.json` and fsync the directory,
//! and only then answer the gRPC call. So a `kill -9` at any point leaves
//! either the old or the new state, never a torn one, and an answered call
//! is always on disk. Several driver processes (a controller instance and
//! per-node instances) may share one state dir, except in `--node-local`
//! mode, where one process owns it (see [`super::node_local`]).
//!
//! Secrets are never stored: only the *keys* of the secrets a call carried.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Name of the state file inside the state dir.
pub const STATE_FILE: &str = "state.json";
/// Name of the lock file inside the state dir.
pub const LOCK_FILE: &str = "state.lock";
/// Format version written into [`State::version`].
pub const STATE_VERSION: u32 = 1;
/// How many [`DeletedVolume`] tombstones are kept (oldest dropped first).
pub const MAX_TOMBSTONES: usize = 10_000;

/// Everything the driver knows. Serialized as-is into `state.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Next creation sequence number (never reused, survives restarts).
    pub next_seq: u64,
    /// Live volumes by volume ID.
    pub volumes: BTreeMap<String, Volume>,
    /// Deleted volumes, oldest first (at most [`MAX_TOMBSTONES`]).
    pub deleted: Vec<DeletedVolume>,
    /// Live snapshots by snapshot ID.
    pub snapshots: BTreeMap<String, Snapshot>,
    /// Node IDs of every driver instance that served with this state dir.
    /// `ControllerPublishVolume` answers `NOT_FOUND` for any other node.
    pub nodes: BTreeSet<String>,
    /// The node ID of the `--node-local` instance that owns this state dir.
    /// Instances of other nodes, and shared-mode instances, refuse it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_local_owner: Option<String>,
}

/// A provisioned volume.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Volume {
    /// `volume_id` (a random UUID, stable across restarts).
    pub id: String,
    /// The CO's `name` from `CreateVolume` (for Kubernetes `pvc-<uid>`).
    pub name: String,
    /// Creation sequence number; `ListVolumes` returns volumes in this order.
    pub seq: u64,
    pub capacity_bytes: i64,
    /// `CreateVolume` parameters (also echoed as the volume context).
    pub parameters: BTreeMap<String, String>,
    /// `CreateVolume` mutable parameters, with every later
    /// `ControllerModifyVolume`'s merged in.
    pub mutable_parameters: BTreeMap<String, String>,
    /// How many `ControllerModifyVolume` calls changed the volume.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub modifications: u32,
    /// Keys of the secrets the last `ControllerModifyVolume` carried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modify_secret_keys: Vec<String>,
    /// Keys of the secrets `CreateVolume` carried (values are never kept).
    pub secret_keys: Vec<String>,
    pub volume_capabilities: Vec<Capability>,
    /// Each element is one topology segment map.
    pub accessible_topology: Vec<BTreeMap<String, String>>,
    /// `ControllerPublishVolume` by node ID.
    pub published_nodes: BTreeMap<String, ControllerPublication>,
    /// `NodePublishVolume` by target path.
    pub node_publications: BTreeMap<String, NodePublication>,
    /// `NodeStageVolume` (with `--data-dir`): the node ID by staging path.
    /// A staged volume is in use: DeleteVolume refuses it, as
    /// hostpathplugin does, so its data never goes from under a mount.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_stagings: BTreeMap<String, String>,
    /// `CreateVolume`'s `volume_content_source`, if it had one.
    pub content_source: Option<ContentSource>,
    /// `--nodeid` of the instance that created the volume (empty in states
    /// written before it was recorded).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node_id: String,
}

/// What a volume was created from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentSource {
    /// Restored from this snapshot ID.
    Snapshot(String),
    /// Cloned from this volume ID.
    Volume(String),
}

/// A snapshot `CreateSnapshot` took.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    /// `snapshot_id` (a random UUID).
    pub id: String,
    /// The CO's `name` from `CreateSnapshot`.
    pub name: String,
    pub source_volume_id: String,
    /// The source volume's capacity when the snapshot was taken.
    pub size_bytes: i64,
    /// Creation sequence number (shared with volumes); `ListSnapshots`
    /// pages by it.
    pub seq: u64,
    /// Seconds since the epoch.
    pub creation_seconds: i64,
    pub parameters: BTreeMap<String, String>,
}

impl Volume {
    /// The node IDs this volume is controller-published to, sorted.
    pub fn published_node_ids(&self) -> Vec<String> {
        self.published_nodes.keys().cloned().collect()
    }
}

/// One `VolumeCapability`, flattened.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Capability {
    /// `mount` or `block`.
    pub access_type: String,
    /// The CSI access mode name, e.g. `SINGLE_NODE_WRITER`.
    pub access_mode: String,
    pub fs_type: String,
    pub mount_flags: Vec<String>,
}

/// A `ControllerPublishVolume` that succeeded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ControllerPublication {
    pub readonly: bool,
    pub capability: Capability,
    /// Keys of the secrets the call carried.
    pub secret_keys: Vec<String>,
    pub publish_context: BTreeMap<String, String>,
}

/// A `NodePublishVolume` that succeeded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodePublication {
    /// `--nodeid` of the instance that served the call.
    pub node_id: String,
    pub readonly: bool,
    pub capability: Capability,
    /// Keys of the secrets the call carried.
    pub secret_keys: Vec<String>,
    pub publish_context: BTreeMap<String, String>,
    /// The driver created the target dir (it is inside the state dir).
    pub created_dir: bool,
}

/// A volume that `DeleteVolume` removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeletedVolume {
    pub id: String,
    pub name: String,
    pub seq: u64,
    /// Keys of the secrets `DeleteVolume` carried.
    pub secret_keys: Vec<String>,
}

impl State {
    /// Live volumes in creation order.
    pub fn volumes_by_seq(&self) -> Vec<&Volume> {
        let mut v: Vec<&Volume> = self.volumes.values().collect();
        v.sort_by_key(|v| v.seq);
        v
    }

    /// The live volume with CO name `name`.
    pub fn volume_by_name(&self, name: &str) -> Option<&Volume> {
        self.volumes.values().find(|v| v.name == name)
    }

    /// Sum of the capacity of all live volumes.
    pub fn used_bytes(&self) -> i64 {
        self.volumes.values().map(|v| v.capacity_bytes).sum()
    }

    /// Records a deletion, keeping at most [`MAX_TOMBSTONES`].
    pub fn push_tombstone(&mut self, t: DeletedVolume) {
        self.deleted.push(t);
        if self.deleted.len() > MAX_TOMBSTONES {
            let extra = self.deleted.len() - MAX_TOMBSTONES;
            self.deleted.drain(..extra);
        }
    }
}

/// Reads `<dir>/state.json`. A missing file (or dir) is the empty state; a
/// file that does not parse is `InvalidData`. Needs no lock: the file is
/// only ever replaced by `rename`.
pub fn load_state(dir: &Path) -> io::Result<State> {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(State {
            version: STATE_VERSION,
            ..State::default()
        }),
        Err(e) => Err(e),
    }
}

/// Writes `state` to `<dir>/state.json` atomically and durably: temp file,
/// fsync, rename, fsync of the directory.
pub fn write_state(dir: &Path, state: &State) -> io::Result<()> {
    let path = dir.join(STATE_FILE);
    let tmp = dir.join(format!(".{STATE_FILE}.tmp.{}", std::process::id()));
    let mut bytes = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
    bytes.push(b'\n');
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()
}

/// Transactions on the state dir, serialized within the process (mutex) and
/// across processes (`flock`); or, [`StateStore::in_memory`], on a state
/// held by this process alone.
#[derive(Debug)]
pub struct StateStore {
    dir: PathBuf,
    lock: Mutex<()>,
    /// `--in-memory`: the state itself, never written back.
    memory: Option<Mutex<State>>,
}

impl StateStore {
    /// Creates the dir if needed. Fails if it is not writable.
    pub fn open(dir: &Path) -> io::Result<StateStore> {
        std::fs::create_dir_all(dir)?;
        let store = StateStore {
            dir: dir.to_path_buf(),
            lock: Mutex::new(()),
            memory: None,
        };
        // Fail fast on an unreadable state file or an unusable lock.
        store.transaction(|_| Ok::<_, io::Error>(()))??;
        Ok(store)
    }

    /// A store that reads `<dir>/state.json` once (a benchmark may lay out
    /// thousands of volumes there beforehand) and from then on keeps the
    /// state in this process only: nothing is written, no lock is taken,
    /// and a transaction changes the state in place, with no copy of it.
    /// So a call costs the same at 50,000 volumes as at 5, where rewriting
    /// and fsyncing the whole file per call would cost seconds. A
    /// transaction that fails keeps what it changed before failing (the
    /// driver's calls check before they change). Not for tests of
    /// durability: a restart forgets everything since the start.
    pub fn in_memory(dir: &Path) -> io::Result<StateStore> {
        std::fs::create_dir_all(dir)?;
        let mut state = load_state(dir)?;
        state.version = STATE_VERSION;
        Ok(StateStore {
            dir: dir.to_path_buf(),
            lock: Mutex::new(()),
            memory: Some(Mutex::new(state)),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `f` on the current state and persists the result if `f`
    /// returned `Ok` and changed something. An `Err` from `f` discards its
    /// changes. The outer `Err` is an I/O error of the store itself.
    ///
    /// Blocking: call it from `spawn_blocking`.
    pub fn transaction<T, E>(
        &self,
        f: impl FnOnce(&mut State) -> Result<T, E>,
    ) -> io::Result<Result<T, E>> {
        if let Some(memory) = &self.memory {
            let mut state = memory.lock().unwrap_or_else(|e| e.into_inner());
            return Ok(f(&mut state));
        }
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let lock_path = self.dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)?;
        flock(&lock, libc::LOCK_EX)?;
        let before = load_state(&self.dir)?;
        let mut state = before.clone();
        state.version = STATE_VERSION;
        let result = f(&mut state);
        if result.is_ok() && state != before {
            write_state(&self.dir, &state)?;
        }
        // The flock is released when `lock` is closed.
        Ok(result)
    }
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a valid open fd has no memory-safety preconditions.
        let r = unsafe { libc::flock(file.as_raw_fd(), op) };
        if r == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(id: &str, name: &str, seq: u64) -> Volume {
        Volume {
            id: id.into(),
            name: name.into(),
            seq,
            capacity_bytes: 1 << 30,
            ..Volume::default()
        }
    }

    #[test]
    fn missing_state_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let s = load_state(&dir.path().join("nope")).unwrap();
        assert!(s.volumes.is_empty());
        assert_eq!(s.version, STATE_VERSION);
    }

    #[test]
    fn in_memory_reads_the_file_once_and_never_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut laid_out = State {
            version: STATE_VERSION,
            ..State::default()
        };
        laid_out.volumes.insert("a".into(), volume("a", "pvc-a", 0));
        write_state(dir.path(), &laid_out).unwrap();
        let before = std::fs::read(dir.path().join(STATE_FILE)).unwrap();

        let store = StateStore::in_memory(dir.path()).unwrap();
        // The laid-out volume is there, and a change is seen by the next
        // transaction.
        store
            .transaction(|s| {
                assert_eq!(s.volumes["a"].name, "pvc-a");
                s.volumes.insert("b".into(), volume("b", "pvc-b", 1));
                Ok::<_, ()>(())
            })
            .unwrap()
            .unwrap();
        let names = store
            .transaction(|s| Ok::<_, ()>(s.volumes.keys().cloned().collect::<Vec<_>>()))
            .unwrap()
            .unwrap();
        assert_eq!(names, ["a", "b"]);
        // The file is as it was, and no lock file or temp file was made.
        assert_eq!(std::fs::read(dir.path().join(STATE_FILE)).unwrap(), before);
        assert!(!dir.path().join(LOCK_FILE).exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn transaction_persists_only_on_ok_and_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(dir.path()).unwrap();
        // open() of an empty dir writes nothing.
        assert!(!dir.path().join(STATE_FILE).exists());

        store
            .transaction(|s| {
                s.volumes.insert("a".into(), volume("a", "pvc-a", 0));
                Ok::<_, ()>(())
            })
            .unwrap()
            .unwrap();
        let s = load_state(dir.path()).unwrap();
        assert_eq!(s.volumes["a"].name, "pvc-a");

        // An error discards the change.
        let r = store
            .transaction(|s| {
                s.volumes.clear();
                Err::<(), _>("no")
            })
            .unwrap();
        assert_eq!(r, Err("no"));
        assert_eq!(load_state(dir.path()).unwrap().volumes.len(), 1);

        // No temp files are left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| n == STATE_FILE || n == LOCK_FILE),
            "{names:?}"
        );
    }

    #[test]
    fn corrupt_state_is_an_error_not_an_empty_state() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STATE_FILE), b"{\"volumes\": ").unwrap();
        let err = load_state(dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(StateStore::open(dir.path()).is_err());
    }

    #[test]
    fn tombstones_are_capped_and_order_is_by_seq() {
        let mut s = State::default();
        for i in 0..(MAX_TOMBSTONES + 5) {
            s.push_tombstone(DeletedVolume {
                id: i.to_string(),
                ..DeletedVolume::default()
            });
        }
        assert_eq!(s.deleted.len(), MAX_TOMBSTONES);
        assert_eq!(s.deleted[0].id, "5");

        s.volumes.insert("z".into(), volume("z", "first", 1));
        s.volumes.insert("a".into(), volume("a", "second", 2));
        let names: Vec<&str> = s.volumes_by_seq().iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["first", "second"]);
        assert_eq!(s.volume_by_name("second").unwrap().id, "a");
        assert_eq!(s.used_bytes(), 2 << 30);
    }

    #[test]
    fn concurrent_transactions_from_threads_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(StateStore::open(dir.path()).unwrap());
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for i in 0..10 {
                        store
                            .transaction(|s| {
                                let id = format!("{t}-{i}");
                                let seq = s.next_seq;
                                s.next_seq += 1;
                                s.volumes.insert(id.clone(), volume(&id, &id, seq));
                                Ok::<_, ()>(())
                            })
                            .unwrap()
                            .unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let s = load_state(dir.path()).unwrap();
        assert_eq!(s.volumes.len(), 80);
        assert_eq!(s.next_seq, 80);
    }
}
