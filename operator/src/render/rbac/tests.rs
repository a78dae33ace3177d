use super::*;

fn keys(set: &[Grant]) -> BTreeSet<(&str, &str, &str)> {
    set.iter()
        .flat_map(|g| g.verbs.iter().map(|v| (g.api_group, g.resource, *v)))
        .collect()
}

#[test]
fn a_node_provisioner_gets_the_central_grants_but_nodes_and_csinodes() {
    let central: BTreeSet<_> = keys(PROVISIONER_GRANTS)
        .into_iter()
        .filter(|(_, r, _)| *r != "nodes" && *r != "csinodes")
        .collect();
    assert_eq!(keys(NODE_PROVISIONER_GRANTS), central);
}

fn spec(json: serde_json::Value) -> csiops_crds::CSIDriverDeploymentSpec {
    let mut base = serde_json::json!({
        "driverName": "d.example.com",
        "version": "v1",
        "driver": {"image": "d:v1"},
    });
    if let (Some(b), Some(extra)) = (base.as_object_mut(), json.as_object()) {
        b.extend(extra.clone());
    }
    serde_json::from_value(base).expect("spec")
}

fn namespaces(list: &[&str]) -> SecretScope {
    SecretScope::Namespaces(list.iter().map(|s| s.to_string()).collect())
}

#[test]
fn secrets_are_read_only_where_the_classes_name_them_on_the_controller_side() {
    let s = spec(serde_json::json!({"storageClasses": [
        {"name": "a", "parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": "p",
            "csi.storage.k8s.io/provisioner-secret-namespace": "storage-creds",
            "csi.storage.k8s.io/controller-expand-secret-namespace": "expand",
            // kubelet reads these: nothing for the driver's tokens.
            "csi.storage.k8s.io/node-stage-secret-namespace": "node-only",
            "csi.storage.k8s.io/node-publish-secret-namespace": "node-only",
        }},
        {"name": "b", "parameters": {"csiProvisionerSecretNamespace": "legacy"}},
        {"name": "c"},
    ]}));
    assert_eq!(
        secret_scope(&s),
        Ok(namespaces(&["expand", "legacy", "storage-creds"]))
    );
    // No class names one: no Secret at all.
    assert_eq!(
        secret_scope(&spec(serde_json::json!({}))),
        Ok(namespaces(&[]))
    );
    // The spec adds its own.
    let s = spec(serde_json::json!({"secretAccess": {"namespaces": ["extra"]}}));
    assert_eq!(secret_scope(&s), Ok(namespaces(&["extra"])));
}

#[test]
fn a_templated_namespace_needs_every_namespace_granted() {
    let class = serde_json::json!([{"name": "tenant", "parameters": {
        "csi.storage.k8s.io/provisioner-secret-name": "creds",
        "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
    }}]);
    let refused = secret_scope(&spec(serde_json::json!({"storageClasses": class.clone()})));
    assert_eq!(
        refused,
        Err(TemplatedSecretNamespace {
            class: "tenant".into(),
            key: "csi.storage.k8s.io/provisioner-secret-namespace".into(),
            value: "${pvc.namespace}".into(),
        })
    );
    let s = spec(serde_json::json!({
        "storageClasses": class,
        "secretAccess": {"clusterWide": true},
    }));
    assert_eq!(secret_scope(&s), Ok(SecretScope::Cluster));
    // A node-side template is kubelet's business.
    let s = spec(
        serde_json::json!({"storageClasses": [{"name": "n", "parameters": {
            "csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}",
        }}]}),
    );
    assert_eq!(secret_scope(&s), Ok(namespaces(&[])));
}

#[test]
fn no_sidecar_role_reads_secrets() {
    for role in SHIPPED_ROLES {
        let reads = role
            .grants
            .iter()
            .any(|g| g.api_group.is_empty() && g.resource == "secrets" && g.verbs.contains(&"get"));
        // The journal's key is the provisioner's own Secret, in its
        // namespace (bound there only).
        let allowed = [SECRET_READER_ROLE.name, JOURNAL_ROLE.name].contains(&role.name);
        assert_eq!(reads, allowed, "{}", role.name);
    }
}

#[test]
fn merge_unions_and_sorts() {
    let rules = merge_rules(&[PROVISIONER_GRANTS, ATTACHER_GRANTS]);
    let pv = rules
        .iter()
        .find(|r| r.resources.as_deref() == Some(&["persistentvolumes".to_string()][..]))
        .map(|r| r.verbs.clone());
    assert_eq!(
        pv,
        Some(
            ["create", "delete", "get", "list", "patch", "watch"]
                .map(String::from)
                .to_vec()
        )
    );
    let keys: Vec<_> = rules
        .iter()
        .map(|r| (r.api_groups.clone(), r.resources.clone()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
}
