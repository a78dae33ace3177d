//! The outside judge of the CSI migration translations: csi-translation-lib
//! itself. `translate-golden` (e2e/cluster-bins/kube, our Go program around
//! the library at the version the bed's kube-controller-manager is built
//! with) is built and run on the cases of
//! `sidecars/src/common/migration/testdata/cases.json`; its output must be
//! the committed `golden.json`, which the sidecars' unit tests hold our
//! Rust translation to. No cluster: Go and the module cache (or proxy) only.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use csiops_e2e::testkit::workspace_root;
use serde_json::Value;

fn testdata() -> PathBuf {
    workspace_root().join("sidecars/src/common/migration/testdata")
}

fn run(cmd: &mut Command, what: &str) -> Vec<u8> {
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run it ({e}); Go must be on PATH"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn golden_file_is_csi_translation_libs_output() {
    let started = std::time::Instant::now();
    let module = workspace_root().join("e2e/cluster-bins/kube");
    let out_dir = tempfile::tempdir().expect("tempdir");
    let bin = out_dir.path().join("translate-golden");
    // The wrapper's go.sum is complete: read-only, the pinned toolchain.
    run(
        Command::new("go")
            .current_dir(&module)
            .env("GOFLAGS", "-mod=readonly")
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0")
            .args(["build", "-trimpath", "-o"])
            .arg(&bin)
            .arg("./translate-golden"),
        "go build ./translate-golden",
    );
    let cases = std::fs::File::open(testdata().join("cases.json")).expect("cases.json");
    let output = run(
        Command::new(&bin).stdin(Stdio::from(cases)),
        "translate-golden",
    );
    let fresh: Value = serde_json::from_slice(&output).expect("translate-golden prints JSON");
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(testdata().join("golden.json")).expect("golden.json"),
    )
    .expect("golden.json is JSON");
    let (Some(fresh), Some(committed)) = (fresh.as_array(), committed.as_array()) else {
        panic!("both are arrays of results");
    };
    assert_eq!(
        fresh.len(),
        committed.len(),
        "golden.json is out of date: regenerate it (testdata/README.md)"
    );
    let differing: Vec<&str> = fresh
        .iter()
        .zip(committed)
        .filter(|(f, c)| f != c)
        .map(|(f, _)| f["name"].as_str().unwrap_or("?"))
        .collect();
    assert!(
        differing.is_empty(),
        "csi-translation-lib now answers differently for: {differing:?} (regenerate golden.json and check the Rust translation)"
    );
    // The cases cover every plugin and every translation.
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(testdata().join("cases.json")).expect("cases.json"),
    )
    .expect("cases.json is JSON");
    let ops: std::collections::BTreeSet<&str> = cases
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["op"].as_str())
        .collect();
    assert_eq!(
        ops.into_iter().collect::<Vec<_>>(),
        [
            "csi-pv-to-in-tree",
            "in-tree-pv-to-csi",
            "inline-to-csi",
            "storage-class"
        ]
    );
    for plugin in [
        "aws-ebs",
        "gce-pd",
        "azure-disk",
        "azure-file",
        "cinder",
        "vsphere",
        "portworx",
    ] {
        let ops: std::collections::BTreeSet<&str> = cases
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"].as_str().is_some_and(|n| n.starts_with(plugin)))
            .filter_map(|c| c["op"].as_str())
            .collect();
        assert_eq!(
            ops.len(),
            4,
            "{plugin}: every translation has cases ({ops:?})"
        );
    }
    eprintln!(
        "{} cases translated by csi-translation-lib in {:?}",
        fresh.len(),
        started.elapsed()
    );
}
