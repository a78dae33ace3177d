//! Pod and workload settings: which volumes the operator creates itself
//! and which become `spec.<workload>.volumes`, the mounts of every
//! container, host namespaces, scheduling, labels and annotations, and the
//! workload's own fields. Also the accounting of what cannot be mapped at
//! all (init containers, other workloads).

use std::collections::BTreeMap;

use csiops_crds::DnsPolicy;
use csiops_operator::render::names::{
    VOLUME_API_ACCESS, VOLUME_KUBELET_DIR, VOLUME_REGISTRATION_DIR, VOLUME_SOCKET_DIR,
};
use csiops_operator::render::API_ACCESS_MOUNT;
use k8s_openapi::api::core::v1::{Container, PodSecurityContext, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use super::classify::{OtherWorkload, Pod, Role, Socket};
use super::{Ctx, Workload};
use crate::input::Object;
use crate::report::{At, Gap, Outcome, Report, What};

/// What becomes of one volume of an input pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// One the operator creates itself (`socket-dir`, …).
    Managed { name: &'static str, what: String },
    /// The pod's ServiceAccount token at the standard path: the operator's
    /// `mountServiceAccountToken`.
    Token,
    /// Carried into `spec.<workload>.volumes` under this name.
    User { name: String },
}

/// What the steps after the pod need to know of it.
#[derive(Clone, Debug)]
pub struct PodPlan {
    pub object: String,
    pub volumes: BTreeMap<String, Fate>,
    pub driver: Option<Container>,
    pub socket: Option<Socket>,
    pub host_network: bool,
}

impl PodPlan {
    pub fn at<'a>(&'a self, container: Option<&'a str>) -> At<'a> {
        At {
            object: &self.object,
            container,
        }
    }
}

/// Labels Helm puts on what it renders; not needed by csiops.
pub const HELM_LABELS: &[&str] = &[
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/name",
    "app.kubernetes.io/component",
    "heritage",
    "release",
    "chart",
];

pub fn is_helm_annotation(key: &str) -> bool {
    key.starts_with("meta.helm.sh/") || key.starts_with("helm.sh/") || key.starts_with("checksum/")
}

const HELM_NOTE: &str = "Helm bookkeeping label, not needed";

/// The labels and annotations of an object's metadata (not a pod's).
pub fn object_metadata(report: &mut Report, at: &At<'_>, meta: &Value) {
    for (key, value) in meta["labels"].as_object().into_iter().flatten() {
        let outcome = if HELM_LABELS.contains(&key.as_str()) {
            Outcome::not_needed(HELM_NOTE)
        } else {
            Outcome::replaced(
                "the operator's labels",
                "the operator labels the objects it creates (app.kubernetes.io/*, csiops.dev/owner-uid)",
            )
        };
        report.push(
            at,
            What::Label,
            key.clone(),
            value.as_str().map(str::to_string),
            outcome,
        );
    }
    for (key, value) in meta["annotations"].as_object().into_iter().flatten() {
        let outcome = if is_helm_annotation(key) {
            Outcome::not_needed("Helm bookkeeping annotation, not needed")
        } else if key.starts_with("deprecated.daemonset.template.generation")
            || key.starts_with("kubectl.kubernetes.io/last-applied-configuration")
            || key.starts_with("deployment.kubernetes.io/")
        {
            Outcome::not_needed("written by Kubernetes or kubectl, not needed")
        } else {
            Outcome::replaced(
                "the operator's annotations",
                "the operator annotates the objects it creates (versions, applied hash)",
            )
        };
        report.push(
            at,
            What::Annotation,
            key.clone(),
            value.as_str().map(str::to_string),
            outcome,
        );
    }
}

fn host_path(v: &Volume) -> Option<String> {
    v.host_path
        .as_ref()
        .map(|h| h.path.trim_end_matches('/').to_string())
        .map(|p| if p.is_empty() { "/".to_string() } else { p })
}

fn is_token_volume(v: &Volume, pod: &Pod<'_>) -> bool {
    let projected_token = v.projected.as_ref().is_some_and(|p| {
        p.sources.iter().flatten().any(|s| {
            s.service_account_token
                .as_ref()
                .is_some_and(|t| t.audience.as_deref().unwrap_or_default().is_empty())
        })
    });
    projected_token
        && pod.spec.containers.iter().all(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.name == v.name)
                .all(|m| m.mount_path.trim_end_matches('/') == API_ACCESS_MOUNT)
        })
}

/// Decides each volume's fate (`kubelet_dir`: kubelet's root on the nodes).
pub fn plan_volumes(
    pod: &Pod<'_>,
    w: Workload,
    kubelet_dir: &str,
    driver_name: &str,
) -> BTreeMap<String, Fate> {
    let kubelet = kubelet_dir.trim_end_matches('/');
    let mut out = BTreeMap::new();
    for v in pod.spec.volumes.iter().flatten() {
        let hp = host_path(v);
        let mounted_as_host = |path: &str| {
            pod.spec.containers.iter().all(|c| {
                c.volume_mounts
                    .iter()
                    .flatten()
                    .filter(|m| m.name == v.name)
                    .all(|m| m.mount_path.trim_end_matches('/') == path)
            })
        };
        let fate = if pod.socket_volume.as_deref() == Some(v.name.as_str()) {
            Fate::Managed {
                name: VOLUME_SOCKET_DIR,
                what: match w {
                    Workload::Controller => "the CSI socket directory (an emptyDir)".into(),
                    Workload::Node => {
                        format!("the CSI socket directory ({kubelet}/plugins/{driver_name}/)")
                    }
                },
            }
        } else if w == Workload::Node
            && hp.as_deref() == Some(format!("{kubelet}/plugins_registry").as_str())
        {
            Fate::Managed {
                name: VOLUME_REGISTRATION_DIR,
                what: format!(
                    "kubelet's plugin registration directory ({kubelet}/plugins_registry/)"
                ),
            }
        } else if let Some(path) = hp.as_deref().filter(|p| {
            w == Workload::Node && (*p == kubelet || p.starts_with(&format!("{kubelet}/")))
        }) {
            if mounted_as_host(path) {
                Fate::Managed {
                    name: VOLUME_KUBELET_DIR,
                    what: format!("the kubelet directory (all of {kubelet}, Bidirectional)"),
                }
            } else {
                user_volume(v)
            }
        } else if is_token_volume(v, pod) {
            Fate::Token
        } else {
            user_volume(v)
        };
        out.insert(v.name.clone(), fate);
    }
    out
}

fn user_volume(v: &Volume) -> Fate {
    let taken = [
        VOLUME_SOCKET_DIR,
        VOLUME_REGISTRATION_DIR,
        VOLUME_KUBELET_DIR,
        VOLUME_API_ACCESS,
    ];
    let name = if taken.contains(&v.name.as_str()) {
        format!("user-{}", v.name)
    } else {
        v.name.clone()
    };
    Fate::User { name }
}

/// Maps one container's mounts to the field `field` (e.g.
/// `spec.node.volumeMounts`); returns them and whether the container
/// mounts the ServiceAccount token.
pub fn map_mounts(
    report: &mut Report,
    plan: &PodPlan,
    c: &Container,
    field: &str,
    extra: bool,
) -> (Vec<VolumeMount>, bool) {
    let at = plan.at(Some(&c.name));
    let mut out = Vec::new();
    let mut token = false;
    for m in c.volume_mounts.iter().flatten() {
        let fate = plan.volumes.get(&m.name).cloned();
        let outcome = match fate {
            Some(Fate::Managed { name, what }) => {
                let at_csi =
                    name == VOLUME_SOCKET_DIR && m.mount_path.trim_end_matches('/') == "/csi";
                if extra && !at_csi {
                    out.push(VolumeMount {
                        name: name.to_string(),
                        ..m.clone()
                    });
                    Outcome::mapped_note(
                        format!("{field}[{}]", out.len() - 1),
                        format!("the operator's volume {name}"),
                    )
                } else {
                    Outcome::replaced(
                        format!("the operator's {name} volume"),
                        format!("the operator mounts {what} itself"),
                    )
                }
            }
            Some(Fate::Token) => {
                token = true;
                Outcome::replaced(
                    "mountServiceAccountToken: true",
                    "the operator mounts a projected ServiceAccount token at the standard path where asked",
                )
            }
            Some(Fate::User { name }) => {
                out.push(VolumeMount { name, ..m.clone() });
                Outcome::mapped(format!("{field}[{}]", out.len() - 1))
            }
            None => Outcome::not_representable(
                format!("the pod has no volume {}", m.name),
                "fix the input: the mount names no volume of its pod",
            ),
        };
        report.push(
            &at,
            What::VolumeMount,
            m.mount_path.clone(),
            Some(m.name.clone()),
            outcome,
        );
    }
    (out, token)
}

/// Every arg, env var, mount, port and probe of a container that cannot be
/// mapped, accounted with the container's `outcome`.
pub fn account_container(
    report: &mut Report,
    at: &At<'_>,
    c: &Container,
    what: What,
    outcome: &Outcome,
) {
    report.push(at, what, c.name.clone(), c.image.clone(), outcome.clone());
    let part = |kind: &str| -> Outcome {
        match outcome {
            Outcome::NotRepresentable { todo, .. } => Outcome::not_representable(
                format!("part of {kind} {}, which is not representable", c.name),
                todo.clone(),
            ),
            other => other.clone(),
        }
    };
    let kind = if what == What::InitContainer {
        "init container"
    } else {
        "container"
    };
    for (i, a) in c.args.iter().flatten().enumerate() {
        report.push(
            at,
            What::Arg,
            format!("args[{i}]"),
            Some(a.clone()),
            part(kind),
        );
    }
    for e in c.env.iter().flatten() {
        report.push(at, What::Env, e.name.clone(), e.value.clone(), part(kind));
    }
    for m in c.volume_mounts.iter().flatten() {
        report.push(
            at,
            What::VolumeMount,
            m.mount_path.clone(),
            Some(m.name.clone()),
            part(kind),
        );
    }
}

/// A workload that is not the driver's: all of it is not representable.
pub fn other_workload(ctx: &mut Ctx, object: &Object, why: OtherWorkload) {
    let id = object.id();
    let at = At {
        object: &id,
        container: None,
    };
    let gap = match why {
        OtherWorkload::Windows => Gap::WindowsDaemonSet,
        OtherWorkload::Unrelated => Gap::OtherWorkload,
    };
    let outcome = Outcome::gap(gap, "");
    ctx.push(&at, What::Object, id.clone(), None, outcome.clone());
    let pod = object
        .value
        .pointer("/spec/template/spec")
        .or_else(|| object.value.pointer("/spec/jobTemplate/spec/template/spec"))
        .or_else(|| object.value.pointer("/spec"))
        .cloned()
        .unwrap_or(Value::Null);
    for (key, what) in [
        ("initContainers", What::InitContainer),
        ("containers", What::Container),
    ] {
        let containers: Vec<Container> =
            serde_json::from_value(pod[key].clone()).unwrap_or_default();
        for c in &containers {
            let at = At {
                object: &id,
                container: Some(&c.name),
            };
            account_container(&mut ctx.report, &at, c, what, &outcome);
        }
    }
    let volumes: Vec<Volume> = serde_json::from_value(pod["volumes"].clone()).unwrap_or_default();
    for v in volumes {
        ctx.push(&at, What::Volume, v.name, None, outcome.clone());
    }
}

/// Maps the pod: volumes, pod settings, labels, the workload's fields, and
/// init containers. The containers are mapped afterwards (driver,
/// sidecars), with the returned plan.
pub fn map_pod(ctx: &mut Ctx, pod: &Pod<'_>, w: Workload) -> PodPlan {
    let plan = PodPlan {
        object: pod.object.id(),
        volumes: plan_volumes(pod, w, &ctx.kubelet_dir, &ctx.driver_name),
        driver: pod.driver().cloned(),
        socket: pod.socket.clone(),
        host_network: pod.spec.host_network == Some(true),
    };
    let at = plan.at(None);
    object_metadata(&mut ctx.report, &at, &pod.object.value["metadata"]);
    workload_fields(ctx, pod, w, &at);
    template_metadata(ctx, pod, w, &at);

    let field = w.field();
    for v in pod.spec.volumes.iter().flatten() {
        let outcome = match plan.volumes.get(&v.name) {
            Some(Fate::Managed { name, what }) => Outcome::mapped_note(
                format!("the operator's {name} volume"),
                format!("created by the operator: {what}"),
            ),
            Some(Fate::Token) => Outcome::replaced(
                "the operator's kube-api-access volume",
                "the operator projects the ServiceAccount token into the containers that ask (mountServiceAccountToken)",
            ),
            Some(Fate::User { name }) => {
                let pod_settings = pod_settings(ctx, w);
                pod_settings.volumes.push(Volume {
                    name: name.clone(),
                    ..v.clone()
                });
                let to = format!("{field}.volumes[{}]", pod_settings.volumes.len() - 1);
                if *name == v.name {
                    Outcome::mapped(to)
                } else {
                    Outcome::mapped_note(to, format!("renamed to {name}: the operator uses {}", v.name))
                }
            }
            None => Outcome::not_needed("unused"),
        };
        ctx.push(&at, What::Volume, v.name.clone(), host_path(v), outcome);
    }

    for c in pod.spec.init_containers.iter().flatten() {
        let at = plan.at(Some(&c.name));
        let settings = pod_settings(ctx, w);
        let i = settings.init_containers.len();
        settings.init_containers.push(c.clone());
        let to = format!("{}.initContainers[{i}]", w.field());
        account_container(
            &mut ctx.report,
            &at,
            c,
            What::InitContainer,
            &Outcome::mapped(to),
        );
    }
    pod_fields(ctx, pod, w, &at);
    plan
}

fn pod_settings(ctx: &mut Ctx, w: Workload) -> &mut csiops_crds::PodSettings {
    match w {
        Workload::Controller => &mut ctx.spec.controller.pod,
        Workload::Node => &mut ctx.spec.node.pod,
    }
}

fn workload_fields(ctx: &mut Ctx, pod: &Pod<'_>, w: Workload, at: &At<'_>) {
    let spec = pod.object.value["spec"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let kind = pod.object.kind.as_str();
    for (key, value) in spec {
        let shown = Some(value.to_string());
        let outcome = match key.as_str() {
            "template" => continue,
            "replicas" if w == Workload::Controller => {
                let replicas = value
                    .as_i64()
                    .and_then(|r| i32::try_from(r).ok())
                    .unwrap_or(1);
                ctx.spec.controller.replicas = replicas;
                Outcome::mapped("spec.controller.replicas")
            }
            "selector" => Outcome::replaced(
                "the operator's selector",
                "the operator selects its pods by its own labels",
            ),
            "serviceName" => Outcome::replaced(
                "the operator's StatefulSet",
                "the controller StatefulSet needs no governing Service",
            ),
            "revisionHistoryLimit"
            | "progressDeadlineSeconds"
            | "minReadySeconds"
            | "podManagementPolicy" => Outcome::replaced(
                "the operator's workload",
                "workload bookkeeping: the operator's workload keeps its own",
            ),
            "updateStrategy" if kind == "DaemonSet" => daemonset_strategy(ctx, &value),
            "strategy" | "updateStrategy" => Outcome::gap(Gap::ControllerUpdateStrategy, ""),
            _ => Outcome::gap(Gap::PodField, format!("{kind} spec.{key}")),
        };
        ctx.push(at, What::Field, format!("spec.{key}"), shown, outcome);
    }
    if w == Workload::Controller && kind == "Deployment" {
        ctx.spec.controller.kind = csiops_crds::ControllerKind::Deployment;
        ctx.report
            .note("the controller is a Deployment: spec.controller.kind: Deployment");
    }
}

fn daemonset_strategy(ctx: &mut Ctx, value: &Value) -> Outcome {
    let rolling = &value["rollingUpdate"];
    let surge = rolling["maxSurge"].clone();
    let surge_zero = surge.is_null() || surge == 0 || surge == "0" || surge == "0%";
    if value["type"] == "OnDelete" {
        return Outcome::gap(
            Gap::DaemonSetSurge,
            "type OnDelete: the operator rolls the nodes itself",
        );
    }
    if !surge_zero {
        return Outcome::gap(Gap::DaemonSetSurge, format!("maxSurge {surge}"));
    }
    match serde_json::from_value::<IntOrString>(rolling["maxUnavailable"].clone()) {
        Ok(mu) if mu != IntOrString::Int(1) => {
            ctx.spec.node.max_unavailable = Some(mu);
            Outcome::mapped("spec.node.maxUnavailable")
        }
        _ => Outcome::mapped_note("spec.node.maxUnavailable", "the default, 1"),
    }
}

fn template_metadata(ctx: &mut Ctx, pod: &Pod<'_>, w: Workload, at: &At<'_>) {
    let meta = pod.template.metadata.clone().unwrap_or_default();
    let field = w.field();
    for (key, value) in meta.labels.unwrap_or_default() {
        let outcome = if HELM_LABELS.contains(&key.as_str()) {
            Outcome::not_needed(HELM_NOTE)
        } else {
            pod_settings(ctx, w)
                .pod_labels
                .insert(key.clone(), value.clone());
            Outcome::mapped(format!("{field}.podLabels"))
        };
        ctx.push(
            at,
            What::Label,
            format!("template {key}"),
            Some(value),
            outcome,
        );
    }
    for (key, value) in meta.annotations.unwrap_or_default() {
        let outcome = if is_helm_annotation(&key) || key == "kubectl.kubernetes.io/restartedAt" {
            Outcome::not_needed(
                "bookkeeping of Helm or kubectl (a restart or config checksum), not needed",
            )
        } else if key == "kubectl.kubernetes.io/default-container" {
            Outcome::replaced(
                "the operator's annotation",
                "the operator names the driver container the default",
            )
        } else {
            pod_settings(ctx, w)
                .pod_annotations
                .insert(key.clone(), value.clone());
            Outcome::mapped(format!("{field}.podAnnotations"))
        };
        ctx.push(
            at,
            What::Annotation,
            format!("template {key}"),
            Some(value),
            outcome,
        );
    }
}

/// Pod spec fields besides containers and volumes.
fn pod_fields(ctx: &mut Ctx, pod: &Pod<'_>, w: Workload, at: &At<'_>) {
    let raw = pod.object.value["spec"]["template"]["spec"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let field = w.field();
    let s = &pod.spec;
    for (key, value) in raw {
        let shown = Some(value.to_string());
        let (what, outcome) = match key.as_str() {
            "containers" | "initContainers" | "volumes" => continue,
            "hostNetwork" => {
                pod_settings(ctx, w).host_network = s.host_network == Some(true);
                (
                    What::PodField,
                    Outcome::mapped(format!("{field}.hostNetwork")),
                )
            }
            "hostPID" => {
                pod_settings(ctx, w).host_pid = s.host_pid == Some(true);
                (What::PodField, Outcome::mapped(format!("{field}.hostPID")))
            }
            "dnsPolicy" => (What::PodField, dns_policy(ctx, w, s.dns_policy.as_deref())),
            "nodeSelector" => {
                let sel = s.node_selector.clone().unwrap_or_default();
                match w {
                    Workload::Controller => ctx.spec.controller.node_selector.extend(sel),
                    Workload::Node => ctx.spec.node.node_selector.extend(sel),
                }
                (
                    What::NodeSelector,
                    Outcome::mapped(format!("{field}.nodeSelector")),
                )
            }
            "tolerations" => {
                for (i, t) in s.tolerations.iter().flatten().enumerate() {
                    match w {
                        Workload::Controller => ctx.spec.controller.tolerations.push(t.clone()),
                        Workload::Node => ctx.spec.node.tolerations.push(t.clone()),
                    }
                    let shown = serde_json::to_string(t).ok();
                    ctx.push(
                        at,
                        What::Toleration,
                        format!("tolerations[{i}]"),
                        shown,
                        Outcome::mapped(format!("{field}.tolerations[{i}]")),
                    );
                }
                continue;
            }
            "affinity" => (What::Affinity, affinity(ctx, pod, w)),
            "priorityClassName" => (
                What::PriorityClass,
                priority_class(ctx, w, s.priority_class_name.as_deref()),
            ),
            "securityContext" => {
                let empty = value.as_object().is_none_or(|o| o.is_empty());
                if empty {
                    (What::SecurityContext, Outcome::not_needed("empty"))
                } else {
                    let field = w.field();
                    let mut psc = s.security_context.clone().unwrap_or_default();
                    let non_root = non_root_keys(pod, &psc);
                    if non_root.contains(&"runAsUser") {
                        psc.run_as_user = None;
                    }
                    if non_root.contains(&"runAsNonRoot") {
                        psc.run_as_non_root = None;
                    }
                    pod_settings(ctx, w).pod_security_context =
                        (psc != PodSecurityContext::default()).then_some(psc);
                    for (k, v) in value.as_object().into_iter().flatten() {
                        let outcome = if non_root.contains(&k.as_str()) {
                            Outcome::gap(Gap::NonRootDriver, format!("pod securityContext.{k}"))
                        } else {
                            Outcome::mapped(format!("{field}.podSecurityContext.{k}"))
                        };
                        ctx.push(
                            at,
                            What::SecurityContext,
                            format!("pod securityContext.{k}"),
                            Some(v.to_string()),
                            outcome,
                        );
                    }
                    continue;
                }
            }
            "serviceAccountName" | "serviceAccount" => (
                What::PodField,
                Outcome::replaced(
                    format!(
                        "ServiceAccount {}{}",
                        ctx.cr_name,
                        match w {
                            Workload::Controller => "-controller",
                            Workload::Node => "-node",
                        }
                    ),
                    "the operator creates the pods' ServiceAccount and binds its roles to it",
                ),
            ),
            "automountServiceAccountToken" => (
                What::PodField,
                Outcome::replaced(
                    "the operator's token handling",
                    "the operator mounts no token automatically; only containers that ask get one",
                ),
            ),
            "imagePullSecrets" => {
                for r in s.image_pull_secrets.iter().flatten() {
                    if !ctx.spec.image_pull_secrets.contains(&r.name) {
                        ctx.spec.image_pull_secrets.push(r.name.clone());
                    }
                }
                (What::PodField, Outcome::mapped("spec.imagePullSecrets"))
            }
            "restartPolicy" if value == "Always" => {
                (What::PodField, Outcome::not_needed("Kubernetes' default"))
            }
            "schedulerName" if value == "default-scheduler" => {
                (What::PodField, Outcome::not_needed("Kubernetes' default"))
            }
            "terminationGracePeriodSeconds" if value == 30 => {
                (What::PodField, Outcome::not_needed("Kubernetes' default"))
            }
            "enableServiceLinks" if value == true => {
                (What::PodField, Outcome::not_needed("Kubernetes' default"))
            }
            _ => (
                What::PodField,
                Outcome::gap(Gap::PodField, format!("pod spec.{key}")),
            ),
        };
        ctx.push(at, what, key, shown, outcome);
    }
}

/// The keys of a pod securityContext that would make the driver container
/// run as a non-root user (`runAsUser` other than 0, `runAsNonRoot: true`)
/// where its own securityContext does not say otherwise. The driver owns
/// its socket; csiops' sidecars run as uid 0 with every capability dropped
/// (docs/security.md), so they could connect only to a root-owned socket.
fn non_root_keys(pod: &Pod<'_>, psc: &PodSecurityContext) -> Vec<&'static str> {
    let driver = pod
        .containers()
        .find(|(role, _)| *role == Role::Driver)
        .and_then(|(_, c)| c.security_context.as_ref());
    // What the driver's own securityContext keeps after the import, which
    // leaves out its non-root settings too (`driver::security_context`).
    let own_user = driver.and_then(|sc| sc.run_as_user).filter(|u| *u == 0);
    let own_non_root = driver.and_then(|sc| sc.run_as_non_root).filter(|n| !n);
    let mut keys = Vec::new();
    if own_user.is_none() && psc.run_as_user.is_some_and(|u| u != 0) {
        keys.push("runAsUser");
    }
    if own_user.is_none() && own_non_root.is_none() && psc.run_as_non_root == Some(true) {
        keys.push("runAsNonRoot");
    }
    keys
}

fn dns_policy(ctx: &mut Ctx, w: Workload, policy: Option<&str>) -> Outcome {
    let parsed = match policy {
        Some("ClusterFirst") => Some(DnsPolicy::ClusterFirst),
        Some("ClusterFirstWithHostNet") => Some(DnsPolicy::ClusterFirstWithHostNet),
        Some("Default") => Some(DnsPolicy::Default),
        Some("None") => Some(DnsPolicy::None),
        _ => None,
    };
    match parsed {
        Some(p) => {
            pod_settings(ctx, w).dns_policy = Some(p);
            Outcome::mapped(format!("{}.dnsPolicy", w.field()))
        }
        None => Outcome::not_representable(
            "an unknown DNS policy",
            "use ClusterFirst, ClusterFirstWithHostNet, Default or None",
        ),
    }
}

fn priority_class(ctx: &mut Ctx, w: Workload, class: Option<&str>) -> Outcome {
    let field = format!("{}.priorityClassName", w.field());
    let default = match w {
        Workload::Controller => csiops_crds::DEFAULT_CONTROLLER_PRIORITY_CLASS,
        Workload::Node => csiops_crds::DEFAULT_NODE_PRIORITY_CLASS,
    };
    match class {
        Some(c) if c == default => Outcome::mapped_note(field, "the operator's default"),
        Some(c) => {
            let c = Some(c.to_string());
            match w {
                Workload::Controller => ctx.spec.controller.priority_class_name = c,
                Workload::Node => ctx.spec.node.priority_class_name = c,
            }
            Outcome::mapped(field)
        }
        None => Outcome::not_needed("no class"),
    }
}

/// Affinity: the controller's maps whole; the node pods' too, except that
/// a required node affinity of one term whose expressions are all `In`
/// with one value reads better as `spec.node.nodeSelector`.
fn affinity(ctx: &mut Ctx, pod: &Pod<'_>, w: Workload) -> Outcome {
    let Some(aff) = pod.spec.affinity.clone() else {
        return Outcome::not_needed("empty");
    };
    if w == Workload::Controller {
        ctx.spec.controller.affinity = Some(aff);
        return Outcome::mapped("spec.controller.affinity");
    }
    let only_node = aff.pod_affinity.is_none()
        && aff.pod_anti_affinity.is_none()
        && aff.node_affinity.as_ref().is_some_and(|n| {
            n.preferred_during_scheduling_ignored_during_execution
                .is_none()
        });
    let terms = aff
        .node_affinity
        .and_then(|n| n.required_during_scheduling_ignored_during_execution)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    let plain: Option<Vec<(String, String)>> = (only_node && terms.len() == 1)
        .then(|| {
            let term = &terms[0];
            if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
                return None;
            }
            term.match_expressions
                .iter()
                .flatten()
                .map(|e| match (e.operator.as_str(), e.values.as_deref()) {
                    ("In", Some([v])) => Some((e.key.clone(), v.clone())),
                    _ => None,
                })
                .collect()
        })
        .flatten();
    match plain {
        Some(pairs) if !pairs.is_empty() => {
            ctx.spec.node.node_selector.extend(pairs);
            Outcome::mapped_note(
                "spec.node.nodeSelector",
                "a required node affinity of plain label matches",
            )
        }
        _ => {
            ctx.spec.node.affinity = pod.spec.affinity.clone();
            Outcome::mapped("spec.node.affinity")
        }
    }
}
