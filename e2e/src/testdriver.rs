//! `csi-test-driver`: a small hostpath-style CSI driver for the e2e tests
//! whose state survives restarts and can be inspected.
//!
//! Volumes, controller publications (attachments) and node publications are
//! kept in one JSON file, `<state-dir>/state.json`, written atomically
//! (temp file, fsync, rename, fsync of the dir) on every mutation *before*
//! the call is answered, so tests can `kill -9` the driver at any point and
//! compare [`load_state`] (or `csi-test-driver list --state-dir D`) with the
//! PersistentVolumes: no volume leaked, none duplicated. Without
//! `--data-dir` nothing is mounted: a target path inside the state dir is
//! created and removed, any other is only recorded. With `--data-dir` the
//! volumes are real and the node service stages and publishes them with
//! bind mounts ([`mounts`]), so kubelet can hand them to a pod.
//!
//! With `--node-local` ([`node_local`]) one process is the controller and
//! node service of one node and owns its state dir, like upstream
//! csi-driver-host-path: its volumes are this node's only (NOT_FOUND
//! elsewhere) and a block volume's loop device comes with CreateVolume, so
//! a deployment that splits it into a central controller and node pods
//! fails as hostpathplugin does.
//!
//! ```text
//! csi-test-driver --endpoint unix:///tmp/x/csi.sock --nodeid node-0 --state-dir /tmp/x/state \
//!   [--drivername test.csi.csiops.dev] [--enable-attach] [--max-volumes-per-node N] \
//!   [--topology-key K [--topology-value V]] [--capacity 100Gi] [--data-dir /var/lib/csi-test/volumes] \
//!   [--node-local [--ignore-accessibility-requirements]] \
//!   [--fail CreateVolume=Unavailable:2] [--fail-after CreateVolume=DeadlineExceeded:1] \
//!   [--delay CreateVolume=5s] [--delay-after CreateVolume=5s]
//! csi-test-driver list --state-dir /tmp/x/state     # the volumes, as a JSON array
//! csi-test-driver state --state-dir /tmp/x/state    # the whole state file
//! csi-test-driver app --dir /data --text hi          # a workload for e2e pods
//! csi-test-driver cat /data/hello.txt                # for `kubectl exec`
//! ```
//!
//! - [`state`]: the persisted types, [`load_state`], [`StateStore`].
//! - [`config`]: flags and fault specs.
//! - [`service`]: the [`Driver`] and the plumbing of every RPC.
//! - [`identity`], [`controller`], [`node`]: the three CSI services.
//! - [`volume_data`]: the volumes' and snapshots' data under `--data-dir`.
//! - [`mounts`]: the bind mounts and loop devices of `--data-dir`.
//! - [`copy`]: the data copies of `--data-dir` snapshots and clones.
//! - [`node_local`]: the decisions of `--node-local`.
//! - [`leftovers`]: a test guard that removes mounts and loop devices.
//! - [`serve`]: the unix socket, signals.
//! - [`harness`]: [`TestDriverProcess`], the driver as a child of a test.

pub mod config;
mod controller;
pub mod copy;
pub mod harness;
mod identity;
pub mod leftovers;
pub mod mounts;
mod node;
pub mod node_local;
pub mod serve;
pub mod service;
pub mod state;
mod volume_data;

pub use config::Config;
pub use harness::{test_driver_bin, TestDriverProcess};
pub use service::{Driver, DriverHandle};
pub use state::{
    load_state, Capability, ContentSource, ControllerPublication, DeletedVolume, NodePublication,
    Snapshot, State, StateStore, Volume, STATE_FILE,
};
