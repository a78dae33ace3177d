//! The cloning-protection workers: the I/O around [`super::may_release`],
//! kept apart from the queue and the decision so that the shared context,
//! which holds the queue, is below it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use tracing::Instrument;

use super::may_release;
use crate::provisioner::content_source::CLONE_FINALIZER;
use crate::provisioner::context::Context;
use crate::provisioner::decide::{self, ClaimKey};
use crate::provisioner::finalizer;
use csiops_runtime::chain;

pub async fn cloning_worker(cx: Arc<Context>) {
    let queue = &cx.cloning.queue;
    while let Some(key) = queue.next().await {
        let span = tracing::info_span!("cloning", claim = %decide::display(&key));
        async {
            match release_source(&cx, &key).await {
                Ok(()) => queue.forget(&key),
                Err(e) => {
                    tracing::warn!(error = %chain(&e), "cannot remove the cloning-protection finalizer; will retry");
                    queue.add_rate_limited(key.clone());
                }
            }
        }
        .instrument(span)
        .await;
        queue.done(&key);
    }
}

/// Takes [`CLONE_FINALIZER`] off the claim when [`may_release`] says so.
async fn release_source(cx: &Context, key: &ClaimKey) -> Result<(), kube::Error> {
    let _held = cx.cloning.lock.lock().await;
    let Some(claim) = cx.caches.claims.get(key) else {
        return Ok(());
    };
    if !may_release(&claim, cx.caches.claims.store().iter()) {
        return Ok(());
    }
    let Some(patch) = finalizer::remove_at_index(&claim.metadata, CLONE_FINALIZER) else {
        return Ok(());
    };
    // Bookkeeping: nothing waits on it but a deletion of the source.
    let api: Api<PersistentVolumeClaim> = Api::namespaced(
        cx.bookkeeping.clone(),
        &claim.namespace().unwrap_or_default(),
    );
    match api
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(written) => {
            cx.caches.claims.wrote(written);
            tracing::info!("no clone pending: cloning-protection finalizer removed");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        // 422: the finalizer list moved (the test failed); the watch
        // event of that change brings the claim back, and so does the
        // retry.
        Err(e) => Err(e),
    }
}
