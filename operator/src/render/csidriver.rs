//! The cluster's `CSIDriver` object, which tells kubelet and the
//! attach/detach controller how to treat the driver's volumes.

use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::labels::cluster_owner_labels;
use super::names::csi_driver_name;
use super::Ctx;

/// Every boolean is written explicitly (also `false`) so server-side apply
/// owns it and a later edit back to the default is applied, not ignored.
/// `fsGroupPolicy` and `volumeLifecycleModes` are left to the API server's
/// defaults when unset. `attachRequired` and `volumeLifecycleModes` are
/// immutable (and `fsGroupPolicy`/`podInfoOnMount` before Kubernetes 1.29), so
/// changing them needs a delete and re-create, which the reconciler decides.
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
            ..Default::default()
        },
    }
}
