//! The cluster's `CSIDriver` object, which tells kubelet and the
//! attach/detach controller how to treat the driver's volumes.

use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, TokenRequest};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::labels::cluster_owner_labels;
use super::names::csi_driver_name;
use super::Ctx;

/// Every boolean is written explicitly (also `false`) so server-side apply
/// owns it and a later edit back to the default is applied, not ignored.
/// `fsGroupPolicy` and `volumeLifecycleModes` are left to the API server's
/// defaults when unset; `tokenRequests` and
/// `nodeAllocatableUpdatePeriodSeconds` are left out when unset (kubelet
/// then requests no token, and keeps `allocatable.count` as registered).
/// `attachRequired` and `volumeLifecycleModes` are immutable (and
/// `fsGroupPolicy`/`podInfoOnMount` before Kubernetes 1.29), so changing them
/// needs a delete and re-create, which the reconciler decides; every other
/// field is updated in place.
pub(crate) fn csi_driver(ctx: &Ctx<'_>) -> CSIDriver {
    let s = &ctx.spec().csi_driver;
    let modes: Vec<String> = s
        .volume_lifecycle_modes
        .iter()
        .map(|m| m.as_str().to_string())
        .collect();
    CSIDriver {
        metadata: ObjectMeta {
            name: Some(csi_driver_name(ctx.obj)),
            labels: Some(cluster_owner_labels(ctx.obj)),
            ..Default::default()
        },
        spec: CSIDriverSpec {
            attach_required: Some(s.attach_required),
            pod_info_on_mount: Some(s.pod_info_on_mount),
            fs_group_policy: s.fs_group_policy.map(|p| p.as_str().to_string()),
            volume_lifecycle_modes: (!modes.is_empty()).then_some(modes),
            storage_capacity: Some(s.storage_capacity),
            requires_republish: Some(s.requires_republish),
            se_linux_mount: Some(s.se_linux_mount),
            token_requests: (!s.token_requests.is_empty()).then(|| {
                s.token_requests
                    .iter()
                    .map(|t| TokenRequest {
                        audience: t.audience.clone(),
                        expiration_seconds: t.expiration_seconds,
                    })
                    .collect()
            }),
            node_allocatable_update_period_seconds: s.node_allocatable_update_period_seconds,
            // No `..Default::default()`: every field of the pinned API's
            // CSIDriverSpec is named, so moving to a newer k8s-openapi API
            // (1.35: serviceAccountTokenInSecrets) fails to build here until
            // its new fields are decided on.
        },
    }
}

/// What a `CSIDriver.spec` field needs that kube-apiserver drops silently
/// (its registry strategy clears it) while a feature gate is off, for the
/// fields that have one in Kubernetes 1.34.
fn feature_gate(field: &str) -> Option<&'static str> {
    match field {
        "nodeAllocatableUpdatePeriodSeconds" => Some(
            "the MutableCSINodeAllocatableCount feature gate on kube-apiserver and kubelet, beta and off by default in Kubernetes 1.34",
        ),
        "seLinuxMount" => Some("the SELinuxMountReadWriteOncePod feature gate on kube-apiserver"),
        _ => None,
    }
}

/// The `spec` fields set in `desired` that `stored` (what the API server
/// stores of it, from a dry run) lacks: fields behind a feature gate that is
/// off on the API server.
pub fn unstored_fields(desired: &CSIDriver, stored: &CSIDriver) -> Vec<String> {
    let fields = |spec: &CSIDriverSpec| match serde_json::to_value(spec) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let have = fields(&stored.spec);
    fields(&desired.spec)
        .into_iter()
        .filter(|(k, v)| !v.is_null() && have.get(k).is_none_or(serde_json::Value::is_null))
        .map(|(k, _)| k)
        .collect()
}

/// What a Warning Event says about `fields` of CSIDriver `name` that the
/// API server did not store.
pub fn unstored_note(name: &str, fields: &[String]) -> String {
    let each: Vec<String> = fields
        .iter()
        .map(|f| match feature_gate(f) {
            Some(needs) => format!("spec.{f} (it needs {needs})"),
            None => format!("spec.{f}"),
        })
        .collect();
    format!(
        "the API server does not store {} of CSIDriver {name}, which has no effect meanwhile; the operator applies it again at every reconcile (this warning is given once), so it takes effect once the API server stores it",
        each.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(spec: CSIDriverSpec) -> CSIDriver {
        CSIDriver {
            metadata: ObjectMeta::default(),
            spec,
        }
    }

    #[test]
    fn fields_the_api_server_drops_are_named_with_their_gate() {
        let desired = driver(CSIDriverSpec {
            attach_required: Some(true),
            se_linux_mount: Some(false),
            node_allocatable_update_period_seconds: Some(10),
            token_requests: Some(vec![TokenRequest {
                audience: "vault".into(),
                expiration_seconds: None,
            }]),
            ..Default::default()
        });
        // A 1.34 API server with MutableCSINodeAllocatableCount off: the
        // period is cleared, the server's defaults are added.
        let mut stored = desired.clone();
        stored.spec.node_allocatable_update_period_seconds = None;
        stored.spec.fs_group_policy = Some("ReadWriteOnceWithFSType".into());
        stored.spec.volume_lifecycle_modes = Some(vec!["Persistent".into()]);
        let dropped = unstored_fields(&desired, &stored);
        assert_eq!(dropped, vec!["nodeAllocatableUpdatePeriodSeconds"]);
        let note = unstored_note("d.csi.example.com", &dropped);
        assert!(
            note.contains("spec.nodeAllocatableUpdatePeriodSeconds (it needs the MutableCSINodeAllocatableCount feature gate")
                && note.contains("of CSIDriver d.csi.example.com"),
            "{note}"
        );
        // Everything stored: nothing to say.
        assert!(unstored_fields(&desired, &desired).is_empty());
        stored.spec.node_allocatable_update_period_seconds = Some(10);
        assert!(unstored_fields(&desired, &stored).is_empty());
        // A field left unset is never missing.
        let unset = driver(CSIDriverSpec {
            attach_required: Some(true),
            ..Default::default()
        });
        assert_eq!(
            unstored_fields(&unset, &driver(CSIDriverSpec::default())),
            vec!["attachRequired"]
        );
        assert!(unstored_fields(&unset, &unset).is_empty());
    }
}
