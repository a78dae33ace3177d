//! The namespaced supporting objects of a driver (ServiceAccounts, the
//! leader-election and node Roles and RoleBindings, the metrics Service)
//! that the current spec no longer renders (the controller's ServiceAccount
//! and leader-election Role once a driver is node-local, the node Role once
//! it is central again): found by the driver's selector labels and
//! our owner reference, and deleted when the spec changes, as their
//! cluster-scoped siblings are (see [`super::cluster`]). The workloads are
//! the rollout's, and the PodMonitor is [`super::monitoring`]'s.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::apply::Owner;
use super::cluster::delete_all;
use super::error::Error;
use crate::render::labels::{INSTANCE, MANAGED_BY, MANAGED_BY_VALUE};
use crate::render::Rendered;

/// What the spec renders of each namespaced kind, by name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Keep {
    pub service_accounts: BTreeSet<String>,
    pub roles: BTreeSet<String>,
    pub role_bindings: BTreeSet<String>,
    pub services: BTreeSet<String>,
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
            roles: rendered
                .leader_election_role
                .iter()
                .chain(&rendered.node_role)
                .map(|r| r.name_any())
                .collect(),
            role_bindings: rendered
                .leader_election_role_binding
                .iter()
                .chain(&rendered.node_role_binding)
                .map(|r| r.name_any())
                .collect(),
            services: rendered
                .metrics_service
                .iter()
                .map(|s| s.name_any())
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
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    // Bindings before roles, so no binding ever points at a missing role.
    Ok(
        delete_all(&role_bindings, "RoleBinding", sel, o, &keep.role_bindings).await?
            + delete_all(&roles, "Role", sel, o, &keep.roles).await?
            + delete_all(&accounts, "ServiceAccount", sel, o, &keep.service_accounts).await?
            + delete_all(&services, "Service", sel, o, &keep.services).await?,
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
        assert_eq!(k.roles, names(&["hp-node"]));
        assert_eq!(k.role_bindings, names(&["hp-node"]));
    }

    #[test]
    fn a_central_spec_keeps_no_node_role() {
        let k = kept("Central", |_| {});
        assert_eq!(k.service_accounts, names(&["hp-controller", "hp-node"]));
        assert_eq!(k.roles, names(&["hp-leader-election"]));
        assert_eq!(k.role_bindings, names(&["hp-leader-election"]));
        // Without any controller sidecar the leader-election Role goes too.
        let k = kept("Central", |o| {
            o.spec.sidecars.provisioner.enabled = false;
            o.spec.sidecars.liveness_probe.enabled = false;
        });
        assert!(k.roles.is_empty(), "{:?}", k.roles);
        assert!(k.services.is_empty());
    }
}
