//! A component that fails at start-up is reported with its own log, and the
//! half-started cluster leaves nothing behind.

use std::os::unix::fs::PermissionsExt;

use csiops_e2e::bins::CLUSTER_BINARIES;
use csiops_e2e::{Cluster, ClusterOptions, Error};

#[tokio::test(flavor = "multi_thread")]
async fn early_exit_is_reported_with_the_log_tail() {
    // Fake binaries that fail like a misconfigured etcd would.
    let bins = tempfile::tempdir().unwrap();
    for b in CLUSTER_BINARIES {
        let path = bins.path().join(b);
        std::fs::write(&path, "#!/bin/sh\necho \"$0: fake failure\" >&2\nexit 3\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // Only test in this binary: nothing else reads the environment meanwhile,
    // and bin_dir() has not cached a real dir yet.
    std::env::set_var("CSIOPS_BIN_DIR", bins.path());

    let err = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect_err("fake binaries must not start");
    match &err {
        Error::ProcessExited {
            name, status, tail, ..
        } => {
            assert_eq!(name, "etcd");
            assert!(status.contains('3'), "{status}");
            assert!(tail.contains("etcd: fake failure"), "{tail}");
        }
        other => panic!("unexpected error: {other}"),
    }
    assert!(err.to_string().contains("fake failure"), "{err}");

    let me = std::process::id().to_string();
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("csiops-e2e-"))
        .filter(|e| std::fs::read_to_string(e.path().join("owner.pid")).is_ok_and(|p| p == me))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
