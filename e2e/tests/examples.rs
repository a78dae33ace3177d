//! Every example in `manifests/examples/` (issue 38 §3), checked as a user
//! would apply it:
//!
//! - each document parses, and the CSIDriverDeployment deserialises as the
//!   CRD's type and renders with the operator's own `render::render`;
//! - every argument of our bundled sidecars in the rendered pods (the
//!   operator's own flags and each `spec.sidecars.*.extraArgs`) is accepted
//!   by csiops-sidecar's parser and its `check()`, and none is a flag the
//!   parser accepts only to ignore it;
//! - on a real API server with the CRD and `install.yaml`'s RBAC and
//!   admission policies, `kubectl apply --dry-run=server` of each example
//!   (as cluster-admin, who holds the host-access verb) succeeds, and a
//!   broken copy of one is refused, so the dry run can fail.
//!
//! One kwok control plane with no node; the cluster-free checks are their
//! own tests.

use std::ffi::OsString;
use std::path::PathBuf;

use csiops_crds::CSIDriverDeployment;
use csiops_e2e::{testkit, Cluster, ClusterOptions};
use csiops_operator::render::{render, RenderConfig};
use k8s_openapi::api::core::v1::PodSpec;

/// The examples, sorted by file name.
fn examples() -> Vec<PathBuf> {
    let dir = testkit::workspace_root().join("manifests/examples");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    out.sort();
    assert!(
        out.len() >= 12,
        "manifests/examples/ should hold the hostpath examples and ten drivers, found {}",
        out.len()
    );
    out
}

fn name(path: &std::path::Path) -> String {
    path.file_name()
        .expect("file name")
        .to_string_lossy()
        .into_owned()
}

/// The documents of a file, parsed.
fn documents(path: &std::path::Path) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).expect("readable");
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            <serde_yaml::Value as serde::Deserialize>::deserialize(d)
                .unwrap_or_else(|e| panic!("{}: a document does not parse: {e}", name(path)))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The one CSIDriverDeployment of an example.
fn cr(path: &std::path::Path) -> CSIDriverDeployment {
    let crs: Vec<serde_yaml::Value> = documents(path)
        .into_iter()
        .filter(|v| v["kind"] == "CSIDriverDeployment")
        .collect();
    assert_eq!(
        crs.len(),
        1,
        "{}: one CSIDriverDeployment per example",
        name(path)
    );
    let mut obj: CSIDriverDeployment = serde_yaml::from_value(crs[0].clone())
        .unwrap_or_else(|e| panic!("{}: not a CSIDriverDeployment: {e}", name(path)));
    obj.metadata.uid = Some("00000000-0000-0000-0000-000000000001".into());
    obj
}

fn cfg() -> RenderConfig {
    RenderConfig {
        sidecar_image: "ghcr.io/csiops/csiops-sidecar:v0.1.0".into(),
        operator_version: "0.1.0".into(),
    }
}

#[test]
fn every_example_parses_and_renders() {
    for path in examples() {
        for doc in documents(&path) {
            assert!(
                doc["apiVersion"].is_string() && doc["kind"].is_string(),
                "{}: every document is a Kubernetes object",
                name(&path)
            );
        }
        let obj = cr(&path);
        assert!(
            obj.metadata.namespace.is_some(),
            "{}: the CR names its namespace",
            name(&path)
        );
        render(&obj, &cfg())
            .unwrap_or_else(|e| panic!("{}: the operator refuses it: {e}", name(&path)));
    }
}

/// The rendered pods' containers that run our bundled sidecar, with their
/// arguments (the role first).
fn bundled_sidecars(obj: &CSIDriverDeployment) -> Vec<(String, Vec<String>)> {
    let r = render(obj, &cfg()).expect("renders");
    let pods: Vec<&PodSpec> = [
        r.controller
            .as_ref()
            .and_then(|c| c.template())
            .and_then(|t| t.spec.as_ref()),
        r.daemonset
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref()),
    ]
    .into_iter()
    .flatten()
    .collect();
    pods.iter()
        .flat_map(|p| p.containers.iter())
        .filter(|c| {
            c.image.as_deref().is_some_and(|i| {
                i.contains("/csiops-sidecar") || i.contains("/csiops-node-sidecar")
            })
        })
        .map(|c| (c.name.clone(), c.args.clone().unwrap_or_default()))
        .collect()
}

#[test]
fn our_sidecars_accept_every_argument_of_every_example() {
    let mut checked = 0;
    for path in examples() {
        let obj = cr(&path);
        let sidecars = bundled_sidecars(&obj);
        assert!(
            !sidecars.is_empty(),
            "{}: no bundled sidecar rendered",
            name(&path)
        );
        for (container, args) in sidecars {
            let mut argv: Vec<OsString> = vec!["csiops-sidecar".into()];
            argv.extend(args.iter().map(OsString::from));
            let parsed = csiops_sidecars::cli::parse_from(argv).unwrap_or_else(|e| {
                panic!(
                    "{}: container {container} {args:?}: csiops-sidecar refuses its arguments: {e}",
                    name(&path)
                )
            });
            parsed.cli.role.check().unwrap_or_else(|e| {
                panic!(
                    "{}: container {container} {args:?}: csiops-sidecar's check refuses: {e}",
                    name(&path)
                )
            });
            assert!(
                parsed.ignored.is_empty(),
                "{}: container {container}: flags accepted only to be ignored: {:?}",
                name(&path),
                parsed.ignored
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 30,
        "only {checked} sidecar command lines checked"
    );
}

/// A copy of an example with `field` of its CR's spec set to `value`.
fn broken(path: &std::path::Path, field: &str, value: serde_yaml::Value) -> String {
    let docs: Vec<String> = documents(path)
        .into_iter()
        .map(|mut v| {
            if v["kind"] == "CSIDriverDeployment" {
                v["spec"][field] = value.clone();
            }
            serde_yaml::to_string(&v).expect("serialises")
        })
        .collect();
    docs.join("---\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_accepts_every_example() {
    let started = std::time::Instant::now();
    let cluster = Cluster::start(ClusterOptions::kwok(0))
        .await
        .expect("cluster starts");
    testkit::install_operator_rbac(&cluster)
        .await
        .expect("CRD, install.yaml's RBAC and admission policies apply");

    let paths = examples();
    for path in &paths {
        // The dry run creates nothing, so the namespaces an example creates
        // are made for real first (an object in a missing namespace is
        // refused before admission).
        for doc in documents(path) {
            if doc["kind"] == "Namespace" {
                let ns = doc["metadata"]["name"].as_str().expect("namespace name");
                let exists = cluster
                    .kubectl(["get", "namespace", ns])
                    .await
                    .expect("kubectl runs")
                    .status
                    .success();
                if !exists {
                    cluster
                        .kubectl_ok(["create", "namespace", ns])
                        .await
                        .expect("namespace created");
                }
            }
        }
        let out = cluster
            .kubectl(["apply", "--dry-run=server", "-f", &path.to_string_lossy()])
            .await
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "{}: the API server refuses it: {}{}",
            name(path),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("csidriverdeployment.csiops.dev/")
                && stdout.contains("(server dry run)"),
            "{}: the CR was not dry-run applied: {stdout}",
            name(path)
        );
    }

    // The dry run can fail: a copy with a field the schema refuses is
    // refused, naming the field.
    let nfs = paths
        .iter()
        .find(|p| name(p) == "csi-driver-nfs.yaml")
        .expect("the nfs example");
    for (field, value, expect) in [
        (
            "driverName",
            serde_yaml::Value::from("Not_A_DNS_Name"),
            "spec.driverName",
        ),
        (
            "logLevel",
            serde_yaml::Value::from("verbose"),
            "spec.logLevel",
        ),
    ] {
        let path = testkit::applied_path(&cluster, "broken-example");
        std::fs::write(&path, broken(nfs, field, value)).expect("written");
        let out = cluster
            .kubectl(["apply", "--dry-run=server", "-f", &path.to_string_lossy()])
            .await
            .expect("kubectl runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "a copy of the nfs example with spec.{field} broken must be refused"
        );
        assert!(
            stderr.contains(expect),
            "the refusal should name {expect}: {stderr}"
        );
    }
    cluster.stop().await.expect("cluster stops");
    println!(
        "{} examples dry-run applied in {:?}",
        paths.len(),
        started.elapsed()
    );
}
