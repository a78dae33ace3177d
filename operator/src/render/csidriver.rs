//! The cluster's `CSIDriver` object, which tells kubelet and the
//! attach/detach controller how to treat the driver's volumes.

use std::borrow::Cow;

use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, TokenRequest};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

use super::labels::cluster_owner_labels;
use super::names::csi_driver_name;
use super::Ctx;

/// The CSIDriver as the operator applies it: k8s-openapi's `CSIDriver` of
/// the pinned API (`v1_35`, the oldest supported) plus the `spec` fields of
/// newer APIs, which that
/// type cannot carry. It serializes as a `CSIDriver` does (`apiVersion`,
/// `kind`, `metadata`, `spec`), the newer fields inside `spec` only when
/// set, so a CSIDriver without them is byte for byte what k8s-openapi
/// writes (and its applied hash unchanged). Read back from the API server
/// (a dry run), it keeps the newer fields the server stored.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct AppliedCSIDriver {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: AppliedCSIDriverSpec,
}

/// `CSIDriver.spec`: the pinned API's fields, then the newer ones.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedCSIDriverSpec {
    #[serde(flatten)]
    pub pinned: CSIDriverSpec,
    /// Kubernetes 1.36 (`VolumeLimitScaling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prevent_pod_scheduling_if_missing: Option<bool>,
}

impl Serialize for AppliedCSIDriver {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("CSIDriver", 4)?;
        s.serialize_field(
            "apiVersion",
            <CSIDriver as k8s_openapi::Resource>::API_VERSION,
        )?;
        s.serialize_field("kind", <CSIDriver as k8s_openapi::Resource>::KIND)?;
        s.serialize_field("metadata", &self.metadata)?;
        s.serialize_field("spec", &self.spec)?;
        s.end()
    }
}

/// Addressed as `CSIDriver` (`storage.k8s.io/v1`, cluster-scoped), so an
/// `Api<AppliedCSIDriver>` reads and writes the cluster's CSIDrivers.
impl kube::Resource for AppliedCSIDriver {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        <CSIDriver as kube::Resource>::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        <CSIDriver as kube::Resource>::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        <CSIDriver as kube::Resource>::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        <CSIDriver as kube::Resource>::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Every boolean of the pinned API is written explicitly (also `false`) so
/// server-side apply owns it and a later edit back to the default is
/// applied, not ignored. `fsGroupPolicy` and `volumeLifecycleModes` are
/// left to the API server's defaults when unset; `tokenRequests`,
/// `nodeAllocatableUpdatePeriodSeconds` and the newer fields
/// (`serviceAccountTokenInSecrets`, `preventPodSchedulingIfMissing`) are
/// left out when unset (kubelet then requests no token, keeps
/// `allocatable.count` as registered, passes tokens in the volume context;
/// the scheduler does not look for the driver on the node).
/// `attachRequired` and `volumeLifecycleModes` are immutable (and
/// `fsGroupPolicy`/`podInfoOnMount` before Kubernetes 1.29), so changing them
/// needs a delete and re-create, which the reconciler decides; every other
/// field is updated in place.
pub(crate) fn csi_driver(ctx: &Ctx<'_>) -> AppliedCSIDriver {
    let s = &ctx.spec().csi_driver;
    let modes: Vec<String> = s
        .volume_lifecycle_modes
        .iter()
        .map(|m| m.as_str().to_string())
        .collect();
    AppliedCSIDriver {
        metadata: ObjectMeta {
            name: Some(csi_driver_name(ctx.obj)),
            labels: Some(cluster_owner_labels(ctx.obj)),
            ..Default::default()
        },
        spec: AppliedCSIDriverSpec {
            pinned: CSIDriverSpec {
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
                service_account_token_in_secrets: s.service_account_token_in_secrets,
                // No `..Default::default()`: every field of the pinned API's
                // CSIDriverSpec is named, so moving to a newer k8s-openapi
                // API fails to build here until its new fields are decided
                // on (1.36's is the one beside this struct).
            },
            prevent_pod_scheduling_if_missing: s.prevent_pod_scheduling_if_missing,
        },
    }
}

/// What a `CSIDriver.spec` field needs that an API server may not store:
/// kube-apiserver drops it silently (its registry strategy clears it) while
/// its feature gate is off, and an API server older than the field refuses
/// it (the operator then leaves it out, see [`leave_out_unknown`]).
fn feature_gate(field: &str) -> Option<&'static str> {
    match field {
        "nodeAllocatableUpdatePeriodSeconds" => Some(
            "the MutableCSINodeAllocatableCount feature gate on kube-apiserver and kubelet, beta and on by default in Kubernetes 1.35, GA from 1.36",
        ),
        "seLinuxMount" => Some("the SELinuxMountReadWriteOncePod feature gate on kube-apiserver"),
        "serviceAccountTokenInSecrets" => Some(
            "Kubernetes 1.35 or later with the CSIServiceAccountTokenSecrets feature gate on kube-apiserver, beta and on by default in 1.35, GA in 1.36",
        ),
        "preventPodSchedulingIfMissing" => Some(
            "Kubernetes 1.36 or later with the VolumeLimitScaling feature gate on kube-apiserver and kube-scheduler, alpha and off by default in 1.36, beta and on by default from 1.37",
        ),
        _ => None,
    }
}

/// The `spec` fields of `spec`, as the API server reads them.
fn spec_fields(spec: &AppliedCSIDriverSpec) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(spec) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

/// The `spec` fields set in `desired` that `stored` (what the API server
/// stores of it, from a dry run) lacks: fields behind a feature gate that is
/// off on the API server.
pub fn unstored_fields(desired: &AppliedCSIDriver, stored: &AppliedCSIDriver) -> Vec<String> {
    let have = spec_fields(&stored.spec);
    spec_fields(&desired.spec)
        .into_iter()
        .filter(|(k, v)| !v.is_null() && have.get(k).is_none_or(serde_json::Value::is_null))
        .map(|(k, _)| k)
        .collect()
}

/// An API server older than a `spec` field refuses a server-side apply that
/// sets it, naming one such field per answer (`….spec.<field>: field not
/// declared in schema`, a 500). When `message` says so of a field set in
/// `desired`, that field is removed from `desired` and its name returned,
/// so the rest can be applied; `None` for any other message. Each `Some`
/// removes a set field, so asking again until `None` ends.
pub fn leave_out_unknown(desired: &mut AppliedCSIDriver, message: &str) -> Option<String> {
    const UNKNOWN: &str = ": field not declared in schema";
    let field = message.match_indices(".spec.").find_map(|(at, prefix)| {
        let rest = &message[at + prefix.len()..];
        let end = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        (end > 0 && rest[end..].starts_with(UNKNOWN)).then(|| &rest[..end])
    })?;
    let mut fields = spec_fields(&desired.spec);
    if fields.remove(field).is_none_or(|v| v.is_null()) {
        return None;
    }
    desired.spec = serde_json::from_value(serde_json::Value::Object(fields)).ok()?;
    Some(field.to_string())
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
    use crate::render::{render, RenderConfig};
    use csiops_crds::CSIDriverDeployment;

    fn driver(spec: CSIDriverSpec) -> AppliedCSIDriver {
        AppliedCSIDriver {
            metadata: ObjectMeta::default(),
            spec: AppliedCSIDriverSpec {
                pinned: spec,
                ..Default::default()
            },
        }
    }

    /// A CSIDriver with a token request and both newer fields set to
    /// `token_in_secrets` and `prevent_scheduling`.
    fn with_newer_fields(token_in_secrets: bool, prevent_scheduling: bool) -> AppliedCSIDriver {
        let mut d = driver(CSIDriverSpec {
            attach_required: Some(true),
            token_requests: Some(vec![TokenRequest {
                audience: "vault".into(),
                expiration_seconds: None,
            }]),
            ..Default::default()
        });
        d.spec.pinned.service_account_token_in_secrets = Some(token_in_secrets);
        d.spec.prevent_pod_scheduling_if_missing = Some(prevent_scheduling);
        d
    }

    /// The CSIDriver of an object whose `spec.csiDriver` is `csi`.
    fn rendered(csi: serde_json::Value) -> AppliedCSIDriver {
        let obj: CSIDriverDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "csiops.dev/v1alpha1",
            "kind": "CSIDriverDeployment",
            "metadata": {"name": "d", "namespace": "ns", "uid": "u-1"},
            "spec": {
                "driverName": "d.csi.example.com",
                "version": "v1",
                "driver": {"image": "driver:1"},
                "csiDriver": csi
            }
        }))
        .expect("object parses");
        let cfg = RenderConfig {
            sidecar_image: "sidecar:1".into(),
            operator_version: "0.1.0".into(),
        };
        render(&obj, &cfg).expect("renders").csi_driver
    }

    #[test]
    fn the_newer_fields_are_sent_when_set_and_left_out_when_not() {
        let set = rendered(serde_json::json!({
            "tokenRequests": [{"audience": "vault"}],
            "serviceAccountTokenInSecrets": true,
            "preventPodSchedulingIfMissing": false
        }));
        assert_eq!(set.spec.pinned.service_account_token_in_secrets, Some(true));
        assert_eq!(set.spec.prevent_pod_scheduling_if_missing, Some(false));
        let json = serde_json::to_value(&set).expect("serializes");
        assert_eq!(json["apiVersion"], "storage.k8s.io/v1");
        assert_eq!(json["kind"], "CSIDriver");
        let spec = &json["spec"];
        assert_eq!(spec["serviceAccountTokenInSecrets"], true, "{spec}");
        assert_eq!(spec["preventPodSchedulingIfMissing"], false, "{spec}");
        assert_eq!(spec["tokenRequests"][0]["audience"], "vault", "{spec}");
        assert_eq!(spec["attachRequired"], true, "{spec}");
        // Read back (a dry run's answer), the newer fields are kept.
        let back: AppliedCSIDriver = serde_json::from_value(json).expect("parses");
        assert_eq!(back, set);

        let unset = rendered(serde_json::json!({"tokenRequests": [{"audience": "vault"}]}));
        let json = serde_json::to_value(&unset).expect("serializes");
        for field in [
            "serviceAccountTokenInSecrets",
            "preventPodSchedulingIfMissing",
        ] {
            assert!(json["spec"].get(field).is_none(), "{field}: {json}");
        }
        // Without them, exactly what k8s-openapi's CSIDriver writes: the
        // applied hash of an existing CSIDriver does not change.
        let plain = CSIDriver {
            metadata: unset.metadata.clone(),
            spec: unset.spec.pinned.clone(),
        };
        assert_eq!(
            serde_json::to_string(&unset).expect("serializes"),
            serde_json::to_string(&plain).expect("serializes")
        );
        assert_ne!(set.spec, unset.spec, "a change of them is a change");
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
        // A 1.35 API server with MutableCSINodeAllocatableCount turned off: the
        // period is cleared, the server's defaults are added.
        let mut stored = desired.clone();
        stored.spec.pinned.node_allocatable_update_period_seconds = None;
        stored.spec.pinned.fs_group_policy = Some("ReadWriteOnceWithFSType".into());
        stored.spec.pinned.volume_lifecycle_modes = Some(vec!["Persistent".into()]);
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
        stored.spec.pinned.node_allocatable_update_period_seconds = Some(10);
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

    #[test]
    fn the_newer_fields_dropped_are_named_with_what_they_need() {
        let desired = with_newer_fields(true, true);
        // A 1.36 API server with VolumeLimitScaling off: that one cleared.
        let mut stored = desired.clone();
        stored.spec.prevent_pod_scheduling_if_missing = None;
        assert_eq!(
            unstored_fields(&desired, &stored),
            vec!["preventPodSchedulingIfMissing"]
        );
        // Stored whole, with the server's defaults: nothing.
        stored.spec.prevent_pod_scheduling_if_missing = Some(true);
        stored.spec.pinned.fs_group_policy = Some("ReadWriteOnceWithFSType".into());
        assert!(unstored_fields(&desired, &stored).is_empty());
        // Neither stored.
        stored.spec.pinned.service_account_token_in_secrets = None;
        stored.spec.prevent_pod_scheduling_if_missing = None;
        let dropped = unstored_fields(&desired, &stored);
        assert_eq!(
            dropped,
            vec![
                "preventPodSchedulingIfMissing",
                "serviceAccountTokenInSecrets"
            ]
        );
        let note = unstored_note("d.csi.example.com", &dropped);
        for needs in [
            "spec.serviceAccountTokenInSecrets (it needs Kubernetes 1.35 or later with the CSIServiceAccountTokenSecrets feature gate",
            "spec.preventPodSchedulingIfMissing (it needs Kubernetes 1.36 or later with the VolumeLimitScaling feature gate",
        ] {
            assert!(note.contains(needs), "{needs}: {note}");
        }
    }

    #[test]
    fn a_field_an_older_api_server_does_not_know_is_left_out() {
        let desired = with_newer_fields(false, true);
        let refusal = |field: &str| {
            format!(
                "failed to create typed patch object (/d.csi.example.com; storage.k8s.io/v1, Kind=CSIDriver): .spec.{field}: field not declared in schema"
            )
        };
        let mut left = desired.clone();
        assert_eq!(
            leave_out_unknown(&mut left, &refusal("preventPodSchedulingIfMissing")).as_deref(),
            Some("preventPodSchedulingIfMissing")
        );
        assert_eq!(left.spec.prevent_pod_scheduling_if_missing, None);
        assert_eq!(
            left.spec.pinned.service_account_token_in_secrets,
            Some(false)
        );
        assert_eq!(left.spec.pinned, desired.spec.pinned);
        // Named again (it is gone): not a field to leave out, the refusal
        // stands; so do other messages and fields not set.
        assert_eq!(
            leave_out_unknown(&mut left, &refusal("preventPodSchedulingIfMissing")),
            None
        );
        assert_eq!(
            leave_out_unknown(&mut left, &refusal("nodeAllocatableUpdatePeriodSeconds")),
            None
        );
        assert_eq!(
            leave_out_unknown(
                &mut left,
                ".spec.tokenRequests[0].audience: field not declared in schema"
            ),
            None
        );
        assert_eq!(
            leave_out_unknown(
                &mut left,
                "spec.serviceAccountTokenInSecrets: Invalid value"
            ),
            None
        );
        assert_eq!(
            leave_out_unknown(&mut left, &refusal("serviceAccountTokenInSecrets")).as_deref(),
            Some("serviceAccountTokenInSecrets")
        );
        assert_eq!(left.spec.pinned.service_account_token_in_secrets, None);
        // A pinned field an even older server lacks goes the same way.
        let mut old = desired.clone();
        old.spec.pinned.node_allocatable_update_period_seconds = Some(10);
        assert_eq!(
            leave_out_unknown(&mut old, &refusal("nodeAllocatableUpdatePeriodSeconds")).as_deref(),
            Some("nodeAllocatableUpdatePeriodSeconds")
        );
        assert_eq!(old.spec.pinned.node_allocatable_update_period_seconds, None);
        assert_eq!(
            old.spec.pinned.token_requests,
            desired.spec.pinned.token_requests
        );
    }
}
