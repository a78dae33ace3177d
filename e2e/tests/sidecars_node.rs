//! The node sidecars on a real control plane with a real CSI driver process
//! (`csi-mock-driver`, Kubernetes' own e2e driver): the registrar registers
//! through kubelet's plugin-registration API, keeps the CSINode and Node as
//! kubelet would, keeps its entry while the driver hangs or crashes (its
//! socket left behind), removes it once the driver is gone (its socket
//! removed) or on SIGTERM, and the liveness probe follows the driver.

use std::collections::BTreeMap;
use std::time::Duration;

use csiops_e2e::node_side::{kubelet_register, registration_socket, start_mock_driver};
use csiops_e2e::process::ManagedProcess;
use csiops_e2e::{
    free_port, pid_alive, sidecar_bin, sigterm_and_wait, testkit, wait_for, Cluster, ClusterOptions,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};

const DRIVER: &str = "mock.csi.csiops.dev";
const NODE: &str = "kwok-node-0";
const TOPOLOGY_KEY: &str = "io.kubernetes.storage.mock/node";
const OTHER: &str = "other.csi.example.com";
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

async fn healthz(port: u16) -> Option<(u16, String)> {
    testkit::http_get_async(([127, 0, 0, 1], port).into(), "/healthz").await
}

fn entry<'a>(c: &'a CSINode, driver: &str) -> Option<&'a CSINodeDriver> {
    c.spec.drivers.iter().find(|d| d.name == driver)
}

fn node_ids(n: &Node) -> BTreeMap<String, String> {
    n.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("csi.volume.kubernetes.io/nodeid"))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

struct Paths {
    driver_socket: std::path::PathBuf,
    registry: std::path::PathBuf,
}

fn registrar(cluster: &Cluster, p: &Paths, port: u16, extra: &[&str], n: usize) -> ManagedProcess {
    let mut args = vec![
        "registrar".to_string(),
        format!("--csi-address=unix://{}", p.driver_socket.display()),
        "--kubelet-registration-path=/var/lib/kubelet/plugins/mock.csi.csiops.dev/csi.sock".into(),
        format!("--plugin-registration-path={}", p.registry.display()),
        format!("--node-name={NODE}"),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--http-endpoint=127.0.0.1:{port}"),
        "--node-info-interval=500ms".into(),
        // Upstream's default (ours is 10s): even 1s timeouts, one after the
        // other, must not unregister a driver that still has its socket.
        "--timeout=1s".into(),
        "--v=5".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let log = cluster.log_dir().join(format!("registrar-{n}.log"));
    ManagedProcess::spawn(
        "registrar",
        &sidecar_bin().expect("csiops-sidecar built"),
        &args,
        &log,
    )
    .expect("registrar starts")
}

/// How many NodeGetInfo calls of the registrar (metrics on `port`) ended
/// with `code` (upstream's label value, e.g. `DeadlineExceeded`).
async fn node_get_info_count(port: u16, code: &str) -> u64 {
    let needle = format!("method_name=\"/csi.v1.Node/NodeGetInfo\",grpc_status_code=\"{code}\"}}");
    testkit::http_get_async(([127, 0, 0, 1], port).into(), "/metrics")
        .await
        .and_then(|(_, text)| {
            text.lines()
                .find(|l| {
                    l.starts_with("csi_sidecar_operations_seconds_count{") && l.contains(&needle)
                })
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Waits until the registrar (metrics on `port`) has seen `more` NodeGetInfo
/// failures with `code` beyond `before`, checking at every poll that the
/// driver's CSINode entry and node-ID key are still there.
async fn failures_keep_the_entry(
    csinodes: &Api<CSINode>,
    nodes: &Api<Node>,
    port: u16,
    code: &str,
    more: u64,
    reg: &ManagedProcess,
) {
    let before = node_get_info_count(port, code).await;
    wait_for(DEADLINE, POLL, || async {
        let c = csinodes.get(NODE).await.ok()?;
        let n = nodes.get(NODE).await.ok()?;
        assert!(
            entry(&c, DRIVER).is_some() && node_ids(&n).contains_key(DRIVER),
            "the registrar removed a driver whose socket is still there ({code}):\n{}",
            reg.log_tail(30)
        );
        (node_get_info_count(port, code).await >= before + more).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "no {more} NodeGetInfo failures with {code}:\n{}",
            reg.log_tail(30)
        )
    });
}

fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits");
    // SAFETY: kill(2) with a pid this test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// SIGTERM, then the exit status as the process reports it.
async fn sigterm_exit(p: &mut ManagedProcess) -> String {
    assert!(
        sigterm_and_wait(p.pid(), DEADLINE).await,
        "process {} did not exit on SIGTERM:\n{}",
        p.pid(),
        p.log_tail(20)
    );
    p.check_running().expect_err("exited").to_string()
}

/// The exit status of a process that ends by itself.
async fn wait_exit(p: &mut ManagedProcess) -> String {
    let pid = p.pid();
    wait_for(DEADLINE, POLL, || async { (!pid_alive(pid)).then_some(()) })
        .await
        .unwrap_or_else(|_| panic!("process {pid} did not exit:\n{}", p.log_tail(20)));
    p.check_running().expect_err("exited").to_string()
}

/// What the phases work on: the cluster, its Node and CSINode APIs, the
/// node's paths, the other driver registered before ours, and our
/// registration socket.
struct Bed {
    cluster: Cluster,
    nodes: Api<Node>,
    csinodes: Api<CSINode>,
    p: Paths,
    other: CSINodeDriver,
    socket: std::path::PathBuf,
}

impl Bed {
    /// csi-mock-driver on the node's driver socket, logging to `driver-{n}.log`.
    fn start_driver(&self, n: usize) -> ManagedProcess {
        start_mock_driver(
            self.cluster.bin_dir(),
            &self.p.driver_socket,
            DRIVER,
            NODE,
            &self.cluster.log_dir().join(format!("driver-{n}.log")),
        )
        .expect("driver starts")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrar_and_liveness_probe_with_a_real_driver() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    let dir = cluster.work_dir().join("node0");
    std::fs::create_dir_all(dir.join("registry")).expect("dirs");
    let p = Paths {
        driver_socket: dir.join("csi.sock"),
        registry: dir.join("registry"),
    };
    let bed = Bed {
        nodes: Api::all(client.clone()),
        csinodes: Api::all(client.clone()),
        socket: registration_socket(&p.registry, DRIVER),
        p,
        other: CSINodeDriver {
            name: OTHER.into(),
            node_id: "other-id".into(),
            ..CSINodeDriver::default()
        },
        cluster,
    };

    another_driver_is_registered_already(&bed).await;
    let mut driver = bed.start_driver(0);
    let reg_port = free_port().expect("port");
    let mut reg = registrar(&bed.cluster, &bed.p, reg_port, &[], 0);
    the_registration_socket_is_private_and_answers_kubelet(&bed, &reg).await;
    csinode_and_node_carry_what_kubelet_writes(&bed, &reg).await;
    passes_keep_running_but_write_nothing(&bed, reg_port).await;
    a_removed_socket_is_re_created(&bed, &reg).await;
    let (mut live, live_port) = the_liveness_probe_answers_over_the_driver(&bed).await;
    a_hung_driver_keeps_its_entry(&bed, &driver, reg_port, &reg).await;
    let mut driver1 = a_crashed_driver_keeps_its_entry(&bed, &mut driver, reg_port, &reg).await;
    a_stopped_driver_loses_its_entry(&bed, &mut driver1, live_port, reg_port, &reg).await;
    let driver2 = a_driver_back_is_registered_again(&bed, live_port).await;
    sigterm_removes_our_socket_and_entry_only(&bed, &mut reg).await;
    keep_registration_on_exit_keeps_the_entry(&bed).await;
    a_refused_registration_ends_the_registrar_non_zero(&bed).await;

    live.terminate(Duration::from_secs(5));
    drop(driver2);
    let Bed { cluster, .. } = bed;
    cluster.stop().await.expect("cluster stops");
}

/// Another driver is registered on the node already, as kubelet left it.
async fn another_driver_is_registered_already(bed: &Bed) {
    let Bed {
        nodes,
        csinodes,
        other,
        ..
    } = bed;
    // Another driver is registered on the node already (as kubelet left it).
    let node = nodes.get(NODE).await.expect("node");
    csinodes
        .create(
            &PostParams::default(),
            &CSINode {
                metadata: ObjectMeta {
                    name: Some(NODE.into()),
                    ..ObjectMeta::default()
                },
                spec: CSINodeSpec {
                    drivers: vec![other.clone()],
                },
            },
        )
        .await
        .expect("CSINode created");
    let patch = serde_json::json!({"metadata": {"annotations": {"csi.volume.kubernetes.io/nodeid": format!("{{\"{OTHER}\":\"other-id\"}}")}}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotation");
    drop(node);
}

/// The registration socket is private, and kubelet's plugin watcher gets our
/// driver's info from it.
async fn the_registration_socket_is_private_and_answers_kubelet(bed: &Bed, reg: &ManagedProcess) {
    let Bed { socket, .. } = bed;
    // kubelet's plugin watcher: GetInfo, then NotifyRegistrationStatus.
    wait_for(DEADLINE, POLL, || async { socket.exists().then_some(()) })
        .await
        .unwrap_or_else(|_| panic!("no registration socket:\n{}", reg.log_tail(20)));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "registration socket must be private");
    let info = kubelet_register(socket, Ok(()))
        .await
        .expect("registration");
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(
        info.endpoint,
        "/var/lib/kubelet/plugins/mock.csi.csiops.dev/csi.sock"
    );
    assert_eq!(info.supported_versions, ["1.0.0"]);
}

/// CSINode and Node carry exactly what kubelet writes for this driver, and the
/// other driver's entry and key are kept.
async fn csinode_and_node_carry_what_kubelet_writes(bed: &Bed, reg: &ManagedProcess) {
    let Bed {
        nodes,
        csinodes,
        other,
        ..
    } = bed;
    // CSINode and Node carry exactly what kubelet writes for this driver.
    let ours = wait_for(DEADLINE, POLL, || async {
        let c = csinodes.get(NODE).await.ok()?;
        entry(&c, DRIVER).cloned()
    })
    .await
    .unwrap_or_else(|_| panic!("no CSINode entry:\n{}", reg.log_tail(30)));
    assert_eq!(ours.node_id, NODE);
    assert_eq!(ours.topology_keys, Some(vec![TOPOLOGY_KEY.to_string()]));
    assert_eq!(ours.allocatable.and_then(|a| a.count), Some(10));
    let node = nodes.get(NODE).await.expect("node");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(TOPOLOGY_KEY).map(String::as_str),
        Some("some-mock-node")
    );
    let ids = node_ids(&node);
    assert_eq!(ids.get(DRIVER).map(String::as_str), Some(NODE));
    assert_eq!(
        ids.get(OTHER).map(String::as_str),
        Some("other-id"),
        "other driver's key kept"
    );
    let c = csinodes.get(NODE).await.expect("csinode");
    assert_eq!(entry(&c, OTHER), Some(other), "other driver's entry kept");
}

/// Passes keep running every 500ms but write nothing when nothing changed.
async fn passes_keep_running_but_write_nothing(bed: &Bed, reg_port: u16) {
    let Bed { csinodes, .. } = bed;
    // Idempotent: passes keep running (every 500ms) but write nothing.
    let rv = csinodes
        .get(NODE)
        .await
        .expect("csinode")
        .metadata
        .resource_version;
    let passes = node_get_info_count(reg_port, "OK").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        csinodes
            .get(NODE)
            .await
            .expect("csinode")
            .metadata
            .resource_version,
        rv,
        "no write when nothing changed"
    );
    // …and they did run meanwhile (else "no write" would prove nothing).
    let ran = node_get_info_count(reg_port, "OK").await - passes;
    assert!(
        ran >= 2,
        "only {ran} passes in 2s at --node-info-interval=500ms"
    );
    assert_eq!(healthz(reg_port).await.map(|r| r.0), Some(200));
}

/// The registration socket is re-created when something removes it.
async fn a_removed_socket_is_re_created(bed: &Bed, reg: &ManagedProcess) {
    let Bed { socket, .. } = bed;
    // The socket is re-created when something removes it.
    std::fs::remove_file(socket).expect("remove socket");
    wait_for(DEADLINE, POLL, || async { socket.exists().then_some(()) })
        .await
        .unwrap_or_else(|_| panic!("socket not re-created:\n{}", reg.log_tail(20)));
    kubelet_register(socket, Ok(()))
        .await
        .expect("registration on the new socket");
}

/// The liveness probe over the same driver answers 200 and counts its Probe
/// calls; it keeps running (returned with its port).
async fn the_liveness_probe_answers_over_the_driver(bed: &Bed) -> (ManagedProcess, u16) {
    let Bed { cluster, p, .. } = bed;
    // Liveness probe over the same driver.
    let live_port = free_port().expect("port");
    let live_args = vec![
        "liveness-probe".to_string(),
        format!("--csi-address={}", p.driver_socket.display()),
        format!("--http-endpoint=127.0.0.1:{live_port}"),
        "--probe-timeout=1s".into(),
    ];
    let live = ManagedProcess::spawn(
        "liveness-probe",
        &sidecar_bin().expect("sidecar"),
        &live_args,
        &cluster.log_dir().join("liveness.log"),
    )
    .expect("liveness starts");
    let ok = wait_for(DEADLINE, POLL, || async {
        healthz(live_port).await.filter(|r| r.0 == 200)
    })
    .await
    .unwrap_or_else(|_| panic!("liveness never 200:\n{}", live.log_tail(20)));
    assert_eq!(ok.1, "ok");
    let metrics = testkit::http_get_async(([127, 0, 0, 1], live_port).into(), "/metrics")
        .await
        .expect("metrics");
    assert!(metrics.1.contains("csi_sidecar_operations_seconds_count{driver_name=\"mock.csi.csiops.dev\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"}"), "{}", metrics.1);
    (live, live_port)
}

/// A hung driver (SIGSTOP) keeps its entry and key while NodeGetInfo times out.
async fn a_hung_driver_keeps_its_entry(
    bed: &Bed,
    driver: &ManagedProcess,
    reg_port: u16,
    reg: &ManagedProcess,
) {
    let Bed {
        nodes, csinodes, ..
    } = bed;
    // The driver hangs (SIGSTOP): every NodeGetInfo times out, the socket is
    // still there — a slow driver, not a gone one. The entry and key stay.
    signal(driver.pid(), libc::SIGSTOP);
    failures_keep_the_entry(csinodes, nodes, reg_port, "DeadlineExceeded", 3, reg).await;
    signal(driver.pid(), libc::SIGCONT);
}

/// A crashed driver (kill -9, socket left) keeps its entry, and its restart
/// has nothing to write back; the restarted driver is returned.
async fn a_crashed_driver_keeps_its_entry(
    bed: &Bed,
    driver: &mut ManagedProcess,
    reg_port: u16,
    reg: &ManagedProcess,
) -> ManagedProcess {
    let Bed {
        nodes, csinodes, p, ..
    } = bed;
    // The driver crashes (kill -9): its socket is left behind, NodeGetInfo
    // is refused — a driver about to be restarted. The entry stays.
    driver.kill9();
    assert!(
        p.driver_socket.exists(),
        "a killed driver leaves its socket"
    );
    failures_keep_the_entry(csinodes, nodes, reg_port, "Unavailable", 3, reg).await;
    // The restarted driver answers; nothing was removed, nothing to write back.
    let rv = csinodes
        .get(NODE)
        .await
        .expect("csinode")
        .metadata
        .resource_version;
    let driver = bed.start_driver(1);
    let answered = node_get_info_count(reg_port, "OK").await;
    wait_for(DEADLINE, POLL, || async {
        (node_get_info_count(reg_port, "OK").await > answered).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("NodeGetInfo never answered again:\n{}", reg.log_tail(20)));
    assert_eq!(
        csinodes
            .get(NODE)
            .await
            .expect("csinode")
            .metadata
            .resource_version,
        rv,
        "the entry was kept, so there was nothing to write back"
    );
    driver
}

/// A stopped driver (socket removed) fails liveness and loses its entry and
/// key; the registrar stays healthy.
async fn a_stopped_driver_loses_its_entry(
    bed: &Bed,
    driver: &mut ManagedProcess,
    live_port: u16,
    reg_port: u16,
    reg: &ManagedProcess,
) {
    let Bed {
        nodes, csinodes, p, ..
    } = bed;
    // The driver stops (SIGTERM: it removes its socket): liveness 500, and
    // once the socket has stayed away for three intervals the driver is
    // gone: its entry and key are removed.
    driver.terminate(Duration::from_secs(5));
    assert!(
        !p.driver_socket.exists(),
        "a stopped driver removes its socket"
    );
    let failing = wait_for(DEADLINE, POLL, || async {
        healthz(live_port).await.filter(|r| r.0 == 500)
    })
    .await
    .expect("liveness turns 500 without the driver");
    assert!(failing.1.contains("probe failed"), "{}", failing.1);
    // The CSINode entry and the Node's id annotation are two writes (the
    // entry first, as kubelet's uninstall does), so wait for both.
    wait_for(DEADLINE, POLL, || async {
        let c = csinodes.get(NODE).await.ok()?;
        let node = nodes.get(NODE).await.ok()?;
        (entry(&c, DRIVER).is_none() && !node_ids(&node).contains_key(DRIVER)).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "entry or node id not removed after the driver's socket went:\n{}",
            reg.log_tail(30)
        )
    });
    let node = nodes.get(NODE).await.expect("node");
    assert!(
        node_ids(&node).contains_key(OTHER),
        "another driver's id is kept"
    );
    // The registrar's /healthz is upstream's (its registration socket
    // answers GetInfo), not the driver's: it stays 200, so kubelet does not
    // restart the registrar (and deregister the driver) for a driver outage.
    assert_eq!(healthz(reg_port).await.map(|r| r.0), Some(200));
}

/// The driver is back: liveness 200 and its entry back; the driver is returned.
async fn a_driver_back_is_registered_again(bed: &Bed, live_port: u16) -> ManagedProcess {
    let Bed { csinodes, .. } = bed;
    // The driver is back: liveness 200, entry back.
    let driver2 = bed.start_driver(2);
    wait_for(DEADLINE, POLL, || async {
        healthz(live_port).await.filter(|r| r.0 == 200)
    })
    .await
    .expect("liveness back to 200");
    wait_for(DEADLINE, POLL, || async {
        let c = csinodes.get(NODE).await.ok()?;
        entry(&c, DRIVER).map(|_| ())
    })
    .await
    .expect("entry back with the driver");
    driver2
}

/// SIGTERM removes our socket and entry; the other driver is untouched.
async fn sigterm_removes_our_socket_and_entry_only(bed: &Bed, reg: &mut ManagedProcess) {
    let Bed {
        csinodes,
        other,
        socket,
        ..
    } = bed;
    // SIGTERM: socket and entry removed, the other driver untouched.
    let exit = sigterm_exit(reg).await;
    assert!(exit.contains("exit status: 0"), "{exit}");
    assert!(!socket.exists(), "socket removed on exit");
    let c = csinodes.get(NODE).await.expect("csinode");
    assert!(entry(&c, DRIVER).is_none(), "entry removed on SIGTERM");
    assert_eq!(entry(&c, OTHER), Some(other));
}

/// --keep-registration-on-exit keeps the entry after SIGTERM (upgrades).
async fn keep_registration_on_exit_keeps_the_entry(bed: &Bed) {
    let Bed {
        cluster,
        csinodes,
        p,
        socket,
        ..
    } = bed;
    // --keep-registration-on-exit keeps it (upgrades). The entry is written
    // once kubelet has accepted the new registrar.
    let mut kept = registrar(
        cluster,
        p,
        free_port().expect("port"),
        &["--keep-registration-on-exit"],
        1,
    );
    wait_for(DEADLINE, POLL, || async {
        kubelet_register(socket, Ok(())).await.ok()
    })
    .await
    .unwrap_or_else(|_| panic!("registration:\n{}", kept.log_tail(20)));
    wait_for(DEADLINE, POLL, || async {
        let c = csinodes.get(NODE).await.ok()?;
        entry(&c, DRIVER).map(|_| ())
    })
    .await
    .unwrap_or_else(|_| panic!("no entry:\n{}", kept.log_tail(20)));
    sigterm_exit(&mut kept).await;
    let c = csinodes.get(NODE).await.expect("csinode");
    assert!(
        entry(&c, DRIVER).is_some(),
        "entry kept with --keep-registration-on-exit"
    );
}

/// kubelet refusing the registration ends the registrar non-zero, with
/// kubelet's error logged.
async fn a_refused_registration_ends_the_registrar_non_zero(bed: &Bed) {
    let Bed {
        cluster, p, socket, ..
    } = bed;
    // kubelet refusing the registration ends the registrar non-zero, with kubelet's error logged.
    let mut refused = registrar(cluster, p, free_port().expect("port"), &[], 2);
    wait_for(DEADLINE, POLL, || async { socket.exists().then_some(()) })
        .await
        .expect("socket");
    // The socket may still be the one of the previous process for an instant.
    wait_for(DEADLINE, POLL, || async {
        kubelet_register(socket, Err("incompatible version".into()))
            .await
            .ok()
    })
    .await
    .expect("refusal delivered");
    let exit = wait_exit(&mut refused).await;
    assert!(exit.contains("exit status: 1"), "{exit}");
    assert!(
        refused.log_tail(10).contains("incompatible version"),
        "{}",
        refused.log_tail(10)
    );
}
