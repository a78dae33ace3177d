//! A wrong flag ends the sidecar at once, non-zero, naming the flag — before
//! it dials the driver or the API server. The socket given does not exist,
//! so a sidecar that checked its flags only after connecting would sit in
//! "waiting for the CSI driver" and be killed by the deadline below.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SIDECAR: &str = env!("CARGO_BIN_EXE_csiops-sidecar");
/// Far longer than a flag check takes, far shorter than waiting for a driver.
const PROMPT: Duration = Duration::from_secs(10);

/// Runs the sidecar; returns its exit code and everything it printed, or
/// panics if it is still running after [`PROMPT`].
fn run(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("missing/csi.sock");
    let mut child = Command::new(SIDECAR)
        .args(args)
        .arg(format!("--csi-address={}", socket.display()))
        // Nothing to find even if a check came late: no in-cluster config.
        .arg(format!(
            "--kubeconfig={}",
            dir.path().join("none").display()
        ))
        .env_remove("KUBECONFIG")
        // What --enable-capacity reads: absent unless a case sets it.
        .env_remove("NAMESPACE")
        .env_remove("POD_NAME")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sidecar starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > PROMPT {
            let _ = child.kill();
            let _ = child.wait();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("{args:?}: still running after {PROMPT:?}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut out);
    }
    (status.code(), out)
}

fn assert_refused(args: &[&str], flag: &str) {
    let (code, out) = run(args);
    assert!(
        matches!(code, Some(c) if c != 0),
        "{args:?}: exit {code:?}\n{out}"
    );
    assert!(
        out.contains(flag),
        "{args:?}: output does not name {flag}\n{out}"
    );
}

#[test]
fn provisioner_names_a_bad_flag_before_connecting() {
    let cases: &[(&str, &[&str])] = &[
        ("--feature-gates", &["--feature-gates=NoSuchGate=true"]),
        (
            "--volume-name-uuid-length",
            &["--volume-name-uuid-length=0"],
        ),
        ("--worker-threads", &["--worker-threads=0"]),
        ("--kube-api-qps", &["--kube-api-qps=0"]),
        (
            "--leader-election-lease-duration",
            &["--leader-election", "--leader-election-lease-duration=2s"],
        ),
        (
            "--capacity-threads",
            &["--enable-capacity", "--capacity-threads=0"],
        ),
        // Publishing capacity without where to: named at once too.
        ("NAMESPACE environment variable", &["--enable-capacity"]),
    ];
    for (flag, extra) in cases {
        let mut args = vec!["provisioner"];
        args.extend_from_slice(extra);
        assert_refused(&args, flag);
    }
}

#[test]
fn attacher_names_a_bad_flag_before_connecting() {
    assert_refused(
        &[
            "attacher",
            "--leader-election",
            "--leader-election-renew-deadline=20s",
        ],
        "--leader-election-lease-duration",
    );
    assert_refused(&["attacher", "--kube-api-burst=0"], "--kube-api-burst");
}

#[test]
fn an_out_of_range_duration_is_an_error_not_a_panic() {
    let (code, out) = run(&["provisioner", "--timeout=20000000000000000000s"]);
    // clap's usage error: exit 2, naming the flag; a panic would be 101.
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--timeout"), "{out}");
    assert!(!out.contains("panicked"), "{out}");
}
