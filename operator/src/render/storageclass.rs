//! StorageClasses provisioned by this driver, created and removed with it.

use std::collections::BTreeMap;

use csiops_crds::StorageClassSpec;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::labels::{cluster_owner_labels, IS_DEFAULT_CLASS};
use super::Ctx;

/// One StorageClass per `spec.storageClasses` entry, in spec order.
///
/// The default-class annotation is only written when `isDefault`; server-side
/// apply removes it again when the field is turned off. Parameters, reclaim
/// policy and binding mode are immutable in Kubernetes, so a change to them
/// needs a delete and re-create by the reconciler.
pub(crate) fn storage_classes(ctx: &Ctx<'_>) -> Vec<StorageClass> {
    ctx.spec()
        .storage_classes
        .iter()
        .map(|sc| storage_class(ctx, sc))
        .collect()
}

fn storage_class(ctx: &Ctx<'_>, sc: &StorageClassSpec) -> StorageClass {
    let annotations = sc
        .is_default
        .then(|| BTreeMap::from([(IS_DEFAULT_CLASS.to_string(), "true".to_string())]));
    StorageClass {
        metadata: ObjectMeta {
            name: Some(sc.name.clone()),
            labels: Some(cluster_owner_labels(ctx.obj)),
            annotations,
            ..Default::default()
        },
        provisioner: ctx.spec().driver_name.clone(),
        parameters: (!sc.parameters.is_empty()).then(|| sc.parameters.clone()),
        reclaim_policy: Some(sc.reclaim_policy.as_str().to_string()),
        volume_binding_mode: Some(sc.volume_binding_mode.as_str().to_string()),
        allow_volume_expansion: Some(sc.allow_volume_expansion),
        mount_options: (!sc.mount_options.is_empty()).then(|| sc.mount_options.clone()),
        allowed_topologies: None,
    }
}
