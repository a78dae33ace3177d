//! ValidatingAdmissionPolicies shipped with the operator (install.yaml and
//! the Helm chart): checks RBAC cannot express, enforced by the API server
//! itself, so they hold whatever the operator or a driver's pods do.
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

/// API group of the marker resource.
pub const MARKER_GROUP: &str = "csiops.dev";
/// The virtual resource whose verbs mark node-scoped accounts (no such
/// resource is served; RBAC and the authorizer do not need one).
pub const MARKER_RESOURCE: &str = "nodescope";
/// Held by the registrar role: "my Node and CSINode writes are limited to my node".
pub const OWN_NODE_VERB: &str = "own-node";
/// Held by no shipped role: exempts an account that also holds [`OWN_NODE_VERB`].
pub const ANY_NODE_VERB: &str = "any-node";
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
            variables: Some(vec![Variable {
                name: "node".into(),
                expression: node,
            }]),
            validations: Some(vec![
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
            ]),
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
