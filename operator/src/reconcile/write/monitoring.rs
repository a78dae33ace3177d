//! The metrics Service and PodMonitor of `spec.monitoring`: applied when
//! rendered, deleted (if ours) when not.
//!
//! The PodMonitor kind belongs to the Prometheus Operator, which many
//! clusters do not run: whether the API server serves it is asked each time
//! one is wanted, so a missing CRD is no error and a CRD installed later is
//! picked up at the next reconciliation.

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject};
use kube::Client;
use tracing::{debug, info, warn};

use super::apply::{apply, delete_owned, Applied, Mode, Owner};
use crate::reconcile::error::Error;
use crate::reconcile::watch::owned::Owned;
use crate::render::monitoring::pod_monitor_resource;
use crate::render::Rendered;
use csiops_runtime::chain;

/// Whether the API server serves PodMonitors. A discovery failure other
/// than "no such group version" is logged and read as "not served": the
/// PodMonitor is an extra that must never hold up the driver.
pub async fn pod_monitors_served(client: &Client) -> bool {
    let resource = pod_monitor_resource();
    match client.list_api_group_resources(&resource.api_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == resource.plural),
        // The API server answers an unknown group version with a plain
        // "404 page not found", not a Status: the code is what counts.
        Err(kube::Error::Api(s)) if s.code == 404 => false,
        Err(e) => {
            warn!(error = %chain(&e), "cannot discover the PodMonitor API; no PodMonitor this time");
            false
        }
    }
}

/// Applies `desired`, or deletes ours named `name` when nothing is desired
/// and `look` says a leftover is possible.
async fn converge<K>(
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    desired: Option<&K>,
    owner: Owner<'_>,
    look: bool,
    known: &Owned,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let changed = match desired {
        Some(obj) => {
            apply(api, kind, obj.clone(), owner, Mode::IfChanged, known).await? == Applied::Created
        }
        None if look => delete_owned(api, kind, name, owner, known).await?,
        None => false,
    };
    if changed {
        let what = if desired.is_some() {
            "created"
        } else {
            "deleted"
        };
        info!(kind, name, "{what}");
    }
    Ok(())
}

/// Applies the rendered Service and PodMonitor, and deletes ours that are
/// no longer rendered. `spec_changed`: the spec changed since the last
/// status, so a removed `spec.monitoring` may have left objects behind
/// (without a change there is nothing to look for, and no call is made).
pub(crate) async fn apply_monitoring(
    client: &Client,
    owner: Owner<'_>,
    r: &Rendered,
    spec_changed: bool,
    known: &Owned,
) -> Result<(), Error> {
    let name = crate::render::names::metrics_name_of(owner.name);
    let services: Api<Service> = Api::namespaced(client.clone(), owner.namespace);
    converge(
        &services,
        "Service",
        &name,
        r.metrics_service.as_ref(),
        owner,
        spec_changed,
        known,
    )
    .await?;
    if r.pod_monitor.is_none() && !spec_changed {
        return Ok(());
    }
    if !pod_monitors_served(client).await {
        if r.pod_monitor.is_some() {
            debug!("the PodMonitor CRD (monitoring.coreos.com/v1) is not installed: no PodMonitor");
        }
        return Ok(());
    }
    let monitors: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), owner.namespace, &pod_monitor_resource());
    converge(
        &monitors,
        "PodMonitor",
        &name,
        r.pod_monitor.as_ref(),
        owner,
        true,
        known,
    )
    .await
}

/// Teardown: deletes ours of both (the owner reference would let the
/// garbage collector do it later; teardown leaves nothing behind itself).
pub(crate) async fn delete_monitoring(
    client: &Client,
    owner: Owner<'_>,
    known: &Owned,
) -> Result<(), Error> {
    let name = crate::render::names::metrics_name_of(owner.name);
    let services: Api<Service> = Api::namespaced(client.clone(), owner.namespace);
    delete_owned(&services, "Service", &name, owner, known).await?;
    if pod_monitors_served(client).await {
        let monitors: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), owner.namespace, &pod_monitor_resource());
        delete_owned(&monitors, "PodMonitor", &name, owner, known).await?;
    }
    Ok(())
}
