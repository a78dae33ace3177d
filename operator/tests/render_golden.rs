//! Golden-file and targeted tests of `csiops_operator::render`.
//!
//! Every rendered object is written as YAML to `tests/golden/<case>/<kind>-<name>.yaml`
//! and compared byte for byte. After an intended change, regenerate with
//!
//!     UPDATE_GOLDEN=1 cargo test -p csiops-operator --test render_golden
//!
//! and review the diff. The targeted tests below check the rules a storage
//! admin relies on directly, so they fail on their own even if someone
//! regenerates the goldens without reading them.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use csiops_crds::CSIDriverDeployment;
use csiops_operator::render::labels::{
    self, Component, COMPONENT, INSTANCE, MANAGED_BY, OWNER_UID, TEMPLATE_HASH, VERSION,
    VERSION_LABEL,
};
use csiops_operator::render::{
    names, rbac, render, ControllerWorkload, RenderConfig, RenderError, Rendered, API_ACCESS_MOUNT,
};
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::Value;

const UID: &str = "6f2b1d9e-3c4a-4b5f-9e7d-1a2b3c4d5e6f";

fn cfg() -> RenderConfig {
    RenderConfig {
        sidecar_image: "ghcr.io/csiops/csiops-sidecar:v0.1.0".to_string(),
        operator_version: "0.1.0".to_string(),
    }
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Central-topology fixture `e2e/fixtures/hostpath-central.yaml` (what
/// the hostpath example was before topology NodeLocal), with a uid as the
/// API server would set it: the base of the targeted tests of the central
/// topology.
fn central() -> CSIDriverDeployment {
    read_cr("../e2e/fixtures/hostpath-central.yaml")
}

/// The `CSIDriverDeployment` of `manifests/examples/hostpath.yaml`
/// (topology NodeLocal).
fn example() -> CSIDriverDeployment {
    read_cr("../manifests/examples/hostpath.yaml")
}

/// The `CSIDriverDeployment` of `manifests/examples/hostpath-distributed.yaml`.
fn distributed() -> CSIDriverDeployment {
    read_cr("../manifests/examples/hostpath-distributed.yaml")
}

/// The `CSIDriverDeployment` of a YAML file (relative to this crate).
fn read_cr(rel: &str) -> CSIDriverDeployment {
    let path = manifest_dir().join(rel);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut found = None;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = Value::deserialize(doc).expect("example is valid YAML");
        if value["kind"] == "CSIDriverDeployment" {
            found =
                Some(serde_json::from_value::<CSIDriverDeployment>(value).expect("example parses"));
        }
    }
    let mut obj = found.expect("example contains a CSIDriverDeployment");
    obj.metadata.uid = Some(UID.to_string());
    obj
}

/// A driver exercising most of the spec: moved kubelet dir, attacher, no
/// liveness probe, 3 replicas, tolerations, resources, overrides, two classes.
const CUSTOM: &str = r#"
apiVersion: csiops.dev/v1alpha1
kind: CSIDriverDeployment
metadata:
  name: block
  namespace: storage-system
  uid: 0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d
spec:
  driverName: block.csi.example.com
  version: 2.4.1
  logLevel: 4
  imagePullSecrets: [registry-creds]
  driver:
    image: registry.example.com/block-csi:2.4.1
    imagePullPolicy: IfNotPresent
    socketName: block.sock
    args: ["--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(KUBE_NODE_NAME)"]
    env:
      - {name: LOG_FORMAT, value: json}
      - {name: MODE, value: all}
    resources:
      requests: {cpu: 50m, memory: 64Mi}
      limits: {memory: 256Mi}
  controller:
    replicas: 3
    nodeSelector: {node-role.kubernetes.io/control-plane: ""}
    tolerations:
      - {key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}
    priorityClassName: system-cluster-critical
    args: ["--endpoint=$(CSI_ENDPOINT)", "--mode=controller"]
  node:
    kubeletDir: /var/lib/k0s/kubelet/
    maxUnavailable: 10%
    tolerations:
      - {operator: Exists}
    readinessTaint: true
    priorityClassName: system-node-critical
    image: registry.example.com/block-csi-node:2.4.1
    args: ["--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(KUBE_NODE_NAME)", "--mode=node"]
    env:
      - {name: MODE, value: node}
      - {name: MAX_VOLUMES, value: "64"}
    resources:
      requests: {cpu: 100m, memory: 128Mi}
      limits: {memory: 512Mi}
  sidecars:
    image: registry.example.com/csiops-sidecar:v0.1.0
    imagePullPolicy: Always
    provisioner:
      extraArgs: ["--worker-threads=20", "--strict-topology"]
      resources:
        requests: {cpu: 10m, memory: 32Mi}
    attacher:
      enabled: true
      extraArgs: ["--worker-threads=5"]
      env:
        - {name: RUST_LOG, value: info}
    registrar:
      resources:
        requests: {cpu: 5m, memory: 16Mi}
    livenessProbe:
      enabled: false
  csiDriver:
    attachRequired: true
    fsGroupPolicy: ReadWriteOnceWithFSType
    storageCapacity: true
    requiresRepublish: true
    tokenRequests:
      - {audience: vault.example.com, expirationSeconds: 3600}
      - {audience: ""}
    nodeAllocatableUpdatePeriodSeconds: 60
    serviceAccountTokenInSecrets: true
    preventPodSchedulingIfMissing: true
  storageClasses:
    - name: block-fast
      isDefault: true
      parameters:
        type: ssd
        csi.storage.k8s.io/fstype: ext4
      reclaimPolicy: Retain
      allowVolumeExpansion: true
      mountOptions: [discard]
    - name: block-slow
      parameters: {type: hdd}
  volumeAttributesClasses:
    - name: block-gold
      parameters: {iops: "3000", throughput: "125"}
    - name: block-silver
      parameters: {iops: "1000"}
"#;

fn custom() -> CSIDriverDeployment {
    serde_yaml::from_str(CUSTOM).expect("custom object parses")
}

fn must_render(obj: &CSIDriverDeployment) -> Rendered {
    render(obj, &cfg()).unwrap_or_else(|e| panic!("render failed: {e}"))
}

// ---------------------------------------------------------------- goldens

/// The cluster-wide rules of `component`'s ServiceAccount, resolved from
/// the bindings and the shipped roles.
fn cluster_rules(r: &Rendered, component: Component) -> Vec<PolicyRule> {
    rbac::effective_rules(r, component).0
}

/// The rules of `component`'s ServiceAccount in the driver's namespace.
fn namespace_rules(r: &Rendered, component: Component) -> Vec<PolicyRule> {
    rbac::effective_rules(r, component).1
}

/// Every rendered object as JSON, in apply order.
fn objects(r: &Rendered) -> Vec<Value> {
    fn v<T: serde::Serialize>(t: &T) -> Value {
        serde_json::to_value(t).expect("rendered objects serialize")
    }
    let mut out: Vec<Value> = r.controller_service_account.iter().map(v).collect();
    out.push(v(&r.node_service_account));
    out.extend(r.role_bindings.iter().map(v));
    out.extend(r.secret_reader_bindings.iter().map(v));
    out.extend(r.cluster_role_bindings.iter().map(v));
    out.extend(r.controller_disruption_budget.iter().map(v));
    out.push(v(&r.csi_driver));
    out.extend(r.storage_classes.iter().map(v));
    out.extend(r.attributes_classes.iter().map(v));
    out.push(v(&r.daemonset));
    match &r.controller {
        Some(ControllerWorkload::StatefulSet(s)) => out.push(v(s)),
        Some(ControllerWorkload::Deployment(d)) => out.push(v(d)),
        None => {}
    }
    out.extend(r.metrics_service.iter().map(v));
    out.extend(r.pod_monitor.iter().map(v));
    out
}

fn golden_file_name(obj: &Value) -> String {
    let kind = obj["kind"].as_str().unwrap_or("unknown").to_lowercase();
    // ':' (in cluster role names) is not a portable file name character.
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or("unnamed")
        .replace(':', "_");
    format!("{kind}-{name}.yaml")
}

fn check_golden(case: &str, obj: &CSIDriverDeployment) {
    let rendered = must_render(obj);
    let dir = manifest_dir().join("tests/golden").join(case);
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");

    let mut expected: BTreeMap<String, String> = BTreeMap::new();
    for o in objects(&rendered) {
        // Server-side apply needs apiVersion and kind in the body.
        assert!(o["apiVersion"].is_string(), "no apiVersion in {o}");
        assert!(o["kind"].is_string(), "no kind in {o}");
        let file = golden_file_name(&o);
        let yaml = serde_yaml::to_string(&o).expect("YAML serialization");
        assert!(
            expected.insert(file.clone(), yaml).is_none(),
            "two objects map to {file}"
        );
    }

    if update {
        fs::create_dir_all(&dir).expect("create golden dir");
        for entry in fs::read_dir(&dir).expect("list golden dir").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !expected.contains_key(&name) {
                fs::remove_file(entry.path()).expect("remove stale golden");
            }
        }
        for (file, yaml) in &expected {
            fs::write(dir.join(file), yaml).expect("write golden");
        }
        return;
    }

    let mut problems = Vec::new();
    for (file, yaml) in &expected {
        let path = dir.join(file);
        match fs::read_to_string(&path) {
            Ok(have) if &have == yaml => {}
            Ok(have) => problems.push(format!(
                "{}: differs\n{}",
                path.display(),
                first_diff(&have, yaml)
            )),
            Err(_) => problems.push(format!("{}: missing", path.display())),
        }
    }
    if let Ok(entries) = fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !expected.contains_key(&name) {
                problems.push(format!("{}: no longer rendered", entry.path().display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "golden files of case {case:?} do not match the rendering:\n{}\n\nIf the change is intended, run \
         `UPDATE_GOLDEN=1 cargo test -p csiops-operator --test render_golden` and review `git diff {}`.",
        problems.join("\n"),
        Path::new("operator/tests/golden").join(case).display(),
    );
}

/// The first differing line, with a little context, of golden vs rendered.
fn first_diff(golden: &str, rendered: &str) -> String {
    let g: Vec<&str> = golden.lines().collect();
    let r: Vec<&str> = rendered.lines().collect();
    let i = g.iter().zip(&r).take_while(|(a, b)| a == b).count();
    let from = i.saturating_sub(3);
    let show = |lines: &[&str]| {
        lines
            .iter()
            .enumerate()
            .skip(from)
            .take(i + 3 - from)
            .map(|(n, l)| format!("    {:>4} {l}", n + 1))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!("  golden:\n{}\n  rendered:\n{}", show(&g), show(&r))
}

#[test]
fn golden_central() {
    check_golden("central", &central());
}

#[test]
fn golden_hostpath() {
    check_golden("hostpath", &example());
}

#[test]
fn golden_distributed() {
    check_golden("distributed", &distributed());
}

#[test]
fn golden_custom() {
    check_golden("custom", &custom());
}

/// The hostpath example with authenticated metrics, a certificate Secret and
/// a PodMonitor.
fn monitored() -> CSIDriverDeployment {
    let mut obj = central();
    obj.spec.monitoring = Some(
        serde_json::from_value(serde_json::json!({
            "metricsAuth": true,
            "tlsSecretName": "hostpath-metrics-tls",
            "podMonitor": {
                "enabled": true,
                "interval": "30s",
                "labels": {"release": "prometheus"},
                "bearerTokenSecret": {"name": "prometheus-scraper", "key": "token"},
            },
        }))
        .expect("monitoring parses"),
    );
    obj
}

#[test]
fn golden_monitoring() {
    check_golden("monitoring", &monitored());
}

// ---------------------------------------------------------------- monitoring

#[test]
fn without_monitoring_nothing_of_it_is_rendered() {
    let r = must_render(&central());
    assert!(r.metrics_service.is_none());
    assert!(r.pod_monitor.is_none());
    for component in [Component::Controller, Component::Node] {
        for c in &pod(&r, component).containers {
            let args = c.args.clone().unwrap_or_default();
            assert!(
                !args.iter().any(|a| a.starts_with("--metrics-")),
                "{args:?}"
            );
        }
    }
    for component in [Component::Controller, Component::Node] {
        let rules = serde_json::to_string(&cluster_rules(&r, component)).expect("json");
        assert!(!rules.contains("tokenreviews"), "{rules}");
    }
}

#[test]
fn metrics_auth_reaches_every_bundled_sidecar_its_probes_and_its_rbac() {
    let r = must_render(&monitored());
    let ours = [
        names::CONTAINER_PROVISIONER,
        names::CONTAINER_REGISTRAR,
        names::CONTAINER_LIVENESS_PROBE,
    ];
    for component in [Component::Controller, Component::Node] {
        let p = pod(&r, component);
        for c in p
            .containers
            .iter()
            .filter(|c| ours.contains(&c.name.as_str()))
        {
            let args = c.args.clone().unwrap_or_default();
            assert!(
                args.contains(&"--metrics-auth".to_string()),
                "{}: {args:?}",
                c.name
            );
            assert!(
                args.iter()
                    .any(|a| a.starts_with("--metrics-tls-cert-file=/etc/csiops/metrics-tls/")),
                "{}: {args:?}",
                c.name
            );
        }
        // Every HTTP probe of a pod with our sidecars speaks HTTPS now.
        for c in &p.containers {
            if let Some(get) = c.liveness_probe.as_ref().and_then(|p| p.http_get.as_ref()) {
                assert_eq!(get.scheme.as_deref(), Some("HTTPS"), "{}", c.name);
            }
        }
        let volumes = p.volumes.clone().unwrap_or_default();
        let tls = volumes
            .iter()
            .find(|v| v.name == "metrics-tls")
            .and_then(|v| v.secret.as_ref())
            .and_then(|s| s.secret_name.as_deref());
        assert_eq!(tls, Some("hostpath-metrics-tls"));
    }
    // Both ServiceAccounts may review callers.
    for component in [Component::Controller, Component::Node] {
        let rules = serde_json::to_string(&cluster_rules(&r, component)).expect("json");
        assert!(rules.contains("tokenreviews"), "{rules}");
        assert!(rules.contains("subjectaccessreviews"), "{rules}");
    }
    let svc = r.metrics_service.as_ref().expect("a metrics Service");
    let spec = svc.spec.as_ref().expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    let ports: Vec<_> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| p.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(ports, ["provisioner", "registrar-http", "healthz"]);
    let pm = r.pod_monitor.as_ref().expect("a PodMonitor");
    let endpoints = &pm.data["spec"]["podMetricsEndpoints"];
    assert_eq!(endpoints.as_array().map(Vec::len), Some(3));
    assert_eq!(endpoints[0]["scheme"], "https");
    assert_eq!(
        endpoints[0]["authorization"]["credentials"]["name"],
        "prometheus-scraper"
    );
    assert_eq!(
        pm.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("release"))
            .map(String::as_str),
        Some("prometheus")
    );
}

#[test]
fn a_service_without_metrics_auth_is_plain_http_and_no_pod_monitor_unless_enabled() {
    let mut obj = central();
    obj.spec.monitoring = Some(Default::default());
    let r = must_render(&obj);
    assert!(r.metrics_service.is_some());
    assert!(r.pod_monitor.is_none());
    let provisioner = container(pod(&r, Component::Controller), names::CONTAINER_PROVISIONER);
    let port = provisioner
        .ports
        .iter()
        .flatten()
        .next()
        .expect("a named metrics port");
    assert_eq!(port.name.as_deref(), Some("provisioner"));
    assert!(!provisioner
        .args
        .iter()
        .flatten()
        .any(|a| a == "--metrics-auth"));
}

// ---------------------------------------------------------------- helpers

fn pod(r: &Rendered, component: Component) -> &PodSpec {
    let spec = match component {
        Component::Controller => r.controller.as_ref().and_then(|c| c.template()),
        Component::Node => r.daemonset.spec.as_ref().map(|s| &s.template),
    };
    spec.and_then(|t| t.spec.as_ref())
        .expect("workload has a pod spec")
}

/// The controller StatefulSet (the default kind).
fn sts(r: &Rendered) -> &k8s_openapi::api::apps::v1::StatefulSet {
    r.controller
        .as_ref()
        .and_then(|c| c.statefulset())
        .expect("the controller is a StatefulSet")
}

fn container_names(p: &PodSpec) -> Vec<&str> {
    p.containers.iter().map(|c| c.name.as_str()).collect()
}

fn container<'a>(p: &'a PodSpec, name: &str) -> &'a Container {
    p.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name} in {:?}", container_names(p)))
}

fn mounts_of<'a>(p: &'a PodSpec, volume: &str) -> Vec<(&'a str, &'a str, Option<&'a str>)> {
    p.containers
        .iter()
        .flat_map(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.name == volume)
                .map(move |m| {
                    (
                        c.name.as_str(),
                        m.mount_path.as_str(),
                        m.mount_propagation.as_deref(),
                    )
                })
        })
        .collect()
}

fn host_path<'a>(p: &'a PodSpec, volume: &str) -> (&'a str, Option<&'a str>) {
    let hp = p
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume)
        .and_then(|v| v.host_path.as_ref())
        .unwrap_or_else(|| panic!("no hostPath volume {volume}"));
    (hp.path.as_str(), hp.type_.as_deref())
}

fn env_value<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

// ---------------------------------------------------------------- node wiring

#[test]
fn node_volumes_follow_the_csi_design() {
    for (obj, kubelet) in [
        (central(), "/var/lib/kubelet"),
        (custom(), "/var/lib/k0s/kubelet"),
    ] {
        let r = must_render(&obj);
        let p = pod(&r, Component::Node);
        let driver = &obj.spec.driver_name;
        let sock = &obj.spec.driver.socket_name;

        let names: Vec<_> = p
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .take(3)
            .collect();
        // The operator's three come first; the user's `node.volumes` follow.
        assert_eq!(names, ["socket-dir", "registration-dir", "kubelet-dir"]);

        // registration-dir: only the registrar, at /registration.
        assert_eq!(
            host_path(p, "registration-dir"),
            (
                format!("{kubelet}/plugins_registry/").as_str(),
                Some("Directory")
            )
        );
        assert_eq!(
            mounts_of(p, "registration-dir"),
            [("node-driver-registrar", "/registration", None)]
        );

        // kubelet-dir: only the driver, at the kubelet path, bidirectional.
        assert_eq!(host_path(p, "kubelet-dir"), (kubelet, Some("Directory")));
        assert_eq!(
            mounts_of(p, "kubelet-dir"),
            [("csi-driver", kubelet, Some("Bidirectional"))]
        );

        // socket-dir: the plugin directory, at /csi in every container.
        assert_eq!(
            host_path(p, "socket-dir"),
            (
                format!("{kubelet}/plugins/{driver}/").as_str(),
                Some("DirectoryOrCreate")
            )
        );
        let socket_users: Vec<_> = mounts_of(p, "socket-dir")
            .into_iter()
            .map(|(c, path, _)| {
                assert_eq!(path, "/csi");
                c
            })
            .collect();
        assert_eq!(socket_users, container_names(p));

        let registrar = container(p, "node-driver-registrar");
        let args = registrar.args.clone().unwrap_or_default();
        assert!(
            args.contains(&format!(
                "--kubelet-registration-path={kubelet}/plugins/{driver}/{sock}"
            )),
            "{args:?}"
        );
        assert_eq!(args[0], "registrar");
    }
}

#[test]
fn node_driver_is_privileged_controller_driver_is_not() {
    for obj in [central(), custom()] {
        let r = must_render(&obj);
        let sc = container(pod(&r, Component::Node), "csi-driver")
            .security_context
            .as_ref()
            .expect("node driver has a securityContext");
        assert_eq!(sc.privileged, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(true));
        assert!(container(pod(&r, Component::Controller), "csi-driver")
            .security_context
            .is_none());
    }
}

#[test]
fn driver_env_is_injected_then_merged() {
    let r = must_render(&custom());
    let node = container(pod(&r, Component::Node), "csi-driver");
    let names: Vec<_> = node.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "CSI_ENDPOINT",
            "KUBE_NODE_NAME",
            "LOG_FORMAT",
            "MODE",
            "MAX_VOLUMES"
        ]
    );
    assert_eq!(
        env_value(node, "CSI_ENDPOINT"),
        Some("unix:///csi/block.sock")
    );
    assert_eq!(
        env_value(node, "MODE"),
        Some("node"),
        "node override replaces driver.env"
    );
    assert_eq!(
        node.image.as_deref(),
        Some("registry.example.com/block-csi-node:2.4.1")
    );

    let ctrl = container(pod(&r, Component::Controller), "csi-driver");
    assert_eq!(env_value(ctrl, "MODE"), Some("all"));
    assert_eq!(
        ctrl.image.as_deref(),
        Some("registry.example.com/block-csi:2.4.1")
    );
    assert_eq!(
        ctrl.args.as_deref(),
        Some(
            &[
                "--endpoint=$(CSI_ENDPOINT)".to_string(),
                "--mode=controller".to_string()
            ][..]
        )
    );
    let node_name = ctrl
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "KUBE_NODE_NAME");
    let field = node_name
        .and_then(|e| e.value_from.as_ref())
        .and_then(|s| s.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(field, Some("spec.nodeName"));
}

// ---------------------------------------------------------------- sidecars

#[test]
fn attacher_only_when_attach_required() {
    let r = must_render(&central());
    assert_eq!(
        container_names(pod(&r, Component::Controller)),
        ["csi-driver", "csi-provisioner", "liveness-probe"]
    );
    let rules = serde_json::to_string(&cluster_rules(&r, Component::Controller)).expect("json");
    assert!(
        !rules.contains("volumeattachments/status"),
        "attacher RBAC without attacher"
    );

    let r = must_render(&custom());
    assert_eq!(
        container_names(pod(&r, Component::Controller)),
        ["csi-driver", "csi-provisioner", "csi-attacher"]
    );

    let mut obj = custom();
    obj.spec.sidecars.attacher.enabled = false;
    let r = must_render(&obj);
    assert_eq!(
        container_names(pod(&r, Component::Controller)),
        ["csi-driver", "csi-provisioner"]
    );
}

#[test]
fn disabled_sidecars_are_absent() {
    // Liveness disabled in the custom case: no sidecar, no port, no probe.
    let r = must_render(&custom());
    for component in [Component::Controller, Component::Node] {
        let p = pod(&r, component);
        assert!(!container_names(p).contains(&"liveness-probe"));
        let driver = container(p, "csi-driver");
        assert!(driver.liveness_probe.is_none());
        assert!(driver.ports.is_none());
    }
    assert_eq!(
        container_names(pod(&r, Component::Node)),
        ["csi-driver", "node-driver-registrar"]
    );

    // Liveness enabled in hostpath: wired to the driver's healthz port.
    let r = must_render(&central());
    let driver = container(pod(&r, Component::Node), "csi-driver");
    let probe = driver
        .liveness_probe
        .as_ref()
        .expect("driver liveness probe");
    assert_eq!(
        (probe.failure_threshold, probe.initial_delay_seconds),
        (Some(5), Some(10))
    );
    assert_eq!(
        (probe.timeout_seconds, probe.period_seconds),
        (Some(3), Some(2))
    );
    let port = &driver.ports.as_ref().expect("healthz port")[0];
    assert_eq!(
        (port.name.as_deref(), port.container_port),
        (Some("healthz"), 9808)
    );

    // Everything off: no sidecars, no roles.
    let mut obj = custom();
    obj.spec.sidecars.provisioner.enabled = false;
    obj.spec.sidecars.attacher.enabled = false;
    obj.spec.sidecars.registrar.enabled = false;
    let r = must_render(&obj);
    assert_eq!(
        container_names(pod(&r, Component::Controller)),
        ["csi-driver"]
    );
    assert_eq!(container_names(pod(&r, Component::Node)), ["csi-driver"]);
    assert!(r.cluster_role_bindings.is_empty() && r.role_bindings.is_empty());
    let vols: Vec<_> = pod(&r, Component::Node)
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.clone())
        .collect();
    assert!(
        vols.contains(&"registration-dir".to_string()),
        "volumes stay fixed: {vols:?}"
    );
}

#[test]
fn sidecar_args_start_with_role_and_end_with_extra_args() {
    let r = must_render(&custom());
    let p = pod(&r, Component::Controller);
    let prov = container(p, "csi-provisioner")
        .args
        .clone()
        .unwrap_or_default();
    assert_eq!(
        prov,
        [
            "provisioner",
            "--csi-address=/csi/block.sock",
            "--v=4",
            "--timeout=60s",
            "--leader-election",
            "--leader-election-namespace=$(NAMESPACE)",
            "--http-endpoint=:9809",
            "--extra-create-metadata",
            // csiDriver.storageCapacity: true, a StatefulSet controller.
            "--enable-capacity",
            "--capacity-ownerref-level=1",
            "--worker-threads=20",
            "--strict-topology",
        ]
    );
    let att = container(p, "csi-attacher");
    let args = att.args.clone().unwrap_or_default();
    assert_eq!(args[0], "attacher");
    assert!(args.contains(&"--http-endpoint=:9810".to_string()));
    assert!(!args.contains(&"--extra-create-metadata".to_string()));
    assert_eq!(
        att.image.as_deref(),
        Some("registry.example.com/csiops-sidecar:v0.1.0")
    );
    assert_eq!(att.image_pull_policy.as_deref(), Some("Always"));
    let env: Vec<_> = att.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(env, ["CSIOPS_DRIVER_NAME", "NAMESPACE", "RUST_LOG"]);
    // The name the driver must answer GetPluginInfo with.
    assert_eq!(
        env_value(att, "CSIOPS_DRIVER_NAME"),
        Some("block.csi.example.com")
    );

    // Without spec.sidecars.image the operator's image is used.
    let r = must_render(&central());
    let prov = container(pod(&r, Component::Controller), "csi-provisioner");
    assert_eq!(
        prov.image.as_deref(),
        Some("ghcr.io/csiops/csiops-sidecar:v0.1.0")
    );
}

/// (apiGroup, resource, verbs joined) of the controller's rules in the
/// driver's namespace.
fn role_rules(r: &Rendered) -> Vec<(String, String, String)> {
    namespace_rules(r, Component::Controller)
        .iter()
        .map(|rule| {
            (
                rule.api_groups.clone().unwrap_or_default().join(","),
                rule.resources.clone().unwrap_or_default().join(","),
                rule.verbs.join(","),
            )
        })
        .collect()
}

fn owned(pairs: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    pairs
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect()
}

#[test]
fn storage_capacity_turns_on_publishing_with_its_owner_env_and_rbac() {
    const CAPACITY_RULE: (&str, &str, &str) = (
        "storage.k8s.io",
        "csistoragecapacities",
        "create,delete,get,list,patch,update,watch",
    );
    const LEASES: (&str, &str, &str) = (
        "coordination.k8s.io",
        "leases",
        "create,get,list,patch,update,watch",
    );
    const EVENTS: (&str, &str, &str) = ("", "events", "create,patch");
    // The provisioner's intent journal.
    const JOURNAL: (&str, &str, &str) = ("", "configmaps", "create,get,patch");
    // The key that seals its entries.
    const JOURNAL_KEY: (&str, &str, &str) = ("", "secrets", "create,get");

    // Off (the hostpath example): no flag, no POD_NAME, leader election and
    // the journal only.
    let r = must_render(&central());
    let prov = container(pod(&r, Component::Controller), names::CONTAINER_PROVISIONER);
    let args = prov.args.clone().unwrap_or_default();
    assert!(!args.iter().any(|a| a.contains("capacity")), "{args:?}");
    let env: Vec<_> = prov.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(env, ["CSIOPS_DRIVER_NAME", "NAMESPACE"]);
    assert_eq!(
        role_rules(&r),
        owned(&[JOURNAL, EVENTS, JOURNAL_KEY, LEASES])
    );

    // On with a StatefulSet: owner one level up, pods readable.
    let mut obj = central();
    obj.spec.csi_driver.storage_capacity = true;
    let r = must_render(&obj);
    let prov = container(pod(&r, Component::Controller), names::CONTAINER_PROVISIONER);
    let args = prov.args.clone().unwrap_or_default();
    assert_eq!(
        args.iter()
            .filter(|a| a.contains("capacity"))
            .collect::<Vec<_>>(),
        ["--enable-capacity", "--capacity-ownerref-level=1"]
    );
    let env: Vec<_> = prov.env.iter().flatten().collect();
    assert_eq!(
        env.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["CSIOPS_DRIVER_NAME", "NAMESPACE", "POD_NAME"]
    );
    let pod_name = env[2]
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(pod_name, Some("metadata.name"));
    assert_eq!(
        role_rules(&r),
        owned(&[
            JOURNAL,
            EVENTS,
            ("", "pods", "get"),
            JOURNAL_KEY,
            LEASES,
            CAPACITY_RULE,
        ])
    );
    assert_eq!(r.csi_driver.spec.pinned.storage_capacity, Some(true));

    // On with a Deployment: two levels up (pod → ReplicaSet → Deployment),
    // ReplicaSets readable.
    obj.spec.controller.kind = csiops_crds::ControllerKind::Deployment;
    let r = must_render(&obj);
    let prov = container(pod(&r, Component::Controller), names::CONTAINER_PROVISIONER);
    assert!(prov
        .args
        .iter()
        .flatten()
        .any(|a| a == "--capacity-ownerref-level=2"));
    assert_eq!(
        role_rules(&r),
        owned(&[
            JOURNAL,
            EVENTS,
            ("", "pods", "get"),
            JOURNAL_KEY,
            ("apps", "replicasets", "get"),
            LEASES,
            CAPACITY_RULE,
        ])
    );

    // Without the provisioner nothing publishes, so nothing is granted.
    obj.spec.sidecars.provisioner.enabled = false;
    let r = must_render(&obj);
    if !r.role_bindings.is_empty() {
        assert_eq!(role_rules(&r), owned(&[EVENTS, LEASES]));
    }
}

#[test]
fn capacity_switch_and_owner_level_are_managed() {
    for arg in ["--enable-capacity", "--capacity-ownerref-level=-1"] {
        let mut obj = central();
        obj.spec.sidecars.provisioner.extra_args.push(arg.into());
        let err = render(&obj, &cfg()).expect_err(arg);
        assert!(matches!(err, RenderError::ManagedFlag { .. }), "{err:?}");
    }
    // The tuning flags are the user's.
    let mut obj = central();
    obj.spec.csi_driver.storage_capacity = true;
    obj.spec.sidecars.provisioner.extra_args.extend([
        "--capacity-poll-interval=30s".into(),
        "--capacity-for-immediate-binding".into(),
    ]);
    let r = must_render(&obj);
    let args = container(pod(&r, Component::Controller), names::CONTAINER_PROVISIONER)
        .args
        .clone()
        .unwrap_or_default();
    assert_eq!(
        &args[args.len() - 2..],
        [
            "--capacity-poll-interval=30s",
            "--capacity-for-immediate-binding"
        ]
    );
}

// ---------------------------------------------------------------- hashes

#[test]
fn hash_follows_the_driver_image_not_storage_classes() {
    let base = must_render(&central());
    assert_eq!(base.controller_hash.len(), 16);
    let annotation = |r: &Rendered| {
        sts(r)
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TEMPLATE_HASH))
            .cloned()
    };
    assert_eq!(annotation(&base), Some(base.controller_hash.clone()));
    assert_eq!(
        base.daemonset
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TEMPLATE_HASH)),
        Some(&base.node_hash)
    );
    assert_eq!(must_render(&central()), base, "rendering is deterministic");

    let mut obj = central();
    obj.spec.driver.image = "registry.k8s.io/sig-storage/hostpathplugin:v1.18.0".into();
    let r = must_render(&obj);
    assert_ne!(r.controller_hash, base.controller_hash);
    assert_ne!(r.node_hash, base.node_hash);

    let mut obj = central();
    obj.spec.storage_classes[0].allow_volume_expansion = false;
    obj.spec
        .storage_classes
        .push(obj.spec.storage_classes[0].clone());
    obj.spec.storage_classes[1].name = "another".into();
    let r = must_render(&obj);
    assert_eq!(r.controller_hash, base.controller_hash);
    assert_eq!(r.node_hash, base.node_hash);
    assert_eq!(r.storage_classes.len(), 2);
}

/// `csiDriver.tokenRequests`, `nodeAllocatableUpdatePeriodSeconds`,
/// `serviceAccountTokenInSecrets` and `preventPodSchedulingIfMissing` reach
/// the CSIDriver as written, are left out when unset, and change no pod
/// (the CSIDriver is read by kubelet and the scheduler, not by the
/// driver's pods).
#[test]
fn token_requests_and_the_allocatable_period_reach_only_the_csidriver() {
    let base = must_render(&central());
    assert_eq!(base.csi_driver.spec.pinned.token_requests, None);
    assert_eq!(
        base.csi_driver
            .spec
            .pinned
            .node_allocatable_update_period_seconds,
        None
    );
    assert_eq!(
        base.csi_driver.spec.pinned.service_account_token_in_secrets,
        None
    );
    assert_eq!(base.csi_driver.spec.prevent_pod_scheduling_if_missing, None);
    let r = must_render(&custom());
    let tokens = r
        .csi_driver
        .spec
        .pinned
        .token_requests
        .clone()
        .expect("tokens");
    let pairs: Vec<(&str, Option<i64>)> = tokens
        .iter()
        .map(|t| (t.audience.as_str(), t.expiration_seconds))
        .collect();
    assert_eq!(pairs, [("vault.example.com", Some(3600)), ("", None)]);
    assert_eq!(
        r.csi_driver
            .spec
            .pinned
            .node_allocatable_update_period_seconds,
        Some(60)
    );
    assert_eq!(r.csi_driver.spec.pinned.requires_republish, Some(true));
    assert_eq!(
        r.csi_driver.spec.pinned.service_account_token_in_secrets,
        Some(true)
    );
    assert_eq!(
        r.csi_driver.spec.prevent_pod_scheduling_if_missing,
        Some(true)
    );

    let mut obj = central();
    obj.spec.csi_driver.node_allocatable_update_period_seconds = Some(10);
    obj.spec.csi_driver.token_requests = custom().spec.csi_driver.token_requests;
    let changed = must_render(&obj);
    assert_ne!(changed.csi_driver, base.csi_driver);
    assert_eq!(changed.controller_hash, base.controller_hash);
    assert_eq!(changed.node_hash, base.node_hash);

    obj.spec.csi_driver.service_account_token_in_secrets = Some(false);
    obj.spec.csi_driver.prevent_pod_scheduling_if_missing = Some(true);
    let newer = must_render(&obj);
    assert_ne!(newer.csi_driver, changed.csi_driver);
    // serviceAccountTokenInSecrets is the pinned (1.35) API's own field.
    let mut pinned = changed.csi_driver.spec.pinned.clone();
    pinned.service_account_token_in_secrets = Some(false);
    assert_eq!(newer.csi_driver.spec.pinned, pinned);
    assert_eq!(newer.controller_hash, base.controller_hash);
    assert_eq!(newer.node_hash, base.node_hash);
}

#[test]
fn replicas_change_only_the_controller_hash() {
    let base = must_render(&central());
    let mut obj = central();
    obj.spec.controller.replicas = 2;
    let r = must_render(&obj);
    assert_ne!(r.controller_hash, base.controller_hash);
    assert_eq!(r.node_hash, base.node_hash);
}

// ---------------------------------------------------------------- labels

#[test]
fn selectors_never_contain_the_version() {
    let a = must_render(&central());
    let mut obj = central();
    obj.spec.version = "v1.18.0".into();
    let b = must_render(&obj);
    for r in [&a, &b] {
        let sts = sts(r)
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone());
        let ds = r
            .daemonset
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone());
        for (sel, component) in [(sts, "controller"), (ds, "node")] {
            let sel = sel.expect("selector");
            assert!(!sel.contains_key(VERSION_LABEL), "{sel:?}");
            assert_eq!(
                sel.keys().collect::<Vec<_>>(),
                [COMPONENT, INSTANCE, MANAGED_BY]
            );
            assert_eq!(sel[COMPONENT], component);
        }
    }
    assert_eq!(
        sts(&a).spec.as_ref().map(|s| &s.selector),
        sts(&b).spec.as_ref().map(|s| &s.selector)
    );
    // The version is on the pods (label and annotation), so it rolls them.
    let tmpl = b
        .daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .expect("meta");
    assert_eq!(
        tmpl.labels
            .as_ref()
            .and_then(|l| l.get(VERSION_LABEL))
            .map(String::as_str),
        Some("v1.18.0")
    );
    assert_eq!(
        tmpl.annotations
            .as_ref()
            .and_then(|l| l.get(VERSION))
            .map(String::as_str),
        Some("v1.18.0")
    );
    assert_ne!(a.node_hash, b.node_hash);

    // A version that is no valid label value is only an annotation.
    let mut obj = central();
    obj.spec.version = "v1.18.0+build/7".into();
    let labels = labels::common_labels(&obj, Component::Node);
    assert!(!labels.contains_key(VERSION_LABEL));
    must_render(&obj);
}

#[test]
fn ownership_of_namespaced_and_cluster_objects() {
    let r = must_render(&custom());
    for o in objects(&r) {
        let meta = &o["metadata"];
        let kind = o["kind"].as_str().unwrap_or_default();
        if meta["namespace"].is_string() {
            assert_eq!(meta["namespace"], "storage-system");
            let owners = meta["ownerReferences"].as_array().expect("owner refs");
            assert_eq!(owners.len(), 1, "{kind}");
            assert_eq!(owners[0]["kind"], "CSIDriverDeployment");
            assert_eq!(owners[0]["controller"], true);
            assert_eq!(owners[0]["blockOwnerDeletion"], true);
            assert_eq!(meta["labels"][INSTANCE], "block", "{kind}");
        } else {
            assert!(
                meta["ownerReferences"].is_null(),
                "{kind} is cluster-scoped"
            );
            assert_eq!(
                meta["labels"][OWNER_UID], "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
                "{kind}"
            );
            assert_eq!(meta["labels"][MANAGED_BY], "csiops-operator", "{kind}");
        }
    }
    let default: Vec<_> = r
        .storage_classes
        .iter()
        .filter(|sc| {
            sc.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.get(labels::IS_DEFAULT_CLASS).is_some_and(|v| v == "true"))
        })
        .filter_map(|sc| sc.metadata.name.as_deref())
        .collect();
    assert_eq!(default, ["block-fast"]);
    assert_eq!(
        names::cluster_role_binding_name(&custom(), "provisioner"),
        "csiops:block.csi.example.com:provisioner"
    );
}

// ---------------------------------------------------------------- errors

#[test]
fn managed_flags_in_extra_args_are_refused() {
    type Setter = fn(&mut CSIDriverDeployment) -> &mut Vec<String>;
    let cases: [(Setter, &str, &str); 9] = [
        (
            |o| &mut o.spec.sidecars.provisioner.extra_args,
            "--csi-address=/tmp/x.sock",
            "csi-address",
        ),
        (|o| &mut o.spec.sidecars.attacher.extra_args, "-v=9", "v"),
        (
            |o| &mut o.spec.sidecars.provisioner.extra_args,
            "--leader-election-namespace",
            "leader-election-namespace",
        ),
        (
            |o| &mut o.spec.sidecars.registrar.extra_args,
            "--kubelet-registration-path=/x",
            "kubelet-registration-path",
        ),
        (
            |o| &mut o.spec.sidecars.liveness_probe.extra_args,
            "--http-endpoint=:1234",
            "http-endpoint",
        ),
        (
            |o| &mut o.spec.sidecars.registrar.extra_args,
            "-health-port=9809",
            "health-port",
        ),
        (
            |o| &mut o.spec.sidecars.attacher.extra_args,
            "--metrics-address=:8080",
            "metrics-address",
        ),
        // The registrar's node is its pod's.
        (
            |o| &mut o.spec.sidecars.registrar.extra_args,
            "--node-name=other-node",
            "node-name",
        ),
        (
            |o| &mut o.spec.sidecars.registrar.extra_args,
            "-node-name",
            "node-name",
        ),
    ];
    for (field, arg, flag) in cases {
        let mut obj = central();
        field(&mut obj).push(arg.to_string());
        let err = render(&obj, &cfg()).expect_err(arg);
        assert!(matches!(err, RenderError::ManagedFlag { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("--{flag}")), "{msg}");
        assert!(msg.contains("extraArgs"), "{msg}");
    }
    // Flags that merely share a prefix are fine.
    let mut obj = central();
    obj.spec
        .sidecars
        .provisioner
        .extra_args
        .push("--leader-election-lease-duration=30s".into());
    obj.spec.sidecars.registrar.extra_args.push("--v=6".into());
    must_render(&obj);
}

#[test]
fn unusable_objects_are_refused_with_a_reason() {
    let mut obj = central();
    obj.metadata.name = Some("a".repeat(42));
    let msg = render(&obj, &cfg()).expect_err("name too long").to_string();
    assert!(msg.contains("52") && msg.contains("41"), "{msg}");
    obj.metadata.name = Some("a".repeat(41));
    must_render(&obj);

    let mut obj = central();
    obj.spec.node.driver.image = Some(String::new());
    let msg = render(&obj, &cfg()).expect_err("empty image").to_string();
    assert!(msg.contains("spec.node.image"), "{msg}");

    let no_image = RenderConfig {
        sidecar_image: String::new(),
        ..cfg()
    };
    let msg = render(&central(), &no_image)
        .expect_err("no sidecar image")
        .to_string();
    assert!(msg.contains("spec.sidecars.image"), "{msg}");
    let mut obj = central();
    obj.spec.sidecars.provisioner.enabled = false;
    obj.spec.sidecars.registrar.enabled = false;
    obj.spec.sidecars.liveness_probe.enabled = false;
    render(&obj, &no_image).expect("no sidecar, no sidecar image needed");

    let mut obj = central();
    obj.metadata.uid = None;
    assert!(matches!(
        render(&obj, &cfg()),
        Err(RenderError::MissingMetadata { field: "uid" })
    ));

    let mut obj = central();
    obj.spec.node.kubelet_dir = "var/lib/kubelet".into();
    assert!(matches!(
        render(&obj, &cfg()),
        Err(RenderError::InvalidKubeletDir { .. })
    ));
}

// ---------------------------------------------------------------- pod settings

/// The example without its own volumes and mounts, patched with `patch`.
fn with_spec(patch: serde_json::Value) -> CSIDriverDeployment {
    let mut base = central();
    for pod in [&mut base.spec.controller.pod, &mut base.spec.node.pod] {
        pod.volumes.clear();
    }
    base.spec.controller.driver.volume_mounts.clear();
    base.spec.node.driver.volume_mounts.clear();
    let mut v = serde_json::to_value(base).expect("serializes");
    json_merge(&mut v["spec"], patch);
    serde_json::from_value(v).expect("patched object parses")
}

#[test]
fn readiness_taint_is_tolerated_by_node_pods_and_removed_by_the_registrar() {
    let key = "csiops.dev/driver-not-ready.hostpath.csi.k8s.io";
    let tolerates = |p: &PodSpec| {
        p.tolerations.iter().flatten().any(|t| {
            t.key.as_deref() == Some(key)
                && t.operator.as_deref() == Some("Exists")
                && t.effect.as_deref() == Some("NoSchedule")
        })
    };
    let flag = format!("--readiness-taint-key={key}");

    let on = must_render(&with_spec(serde_json::json!({
        "node": {"readinessTaint": true, "tolerations": [{"key": "example.com/gpu", "operator": "Exists"}]}
    })));
    let node = pod(&on, Component::Node);
    assert!(tolerates(node), "{:?}", node.tolerations);
    // The user's tolerations stay, first.
    assert_eq!(
        node.tolerations.as_ref().map(|t| t[0].key.as_deref()),
        Some(Some("example.com/gpu"))
    );
    let registrar = container(node, names::CONTAINER_REGISTRAR);
    assert!(registrar.args.iter().flatten().any(|a| *a == flag));
    // The controller does not need it: it starts after the node side registered.
    assert!(!tolerates(pod(&on, Component::Controller)));

    let off = must_render(&with_spec(serde_json::json!({})));
    let node = pod(&off, Component::Node);
    assert!(!tolerates(node));
    let registrar = container(node, names::CONTAINER_REGISTRAR);
    assert!(!registrar
        .args
        .iter()
        .flatten()
        .any(|a| a.starts_with("--readiness-taint-key")));
}

fn json_merge(into: &mut Value, patch: Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                json_merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

#[test]
fn pod_settings_volumes_mounts_and_security_context_are_rendered() {
    let obj = with_spec(serde_json::json!({
        "node": {
            "hostNetwork": true,
            "hostPID": true,
            "podLabels": {"team": "storage"},
            "podAnnotations": {"example.com/scrape": "true"},
            "volumes": [
                {"name": "dev-dir", "hostPath": {"path": "/dev", "type": "Directory"}},
                {"name": "modules", "hostPath": {"path": "/lib/modules"}}
            ],
            "volumeMounts": [
                {"name": "dev-dir", "mountPath": "/dev", "mountPropagation": "HostToContainer"},
                {"name": "modules", "mountPath": "/lib/modules", "readOnly": true}
            ],
            "securityContext": {"privileged": true, "capabilities": {"add": ["SYS_ADMIN"]}}
        },
        "controller": {
            "dnsPolicy": "Default",
            "volumes": [{"name": "config", "configMap": {"name": "driver-config"}}],
            "volumeMounts": [{"name": "config", "mountPath": "/etc/driver"}]
        },
        "sidecars": {
            "registrar": {"volumeMounts": [{"name": "dev-dir", "mountPath": "/dev"}]},
            "provisioner": {"volumeMounts": [{"name": "config", "mountPath": "/etc/driver"}]}
        }
    }));
    let r = must_render(&obj);

    let node = pod(&r, Component::Node);
    assert_eq!(node.host_network, Some(true));
    assert_eq!(node.host_pid, Some(true));
    // hostNetwork without a dnsPolicy keeps cluster DNS.
    assert_eq!(node.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    let volumes: Vec<&str> = node
        .volumes
        .iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(
        volumes,
        [
            names::VOLUME_SOCKET_DIR,
            names::VOLUME_REGISTRATION_DIR,
            names::VOLUME_KUBELET_DIR,
            names::VOLUME_API_ACCESS,
            "dev-dir",
            "modules"
        ]
    );
    assert_eq!(host_path(node, "dev-dir"), ("/dev", Some("Directory")));
    assert_eq!(
        mounts_of(node, "dev-dir"),
        [
            (names::CONTAINER_DRIVER, "/dev", Some("HostToContainer")),
            (names::CONTAINER_REGISTRAR, "/dev", None)
        ]
    );
    let driver = container(node, names::CONTAINER_DRIVER);
    let sc = driver.security_context.as_ref().expect("security context");
    assert_eq!(sc.privileged, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().and_then(|c| c.add.clone()),
        Some(vec!["SYS_ADMIN".to_string()])
    );
    // The operator's mounts come first and stay.
    assert_eq!(
        mounts_of(node, names::VOLUME_KUBELET_DIR),
        [(
            names::CONTAINER_DRIVER,
            "/var/lib/kubelet",
            Some("Bidirectional")
        )]
    );
    let tmpl = r
        .daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .expect("template meta");
    let labels = tmpl.labels.as_ref().expect("labels");
    assert_eq!(labels["team"], "storage");
    assert_eq!(labels[INSTANCE], "hostpath");
    let annotations = tmpl.annotations.as_ref().expect("annotations");
    assert_eq!(annotations["example.com/scrape"], "true");
    assert_eq!(annotations[VERSION], "v1.17.0");

    let ctrl = pod(&r, Component::Controller);
    assert_eq!(ctrl.dns_policy.as_deref(), Some("Default"));
    assert_eq!(ctrl.host_network, None);
    assert_eq!(
        mounts_of(ctrl, "config"),
        [
            (names::CONTAINER_DRIVER, "/etc/driver", None),
            (names::CONTAINER_PROVISIONER, "/etc/driver", None)
        ]
    );
    // Pod settings are pod content: they roll the pods.
    let base = must_render(&central());
    assert_ne!(r.node_hash, base.node_hash);
    assert_ne!(r.controller_hash, base.controller_hash);
}

#[test]
fn collisions_with_what_the_operator_manages_are_refused_naming_both() {
    let cases = [
        (
            serde_json::json!({"node": {"volumes": [{"name": "socket-dir", "emptyDir": {}}]}}),
            vec![
                "spec.node.volumes[0].name",
                "\"socket-dir\"",
                "CSI socket directory",
            ],
        ),
        (
            serde_json::json!({"node": {"volumes": [{"name": "kubelet-dir", "emptyDir": {}}]}}),
            vec!["spec.node.volumes[0].name", "kubelet directory"],
        ),
        (
            serde_json::json!({"controller": {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/csi"}]}}),
            vec![
                "spec.controller.volumeMounts[0].mountPath",
                "\"/csi\"",
                "CSI socket directory",
            ],
        ),
        (
            serde_json::json!({"node": {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/var/lib/kubelet/"}]}}),
            vec!["spec.node.volumeMounts[0].mountPath", "kubeletDir"],
        ),
        (
            serde_json::json!({
                "node": {"volumes": [{"name": "x", "emptyDir": {}}]},
                "sidecars": {"registrar": {"volumeMounts": [{"name": "x", "mountPath": "/registration"}]}}}),
            vec![
                "spec.sidecars.registrar.volumeMounts[0].mountPath",
                "registration directory",
            ],
        ),
        (
            serde_json::json!({"node": {"podLabels": {"app.kubernetes.io/instance": "x"}}}),
            vec![
                "spec.node.podLabels",
                "app.kubernetes.io/instance",
                "selects its pods by",
            ],
        ),
        (
            serde_json::json!({"controller": {"podAnnotations": {"csiops.dev/version": "x"}}}),
            vec!["spec.controller.podAnnotations", "csiops.dev/version"],
        ),
        (
            serde_json::json!({"node": {"volumes": [
                {"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}}),
            vec!["spec.node.volumes[1].name", "spec.node.volumes[0]"],
        ),
        (
            serde_json::json!({"node": {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}}),
            vec!["spec.node.volumeMounts[0]", "\"nope\"", "spec.node.volumes"],
        ),
        (
            // The controller's volumes are not the node's.
            serde_json::json!({
                "controller": {"volumes": [{"name": "cfg", "emptyDir": {}}]},
                "sidecars": {"registrar": {"volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}}}),
            vec![
                "spec.sidecars.registrar.volumeMounts[0]",
                "spec.node.volumes",
            ],
        ),
        (
            serde_json::json!({"node": {"securityContext": {"runAsUser": 0}}}),
            vec![
                "spec.node.securityContext",
                "Bidirectional",
                "privileged: true",
            ],
        ),
        (
            serde_json::json!({"controller": {
                "volumes": [{"name": "m", "hostPath": {"path": "/mnt"}}],
                "volumeMounts": [{"name": "m", "mountPath": "/mnt", "mountPropagation": "Bidirectional"}]}}),
            vec!["spec.controller.securityContext", "/mnt"],
        ),
    ];
    for (patch, expect) in cases {
        let obj = with_spec(patch.clone());
        let msg = render(&obj, &cfg())
            .expect_err(&patch.to_string())
            .to_string();
        for e in expect {
            assert!(msg.contains(e), "{patch}: {msg:?} should contain {e:?}");
        }
    }
    // Mounting an operator-managed volume elsewhere is allowed.
    let obj = with_spec(serde_json::json!({
        "sidecars": {"registrar": {"volumeMounts": [{"name": "kubelet-dir", "mountPath": "/kubelet", "readOnly": true}]}}
    }));
    must_render(&obj);
}

// ---------------------------------------------------------------- hostpath facts

/// The example runs hostpathplugin as upstream's deploy/kubernetes-distributed
/// does: one pod per node with the driver, a node-deployment provisioner,
/// the registrar and the liveness probe; no controller.
#[test]
fn hostpath_example_has_what_hostpathplugin_needs() {
    let obj = example();
    let r = must_render(&obj);
    assert!(r.controller.is_none(), "no controller workload");
    assert!(r.controller_service_account.is_none());
    assert!(namespace_rules(&r, Component::Controller).is_empty());
    let node = pod(&r, Component::Node);
    assert_eq!(
        container_names(node),
        [
            names::CONTAINER_DRIVER,
            names::CONTAINER_PROVISIONER,
            names::CONTAINER_REGISTRAR,
            names::CONTAINER_LIVENESS_PROBE
        ]
    );
    let driver = container(node, names::CONTAINER_DRIVER);

    assert_eq!(
        driver.args.as_deref(),
        Some(
            &[
                "--drivername=hostpath.csi.k8s.io".to_string(),
                "--v=5".to_string(),
                "--endpoint=$(CSI_ENDPOINT)".to_string(),
                "--nodeid=$(KUBE_NODE_NAME)".to_string(),
            ][..]
        )
    );
    assert_eq!(
        env_value(driver, "CSI_ENDPOINT"),
        Some("unix:///csi/csi.sock")
    );
    assert_eq!(field_ref(driver, "KUBE_NODE_NAME"), Some("spec.nodeName"));
    assert_eq!(
        driver.image.as_deref(),
        Some("registry.k8s.io/sig-storage/hostpathplugin:v1.18.0")
    );
    // Privileged: Bidirectional propagation and loop devices need it.
    assert_eq!(
        driver.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );

    // Data dir (hostpathplugin's --statedir) and /dev from the host, at
    // upstream's paths, in the driver only.
    assert_eq!(
        host_path(node, "csi-data-dir"),
        ("/var/lib/csi-hostpath-data/", Some("DirectoryOrCreate"))
    );
    assert_eq!(host_path(node, "dev-dir"), ("/dev", Some("Directory")));
    assert_eq!(
        mounts_of(node, "csi-data-dir"),
        [(names::CONTAINER_DRIVER, "/csi-data-dir", None)]
    );
    assert_eq!(
        mounts_of(node, "dev-dir"),
        [(names::CONTAINER_DRIVER, "/dev", None)]
    );
    // Upstream's mountpoint dir (<kubelet>/pods) and plugins dir
    // (<kubelet>/plugins), both Bidirectional: covered by the kubelet
    // directory mounted at the same path, Bidirectional.
    assert_eq!(
        mounts_of(node, names::VOLUME_KUBELET_DIR),
        [(
            names::CONTAINER_DRIVER,
            "/var/lib/kubelet",
            Some("Bidirectional")
        )]
    );
    // Its health: kubelet probes the driver through the liveness-probe sidecar.
    let probe = driver.liveness_probe.as_ref().expect("liveness probe");
    assert_eq!(
        probe.http_get.as_ref().and_then(|g| g.path.as_deref()),
        Some("/healthz")
    );

    // The provisioner of upstream's distributed DaemonSet.
    let prov = container(node, names::CONTAINER_PROVISIONER);
    let args = prov.args.clone().unwrap_or_default();
    for flag in [
        "--node-deployment",
        "--strict-topology=true",
        "--immediate-topology=false",
        "--enable-capacity",
        "--capacity-ownerref-level=0",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--leader-election")));
    assert_eq!(field_ref(prov, "NODE_NAME"), Some("spec.nodeName"));
    assert_eq!(field_ref(prov, "NAMESPACE"), Some("metadata.namespace"));
    assert_eq!(field_ref(prov, "POD_NAME"), Some("metadata.name"));

    // CSIDriver as upstream's distributed driverinfo; a late-binding class.
    let csi = &r.csi_driver.spec.pinned;
    assert_eq!(csi.attach_required, Some(false));
    assert_eq!(csi.storage_capacity, Some(true));
    assert_eq!(csi.pod_info_on_mount, Some(true));
    assert_eq!(csi.fs_group_policy.as_deref(), Some("File"));
    let sc = &r.storage_classes[0];
    assert_eq!(sc.metadata.name.as_deref(), Some("csi-hostpath-sc"));
    assert_eq!(sc.provisioner, "hostpath.csi.k8s.io");
    assert_eq!(
        sc.volume_binding_mode.as_deref(),
        Some("WaitForFirstConsumer")
    );
    assert_eq!(sc.allow_volume_expansion, Some(false));
}

/// The distributed example maps upstream's flags: its capacity kinds reach
/// the driver, its classes select them, `--worker-threads=5` the provisioner.
#[test]
fn distributed_example_maps_upstreams_capacity_and_classes() {
    let r = must_render(&distributed());
    let node = pod(&r, Component::Node);
    let driver = container(node, names::CONTAINER_DRIVER);
    let args = driver.args.clone().unwrap_or_default();
    assert!(args.contains(&"--capacity=slow=10Gi".to_string()));
    assert!(args.contains(&"--capacity=fast=100Gi".to_string()));
    let prov = container(node, names::CONTAINER_PROVISIONER);
    let pargs = prov.args.clone().unwrap_or_default();
    assert_eq!(pargs.last().map(String::as_str), Some("--worker-threads=5"));
    assert!(pargs.contains(&"--v=5".to_string()));
    let kinds: Vec<_> = r
        .storage_classes
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                c.parameters.clone().unwrap_or_default()["kind"].clone(),
                c.volume_binding_mode.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (
                "csi-hostpath-fast".to_string(),
                "fast".to_string(),
                "WaitForFirstConsumer".to_string()
            ),
            (
                "csi-hostpath-slow".to_string(),
                "slow".to_string(),
                "WaitForFirstConsumer".to_string()
            ),
        ]
    );
}

fn field_ref<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str())
}

// ---------------------------------------------------------------- node-local topology

/// The central fixture switched to node-local, without its controller settings.
fn node_local() -> CSIDriverDeployment {
    let mut obj = central();
    obj.spec.topology = csiops_crds::Topology::NodeLocal;
    obj.spec.controller = Default::default();
    obj.spec.csi_driver.attach_required = false;
    obj
}

fn args_of(c: &Container) -> Vec<String> {
    c.args.clone().unwrap_or_default()
}

#[test]
fn node_local_runs_the_provisioner_in_every_node_pod_and_no_controller() {
    let mut obj = node_local();
    obj.spec.sidecars.provisioner.extra_args = vec![
        "--worker-threads=5".into(),
        // Upstream's recommendation may be overridden: the user's come last.
        "--strict-topology=false".into(),
    ];
    let r = must_render(&obj);
    assert!(r.controller.is_none());
    assert_eq!(r.controller_hash, "");
    let node = pod(&r, Component::Node);
    let prov = container(node, names::CONTAINER_PROVISIONER);
    let args = args_of(prov);
    assert_eq!(
        args,
        [
            "provisioner",
            "--csi-address=/csi/csi.sock",
            "--v=2",
            "--timeout=60s",
            "--http-endpoint=:9815",
            "--node-deployment",
            "--extra-create-metadata",
            "--strict-topology=true",
            "--immediate-topology=false",
            "--worker-threads=5",
            "--strict-topology=false",
        ]
    );
    // Its own port: the registrar listens on 9809 in the same pod.
    let registrar = container(node, names::CONTAINER_REGISTRAR);
    assert!(args_of(registrar).contains(&"--http-endpoint=:9809".to_string()));
    // NODE_NAME is what node deployment needs; NAMESPACE as everywhere; no
    // POD_NAME without capacity.
    let env: Vec<_> = prov.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(env, ["CSIOPS_DRIVER_NAME", "NODE_NAME", "NAMESPACE"]);
    assert_eq!(
        mounts_of(node, "socket-dir")[1],
        ("csi-provisioner", "/csi", None)
    );
    // The provisioner gets the ServiceAccount token (the journal's
    // namespace is the ServiceAccount's, read from it); the driver does not.
    assert_eq!(
        mounts_of(node, names::VOLUME_API_ACCESS),
        [
            (names::CONTAINER_PROVISIONER, API_ACCESS_MOUNT, None),
            (names::CONTAINER_REGISTRAR, API_ACCESS_MOUNT, None),
        ]
    );

    // Never surges: a second driver on the node's state would fight the first.
    let rolling = r
        .daemonset
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .expect("rolling update");
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(0)));
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(1)));
    // A central driver's DaemonSet is rendered as before (no maxSurge).
    let central_ds = must_render(&central()).daemonset;
    let rolling = central_ds
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .expect("rolling update");
    assert_eq!(rolling.max_surge, None);
}

#[test]
fn node_local_grants_the_node_service_account_what_its_provisioner_calls() {
    let mut obj = node_local();
    let r = must_render(&obj);
    // No controller: no controller role, no leader election, no controller SA.
    assert!(r.controller_service_account.is_none());
    assert!(!r
        .role_bindings
        .iter()
        .any(|b| b.role_ref.name == rbac::LEADER_ELECTION_ROLE.name));
    let role_names: Vec<_> = r
        .cluster_role_bindings
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                c.role_ref.name.clone(),
            )
        })
        .collect();
    assert_eq!(
        role_names,
        [
            (
                "csiops:hostpath.csi.k8s.io:node-provisioner".to_string(),
                "csiops:node-provisioner".to_string()
            ),
            (
                "csiops:hostpath.csi.k8s.io:registrar".to_string(),
                "csiops:registrar".to_string()
            )
        ]
    );
    let node_rules = triples_of(&cluster_rules(&r, Component::Node));
    let want: std::collections::BTreeSet<_> =
        [rbac::REGISTRAR_GRANTS, rbac::NODE_PROVISIONER_GRANTS]
            .iter()
            .flat_map(|set| set.iter())
            .flat_map(|g| {
                g.verbs.iter().map(|v| {
                    (
                        g.api_group.to_string(),
                        g.resource.to_string(),
                        v.to_string(),
                    )
                })
            })
            .collect();
    assert_eq!(node_rules, want);
    let binding = &r.cluster_role_bindings[0];
    let subject = &binding.subjects.as_ref().expect("subjects")[0];
    assert_eq!(subject.name, "hostpath-node");

    // Its namespaced grants: the journal only; with capacity, the capacity
    // objects and its own pod (the owner, level 0). No Leases.
    let rules = |r: &Rendered| triples_of(&namespace_rules(r, Component::Node));
    let journal = ["create", "get", "patch"]
        .map(|v| ("".to_string(), "configmaps".to_string(), v.to_string()))
        .into_iter()
        .chain(["create", "get"].map(|v| ("".to_string(), "secrets".to_string(), v.to_string())))
        .collect::<Vec<_>>();
    assert_eq!(rules(&r), journal.iter().cloned().collect());
    assert_eq!(r.role_bindings.len(), 1);
    let binding = &r.role_bindings[0];
    assert_eq!(binding.metadata.name.as_deref(), Some("hostpath-journal"));
    assert_eq!(binding.role_ref.name, "csiops:provisioner-journal");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        binding.subjects.as_ref().map(|s| s[0].name.as_str()),
        Some("hostpath-node")
    );
    obj.spec.csi_driver.storage_capacity = true;
    let r = must_render(&obj);
    let with_capacity = rules(&r);
    assert!(with_capacity.contains(&("".into(), "pods".into(), "get".into())));
    assert!(with_capacity.contains(&(
        "storage.k8s.io".into(),
        "csistoragecapacities".into(),
        "create".into()
    )));
    assert!(!with_capacity
        .iter()
        .any(|(_, res, _)| res == "leases" || res == "replicasets"));
    let prov = container(pod(&r, Component::Node), names::CONTAINER_PROVISIONER);
    assert!(args_of(prov).contains(&"--capacity-ownerref-level=0".to_string()));
    assert_eq!(field_ref(prov, "POD_NAME"), Some("metadata.name"));

    // Without the provisioner the node pods need no namespaced grant.
    obj.spec.sidecars.provisioner.enabled = false;
    let r = must_render(&obj);
    assert!(r.role_bindings.is_empty());
    assert!(!container_names(pod(&r, Component::Node)).contains(&names::CONTAINER_PROVISIONER));
    // A central driver grants its node pods nothing in the namespace.
    assert!(namespace_rules(&must_render(&central()), Component::Node).is_empty());
}

fn triples_of(
    rules: &[k8s_openapi::api::rbac::v1::PolicyRule],
) -> std::collections::BTreeSet<(String, String, String)> {
    let mut out = std::collections::BTreeSet::new();
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
fn node_deployment_is_a_managed_flag_in_both_topologies() {
    for mut obj in [central(), node_local()] {
        obj.spec
            .sidecars
            .provisioner
            .extra_args
            .push("--node-deployment=false".into());
        let err = render(&obj, &cfg()).expect_err("managed");
        assert!(matches!(err, RenderError::ManagedFlag { .. }), "{err:?}");
        assert!(err.to_string().contains("--node-deployment"), "{err}");
    }
    // --leader-election is managed too: node instances elect no leader.
    let mut obj = node_local();
    obj.spec
        .sidecars
        .provisioner
        .extra_args
        .push("--leader-election".into());
    assert!(render(&obj, &cfg()).is_err());
    // Its tuning flags are the user's.
    let mut obj = node_local();
    obj.spec.sidecars.provisioner.extra_args.extend([
        "--node-deployment-immediate-binding=false".into(),
        "--node-deployment-base-delay=5s".into(),
    ]);
    must_render(&obj);
}

#[test]
fn node_local_refuses_what_needs_controller_pods_naming_the_field() {
    type Edit = fn(&mut CSIDriverDeployment);
    let cases: [(Edit, &str); 5] = [
        (
            |o| o.spec.csi_driver.attach_required = true,
            "spec.csiDriver.attachRequired",
        ),
        (
            |o| o.spec.controller.replicas = 2,
            "spec.controller.replicas",
        ),
        (
            |o| o.spec.controller.pod.host_network = true,
            "spec.controller.hostNetwork",
        ),
        (
            |o| o.spec.sidecars.snapshotter.enabled = true,
            "spec.sidecars.snapshotter.enabled",
        ),
        (
            |o| {
                o.spec.sidecars.extra.push(
                    serde_json::from_value(serde_json::json!({"name": "x", "image": "x:1"}))
                        .expect("extra parses"),
                )
            },
            "spec.sidecars.extra[0].pod",
        ),
    ];
    for (edit, field) in cases {
        let mut obj = node_local();
        edit(&mut obj);
        let err = render(&obj, &cfg()).expect_err(field);
        assert!(matches!(err, RenderError::NodeLocal { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.starts_with(field), "{msg}");
        assert!(msg.contains("NodeLocal"), "{msg}");
    }
    // An extra container in the node pods is fine.
    let mut obj = node_local();
    obj.spec.sidecars.extra.push(
        serde_json::from_value(serde_json::json!({"name": "x", "image": "x:1", "pod": "Node"}))
            .expect("extra parses"),
    );
    let r = must_render(&obj);
    assert!(container_names(pod(&r, Component::Node)).contains(&"x"));
}

#[test]
fn a_node_local_provisioners_mounts_name_node_volumes() {
    let mut obj = node_local();
    obj.spec.sidecars.provisioner.volume_mounts = vec![serde_json::from_value(
        serde_json::json!({"name": "csi-data-dir", "mountPath": "/data", "readOnly": true}),
    )
    .expect("mount parses")];
    let r = must_render(&obj);
    assert!(
        mounts_of(pod(&r, Component::Node), "csi-data-dir").contains(&(
            names::CONTAINER_PROVISIONER,
            "/data",
            None
        ))
    );
    // A controller volume is no volume of the node pods.
    obj.spec.sidecars.provisioner.volume_mounts[0].name = "nowhere".into();
    let err = render(&obj, &cfg()).expect_err("unknown volume");
    assert!(err.to_string().contains("spec.node.volumes"), "{err}");
}

#[test]
fn node_local_monitoring_covers_the_node_provisioner() {
    let mut obj = node_local();
    obj.spec.monitoring = Some(
        serde_json::from_value(
            serde_json::json!({"metricsAuth": true, "podMonitor": {"enabled": true}}),
        )
        .expect("monitoring parses"),
    );
    let r = must_render(&obj);
    let node = pod(&r, Component::Node);
    let prov = container(node, names::CONTAINER_PROVISIONER);
    assert_eq!(
        prov.ports
            .as_ref()
            .map(|p| (p[0].name.as_deref(), p[0].container_port)),
        Some((Some("provisioner"), 9815))
    );
    assert!(args_of(prov).contains(&"--metrics-auth".to_string()));
    // The reviews are granted to the node ServiceAccount, to nobody else.
    let node_role = triples_of(&cluster_rules(&r, Component::Node));
    assert!(node_role.contains(&(
        "authentication.k8s.io".into(),
        "tokenreviews".into(),
        "create".into()
    )));
    let auth = r
        .cluster_role_bindings
        .iter()
        .find(|b| b.role_ref.name == rbac::METRICS_AUTH_ROLE.name)
        .expect("metrics-auth binding");
    let subjects: Vec<_> = auth
        .subjects
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(subjects, ["hostpath-node"]);
    let service = r.metrics_service.as_ref().expect("metrics service");
    let ports: Vec<_> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| p.name.as_deref())
        .collect();
    assert!(ports.contains(&"provisioner"), "{ports:?}");
}

#[test]
fn node_local_readiness_taint_and_topology_switch() {
    let mut obj = node_local();
    obj.spec.node.readiness_taint = true;
    let r = must_render(&obj);
    let node = pod(&r, Component::Node);
    let key = "csiops.dev/driver-not-ready.hostpath.csi.k8s.io";
    assert!(node
        .tolerations
        .iter()
        .flatten()
        .any(|t| t.key.as_deref() == Some(key)));
    assert!(args_of(container(node, names::CONTAINER_REGISTRAR))
        .contains(&format!("--readiness-taint-key={key}")));
    // Switching the topology changes the node side (the provisioner comes
    // or goes), hence a node roll.
    let mut central_too = central();
    central_too.spec.csi_driver.attach_required = false;
    central_too.spec.controller = Default::default();
    assert_ne!(
        must_render(&central_too).node_hash,
        must_render(&node_local()).node_hash
    );
}

// ---------------------------------------------------------------- controller kind

#[test]
fn controller_kind_deployment_renders_the_same_pod_as_a_deployment() {
    let sts_render = must_render(&central());
    let mut obj = central();
    obj.spec.controller.kind = csiops_crds::ControllerKind::Deployment;
    obj.spec.controller.replicas = 2;
    let r = must_render(&obj);
    let workload = r.controller.as_ref().expect("a controller workload");
    let deploy = workload.deployment().expect("a Deployment");
    assert!(workload.statefulset().is_none());
    assert_eq!(deploy.metadata.name.as_deref(), Some("hostpath-controller"));
    let spec = deploy.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(
        spec.selector,
        sts(&sts_render).spec.as_ref().expect("spec").selector,
        "same selector, so the pods of either kind are found the same way"
    );
    // Every controller sidecar elects a leader: two replicas never both act.
    let p = pod(&r, Component::Controller);
    let args = container(p, names::CONTAINER_PROVISIONER)
        .args
        .clone()
        .unwrap_or_default();
    assert!(args.iter().any(|a| a == "--leader-election"), "{args:?}");
    assert_eq!(
        deploy
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TEMPLATE_HASH)),
        Some(&r.controller_hash)
    );
    // Switching kinds is a controller-only change.
    assert_ne!(r.controller_hash, sts_render.controller_hash);
    assert_eq!(r.node_hash, sts_render.node_hash);
}

// ---------------------------------------------------------------- helpers and extra containers

/// The hostpath example with the three upstream helpers on (as upstream's
/// csi-driver-host-path deploys them), one customised, and a vendor sidecar
/// in each pod.
fn with_helpers() -> CSIDriverDeployment {
    let mut v = serde_json::to_value(central()).expect("serializes");
    json_merge(
        &mut v["spec"]["sidecars"],
        serde_json::json!({
            "resizer": {"enabled": true},
            "snapshotter": {
                "enabled": true,
                "image": "registry.example.com/csi-snapshotter:v8.6.0",
                "imagePullPolicy": "IfNotPresent",
                "extraArgs": ["--worker-threads=4"],
                "env": [{"name": "GOMAXPROCS", "value": "2"}],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                "volumeMounts": [{"name": "csi-data-dir", "mountPath": "/data", "readOnly": true}]
            },
            "healthMonitor": {"enabled": true},
            "extra": [
                {
                    "name": "csi-addons",
                    "image": "quay.io/csiaddons/k8s-sidecar:v0.12.0",
                    "args": ["--csi-addons-address=/csi/csi-addons.sock"],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
                },
                {
                    "name": "csi-addons",
                    "pod": "Node",
                    "image": "quay.io/csiaddons/k8s-sidecar:v0.12.0",
                    "command": ["/usr/bin/csi-addons"],
                    "volumeMounts": [{"name": "dev-dir", "mountPath": "/dev"}],
                    "securityContext": {"privileged": true}
                }
            ]
        }),
    );
    serde_json::from_value(v).expect("patched object parses")
}

#[test]
fn golden_helpers() {
    check_golden("helpers", &with_helpers());
}

/// (apiGroup, resource, verb) triples of the controller's cluster-wide rules.
fn controller_rule_triples(r: &Rendered) -> std::collections::BTreeSet<(String, String, String)> {
    let rules = cluster_rules(r, Component::Controller);
    assert!(!rules.is_empty(), "the controller is granted something");
    let mut out = std::collections::BTreeSet::new();
    for rule in &rules {
        for g in rule.api_groups.iter().flatten() {
            for res in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.insert((g.clone(), res.clone(), verb.clone()));
                }
            }
        }
    }
    out
}

/// (apiGroup, resource, verbs), as an upstream rbac.yaml writes a rule.
type UpstreamRule = (&'static str, &'static str, &'static [&'static str]);

fn triples(rules: &[UpstreamRule]) -> std::collections::BTreeSet<(String, String, String)> {
    rules
        .iter()
        .flat_map(|(g, r, verbs)| {
            verbs
                .iter()
                .map(move |v| (g.to_string(), r.to_string(), v.to_string()))
        })
        .collect()
}

/// Each helper adds exactly the ClusterRole rules of its upstream
/// repository's RBAC at the pinned tag (written out here, independently of
/// `render::rbac`, so a change there must agree with upstream's files).
#[test]
fn helper_rbac_is_upstreams_cluster_role() {
    const R: &[&str] = &["get", "list", "watch"];
    let upstream: [(&str, Vec<UpstreamRule>); 3] = [
        // external-resizer v2.2.1 deploy/kubernetes/rbac.yaml
        (
            "resizer",
            vec![
                ("", "persistentvolumes", &["get", "list", "watch", "patch"]),
                ("", "persistentvolumeclaims", R),
                ("", "pods", R),
                ("", "persistentvolumeclaims/status", &["patch"]),
                (
                    "",
                    "events",
                    &["list", "watch", "create", "update", "patch"],
                ),
                ("storage.k8s.io", "volumeattributesclasses", R),
            ],
        ),
        // external-snapshotter v8.6.0 deploy/kubernetes/csi-snapshotter/rbac-csi-snapshotter.yaml
        (
            "snapshotter",
            vec![
                (
                    "",
                    "events",
                    &["list", "watch", "create", "update", "patch"],
                ),
                ("snapshot.storage.k8s.io", "volumesnapshotclasses", R),
                (
                    "snapshot.storage.k8s.io",
                    "volumesnapshotcontents",
                    &["get", "list", "watch", "update", "patch"],
                ),
                (
                    "snapshot.storage.k8s.io",
                    "volumesnapshotcontents/status",
                    &["update", "patch"],
                ),
                (
                    "groupsnapshot.storage.k8s.io",
                    "volumegroupsnapshotclasses",
                    R,
                ),
                (
                    "groupsnapshot.storage.k8s.io",
                    "volumegroupsnapshotcontents",
                    &["get", "list", "watch", "update", "patch"],
                ),
                (
                    "groupsnapshot.storage.k8s.io",
                    "volumegroupsnapshotcontents/status",
                    &["update", "patch"],
                ),
            ],
        ),
        // external-health-monitor v0.18.0 deploy/kubernetes/external-health-monitor-controller/rbac.yaml
        (
            "healthMonitor",
            vec![
                ("", "persistentvolumes", R),
                ("", "persistentvolumeclaims", R),
                ("", "nodes", R),
                ("", "pods", R),
                ("", "events", &["get", "list", "watch", "create", "patch"]),
            ],
        ),
    ];
    // Only the controller sidecars we bundle can be turned off: each helper
    // alone then renders exactly its upstream rules.
    let mut base = central();
    base.spec.sidecars.provisioner.enabled = false;
    base.spec.sidecars.attacher.enabled = false;
    for (key, rules) in &upstream {
        let mut v = serde_json::to_value(&base).expect("serializes");
        v["spec"]["sidecars"][key] = serde_json::json!({"enabled": true});
        let obj: CSIDriverDeployment = serde_json::from_value(v).expect("parses");
        let r = must_render(&obj);
        assert_eq!(controller_rule_triples(&r), triples(rules), "{key}");
        // Helpers elect a leader too: leases are granted with only a helper on.
        assert!(
            role_rules(&r).iter().any(|(_, res, _)| res == "leases"),
            "{key}"
        );
    }
    // With the bundled sidecars, the role is the union.
    let r = must_render(&with_helpers());
    let all = controller_rule_triples(&r);
    for (key, rules) in &upstream {
        let missing: Vec<_> = triples(rules).difference(&all).cloned().collect();
        assert!(missing.is_empty(), "{key}: {missing:?}");
    }
    // Nothing of the helpers reaches the node's role.
    let node_role = serde_json::to_string(&cluster_rules(&r, Component::Node)).expect("json");
    assert!(!node_role.contains("snapshot"), "{node_role}");
}

#[test]
fn helpers_run_in_the_controller_pod_with_the_standard_flags() {
    let r = must_render(&with_helpers());
    let p = pod(&r, Component::Controller);
    assert_eq!(
        container_names(p),
        [
            "csi-driver",
            "csi-provisioner",
            "csi-resizer",
            "csi-snapshotter",
            "csi-external-health-monitor-controller",
            "liveness-probe",
            "csi-addons",
        ]
    );
    let resizer = container(p, names::CONTAINER_RESIZER);
    assert_eq!(
        resizer.image.as_deref(),
        Some("registry.k8s.io/sig-storage/csi-resizer:v2.2.1")
    );
    assert_eq!(
        resizer.args.clone().unwrap_or_default(),
        [
            "--csi-address=/csi/csi.sock",
            "--v=2",
            "--timeout=60s",
            "--leader-election",
            "--leader-election-namespace=$(NAMESPACE)",
            "--http-endpoint=:9811",
        ]
    );
    let ns = resizer
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NAMESPACE")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    assert_eq!(ns, Some("metadata.namespace"));
    assert_eq!(
        container(p, names::CONTAINER_HEALTH_MONITOR)
            .image
            .as_deref(),
        Some("registry.k8s.io/sig-storage/csi-external-health-monitor-controller:v0.18.0")
    );

    // The user's settings, after the operator's.
    let snap = container(p, names::CONTAINER_SNAPSHOTTER);
    assert_eq!(
        snap.image.as_deref(),
        Some("registry.example.com/csi-snapshotter:v8.6.0")
    );
    assert_eq!(snap.image_pull_policy.as_deref(), Some("IfNotPresent"));
    let args = snap.args.clone().unwrap_or_default();
    assert_eq!(args.last().map(String::as_str), Some("--worker-threads=4"));
    assert!(args.contains(&"--http-endpoint=:9812".to_string()));
    assert_eq!(env_value(snap, "GOMAXPROCS"), Some("2"));
    assert_eq!(
        mounts_of(p, "csi-data-dir"),
        [
            (names::CONTAINER_DRIVER, "/csi-data-dir", None),
            (names::CONTAINER_SNAPSHOTTER, "/data", None)
        ]
    );

    // Every HTTP endpoint in the pod has its own port.
    let mut ports: Vec<String> = p
        .containers
        .iter()
        .flat_map(|c| c.args.iter().flatten())
        .filter_map(|a| a.strip_prefix("--http-endpoint=:").map(str::to_string))
        .collect();
    // Provisioner, three helpers, liveness probe (hostpath needs no attacher).
    assert_eq!(ports.len(), 5, "{ports:?}");
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 5, "HTTP ports collide: {ports:?}");
    // Nor with the attacher's, which the hostpath case leaves out.
    let attacher = csiops_operator::render::ATTACHER_HTTP_PORT.to_string();
    assert!(!ports.contains(&attacher), "{ports:?}");

    // All of them, and the extra container, share the socket directory.
    let socket_users: Vec<_> = mounts_of(p, names::VOLUME_SOCKET_DIR)
        .into_iter()
        .map(|(c, path, _)| {
            assert_eq!(path, "/csi");
            c
        })
        .collect();
    assert_eq!(socket_users, container_names(p));

    // The extra containers: as written, plus the socket directory first.
    let addons = container(p, "csi-addons");
    assert_eq!(
        addons.args.as_deref(),
        Some(&["--csi-addons-address=/csi/csi-addons.sock".to_string()][..])
    );
    assert!(addons.security_context.is_none());
    let node = pod(&r, Component::Node);
    assert_eq!(
        container_names(node),
        [
            "csi-driver",
            "node-driver-registrar",
            "liveness-probe",
            "csi-addons"
        ]
    );
    let node_addons = container(node, "csi-addons");
    assert_eq!(
        node_addons.command.as_deref(),
        Some(&["/usr/bin/csi-addons".to_string()][..])
    );
    assert_eq!(
        node_addons
            .security_context
            .as_ref()
            .and_then(|s| s.privileged),
        Some(true)
    );
    assert!(mounts_of(node, names::VOLUME_SOCKET_DIR).contains(&("csi-addons", "/csi", None)));
    assert!(mounts_of(node, "dev-dir").contains(&("csi-addons", "/dev", None)));
}

/// Helpers are part of the controller template: enabling one is a
/// controller-only change, which the ordered rollout applies in its
/// controller step without touching the DaemonSet.
#[test]
fn helpers_change_only_the_controller_hash() {
    let base = must_render(&central());
    for key in ["resizer", "snapshotter", "healthMonitor"] {
        let mut v = serde_json::to_value(central()).expect("serializes");
        v["spec"]["sidecars"][key] = serde_json::json!({"enabled": true});
        let obj: CSIDriverDeployment = serde_json::from_value(v).expect("parses");
        let r = must_render(&obj);
        assert_ne!(r.controller_hash, base.controller_hash, "{key}");
        assert_eq!(r.node_hash, base.node_hash, "{key}");

        // So is a new image of a helper.
        let mut v = serde_json::to_value(&obj).expect("serializes");
        v["spec"]["sidecars"][key]["image"] = "registry.example.com/helper:v2".into();
        let obj: CSIDriverDeployment = serde_json::from_value(v).expect("parses");
        let r2 = must_render(&obj);
        assert_ne!(r2.controller_hash, r.controller_hash, "{key}");
        assert_eq!(r2.node_hash, base.node_hash, "{key}");
    }
    // A disabled helper's settings render nothing and change nothing.
    let mut obj = central();
    obj.spec.sidecars.resizer.extra_args = vec!["--workers=3".into()];
    let r = must_render(&obj);
    assert_eq!(r.controller_hash, base.controller_hash);

    // An extra container rolls the pods it runs in, and only those.
    let r = must_render(&with_helpers());
    let mut obj = with_helpers();
    obj.spec.sidecars.extra[1].image = "quay.io/csiaddons/k8s-sidecar:v0.13.0".into();
    let r2 = must_render(&obj);
    assert_eq!(r2.controller_hash, r.controller_hash);
    assert_ne!(r2.node_hash, r.node_hash);
}

#[test]
fn helper_and_extra_container_mistakes_are_refused_naming_them() {
    let cases = [
        (
            serde_json::json!({"sidecars": {"extra": [{"name": "csi-provisioner", "image": "x"}]}}),
            vec![
                "spec.sidecars.extra[0].name",
                "\"csi-provisioner\"",
                "provisioner sidecar",
            ],
        ),
        (
            // A disabled helper's name is still the operator's.
            serde_json::json!({"sidecars": {"extra": [{"name": "csi-resizer", "image": "x"}]}}),
            vec!["spec.sidecars.extra[0].name", "resizer helper"],
        ),
        (
            serde_json::json!({"sidecars": {"extra": [
                {"name": "node-driver-registrar", "image": "x", "pod": "Controller"}]}}),
            vec!["spec.sidecars.extra[0].name", "registrar sidecar"],
        ),
        (
            serde_json::json!({"sidecars": {"extra": [
                {"name": "vendor", "image": "x"}, {"name": "vendor", "image": "y"}]}}),
            vec!["spec.sidecars.extra[1].name", "spec.sidecars.extra[0]"],
        ),
        (
            serde_json::json!({"sidecars": {"extra": [{"name": "Vendor_1", "image": "x"}]}}),
            vec!["spec.sidecars.extra[0].name", "not a valid container name"],
        ),
        (
            serde_json::json!({"sidecars": {"extra": [{"name": "vendor", "image": " "}]}}),
            vec!["spec.sidecars.extra[0].image"],
        ),
        (
            serde_json::json!({"sidecars": {"extra": [
                {"name": "vendor", "image": "x", "volumeMounts": [{"name": "socket-dir", "mountPath": "/csi/"}]}]}}),
            vec![
                "spec.sidecars.extra[0].volumeMounts[0].mountPath",
                "CSI socket directory",
            ],
        ),
        (
            // A node extra container mounts node volumes, not controller ones.
            serde_json::json!({
                "controller": {"volumes": [{"name": "cfg", "emptyDir": {}}]},
                "sidecars": {"extra": [{"name": "vendor", "image": "x", "pod": "Node",
                    "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}]}}),
            vec![
                "spec.sidecars.extra[0].volumeMounts[0]",
                "spec.node.volumes",
            ],
        ),
        (
            serde_json::json!({"sidecars": {"resizer": {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}}}),
            vec![
                "spec.sidecars.resizer.volumeMounts[0]",
                "spec.controller.volumes",
            ],
        ),
        (
            serde_json::json!({"sidecars": {"healthMonitor": {"volumeMounts": [{"name": "socket-dir", "mountPath": "/csi"}]}}}),
            vec!["spec.sidecars.healthMonitor.volumeMounts[0].mountPath"],
        ),
        (
            serde_json::json!({"sidecars": {"snapshotter": {"extraArgs": ["--http-endpoint=:8080"]}}}),
            vec!["spec.sidecars.snapshotter.extraArgs", "--http-endpoint"],
        ),
        (
            serde_json::json!({"sidecars": {"resizer": {"extraArgs": ["-metrics-address", ":8080"]}}}),
            vec!["spec.sidecars.resizer.extraArgs", "--metrics-address"],
        ),
        (
            serde_json::json!({"sidecars": {"healthMonitor": {"image": ""}}}),
            vec!["spec.sidecars.healthMonitor.image"],
        ),
    ];
    for (patch, expect) in cases {
        let obj = with_spec(patch.clone());
        let msg = render(&obj, &cfg())
            .expect_err(&patch.to_string())
            .to_string();
        for e in expect {
            assert!(msg.contains(e), "{patch}: {msg:?} should contain {e:?}");
        }
    }
    // The same name in controller and node pods is fine: they are
    // different pods (csi-addons runs in both).
    let obj = with_spec(serde_json::json!({"sidecars": {"extra": [
        {"name": "vendor", "image": "x"}, {"name": "vendor", "image": "x", "pod": "Node"}]}}));
    must_render(&obj);
}

// ---------------------------------------------------------------- tokens

/// Names of the containers of `p` that see the ServiceAccount token.
fn token_holders(p: &PodSpec) -> Vec<&str> {
    p.containers
        .iter()
        .filter(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == API_ACCESS_MOUNT)
        })
        .map(|c| c.name.as_str())
        .collect()
}

#[test]
fn only_the_containers_that_call_the_api_get_a_service_account_token() {
    let mut obj = with_helpers();
    obj.spec.sidecars.extra = serde_json::from_value(serde_json::json!([
        {"name": "vendor-ctl", "image": "vendor:1"},
        {"name": "vendor-node", "image": "vendor:1", "pod": "Node"},
    ]))
    .expect("extras parse");
    let r = must_render(&obj);
    for component in [Component::Controller, Component::Node] {
        let p = pod(&r, component);
        // Nothing is mounted behind the pod's back.
        assert_eq!(p.automount_service_account_token, Some(false));
        let volume = p
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == names::VOLUME_API_ACCESS)
            .and_then(|v| v.projected.as_ref())
            .expect("the projected token volume");
        let sources = serde_json::to_string(&volume.sources).expect("json");
        for part in [
            "serviceAccountToken",
            "kube-root-ca.crt",
            "metadata.namespace",
        ] {
            assert!(sources.contains(part), "{sources}");
        }
        // Read-only everywhere it is mounted.
        for c in &p.containers {
            for m in c.volume_mounts.iter().flatten() {
                if m.name == names::VOLUME_API_ACCESS {
                    assert_eq!(m.read_only, Some(true), "{}", c.name);
                }
            }
        }
    }
    assert_eq!(
        token_holders(pod(&r, Component::Controller)),
        [
            names::CONTAINER_PROVISIONER,
            names::CONTAINER_RESIZER,
            names::CONTAINER_SNAPSHOTTER,
            names::CONTAINER_HEALTH_MONITOR,
        ]
    );
    assert_eq!(
        token_holders(pod(&r, Component::Node)),
        [names::CONTAINER_REGISTRAR]
    );

    // Asked for: the driver (both pods) and the one extra container.
    obj.spec.driver.mount_service_account_token = true;
    obj.spec.sidecars.extra[1].mount_service_account_token = true;
    let r = must_render(&obj);
    assert!(token_holders(pod(&r, Component::Controller)).contains(&names::CONTAINER_DRIVER));
    assert!(!token_holders(pod(&r, Component::Controller)).contains(&"vendor-ctl"));
    assert_eq!(
        token_holders(pod(&r, Component::Node)),
        [
            names::CONTAINER_DRIVER,
            names::CONTAINER_REGISTRAR,
            "vendor-node"
        ]
    );

    // The liveness probe calls the API only to review metrics callers.
    let r = must_render(&monitored());
    assert!(token_holders(pod(&r, Component::Node)).contains(&names::CONTAINER_LIVENESS_PROBE));

    // Nothing calls the API: no volume at all.
    let mut quiet = custom();
    quiet.spec.sidecars.provisioner.enabled = false;
    quiet.spec.sidecars.attacher.enabled = false;
    quiet.spec.sidecars.registrar.enabled = false;
    let r = must_render(&quiet);
    for component in [Component::Controller, Component::Node] {
        let p = pod(&r, component);
        assert!(token_holders(p).is_empty());
        assert!(!p
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == names::VOLUME_API_ACCESS));
    }
}

#[test]
fn the_token_cannot_be_mounted_around_the_switch() {
    let cases = [
        // A mount of the token volume, by the driver or an extra container.
        serde_json::json!({"node": {"volumeMounts": [{"name": "kube-api-access", "mountPath": "/tok"}]}}),
        serde_json::json!({"sidecars": {"extra": [{"name": "x", "image": "x:1",
            "volumeMounts": [{"name": "kube-api-access", "mountPath": "/tok"}]}]}}),
        // Another volume at the token's path.
        serde_json::json!({"controller": {"volumes": [{"name": "t", "emptyDir": {}}],
            "volumeMounts": [{"name": "t", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount/"}]}}),
        // A volume of the same name.
        serde_json::json!({"node": {"volumes": [{"name": "kube-api-access", "emptyDir": {}}]}}),
    ];
    for patch in cases {
        let obj = with_spec(patch.clone());
        let err = render(&obj, &cfg()).expect_err(&patch.to_string());
        let message = err.to_string();
        assert!(
            message.contains("ServiceAccount token"),
            "{patch}: {message}"
        );
    }
}

#[test]
fn the_registrar_writes_only_its_own_node() {
    let r = must_render(&central());
    let registrar = container(pod(&r, Component::Node), names::CONTAINER_REGISTRAR);
    assert!(args_of(registrar).contains(&"--node-name=$(NODE_NAME)".to_string()));
    assert_eq!(field_ref(registrar, "NODE_NAME"), Some("spec.nodeName"));
    // Neither variable that names a node may come from the spec, in the
    // registrar or the (node) provisioner.
    for (sidecar, var) in [
        ("registrar", "NODE_NAME"),
        ("registrar", "KUBE_NODE_NAME"),
        ("provisioner", "NODE_NAME"),
    ] {
        let obj = with_spec(serde_json::json!({"sidecars": {sidecar: {"env": [
            {"name": "LOG", "value": "1"}, {"name": var, "value": "other-node"}]}}}));
        let err = render(&obj, &cfg()).expect_err(var);
        assert!(matches!(err, RenderError::ManagedEnv { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("spec.sidecars.{sidecar}.env sets {var}"))
                && msg.contains("spec.nodeName"),
            "{msg}"
        );
    }
}

// ------------------------------------------------- maintenance defaults

/// The central fixture with `replicas` controller replicas and `budget`
/// as `spec.controller.disruptionBudget` (`Null`: unset).
fn replicated(replicas: i32, budget: Value) -> CSIDriverDeployment {
    let mut controller = serde_json::json!({"replicas": replicas});
    if !budget.is_null() {
        controller["disruptionBudget"] = budget;
    }
    with_spec(serde_json::json!({ "controller": controller }))
}

#[test]
fn two_controller_replicas_get_a_budget_of_one_unavailable() {
    let obj = replicated(2, Value::Null);
    let r = must_render(&obj);
    let pdb = r
        .controller_disruption_budget
        .as_ref()
        .expect("a budget at 2 replicas");
    assert_eq!(
        pdb.metadata.name.as_deref(),
        Some(names::controller_name(&obj).as_str())
    );
    assert_eq!(pdb.metadata.namespace, obj.metadata.namespace);
    // Owned like every namespaced child: controller owner reference and
    // the managed-by label (the prune and the watch find it by them).
    let owner = pdb
        .metadata
        .owner_references
        .as_ref()
        .and_then(|o| o.first())
        .expect("owner reference");
    assert_eq!(owner.uid, UID);
    assert_eq!(owner.controller, Some(true));
    let meta_labels = pdb.metadata.labels.as_ref().expect("labels");
    assert_eq!(
        meta_labels.get(MANAGED_BY).map(String::as_str),
        Some("csiops-operator")
    );
    let spec = pdb.spec.as_ref().expect("spec");
    assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(spec.min_available, None);
    assert_eq!(
        spec.unhealthy_pod_eviction_policy.as_deref(),
        Some("AlwaysAllow")
    );
    // It selects exactly the controller pods: the workload's own selector,
    // which the pod template carries and the node pods do not match.
    let selector = spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .expect("matchLabels");
    assert_eq!(
        Some(&selector),
        sts(&r)
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.as_ref())
    );
    let template = r
        .controller
        .as_ref()
        .and_then(|c| c.template())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("template labels");
    assert!(selector.iter().all(|(k, v)| template.get(k) == Some(v)));
    let node_labels = r
        .daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .expect("node template labels");
    assert!(!selector.iter().all(|(k, v)| node_labels.get(k) == Some(v)));
    // The same for a Deployment controller.
    let mut deploy = obj.clone();
    deploy.spec.controller.kind = csiops_crds::ControllerKind::Deployment;
    assert!(must_render(&deploy).controller_disruption_budget.is_some());
}

#[test]
fn one_replica_a_disabled_budget_or_node_local_renders_none() {
    assert!(must_render(&replicated(1, Value::Null))
        .controller_disruption_budget
        .is_none());
    assert!(must_render(&replicated(0, Value::Null))
        .controller_disruption_budget
        .is_none());
    let disabled = replicated(3, serde_json::json!({"enabled": false}));
    assert!(must_render(&disabled)
        .controller_disruption_budget
        .is_none());
    // One replica with a minAvailable that would block drains: nothing
    // rendered, nothing refused (it applies once scaled up, if valid then).
    let one = replicated(1, serde_json::json!({"minAvailable": 1}));
    assert!(must_render(&one).controller_disruption_budget.is_none());
    assert!(must_render(&example())
        .controller_disruption_budget
        .is_none());
}

#[test]
fn a_configured_bound_replaces_the_default() {
    let r = must_render(&replicated(3, serde_json::json!({"minAvailable": 2})));
    let spec = r
        .controller_disruption_budget
        .and_then(|p| p.spec)
        .expect("budget");
    assert_eq!(spec.min_available, Some(IntOrString::Int(2)));
    assert_eq!(spec.max_unavailable, None);
    let r = must_render(&replicated(4, serde_json::json!({"maxUnavailable": "50%"})));
    let spec = r
        .controller_disruption_budget
        .and_then(|p| p.spec)
        .expect("budget");
    assert_eq!(
        spec.max_unavailable,
        Some(IntOrString::String("50%".into()))
    );
    assert_eq!(spec.min_available, None);
}

#[test]
fn a_budget_that_would_block_every_drain_is_refused() {
    for budget in [
        serde_json::json!({"minAvailable": 2}),
        serde_json::json!({"minAvailable": "60%"}),
        serde_json::json!({"maxUnavailable": 0}),
        serde_json::json!({"maxUnavailable": 1, "minAvailable": 1}),
    ] {
        let err = render(&replicated(2, budget.clone()), &cfg()).expect_err(&budget.to_string());
        assert!(
            matches!(err, RenderError::DisruptionBudget { .. }),
            "{budget}: {err:?}"
        );
        assert!(
            err.to_string().contains("spec.controller.disruptionBudget"),
            "{err}"
        );
    }
}

#[test]
fn driver_pods_get_the_critical_priority_classes_unless_told_otherwise() {
    let r = must_render(&central());
    assert_eq!(
        pod(&r, Component::Node).priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(
        pod(&r, Component::Controller)
            .priority_class_name
            .as_deref(),
        Some("system-cluster-critical")
    );
    // Node-local: the node pods run the provisioner too; still node-critical.
    let r = must_render(&example());
    assert_eq!(
        pod(&r, Component::Node).priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    // A class of the user's, and "" for none.
    let obj = with_spec(serde_json::json!({
        "controller": {"priorityClassName": ""},
        "node": {"priorityClassName": "storage-critical"}
    }));
    let r = must_render(&obj);
    assert_eq!(
        pod(&r, Component::Node).priority_class_name.as_deref(),
        Some("storage-critical")
    );
    assert_eq!(pod(&r, Component::Controller).priority_class_name, None);
}

#[test]
fn node_affinity_pod_security_context_init_containers_ports_and_hooks_are_rendered() {
    let obj = with_spec(serde_json::json!({
        "node": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]},
                    {"matchExpressions": [{"key": "storage", "operator": "Exists"}]}
                ]}}},
            "podSecurityContext": {"fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [{"name": "load-modules", "image": "registry.example.com/modprobe:1",
                                "args": ["nbd"], "securityContext": {"privileged": true}}],
            "ports": [{"name": "driver-metrics", "containerPort": 9102}],
            "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "rm -rf /csi/csi.sock"]}}}
        },
        "controller": {
            "podSecurityContext": {"runAsNonRoot": true}
        }
    }));
    let r = must_render(&obj);
    let node = pod(&r, Component::Node);
    let terms = &node
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .expect("required node affinity")
        .node_selector_terms;
    assert_eq!(
        terms.len(),
        2,
        "the user's terms, unchanged without a takeover"
    );
    assert_eq!(
        node.security_context.as_ref().and_then(|s| s.fs_group),
        Some(2000)
    );
    let init = node.init_containers.as_ref().expect("init containers");
    assert_eq!(init[0].name, "load-modules");
    let driver = container(node, names::CONTAINER_DRIVER);
    let ports: Vec<i32> = driver
        .ports
        .iter()
        .flatten()
        .map(|p| p.container_port)
        .collect();
    assert_eq!(ports, [9808, 9102], "healthz first, then the driver's own");
    assert!(driver
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .is_some());
    let controller = pod(&r, Component::Controller);
    assert_eq!(
        controller
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_non_root),
        Some(true)
    );
    assert!(controller.init_containers.is_none());

    // A takeover adds its requirement to each of the user's terms.
    let mut adopting = obj.clone();
    adopting.spec.adoption = Some(csiops_crds::AdoptionSpec {
        node_daemon_set: Some("old-node".into()),
        ..Default::default()
    });
    let r = must_render(&adopting);
    let terms = pod(&r, Component::Node)
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .expect("required node affinity")
        .node_selector_terms
        .clone();
    assert_eq!(terms.len(), 2);
    for term in &terms {
        let exprs = term.match_expressions.as_ref().expect("expressions");
        assert_eq!(exprs.len(), 2, "{exprs:?}");
        assert_eq!(exprs[1].operator, "NotIn");
        assert_eq!(
            exprs[1].key,
            csiops_crds::adoption_label_key(&adopting.spec.driver_name)
        );
    }
}

#[test]
fn a_driver_port_the_sidecars_use_is_refused() {
    for (ports, field) in [
        (
            serde_json::json!([{"containerPort": 9809}]),
            "spec.node.ports[0].containerPort",
        ),
        (
            serde_json::json!([{"name": "healthz", "containerPort": 9200}]),
            "spec.node.ports[0].name",
        ),
    ] {
        let obj = with_spec(serde_json::json!({"node": {"ports": ports}}));
        let msg = render(&obj, &cfg()).expect_err(field).to_string();
        assert!(msg.contains(field), "{msg}");
    }
}

#[test]
fn a_port_base_moves_every_sidecar_port_together() {
    let endpoints = |r: &Rendered, component: Component| -> Vec<i32> {
        let p = pod(r, component);
        let mut found: Vec<i32> = p
            .containers
            .iter()
            .flat_map(|c| c.args.iter().flatten())
            .filter_map(|a| a.strip_prefix("--http-endpoint=:"))
            .filter_map(|n| n.parse().ok())
            .chain(
                p.containers
                    .iter()
                    .flat_map(|c| c.ports.iter().flatten())
                    .map(|port| port.container_port),
            )
            .collect();
        found.sort_unstable();
        found.dedup();
        found
    };
    let plain = must_render(&with_spec(serde_json::json!({})));
    let moved = must_render(&with_spec(
        serde_json::json!({"sidecars": {"portBase": 9828}}),
    ));
    for component in [Component::Controller, Component::Node] {
        let before = endpoints(&plain, component);
        let after = endpoints(&moved, component);
        assert!(!before.is_empty());
        assert_eq!(
            after,
            before.iter().map(|p| p + 20).collect::<Vec<_>>(),
            "{component:?}"
        );
    }
    // The driver's own ports are judged against the moved ones.
    let ok = with_spec(
        serde_json::json!({"sidecars": {"portBase": 9828}, "node": {"ports": [{"containerPort": 9809}]}}),
    );
    must_render(&ok);
    let taken = with_spec(
        serde_json::json!({"sidecars": {"portBase": 9828}, "node": {"ports": [{"containerPort": 9829}]}}),
    );
    let msg = render(&taken, &cfg())
        .expect_err("9829 is the registrar's")
        .to_string();
    assert!(msg.contains("spec.node.ports[0].containerPort"), "{msg}");
}

/// Issue 37 §2: the driver's tokens read Secrets only in the namespaces its
/// classes name for the controller side, through a RoleBinding there that
/// the owner labels tie to the object; every namespace only with
/// `secretAccess.clusterWide`; a templated namespace without it is refused.
#[test]
fn secret_reads_are_bound_only_where_the_classes_name_them() {
    let with_classes = |mut obj: CSIDriverDeployment, access: Value| {
        let classes = serde_json::json!([
            {"name": "creds", "parameters": {
                "csi.storage.k8s.io/provisioner-secret-name": "p",
                "csi.storage.k8s.io/provisioner-secret-namespace": "storage-creds",
                "csi.storage.k8s.io/node-stage-secret-name": "n",
                "csi.storage.k8s.io/node-stage-secret-namespace": "node-creds",
            }},
        ]);
        obj.spec.storage_classes = serde_json::from_value(classes).expect("classes");
        obj.spec.secret_access = serde_json::from_value(access).expect("secretAccess");
        obj
    };
    let readers = |r: &Rendered| {
        r.secret_reader_bindings
            .iter()
            .map(|b| {
                let subjects: Vec<_> = b
                    .subjects
                    .iter()
                    .flatten()
                    .map(|s| format!("{}/{}", s.namespace.as_deref().unwrap_or(""), s.name))
                    .collect();
                (
                    b.metadata.namespace.clone().unwrap_or_default(),
                    b.metadata.name.clone().unwrap_or_default(),
                    subjects.join(","),
                )
            })
            .collect::<Vec<_>>()
    };
    let cluster_wide = |r: &Rendered| {
        r.cluster_role_bindings
            .iter()
            .filter(|b| b.role_ref.name == rbac::SECRET_READER_ROLE.name)
            .count()
    };

    // Central: the controller's account, in the provisioner's namespace
    // only (kubelet reads the node-stage Secret).
    let obj = with_classes(central(), serde_json::json!({"namespaces": ["extra"]}));
    let ns = obj.metadata.namespace.clone().expect("namespace");
    let r = must_render(&obj);
    let name = format!("csiops:{}:secret-reader", obj.spec.driver_name);
    assert_eq!(
        readers(&r),
        [
            (
                "extra".to_string(),
                name.clone(),
                format!(
                    "{ns}/{}-controller",
                    obj.metadata.name.clone().unwrap_or_default()
                )
            ),
            (
                "storage-creds".to_string(),
                name.clone(),
                format!(
                    "{ns}/{}-controller",
                    obj.metadata.name.clone().unwrap_or_default()
                )
            ),
        ]
    );
    assert_eq!(cluster_wide(&r), 0);
    for b in &r.secret_reader_bindings {
        assert!(b.metadata.owner_references.is_none(), "{b:?}");
        let labels = b.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(OWNER_UID), obj.metadata.uid.as_ref());
        assert_eq!(b.role_ref.kind, "ClusterRole");
    }
    // No cluster-wide role grants any Secret.
    let (cluster, _) = rbac::effective_rules(&r, Component::Controller);
    assert!(
        !cluster
            .iter()
            .any(|rule| rule.resources.iter().flatten().any(|res| res == "secrets")),
        "{cluster:?}"
    );

    // Node-local: the nodes' account, since their provisioners read it.
    let obj = with_classes(node_local(), serde_json::json!({}));
    let r = must_render(&obj);
    let got = readers(&r);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "storage-creds");
    assert!(got[0].2.ends_with("-node"), "{got:?}");

    // Every namespace, by choice: one ClusterRoleBinding, no RoleBinding.
    let obj = with_classes(central(), serde_json::json!({"clusterWide": true}));
    let r = must_render(&obj);
    assert!(r.secret_reader_bindings.is_empty());
    assert_eq!(cluster_wide(&r), 1);

    // A namespace by template needs that choice; refused without it,
    // naming the class, the key and the switch.
    let mut obj = central();
    obj.spec.storage_classes = serde_json::from_value(serde_json::json!([
        {"name": "tenant", "parameters": {
            "csi.storage.k8s.io/provisioner-secret-name": "creds",
            "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
        }},
    ]))
    .expect("classes");
    let err = render(&obj, &cfg()).expect_err("a templated namespace is refused");
    let msg = err.to_string();
    assert!(
        matches!(err, RenderError::TemplatedSecretNamespace { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("\"tenant\"")
            && msg.contains("provisioner-secret-namespace")
            && msg.contains("spec.secretAccess.clusterWide: true"),
        "{msg}"
    );
    obj.spec.secret_access.namespaces = vec!["Not_A_Namespace".into()];
    obj.spec.secret_access.cluster_wide = true;
    let err = render(&obj, &cfg()).expect_err("a bad namespace name is refused");
    assert!(
        matches!(err, RenderError::SecretNamespace { .. }),
        "{err:?}"
    );
}
