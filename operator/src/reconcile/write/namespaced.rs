//! The namespaced supporting objects of a driver (ServiceAccounts, the
//! RoleBindings of the shipped namespaced roles, the metrics Service, the
//! controller's PodDisruptionBudget) that the current spec no longer
//! renders (the controller's ServiceAccount and leader-election binding
//! once a driver is node-local; the budget once the controller is down to
//! one replica or the budget is disabled): found by the
//! driver's selector labels and our owner reference, and deleted when the
//! spec changes, as their cluster-scoped siblings are (see
//! [`super::cluster`]). The workloads are the rollout's, and the
//! PodMonitor is [`super::monitoring`]'s.
//!
//! No Roles: the operator writes none (the roles are shipped ClusterRoles
//! it may only bind). Roles an earlier version made carry our owner
//! reference and go with the object; unbound, they grant nothing.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::apply::Owner;
use super::cluster::delete_all;
use crate::reconcile::error::Error;
use crate::render::labels::{INSTANCE, MANAGED_BY, MANAGED_BY_VALUE};
use crate::render::Rendered;

/// What the spec renders of each namespaced kind, by name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Keep {
    pub service_accounts: BTreeSet<String>,
    pub role_bindings: BTreeSet<String>,
    pub services: BTreeSet<String>,
    pub disruption_budgets: BTreeSet<String>,
}

impl Keep {
    /// The names `rendered` holds.
    pub fn of(rendered: &Rendered) -> Keep {
        Keep {
            service_accounts: rendered
                .controller_service_account
                .iter()
                .chain(std::iter::once(&rendered.node_service_account))
                .map(|sa| sa.name_any())
                .collect(),
            role_bindings: rendered
                .role_bindings
                .iter()
                .map(|r| r.name_any())
                .collect(),
            services: rendered
                .metrics_service
                .iter()
                .map(|s| s.name_any())
                .collect(),
            disruption_budgets: rendered
                .controller_disruption_budget
                .iter()
                .map(|b| b.name_any())
                .collect(),
        }
    }
}

/// Deletes `owner`'s namespaced supporting objects not in `keep`; how many.
pub async fn prune(client: &Client, owner: Owner<'_>, keep: &Keep) -> Result<usize, Error> {
    let ns = owner.namespace;
    let selector = format!("{MANAGED_BY}={MANAGED_BY_VALUE},{INSTANCE}={}", owner.name);
    let sel = selector.as_str();
    let o = Some(owner);
    let role_bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    Ok(
        delete_all(&role_bindings, "RoleBinding", sel, o, &keep.role_bindings).await?
            + delete_all(&accounts, "ServiceAccount", sel, o, &keep.service_accounts).await?
            + delete_all(&services, "Service", sel, o, &keep.services).await?
            + delete_all(
                &budgets,
                "PodDisruptionBudget",
                sel,
                o,
                &keep.disruption_budgets,
            )
            .await?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{render, RenderConfig};
    use csiops_crds::CSIDriverDeployment;

    fn kept(topology: &str, edit: impl Fn(&mut CSIDriverDeployment)) -> Keep {
        let mut o: CSIDriverDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "csiops.dev/v1alpha1",
            "kind": "CSIDriverDeployment",
            "metadata": {"name": "hp", "namespace": "ns", "uid": "u-1"},
            "spec": {
                "driverName": "hp.csi.example.com",
                "version": "v1",
                "topology": topology,
                "driver": {"image": "driver:1"},
                "csiDriver": {"attachRequired": false}
            }
        }))
        .expect("object parses");
        edit(&mut o);
        let cfg = RenderConfig {
            sidecar_image: "sidecar:1".into(),
            operator_version: "0.1.0".into(),
        };
        Keep::of(&render(&o, &cfg).expect("renders"))
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_node_local_spec_keeps_no_controller_objects() {
        let k = kept("NodeLocal", |_| {});
        assert_eq!(k.service_accounts, names(&["hp-node"]));
        assert_eq!(k.role_bindings, names(&["hp-journal"]));
    }

    #[test]
    fn a_central_spec_keeps_no_node_role() {
        let k = kept("Central", |_| {});
        assert_eq!(k.service_accounts, names(&["hp-controller", "hp-node"]));
        assert_eq!(k.role_bindings, names(&["hp-journal", "hp-leases"]));
        // Without any controller sidecar the leader-election binding goes too.
        let k = kept("Central", |o| {
            o.spec.sidecars.provisioner.enabled = false;
            o.spec.sidecars.liveness_probe.enabled = false;
        });
        assert!(k.role_bindings.is_empty(), "{:?}", k.role_bindings);
        assert!(k.services.is_empty());
    }
}
