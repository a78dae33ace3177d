//! ValidatingAdmissionPolicies shipped with the operator (install.yaml and
//! the Helm chart): checks RBAC cannot express, enforced by the API server
//! itself, so they hold whatever the operator or a driver's pods do.
//!
//! **Host access is a cluster admin's to grant** ([`host_access`]). Every
//! CSIDriverDeployment runs its driver privileged on every node, with the
//! kubelet directory, and with what its spec says: images, host namespaces,
//! volumes (hostPath included), security contexts, extra containers,
//! ServiceAccount tokens, StorageClasses (a cluster default, provisioner
//! Secrets of any namespace), VolumeAttributesClasses (cluster-wide). The operator does all that with its own
//! rights, so without this policy "may create a CSIDriverDeployment in some
//! namespace" would mean "root on every node". The policy lets a requester
//! create one, or change its spec beyond [`HARMLESS_FIELDS`], only when a
//! cluster admin allowed it through one of two documented switches: the
//! verb [`HOST_ACCESS_VERB`] on `csidriverdeployments.csiops.dev` granted
//! **cluster-wide** (a ClusterRoleBinding; a RoleBinding in the namespace
//! does not count, so a namespace admin's wildcard Role does not either),
//! or the label [`HOST_ACCESS_LABEL`]`=allowed` on the object's namespace,
//! which only those holding that verb may set ([`host_access_label`]: whoever
//! may create a namespace writes its labels).
//! Deleting, and updates that leave the spec alone (the operator's
//! finalizer, labels), stay open.
//!
//! **Each registrar writes only its own node.** RBAC can grant `patch` on
//! Nodes and writes on CSINodes only for all of them. Since Kubernetes 1.30
//! (`ServiceAccountTokenPodNodeInfo`, beta and on by default in 1.30, GA in
//! 1.32) a ServiceAccount token bound to a pod carries the pod's node, and
//! the API server puts it in the request's user info as the extra
//! `authentication.kubernetes.io/node-name`. The policy compares it with
//! the object written (a Node and its CSINode share the node's name).
//!
//! Who is a registrar is told by RBAC, not by names: the shipped
//! `csiops:registrar` role holds the marker verb [`OWN_NODE_VERB`] on the
//! virtual resource [`MARKER_RESOURCE`] of `csiops.dev`, and the policy
//! applies to a requester the authorizer grants it. A wildcard role
//! (cluster-admin) grants every verb, so those holding
//! [`ANY_NODE_VERB`] too are left alone: an administrator exempts an
//! account by granting it that verb.
//!
//! **Fallback.** A token without the node claim — one not bound to a pod
//! (`kubectl create token` without `--bound-object-kind Pod`), or a cluster
//! older than 1.30 or with the feature off — cannot be checked, and the
//! write is refused, saying so (fail closed). On such a cluster delete the
//! binding `csiops-registrar-own-node` to fall back to RBAC alone (each
//! registrar may then write any Node and CSINode, as before this policy).
//! ValidatingAdmissionPolicy itself is GA since 1.30, so older clusters
//! cannot install it at all.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

pub mod presence;

// The marker names are the rendering's (the registrar role carries the
// marker), kept there so that render never imports the policies above it.
pub use crate::render::names::{ANY_NODE_VERB, MARKER_GROUP, MARKER_RESOURCE, OWN_NODE_VERB};
/// The user-info extra key carrying a pod-bound token's node.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// Name of the policy and its binding.
pub const REGISTRAR_POLICY: &str = "csiops-registrar-own-node";

fn rule(group: &str, resource: &str, operations: &[&str]) -> NamedRuleWithOperations {
    NamedRuleWithOperations {
        api_groups: Some(vec![group.to_string()]),
        api_versions: Some(vec!["*".to_string()]),
        operations: Some(operations.iter().map(|s| s.to_string()).collect()),
        resources: Some(vec![resource.to_string()]),
        ..Default::default()
    }
}

fn meta(name: &str, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(labels.clone()),
        ..Default::default()
    }
}

/// The registrar policy and its binding (Deny).
pub fn registrar_own_node(
    labels: &BTreeMap<String, String>,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let check = |verb: &str| {
        format!(
            "authorizer.group('{MARKER_GROUP}').resource('{MARKER_RESOURCE}').check('{verb}').allowed()"
        )
    };
    let node = format!(
        "has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in request.userInfo.extra && \
         size(request.userInfo.extra['{NODE_NAME_EXTRA}']) == 1 ? \
         request.userInfo.extra['{NODE_NAME_EXTRA}'][0] : ''"
    );
    let policy = ValidatingAdmissionPolicy {
        metadata: meta(REGISTRAR_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![
                    // A patch is an UPDATE at admission.
                    rule("", "nodes", &["UPDATE", "DELETE"]),
                    rule(
                        "storage.k8s.io",
                        "csinodes",
                        &["CREATE", "UPDATE", "DELETE"],
                    ),
                ]),
                ..Default::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "csiops-registrar".into(),
                expression: format!("{} && !{}", check(OWN_NODE_VERB), check(ANY_NODE_VERB)),
            }]),
            // The requester's node, from its token ('' without the claim).
            variables: Some(vec![
                Variable {
                    name: "node".into(),
                    expression: node,
                },
                Variable {
                    name: "nodeUpdate".into(),
                    expression:
                        "request.resource.resource == 'nodes' && request.operation == 'UPDATE'"
                            .into(),
                },
            ]),
            validations: Some(
                vec![
                    Validation {
                        expression: "variables.node != ''".into(),
                        message_expression: Some(format!(
                            "request.userInfo.username + ' may write only its own node, and its \
                         token names none (the {NODE_NAME_EXTRA} claim of a token bound to a \
                         pod, Kubernetes 1.30+): refusing to write ' + \
                         request.resource.resource + ' ' + request.name"
                        )),
                        reason: Some("Forbidden".into()),
                        ..Default::default()
                    },
                    Validation {
                        expression: "variables.node == '' || variables.node == request.name".into(),
                        message_expression: Some(
                            "request.userInfo.username + ' runs on node ' + variables.node + \
                         ' and may write only that node\\'s Node and CSINode, not ' + \
                         request.resource.resource + ' ' + request.name"
                                .into(),
                        ),
                        reason: Some("Forbidden".into()),
                        ..Default::default()
                    },
                ]
                .into_iter()
                .chain(own_node_changes())
                .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: meta(REGISTRAR_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(REGISTRAR_POLICY.into()),
            validation_actions: Some(vec!["Deny".into()]),
            ..Default::default()
        }),
    };
    (policy, binding)
}

/// The annotation with every registered driver's node ID (kubelet's and
/// the registrar's).
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
/// Node fields of `spec` a registrar never writes (all but `taints`).
const NODE_SPEC_FIELDS: &[&str] = &[
    "podCIDR",
    "podCIDRs",
    "providerID",
    "unschedulable",
    "configSource",
    "externalID",
];

/// What a registrar may change on its own Node, which is what it needs and
/// no more (Kubernetes' NodeRestriction holds kubelets to the same kind of
/// list): add topology labels, but none under `kubernetes.io` or `k8s.io`
/// but `topology.kubernetes.io` (so no `node-role`, no
/// `node-restriction.kubernetes.io`), and never change or remove a label;
/// write the node-ID annotation and no other; remove a driver-readiness
/// taint (`csiops.dev/driver-not-ready.<driver>`) and add, change or
/// remove no other taint; touch no other field of the spec (no
/// `unschedulable`). A registrar never deletes a Node. These checks run on
/// Node updates only; a CSINode is the registrar's own object.
fn own_node_changes() -> Vec<Validation> {
    let map = |obj: &str, field: &str| {
        format!("has({obj}.metadata.{field}) ? {obj}.metadata.{field} : {{}}")
    };
    let (old_labels, new_labels) = (map("oldObject", "labels"), map("object", "labels"));
    let (old_ann, new_ann) = (
        map("oldObject", "annotations"),
        map("object", "annotations"),
    );
    let taints = |obj: &str| format!("(has({obj}.spec.taints) ? {obj}.spec.taints : [])");
    let (old_taints, new_taints) = (taints("oldObject"), taints("object"));
    let domain = "(k.indexOf('/') < 0 ? '' : k.substring(0, k.indexOf('/')))";
    let reserved = format!(
        "({domain} == 'kubernetes.io' || {domain}.endsWith('.kubernetes.io') || \
         {domain} == 'k8s.io' || {domain}.endsWith('.k8s.io')) && {domain} != 'topology.kubernetes.io'"
    );
    let spec_same = NODE_SPEC_FIELDS
        .iter()
        .map(|f| {
            format!(
                "(has(object.spec.{f}) == has(oldObject.spec.{f}) && \
                 (!has(object.spec.{f}) || object.spec.{f} == oldObject.spec.{f}))"
            )
        })
        .collect::<Vec<_>>()
        .join(" && ");
    let refuse = |what: &str| {
        Some(format!(
            "request.userInfo.username + ' may not {what} on Node ' + request.name + \
             ': a registrar adds the topology labels and node ID of its driver and removes its \
             readiness taint, nothing else'"
        ))
    };
    let check = |expression: String, what: &str| Validation {
        expression: format!("!variables.nodeUpdate || ({expression})"),
        message_expression: refuse(what),
        reason: Some("Forbidden".into()),
        ..Default::default()
    };
    vec![
        Validation {
            expression: "request.resource.resource != 'nodes' || request.operation != 'DELETE'"
                .into(),
            message_expression: Some(
                "request.userInfo.username + ' may not delete Node ' + request.name".into(),
            ),
            reason: Some("Forbidden".into()),
            ..Default::default()
        },
        check(
            format!(
                "({old_labels}).all(k, k in ({new_labels}) && ({new_labels})[k] == ({old_labels})[k])"
            ),
            "change or remove a label",
        ),
        check(
            format!("({new_labels}).all(k, k in ({old_labels}) || !({reserved}))"),
            "add a label under kubernetes.io or k8s.io (node-role, node-restriction)",
        ),
        check(
            format!(
                "({old_ann}).all(k, k == '{NODE_ID_ANNOTATION}' || \
                 (k in ({new_ann}) && ({new_ann})[k] == ({old_ann})[k])) && \
                 ({new_ann}).all(k, k == '{NODE_ID_ANNOTATION}' || k in ({old_ann}))"
            ),
            "change an annotation but the node-ID one",
        ),
        check(
            format!(
                "{new_taints}.all(t, {old_taints}.exists(o, o == t)) && \
                 {old_taints}.all(o, {new_taints}.exists(t, t == o) || \
                 o.key.startsWith('{}'))",
                csiops_crds::READINESS_TAINT_PREFIX
            ),
            "add, change or remove a taint but a driver-readiness one",
        ),
        check(spec_same, "change the spec but its taints"),
    ]
}

/// Name of the host-access policy and its binding.
pub const HOST_ACCESS_POLICY: &str = "csiops-driver-host-access";
/// The verb on `csidriverdeployments.csiops.dev` that allows host access
/// when granted cluster-wide (no such request is ever made; RBAC and the
/// authorizer need none).
pub const HOST_ACCESS_VERB: &str = "host-access";
/// The namespace label that allows host access to every requester in it.
pub const HOST_ACCESS_LABEL: &str = "csiops.dev/host-access";
/// Its value.
pub const HOST_ACCESS_LABEL_VALUE: &str = "allowed";
/// Spec fields anyone who may update the object may change: holding the
/// rollout, its pace, the sidecars' verbosity, the version label (the
/// images stay what an admin set).
pub const HARMLESS_FIELDS: &[&str] = &["paused", "rollout", "logLevel", "version"];

/// The spec fields of the CRD (every one but [`HARMLESS_FIELDS`] needs
/// host access to change), read from the generated schema so a new field
/// is covered the day it is added.
pub fn guarded_spec_fields() -> Vec<String> {
    let crd = csiops_crds::crd();
    let props = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .and_then(|s| s.properties.as_ref());
    props
        .map(|p| {
            p.keys()
                .filter(|k| !HARMLESS_FIELDS.contains(&k.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The host-access policy and its binding (Deny).
pub fn host_access(
    labels: &BTreeMap<String, String>,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let allowed = format!(
        "authorizer.group('{MARKER_GROUP}').resource('csidriverdeployments').check('{HOST_ACCESS_VERB}').allowed() || \
         (has(namespaceObject.metadata.labels) && '{HOST_ACCESS_LABEL}' in namespaceObject.metadata.labels && \
         namespaceObject.metadata.labels['{HOST_ACCESS_LABEL}'] == '{HOST_ACCESS_LABEL_VALUE}')"
    );
    // The guarded fields that differ, by name (for the message).
    let changed = guarded_spec_fields()
        .iter()
        .map(|f| {
            format!(
                "((has(object.spec.{f}) != has(oldObject.spec.{f})) || \
                 (has(object.spec.{f}) && object.spec.{f} != oldObject.spec.{f}) ? ['{f}'] : [])"
            )
        })
        .collect::<Vec<_>>()
        .join(" + ");
    let switch = format!(
        "the verb {HOST_ACCESS_VERB} on csidriverdeployments.csiops.dev granted cluster-wide \
         (a ClusterRoleBinding), or the label {HOST_ACCESS_LABEL}={HOST_ACCESS_LABEL_VALUE} on \
         the namespace (see the README, Security model)"
    );
    let policy = ValidatingAdmissionPolicy {
        metadata: meta(HOST_ACCESS_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![rule(
                    MARKER_GROUP,
                    "csidriverdeployments",
                    &["CREATE", "UPDATE"],
                )]),
                ..Default::default()
            }),
            variables: Some(vec![
                Variable {
                    name: "allowed".into(),
                    expression: allowed,
                },
                Variable {
                    name: "changed".into(),
                    expression: format!(
                        "request.operation == 'UPDATE' ? ({changed}) : []"
                    ),
                },
            ]),
            validations: Some(vec![
                Validation {
                    expression: "request.operation != 'CREATE' || variables.allowed".into(),
                    message_expression: Some(format!(
                        "request.userInfo.username + ' may not create CSIDriverDeployment ' + \
                         request.namespace + '/' + request.name + ': it runs its driver \
                         privileged on every node, with the kubelet directory and the images, \
                         host namespaces, volumes and StorageClasses its spec names; that needs {switch}'"
                    )),
                    reason: Some("Forbidden".into()),
                    ..Default::default()
                },
                Validation {
                    expression: "variables.allowed || size(variables.changed) == 0".into(),
                    message_expression: Some(format!(
                        "request.userInfo.username + ' may not change spec.' + \
                         variables.changed.join(', spec.') + ' of CSIDriverDeployment ' + \
                         request.namespace + '/' + request.name + ': without host access only \
                         spec.{} may change; anything else is what its privileged pods run, which needs {switch}'",
                        HARMLESS_FIELDS.join(", spec.")
                    )),
                    reason: Some("Forbidden".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: meta(HOST_ACCESS_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(HOST_ACCESS_POLICY.into()),
            validation_actions: Some(vec!["Deny".into()]),
            ..Default::default()
        }),
    };
    (policy, binding)
}

/// Name of the policy guarding the namespace label, and its binding.
pub const HOST_ACCESS_LABEL_POLICY: &str = "csiops-host-access-label";

/// The policy that keeps [`HOST_ACCESS_LABEL`] a cluster admin's switch,
/// and its binding (Deny). Namespaces are cluster-scoped, but whoever may
/// *create* one writes its labels: without this, a user allowed to create
/// namespaces and CSIDriverDeployments would create a namespace that already
/// carries the label and gain host access. Setting the label, or changing
/// its value, on create or update therefore needs what host access itself
/// needs: the verb [`HOST_ACCESS_VERB`] granted cluster-wide. Removing it
/// takes access away and stays open; so does every other label.
pub fn host_access_label(
    labels: &BTreeMap<String, String>,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let value = |obj: &str| {
        format!(
            "has({obj}.metadata.labels) && '{HOST_ACCESS_LABEL}' in {obj}.metadata.labels ? \
             {obj}.metadata.labels['{HOST_ACCESS_LABEL}'] : ''"
        )
    };
    let policy = ValidatingAdmissionPolicy {
        metadata: meta(HOST_ACCESS_LABEL_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![rule("", "namespaces", &["CREATE", "UPDATE"])]),
                ..Default::default()
            }),
            variables: Some(vec![
                Variable {
                    name: "label".into(),
                    expression: value("object"),
                },
                Variable {
                    name: "before".into(),
                    expression: format!(
                        "request.operation == 'UPDATE' ? ({}) : ''",
                        value("oldObject")
                    ),
                },
            ]),
            validations: Some(vec![Validation {
                expression: format!(
                    "variables.label == '' || variables.label == variables.before || \
                     authorizer.group('{MARKER_GROUP}').resource('csidriverdeployments').check('{HOST_ACCESS_VERB}').allowed()"
                ),
                message_expression: Some(format!(
                    "request.userInfo.username + ' may not set the label {HOST_ACCESS_LABEL} on \
                     namespace ' + request.name + ': it lets every CSIDriverDeployment of the \
                     namespace run privileged on every node, so setting it needs what host access \
                     needs, the verb {HOST_ACCESS_VERB} on csidriverdeployments.csiops.dev granted \
                     cluster-wide (a ClusterRoleBinding)'"
                )),
                reason: Some("Forbidden".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: meta(HOST_ACCESS_LABEL_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(HOST_ACCESS_LABEL_POLICY.into()),
            validation_actions: Some(vec!["Deny".into()]),
            ..Default::default()
        }),
    };
    (policy, binding)
}

/// Name of the policy that limits the operator's Node writes to takeover
/// labels, and its binding.
pub const OPERATOR_NODE_LABELS_POLICY: &str = "csiops-operator-node-labels";

/// The operator patches Nodes only for a takeover (`spec.adoption`): the
/// label `adopt.csiops.dev/<driver>` says which plugin runs there. This
/// policy (Deny) lets the operator's account change nothing else of a Node:
/// no other label, no annotation, no taint, nothing of its spec.
pub fn operator_node_labels(
    labels: &BTreeMap<String, String>,
    account: &str,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let prefix = csiops_crds::adoption_label_key("");
    let same_except_adopt = |a: &str, b: &str| {
        format!(
            "(!has({a}.metadata.labels) || {a}.metadata.labels.all(k, k.startsWith('{prefix}') || \
              (has({b}.metadata.labels) && k in {b}.metadata.labels && {b}.metadata.labels[k] == {a}.metadata.labels[k])))"
        )
    };
    let unchanged = |f: &str| {
        format!(
            "(has(object.{f}) == has(oldObject.{f}) && (!has(object.{f}) || object.{f} == oldObject.{f}))"
        )
    };
    let expression = [
        same_except_adopt("object", "oldObject"),
        same_except_adopt("oldObject", "object"),
        unchanged("metadata.annotations"),
        unchanged("spec"),
    ]
    .join(" && ");
    let policy = ValidatingAdmissionPolicy {
        metadata: meta(OPERATOR_NODE_LABELS_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![rule("", "nodes", &["UPDATE"])]),
                ..Default::default()
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "csiops-operator".into(),
                expression: format!("request.userInfo.username == '{account}'"),
            }]),
            validations: Some(vec![Validation {
                expression,
                message: Some(format!(
                    "the operator changes only the labels {prefix}<driver> of a Node (a takeover, spec.adoption)"
                )),
                reason: Some("Forbidden".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: meta(OPERATOR_NODE_LABELS_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(OPERATOR_NODE_LABELS_POLICY.into()),
            validation_actions: Some(vec!["Deny".into()]),
            ..Default::default()
        }),
    };
    (policy, binding)
}

/// A takeover (`spec.adoption`) confines the old node DaemonSet, which no
/// CSIDriverDeployment owns, to the nodes it still serves: an update that
/// changes neither its pods' containers, volumes, account nor host access
/// (only their scheduling and its update strategy) gives no power, and the
/// fence lets it through.
fn confinement_only() -> String {
    let unchanged = |f: &str| {
        format!(
            "(has(object.spec.template.spec.{f}) == has(oldObject.spec.template.spec.{f}) && \
             (!has(object.spec.template.spec.{f}) || \
              object.spec.template.spec.{f} == oldObject.spec.template.spec.{f}))"
        )
    };
    let fields = [
        "containers",
        "initContainers",
        "volumes",
        "serviceAccountName",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "securityContext",
    ];
    let mut parts = vec![
        "request.operation == 'UPDATE'".to_string(),
        "request.resource.resource == 'daemonsets'".to_string(),
    ];
    parts.extend(fields.iter().map(|f| unchanged(f)));
    parts.join(" && ")
}

/// Name of the policy fencing the operator's own writes, and its binding.
pub const OPERATOR_FENCE_POLICY: &str = "csiops-operator-fence";

/// The policy that fences the operator's own power, and its binding (Deny).
/// RBAC's `bind` check limits which roles the operator may bind, not to
/// whom, and its workload verbs reach every namespace: its token alone
/// could bind `csiops:provisioner` to any account and run pods with it.
/// So every binding and workload the operator writes must be owned by a
/// CSIDriverDeployment (a controller owner reference in its namespace; the
/// owner labels on a ClusterRoleBinding, and on a RoleBinding of
/// `csiops:secret-reader`, which lives in the namespace of the Secrets it
/// grants, where no owner reference can reach) and may name only that object's
/// two ServiceAccounts, `<name>-controller` and `<name>-node` in its
/// namespace: as subjects of a binding, as the account of a workload's
/// pods; and a PodDisruptionBudget it writes selects only that object's
/// pods (one over anyone else's would block their drains). `account` is
/// the operator's user name
/// (`system:serviceaccount:<namespace>:<name>`).
pub fn operator_fence(
    labels: &BTreeMap<String, String>,
    account: &str,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    use crate::render::labels::{INSTANCE, OWNER_NAME, OWNER_NAMESPACE, OWNER_UID};
    use crate::render::names::{CONTROLLER_SUFFIX, NODE_SUFFIX};
    let label_owned = format!(
        "request.resource.resource == 'clusterrolebindings' || \
         (request.resource.resource == 'rolebindings' && object.roleRef.name == '{}')",
        crate::render::names::SECRET_READER_ROLE_NAME
    );
    let owner_name = format!(
        "variables.labelOwned ? \
         (has(object.metadata.labels) && '{OWNER_UID}' in object.metadata.labels && \
          '{OWNER_NAME}' in object.metadata.labels ? object.metadata.labels['{OWNER_NAME}'] : '') : \
         (has(object.metadata.ownerReferences) ? \
          object.metadata.ownerReferences.filter(o, o.kind == 'CSIDriverDeployment' && \
            o.apiVersion.startsWith('{MARKER_GROUP}/') && has(o.controller) && o.controller) : [])\
          .map(o, o.name).join('')"
    );
    let owner_namespace = format!(
        "variables.labelOwned ? \
         (has(object.metadata.labels) && '{OWNER_NAMESPACE}' in object.metadata.labels ? \
          object.metadata.labels['{OWNER_NAMESPACE}'] : '') : request.namespace"
    );
    let policy = ValidatingAdmissionPolicy {
        metadata: meta(OPERATOR_FENCE_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![
                    rule(
                        "rbac.authorization.k8s.io",
                        "rolebindings",
                        &["CREATE", "UPDATE"],
                    ),
                    rule(
                        "rbac.authorization.k8s.io",
                        "clusterrolebindings",
                        &["CREATE", "UPDATE"],
                    ),
                    rule("apps", "statefulsets", &["CREATE", "UPDATE"]),
                    rule("apps", "daemonsets", &["CREATE", "UPDATE"]),
                    rule("apps", "deployments", &["CREATE", "UPDATE"]),
                    rule("policy", "poddisruptionbudgets", &["CREATE", "UPDATE"]),
                ]),
                ..Default::default()
            }),
            match_conditions: Some(vec![
                MatchCondition {
                    name: "csiops-operator".into(),
                    expression: format!("request.userInfo.username == '{account}'"),
                },
                MatchCondition {
                    name: "not-a-takeover-confinement".into(),
                    expression: format!("!({})", confinement_only()),
                },
            ]),
            variables: Some(vec![
                Variable {
                    name: "labelOwned".into(),
                    expression: label_owned,
                },
                Variable {
                    name: "owner".into(),
                    expression: owner_name,
                },
                Variable {
                    name: "ownerNamespace".into(),
                    expression: owner_namespace,
                },
                Variable {
                    name: "accounts".into(),
                    expression: format!(
                        "[variables.owner + '{CONTROLLER_SUFFIX}', variables.owner + '{NODE_SUFFIX}']"
                    ),
                },
            ]),
            validations: Some(vec![
                Validation {
                    expression: "variables.owner != ''".into(),
                    message_expression: Some(
                        "'the operator writes only objects a CSIDriverDeployment owns, and ' + \
                         request.resource.resource + ' ' + request.name + ' names no owner'"
                            .into(),
                    ),
                    reason: Some("Forbidden".into()),
                    ..Default::default()
                },
                Validation {
                    expression: "!(request.resource.resource in ['rolebindings', 'clusterrolebindings']) || \
                         (has(object.subjects) && object.subjects.all(s, s.kind == 'ServiceAccount' && \
                          has(s.namespace) && s.namespace == variables.ownerNamespace && \
                          s.name in variables.accounts))"
                        .into(),
                    message_expression: Some(
                        "'the operator binds roles only to the ServiceAccounts of the \
                         CSIDriverDeployment that owns the binding (' + variables.ownerNamespace + \
                         '/' + variables.accounts.join(', ') + '): refusing ' + \
                         request.resource.resource + ' ' + request.name"
                            .into(),
                    ),
                    reason: Some("Forbidden".into()),
                    ..Default::default()
                },
                Validation {
                    expression: "!(request.resource.resource in ['statefulsets', 'daemonsets', 'deployments']) || \
                         (has(object.spec.template.spec.serviceAccountName) && \
                          object.spec.template.spec.serviceAccountName in variables.accounts)"
                        .into(),
                    message_expression: Some(
                        "'the operator runs pods only as the ServiceAccounts of the \
                         CSIDriverDeployment that owns the workload (' + \
                         variables.accounts.join(', ') + '): refusing ' + \
                         request.resource.resource + ' ' + request.name"
                            .into(),
                    ),
                    reason: Some("Forbidden".into()),
                    ..Default::default()
                },
                Validation {
                    expression: format!(
                        "request.resource.resource != 'poddisruptionbudgets' || \
                         (has(object.spec.selector) && has(object.spec.selector.matchLabels) && \
                          '{INSTANCE}' in object.spec.selector.matchLabels && \
                          object.spec.selector.matchLabels['{INSTANCE}'] == variables.owner)"
                    ),
                    message_expression: Some(
                        "'the operator guards only the pods of the CSIDriverDeployment that owns \
                         the budget (' + variables.owner + '): refusing ' + \
                         request.resource.resource + ' ' + request.name"
                            .into(),
                    ),
                    reason: Some("Forbidden".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: meta(OPERATOR_FENCE_POLICY, labels),
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(OPERATOR_FENCE_POLICY.into()),
            validation_actions: Some(vec!["Deny".into()]),
            ..Default::default()
        }),
    };
    (policy, binding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_field_but_the_harmless_ones_is_guarded() {
        let guarded = guarded_spec_fields();
        for field in [
            "driver",
            "node",
            "controller",
            "sidecars",
            "storageClasses",
            "volumeAttributesClasses",
            "csiDriver",
            "imagePullSecrets",
            "monitoring",
            "topology",
            "driverName",
        ] {
            assert!(guarded.iter().any(|g| g == field), "{field}: {guarded:?}");
        }
        for field in HARMLESS_FIELDS {
            assert!(!guarded.iter().any(|g| g == field), "{field}");
        }
        let (policy, _) = host_access(&BTreeMap::new());
        let changed = &policy.spec.as_ref().unwrap().variables.as_ref().unwrap()[1].expression;
        for field in &guarded {
            assert!(
                changed.contains(&format!("object.spec.{field} != oldObject.spec.{field}")),
                "{field}"
            );
        }
    }
}
