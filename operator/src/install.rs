//! `manifests/install.yaml`: Namespace, CRD, the operator's ServiceAccount and
//! RBAC, and its Deployment — generated here so it cannot drift from the code
//! (a test compares the checked-in file).
//!
//! The sidecars' and helpers' permissions are shipped here as fixed
//! ClusterRoles, one per role (`render::rbac::SHIPPED_ROLES`). The operator
//! holds none of their verbs: Kubernetes lets it bind a role it does not hold
//! when it has `bind` on that role, which it has on exactly these names.
//! So a compromised operator cannot read a Secret, patch a Node or create a
//! PersistentVolume through the API itself (see the README's Security model
//! for what it can still do through the pods it creates).

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, Namespace,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, ServiceAccount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use crate::render::rbac::{self, Grant};

/// Namespace the operator is installed into.
pub const NAMESPACE: &str = "csiops-system";
/// Name of the operator's Deployment, ServiceAccount and RBAC.
pub const NAME: &str = "csiops-operator";
/// Path of the checked-in manifest, relative to the workspace root.
pub const INSTALL_FILE: &str = "manifests/install.yaml";

/// The operator image of this version.
pub fn operator_image() -> String {
    format!(
        "ghcr.io/csiops/csiops-operator:v{}",
        env!("CARGO_PKG_VERSION")
    )
}

const ALL: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];
/// Kinds the operator applies: written, and watched (label-filtered) so an
/// unchanged object costs no request and a deleted one is put back at once.
const WRITE: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// What the operator itself does.
const OPERATOR_GRANTS: &[Grant] = &[
    Grant {
        api_group: "csiops.dev",
        resource: "csidriverdeployments",
        verbs: &["get", "list", "watch", "update", "patch"],
    },
    Grant {
        api_group: "csiops.dev",
        resource: "csidriverdeployments/status",
        verbs: &["get", "update", "patch"],
    },
    Grant {
        api_group: "csiops.dev",
        resource: "csidriverdeployments/finalizers",
        verbs: &["update"],
    },
    Grant {
        api_group: "apps",
        resource: "statefulsets",
        verbs: ALL,
    },
    Grant {
        api_group: "apps",
        resource: "daemonsets",
        verbs: ALL,
    },
    // spec.controller.kind: Deployment.
    Grant {
        api_group: "apps",
        resource: "deployments",
        verbs: ALL,
    },
    Grant {
        api_group: "",
        resource: "pods",
        verbs: &["get", "list", "watch"],
    },
    Grant {
        api_group: "",
        resource: "serviceaccounts",
        verbs: WRITE,
    },
    // Bindings of the shipped roles (never roles: see `bind_rule`).
    Grant {
        api_group: "rbac.authorization.k8s.io",
        resource: "rolebindings",
        verbs: WRITE,
    },
    Grant {
        api_group: "rbac.authorization.k8s.io",
        resource: "clusterrolebindings",
        verbs: WRITE,
    },
    Grant {
        api_group: "storage.k8s.io",
        resource: "csidrivers",
        verbs: WRITE,
    },
    Grant {
        api_group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: WRITE,
    },
    // spec.volumeAttributesClasses, as StorageClasses.
    Grant {
        api_group: "storage.k8s.io",
        resource: "volumeattributesclasses",
        verbs: WRITE,
    },
    Grant {
        api_group: "storage.k8s.io",
        resource: "csinodes",
        verbs: &["get", "list", "watch"],
    },
    // Nodes' readiness taints, counted in status.taintedNodes; patch: a
    // takeover's node labels (spec.adoption), and nothing else of a Node
    // (policy::operator_node_labels).
    Grant {
        api_group: "",
        resource: "nodes",
        verbs: &["get", "list", "watch", "patch"],
    },
    Grant {
        api_group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
    },
    // list/watch: kubelet's FailedMount Events (field-selected by reason)
    // of a driver pod that does not start.
    Grant {
        api_group: "",
        resource: "events",
        verbs: &["create", "patch", "list", "watch"],
    },
    // spec.monitoring: the metrics Service and the PodMonitor.
    Grant {
        api_group: "",
        resource: "services",
        verbs: WRITE,
    },
    Grant {
        api_group: "monitoring.coreos.com",
        resource: "podmonitors",
        verbs: WRITE,
    },
    // The controller's PodDisruptionBudget (spec.controller.disruptionBudget).
    Grant {
        api_group: "policy",
        resource: "poddisruptionbudgets",
        verbs: WRITE,
    },
    // Whether the shipped admission policies are in force (read only:
    // reconcile::watch::admission).
    Grant {
        api_group: "admissionregistration.k8s.io",
        resource: "validatingadmissionpolicies",
        verbs: &["list"],
    },
    Grant {
        api_group: "admissionregistration.k8s.io",
        resource: "validatingadmissionpolicybindings",
        verbs: &["list"],
    },
];

/// `bind` on the shipped roles, by name: what lets the operator create a
/// (Cluster)RoleBinding to a role whose verbs it does not hold. Kubernetes
/// checks it against the binding's namespace, so this one cluster-wide rule
/// covers the RoleBindings of the namespaced roles in every namespace.
pub fn bind_rule() -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec!["rbac.authorization.k8s.io".into()]),
        resources: Some(vec!["clusterroles".into()]),
        resource_names: Some(
            rbac::SHIPPED_ROLES
                .iter()
                .map(|r| r.name.to_string())
                .collect(),
        ),
        verbs: vec!["bind".into()],
        ..PolicyRule::default()
    }
}

/// The operator's ClusterRole rules: its own needs and `bind` on the
/// shipped roles; none of the sidecars' verbs.
pub fn operator_rules() -> Vec<PolicyRule> {
    let mut rules = rbac::merge_rules(&[
        OPERATOR_GRANTS,
        // The operator's own --metrics-auth (TokenReview and
        // SubjectAccessReview, as system:auth-delegator grants).
        crate::render::rbac::METRICS_AUTH_GRANTS,
    ]);
    rules.push(bind_rule());
    rules
}

fn meta(name: &str, namespaced: bool) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespaced.then(|| NAMESPACE.to_string()),
        labels: Some(labels()),
        ..ObjectMeta::default()
    }
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), NAME.to_string()),
        (
            "app.kubernetes.io/part-of".to_string(),
            "csiops".to_string(),
        ),
    ])
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: path.to_string(),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// Scheme of the operator's probes: HTTP, or HTTPS with `--metrics-auth`
/// (the whole admin port speaks TLS then; `/healthz` and `/readyz` stay
/// unauthenticated). The Helm chart switches both with `metricsAuth`.
pub const PROBE_SCHEME: &str = "HTTP";

fn probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("http".into()),
            scheme: Some(PROBE_SCHEME.into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(10),
        ..Probe::default()
    }
}

fn deployment() -> Deployment {
    let selector = BTreeMap::from([("app.kubernetes.io/name".to_string(), NAME.to_string())]);
    let container = Container {
        name: "operator".into(),
        image: Some(operator_image()),
        args: Some(vec![
            "--leader-election=true".into(),
            "--http-endpoint=0.0.0.0:8080".into(),
            "--log-format=json".into(),
            // true: HTTPS, and /metrics only for callers RBAC allows to
            // `get` the nonResourceURL /metrics (set the probes' scheme to
            // HTTPS too; the chart's `metricsAuth` value does both).
            "--metrics-auth=false".into(),
        ]),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: 8080,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(probe("/healthz")),
        readiness_probe: Some(probe("/readyz")),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".into())),
                ("memory".to_string(), Quantity("32Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("256Mi".into()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    Deployment {
        metadata: meta(NAME, true),
        spec: Some(DeploymentSpec {
            // Two replicas: one leads on the Lease, the other takes over within 15s.
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                ..LabelSelector::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                ..DeploymentStrategy::default()
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(selector),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(NAME.into()),
                    containers: vec![container],
                    termination_grace_period_seconds: Some(30),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

fn subject() -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(NAMESPACE.into()),
        ..Subject::default()
    }
}

fn doc<T: Serialize>(obj: &T) -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(obj)
}

/// The objects of an installation, in apply order. The install manifest
/// and the Helm chart ([`crate::helm`]) are both made from these.
pub struct Objects {
    pub namespace: Namespace,
    pub service_account: ServiceAccount,
    /// The sidecars' roles, which the operator binds (`rbac::SHIPPED_ROLES`).
    pub shipped_roles: Vec<ClusterRole>,
    /// Admission policies and their bindings (`crate::policy`).
    pub policies: Vec<(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding)>,
    pub cluster_role: ClusterRole,
    pub cluster_role_binding: ClusterRoleBinding,
    pub lease_role: Role,
    pub lease_role_binding: RoleBinding,
    pub deployment: Deployment,
    /// One operator pod at a time through a drain: the other keeps the
    /// Lease, or takes it over, while the evicted one moves.
    pub disruption_budget: PodDisruptionBudget,
}

/// The installation's objects (the CRD comes from `csiops_crds::crd`).
pub fn objects() -> Objects {
    let lease_name = format!("{NAME}-leader-election");
    Objects {
        namespace: Namespace {
            metadata: meta(NAMESPACE, false),
            ..Namespace::default()
        },
        service_account: ServiceAccount {
            metadata: meta(NAME, true),
            ..ServiceAccount::default()
        },
        shipped_roles: rbac::shipped_cluster_roles(&labels()),
        policies: vec![
            crate::policy::registrar_own_node(&labels()),
            crate::policy::host_access(&labels()),
            crate::policy::host_access_label(&labels()),
            crate::policy::operator_fence(
                &labels(),
                &format!("system:serviceaccount:{NAMESPACE}:{NAME}"),
            ),
            crate::policy::operator_node_labels(
                &labels(),
                &format!("system:serviceaccount:{NAMESPACE}:{NAME}"),
            ),
        ],
        cluster_role: ClusterRole {
            metadata: meta(NAME, false),
            rules: Some(operator_rules()),
            ..ClusterRole::default()
        },
        cluster_role_binding: ClusterRoleBinding {
            metadata: meta(NAME, false),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: NAME.into(),
            },
            subjects: Some(vec![subject()]),
        },
        lease_role: Role {
            metadata: meta(&lease_name, true),
            rules: Some(rbac::merge_rules(&[&[Grant {
                api_group: "coordination.k8s.io",
                resource: "leases",
                verbs: &["get", "list", "watch", "create", "update", "patch"],
            }]])),
        },
        lease_role_binding: RoleBinding {
            metadata: meta(&lease_name, true),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: lease_name.clone(),
            },
            subjects: Some(vec![subject()]),
        },
        deployment: deployment(),
        disruption_budget: disruption_budget(),
    }
}

/// The operator's PodDisruptionBudget: `maxUnavailable: 1`, so a drain
/// evicts its replicas one by one (with one replica it still may, as a
/// budget must not block drains).
fn disruption_budget() -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(NAME, true),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_string(),
                    NAME.to_string(),
                )])),
                ..LabelSelector::default()
            }),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

/// The whole install manifest.
pub fn manifest() -> Result<String, serde_yaml::Error> {
    let o = objects();
    let crd = serde_yaml::to_string(&csiops_crds::crd())?;
    let mut parts = vec![doc(&o.namespace)?, crd, doc(&o.service_account)?];
    for role in &o.shipped_roles {
        parts.push(doc(role)?);
    }
    for (policy, binding) in &o.policies {
        parts.push(doc(policy)?);
        parts.push(doc(binding)?);
    }
    parts.extend([
        doc(&o.cluster_role)?,
        doc(&o.cluster_role_binding)?,
        doc(&o.lease_role)?,
        doc(&o.lease_role_binding)?,
        doc(&o.deployment)?,
        doc(&o.disruption_budget)?,
    ]);
    let mut out = String::from(
        "# csiops: the CSIDriverDeployment CRD and the operator.\n\
         # Generated by `make manifests` from operator/src/install.rs; do not edit by hand.\n\
         #   kubectl apply --server-side -f manifests/install.yaml\n",
    );
    for part in parts {
        out.push_str("---\n");
        out.push_str(&part);
    }
    Ok(out)
}
