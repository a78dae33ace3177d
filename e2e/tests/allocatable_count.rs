//! KEP-4876 on the real node: kubelet keeps CSINode `allocatable.count`, and
//! our registrar never fights it.
//!
//! kube-apiserver and kubelet run with `MutableCSINodeAllocatableCount` on
//! (beta, off by default in 1.34). csi-test-driver is deployed through the
//! operator with `csiDriver.nodeAllocatableUpdatePeriodSeconds: 10` and
//! reads its `max_volumes_per_node` from a file on the host at every
//! NodeGetInfo; its registrar re-asks NodeGetInfo every 2 s, five times as
//! often as kubelet. The limit is changed live (5 → 9 → 3, and on until the
//! registrar has asked NodeGetInfo between a change and kubelet's write of
//! it at least once), and:
//!
//! - kubelet updates the count (within four periods), and the count sticks:
//!   no write of the CSINode at all while the registrar asks NodeGetInfo ten
//!   more times (its own metrics; about two kubelet periods), and never a
//!   step back to an older count (a watch sees every write);
//! - the registrar, which saw the new limit too, wrote nothing: the
//!   CSINode's only field manager is `kubelet`, and the registrar never logs
//!   a CSINode write.
//!
//! Needs root and `make node-prereqs`, like `real_node.rs`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csiops_e2e::cluster::ALLOCATABLE_COUNT_GATE;
use csiops_e2e::realnode::NODE_NAME;
use csiops_e2e::walkthrough::{self, App, Use, VolumeDriver, DATA_MOUNT, DRIVER, NAME, NS};
use csiops_e2e::{testkit, wait_for, Cluster, ClusterOptions};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::api::{Api, ListParams};
use kube::runtime::{watcher, WatchStreamExt};

const DEADLINE: Duration = Duration::from_secs(180);
/// `csiDriver.nodeAllocatableUpdatePeriodSeconds` (the API's minimum).
const PERIOD: Duration = Duration::from_secs(10);
/// The registrar's `--node-info-interval`.
const REGISTRAR_INTERVAL: &str = "2s";
/// The file, in the driver's data dir, holding its `max_volumes_per_node`.
const LIMIT_FILE: &str = "max-volumes";
/// The registrar's metrics port (`--http-endpoint=:9809`).
const REGISTRAR_PORT: u16 = 9809;

/// One write of the CSINode as the watch saw it.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    resource_version: String,
    count: Option<i32>,
    managers: Vec<String>,
}

fn seen(c: &CSINode) -> Seen {
    Seen {
        at: Instant::now(),
        resource_version: c.metadata.resource_version.clone().unwrap_or_default(),
        count: c
            .spec
            .drivers
            .iter()
            .find(|d| d.name == DRIVER)
            .and_then(|d| d.allocatable.as_ref())
            .and_then(|a| a.count),
        managers: c
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .map(|m| {
                format!(
                    "{}/{}",
                    m.manager.clone().unwrap_or_default(),
                    m.operation.clone().unwrap_or_default()
                )
            })
            .collect(),
    }
}

/// The count of NodeGetInfo calls the registrar made, from its metrics.
async fn registrar_node_get_info_calls(pod_ip: &str) -> Option<u64> {
    let addr: std::net::SocketAddr = format!("{pod_ip}:{REGISTRAR_PORT}").parse().ok()?;
    let (code, body) = testkit::http_get_async(addr, "/metrics").await?;
    if code != 200 {
        return None;
    }
    Some(
        body.lines()
            .filter(|l| {
                l.starts_with("csi_sidecar_operations_seconds_count{")
                    && l.contains("method_name=\"/csi.v1.Node/NodeGetInfo\"")
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>() as u64,
    )
}

/// The test bed of both tests: a real node, the operator, and
/// csi-test-driver deployed through it with `period` and the registrar
/// asking NodeGetInfo every [`REGISTRAR_INTERVAL`].
struct Bed {
    cluster: Cluster,
    client: kube::Client,
    driver_image: String,
    limit_file: std::path::PathBuf,
}

impl Bed {
    /// Sets the driver's `max_volumes_per_node`, read at every NodeGetInfo.
    fn set_limit(&self, n: i32) {
        std::fs::write(&self.limit_file, format!("{n}\n")).expect("limit file");
    }

    async fn start(period: Duration, controller_args: &[&str]) -> Bed {
        let cluster = Cluster::start(ClusterOptions {
            nodes: 0,
            real_node: true,
            feature_gates: vec![ALLOCATABLE_COUNT_GATE],
            ..ClusterOptions::default()
        })
        .await
        .unwrap_or_else(|e| panic!("cluster with a real node starts: {e}"));
        let client = cluster.client().expect("client");
        let (driver_image, kubelet_dir, data_dir) =
            walkthrough::real_node_bed(&cluster, "csi-data").expect("the real node's bed");
        let bed = Bed {
            limit_file: data_dir.join(LIMIT_FILE),
            cluster,
            client,
            driver_image,
        };
        bed.set_limit(5);

        walkthrough::install_operator(&bed.cluster)
            .await
            .unwrap_or_else(|e| panic!("operator ready: {e}\n{}", diagnostics(&bed.cluster)));

        let limit_arg = format!("--max-volumes-per-node-file={DATA_MOUNT}/{LIMIT_FILE}");
        let driver = VolumeDriver {
            image: &bed.driver_image,
            version: "v0.1.0",
            kubelet_dir: &kubelet_dir,
            data_dir: &data_dir,
            on_simulated_nodes: false,
            controller_args,
            node_args: &[&limit_arg],
            node_fields: &[],
        };
        let csi_driver = "  csiDriver:\n    attachRequired: true\n";
        let base = driver.yaml();
        assert!(base.contains(csi_driver), "{base}");
        let yaml = format!(
            "{}  sidecars:\n    registrar:\n      extraArgs: [\"--node-info-interval={REGISTRAR_INTERVAL}\"]\n",
            base.replace(
                csi_driver,
                &format!(
                    "{csi_driver}    nodeAllocatableUpdatePeriodSeconds: {}\n",
                    period.as_secs()
                )
            )
        );
        testkit::apply_ok(&bed.cluster, "driver", &yaml).await;
        testkit::wait_running(&bed.cluster, NS, NAME, "v0.1.0", 1, DEADLINE)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", diagnostics(&bed.cluster)));
        let csidriver = Api::<CSIDriver>::all(bed.client.clone())
            .get(DRIVER)
            .await
            .expect("CSIDriver");
        assert_eq!(
            csidriver.spec.node_allocatable_update_period_seconds,
            Some(period.as_secs() as i64),
            "the API server stored the period"
        );
        bed
    }

    /// Every write of the node's CSINode from now on, as a watch sees it.
    fn watch_csinode(&self) -> (Arc<Mutex<Vec<Seen>>>, tokio::task::JoinHandle<()>) {
        let csinodes: Api<CSINode> = Api::all(self.client.clone());
        let history: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let watch = {
            let history = history.clone();
            let config = watcher::Config::default().fields(&format!("metadata.name={NODE_NAME}"));
            let stream = watcher::watcher(csinodes, config).applied_objects();
            tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(item) = stream.next().await {
                    if let Ok(c) = item {
                        if let Ok(mut h) = history.lock() {
                            h.push(seen(&c));
                        }
                    }
                }
            })
        };
        (history, watch)
    }

    /// Waits until kubelet has registered the driver with `count`.
    async fn wait_count(&self, history: &Mutex<Vec<Seen>>, count: i32) {
        let latest = || history.lock().ok().and_then(|h| h.last().cloned());
        wait_for(DEADLINE, Duration::from_millis(200), || async {
            latest().filter(|s| s.count == Some(count)).map(drop)
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "kubelet registered the driver with count {count}: {:?}\n{}",
                latest(),
                diagnostics(&self.cluster)
            )
        });
    }

    /// Teardown through the operator; the cluster then stops clean.
    async fn stop(self) {
        self.cluster
            .kubectl_ok([
                "-n",
                NS,
                "delete",
                "csidriverdeployment",
                NAME,
                "--timeout=120s",
            ])
            .await
            .unwrap_or_else(|e| panic!("teardown: {e}\n{}", diagnostics(&self.cluster)));
        let left = self.cluster.stop_and_report().await.expect("cluster stops");
        assert!(left.is_empty(), "left on the host: {left:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_keeps_the_allocatable_count_and_the_registrar_never_writes_it() {
    let bed = Bed::start(PERIOD, &[]).await;
    let (cluster, client) = (&bed.cluster, bed.client.clone());
    let (history, watch) = bed.watch_csinode();
    bed.wait_count(&history, 5).await;
    let pod_ip = the_node_pod_ip(&client).await;

    // --- The driver's limit changes while it runs: up, then down, and on ----
    // until the registrar has asked NodeGetInfo at least once between a change
    // and kubelet's write of it (the driver then says another count than the
    // CSINode: the moment a second writer would write). kubelet's ticks are
    // not ours to time, so that window is 0–10 s long.
    let limits = [5, 9, 3, 7, 4, 8, 2];
    let mut raced = 0;
    for (step, pair) in limits.windows(2).enumerate() {
        let (from, to) = (pair[0], pair[1]);
        if step >= 2 && raced > 0 {
            break;
        }
        raced += a_limit_change_is_written_by_kubelet_only(&bed, &history, &pod_ip, from, to).await;
    }
    watch.abort();
    assert!(
        raced > 0,
        "in {} changes the registrar never asked NodeGetInfo before kubelet wrote the new count",
        limits.len() - 1
    );

    the_registrar_maintains_csinode_and_never_wrote_it(cluster);

    bed.stop().await;
}

/// The IP of the driver's node pod (where the registrar serves its metrics).
async fn the_node_pod_ip(client: &kube::Client) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let node_pod = pods
        .list(&ListParams::default().labels(&testkit::node_pod_selector(NAME)))
        .await
        .expect("node pods")
        .items
        .into_iter()
        .next()
        .expect("a node pod");
    node_pod
        .status
        .and_then(|s| s.pod_ip)
        .expect("the node pod's IP")
}

/// The driver's limit goes `from` → `to`: kubelet writes the new count within
/// four periods, and it sticks while the registrar asks NodeGetInfo ten more
/// times; only kubelet ever wrote the CSINode. How often the registrar asked
/// NodeGetInfo between the change and kubelet's write.
async fn a_limit_change_is_written_by_kubelet_only(
    bed: &Bed,
    history: &Mutex<Vec<Seen>>,
    pod_ip: &str,
    from: i32,
    to: i32,
) -> u64 {
    let cluster = &bed.cluster;
    let latest = || history.lock().ok().and_then(|h| h.last().cloned());
    let calls_before = registrar_node_get_info_calls(pod_ip)
        .await
        .expect("the registrar's metrics");
    let writes_before = history.lock().map(|h| h.len()).unwrap_or_default();
    let t0 = Instant::now();
    bed.set_limit(to);
    // The registrar's calls seen while the CSINode still had the old count.
    let window_calls = Mutex::new(calls_before);
    let updated = wait_for(PERIOD * 4, Duration::from_millis(100), || async {
        if let Some(s) = latest().filter(|s| s.count == Some(to)) {
            return Some(s);
        }
        if let Some(calls) = registrar_node_get_info_calls(pod_ip).await {
            if let Ok(mut w) = window_calls.lock() {
                *w = calls;
            }
        }
        None
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "kubelet did not update allocatable.count {from} -> {to} within {:?}: {:#?}\n{}",
            PERIOD * 4,
            history.lock().map(|h| h.clone()).unwrap_or_default(),
            diagnostics(cluster)
        )
    });
    let took = updated.at.duration_since(t0);
    let calls_at_update = registrar_node_get_info_calls(pod_ip)
        .await
        .expect("the registrar's metrics");
    let in_window = window_calls.lock().map(|w| *w).unwrap_or(calls_before) - calls_before;
    eprintln!(
        "allocatable.count {from} -> {to}: written by kubelet {took:?} after the driver changed; the registrar had asked NodeGetInfo {in_window} times meanwhile"
    );

    // It sticks: while the registrar asks NodeGetInfo ten more times
    // (about 20 s, two kubelet periods), nobody writes the CSINode.
    let asked = wait_for(PERIOD * 9, Duration::from_millis(500), || async {
        let calls = registrar_node_get_info_calls(pod_ip).await?;
        (calls >= calls_at_update + 10).then_some(calls)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the registrar did not ask NodeGetInfo ten times (--node-info-interval={REGISTRAR_INTERVAL})\n{}",
            diagnostics(cluster)
        )
    });
    let h = history.lock().map(|h| h.clone()).unwrap_or_default();
    let after = &h[writes_before..];
    let counts: Vec<Option<i32>> = after.iter().map(|s| s.count).collect();
    assert_eq!(
        counts.last(),
        Some(&Some(to)),
        "the count stayed {to}: {after:#?}"
    );
    // Every write of this step: the old count, then the new one, never back.
    let first_new = counts
        .iter()
        .position(|c| *c == Some(to))
        .expect("the new count was seen");
    assert!(
        counts[..first_new].iter().all(|c| *c == Some(from))
            && counts[first_new..].iter().all(|c| *c == Some(to)),
        "a count went back: {after:#?}"
    );
    let last = after.last().expect("a write");
    assert_eq!(
        last.resource_version, updated.resource_version,
        "no write of the CSINode after kubelet's: {after:#?}"
    );
    let managers: std::collections::BTreeSet<&str> =
        last.managers.iter().map(String::as_str).collect();
    assert_eq!(
        managers,
        ["kubelet/Update"].into(),
        "only kubelet ever wrote the CSINode"
    );

    eprintln!(
        "registrar: {} NodeGetInfo calls in {:?}, no CSINode write",
        asked - calls_before,
        t0.elapsed()
    );
    in_window
}

/// The registrar's CSINode maintenance is on, and it never logged a write
/// of the CSINode.
fn the_registrar_maintains_csinode_and_never_wrote_it(cluster: &Cluster) {
    let log = testkit::kubectl_text(
        cluster,
        &[
            "-n",
            NS,
            "logs",
            &format!("daemonset/{NAME}-node"),
            "-c",
            "node-driver-registrar",
        ],
    );
    assert!(
        log.contains("CSINode maintenance is on"),
        "registrar log:\n{log}"
    );
    assert!(
        !log.contains("driver registered in CSINode"),
        "the registrar wrote the CSINode:\n{log}"
    );
}

fn diagnostics(cluster: &Cluster) -> String {
    format!(
        "--- status\n{}\n--- pods\n{}\n--- csinode\n{}\n--- registrar\n{}\n--- operator\n{}\n--- node\n{}",
        testkit::kubectl_text(
            cluster,
            &["-n", NS, "get", "csidriverdeployment", NAME, "-o", "jsonpath={.status}"]
        ),
        testkit::kubectl_text(cluster, &["get", "pods", "-A", "-o", "wide"]),
        testkit::kubectl_text(cluster, &["get", "csinode", NODE_NAME, "-o", "yaml"]),
        testkit::kubectl_text(
            cluster,
            &["-n", NS, "logs", &format!("daemonset/{NAME}-node"), "-c", "node-driver-registrar", "--tail=40"]
        ),
        testkit::operator_log(cluster),
        cluster
            .real_node()
            .map(|n| n.log_tails(30))
            .unwrap_or_default(),
    )
}

/// `nodeAllocatableUpdatePeriodSeconds` of the reactive test: far longer
/// than the test, so kubelet's periodic refresh never comes into it.
const LONG_PERIOD: Duration = Duration::from_secs(3600);
/// kubelet gives a pod's volumes this long to attach and mount before it
/// looks for a ResourceExhausted attach (`podAttachAndMountTimeout`, 2m3s),
/// plus slack for the pod's start.
const ATTACH_AND_MOUNT_WAIT: Duration = Duration::from_secs(300);

/// KEP-4876's reactive path, which needs our attacher's
/// `VolumeError.errorCode`: the driver refuses every ControllerPublish
/// with ResourceExhausted (a node out of attach slots), the attacher
/// records code 8 on the VolumeAttachment, and kubelet, once the pod's
/// volume did not attach, reads that code, asks the driver's NodeGetInfo
/// at once (not at its next period, an hour away) and writes the new count
/// into the CSINode; it rejects the pod with `VolumeAttachmentLimitExceeded`
/// so that its controller can place it elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_refused_as_resource_exhausted_makes_kubelet_refresh_the_count() {
    let bed = Bed::start(
        LONG_PERIOD,
        &["--fail=ControllerPublishVolume=ResourceExhausted"],
    )
    .await;
    let (history, watch) = bed.watch_csinode();
    let latest = || history.lock().ok().and_then(|h| h.last().cloned());
    bed.wait_count(&history, 5).await;

    // The node lost slots the CSINode does not know of yet.
    bed.set_limit(2);
    let t0 = Instant::now();
    let app = App {
        name: "exhausted",
        image: &bed.driver_image,
        text: "never-written",
        access_mode: "ReadWriteOnce",
        usage: Use::Filesystem,
        fs_group: None,
    };
    testkit::apply_ok(&bed.cluster, "app", &app.yaml()).await;

    // The attacher records the driver's code.
    let vas: Api<VolumeAttachment> = Api::all(bed.client.clone());
    let code = wait_for(DEADLINE, Duration::from_millis(500), || async {
        let list = vas.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .filter(|va| va.spec.attacher == DRIVER)
            .find_map(|va| va.status?.attach_error?.error_code)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "no attachError.errorCode on the VolumeAttachment\n{}",
            diagnostics(&bed.cluster)
        )
    });
    assert_eq!(code, 8, "ResourceExhausted is gRPC code 8");
    assert_eq!(
        latest().and_then(|s| s.count),
        Some(5),
        "nobody refreshed the count before kubelet's attach wait ran out"
    );

    // kubelet gives up on the attach, sees code 8, refreshes and rejects.
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), NS);
    let rejected = wait_for(ATTACH_AND_MOUNT_WAIT, Duration::from_secs(1), || async {
        let status = pods.get_opt(app.name).await.ok()??.status?;
        (status.phase.as_deref() == Some("Failed")).then_some(status)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "kubelet did not reject the pod within {ATTACH_AND_MOUNT_WAIT:?}\n{}",
            diagnostics(&bed.cluster)
        )
    });
    assert_eq!(
        rejected.reason.as_deref(),
        Some("VolumeAttachmentLimitExceeded"),
        "{rejected:?}"
    );
    wait_for(Duration::from_secs(30), Duration::from_millis(200), || async {
        latest().filter(|s| s.count == Some(2)).map(drop)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "kubelet did not refresh allocatable.count to 2 on the ResourceExhausted attach: {:#?}\n{}",
            history.lock().map(|h| h.clone()).unwrap_or_default(),
            diagnostics(&bed.cluster)
        )
    });
    eprintln!(
        "ResourceExhausted attach: pod rejected and allocatable.count 5 -> 2 written {:?} after the driver's limit changed (period {LONG_PERIOD:?})",
        t0.elapsed()
    );
    let last = latest().expect("a write");
    let managers: std::collections::BTreeSet<&str> =
        last.managers.iter().map(String::as_str).collect();
    assert_eq!(
        managers,
        ["kubelet/Update"].into(),
        "only kubelet wrote the CSINode"
    );
    watch.abort();

    // The pod and claim go; the volume is detached and deleted before the
    // driver is torn down.
    for kind in ["pod", "pvc"] {
        bed.cluster
            .kubectl_ok(["-n", NS, "delete", kind, app.name, "--timeout=120s"])
            .await
            .unwrap_or_else(|e| panic!("delete {kind}: {e}\n{}", diagnostics(&bed.cluster)));
    }
    testkit::wait_no_volumes(&bed.cluster, DEADLINE)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the volume was not deleted: {e}\n{}",
                diagnostics(&bed.cluster)
            )
        });
    bed.stop().await;
}
