//! The checked-in manifests match the code, the operator holds every
//! permission it grants, and the example renders.

use std::collections::BTreeSet;

use csiops_crds::CSIDriverDeployment;
use csiops_operator::install;
use csiops_operator::render::{render, RenderConfig};

fn workspace_file(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

#[test]
fn install_yaml_is_up_to_date() {
    let generated = install::manifest().expect("manifest renders");
    let path = workspace_file(install::INSTALL_FILE);
    let on_disk = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; run `make manifests`", path.display()));
    assert!(
        on_disk == generated,
        "{} is out of date; run `make manifests` and commit the result",
        path.display()
    );
}

#[test]
fn helm_chart_is_up_to_date() {
    let dir = workspace_file(csiops_operator::helm::CHART_DIR);
    let files = csiops_operator::helm::chart().expect("chart renders");
    for f in &files {
        let path = dir.join(f.path);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("cannot read {}: {e}; run `make manifests`", path.display())
        });
        assert!(
            on_disk == f.content,
            "{} is out of date; run `make manifests` and commit the result",
            path.display()
        );
    }
    // No stale file a removed template left behind.
    let mut listed: Vec<String> = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("chart dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p
                    .strip_prefix(&dir)
                    .expect("inside")
                    .to_string_lossy()
                    .into_owned();
                listed.push(rel);
            }
        }
    }
    for rel in listed {
        assert!(
            files.iter().any(|f| f.path == rel),
            "{rel} in the chart is not generated; run `make manifests`"
        );
    }
}

#[test]
fn install_yaml_has_every_part_of_an_installation() {
    let yaml = install::manifest().expect("manifest renders");
    let kinds: Vec<String> = serde_yaml::Deserializer::from_str(&yaml)
        .map(|d| {
            let v = <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("yaml doc");
            v["kind"].as_str().unwrap_or("").to_string()
        })
        .collect();
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "{kind} missing from {kinds:?}"
        );
    }
}

fn example() -> CSIDriverDeployment {
    read_cr("manifests/examples/hostpath.yaml")
}

/// The Central-topology fixture of the e2e tests.
fn central() -> CSIDriverDeployment {
    read_cr("e2e/fixtures/hostpath-central.yaml")
}

fn read_cr(rel: &str) -> CSIDriverDeployment {
    let text = std::fs::read_to_string(workspace_file(rel)).expect("YAML readable");
    let doc = serde_yaml::Deserializer::from_str(&text)
        .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("yaml doc"))
        .find(|v| v["kind"] == "CSIDriverDeployment")
        .expect("example has a CSIDriverDeployment");
    let mut obj: CSIDriverDeployment = serde_yaml::from_value(doc).expect("example parses");
    obj.metadata.uid = Some("00000000-0000-0000-0000-000000000001".into());
    obj
}

/// (apiGroup, resource, verb) triples of a rule list.
fn triples(rules: &[k8s_openapi::api::rbac::v1::PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

#[test]
fn operator_holds_every_permission_it_grants() {
    let held = triples(&install::operator_rules());
    let mut obj = central();
    // Every sidecar and helper on, so every grant is rendered.
    obj.spec.csi_driver.attach_required = true;
    obj.spec.sidecars.resizer.enabled = true;
    obj.spec.sidecars.snapshotter.enabled = true;
    obj.spec.sidecars.health_monitor.enabled = true;
    // Capacity publishing from a Deployment: its Role's rules too.
    obj.spec.csi_driver.storage_capacity = true;
    obj.spec.controller.kind = csiops_crds::ControllerKind::Deployment;
    let cfg = RenderConfig {
        sidecar_image: "ghcr.io/csiops/csiops-sidecar:v0.1.0".into(),
        operator_version: "0.1.0".into(),
    };
    // And a node-local driver with capacity and authenticated metrics: the
    // node ServiceAccount's grants.
    let mut node_local = example();
    node_local.spec.csi_driver.storage_capacity = true;
    node_local.spec.monitoring =
        Some(serde_json::from_value(serde_json::json!({"metricsAuth": true})).expect("parses"));
    for obj in [obj, node_local] {
        let r = render(&obj, &cfg).expect("object renders");
        let mut granted = BTreeSet::new();
        for role in &r.cluster_roles {
            granted.extend(triples(role.rules.as_deref().unwrap_or_default()));
        }
        for role in r.leader_election_role.iter().chain(&r.node_role) {
            granted.extend(triples(role.rules.as_deref().unwrap_or_default()));
        }
        assert!(
            granted.len() > 20,
            "expected a real rule set, got {granted:?}"
        );
        let missing: Vec<_> = granted.difference(&held).collect();
        assert!(missing.is_empty(), "operator cannot grant {missing:?}");
    }
}

#[test]
fn example_is_the_hostpath_driver_and_renders() {
    let obj = example();
    assert_eq!(obj.spec.driver_name, "hostpath.csi.k8s.io");
    assert_eq!(obj.metadata.namespace.as_deref(), Some("csi-hostpath"));
    let cfg = RenderConfig {
        sidecar_image: "ghcr.io/csiops/csiops-sidecar:v0.1.0".into(),
        operator_version: "0.1.0".into(),
    };
    let r = render(&obj, &cfg).expect("example renders");
    assert_eq!(r.storage_classes.len(), 1);
    assert!(r.controller.is_none(), "the example is node-local");
    let distributed = read_cr("manifests/examples/hostpath-distributed.yaml");
    assert_eq!(distributed.spec.driver_name, obj.spec.driver_name);
    let r = render(&distributed, &cfg).expect("distributed example renders");
    assert_eq!(r.storage_classes.len(), 2);
    assert!(r.controller.is_none());
}
