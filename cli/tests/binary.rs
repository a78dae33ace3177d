//! The `kubectl-csiops` binary itself: stdin input, files, and exit codes.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kubectl-csiops"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn run_with_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("writes stdin");
    child.wait_with_output().expect("runs")
}

#[test]
fn import_reads_helm_output_from_stdin() {
    let text = std::fs::read(fixture("helm.yaml")).expect("fixture");
    let out = run_with_stdin(&["import", "-f", "-"], &text);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cr = String::from_utf8_lossy(&out.stdout);
    assert!(cr.contains("kind: CSIDriverDeployment"), "{cr}");
    assert!(cr.contains("driverName: tiny.csi.example.com"), "{cr}");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        report.contains("Helm bookkeeping label, not needed"),
        "{report}"
    );
    assert!(report.contains("0 not representable"), "{report}");
}

#[test]
fn not_representable_exits_2_unless_partial_is_allowed() {
    // The driver's own RBAC is not representable.
    let f = fixture("bundled-sidecars.yaml");
    let f = f.to_str().expect("utf-8 path");
    let out = bin().args(["import", "-f", f]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    // The CR is printed anyway.
    assert!(String::from_utf8_lossy(&out.stdout).contains("kind: CSIDriverDeployment"));
    let out = bin()
        .args(["import", "-f", f, "--allow-partial"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn the_report_goes_to_a_file_as_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("report.json");
    let out = bin()
        .args(["import", "-f"])
        .arg(fixture("central"))
        .args(["--report-format", "json", "--report"])
        .arg(&report)
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stderr.is_empty());
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("report written")).expect("JSON");
    assert_eq!(
        json["summary"]["not representable"],
        serde_json::Value::Null
    );
    assert!(json["items"].as_array().is_some_and(|i| !i.is_empty()));
}

#[test]
fn render_prints_the_objects_and_diff_exits_by_differences() {
    let imported = bin()
        .args(["import", "-f"])
        .arg(fixture("host-network.yaml"))
        .arg("--allow-partial")
        .output()
        .expect("runs");
    assert_eq!(imported.status.code(), Some(0));
    // render from stdin
    let out = run_with_stdin(&["render", "-f", "-"], &imported.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8_lossy(&out.stdout);
    for kind in [
        "kind: DaemonSet",
        "kind: Deployment",
        "kind: CSIDriver",
        "kind: ServiceAccount",
        "kind: ClusterRoleBinding",
    ] {
        assert!(yaml.contains(kind), "{kind} missing");
    }
    // Deterministic for GitOps.
    let again = run_with_stdin(&["render", "-f", "-"], &imported.stdout);
    assert_eq!(out.stdout, again.stdout);

    // A fixture with something not representable (the driver's own RBAC)
    // differs from what its import renders.
    let partial = bin()
        .args(["import", "-f"])
        .arg(fixture("bundled-sidecars.yaml"))
        .arg("--allow-partial")
        .output()
        .expect("runs");
    assert_eq!(partial.status.code(), Some(0));
    let dir = tempfile::tempdir().expect("tempdir");
    let cr = dir.path().join("cr.yaml");
    std::fs::write(&cr, &partial.stdout).expect("write CR");
    let diff = bin()
        .args(["diff", "-f"])
        .arg(fixture("bundled-sidecars.yaml"))
        .arg("--cr")
        .arg(&cr)
        .output()
        .expect("runs");
    assert_eq!(
        diff.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    let clean = bin()
        .args(["diff", "-f"])
        .arg(fixture("central"))
        .output()
        .expect("runs");
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stdout)
    );
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let out = run_with_stdin(&["import", "-f", "-"], b"kind: [\n");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stdin (document 1): not valid YAML"), "{err}");
    let out = run_with_stdin(
        &["render", "-f", "-"],
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no CSIDriverDeployment"));
    let out = run_with_stdin(&["diff", "-f", "-"], b"---\n");
    assert_eq!(out.status.code(), Some(2), "diff's trouble is 2");
}

#[test]
fn import_adopt_names_the_running_workloads_and_keeps_the_classes() {
    let dir = fixture("central");
    let dir = dir.to_str().expect("utf-8 path");
    let out = bin()
        .args(["import", "-f", dir, "--adopt", "--allow-partial"])
        .output()
        .expect("runs");
    let report = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{report}");
    let cr: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).expect("CR YAML");
    assert_eq!(cr["metadata"]["namespace"], "kube-system");
    let adoption = &cr["spec"]["adoption"];
    assert_eq!(adoption["controller"]["kind"], "StatefulSet");
    assert_eq!(adoption["controller"]["name"], "files-csi-controller");
    assert_eq!(adoption["nodeDaemonSet"], "files-csi-node");
    let removed: Vec<(String, String)> = adoption["remove"]
        .as_sequence()
        .expect("remove list")
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for want in [
        ("ServiceAccount", "files-csi-controller-sa"),
        ("ServiceAccount", "files-csi-node-sa"),
        ("ClusterRoleBinding", "files-csi-provisioner-binding"),
    ] {
        assert!(
            removed.contains(&(want.0.to_string(), want.1.to_string())),
            "{want:?} not in {removed:?}"
        );
    }
    assert!(
        !removed.iter().any(|(k, _)| k == "ClusterRole"),
        "roles are never removed: {removed:?}"
    );
    assert!(
        cr["spec"].get("storageClasses").is_none(),
        "classes of a running driver stay as they are"
    );
    assert!(
        report.contains("files-external-provisioner-role") && report.contains("left for you"),
        "{report}"
    );
    // The CR must be valid for the operator: it parses as the API type.
    let typed: csiops_crds::CSIDriverDeployment =
        serde_yaml::from_slice(&out.stdout).expect("a CSIDriverDeployment");
    assert!(typed.spec.adoption.is_some());

    // A CR in another namespace cannot share the Leases: refused.
    let out = bin()
        .args(["import", "-f", dir, "--adopt", "-n", "storage"])
        .output()
        .expect("runs");
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("one namespace") && err.contains("kube-system"),
        "{err}"
    );
}
