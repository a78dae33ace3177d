//! No cluster process outlives the test, however the test ends.
//!
//! One test function with steps, so the two clusters never run at once.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use csiops_e2e::{pid_alive, wait_for, Cluster, ClusterOptions};
use futures::FutureExt;

const GONE: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread")]
async fn children_die_on_panic_and_on_sigkill_of_the_test() {
    fake_operator_is_started_with_flags_and_killed_on_drop().await;
    children_die_when_the_test_panics().await;
    children_die_when_the_test_process_is_sigkilled().await;
}

async fn all_gone(pids: &[(String, u32)]) {
    let pids = pids.to_vec();
    let res = wait_for(GONE, POLL, || {
        let pids = pids.clone();
        async move { pids.iter().all(|(_, p)| !pid_alive(*p)).then_some(()) }
    })
    .await;
    let alive: Vec<_> = pids.iter().filter(|(_, p)| pid_alive(*p)).collect();
    assert!(res.is_ok(), "still alive: {alive:?}");
}

/// `run_operator` passes the documented flags and kills the process on drop.
/// A shell script stands in for the operator so this test does not depend on
/// the operator's own state.
async fn fake_operator_is_started_with_flags_and_killed_on_drop() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("start");
    let script = cluster.work_dir().join("fake-operator.sh");
    std::fs::write(&script, "#!/bin/sh\necho \"args: $*\"\nexec sleep 1000\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let op = cluster.run_operator(&script).expect("run_operator");
    let log = op.log_path().to_path_buf();
    let args = wait_for(GONE, POLL, || async {
        let text = std::fs::read_to_string(&log).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("args: ").map(str::to_string))
    })
    .await
    .expect("fake operator logged its args");
    let kubeconfig = cluster.kubeconfig_path().display().to_string();
    assert_eq!(
        args,
        format!(
            "--kubeconfig={kubeconfig} --leader-election=false --http-endpoint={} --log-format=text --admission-check=false",
            op.http_endpoint()
        )
    );
    assert!(op.http_endpoint().ip().is_loopback());
    let pid = op.pid();
    assert!(pid_alive(pid));
    drop(op);
    assert!(!pid_alive(pid), "operator outlived its OperatorProcess");
    cluster.stop().await.unwrap();
}

async fn children_die_when_the_test_panics() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("start");
    let pids = cluster.pids();
    let dir = cluster.work_dir().to_path_buf();
    // Keep the deliberate panic (and RUST_BACKTRACE) out of the test output;
    // this binary runs no other test concurrently.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let panicked = std::panic::AssertUnwindSafe(async move {
        let _cluster = cluster;
        panic!("deliberate panic with a running cluster");
    })
    .catch_unwind()
    .await;
    std::panic::set_hook(hook);
    assert!(panicked.is_err());
    all_gone(&pids).await;
    assert!(!dir.exists(), "{} not removed by Drop", dir.display());
}

/// Runs `helper_start_cluster_and_block` in a child test process, SIGKILLs
/// it (no destructor runs), and expects PR_SET_PDEATHSIG to take the cluster
/// down with it.
async fn children_die_when_the_test_process_is_sigkilled() {
    let mut helper = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "helper_start_cluster_and_block",
                "--nocapture",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = helper.0.stdout.take().unwrap();
    let (pids, dir) = tokio::task::spawn_blocking(move || {
        let mut pids = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix("HELPER_PID ") {
                let (name, pid) = rest.split_once(' ').unwrap();
                pids.push((name.to_string(), pid.parse::<u32>().unwrap()));
            } else if let Some(dir) = line.strip_prefix("HELPER_DIR ") {
                return (pids, PathBuf::from(dir));
            }
        }
        panic!("helper exited before reporting its cluster");
    })
    .await
    .unwrap();
    assert_eq!(pids.len(), 5, "{pids:?}");
    assert!(pids.iter().all(|(_, p)| pid_alive(*p)));

    drop(helper); // SIGKILL, reaped
    all_gone(&pids).await;
    // The dead helper could not remove its dir; the next Cluster::start
    // sweeps it, but do not leave it behind here.
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Never leaves the helper behind, even when an assertion fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "helper process of children_die_on_panic_and_on_sigkill_of_the_test"]
async fn helper_start_cluster_and_block() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("start");
    for (name, pid) in cluster.pids() {
        println!("HELPER_PID {name} {pid}");
    }
    println!("HELPER_DIR {}", cluster.work_dir().display());
    // Wait to be SIGKILLed; the parent test bounds how long that takes.
    futures::future::pending::<()>().await;
}
