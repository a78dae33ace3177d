//! `spec.monitoring`: what the sidecars' metrics need in the pods (flags,
//! the certificate volume, probe schemes, named ports), the RBAC of
//! authenticated metrics, the metrics Service and the PodMonitor.
//!
//! Only our sidecars are covered (provisioner, attacher, registrar,
//! liveness-probe): the upstream helpers know nothing of `--metrics-auth`.

use std::collections::BTreeMap;

use csiops_crds::{MonitoringSpec, PodMonitorSpec};
use k8s_openapi::api::core::v1::{
    ContainerPort, SecretVolumeSource, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ApiResource, DynamicObject};
use serde_json::json;

use super::labels::{Component, INSTANCE, MANAGED_BY, MANAGED_BY_VALUE};
use super::names::metrics_name;
use super::ports::{
    ATTACHER_HTTP_PORT, ATTACHER_PORT_NAME, HEALTHZ_PORT, HEALTHZ_PORT_NAME, PROVISIONER_HTTP_PORT,
    PROVISIONER_PORT_NAME, REGISTRAR_PORT_NAME, REGISTRAR_SERVICE_PORT,
};
use super::{namespaced_meta, Ctx};

/// Volume of the serving certificate (`spec.monitoring.tlsSecretName`).
pub const VOLUME_METRICS_TLS: &str = "metrics-tls";
/// Where the sidecars see the certificate Secret.
pub const METRICS_TLS_MOUNT: &str = "/etc/csiops/metrics-tls";
/// The metrics path the operator leaves at the sidecars' default.
pub const METRICS_PATH: &str = "/metrics";

/// API resource of the Prometheus Operator's PodMonitor.
pub fn pod_monitor_resource() -> ApiResource {
    ApiResource {
        group: "monitoring.coreos.com".into(),
        version: "v1".into(),
        api_version: "monitoring.coreos.com/v1".into(),
        kind: "PodMonitor".into(),
        plural: "podmonitors".into(),
    }
}

fn monitoring<'a>(ctx: &'a Ctx<'_>) -> Option<&'a MonitoringSpec> {
    ctx.spec().monitoring.as_ref()
}

/// Whether the sidecars check their metrics callers.
pub(crate) fn metrics_auth(ctx: &Ctx<'_>) -> bool {
    monitoring(ctx).is_some_and(|m| m.metrics_auth)
}

/// Whether the pods of `component` need the grants of `--metrics-auth`:
/// one of our sidecars runs there and checks its callers.
pub(crate) fn needs_auth_grants(ctx: &Ctx<'_>, component: Component) -> bool {
    let node_provisioner = ctx.node_local() && ctx.provisioner_enabled();
    let ours = match component {
        Component::Controller => {
            !ctx.node_local()
                && (ctx.provisioner_enabled()
                    || ctx.attacher_enabled()
                    || ctx.liveness_probe_enabled())
        }
        Component::Node => {
            ctx.registrar_enabled() || ctx.liveness_probe_enabled() || node_provisioner
        }
    };
    metrics_auth(ctx) && ours
}

/// Flags of every bundled sidecar.
pub(crate) fn sidecar_args(ctx: &Ctx<'_>) -> Vec<String> {
    let Some(m) = monitoring(ctx).filter(|m| m.metrics_auth) else {
        return Vec::new();
    };
    let mut args = vec!["--metrics-auth".to_string()];
    if m.tls_secret_name.is_some() {
        args.push(format!(
            "--metrics-tls-cert-file={METRICS_TLS_MOUNT}/tls.crt"
        ));
        args.push(format!(
            "--metrics-tls-key-file={METRICS_TLS_MOUNT}/tls.key"
        ));
    }
    args
}

/// Mounts of every bundled sidecar: the certificate Secret, read-only.
pub(crate) fn sidecar_mounts(ctx: &Ctx<'_>) -> Vec<VolumeMount> {
    tls_secret(ctx)
        .map(|_| VolumeMount {
            name: VOLUME_METRICS_TLS.to_string(),
            mount_path: METRICS_TLS_MOUNT.to_string(),
            read_only: Some(true),
            ..Default::default()
        })
        .into_iter()
        .collect()
}

/// Pod volumes: the certificate Secret.
pub(crate) fn pod_volumes(ctx: &Ctx<'_>) -> Vec<Volume> {
    tls_secret(ctx)
        .map(|secret| Volume {
            name: VOLUME_METRICS_TLS.to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .into_iter()
        .collect()
}

fn tls_secret<'a>(ctx: &'a Ctx<'_>) -> Option<&'a str> {
    monitoring(ctx)
        .filter(|m| m.metrics_auth)
        .and_then(|m| m.tls_secret_name.as_deref())
}

/// Scheme of the probes that hit a bundled sidecar's HTTP endpoint: HTTPS
/// under `--metrics-auth` (kubelet does not verify the certificate, and
/// `/healthz` needs no token); unset (HTTP) otherwise.
pub(crate) fn probe_scheme(ctx: &Ctx<'_>) -> Option<String> {
    metrics_auth(ctx).then(|| "HTTPS".to_string())
}

/// The named metrics port of a controller sidecar, when monitoring is on
/// (without it nothing changes in the pods, so turning the operator up
/// does not roll drivers that do not use it).
pub(crate) fn metrics_port(ctx: &Ctx<'_>, name: &str, port: i32) -> Option<Vec<ContainerPort>> {
    monitoring(ctx).map(|_| {
        vec![ContainerPort {
            name: Some(name.to_string()),
            container_port: port,
            protocol: Some("TCP".to_string()),
            ..Default::default()
        }]
    })
}

/// The metrics ports of the enabled sidecars: (port name in the pods,
/// Service port).
fn endpoints(ctx: &Ctx<'_>) -> Vec<(&'static str, i32)> {
    let mut ports = Vec::new();
    if ctx.provisioner_enabled() {
        ports.push((PROVISIONER_PORT_NAME, ctx.port(PROVISIONER_HTTP_PORT)));
    }
    if ctx.attacher_enabled() {
        ports.push((ATTACHER_PORT_NAME, ctx.port(ATTACHER_HTTP_PORT)));
    }
    if ctx.registrar_enabled() {
        ports.push((REGISTRAR_PORT_NAME, ctx.port(REGISTRAR_SERVICE_PORT)));
    }
    if ctx.liveness_probe_enabled() {
        ports.push((HEALTHZ_PORT_NAME, ctx.port(HEALTHZ_PORT)));
    }
    ports
}

/// Selects the driver's controller and node pods.
fn pod_selector(ctx: &Ctx<'_>) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (
            INSTANCE.to_string(),
            ctx.obj.metadata.name.clone().unwrap_or_default(),
        ),
    ])
}

/// `<name>-metrics`: a headless Service over the sidecars' metrics ports
/// of controller and node pods, for scrapers that discover endpoints by
/// Service (and `kubectl get endpointslices`). Headless, because metrics
/// are scraped per pod, never load-balanced. `None` without
/// `spec.monitoring` or without a sidecar.
pub(crate) fn service(ctx: &Ctx<'_>) -> Option<Service> {
    monitoring(ctx)?;
    let ports = endpoints(ctx);
    if ports.is_empty() {
        return None;
    }
    Some(Service {
        metadata: namespaced_meta(ctx, metrics_name(ctx.obj), Component::Controller),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(pod_selector(ctx)),
            ports: Some(
                ports
                    .into_iter()
                    .map(|(name, port)| ServicePort {
                        name: Some(name.to_string()),
                        port,
                        target_port: Some(IntOrString::String(name.to_string())),
                        protocol: Some("TCP".to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    })
}

/// One `podMetricsEndpoints` entry.
fn pod_metrics_endpoint(port: &str, metrics_auth: bool, pm: &PodMonitorSpec) -> serde_json::Value {
    let mut endpoint = json!({ "port": port, "path": METRICS_PATH });
    if let Some(interval) = &pm.interval {
        endpoint["interval"] = json!(interval);
    }
    if metrics_auth {
        endpoint["scheme"] = json!("https");
        // Pods are scraped by IP, which no serving certificate names; the
        // caller is authenticated by token, not the target by certificate.
        endpoint["tlsConfig"] = json!({ "insecureSkipVerify": true });
        if let Some(secret) = &pm.bearer_token_secret {
            endpoint["authorization"] = json!({
                "type": "Bearer",
                "credentials": { "name": secret.name, "key": secret.key },
            });
        }
    } else {
        endpoint["scheme"] = json!("http");
    }
    endpoint
}

/// `<name>-metrics`: the PodMonitor, when `spec.monitoring.podMonitor` is
/// enabled. Whether the cluster has the CRD is the reconciler's question.
pub(crate) fn pod_monitor(ctx: &Ctx<'_>) -> Option<DynamicObject> {
    let m = monitoring(ctx)?;
    if !m.pod_monitor.enabled {
        return None;
    }
    let ports = endpoints(ctx);
    if ports.is_empty() {
        return None;
    }
    let mut obj = DynamicObject::new(&metrics_name(ctx.obj), &pod_monitor_resource());
    let mut meta = namespaced_meta(ctx, metrics_name(ctx.obj), Component::Controller);
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in &m.pod_monitor.labels {
        labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    obj.metadata = meta;
    obj.data = json!({
        "spec": {
            "selector": { "matchLabels": pod_selector(ctx) },
            "podMetricsEndpoints": ports
                .iter()
                .map(|(name, _)| pod_metrics_endpoint(name, m.metrics_auth, &m.pod_monitor))
                .collect::<Vec<_>>(),
        }
    });
    Some(obj)
}
