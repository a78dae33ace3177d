//! VolumeAttributesClasses of this driver, created and removed with it.

use csiops_crds::VolumeAttributesClassSpec;
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::labels::cluster_owner_labels;
use super::Ctx;

/// One VolumeAttributesClass per `spec.volumeAttributesClasses` entry, in
/// spec order, for this driver. Parameters and driverName are immutable in
/// Kubernetes: a change needs a delete and re-create by the reconciler.
pub(crate) fn attributes_classes(ctx: &Ctx<'_>) -> Vec<VolumeAttributesClass> {
    ctx.spec()
        .volume_attributes_classes
        .iter()
        .map(|c| attributes_class(ctx, c))
        .collect()
}

fn attributes_class(ctx: &Ctx<'_>, c: &VolumeAttributesClassSpec) -> VolumeAttributesClass {
    VolumeAttributesClass {
        metadata: ObjectMeta {
            name: Some(c.name.clone()),
            labels: Some(cluster_owner_labels(ctx.obj)),
            ..Default::default()
        },
        driver_name: ctx.spec().driver_name.clone(),
        parameters: Some(c.parameters.clone()),
    }
}
