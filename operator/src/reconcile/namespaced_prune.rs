//! The namespaced supporting objects a spec stops rendering: the
//! controller's ServiceAccount and leader-election Role when a driver
//! becomes node-local, the node provisioner's Role when it becomes central
//! again (or its provisioner is turned off). Cluster-scoped ones are pruned
//! by [`super::cluster`]; both run when the spec changes.
//!
//! Namespaced objects carry our owner reference and would go with the
//! object anyway; pruning them at once leaves no grant to a ServiceAccount
//! whose pods no longer exist.

use csiops_crds::CSIDriverDeployment;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::Api;
use kube::{Client, ResourceExt};
use tracing::info;

use super::apply::{delete_owned, Owner};
use super::error::Error;
use crate::render::{names, Rendered};

/// A kind of namespaced supporting object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ServiceAccount,
    Role,
    RoleBinding,
}

/// The objects of `obj` that may exist and that `rendered` no longer has,
/// by kind and name. Pure.
pub fn stale(obj: &CSIDriverDeployment, rendered: &Rendered) -> Vec<(Kind, String)> {
    let mut out = Vec::new();
    if rendered.controller_service_account.is_none() {
        out.push((Kind::ServiceAccount, names::controller_name(obj)));
    }
    let pairs = [
        (
            names::leader_election_role_name(obj),
            rendered.leader_election_role.as_ref().map(|r| r.name_any()),
            rendered
                .leader_election_role_binding
                .as_ref()
                .map(|b| b.name_any()),
        ),
        (
            names::node_role_name(obj),
            rendered.node_role.as_ref().map(|r| r.name_any()),
            rendered.node_role_binding.as_ref().map(|b| b.name_any()),
        ),
    ];
    for (name, role, binding) in pairs {
        if binding.as_deref() != Some(name.as_str()) {
            out.push((Kind::RoleBinding, name.clone()));
        }
        if role.as_deref() != Some(name.as_str()) {
            out.push((Kind::Role, name));
        }
    }
    out
}

/// Deletes the [`stale`] objects that exist and are ours (a same-named
/// object of someone else is left alone); how many went.
pub async fn prune(
    client: &Client,
    obj: &CSIDriverDeployment,
    owner: Owner<'_>,
    rendered: &Rendered,
) -> Result<usize, Error> {
    let mut deleted = 0;
    for (kind, name) in stale(obj, rendered) {
        let gone = match kind {
            Kind::ServiceAccount => {
                let api: Api<ServiceAccount> = Api::namespaced(client.clone(), owner.namespace);
                delete_owned(&api, "ServiceAccount", &name, owner).await
            }
            Kind::Role => {
                let api: Api<Role> = Api::namespaced(client.clone(), owner.namespace);
                delete_owned(&api, "Role", &name, owner).await
            }
            Kind::RoleBinding => {
                let api: Api<RoleBinding> = Api::namespaced(client.clone(), owner.namespace);
                delete_owned(&api, "RoleBinding", &name, owner).await
            }
        };
        match gone {
            Ok(true) => {
                info!(object = %owner.name, kind = ?kind, name = %name, "removed what the spec no longer renders");
                deleted += 1;
            }
            Ok(false) | Err(Error::NotOwned { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{render, RenderConfig};

    fn obj(topology: &str) -> CSIDriverDeployment {
        serde_json::from_value(serde_json::json!({
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
        .expect("object parses")
    }

    fn rendered(o: &CSIDriverDeployment) -> Rendered {
        let cfg = RenderConfig {
            sidecar_image: "sidecar:1".into(),
            operator_version: "0.1.0".into(),
        };
        render(o, &cfg).expect("renders")
    }

    #[test]
    fn a_node_local_spec_leaves_the_controllers_objects_stale() {
        let o = obj("NodeLocal");
        assert_eq!(
            stale(&o, &rendered(&o)),
            [
                (Kind::ServiceAccount, "hp-controller".to_string()),
                (Kind::RoleBinding, "hp-leader-election".to_string()),
                (Kind::Role, "hp-leader-election".to_string()),
            ]
        );
    }

    #[test]
    fn a_central_spec_leaves_the_node_role_stale() {
        let o = obj("Central");
        assert_eq!(
            stale(&o, &rendered(&o)),
            [
                (Kind::RoleBinding, "hp-node".to_string()),
                (Kind::Role, "hp-node".to_string()),
            ]
        );
        // Without any controller sidecar the leader-election Role goes too.
        let mut o = obj("Central");
        o.spec.sidecars.provisioner.enabled = false;
        o.spec.sidecars.liveness_probe.enabled = false;
        let names: Vec<_> = stale(&o, &rendered(&o))
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        assert!(
            names.contains(&"hp-leader-election".to_string()),
            "{names:?}"
        );
    }
}
