//! Whether the shipped admission policies are in force. Pure.
//!
//! RBAC alone lets whoever may edit a CSIDriverDeployment run privileged
//! pods on every node; the policies of [`crate::policy`] are what confine
//! that. A policy or binding deleted, re-pointed, switched to warn or audit
//! only, or set to let CEL errors through, silently reopens the path, so
//! the operator compares what the cluster holds with what it ships and
//! says what differs (see `reconcile::watch::admission`).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};

/// The Degraded reason (and Warning Event) of every object while a shipped
/// policy is not in force.
pub const REASON: &str = "AdmissionPoliciesMissing";

/// What differs between `shipped` and the cluster's `policies` and
/// `bindings`, one line each; empty when every shipped policy is in force.
/// Only the properties that make a policy refuse are compared: its binding
/// names it and denies, and it fails closed. Its CEL is not: a later
/// install.yaml may change it, and whoever may edit policies is a cluster
/// admin already.
pub fn differences(
    shipped: &[(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding)],
    policies: &[ValidatingAdmissionPolicy],
    bindings: &[ValidatingAdmissionPolicyBinding],
) -> Vec<String> {
    let mut out = Vec::new();
    for (want_policy, want_binding) in shipped {
        let policy_name = want_policy.metadata.name.as_deref().unwrap_or_default();
        let binding_name = want_binding.metadata.name.as_deref().unwrap_or_default();
        match policies
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(policy_name))
        {
            None => out.push(format!(
                "ValidatingAdmissionPolicy {policy_name} is missing"
            )),
            Some(p) => {
                let failure = p.spec.as_ref().and_then(|s| s.failure_policy.as_deref());
                // The API server defaults an unset failurePolicy to Fail.
                if failure.is_some_and(|f| f != "Fail") {
                    out.push(format!(
                        "ValidatingAdmissionPolicy {policy_name} has failurePolicy {}, not Fail",
                        failure.unwrap_or_default()
                    ));
                }
            }
        }
        match bindings
            .iter()
            .find(|b| b.metadata.name.as_deref() == Some(binding_name))
        {
            None => out.push(format!(
                "ValidatingAdmissionPolicyBinding {binding_name} is missing"
            )),
            Some(b) => {
                let spec = b.spec.as_ref();
                let bound = spec
                    .and_then(|s| s.policy_name.as_deref())
                    .unwrap_or_default();
                if bound != policy_name {
                    out.push(format!(
                        "ValidatingAdmissionPolicyBinding {binding_name} binds {bound:?}, not {policy_name}"
                    ));
                }
                let actions = spec
                    .and_then(|s| s.validation_actions.clone())
                    .unwrap_or_default();
                if !actions.iter().any(|a| a == "Deny") {
                    out.push(format!(
                        "ValidatingAdmissionPolicyBinding {binding_name} does not deny (validationActions {actions:?})"
                    ));
                }
                // A binding's matchResources or paramRef narrowing it is not
                // compared: the shipped ones set neither.
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install;

    fn shipped() -> Vec<(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding)> {
        install::objects().policies
    }

    fn cluster() -> (
        Vec<ValidatingAdmissionPolicy>,
        Vec<ValidatingAdmissionPolicyBinding>,
    ) {
        shipped().into_iter().unzip()
    }

    #[test]
    fn the_shipped_objects_are_in_force() {
        let (p, b) = cluster();
        assert!(!p.is_empty());
        assert_eq!(differences(&shipped(), &p, &b), Vec::<String>::new());
    }

    #[test]
    fn a_deleted_policy_or_binding_is_named() {
        let (mut p, mut b) = cluster();
        let gone = p.remove(1).metadata.name.unwrap_or_default();
        let unbound = b.remove(0).metadata.name.unwrap_or_default();
        let d = differences(&shipped(), &p, &b);
        assert_eq!(
            d,
            vec![
                format!("ValidatingAdmissionPolicyBinding {unbound} is missing"),
                format!("ValidatingAdmissionPolicy {gone} is missing"),
            ]
        );
    }

    #[test]
    fn a_binding_that_only_warns_or_binds_another_policy_is_named() {
        let (mut p, mut b) = cluster();
        let spec = b[0].spec.as_mut().expect("spec");
        spec.validation_actions = Some(vec!["Warn".into(), "Audit".into()]);
        let spec = b[1].spec.as_mut().expect("spec");
        spec.policy_name = Some("something-else".into());
        p[2].spec.as_mut().expect("spec").failure_policy = Some("Ignore".into());
        let d = differences(&shipped(), &p, &b);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].contains("does not deny"), "{d:?}");
        assert!(d[0].contains("Warn"), "{d:?}");
        assert!(d[1].contains("binds \"something-else\""), "{d:?}");
        assert!(d[2].contains("failurePolicy Ignore"), "{d:?}");
    }

    #[test]
    fn an_unset_failure_policy_is_the_servers_default_fail() {
        let (mut p, b) = cluster();
        for policy in &mut p {
            policy.spec.as_mut().expect("spec").failure_policy = None;
        }
        assert!(differences(&shipped(), &p, &b).is_empty());
    }
}
