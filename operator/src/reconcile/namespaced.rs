//! The namespaced supporting objects of a driver (ServiceAccounts, the
//! leader-election Role and RoleBinding, the metrics Service) that the
//! current spec no longer renders: found by the driver's selector labels and
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
            service_accounts: [
                rendered.controller_service_account.name_any(),
                rendered.node_service_account.name_any(),
            ]
            .into(),
            roles: rendered
                .leader_election_role
                .iter()
                .map(|r| r.name_any())
                .collect(),
            role_bindings: rendered
                .leader_election_role_binding
                .iter()
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
