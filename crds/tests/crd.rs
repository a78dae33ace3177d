//! The checked-in CRD matches the Rust types, and its validation rules
//! accept good objects and reject bad ones.

use csiops_crds::{
    topology, CSIDriverDeployment, CSIDriverDeploymentSpec, DriverSpec, StorageClassSpec, Topology,
};
use kube::core::cel::{validate_cel, validate_cel_update};
use kube::CustomResourceExt;

fn workspace_file(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

#[test]
fn crd_yaml_is_up_to_date() {
    let generated = csiops_crds::crd_yaml().expect("CRD renders");
    let path = workspace_file(csiops_crds::CRD_FILE);
    let on_disk = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; run `make crds`", path.display()));
    assert!(
        on_disk == generated,
        "{} is out of date with crds/src; run `make crds` and commit the result",
        path.display()
    );
}

#[test]
fn crd_has_short_name_status_and_printer_columns() {
    let crd = CSIDriverDeployment::crd();
    assert_eq!(crd.spec.names.short_names, Some(vec!["csidd".to_string()]));
    assert_eq!(crd.spec.scope, "Namespaced");
    let v = &crd.spec.versions[0];
    assert!(v
        .subresources
        .as_ref()
        .and_then(|s| s.status.as_ref())
        .is_some());
    let cols: Vec<&str> = v
        .additional_printer_columns
        .as_ref()
        .expect("printer columns")
        .iter()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        cols,
        [
            "Driver",
            "Version",
            "Phase",
            "Controller",
            "Nodes",
            "Registered",
            "Age"
        ]
    );
}

fn schema_json() -> serde_json::Value {
    let crd = csiops_crds::crd();
    serde_json::to_value(&crd.spec.versions[0].schema).expect("schema serializes")
}

#[test]
fn schema_constrains_driver_name_kubelet_dir_replicas_and_enums() {
    let s = schema_json();
    let spec = &s["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(spec["driverName"]["maxLength"], 63);
    assert!(spec["driverName"]["pattern"]
        .as_str()
        .unwrap_or("")
        .starts_with("^[a-z0-9]"));
    assert_eq!(spec["node"]["properties"]["kubeletDir"]["pattern"], "^/");
    assert_eq!(spec["controller"]["properties"]["replicas"]["minimum"], 0.0);
    let policies = &spec["storageClasses"]["items"]["properties"]["reclaimPolicy"]["enum"];
    assert_eq!(policies, &serde_json::json!(["Delete", "Retain"]));
    let pull = &spec["driver"]["properties"]["imagePullPolicy"]["enum"];
    for policy in ["Always", "IfNotPresent", "Never"] {
        assert!(
            pull.as_array().is_some_and(|a| a.contains(&policy.into())),
            "{pull}"
        );
    }
}

fn object(spec: CSIDriverDeploymentSpec) -> CSIDriverDeployment {
    CSIDriverDeployment::new("hostpath", spec)
}

fn base_spec() -> CSIDriverDeploymentSpec {
    serde_json::from_value(serde_json::json!({
        "driverName": "hostpath.csi.k8s.io",
        "version": "v1.17.0",
        "driver": {"image": "registry.k8s.io/sig-storage/hostpathplugin:v1.17.0"}
    }))
    .expect("minimal spec parses")
}

#[test]
fn minimal_spec_gets_the_documented_defaults() {
    let spec = base_spec();
    assert_eq!(spec.controller.replicas, 1);
    assert_eq!(spec.node.kubelet_dir, "/var/lib/kubelet");
    assert_eq!(spec.driver.socket_name, "csi.sock");
    assert!(spec.sidecars.provisioner.enabled && spec.sidecars.registrar.enabled);
    assert!(spec.csi_driver.attach_required);
    assert_eq!(spec.rollout.step_timeout_seconds, 600);
    assert!(validate_cel(&object(spec)).is_ok());
}

#[test]
fn driver_name_is_immutable() {
    let old = object(base_spec());
    let mut new_spec = base_spec();
    new_spec.driver_name = "other.csi.k8s.io".into();
    let err = validate_cel_update(&object(new_spec), &old).expect_err("rename must be refused");
    assert!(
        format!("{err:?}").contains("driverName is immutable"),
        "{err:?}"
    );
    let mut same = base_spec();
    same.version = "v1.18.0".into();
    assert!(validate_cel_update(&object(same), &old).is_ok());
}

#[test]
fn kubelet_dir_must_be_clean() {
    let mut spec = base_spec();
    spec.node.kubelet_dir = "/var/lib/../kubelet".into();
    let err = validate_cel(&object(spec)).expect_err("dirty path refused");
    assert!(
        format!("{err:?}").contains("clean absolute path"),
        "{err:?}"
    );
}

#[test]
fn readiness_taint_needs_a_short_driver_name_and_the_registrar() {
    let mut spec = base_spec();
    spec.node.readiness_taint = true;
    assert!(validate_cel(&object(spec.clone())).is_ok());

    // 46 characters fit the taint key's 63-character name part; 47 do not.
    spec.driver_name = format!("{}.io", "a".repeat(43));
    assert!(validate_cel(&object(spec.clone())).is_ok());
    spec.driver_name = format!("{}.io", "a".repeat(44));
    let err = validate_cel(&object(spec.clone())).expect_err("47 characters refused");
    assert!(format!("{err:?}").contains("at most 46"), "{err:?}");
    // The same name is fine without the taint.
    spec.node.readiness_taint = false;
    assert!(validate_cel(&object(spec)).is_ok());

    let mut spec = base_spec();
    spec.node.readiness_taint = true;
    spec.sidecars.registrar.enabled = false;
    let err = validate_cel(&object(spec)).expect_err("no registrar refused");
    assert!(
        format!("{err:?}").contains("needs the registrar"),
        "{err:?}"
    );
}

fn class(name: &str, is_default: bool) -> StorageClassSpec {
    serde_json::from_value(serde_json::json!({"name": name, "isDefault": is_default}))
        .expect("class parses")
}

#[test]
fn storage_class_names_are_unique_and_one_default_at_most() {
    let mut spec = base_spec();
    spec.storage_classes = vec![class("fast", true), class("fast", false)];
    let err = validate_cel(&object(spec)).expect_err("duplicate refused");
    assert!(format!("{err:?}").contains("must be unique"), "{err:?}");

    let mut spec = base_spec();
    spec.storage_classes = vec![class("a", true), class("b", true)];
    let err = validate_cel(&object(spec)).expect_err("two defaults refused");
    assert!(format!("{err:?}").contains("at most one"), "{err:?}");

    let mut spec = base_spec();
    spec.storage_classes = vec![class("a", true), class("b", false)];
    assert!(validate_cel(&object(spec)).is_ok());
}

#[test]
fn driver_spec_requires_an_image() {
    let err = serde_json::from_value::<DriverSpec>(serde_json::json!({})).expect_err("no image");
    assert!(err.to_string().contains("image"));
}

/// Every `Quantity` in the schema (resources of every container, emptyDir
/// sizeLimit…) carries the quantity pattern, and the pattern accepts what
/// Kubernetes accepts and refuses what it refuses.
#[test]
fn quantities_are_validated_by_the_schema() {
    let s = schema_json();
    let spec = &s["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let limits = &spec["driver"]["properties"]["resources"]["properties"]["limits"];
    assert_eq!(
        limits["additionalProperties"]["pattern"],
        csiops_crds::QUANTITY_PATTERN
    );
    let sidecar_requests = &spec["sidecars"]["properties"]["provisioner"]["properties"]
        ["resources"]["properties"]["requests"];
    assert_eq!(
        sidecar_requests["additionalProperties"]["pattern"],
        csiops_crds::QUANTITY_PATTERN
    );
    // No quantity anywhere is left without the pattern.
    let text = serde_json::to_string(&s).expect("json");
    assert!(
        !text.contains("Quantity is a fixed-point"),
        "a Quantity was missed"
    );

    let re = regex::Regex::new(csiops_crds::QUANTITY_PATTERN).expect("pattern compiles");
    for good in [
        "1", "100m", "64Mi", "1.5Gi", "2e3", "0.5", ".5", "+1k", "1E",
    ] {
        assert!(re.is_match(good), "{good} should be a quantity");
    }
    for bad in ["lots", "", "1 Gi", "1gi", "Mi", "1.2.3", "64MB"] {
        assert!(!re.is_match(bad), "{bad:?} should not be a quantity");
    }
}

#[test]
fn the_name_must_leave_room_for_the_derived_names() {
    let mut ok = object(base_spec());
    ok.metadata.name = Some("a".repeat(csiops_crds::MAX_NAME_LEN));
    assert!(validate_cel(&ok).is_ok());
    let mut long = object(base_spec());
    long.metadata.name = Some("a".repeat(csiops_crds::MAX_NAME_LEN + 1));
    let err = validate_cel(&long).expect_err("name too long refused");
    assert!(
        format!("{err:?}").contains("at most 41 characters"),
        "{err:?}"
    );
}

#[test]
fn kubelet_dir_with_a_trailing_slash_or_dot_segments_is_refused() {
    for dir in ["/var/lib/kubelet/", "/var/./kubelet", "/var/lib/kubelet/."] {
        let mut spec = base_spec();
        spec.node.kubelet_dir = dir.into();
        let err = validate_cel(&object(spec)).expect_err(dir);
        assert!(
            format!("{err:?}").contains("trailing '/'"),
            "{dir}: {err:?}"
        );
    }
    let mut spec = base_spec();
    spec.node.kubelet_dir = "/var/lib/k0s/kubelet".into();
    assert!(validate_cel(&object(spec)).is_ok());
}

#[test]
fn pod_settings_parse_with_their_kubernetes_names() {
    let spec: CSIDriverDeploymentSpec = serde_json::from_value(serde_json::json!({
        "driverName": "rbd.csi.ceph.com",
        "version": "v3.14.0",
        "driver": {"image": "quay.io/cephcsi/cephcsi:v3.14.0"},
        "node": {
            "hostNetwork": true,
            "hostPID": true,
            "dnsPolicy": "ClusterFirstWithHostNet",
            "podLabels": {"team": "storage"},
            "podAnnotations": {"example.com/scrape": "true"},
            "volumes": [{"name": "host-dev", "hostPath": {"path": "/dev"}}],
            "volumeMounts": [{"name": "host-dev", "mountPath": "/dev", "mountPropagation": "HostToContainer"}],
            "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN"]}}
        },
        "sidecars": {"registrar": {"volumeMounts": [{"name": "host-dev", "mountPath": "/dev"}]}}
    }))
    .expect("spec parses");
    assert!(spec.node.pod.host_network && spec.node.pod.host_pid);
    assert_eq!(spec.node.pod.volumes[0].name, "host-dev");
    assert_eq!(
        spec.node.driver.volume_mounts[0]
            .mount_propagation
            .as_deref(),
        Some("HostToContainer")
    );
    assert_eq!(
        spec.node
            .driver
            .security_context
            .as_ref()
            .and_then(|s| s.privileged),
        Some(true)
    );
    assert_eq!(spec.sidecars.registrar.volume_mounts.len(), 1);
    let back = serde_json::to_value(&spec.node).expect("serializes");
    assert_eq!(back["hostPID"], true);
    assert!(back.get("hostPid").is_none());
}

fn node_local_spec() -> CSIDriverDeploymentSpec {
    serde_json::from_value(serde_json::json!({
        "driverName": "hostpath.csi.k8s.io",
        "version": "v1.18.0",
        "topology": "NodeLocal",
        "driver": {"image": "registry.k8s.io/sig-storage/hostpathplugin:v1.18.0"},
        "csiDriver": {"attachRequired": false, "storageCapacity": true},
        "sidecars": {"extra": [{"name": "tool", "image": "tool:1", "pod": "Node"}]}
    }))
    .expect("node-local spec parses")
}

#[test]
fn topology_defaults_to_central_and_a_central_object_may_set_everything() {
    let spec = base_spec();
    assert_eq!(spec.topology, Topology::Central);
    assert!(spec.node_local_conflicts().is_empty());
    let mut spec = base_spec();
    spec.controller.replicas = 3;
    spec.sidecars.resizer.enabled = true;
    assert!(validate_cel(&object(spec.clone())).is_ok());
    assert!(spec.node_local_conflicts().is_empty());
}

#[test]
fn a_node_local_object_without_controller_settings_is_accepted() {
    let spec = node_local_spec();
    assert!(validate_cel(&object(spec.clone())).is_ok());
    assert!(spec.node_local_conflicts().is_empty());
    // Empty collections and false flags are no settings.
    let spec: CSIDriverDeploymentSpec = serde_json::from_value(serde_json::json!({
        "driverName": "hostpath.csi.k8s.io",
        "version": "v1",
        "topology": "NodeLocal",
        "driver": {"image": "x"},
        "csiDriver": {"attachRequired": false},
        "controller": {"tolerations": [], "hostNetwork": false, "podLabels": {}}
    }))
    .expect("parses");
    assert!(validate_cel(&object(spec.clone())).is_ok());
    assert!(spec.node_local_conflicts().is_empty());
}

/// Refused by the CRD and by the operator's own check, with the same words.
fn assert_node_local_refused(spec: CSIDriverDeploymentSpec, field: &str, message: &str) {
    let err = validate_cel(&object(spec.clone())).expect_err(field);
    assert!(format!("{err:?}").contains(message), "{field}: {err:?}");
    let conflicts = spec.node_local_conflicts();
    assert!(
        conflicts
            .iter()
            .any(|c| c.field == field && c.why == message),
        "{field}: {conflicts:?}"
    );
}

#[test]
fn node_local_refuses_attach() {
    let mut spec = node_local_spec();
    spec.csi_driver.attach_required = true;
    assert_node_local_refused(
        spec,
        "spec.csiDriver.attachRequired",
        topology::ATTACH_MESSAGE,
    );
    // Left unset, attachRequired is true: refused as well.
    let spec: CSIDriverDeploymentSpec = serde_json::from_value(serde_json::json!({
        "driverName": "hostpath.csi.k8s.io",
        "version": "v1",
        "topology": "NodeLocal",
        "driver": {"image": "x"}
    }))
    .expect("parses");
    assert!(spec.csi_driver.attach_required);
    assert_node_local_refused(
        spec,
        "spec.csiDriver.attachRequired",
        topology::ATTACH_MESSAGE,
    );
}

/// Every field of `spec.controller` the CRD rule checks is one the
/// operator's check finds, and the other way round.
#[test]
fn node_local_refuses_every_controller_setting() {
    let samples: Vec<(&str, serde_json::Value)> = vec![
        ("kind", serde_json::json!("Deployment")),
        ("replicas", serde_json::json!(2)),
        ("nodeSelector", serde_json::json!({"a": "b"})),
        ("tolerations", serde_json::json!([{"operator": "Exists"}])),
        ("affinity", serde_json::json!({"nodeAffinity": {}})),
        ("priorityClassName", serde_json::json!("high")),
        ("disruptionBudget", serde_json::json!({"enabled": false})),
        ("image", serde_json::json!("other:1")),
        ("args", serde_json::json!(["--x"])),
        ("env", serde_json::json!([{"name": "A", "value": "1"}])),
        (
            "resources",
            serde_json::json!({"limits": {"memory": "1Gi"}}),
        ),
        (
            "volumeMounts",
            serde_json::json!([{"name": "v", "mountPath": "/v"}]),
        ),
        ("securityContext", serde_json::json!({"privileged": true})),
        (
            "volumes",
            serde_json::json!([{"name": "v", "emptyDir": {}}]),
        ),
        ("hostNetwork", serde_json::json!(true)),
        ("dnsPolicy", serde_json::json!("Default")),
        ("hostPID", serde_json::json!(true)),
        ("podAnnotations", serde_json::json!({"a": "b"})),
        ("podLabels", serde_json::json!({"a": "b"})),
    ];
    let checked: Vec<&str> = topology::CONTROLLER_FIELDS
        .iter()
        .map(|(f, _)| *f)
        .chain(["kind", "replicas"])
        .collect();
    assert_eq!(samples.len(), checked.len());
    for (field, value) in samples {
        assert!(checked.contains(&field), "{field} is not checked");
        let mut json = serde_json::to_value(node_local_spec()).expect("serializes");
        json["controller"][field] = value;
        let spec: CSIDriverDeploymentSpec = serde_json::from_value(json).expect(field);
        assert_eq!(spec.controller.set_fields(), vec![field]);
        assert_node_local_refused(
            spec,
            &format!("spec.controller.{field}"),
            topology::CONTROLLER_MESSAGE,
        );
    }
}

#[test]
fn node_local_refuses_the_controller_helpers_and_extra_containers_of_controller_pods() {
    for helper in topology::CONTROLLER_HELPERS {
        let mut json = serde_json::to_value(node_local_spec()).expect("serializes");
        json["sidecars"][helper] = serde_json::json!({"enabled": true});
        let spec: CSIDriverDeploymentSpec = serde_json::from_value(json).expect(helper);
        assert_node_local_refused(
            spec,
            &format!("spec.sidecars.{helper}.enabled"),
            topology::HELPERS_MESSAGE,
        );
    }
    let mut json = serde_json::to_value(node_local_spec()).expect("serializes");
    json["sidecars"]["extra"] = serde_json::json!([
        {"name": "a", "image": "a:1", "pod": "Node"},
        {"name": "b", "image": "b:1"}
    ]);
    let spec: CSIDriverDeploymentSpec = serde_json::from_value(json).expect("extra");
    assert_node_local_refused(spec, "spec.sidecars.extra[1].pod", topology::EXTRA_MESSAGE);
}

#[test]
fn api_reference_is_up_to_date() {
    let generated = csiops_crds::apidoc::api_reference();
    let path = workspace_file(csiops_crds::apidoc::API_REFERENCE_FILE);
    let on_disk = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; run `make api-docs`", path.display()));
    assert!(
        on_disk == generated,
        "{} is out of date with crds/src; run `make api-docs` and commit the result",
        path.display()
    );
}

/// `csiDriver.tokenRequests` and `nodeAllocatableUpdatePeriodSeconds` carry
/// the API server's own limits (Kubernetes 1.34 `validateTokenRequests`,
/// `validateNodeAllocatableUpdatePeriodSeconds`), so `kubectl apply` refuses
/// what the CSIDriver could not take, and round-trip through the types.
#[test]
fn csidriver_token_requests_and_allocatable_period_carry_the_api_limits() {
    let s = schema_json();
    let csi = &s["openAPIV3Schema"]["properties"]["spec"]["properties"]["csiDriver"]["properties"];
    let period = &csi["nodeAllocatableUpdatePeriodSeconds"];
    assert_eq!(period["minimum"], 10.0, "{period}");
    assert_eq!(period["type"], "integer");
    let tokens = &csi["tokenRequests"];
    // Keyed by audience: the API server refuses a duplicate audience.
    assert_eq!(tokens["x-kubernetes-list-type"], "map", "{tokens}");
    assert_eq!(
        tokens["x-kubernetes-list-map-keys"],
        serde_json::json!(["audience"])
    );
    assert_eq!(tokens["items"]["required"], serde_json::json!(["audience"]));
    let expiry = &tokens["items"]["properties"]["expirationSeconds"];
    assert_eq!(expiry["minimum"], 600.0, "{expiry}");
    assert_eq!(expiry["maximum"], 4_294_967_296.0, "{expiry}");

    let spec: CSIDriverDeploymentSpec = serde_json::from_value(serde_json::json!({
        "driverName": "hostpath.csi.k8s.io",
        "version": "v1",
        "driver": {"image": "x"},
        "csiDriver": {
            "tokenRequests": [{"audience": "vault", "expirationSeconds": 3600}, {"audience": ""}],
            "nodeAllocatableUpdatePeriodSeconds": 30
        }
    }))
    .expect("parses");
    assert_eq!(spec.csi_driver.token_requests.len(), 2);
    assert_eq!(spec.csi_driver.token_requests[1].expiration_seconds, None);
    assert_eq!(
        spec.csi_driver.node_allocatable_update_period_seconds,
        Some(30)
    );
    let back = serde_json::to_value(&spec.csi_driver).expect("serializes");
    assert_eq!(
        back["tokenRequests"][1],
        serde_json::json!({"audience": ""})
    );
    // Unset: left out, as the CSIDriver field is.
    let unset = serde_json::to_value(&base_spec().csi_driver).expect("serializes");
    assert!(
        unset.get("tokenRequests").is_none()
            && unset.get("nodeAllocatableUpdatePeriodSeconds").is_none()
    );
}

/// `serviceAccountTokenInSecrets` and `preventPodSchedulingIfMissing` (the
/// 1.35 and 1.36 CSIDriverSpec fields) are optional booleans, left out when
/// unset; the first is refused without `tokenRequests`, true or false, as
/// the API server refuses it (`validateServiceAccountTokenInSecrets`).
#[test]
fn token_in_secrets_needs_token_requests_and_the_newer_fields_round_trip() {
    let s = schema_json();
    let csi = &s["openAPIV3Schema"]["properties"]["spec"]["properties"]["csiDriver"];
    for field in [
        "serviceAccountTokenInSecrets",
        "preventPodSchedulingIfMissing",
    ] {
        assert_eq!(csi["properties"][field]["type"], "boolean", "{field}");
    }
    let rules = csi["x-kubernetes-validations"].to_string();
    assert!(
        rules.contains(csiops_crds::SERVICE_ACCOUNT_TOKEN_IN_SECRETS_MESSAGE),
        "{rules}"
    );

    let with = |csi: serde_json::Value| -> CSIDriverDeploymentSpec {
        let mut json = serde_json::to_value(base_spec()).expect("serializes");
        json["csiDriver"] = csi;
        serde_json::from_value(json).expect("parses")
    };
    let refused = |spec: CSIDriverDeploymentSpec| {
        let err = validate_cel(&object(spec)).expect_err("refused");
        assert!(
            format!("{err:?}").contains(csiops_crds::SERVICE_ACCOUNT_TOKEN_IN_SECRETS_MESSAGE),
            "{err:?}"
        );
    };
    refused(with(
        serde_json::json!({"serviceAccountTokenInSecrets": true}),
    ));
    refused(with(
        serde_json::json!({"serviceAccountTokenInSecrets": false}),
    ));
    // (An empty `tokenRequests: []` is refused too; the typed object cannot
    // carry one, so e2e/tests/csidriver_fields.rs shows it on the API server.)
    let spec = with(serde_json::json!({
        "serviceAccountTokenInSecrets": true,
        "tokenRequests": [{"audience": "vault"}],
        "preventPodSchedulingIfMissing": true
    }));
    assert!(validate_cel(&object(spec.clone())).is_ok());
    assert_eq!(spec.csi_driver.service_account_token_in_secrets, Some(true));
    assert_eq!(
        spec.csi_driver.prevent_pod_scheduling_if_missing,
        Some(true)
    );
    let back = serde_json::to_value(&spec.csi_driver).expect("serializes");
    assert_eq!(back["serviceAccountTokenInSecrets"], true);
    assert_eq!(back["preventPodSchedulingIfMissing"], true);
    // Either alone, or false, without tokens for the second: accepted.
    let spec = with(serde_json::json!({"preventPodSchedulingIfMissing": false}));
    assert_eq!(
        spec.csi_driver.prevent_pod_scheduling_if_missing,
        Some(false)
    );
    assert!(validate_cel(&object(spec)).is_ok());
    // Unset: left out, as the CSIDriver fields are.
    let unset = serde_json::to_value(&base_spec().csi_driver).expect("serializes");
    assert!(
        unset.get("serviceAccountTokenInSecrets").is_none()
            && unset.get("preventPodSchedulingIfMissing").is_none(),
        "{unset}"
    );
    assert!(validate_cel(&object(base_spec())).is_ok());
}

#[test]
fn the_registrars_node_is_not_the_specs_to_choose() {
    let refused = |edit: &dyn Fn(&mut CSIDriverDeploymentSpec)| {
        let mut spec = base_spec();
        edit(&mut spec);
        let err = validate_cel(&object(spec)).expect_err("refused");
        assert!(
            format!("{err:?}").contains(csiops_crds::security::REGISTRAR_NODE_MESSAGE),
            "{err:?}"
        );
    };
    for var in ["NODE_NAME", "KUBE_NODE_NAME"] {
        refused(&|s| {
            s.sidecars.registrar.env =
                serde_json::from_value(serde_json::json!([{"name": var, "value": "other-node"}]))
                    .expect("env parses")
        });
    }
    // Other variables, and these elsewhere, are fine (`--node-name` in
    // extraArgs is the operator's to refuse, as every managed flag).
    let mut spec = base_spec();
    spec.sidecars.registrar.env =
        serde_json::from_value(serde_json::json!([{"name": "NODE_NAMES", "value": "x"}]))
            .expect("env parses");
    assert!(validate_cel(&object(spec)).is_ok());
}

/// `spec.controller.disruptionBudget`: one bound at most, never one that
/// keeps every replica from being evicted.
#[test]
fn a_disruption_budget_takes_one_bound_that_lets_a_drain_finish() {
    let with = |replicas: i32, budget: serde_json::Value| {
        let mut json = serde_json::to_value(base_spec()).expect("serializes");
        json["controller"] = serde_json::json!({"replicas": replicas, "disruptionBudget": budget});
        let spec: CSIDriverDeploymentSpec = serde_json::from_value(json).expect("parses");
        validate_cel(&object(spec))
    };
    for (replicas, budget) in [
        (2, serde_json::json!({})),
        (2, serde_json::json!({"enabled": false})),
        (2, serde_json::json!({"maxUnavailable": 1})),
        (4, serde_json::json!({"maxUnavailable": "25%"})),
        (3, serde_json::json!({"minAvailable": 2})),
        (2, serde_json::json!({"minAvailable": "50%"})),
        // One replica renders no budget: nothing to refuse.
        (1, serde_json::json!({"minAvailable": 1})),
    ] {
        assert!(
            with(replicas, budget.clone()).is_ok(),
            "{replicas} {budget}: {:?}",
            with(replicas, budget.clone())
        );
    }
    for (replicas, budget, message) in [
        (
            3,
            serde_json::json!({"maxUnavailable": 1, "minAvailable": 1}),
            "not both",
        ),
        (2, serde_json::json!({"maxUnavailable": 0}), "at least 1"),
        (2, serde_json::json!({"maxUnavailable": "0%"}), "at least 1"),
        (2, serde_json::json!({"minAvailable": -1}), "at least 0"),
        (2, serde_json::json!({"minAvailable": "100%"}), "0% to 99%"),
        (
            2,
            serde_json::json!({"minAvailable": 2}),
            "less than controller.replicas",
        ),
        (
            3,
            serde_json::json!({"minAvailable": 5}),
            "less than controller.replicas",
        ),
    ] {
        let err = with(replicas, budget.clone()).expect_err(&budget.to_string());
        assert!(format!("{err:?}").contains(message), "{budget}: {err:?}");
    }
}

/// `priorityClassName`: empty (no class) or a PriorityClass name.
#[test]
fn priority_class_names_are_empty_or_a_dns_subdomain() {
    let schema = schema_json().to_string();
    let pattern = r#"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"#;
    assert_eq!(
        schema.matches(pattern).count(),
        2,
        "controller and node priorityClassName carry the pattern"
    );
    let unset = base_spec();
    assert_eq!(unset.controller.priority_class_name, None);
    assert_eq!(
        csiops_crds::effective_priority_class(
            unset.node.priority_class_name.as_deref(),
            csiops_crds::DEFAULT_NODE_PRIORITY_CLASS
        ),
        Some("system-node-critical")
    );
}
