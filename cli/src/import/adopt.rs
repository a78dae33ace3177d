//! `import --adopt`: the CR takes the input's running deployment over
//! (`spec.adoption`, docs/adoption.md) instead of deploying beside it.
//! Pure: from what the inventory found.

use csiops_crds::{
    AdoptedObject, AdoptedObjectKind, AdoptedWorkload, AdoptedWorkloadKind, AdoptionSpec,
};

use super::classify::Inventory;
use super::ImportError;

/// `spec.adoption` for the input's workloads, and what the user should
/// know. Every workload must be in `namespace` (the CR's): the sidecars'
/// Leases are, and only a shared Lease keeps one provisioner acting.
pub fn adoption(
    inv: &Inventory<'_>,
    namespace: &str,
) -> Result<(AdoptionSpec, Vec<String>), ImportError> {
    let mut notes = Vec::new();
    let in_ns = |ns: Option<&String>, id: String| -> Result<(), ImportError> {
        match ns {
            Some(ns) if ns != namespace => Err(ImportError::AdoptionNamespace {
                object: id,
                namespace: ns.clone(),
                cr: namespace.to_string(),
            }),
            _ => Ok(()),
        }
    };
    let controller = match &inv.controller {
        Some(pod) => {
            in_ns(pod.object.namespace.as_ref(), pod.object.id())?;
            let kind = match pod.object.kind.as_str() {
                "Deployment" => AdoptedWorkloadKind::Deployment,
                _ => AdoptedWorkloadKind::StatefulSet,
            };
            Some(AdoptedWorkload {
                kind,
                name: pod.object.name.clone(),
            })
        }
        None => None,
    };
    let node = match &inv.node {
        Some(pod) => {
            in_ns(pod.object.namespace.as_ref(), pod.object.id())?;
            Some(pod.object.name.clone())
        }
        None => None,
    };
    let mut remove = Vec::new();
    for o in &inv.objects {
        let kind = match o.kind.as_str() {
            "ServiceAccount" => AdoptedObjectKind::ServiceAccount,
            "RoleBinding" => AdoptedObjectKind::RoleBinding,
            "Service" => AdoptedObjectKind::Service,
            "ClusterRoleBinding" => AdoptedObjectKind::ClusterRoleBinding,
            // Shipped and built-in roles are not the old deployment's.
            "Role" | "ClusterRole"
                if o.name.starts_with("csiops:") || o.name.starts_with("system:") =>
            {
                continue
            }
            "Role" | "ClusterRole" | "ConfigMap" => {
                notes.push(format!(
                    "{} is left for you to delete after the takeover: the operator holds no verb on {}s (docs/adoption.md)",
                    o.id(),
                    o.kind
                ));
                continue;
            }
            _ => continue,
        };
        if !kind.cluster_scoped() && o.namespace.as_deref().is_some_and(|ns| ns != namespace) {
            notes.push(format!(
                "{} is in namespace {}, not {namespace}: not removed by the takeover",
                o.id(),
                o.namespace.as_deref().unwrap_or_default()
            ));
            continue;
        }
        remove.push(AdoptedObject {
            kind,
            name: o.name.clone(),
        });
    }
    if remove.len() > MAX_REMOVE {
        notes.push(format!(
            "{} objects to remove; spec.adoption.remove holds {MAX_REMOVE}: the rest are left for you",
            remove.len()
        ));
        remove.truncate(MAX_REMOVE);
    }
    Ok((
        AdoptionSpec {
            controller,
            node_daemon_set: node,
            remove,
        },
        notes,
    ))
}

/// `spec.adoption.remove`'s bound in the CRD.
const MAX_REMOVE: usize = 64;
