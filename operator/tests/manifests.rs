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

/// Specs that together render every binding: a central driver with every
/// sidecar and helper, capacity from a Deployment, authenticated metrics
/// and a Secret namespace, and a node-local one with capacity and
/// authenticated metrics.
fn every_binding() -> Vec<CSIDriverDeployment> {
    let mut obj = central();
    obj.spec.csi_driver.attach_required = true;
    obj.spec.sidecars.resizer.enabled = true;
    obj.spec.sidecars.snapshotter.enabled = true;
    obj.spec.sidecars.health_monitor.enabled = true;
    obj.spec.csi_driver.storage_capacity = true;
    obj.spec.controller.kind = csiops_crds::ControllerKind::Deployment;
    obj.spec.secret_access.namespaces = vec!["creds".into()];
    obj.spec.monitoring =
        Some(serde_json::from_value(serde_json::json!({"metricsAuth": true})).expect("parses"));
    let mut node_local = example();
    node_local.spec.csi_driver.storage_capacity = true;
    node_local.spec.monitoring =
        Some(serde_json::from_value(serde_json::json!({"metricsAuth": true})).expect("parses"));
    vec![obj, node_local]
}

fn cfg() -> RenderConfig {
    RenderConfig {
        sidecar_image: "ghcr.io/csiops/csiops-sidecar:v0.1.0".into(),
        operator_version: "0.1.0".into(),
    }
}

#[test]
fn every_binding_the_operator_renders_names_a_shipped_role_it_may_bind() {
    let bind = install::bind_rule();
    let bindable: BTreeSet<String> = bind
        .resource_names
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let shipped: BTreeSet<String> = install::objects()
        .shipped_roles
        .iter()
        .filter_map(|r| r.metadata.name.clone())
        .collect();
    assert_eq!(bindable, shipped, "bind covers exactly the shipped roles");
    let mut referenced = BTreeSet::new();
    for obj in every_binding() {
        let r = render(&obj, &cfg()).expect("object renders");
        for role_ref in r.cluster_role_bindings.iter().map(|b| &b.role_ref).chain(
            r.role_bindings
                .iter()
                .chain(&r.secret_reader_bindings)
                .map(|b| &b.role_ref),
        ) {
            assert_eq!(role_ref.kind, "ClusterRole", "{role_ref:?}");
            assert!(
                bindable.contains(&role_ref.name),
                "{} is not a shipped role the operator may bind",
                role_ref.name
            );
            referenced.insert(role_ref.name.clone());
        }
    }
    // Every shipped role is used by some spec (no dead role in install.yaml).
    assert_eq!(referenced, shipped);
}

#[test]
fn the_operator_holds_no_data_plane_verb() {
    let rules = install::operator_rules();
    let held = triples(&rules);
    assert!(held.len() > 20, "expected a real rule set, got {held:?}");
    for (group, resource, verb) in &held {
        assert!(
            group != "*" && resource != "*" && verb != "*",
            "wildcard in the operator's rules: {group}/{resource} {verb}"
        );
        assert!(resource != "secrets", "the operator may {verb} secrets");
        assert!(
            resource != "configmaps",
            "the operator may {verb} configmaps"
        );
        // patch: a takeover's node labels, and nothing else of a Node (the
        // policy csiops-operator-node-labels).
        assert!(
            resource != "nodes" || ["get", "list", "watch", "patch"].contains(&verb.as_str()),
            "the operator may {verb} nodes"
        );
        assert!(
            !(resource.starts_with("persistentvolume")
                && ["create", "delete", "update", "patch"].contains(&verb.as_str())),
            "the operator may {verb} {resource}"
        );
        assert!(
            !["escalate", "impersonate"].contains(&verb.as_str()),
            "the operator may {verb} {group}/{resource}"
        );
        assert!(
            !(resource == "roles" || resource == "clusterroles") || verb == "bind",
            "the operator may {verb} {resource}"
        );
        assert!(
            resource != "leases",
            "leases are the operator's own Role's, in its namespace only"
        );
    }
    // `bind` only on the shipped roles, by name.
    for rule in &rules {
        if rule.verbs.iter().any(|v| v == "bind") {
            assert_eq!(rule.verbs, ["bind"]);
            let names = rule.resource_names.as_deref().unwrap_or_default();
            assert!(!names.is_empty(), "bind restricted by resourceNames");
            assert!(names.iter().all(|n| n.starts_with("csiops:")), "{names:?}");
        }
    }
    // And the shipped roles hold what the sidecars need (they are the
    // data plane): the provisioner reads Secrets, the registrar patches Nodes.
    let o = install::objects();
    let role = |name: &str| {
        triples(
            o.shipped_roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .and_then(|r| r.rules.as_deref())
                .unwrap_or_default(),
        )
    };
    // Secrets only through the reader, bound where the classes name them.
    assert!(!role("csiops:provisioner").contains(&("".into(), "secrets".into(), "get".into())));
    assert!(role("csiops:secret-reader").contains(&("".into(), "secrets".into(), "get".into())));
    assert!(role("csiops:registrar").contains(&("".into(), "nodes".into(), "patch".into())));
    // The registrar role carries the marker its admission policy keys on,
    // and nothing shipped carries the exemption.
    let marker = |verb: &str| {
        (
            csiops_operator::policy::MARKER_GROUP.to_string(),
            csiops_operator::policy::MARKER_RESOURCE.to_string(),
            verb.to_string(),
        )
    };
    assert!(role("csiops:registrar").contains(&marker(csiops_operator::policy::OWN_NODE_VERB)));
    for r in &o.shipped_roles {
        let name = r.metadata.name.clone().unwrap_or_default();
        let t = role(&name);
        assert!(
            !t.contains(&marker(csiops_operator::policy::ANY_NODE_VERB)),
            "{name}"
        );
        if name != "csiops:registrar" {
            assert!(
                !t.contains(&marker(csiops_operator::policy::OWN_NODE_VERB)),
                "{name}"
            );
        }
    }
    // The policy is shipped with a Deny binding.
    let (policy, binding) = o
        .policies
        .iter()
        .find(|(p, _)| {
            p.metadata.name.as_deref() == Some(csiops_operator::policy::REGISTRAR_POLICY)
        })
        .expect("the registrar policy");
    let spec = binding.spec.as_ref().expect("binding spec");
    assert_eq!(spec.policy_name.as_deref(), policy.metadata.name.as_deref());
    assert_eq!(
        spec.validation_actions.as_deref(),
        Some(&["Deny".to_string()][..])
    );
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

/// Every namespaced kind the operator applies, watches and prunes: it holds
/// all of the verbs that takes, in its ClusterRole (and so in the chart).
#[test]
fn the_operator_may_apply_watch_and_prune_every_namespaced_kind_it_renders() {
    let held = triples(&install::operator_rules());
    // The controller's PodDisruptionBudget is rendered (2 replicas), so it
    // belongs in the list.
    let mut replicated = central();
    replicated.spec.controller.replicas = 2;
    let r = render(&replicated, &cfg()).expect("object renders");
    assert!(r.controller_disruption_budget.is_some());
    for (group, resource) in [
        ("", "serviceaccounts"),
        ("", "services"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("policy", "poddisruptionbudgets"),
    ] {
        for verb in ["get", "list", "watch", "create", "patch", "delete"] {
            assert!(
                held.contains(&(group.to_string(), resource.to_string(), verb.to_string())),
                "the operator may not {verb} {group}/{resource}"
            );
        }
    }
}
