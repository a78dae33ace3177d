//! Labels, annotations and owner references of rendered objects.
//!
//! Selector labels are the contract with the API server: a workload's selector
//! is immutable, so it only ever contains values that never change for the
//! lifetime of a `CSIDriverDeployment` (never the version).

use std::collections::BTreeMap;

use csiops_crds::CSIDriverDeployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

/// Label key naming the tool that manages an object.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`] on everything csiops renders.
pub const MANAGED_BY_VALUE: &str = "csiops-operator";
/// Label key holding the `CSIDriverDeployment` name.
pub const INSTANCE: &str = "app.kubernetes.io/instance";
/// Label key holding the [`Component`] (`controller` or `node`).
pub const COMPONENT: &str = "app.kubernetes.io/component";
/// Label key holding the CSI driver name.
pub const NAME: &str = "app.kubernetes.io/name";
/// Label key holding `spec.version`, set only when it is a valid label value.
pub const VERSION_LABEL: &str = "app.kubernetes.io/version";
/// Label key on cluster-scoped objects: name of the owning `CSIDriverDeployment`.
pub const OWNER_NAME: &str = "csiops.dev/owner-name";
/// Label key on cluster-scoped objects: namespace of the owning `CSIDriverDeployment`.
pub const OWNER_NAMESPACE: &str = "csiops.dev/owner-namespace";
/// Label key on cluster-scoped objects: uid of the owning `CSIDriverDeployment`.
pub const OWNER_UID: &str = "csiops.dev/owner-uid";
/// Annotation on the StatefulSet/DaemonSet: hash of the rendered workload spec.
pub const TEMPLATE_HASH: &str = "csiops.dev/template-hash";
/// Annotation on workloads and pod templates: `spec.version` they run.
pub const VERSION: &str = "csiops.dev/version";
/// Annotation on workloads: version of the operator that rendered them.
/// Deliberately kept out of the pod template so an operator upgrade alone
/// does not restart drivers.
pub const OPERATOR_VERSION: &str = "csiops.dev/operator-version";
/// Pod annotation that makes `kubectl logs`/`exec` pick the driver container.
pub const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";
/// StorageClass annotation marking the cluster default class.
pub const IS_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// Which workload an object belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Component {
    /// The controller StatefulSet and what it uses.
    Controller,
    /// The node DaemonSet and what it uses.
    Node,
}

impl Component {
    /// Value of the [`COMPONENT`] label.
    pub fn as_str(self) -> &'static str {
        match self {
            Component::Controller => "controller",
            Component::Node => "node",
        }
    }
}

fn cr_name(obj: &CSIDriverDeployment) -> String {
    obj.metadata.name.clone().unwrap_or_default()
}

/// The immutable selector of a workload: managed-by, instance, component.
///
/// Also the selector to list the pods of a workload, e.g. for the controller:
/// `app.kubernetes.io/managed-by=csiops-operator,app.kubernetes.io/instance=<cr>,app.kubernetes.io/component=controller`.
pub fn selector_labels(
    obj: &CSIDriverDeployment,
    component: Component,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (INSTANCE.to_string(), cr_name(obj)),
        (COMPONENT.to_string(), component.as_str().to_string()),
    ])
}

/// Labels of every namespaced object and pod template: the selector labels,
/// the driver name, and the version when it is a valid label value (a version
/// like `v1.2.3+build/7` is still reported by annotation, just not as label).
pub fn common_labels(obj: &CSIDriverDeployment, component: Component) -> BTreeMap<String, String> {
    let mut labels = selector_labels(obj, component);
    labels.insert(NAME.to_string(), obj.spec.driver_name.clone());
    if !obj.spec.version.is_empty() && is_valid_label_value(&obj.spec.version) {
        labels.insert(VERSION_LABEL.to_string(), obj.spec.version.clone());
    }
    labels
}

/// Labels of cluster-scoped objects (CSIDriver, ClusterRoles and bindings,
/// StorageClasses). A namespaced owner cannot own them through owner
/// references, so these labels are how the operator finds and deletes them.
pub fn cluster_owner_labels(obj: &CSIDriverDeployment) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
        (OWNER_NAME.to_string(), cr_name(obj)),
        (
            OWNER_NAMESPACE.to_string(),
            obj.metadata.namespace.clone().unwrap_or_default(),
        ),
        (
            OWNER_UID.to_string(),
            obj.metadata.uid.clone().unwrap_or_default(),
        ),
    ])
}

/// Label selector string matching every cluster-scoped object of `obj`
/// (managed-by and owner uid).
pub fn cluster_owner_selector(obj: &CSIDriverDeployment) -> String {
    format!(
        "{MANAGED_BY}={MANAGED_BY_VALUE},{OWNER_UID}={}",
        obj.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// Controller owner reference to `obj`, set on every namespaced child so that
/// Kubernetes garbage-collects them and the operator is woken by their changes.
///
/// `render` refuses objects without name or uid; call this only on objects
/// read from the API server.
pub fn owner_reference(obj: &CSIDriverDeployment) -> OwnerReference {
    OwnerReference {
        api_version: CSIDriverDeployment::api_version(&()).into_owned(),
        kind: CSIDriverDeployment::kind(&()).into_owned(),
        name: cr_name(obj),
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether `value` is a valid Kubernetes label value: at most 63 characters,
/// alphanumerics, `-`, `_` and `.`, starting and ending with an alphanumeric.
pub fn is_valid_label_value(value: &str) -> bool {
    if value.is_empty() {
        return true;
    }
    let bytes = value.as_bytes();
    let edge_ok = |b: u8| b.is_ascii_alphanumeric();
    value.len() <= 63
        && edge_ok(bytes[0])
        && edge_ok(bytes[bytes.len() - 1])
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}
