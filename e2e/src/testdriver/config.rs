//! Flags of `csi-test-driver` and the fault-injection specs.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tonic::Code;

/// Default `--drivername`.
pub const DEFAULT_DRIVER_NAME: &str = "test.csi.csiops.dev";
/// Default `--topology-key`.
pub const DEFAULT_TOPOLOGY_KEY: &str = "topology.test.csi.csiops.dev/node";
/// Default `--capacity`: 100 GiB.
pub const DEFAULT_CAPACITY: i64 = 100 << 30;
/// Size of a volume created without `required_bytes` (capped by `limit_bytes`).
pub const DEFAULT_VOLUME_SIZE: i64 = 1 << 30;

/// Every RPC name that `--fail`/`--delay` accept.
pub const METHODS: &[&str] = &[
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerGetCapabilities",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetVolumeStats",
    "NodeExpandVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
];

/// Serving flags (`csi-test-driver --endpoint … --state-dir …`).
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Unix socket to serve on: a path or a `unix://` URL. A stale socket is
    /// removed; one that still answers is an error.
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: Option<String>,

    /// Name in GetPluginInfo.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    pub drivername: String,

    /// This instance's node ID (NodeGetInfo, topology of volumes created
    /// without requirements). Recorded in the state as a known node.
    #[arg(long, env = "KUBE_NODE_NAME")]
    pub nodeid: Option<String>,

    /// Directory of the persistent state (`state.json`). Instances may share
    /// it, unless one of them is `--node-local`.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,

    /// Keep the state in this process only: `state.json` is read once at
    /// start (a benchmark may lay out volumes there) and never written, so
    /// a call costs the same at tens of thousands of volumes. A restart
    /// forgets everything; not with `--node-local` or `--data-dir`.
    #[arg(long, conflicts_with_all = ["node_local", "data_dir"])]
    pub in_memory: bool,

    /// Real volumes: a directory `<data-dir>/<volume-id>` (or, for block,
    /// a sparse file `<volume-id>.img` behind a loop device) per volume;
    /// the node service stages and publishes with real bind mounts and
    /// advertises STAGE_UNSTAGE_VOLUME. Needs root (a privileged pod).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,

    /// Node-local mode, like upstream csi-driver-host-path: this process is
    /// the controller and the node service of one node. It owns its state
    /// dir (a second instance on it refuses to start), volumes are
    /// accessible from this node only and unknown anywhere else (NOT_FOUND),
    /// ControllerPublishVolume to another node is NOT_FOUND, and with
    /// `--data-dir` a block volume's loop device is set up by CreateVolume
    /// and released by DeleteVolume. See `testdriver::node_local`.
    #[arg(long)]
    pub node_local: bool,

    /// With `--node-local`: create volumes on this node whatever the
    /// requisite topology says, as hostpathplugin does (it never reads the
    /// accessibility requirements). Without it, requirements that exclude
    /// this node are refused with RESOURCE_EXHAUSTED, as the CSI spec asks.
    #[arg(long, requires = "node_local")]
    pub ignore_accessibility_requirements: bool,

    /// `max_volumes_per_node` in NodeGetInfo, enforced by
    /// ControllerPublishVolume (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_volumes_per_node: i64,

    /// A file holding `max_volumes_per_node` (a decimal count), read at
    /// every NodeGetInfo and ControllerPublishVolume: tests change the
    /// limit while the driver runs. Absent file: `--max-volumes-per-node`.
    #[arg(long)]
    pub max_volumes_per_node_file: Option<PathBuf>,

    /// Topology key of NodeGetInfo: `{<key>: <nodeid>}`.
    #[arg(long, default_value = DEFAULT_TOPOLOGY_KEY)]
    pub topology_key: String,

    /// The value of this instance's topology segment instead of its node
    /// ID: instances given the same value make one segment, a backend every
    /// node in it reaches (the e2e's nodes share one host, so a host
    /// `--data-dir` is such a backend). Volumes are then accessible from
    /// the whole segment, and GetCapacity counts one pool for it.
    #[arg(long, conflicts_with = "node_local")]
    pub topology_value: Option<String>,

    /// Advertise PUBLISH_UNPUBLISH_VOLUME and LIST_VOLUMES_PUBLISHED_NODES.
    #[arg(long)]
    pub enable_attach: bool,

    /// Advertise MODIFY_VOLUME and serve ControllerModifyVolume (what the
    /// external-resizer calls when a claim's VolumeAttributesClass
    /// changes): the given mutable parameters are merged into the volume's.
    #[arg(long)]
    pub enable_modify: bool,

    /// Total capacity in bytes (suffixes Ki, Mi, Gi, Ti, k, M, G, T).
    /// GetCapacity with a topology segment reports this much per segment,
    /// minus the volumes accessible from it (a pool per node).
    #[arg(long, default_value = "100Gi", value_parser = parse_quantity)]
    pub capacity: i64,

    /// `<Method>=<code>[:<count>]`: fail the first <count> calls (all if no
    /// count) with the gRPC code, before doing anything. Repeatable.
    #[arg(long = "fail", value_name = "METHOD=CODE[:COUNT]")]
    pub fail: Vec<FaultSpec>,

    /// Number every injected failure's message (`… (#7)`), like a driver
    /// that puts a request ID into each error.
    #[arg(long)]
    pub numbered_failures: bool,

    /// `<Method>=<code>[:<count>]`: do the work and persist it, then answer
    /// with the error anyway (a lost response). Repeatable.
    #[arg(long = "fail-after", value_name = "METHOD=CODE[:COUNT]")]
    pub fail_after: Vec<FaultSpec>,

    /// `<Method>=<duration>`: sleep before doing the work (e.g. `2s`,
    /// `500ms`). The work still happens if the caller gives up meanwhile.
    #[arg(long = "delay", value_name = "METHOD=DURATION")]
    pub delay: Vec<DelaySpec>,

    /// `<Method>=<duration>`: sleep after the work is persisted, before
    /// answering (kill the driver or the caller meanwhile: done, answer lost).
    #[arg(long = "delay-after", value_name = "METHOD=DURATION")]
    pub delay_after: Vec<DelaySpec>,
}

impl Config {
    /// A config with every default, for tests and library users.
    pub fn new(endpoint: &str, nodeid: &str, state_dir: &std::path::Path) -> Config {
        Config {
            endpoint: Some(endpoint.to_owned()),
            drivername: DEFAULT_DRIVER_NAME.to_owned(),
            nodeid: Some(nodeid.to_owned()),
            state_dir: Some(state_dir.to_path_buf()),
            in_memory: false,
            data_dir: None,
            node_local: false,
            ignore_accessibility_requirements: false,
            max_volumes_per_node: 0,
            max_volumes_per_node_file: None,
            topology_key: DEFAULT_TOPOLOGY_KEY.to_owned(),
            topology_value: None,
            enable_attach: false,
            enable_modify: false,
            capacity: DEFAULT_CAPACITY,
            fail: Vec::new(),
            numbered_failures: false,
            fail_after: Vec::new(),
            delay: Vec::new(),
            delay_after: Vec::new(),
        }
    }
}

/// `--fail` / `--fail-after`: `Method=Code[:count]`.
#[derive(Debug)]
pub struct FaultSpec {
    pub method: String,
    pub code: Code,
    /// Calls left to fail; `None`: every call.
    remaining: Option<AtomicU64>,
}

impl Clone for FaultSpec {
    fn clone(&self) -> Self {
        FaultSpec {
            method: self.method.clone(),
            code: self.code,
            remaining: self
                .remaining
                .as_ref()
                .map(|r| AtomicU64::new(r.load(Ordering::SeqCst))),
        }
    }
}

impl FaultSpec {
    pub fn new(method: &str, code: Code, count: Option<u64>) -> FaultSpec {
        FaultSpec {
            method: method.to_owned(),
            code,
            remaining: count.map(AtomicU64::new),
        }
    }

    /// Whether this call should fail; consumes one of the count.
    pub fn take(&self) -> bool {
        match &self.remaining {
            None => true,
            Some(r) => r
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok(),
        }
    }
}

impl FromStr for FaultSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (method, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected METHOD=CODE[:COUNT]"))?;
        let method = parse_method(method)?;
        let (code, count) = match rest.split_once(':') {
            Some((code, count)) => {
                let n = count
                    .trim()
                    .parse::<u64>()
                    .map_err(|e| format!("{s:?}: count {count:?}: {e}"))?;
                (code, Some(n))
            }
            None => (rest, None),
        };
        Ok(FaultSpec::new(method, parse_code(code)?, count))
    }
}

/// `--delay` / `--delay-after`: `Method=duration`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelaySpec {
    pub method: String,
    pub delay: Duration,
}

impl FromStr for DelaySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (method, d) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected METHOD=DURATION"))?;
        Ok(DelaySpec {
            method: parse_method(method)?.to_owned(),
            delay: parse_duration(d)?,
        })
    }
}

fn parse_method(m: &str) -> Result<&'static str, String> {
    let m = m.trim();
    METHODS
        .iter()
        .find(|k| k.eq_ignore_ascii_case(m))
        .copied()
        .ok_or_else(|| format!("unknown CSI method {m:?} (one of {})", METHODS.join(", ")))
}

/// A gRPC code by name (`Unavailable`, `UNAVAILABLE`, `deadline_exceeded`,
/// `DeadlineExceeded`) or number (`14`).
pub fn parse_code(s: &str) -> Result<Code, String> {
    let s = s.trim();
    if let Ok(n) = s.parse::<i32>() {
        let code = Code::from_i32(n);
        return if (0..=16).contains(&n) {
            Ok(code)
        } else {
            Err(format!("gRPC code {n} out of range 0..=16"))
        };
    }
    let norm: String = s
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .collect::<String>()
        .to_ascii_lowercase();
    (0..=16)
        .map(Code::from_i32)
        .find(|c| format!("{c:?}").to_ascii_lowercase() == norm)
        .ok_or_else(|| format!("unknown gRPC code {s:?}"))
}

/// `1.5s`, `500ms`, `2m`, `1h`, `250us`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("duration {s:?}: expected e.g. 2s or 500ms"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1e3,
        "us" | "µs" => n / 1e6,
        "ns" => n / 1e9,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("duration {s:?}: unknown unit {unit:?}")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("duration {s:?}: {e}"))
}

/// `100Gi`, `512Mi`, `1G`, `1073741824`.
pub fn parse_quantity(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: i64 = num
        .parse()
        .map_err(|_| format!("quantity {s:?}: expected e.g. 100Gi"))?;
    let mult: i64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(format!("quantity {s:?}: unknown suffix {suffix:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("quantity {s:?} overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_specs() {
        let f: FaultSpec = "CreateVolume=Unavailable:2".parse().unwrap();
        assert_eq!(f.method, "CreateVolume");
        assert_eq!(f.code, Code::Unavailable);
        assert!(f.take());
        assert!(f.take());
        assert!(!f.take());
        assert!(!f.take());

        let f: FaultSpec = "probe=FAILED_PRECONDITION".parse().unwrap();
        assert_eq!(f.method, "Probe");
        assert_eq!(f.code, Code::FailedPrecondition);
        assert!((0..100).all(|_| f.take()));

        let f: FaultSpec = "DeleteVolume=4:0".parse().unwrap();
        assert_eq!(f.code, Code::DeadlineExceeded);
        assert!(!f.take());

        for bad in [
            "CreateVolume",
            "Create=Unavailable",
            "CreateVolume=Nope",
            "CreateVolume=Unavailable:x",
            "CreateVolume=17",
        ] {
            assert!(bad.parse::<FaultSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn codes_by_any_spelling() {
        for s in [
            "DeadlineExceeded",
            "DEADLINE_EXCEEDED",
            "deadline-exceeded",
            "4",
        ] {
            assert_eq!(parse_code(s).unwrap(), Code::DeadlineExceeded, "{s}");
        }
        assert_eq!(parse_code("ok").unwrap(), Code::Ok);
        assert_eq!(parse_code("Aborted").unwrap(), Code::Aborted);
    }

    #[test]
    fn delays_and_durations() {
        let d: DelaySpec = "CreateVolume=1.5s".parse().unwrap();
        assert_eq!(d.delay, Duration::from_millis(1500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("2 days").is_err());
        assert!("Nope=1s".parse::<DelaySpec>().is_err());
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("100Gi").unwrap(), 100 << 30);
        assert_eq!(parse_quantity("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_quantity("4096").unwrap(), 4096);
        assert!(parse_quantity("1Pi").is_err());
        assert!(parse_quantity("99999999999Ti").is_err());
    }
}
