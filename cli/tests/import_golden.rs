//! Golden and accounting tests of `kubectl csiops import` and `diff` on
//! our own fixtures (`tests/fixtures/`, in the shapes of real deployments,
//! none copied from upstream).
//!
//! For each fixture the imported CR and the report (JSON) are compared
//! byte for byte with `tests/golden/<case>/`. After an intended change,
//! regenerate with
//!
//!     UPDATE_GOLDEN=1 cargo test -p kubectl-csiops --test import_golden
//!
//! and review the diff. The other tests check what must hold whatever the
//! goldens say: every element of the input is accounted exactly once, the
//! CR is a valid CSIDriverDeployment the operator renders, and `diff`
//! against the fixture's own import shows only what is not representable.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use csiops_crds::CSIDriverDeployment;
use csiops_operator::render::RenderConfig;
use k8s_openapi::api::core::v1::Container;
use kubectl_csiops::import::{cr_yaml, import, Imported, Options};
use kubectl_csiops::input::{read_sources, Object};
use kubectl_csiops::report::{Outcome, What};
use kubectl_csiops::{diff, render_cmd};

/// The fixtures: (case, path under tests/fixtures).
const CASES: &[(&str, &str)] = &[
    ("central", "central"),
    ("distributed", "distributed.yaml"),
    ("several-drivers", "several-drivers.yaml"),
    ("init-containers", "init-containers.yaml"),
    ("host-network", "host-network.yaml"),
    ("env-secrets", "env-secrets.yaml"),
    ("projected-tokens", "projected-tokens.yaml"),
    ("extra-sidecar", "extra-sidecar.yaml"),
    ("helm", "helm.yaml"),
    ("bundled-sidecars", "bundled-sidecars.yaml"),
    ("non-root-pods", "non-root-pods.yaml"),
];

fn cfg() -> RenderConfig {
    RenderConfig {
        sidecar_image: "ghcr.io/csiops/csiops-sidecar:v0.1.0".into(),
        operator_version: "0.1.0".into(),
    }
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn load(path: &str) -> Vec<Object> {
    read_sources(&[dir().join("fixtures").join(path)])
        .unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

fn imported(path: &str) -> (Vec<Object>, Imported) {
    let objects = load(path);
    let imported = import(&objects, &Options::default(), &cfg())
        .unwrap_or_else(|e| panic!("import {path}: {e}"));
    (objects, imported)
}

fn golden(case: &str, file: &str, actual: &str) -> Option<String> {
    let path = dir().join("golden").join(case).join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fs::create_dir_all(path.parent().expect("golden dir")).expect("create golden dir");
        fs::write(&path, actual).expect("write golden");
        return None;
    }
    let expected = fs::read_to_string(&path).unwrap_or_default();
    (expected != actual).then(|| format!("{} differs (UPDATE_GOLDEN=1 to accept)", path.display()))
}

#[test]
fn goldens() {
    let mut failures = Vec::new();
    for (case, path) in CASES {
        let (objects, imp) = imported(path);
        let cr = cr_yaml(&imp.cr).expect("CR serializes");
        let report = imp.report.to_json().expect("report serializes");
        let diffs = diff::diff(&objects, &imp.cr, &cfg()).expect("diff runs");
        failures.extend(golden(case, "cr.yaml", &cr));
        failures.extend(golden(case, "report.json", &report));
        failures.extend(golden(case, "diff.txt", &diff::to_text(&diffs)));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What the walk of the input expects in the report: (object, container,
/// what, key).
type Key = (String, Option<String>, What, String);

fn containers(o: &Object) -> Vec<(What, Container)> {
    let pod = o
        .value
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for (field, what) in [
        ("initContainers", What::InitContainer),
        ("containers", What::Container),
    ] {
        let cs: Vec<Container> = serde_json::from_value(pod[field].clone()).unwrap_or_default();
        out.extend(cs.into_iter().map(|c| (what, c)));
    }
    out
}

/// Every container, arg, env var, volume and mount of the input's
/// workloads, walked from the input itself (not from the mapping).
fn expected_keys(objects: &[Object]) -> Vec<Key> {
    let mut out = Vec::new();
    for o in objects {
        let id = o.id();
        for (what, c) in containers(o) {
            let cn = Some(c.name.clone());
            out.push((id.clone(), cn.clone(), what, c.name.clone()));
            for i in 0..c.args.as_ref().map_or(0, Vec::len) {
                out.push((id.clone(), cn.clone(), What::Arg, format!("args[{i}]")));
            }
            for e in c.env.iter().flatten() {
                out.push((id.clone(), cn.clone(), What::Env, e.name.clone()));
            }
            for m in c.volume_mounts.iter().flatten() {
                out.push((
                    id.clone(),
                    cn.clone(),
                    What::VolumeMount,
                    m.mount_path.clone(),
                ));
            }
        }
        for v in o
            .value
            .pointer("/spec/template/spec/volumes")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            let name = v["name"].as_str().unwrap_or_default().to_string();
            out.push((id.clone(), None, What::Volume, name));
        }
    }
    out
}

#[test]
fn every_element_of_the_input_is_accounted_exactly_once() {
    for (_, path) in CASES {
        let (objects, imp) = imported(path);
        let mut counts: BTreeMap<Key, usize> = BTreeMap::new();
        for item in &imp.report.items {
            // The value of a two-argument flag is its own item.
            let key = item.key.trim_end_matches(" (value)").to_string();
            *counts
                .entry((item.object.clone(), item.container.clone(), item.what, key))
                .or_default() += 1;
        }
        for key in expected_keys(&objects) {
            let n = counts.get(&key).copied().unwrap_or(0);
            assert_eq!(n, 1, "{path}: {key:?} is in the report {n} times");
        }
    }
}

#[test]
fn the_imported_cr_is_a_csidriverdeployment_the_operator_renders() {
    for (_, path) in CASES {
        let (_, imp) = imported(path);
        let yaml = cr_yaml(&imp.cr).expect("serializes");
        let back: CSIDriverDeployment = serde_yaml::from_str(&yaml)
            .unwrap_or_else(|e| panic!("{path}: the CR does not read back: {e}"));
        assert_eq!(
            back.spec, imp.cr.spec,
            "{path}: pruning the defaults changed the spec"
        );
        render_cmd::render_values(&back, &cfg())
            .unwrap_or_else(|e| panic!("{path}: the operator would refuse the import: {e}"));
    }
}

#[test]
fn diff_against_its_own_import_shows_only_what_is_not_representable() {
    for (_, path) in CASES {
        let (objects, imp) = imported(path);
        let diffs = diff::diff(&objects, &imp.cr, &cfg()).expect("diff runs");
        let gaps: Vec<&kubectl_csiops::report::Item> = imp
            .report
            .items
            .iter()
            .filter(|i| matches!(i.outcome, Outcome::NotRepresentable { .. }))
            .collect();
        for d in &diffs {
            // Each difference is in a part of the input where the report
            // names something not representable.
            let explained = gaps.iter().any(|g| match d.section.as_str() {
                "RBAC" => g.what == What::RbacRule,
                "StorageClass" => g.object == format!("StorageClass/{}", d.field),
                "CSIDriver" => g.object.starts_with("CSIDriver/"),
                section => {
                    let workload = objects.iter().find(|o| o.id() == g.object);
                    let kind_matches = workload.is_some_and(|o| {
                        (section == "node") == (o.kind == "DaemonSet")
                            && ["DaemonSet", "Deployment", "StatefulSet"].contains(&o.kind.as_str())
                    });
                    kind_matches
                }
            });
            assert!(
                explained,
                "{path}: difference without a not-representable item: {d:?}"
            );
        }
        if !imp.report.partial() {
            assert!(
                diffs.is_empty(),
                "{path}: fully representable, yet {diffs:?}"
            );
        }
    }
}

#[test]
fn what_each_fixture_must_map_to() {
    let (_, d) = imported("distributed.yaml");
    assert_eq!(d.cr.spec.topology, csiops_crds::Topology::NodeLocal);
    assert!(!d.cr.spec.csi_driver.attach_required);
    assert!(d
        .cr
        .spec
        .sidecars
        .provisioner
        .extra_args
        .contains(&"--worker-threads=5".to_string()));

    let (_, c) = imported("central");
    assert_eq!(c.cr.spec.controller.replicas, 2);
    assert!(c.cr.spec.sidecars.resizer.enabled && c.cr.spec.sidecars.snapshotter.enabled);
    assert!(!c.cr.spec.sidecars.health_monitor.enabled);
    assert_eq!(c.cr.spec.version, "v4.2.0");
    assert_eq!(c.cr.spec.storage_classes[0].name, "files-retain");
    assert!(!c.report.partial(), "{}", c.report.to_text());

    let (_, i) = imported("init-containers.yaml");
    assert_eq!(i.cr.spec.node.kubelet_dir, "/var/lib/k0s/kubelet");
    assert_eq!(i.cr.spec.controller.replicas, 0);
    assert_eq!(i.cr.spec.driver.args[0], "--endpoint=unix:///csi/csi.sock");

    // A pod-level non-root user would make the driver own its socket,
    // which the sidecars (uid 0, no capabilities) cannot connect to: left
    // out, unless the driver keeps its own user.
    let (_, n) = imported("non-root-pods.yaml");
    let psc = n.cr.spec.controller.pod.pod_security_context.as_ref();
    assert_eq!(psc.and_then(|p| p.run_as_user), None);
    assert_eq!(psc.and_then(|p| p.run_as_non_root), None);
    assert_eq!(psc.and_then(|p| p.fs_group), Some(2000));
    let psc = n.cr.spec.node.pod.pod_security_context.as_ref();
    assert_eq!(psc.and_then(|p| p.run_as_user), Some(2000));
    let text = n.report.to_text();
    assert!(text.contains("own its CSI socket"), "{text}");
    assert!(text.contains("ports 9808-9815"), "{text}");
    assert_eq!(n.cr.spec.sidecars.port_base, None);

    let (_, e) = imported("env-secrets.yaml");
    let names: Vec<&str> =
        e.cr.spec
            .controller
            .driver
            .env
            .iter()
            .map(|v| v.name.as_str())
            .collect();
    assert!(names.contains(&"CLOUD_SECRET_ACCESS_KEY"), "{names:?}");
    assert_eq!(
        e.cr.spec
            .controller
            .driver
            .args
            .as_ref()
            .map(|a| a[0].as_str()),
        Some("controller")
    );
    assert_eq!(e.cr.spec.driver.args[0], "node");

    let (_, t) = imported("projected-tokens.yaml");
    assert!(t.cr.spec.driver.mount_service_account_token);
    assert!(t
        .cr
        .spec
        .node
        .pod
        .volumes
        .iter()
        .any(|v| v.name == "cloud-token"));

    let (_, s) = imported("several-drivers.yaml");
    assert_eq!(
        s.cr.spec.controller.kind,
        csiops_crds::ControllerKind::Deployment
    );
    let extras: Vec<&str> =
        s.cr.spec
            .sidecars
            .extra
            .iter()
            .map(|x| x.name.as_str())
            .collect();
    assert_eq!(extras, ["block-controller", "liveness-prometheus"]);
    assert!(s.cr.spec.node.pod.host_network && s.cr.spec.node.pod.host_pid);

    let (_, x) = imported("extra-sidecar.yaml");
    assert_eq!(x.cr.spec.sidecars.extra.len(), 2);
    assert_eq!(
        x.cr.spec.sidecars.extra[1].pod,
        csiops_crds::ExtraContainerPod::Node
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let objects = kubectl_csiops::input::parse_stream(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
        "t.yaml",
    )
    .expect("parses");
    let err = import(&objects, &Options::default(), &cfg()).expect_err("no driver");
    assert!(err.to_string().contains("no node DaemonSet"), "{err}");
    let bad = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers: 3\n";
    let objects = kubectl_csiops::input::parse_stream(bad, "t.yaml").expect("parses");
    let err = import(&objects, &Options::default(), &cfg()).expect_err("bad containers");
    assert!(err.to_string().starts_with("DaemonSet/x"), "{err}");
    let _ = Path::new("");
}

/// A class naming its Secret's namespace by template (per-tenant
/// credentials) needs every namespace's Secrets: the import asks for that
/// (`secretAccess.clusterWide`), says so in the report, and the operator
/// renders the result; a literal namespace asks for nothing.
#[test]
fn a_templated_secret_namespace_imports_as_cluster_wide_secret_reads() {
    let (_, literal) = imported("central");
    assert!(!literal.cr.spec.secret_access.cluster_wide);
    let tmp = tempfile::tempdir().expect("temp dir");
    for entry in fs::read_dir(dir().join("fixtures/central")).expect("fixtures") {
        let path = entry.expect("entry").path();
        let text = fs::read_to_string(&path).expect("fixture");
        let text = text.replace(
            "provisioner-secret-namespace: kube-system",
            "provisioner-secret-namespace: ${pvc.namespace}",
        );
        fs::write(tmp.path().join(path.file_name().expect("name")), text).expect("write");
    }
    let objects = read_sources(&[tmp.path().to_path_buf()]).expect("reads");
    let imp = import(&objects, &Options::default(), &cfg()).expect("imports");
    assert!(imp.cr.spec.secret_access.cluster_wide);
    assert!(
        imp.report.items.iter().any(|i| i.key
            == "parameters.csi.storage.k8s.io/provisioner-secret-namespace"
            && i.outcome == Outcome::mapped("spec.secretAccess.clusterWide")),
        "{:#?}",
        imp.report.items
    );
    render_cmd::render_values(&imp.cr, &cfg()).expect("the operator renders it");
}
