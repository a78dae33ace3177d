//! Least-privilege RBAC: exactly what the enabled sidecars call.
//!
//! Rules are declared per sidecar as in the upstream sidecars' RBAC, merged
//! per apiGroup + resource (union of verbs, sorted) and emitted sorted, so the
//! output depends only on which sidecars run, never on declaration order.

use std::collections::{BTreeMap, BTreeSet};

use csiops_crds::ControllerKind;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::containers::Helper;
use super::labels::{cluster_owner_labels, Component};
use super::monitoring;
use super::names::{
    controller_cluster_role_binding_name, controller_cluster_role_name, controller_name,
    leader_election_role_name, node_cluster_role_binding_name, node_cluster_role_name, node_name,
    node_role_name,
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

/// external-provisioner: PVs for PVCs, StorageClass parameters, topology from
/// CSINode/Node, VolumeAttachments (to delay deletes of attached volumes),
/// provisioner/node-stage secrets, Events on PVCs and PVs (events.k8s.io,
/// which the sidecars' recorder writes); for restores the VolumeSnapshot and
/// its content (one GET each per provisioning: never listed or watched, so
/// no list/watch, unlike upstream's get/list), for cross-namespace data
/// sources the ReferenceGrants of the source's namespace (listed); the
/// claims' update/patch also covers the cloning-protection finalizer on a
/// clone's source.
pub const PROVISIONER_GRANTS: &[Grant] = &[
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
    grant(STORAGE, "csinodes", READ),
    grant("", "nodes", READ),
    grant(STORAGE, "volumeattachments", READ),
    grant("", "secrets", &["get"]),
    grant("events.k8s.io", "events", &["create", "patch"]),
    // get to restore; list and patch for the source-protection finalizer.
    grant(SNAPSHOT, "volumesnapshots", &["get", "list", "patch"]),
    grant(SNAPSHOT, "volumesnapshotcontents", &["get"]),
    grant("gateway.networking.k8s.io", "referencegrants", &["list"]),
];

/// The provisioner in node-deployment mode (topology NodeLocal): the
/// central grants but Nodes and CSINodes, which it never reads (its
/// topology is its own driver's NodeGetInfo answer; the registrar in the
/// same pods holds its own grants on them).
pub const NODE_PROVISIONER_GRANTS: &[Grant] = &[
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
    grant(STORAGE, "volumeattachments", READ),
    grant("", "secrets", &["get"]),
    grant("events.k8s.io", "events", &["create", "patch"]),
    grant(SNAPSHOT, "volumesnapshots", &["get", "list", "patch"]),
    grant(SNAPSHOT, "volumesnapshotcontents", &["get"]),
    grant("gateway.networking.k8s.io", "referencegrants", &["list"]),
];

/// external-attacher: VolumeAttachments and their status, PV finalizers, node
/// IDs from CSINode/Node, publish secrets, Events (events.k8s.io).
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
    grant("", "secrets", &["get"]),
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

/// The grants of one upstream helper.
pub fn helper_grants(helper: Helper) -> &'static [Grant] {
    match helper {
        Helper::Resizer => RESIZER_GRANTS,
        Helper::Snapshotter => SNAPSHOTTER_GRANTS,
        Helper::HealthMonitor => HEALTH_MONITOR_GRANTS,
    }
}

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
];

/// Leader election of the controller sidecars, in the CR's namespace only.
pub const LEADER_ELECTION_GRANTS: &[Grant] = &[
    grant(
        "coordination.k8s.io",
        "leases",
        &["get", "list", "watch", "create", "update", "patch"],
    ),
    grant("", "events", &["create", "patch"]),
];

/// The provisioner's intent journal: one ConfigMap beside its Lease (see
/// the sidecar's `provisioner::journal`).
pub const PROVISIONER_NAMESPACED_GRANTS: &[Grant] =
    &[grant("", "configmaps", &["get", "create", "patch"])];

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

/// Grants of the enabled controller sidecars and helpers. (Extra containers
/// get none: the operator cannot know what a vendor's container calls; a
/// vendor binds its own role to the controller ServiceAccount.)
fn controller_grants(ctx: &Ctx<'_>) -> Vec<&'static [Grant]> {
    let mut sets = Vec::new();
    if ctx.provisioner_enabled() && !ctx.node_local() {
        sets.push(PROVISIONER_GRANTS);
    }
    if ctx.attacher_enabled() {
        sets.push(ATTACHER_GRANTS);
    }
    for helper in Helper::ALL {
        if ctx.helper_enabled(helper) {
            sets.push(helper_grants(helper));
        }
    }
    sets
}

/// Grants of the controller sidecars in the CR's namespace: leader
/// election for all, the journal for the provisioner, and capacity
/// publishing when it is on.
fn namespaced_grants(ctx: &Ctx<'_>) -> Vec<&'static [Grant]> {
    let mut sets = vec![LEADER_ELECTION_GRANTS];
    if ctx.provisioner_enabled() {
        sets.push(PROVISIONER_NAMESPACED_GRANTS);
    }
    if ctx.capacity_enabled() {
        sets.push(CAPACITY_GRANTS);
        if ctx.spec().controller.kind == ControllerKind::Deployment {
            sets.push(CAPACITY_DEPLOYMENT_GRANTS);
        }
    }
    sets
}

/// The node provisioner's grants in the CR's namespace (topology
/// NodeLocal): its per-node intent journal and, with capacity, the
/// CSIStorageCapacity objects and `get` on its own pod (their owner). No
/// Leases: node instances elect no leader.
fn node_namespaced_grants(ctx: &Ctx<'_>) -> Vec<&'static [Grant]> {
    let mut sets = Vec::new();
    if ctx.node_local() && ctx.provisioner_enabled() {
        sets.push(PROVISIONER_NAMESPACED_GRANTS);
        if ctx.capacity_enabled() {
            sets.push(CAPACITY_GRANTS);
        }
    }
    sets
}

/// The node sidecars' Role in the CR's namespace and its binding to the
/// node ServiceAccount, `<name>-node`; `None` when they need none.
pub(crate) fn node_role(ctx: &Ctx<'_>) -> Option<(Role, RoleBinding)> {
    let sets = node_namespaced_grants(ctx);
    if sets.is_empty() {
        return None;
    }
    let name = node_role_name(ctx.obj);
    let role = Role {
        metadata: namespaced_meta(ctx, name.clone(), Component::Node),
        rules: Some(merge_rules(&sets)),
    };
    let binding = RoleBinding {
        metadata: namespaced_meta(ctx, name.clone(), Component::Node),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string(),
            kind: "Role".to_string(),
            name,
        },
        subjects: Some(vec![service_account_subject(ctx, node_name(ctx.obj))]),
    };
    Some((role, binding))
}

pub(crate) fn service_account(ctx: &Ctx<'_>, component: Component) -> ServiceAccount {
    let name = match component {
        Component::Controller => controller_name(ctx.obj),
        Component::Node => node_name(ctx.obj),
    };
    ServiceAccount {
        metadata: namespaced_meta(ctx, name, component),
        ..Default::default()
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

/// The namespaced Role (leader election; CSIStorageCapacity objects and
/// the owner lookup when capacity is published) and its binding to the
/// controller ServiceAccount; `None` when no controller sidecar or helper
/// runs (all of them elect a leader).
pub(crate) fn leader_election(ctx: &Ctx<'_>) -> Option<(Role, RoleBinding)> {
    if controller_grants(ctx).is_empty() {
        return None;
    }
    let name = leader_election_role_name(ctx.obj);
    let role = Role {
        metadata: namespaced_meta(ctx, name.clone(), Component::Controller),
        rules: Some(merge_rules(&namespaced_grants(ctx))),
    };
    let binding = RoleBinding {
        metadata: namespaced_meta(ctx, name.clone(), Component::Controller),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string(),
            kind: "Role".to_string(),
            name,
        },
        subjects: Some(vec![service_account_subject(ctx, controller_name(ctx.obj))]),
    };
    Some((role, binding))
}

fn cluster_meta(ctx: &Ctx<'_>, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        labels: Some(cluster_owner_labels(ctx.obj)),
        ..Default::default()
    }
}

fn cluster_role_and_binding(
    ctx: &Ctx<'_>,
    role_name: String,
    binding_name: String,
    sa_name: String,
    rules: Vec<PolicyRule>,
) -> (ClusterRole, ClusterRoleBinding) {
    let role = ClusterRole {
        metadata: cluster_meta(ctx, role_name.clone()),
        rules: Some(rules),
        aggregation_rule: None,
    };
    let binding = ClusterRoleBinding {
        metadata: cluster_meta(ctx, binding_name),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string(),
            kind: "ClusterRole".to_string(),
            name: role_name,
        },
        subjects: Some(vec![service_account_subject(ctx, sa_name)]),
    };
    (role, binding)
}

/// Controller role (if a controller sidecar runs), then node role (if the
/// registrar or, node-locally, the provisioner runs, or a sidecar that
/// reviews metrics callers), each with its binding at the same index.
pub(crate) fn cluster_roles(ctx: &Ctx<'_>) -> (Vec<ClusterRole>, Vec<ClusterRoleBinding>) {
    let mut roles = Vec::new();
    let mut bindings = Vec::new();
    let mut controller_sets = controller_grants(ctx);
    controller_sets.extend(monitoring::auth_grants(ctx, Component::Controller));
    if !controller_sets.is_empty() {
        let (role, binding) = cluster_role_and_binding(
            ctx,
            controller_cluster_role_name(ctx.obj),
            controller_cluster_role_binding_name(ctx.obj),
            controller_name(ctx.obj),
            merge_rules(&controller_sets),
        );
        roles.push(role);
        bindings.push(binding);
    }
    let mut node_sets: Vec<&[Grant]> = Vec::new();
    if ctx.registrar_enabled() {
        node_sets.push(REGISTRAR_GRANTS);
    }
    if ctx.node_local() && ctx.provisioner_enabled() {
        node_sets.push(NODE_PROVISIONER_GRANTS);
    }
    node_sets.extend(monitoring::auth_grants(ctx, Component::Node));
    if !node_sets.is_empty() {
        let (role, binding) = cluster_role_and_binding(
            ctx,
            node_cluster_role_name(ctx.obj),
            node_cluster_role_binding_name(ctx.obj),
            node_name(ctx.obj),
            merge_rules(&node_sets),
        );
        roles.push(role);
        bindings.push(binding);
    }
    (roles, bindings)
}

#[cfg(test)]
mod tests {
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
}
