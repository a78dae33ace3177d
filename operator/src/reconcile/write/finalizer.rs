//! The finalizer that holds a deleted object until its ordered teardown is done.

use csiops_crds::CSIDriverDeployment;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

use crate::reconcile::error::Error;

/// Finalizer that holds a deleted object until its ordered teardown is done.
pub const FINALIZER: &str = "csiops.dev/teardown";

/// Adds the finalizer unless the object has it, before any child is written:
/// what the operator creates is then always torn down in order.
pub(crate) async fn ensure_finalizer(
    obj: &CSIDriverDeployment,
    api: &Api<CSIDriverDeployment>,
) -> Result<(), Error> {
    if obj.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    patch_finalizers(obj, api, finalizers).await
}

/// The resourceVersion makes the merge patch conditional: another writer's
/// finalizer is never dropped by a stale list.
async fn patch_finalizers(
    obj: &CSIDriverDeployment,
    api: &Api<CSIDriverDeployment>,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let patch =
        json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()}});
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// Drops our finalizer, keeping every other writer's: the teardown is done.
pub(crate) async fn release(
    obj: &CSIDriverDeployment,
    api: &Api<CSIDriverDeployment>,
) -> Result<(), Error> {
    let finalizers = obj
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_finalizers(obj, api, finalizers).await
}
