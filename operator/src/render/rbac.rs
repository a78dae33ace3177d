//! Least-privilege RBAC: exactly what the enabled sidecars call.
//!
//! Rules are declared per sidecar as in the upstream sidecars' RBAC and
//! shipped once, as fixed ClusterRoles (`csiops:<role>`) in install.yaml and
//! the Helm chart. A driver gets bindings only: a ClusterRoleBinding per
//! cluster-wide role and a RoleBinding in its namespace per namespaced one
//! (leases, the journal, capacity objects), so the operator needs `bind` on
//! those names and none of their verbs. Rules are merged per apiGroup +
//! resource (union of verbs, sorted) and emitted sorted.

use std::collections::{BTreeMap, BTreeSet};

use csiops_crds::ControllerKind;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::containers::Helper;
use super::labels::{cluster_owner_labels, Component};
use super::monitoring;
use super::names::{
    self, cluster_role_binding_name, controller_name, node_name, role_binding_name,
};
use super::{namespaced_meta, Ctx};

/// One grant: verbs on a resource of an API group (`""` is the core group).
#[derive(Clone, Copy, Debug)]
pub struct Grant {
    pub api_group: &'static str,
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
}

const fn grant(
    api_group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
) -> Grant {
    Grant {
        api_group,
        resource,
        verbs,
    }
}

const READ: &[&str] = &["get", "list", "watch"];
const STORAGE: &str = "storage.k8s.io";

/// What the reviewing sidecars call: the checks of `--metrics-auth`.
pub const METRICS_AUTH_GRANTS: &[Grant] = &[
    Grant {
        api_group: "authentication.k8s.io",
        resource: "tokenreviews",
        verbs: &["create"],
    },
    Grant {
        api_group: "authorization.k8s.io",
        resource: "subjectaccessreviews",
        verbs: &["create"],
    },
];

/// external-provisioner: PVs for PVCs, StorageClass parameters, the
/// claims' VolumeAttributesClasses (watched, so a claim waiting for its
/// class goes on when it appears; upstream only gets them), topology from
/// CSINode/Node, VolumeAttachments (to delay deletes of attached volumes),
/// Events on PVCs and PVs (events.k8s.io,
/// which the sidecars' recorder writes); for restores the VolumeSnapshot and
/// its content (one GET each per provisioning: never listed or watched, so
/// no list/watch, unlike upstream's get/list), for cross-namespace data
/// sources the ReferenceGrants of the source's namespace (listed); the
/// claims' update/patch also covers the cloning-protection finalizer on a
/// clone's source. Its Secrets: [`SECRET_READER_ROLE`], where the classes
/// name them.
pub const PROVISIONER_GRANTS: &[Grant] = &joined::<9, 2, 11>(PROVISIONING, TOPOLOGY_READS);

/// The provisioner in node-deployment mode (topology NodeLocal): the
/// central grants but Nodes and CSINodes, which it never reads (its
/// topology is its own driver's NodeGetInfo answer; the registrar in the
/// same pods holds its own grants on them).
pub const NODE_PROVISIONER_GRANTS: &[Grant] = &PROVISIONING;

/// What a provisioner needs wherever it runs.
const PROVISIONING: [Grant; 9] = [
    grant(
        "",
        "persistentvolumes",
        &["get", "list", "watch", "create", "delete", "patch"],
    ),
    grant(
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "update", "patch"],
    ),
    grant(STORAGE, "storageclasses", READ),
    grant(STORAGE, "volumeattributesclasses", READ),
    grant(STORAGE, "volumeattachments", READ),
    grant("events.k8s.io", "events", &["create", "patch"]),
    // get to restore; list and patch for the source-protection finalizer.
    grant(SNAPSHOT, "volumesnapshots", &["get", "list", "patch"]),
    grant(SNAPSHOT, "volumesnapshotcontents", &["get"]),
    grant("gateway.networking.k8s.io", "referencegrants", &["list"]),
];

/// The central provisioner's topology: the nodes' CSINode and labels.
const TOPOLOGY_READS: [Grant; 2] = [grant(STORAGE, "csinodes", READ), grant("", "nodes", READ)];

/// `a` then `b`, as one set (`N` is their length together). The order of a
/// set does not matter: [`merge_rules`] sorts.
const fn joined<const A: usize, const B: usize, const N: usize>(
    a: [Grant; A],
    b: [Grant; B],
) -> [Grant; N] {
    assert!(A + B == N);
    let mut out = [grant("", "", &[]); N];
    let mut i = 0;
    while i < N {
        out[i] = if i < A { a[i] } else { b[i - A] };
        i += 1;
    }
    out
}

/// external-attacher: VolumeAttachments and their status, PV finalizers, node
/// IDs from CSINode/Node, Events (events.k8s.io). Its publish Secrets:
/// [`SECRET_READER_ROLE`].
pub const ATTACHER_GRANTS: &[Grant] = &[
    grant("", "persistentvolumes", &["get", "list", "watch", "patch"]),
    grant(
        STORAGE,
        "volumeattachments",
        &["get", "list", "watch", "patch"],
    ),
    grant(STORAGE, "volumeattachments/status", &["patch"]),
    grant(STORAGE, "csinodes", READ),
    grant("", "nodes", READ),
    grant("events.k8s.io", "events", &["create", "patch"]),
];

// The three helper grant sets are the ClusterRole rules of each upstream
// repository's deploy/kubernetes RBAC at the pinned tag (external-resizer
// v2.2.1 `deploy/kubernetes/rbac.yaml`, external-snapshotter v8.6.0
// `deploy/kubernetes/csi-snapshotter/rbac-csi-snapshotter.yaml`,
// external-health-monitor v0.18.0
// `deploy/kubernetes/external-health-monitor-controller/rbac.yaml`), without
// the rules upstream leaves commented out (secrets). Leases come from the
// shared leader-election Role.

/// external-resizer: patches PV sizes and PVC status (resize conditions),
/// reads pods (to know whether an in-use volume may be expanded) and
/// VolumeAttributesClasses (ModifyVolume), records Events.
pub const RESIZER_GRANTS: &[Grant] = &[
    grant("", "persistentvolumes", &["get", "list", "watch", "patch"]),
    grant("", "persistentvolumeclaims", READ),
    grant("", "pods", READ),
    grant("", "persistentvolumeclaims/status", &["patch"]),
    grant(
        "",
        "events",
        &["list", "watch", "create", "update", "patch"],
    ),
    grant(STORAGE, "volumeattributesclasses", READ),
];

const SNAPSHOT: &str = "snapshot.storage.k8s.io";
const GROUP_SNAPSHOT: &str = "groupsnapshot.storage.k8s.io";

/// external-snapshotter (the csi-snapshotter sidecar, not the
/// cluster-wide snapshot-controller): VolumeSnapshotContents and their
/// status, their classes, the group-snapshot equivalents, Events.
pub const SNAPSHOTTER_GRANTS: &[Grant] = &[
    grant(
        "",
        "events",
        &["list", "watch", "create", "update", "patch"],
    ),
    grant(SNAPSHOT, "volumesnapshotclasses", READ),
    grant(
        SNAPSHOT,
        "volumesnapshotcontents",
        &["get", "list", "watch", "update", "patch"],
    ),
    grant(
        SNAPSHOT,
        "volumesnapshotcontents/status",
        &["update", "patch"],
    ),
    grant(GROUP_SNAPSHOT, "volumegroupsnapshotclasses", READ),
    grant(
        GROUP_SNAPSHOT,
        "volumegroupsnapshotcontents",
        &["get", "list", "watch", "update", "patch"],
    ),
    grant(
        GROUP_SNAPSHOT,
        "volumegroupsnapshotcontents/status",
        &["update", "patch"],
    ),
];

/// external-health-monitor controller: reads PVs, PVCs, nodes and pods and
/// reports abnormal volumes as Events.
pub const HEALTH_MONITOR_GRANTS: &[Grant] = &[
    grant("", "persistentvolumes", READ),
    grant("", "persistentvolumeclaims", READ),
    grant("", "nodes", READ),
    grant("", "pods", READ),
    grant("", "events", &["get", "list", "watch", "create", "patch"]),
];

/// Registrar: maintains its node's CSINode entry, topology labels and the
/// node-id annotation on the Node.
pub const REGISTRAR_GRANTS: &[Grant] = &[
    grant(
        STORAGE,
        "csinodes",
        &["get", "list", "watch", "create", "update", "patch"],
    ),
    grant("", "nodes", &["get", "list", "watch", "patch"]),
    grant("", "events", &["create", "patch"]),
    // The Warning Event of a refused topology (its recorder writes
    // events.k8s.io, as the other sidecars').
    grant("events.k8s.io", "events", &["create", "patch"]),
    // Not a permission: the marker by which the shipped admission policy
    // limits this role's Node and CSINode writes to the pod's own node
    // (see `crate::policy`).
    grant(
        names::MARKER_GROUP,
        names::MARKER_RESOURCE,
        &[names::OWN_NODE_VERB],
    ),
];

/// `get` on Secrets, bound apart from the sidecar roles: by a RoleBinding in
/// each namespace the driver's classes name ([`secret_scope`]), or with
/// `spec.secretAccess.clusterWide` by a ClusterRoleBinding. In the sidecar
/// roles it would let every token of the driver's pods (on every node, with
/// a node-local provisioner) read every Secret of the cluster.
pub const SECRET_READER_GRANTS: &[Grant] = &[grant("", "secrets", &["get"])];

/// Leader election of the controller sidecars, in the CR's namespace only.
pub const LEADER_ELECTION_GRANTS: &[Grant] = &[
    grant(
        "coordination.k8s.io",
        "leases",
        &["get", "list", "watch", "create", "update", "patch"],
    ),
    grant("", "events", &["create", "patch"]),
];

/// The provisioner's intent journal: one ConfigMap beside its Lease, and
/// the Secret with the key that seals its entries, which the first
/// provisioner makes (see the sidecar's `provisioner::journal`).
pub const PROVISIONER_NAMESPACED_GRANTS: &[Grant] = &[
    grant("", "configmaps", &["get", "create", "patch"]),
    grant("", "secrets", &["get", "create"]),
];

/// CSIStorageCapacity publishing (`--enable-capacity`), in the CR's
/// namespace only, where the objects live; and `get` on the pod, where the
/// owner lookup starts (a StatefulSet is read from the pod's reference).
pub const CAPACITY_GRANTS: &[Grant] = &[
    grant(
        STORAGE,
        "csistoragecapacities",
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
    ),
    grant("", "pods", &["get"]),
];

/// With a Deployment the owner is two levels up: the pod's ReplicaSet is
/// read for its Deployment's reference.
pub const CAPACITY_DEPLOYMENT_GRANTS: &[Grant] = &[grant("apps", "replicasets", &["get"])];

/// Merges grant sets into policy rules: one rule per apiGroup + resource,
/// verbs deduplicated and sorted, rules sorted by apiGroup then resource.
pub fn merge_rules(sets: &[&[Grant]]) -> Vec<PolicyRule> {
    let mut merged: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for grant in sets.iter().flat_map(|set| set.iter()) {
        merged
            .entry((grant.api_group, grant.resource))
            .or_default()
            .extend(grant.verbs.iter().copied());
    }
    merged
        .into_iter()
        .map(|((group, resource), verbs)| PolicyRule {
            api_groups: Some(vec![group.to_string()]),
            resources: Some(vec![resource.to_string()]),
            verbs: verbs.into_iter().map(str::to_string).collect(),
            ..Default::default()
        })
        .collect()
}

/// Where a shipped role applies once bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Cluster-wide: bound by a ClusterRoleBinding.
    Cluster,
    /// The driver's namespace only: bound by a RoleBinding there (a
    /// RoleBinding may reference a ClusterRole and then grants its rules in
    /// its own namespace only), so one shipped object serves every driver.
    Namespace,
}

/// A ClusterRole shipped by `manifests/install.yaml` and the Helm chart,
/// one per sidecar role. The operator never writes a role: it only binds
/// these to a driver's ServiceAccounts (`bind`, restricted by name), so it
/// holds none of their data-plane verbs.
#[derive(Clone, Copy, Debug)]
pub struct ShippedRole {
    /// The ClusterRole's name (`csiops:<short>`).
    pub name: &'static str,
    /// Suffix of the bindings' names.
    pub short: &'static str,
    pub scope: Scope,
    pub grants: &'static [Grant],
}

const fn shipped(
    name: &'static str,
    short: &'static str,
    scope: Scope,
    grants: &'static [Grant],
) -> ShippedRole {
    ShippedRole {
        name,
        short,
        scope,
        grants,
    }
}

pub const PROVISIONER_ROLE: ShippedRole = shipped(
    "csiops:provisioner",
    "provisioner",
    Scope::Cluster,
    PROVISIONER_GRANTS,
);
pub const NODE_PROVISIONER_ROLE: ShippedRole = shipped(
    "csiops:node-provisioner",
    "node-provisioner",
    Scope::Cluster,
    NODE_PROVISIONER_GRANTS,
);
pub const ATTACHER_ROLE: ShippedRole = shipped(
    "csiops:attacher",
    "attacher",
    Scope::Cluster,
    ATTACHER_GRANTS,
);
pub const RESIZER_ROLE: ShippedRole =
    shipped("csiops:resizer", "resizer", Scope::Cluster, RESIZER_GRANTS);
pub const SNAPSHOTTER_ROLE: ShippedRole = shipped(
    "csiops:snapshotter",
    "snapshotter",
    Scope::Cluster,
    SNAPSHOTTER_GRANTS,
);
pub const HEALTH_MONITOR_ROLE: ShippedRole = shipped(
    "csiops:health-monitor",
    "health-monitor",
    Scope::Cluster,
    HEALTH_MONITOR_GRANTS,
);
pub const REGISTRAR_ROLE: ShippedRole = shipped(
    "csiops:registrar",
    "registrar",
    Scope::Cluster,
    REGISTRAR_GRANTS,
);
pub const METRICS_AUTH_ROLE: ShippedRole = shipped(
    "csiops:metrics-auth",
    "metrics-auth",
    Scope::Cluster,
    METRICS_AUTH_GRANTS,
);
// Binding suffix "leases", not "leader-election": the RoleBinding an
// earlier version named `<cr>-leader-election` points at a Role, and a
// binding's roleRef cannot change.
pub const LEADER_ELECTION_ROLE: ShippedRole = shipped(
    "csiops:leader-election",
    "leases",
    Scope::Namespace,
    LEADER_ELECTION_GRANTS,
);
pub const JOURNAL_ROLE: ShippedRole = shipped(
    "csiops:provisioner-journal",
    "journal",
    Scope::Namespace,
    PROVISIONER_NAMESPACED_GRANTS,
);
pub const CAPACITY_ROLE: ShippedRole = shipped(
    "csiops:capacity",
    "capacity",
    Scope::Namespace,
    CAPACITY_GRANTS,
);
pub const SECRET_READER_ROLE: ShippedRole = shipped(
    super::names::SECRET_READER_ROLE_NAME,
    "secret-reader",
    Scope::Namespace,
    SECRET_READER_GRANTS,
);
pub const CAPACITY_OWNER_ROLE: ShippedRole = shipped(
    "csiops:capacity-owner",
    "capacity-owner",
    Scope::Namespace,
    CAPACITY_DEPLOYMENT_GRANTS,
);

/// Every shipped role, in the order install.yaml lists them.
pub const SHIPPED_ROLES: &[ShippedRole] = &[
    PROVISIONER_ROLE,
    NODE_PROVISIONER_ROLE,
    ATTACHER_ROLE,
    RESIZER_ROLE,
    SNAPSHOTTER_ROLE,
    HEALTH_MONITOR_ROLE,
    REGISTRAR_ROLE,
    METRICS_AUTH_ROLE,
    LEADER_ELECTION_ROLE,
    JOURNAL_ROLE,
    CAPACITY_ROLE,
    CAPACITY_OWNER_ROLE,
    SECRET_READER_ROLE,
];

/// The shipped role named `name`.
pub fn shipped_role(name: &str) -> Option<&'static ShippedRole> {
    SHIPPED_ROLES.iter().find(|r| r.name == name)
}

/// The shipped ClusterRoles as objects (install.yaml and the chart);
/// `labels` are the installation's.
pub fn shipped_cluster_roles(labels: &BTreeMap<String, String>) -> Vec<ClusterRole> {
    SHIPPED_ROLES
        .iter()
        .map(|r| ClusterRole {
            metadata: ObjectMeta {
                name: Some(r.name.to_string()),
                labels: Some(labels.clone()),
                ..Default::default()
            },
            rules: Some(merge_rules(&[r.grants])),
            aggregation_rule: None,
        })
        .collect()
}

/// The roles the pods of `component` need: their enabled sidecars and
/// helpers. (Extra containers get none: the operator cannot know what a
/// vendor's container calls; a vendor binds its own role to the
/// ServiceAccount.)
fn roles_of(ctx: &Ctx<'_>, component: Component) -> Vec<ShippedRole> {
    let mut roles = Vec::new();
    let auth = monitoring::needs_auth_grants(ctx, component);
    match component {
        Component::Controller => {
            let mut cluster = Vec::new();
            if ctx.provisioner_enabled() && !ctx.node_local() {
                cluster.push(PROVISIONER_ROLE);
            }
            if ctx.attacher_enabled() {
                cluster.push(ATTACHER_ROLE);
            }
            for helper in Helper::ALL {
                if ctx.helper_enabled(helper) {
                    cluster.push(match helper {
                        Helper::Resizer => RESIZER_ROLE,
                        Helper::Snapshotter => SNAPSHOTTER_ROLE,
                        Helper::HealthMonitor => HEALTH_MONITOR_ROLE,
                    });
                }
            }
            // Every controller sidecar and helper elects a leader, in the
            // driver's namespace.
            if !cluster.is_empty() {
                roles.push(LEADER_ELECTION_ROLE);
                if ctx.provisioner_enabled() {
                    roles.push(JOURNAL_ROLE);
                }
                if ctx.capacity_enabled() {
                    roles.push(CAPACITY_ROLE);
                    if ctx.spec().controller.kind == ControllerKind::Deployment {
                        roles.push(CAPACITY_OWNER_ROLE);
                    }
                }
            }
            roles.extend(cluster);
        }
        Component::Node => {
            if ctx.registrar_enabled() {
                roles.push(REGISTRAR_ROLE);
            }
            // Topology NodeLocal: the node provisioner's cluster grants,
            // its per-node journal and, with capacity, the
            // CSIStorageCapacity objects and `get` on its own pod (their
            // owner). No Leases: node instances elect no leader.
            if ctx.node_local() && ctx.provisioner_enabled() {
                roles.push(NODE_PROVISIONER_ROLE);
                roles.push(JOURNAL_ROLE);
                if ctx.capacity_enabled() {
                    roles.push(CAPACITY_ROLE);
                }
            }
        }
    }
    if auth {
        roles.push(METRICS_AUTH_ROLE);
    }
    roles
}

pub(crate) fn service_account(ctx: &Ctx<'_>, component: Component) -> ServiceAccount {
    let name = sa_name(ctx, component);
    ServiceAccount {
        metadata: namespaced_meta(ctx, name, component),
        ..Default::default()
    }
}

fn sa_name(ctx: &Ctx<'_>, component: Component) -> String {
    match component {
        Component::Controller => controller_name(ctx.obj),
        Component::Node => node_name(ctx.obj),
    }
}

fn service_account_subject(ctx: &Ctx<'_>, name: String) -> Subject {
    Subject {
        kind: "ServiceAccount".to_string(),
        name,
        namespace: Some(ctx.namespace.to_string()),
        ..Default::default()
    }
}

fn role_ref(role: &ShippedRole) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".to_string(),
        kind: "ClusterRole".to_string(),
        name: role.name.to_string(),
    }
}

/// Each needed shipped role with the components that need it, in
/// [`SHIPPED_ROLES`] order (so the output does not depend on the order
/// the needs were found in).
fn needs(ctx: &Ctx<'_>) -> Vec<(ShippedRole, Vec<Component>)> {
    let controller = if ctx.node_local() {
        Vec::new()
    } else {
        roles_of(ctx, Component::Controller)
    };
    let node = roles_of(ctx, Component::Node);
    SHIPPED_ROLES
        .iter()
        .filter_map(|role| {
            let who: Vec<Component> = [
                (Component::Controller, &controller),
                (Component::Node, &node),
            ]
            .into_iter()
            .filter(|(_, roles)| roles.iter().any(|r| r.name == role.name))
            .map(|(c, _)| c)
            .collect();
            (!who.is_empty()).then_some((*role, who))
        })
        .collect()
}

/// The driver's bindings: a ClusterRoleBinding `csiops:<driverName>:<role>`
/// per cluster-wide role and a RoleBinding `<cr-name>-<role>` in the CR's
/// namespace per namespaced one, each to the ServiceAccounts whose pods
/// run that role; and the Secret reads ([`secret_reader_bindings`]).
/// Nothing else: the roles themselves are shipped.
pub(crate) fn bindings(ctx: &Ctx<'_>) -> Bindings {
    let mut out = Bindings::default();
    for (role, who) in needs(ctx) {
        let subjects: Vec<Subject> = who
            .iter()
            .map(|c| service_account_subject(ctx, sa_name(ctx, *c)))
            .collect();
        match role.scope {
            Scope::Cluster => out.cluster.push(cluster_binding(ctx, &role, subjects)),
            Scope::Namespace => out.namespaced.push(RoleBinding {
                metadata: namespaced_meta(ctx, role_binding_name(ctx.obj, role.short), who[0]),
                role_ref: role_ref(&role),
                subjects: Some(subjects),
            }),
        }
    }
    secret_reader_bindings(ctx, &mut out);
    out
}

/// What [`bindings`] renders.
#[derive(Default)]
pub(crate) struct Bindings {
    pub cluster: Vec<ClusterRoleBinding>,
    /// In the CR's namespace, owned by reference.
    pub namespaced: Vec<RoleBinding>,
    /// `csiops:secret-reader` in the namespaces the classes name, owned by
    /// the owner labels (an owner reference cannot cross namespaces).
    pub secret_readers: Vec<RoleBinding>,
}

fn cluster_binding(
    ctx: &Ctx<'_>,
    role: &ShippedRole,
    subjects: Vec<Subject>,
) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(cluster_role_binding_name(ctx.obj, role.short)),
            labels: Some(cluster_owner_labels(ctx.obj)),
            ..Default::default()
        },
        role_ref: role_ref(role),
        subjects: Some(subjects),
    }
}

/// `csiops:secret-reader` for the accounts whose pods run a sidecar that
/// reads Secrets (the controller's; the nodes' with a node-local
/// provisioner): one RoleBinding `csiops:<driverName>:secret-reader` per
/// namespace of [`secret_scope`], or one ClusterRoleBinding of that name.
fn secret_reader_bindings(ctx: &Ctx<'_>, out: &mut Bindings) {
    let reader = if ctx.node_local() {
        ctx.provisioner_enabled().then_some(Component::Node)
    } else {
        (!roles_of(ctx, Component::Controller).is_empty()).then_some(Component::Controller)
    };
    let Some(reader) = reader else {
        return;
    };
    let subjects = vec![service_account_subject(ctx, sa_name(ctx, reader))];
    // A templated namespace without the opt-in is refused before rendering
    // (`validate`); nothing is granted for it here either way.
    match secret_scope(ctx.spec()) {
        Ok(SecretScope::Cluster) => {
            out.cluster
                .push(cluster_binding(ctx, &SECRET_READER_ROLE, subjects));
        }
        Ok(SecretScope::Namespaces(namespaces)) => {
            for namespace in namespaces {
                out.secret_readers.push(RoleBinding {
                    metadata: ObjectMeta {
                        name: Some(cluster_role_binding_name(ctx.obj, SECRET_READER_ROLE.short)),
                        namespace: Some(namespace),
                        labels: Some(cluster_owner_labels(ctx.obj)),
                        ..Default::default()
                    },
                    role_ref: role_ref(&SECRET_READER_ROLE),
                    subjects: Some(subjects.clone()),
                });
            }
        }
        Err(_) => {}
    }
}

/// StorageClass parameters naming the namespace of a Secret that a
/// controller-side sidecar reads: the provisioner its own, the attacher
/// and the resizer those the provisioner copies into the PV (publish,
/// expand, modify), and the default one, which serves every operation
/// without keys of its own. The sidecars' `provisioner::params` reads the
/// same keys. Kubelet reads the node-side ones (stage, publish, expand).
pub const CONTROLLER_SECRET_NAMESPACE_KEYS: &[&str] = &[
    "csi.storage.k8s.io/secret-namespace",
    "csi.storage.k8s.io/provisioner-secret-namespace",
    "csi.storage.k8s.io/controller-publish-secret-namespace",
    "csi.storage.k8s.io/controller-expand-secret-namespace",
    "csi.storage.k8s.io/controller-modify-secret-namespace",
    "csiProvisionerSecretNamespace",
    "csiControllerPublishSecretNamespace",
];

/// The non-empty [`CONTROLLER_SECRET_NAMESPACE_KEYS`] of a class, with
/// their values (literal or templates).
pub fn class_secret_namespaces(
    class: &csiops_crds::StorageClassSpec,
) -> impl Iterator<Item = (&'static str, &str)> {
    CONTROLLER_SECRET_NAMESPACE_KEYS.iter().filter_map(|key| {
        class
            .parameters
            .get(*key)
            .filter(|v| !v.is_empty())
            .map(|v| (*key, v.as_str()))
    })
}

/// Whether a secret parameter's value is a template (`${pvc.namespace}`),
/// resolved per claim by the provisioner.
pub fn is_template(value: &str) -> bool {
    value.contains("${")
}

/// Where a driver's tokens may read Secrets.
#[derive(Debug, PartialEq, Eq)]
pub enum SecretScope {
    /// `secretAccess.clusterWide`.
    Cluster,
    /// The namespaces the classes name and `secretAccess.namespaces` adds
    /// (none: no Secret at all).
    Namespaces(BTreeSet<String>),
}

/// A class names a Secret's namespace by template, without
/// `secretAccess.clusterWide`.
#[derive(Debug, PartialEq, Eq)]
pub struct TemplatedSecretNamespace {
    pub class: String,
    pub key: String,
    pub value: String,
}

/// [`SecretScope`] of a spec: refused when a class's namespace is a
/// template (`${pvc.namespace}`) and the spec does not grant every
/// namespace, since no RoleBinding can follow a claim's namespace.
pub fn secret_scope(
    spec: &csiops_crds::CSIDriverDeploymentSpec,
) -> Result<SecretScope, TemplatedSecretNamespace> {
    if spec.secret_access.cluster_wide {
        return Ok(SecretScope::Cluster);
    }
    let mut namespaces: BTreeSet<String> = spec.secret_access.namespaces.iter().cloned().collect();
    for class in &spec.storage_classes {
        for (key, value) in class_secret_namespaces(class) {
            if is_template(value) {
                return Err(TemplatedSecretNamespace {
                    class: class.name.clone(),
                    key: key.to_string(),
                    value: value.to_string(),
                });
            }
            namespaces.insert(value.to_string());
        }
    }
    Ok(SecretScope::Namespaces(namespaces))
}

/// What the ServiceAccount of `component` may do, resolved from
/// `rendered`'s bindings and the shipped roles: (cluster-wide rules,
/// rules in the driver's namespace). For tests and reviews: the effective
/// grants, as the API server's RBAC authorizer computes them.
pub fn effective_rules(
    rendered: &super::Rendered,
    component: Component,
) -> (Vec<PolicyRule>, Vec<PolicyRule>) {
    let sa = match component {
        Component::Controller => rendered.controller_service_account.as_ref(),
        Component::Node => Some(&rendered.node_service_account),
    };
    let Some(sa) = sa.and_then(|sa| sa.metadata.name.clone()) else {
        return (Vec::new(), Vec::new());
    };
    let names = |subjects: &Option<Vec<Subject>>| {
        subjects
            .iter()
            .flatten()
            .any(|s| s.kind == "ServiceAccount" && s.name == sa)
    };
    let grants = |role_ref: &RoleRef| {
        shipped_role(&role_ref.name)
            .filter(|_| role_ref.kind == "ClusterRole")
            .map(|r| r.grants)
            .unwrap_or_default()
    };
    let cluster: Vec<&[Grant]> = rendered
        .cluster_role_bindings
        .iter()
        .filter(|b| names(&b.subjects))
        .map(|b| grants(&b.role_ref))
        .collect();
    let namespaced: Vec<&[Grant]> = rendered
        .role_bindings
        .iter()
        .filter(|b| names(&b.subjects))
        .map(|b| grants(&b.role_ref))
        .collect();
    (merge_rules(&cluster), merge_rules(&namespaced))
}

#[cfg(test)]
mod tests;
