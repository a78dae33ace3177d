//! Our unix-socket gRPC servers against a real grpc-go client that dials the
//! way kubelet's plugin registration does: the socket path as the target, so
//! the path goes out as HTTP/2 `:authority` (issue 16). The client is
//! `regclient` (e2e/cluster-bins/kube/regclient, built by build.sh with the
//! grpc-go and kubelet API of the pinned Kubernetes), so nothing here depends
//! on our own Rust client.
//!
//! - csi-test-driver answers GetPluginInfo and Probe;
//! - the registrar answers GetInfo and takes NotifyRegistrationStatus;
//! - the registrar writes the CSINode entry only once kubelet accepted the
//!   registration: not while it has not said, not when it refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use csiops_e2e::node_side::registration_socket;
use csiops_e2e::process::ManagedProcess;
use csiops_e2e::testdriver::TestDriverProcess;
use csiops_e2e::{pid_alive, sidecar_bin, sigterm_and_wait, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;
use serde_json::Value;

const DRIVER: &str = "grpc-go.csi.csiops.dev";
const NODE: &str = "kwok-node-0";
const ENDPOINT: &str = "/var/lib/kubelet/plugins/grpc-go.csi.csiops.dev/csi.sock";
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// Several CSINode passes of the registrar (`--node-info-interval=500ms`).
const SEVERAL_PASSES: Duration = Duration::from_secs(2);

/// Runs `regclient`; its JSON on success, its stderr (the gRPC error) otherwise.
async fn regclient(bin: &Path, args: &[String]) -> Result<Value, String> {
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args).stdin(std::process::Stdio::null());
    // regclient bounds the dial and each call itself (-timeout, 10s).
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    if !out.status.success() {
        return Err(format!(
            "regclient {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "regclient printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn registrar(cluster: &Cluster, driver_socket: &Path, registry: &Path, n: usize) -> ManagedProcess {
    let args = vec![
        "registrar".to_string(),
        format!("--csi-address={}", driver_socket.display()),
        format!("--kubelet-registration-path={ENDPOINT}"),
        format!("--plugin-registration-path={}", registry.display()),
        format!("--node-name={NODE}"),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        "--node-info-interval=500ms".into(),
        "--v=5".into(),
    ];
    ManagedProcess::spawn(
        "registrar",
        &sidecar_bin().expect("csiops-sidecar built"),
        &args,
        &cluster.log_dir().join(format!("grpc-go-registrar-{n}.log")),
    )
    .expect("registrar starts")
}

/// Waits until the registrar says its CSINode maintenance runs: only then
/// can "no entry before kubelet's verdict" fail (before, nothing would
/// write one anyway).
async fn maintenance_on(reg: &ManagedProcess) {
    wait_for(DEADLINE, POLL, || async {
        std::fs::read_to_string(reg.log_path())
            .ok()?
            .contains("CSINode maintenance is on")
            .then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("CSINode maintenance never started:\n{}", reg.log_tail(20)));
}

async fn our_entry(csinodes: &Api<CSINode>) -> Option<String> {
    let c = csinodes.get_opt(NODE).await.expect("get CSINode")?;
    c.spec
        .drivers
        .into_iter()
        .find(|d| d.name == DRIVER)
        .map(|d| d.node_id)
}

async fn wait_socket(socket: &Path, p: &ManagedProcess) {
    wait_for(DEADLINE, POLL, || async { socket.exists().then_some(()) })
        .await
        .unwrap_or_else(|_| panic!("no registration socket:\n{}", p.log_tail(20)));
}

fn check_info(v: &Value) {
    assert_eq!(v["info"]["type"], "CSIPlugin", "{v}");
    assert_eq!(v["info"]["name"], DRIVER, "{v}");
    assert_eq!(v["info"]["endpoint"], ENDPOINT, "{v}");
    assert_eq!(
        v["info"]["supported_versions"],
        serde_json::json!(["1.0.0"]),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_grpc_go_client_registers_our_registrar_and_calls_our_driver() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster starts");
    // Part of the test bed: missing means build.sh is stale, which must fail.
    let client_bin: PathBuf = cluster.bin_dir().join("regclient");
    assert!(
        client_bin.is_file(),
        "{} is missing: run e2e/cluster-bins/build.sh",
        client_bin.display()
    );
    let csinodes: Api<CSINode> = Api::all(cluster.client().expect("client"));
    let dir = cluster.work_dir().join("grpc-go");
    let registry = dir.join("reg");
    std::fs::create_dir_all(&registry).expect("dirs");
    let driver_socket = dir.join("csi.sock");
    let driver = TestDriverProcess::start(
        Path::new(env!("CARGO_BIN_EXE_csi-test-driver")),
        &driver_socket,
        &dir.join("state"),
        &[
            &format!("--drivername={DRIVER}"),
            &format!("--nodeid={NODE}"),
        ],
        &cluster.log_dir().join("grpc-go-driver.log"),
    )
    .await
    .expect("csi-test-driver starts");

    // csi-test-driver, dialled by path as kubelet's CSI client used to.
    let socket_arg = |p: &Path| format!("-socket={}", p.display());
    let v = regclient(&client_bin, &["csi".into(), socket_arg(&driver_socket)])
        .await
        .unwrap_or_else(|e| panic!("csi-test-driver refused grpc-go: {e}"));
    assert_eq!(v["plugin_info"]["name"], DRIVER, "{v}");
    assert_eq!(v["probe"]["ready"]["value"], true, "{v}");

    // kubelet refuses: the registrar never writes, and exits non-zero.
    let socket = registration_socket(&registry, DRIVER);
    let mut refused = registrar(&cluster, &driver_socket, &registry, 0);
    wait_socket(&socket, &refused).await;
    maintenance_on(&refused).await;
    tokio::time::sleep(SEVERAL_PASSES).await;
    assert_eq!(
        our_entry(&csinodes).await,
        None,
        "entry before kubelet's verdict"
    );
    let v = regclient(
        &client_bin,
        &[
            "register".into(),
            socket_arg(&socket),
            "-refuse=incompatible version".into(),
        ],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nregistrar:\n{}", refused.log_tail(20)));
    check_info(&v);
    assert_eq!(v["notified"]["plugin_registered"], false, "{v}");
    let pid = refused.pid();
    wait_for(DEADLINE, POLL, || async { (!pid_alive(pid)).then_some(()) })
        .await
        .unwrap_or_else(|_| panic!("refused registrar still runs:\n{}", refused.log_tail(20)));
    let exit = refused.check_running().expect_err("exited").to_string();
    assert!(exit.contains("exit status: 1"), "{exit}");
    assert!(refused.log_tail(10).contains("incompatible version"));
    assert_eq!(
        our_entry(&csinodes).await,
        None,
        "entry after kubelet refused"
    );

    // kubelet accepts: GetInfo, Notify, and only then the CSINode entry.
    let reg = registrar(&cluster, &driver_socket, &registry, 1);
    wait_socket(&socket, &reg).await;
    maintenance_on(&reg).await;
    tokio::time::sleep(SEVERAL_PASSES).await;
    assert_eq!(
        our_entry(&csinodes).await,
        None,
        "entry before kubelet's verdict"
    );
    let v = regclient(&client_bin, &["register".into(), socket_arg(&socket)])
        .await
        .unwrap_or_else(|e| panic!("{e}\nregistrar:\n{}", reg.log_tail(20)));
    check_info(&v);
    assert_eq!(v["notified"]["plugin_registered"], true, "{v}");
    let node_id = wait_for(DEADLINE, POLL, || our_entry(&csinodes))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no CSINode entry after kubelet accepted:\n{}",
                reg.log_tail(30)
            )
        });
    assert_eq!(node_id, NODE);

    assert!(
        sigterm_and_wait(reg.pid(), DEADLINE).await,
        "registrar stops"
    );
    drop(driver);
    cluster.stop().await.expect("cluster stops");
}
