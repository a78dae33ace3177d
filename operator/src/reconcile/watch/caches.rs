//! Everything the reconciles read, kept by watches, so that a settled
//! driver costs no request but the read of its object.
//!
//! - the driver's pods, as [`PodView`]s ([`PodCache`]);
//! - its workloads (StatefulSet, Deployment, DaemonSet), without their
//!   managed fields;
//! - what is kept of every Node ([`NodeCache`]) and of every CSINode
//!   ([`CsiNodeDrivers`]);
//! - kubelet's `FailedMount` Events ([`MountFailures`]);
//! - the applied hash and generation of every object the operator applies
//!   ([`Owned`]).
//!
//! Each watch marks its [`SyncGate`] flag at its first complete list; the
//! reconciles wait for all of them.
//!
//! The watches select on the managed-by label, which anyone who may create
//! a pod or a Deployment may set. So what is kept is bounded by what the
//! operator wrote, not by that label: workloads only when a
//! CSIDriverDeployment controls them ([`ours`]), pods and mount failures
//! only in the namespaces it acts on (`--watch-namespaces`); and lists come
//! in pages of `paging::LIST_PAGE`, so a page of padded objects read whole stays
//! small.

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttributesClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tracing::warn;

use super::super::scope::Namespaces;
use super::csinodes::CsiNodeDrivers;
use super::nodes::NodeCache;
use super::owned::Owned;
use super::paging::LIST_PAGE;
use super::pod_cache::PodCache;
use super::pod_events::MountFailures;
use super::sync::{SyncFlag, SyncGate};
use crate::pods::PodView;
use crate::render::labels::{MANAGED_BY, MANAGED_BY_VALUE};
use csiops_crds::CSIDriverDeployment;
use csiops_runtime::chain;

/// The caches, shared by every reconcile.
#[derive(Clone)]
pub struct Caches {
    pub pods: PodCache,
    pub statefulsets: Store<StatefulSet>,
    pub deployments: Store<Deployment>,
    pub daemonsets: Store<DaemonSet>,
    pub nodes: NodeCache,
    pub csinodes: CsiNodeDrivers,
    pub mount_failures: MountFailures,
    pub owned: Owned,
    pub synced: SyncGate,
}

fn managed() -> watcher::Config {
    watcher::Config::default()
        .labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}"))
        .page_size(LIST_PAGE)
}

/// Whether a watched workload is kept: in a namespace the operator acts
/// on, and controlled by a CSIDriverDeployment (the owner reference the
/// operator writes; which one is checked when it is read, `owned_only`).
/// One left out is not lost: reading it from the cache finds nothing, and
/// the write that follows gets it from the API server and refuses it when
/// it is not the object's own (`apply`).
pub fn ours(meta: &ObjectMeta, scope: &Namespaces) -> bool {
    let in_scope = meta.namespace.as_deref().is_some_and(|ns| scope.allows(ns));
    let controlled = meta.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.kind == "CSIDriverDeployment"
            && o.api_version.split('/').next() == Some(csiops_crds::GROUP)
    });
    in_scope && controlled
}

/// Watch events of objects that are not [`ours`] dropped: one that stops
/// being ours (its owner reference removed) leaves the store as a delete.
fn only_ours<K: Resource>(
    event: Result<Event<K>, watcher::Error>,
    scope: &Namespaces,
) -> Option<Result<Event<K>, watcher::Error>> {
    match event {
        Ok(Event::Apply(o)) if !ours(o.meta(), scope) => Some(Ok(Event::Delete(o))),
        Ok(Event::InitApply(o)) if !ours(o.meta(), scope) => None,
        other => Some(other),
    }
}

/// A watch of our objects of kind `K` into a store, feeding `owned` (when
/// `kind` is given) and marking `flag` at its first list; yields the objects
/// that changed.
fn reflect<K>(
    client: &Client,
    store_writer: reflector::store::Writer<K>,
    flag: SyncFlag,
    owned: Option<(Owned, &'static str)>,
    scope: Namespaces,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    watcher::watcher(api, managed())
        .default_backoff()
        .filter_map(move |e| futures::future::ready(only_ours(e, &scope)))
        .modify(|o| o.meta_mut().managed_fields = None)
        .reflect(store_writer)
        .inspect(move |event| {
            if let Ok(e) = event {
                if let Some((owned, kind)) = &owned {
                    owned.observe(kind, e);
                }
                if matches!(e, Event::InitDone) {
                    flag.mark();
                }
            }
        })
        .touched_objects()
}

/// The watch streams that wake reconciles, to be wired into the controller.
pub struct Triggers<S1, S2, S3, S4, S5, S6, S7, S8> {
    pub pods: S1,
    pub statefulsets: S2,
    pub deployments: S3,
    pub daemonsets: S4,
    pub nodes: S5,
    pub csinodes: S6,
    pub mount_failures: S7,
    /// Owners of supporting objects changed or deleted by someone else.
    pub supporting: S8,
}

impl Caches {
    /// Starts every watch (lazily: nothing runs until the streams are polled).
    #[allow(clippy::type_complexity)]
    pub fn start(
        client: &Client,
        scope: &Namespaces,
    ) -> (
        Caches,
        Triggers<
            impl Stream<Item = Result<PodView, watcher::Error>> + Send + 'static,
            impl Stream<Item = Result<StatefulSet, watcher::Error>> + Send + 'static,
            impl Stream<Item = Result<Deployment, watcher::Error>> + Send + 'static,
            impl Stream<Item = Result<DaemonSet, watcher::Error>> + Send + 'static,
            impl Stream<Item = Result<k8s_openapi::api::core::v1::Node, watcher::Error>>
                + Send
                + 'static,
            impl Stream<Item = Result<super::csinodes::Changed, watcher::Error>> + Send + 'static,
            impl Stream<Item = Result<super::pod_events::PodKey, watcher::Error>> + Send + 'static,
            impl Stream<Item = (String, String)> + Send + 'static,
        >,
    ) {
        let synced = SyncGate::default();
        let owned = Owned::default();
        let pods = PodCache::default();
        let (statefulsets, sts_w) = reflector::store();
        let (deployments, deploy_w) = reflector::store();
        let (daemonsets, ds_w) = reflector::store();
        let nodes = NodeCache::default();
        let csinodes = CsiNodeDrivers::default();
        let mount_failures = MountFailures::default();

        let pod_stream = pods.watch(client.clone(), synced.flag(), scope.clone());
        let sts_stream = reflect(
            client,
            sts_w,
            synced.flag(),
            Some((owned.clone(), "StatefulSet")),
            scope.clone(),
        );
        let deploy_stream = reflect(
            client,
            deploy_w,
            synced.flag(),
            Some((owned.clone(), "Deployment")),
            scope.clone(),
        );
        let ds_stream = reflect(
            client,
            ds_w,
            synced.flag(),
            Some((owned.clone(), "DaemonSet")),
            scope.clone(),
        );
        let node_stream = nodes.watch(client.clone(), synced.flag());
        let csinode_stream = csinodes.watch(client.clone(), synced.flag());
        let failure_stream = mount_failures.watch(client.clone(), synced.flag(), pods.clone());

        // Metadata only: hash and generation are all that is compared.
        let meta = |s: std::pin::Pin<
            Box<dyn Stream<Item = Result<Option<(String, String)>, watcher::Error>> + Send>,
        >,
                    flag: SyncFlag| {
            s.filter_map(move |r| {
                let out = match r {
                    Ok(Some(owner)) => Some(owner),
                    Ok(None) => {
                        flag.mark();
                        None
                    }
                    Err(e) => {
                        warn!(error = %chain(&e), "watching the objects csiops applies");
                        None
                    }
                };
                futures::future::ready(out)
            })
        };
        let supporting = futures::stream::select_all(vec![
            meta(
                Box::pin(owned.watch_meta::<ServiceAccount>(client, "ServiceAccount")),
                synced.flag(),
            )
            .boxed(),
            meta(
                Box::pin(owned.watch_meta::<RoleBinding>(client, "RoleBinding")),
                synced.flag(),
            )
            .boxed(),
            meta(
                Box::pin(owned.watch_meta::<ClusterRoleBinding>(client, "ClusterRoleBinding")),
                synced.flag(),
            )
            .boxed(),
            meta(
                Box::pin(owned.watch_meta::<CSIDriver>(client, "CSIDriver")),
                synced.flag(),
            )
            .boxed(),
            meta(
                Box::pin(owned.watch_meta::<StorageClass>(client, "StorageClass")),
                synced.flag(),
            )
            .boxed(),
            // Also what brings a driver back when Kubernetes finally
            // deletes a replaced class that was in use (see `write::supporting`).
            meta(
                Box::pin(
                    owned.watch_meta::<VolumeAttributesClass>(client, "VolumeAttributesClass"),
                ),
                synced.flag(),
            )
            .boxed(),
            meta(
                Box::pin(owned.watch_meta::<Service>(client, "Service")),
                synced.flag(),
            )
            .boxed(),
            meta(
                Box::pin(owned.watch_meta::<PodDisruptionBudget>(client, "PodDisruptionBudget")),
                synced.flag(),
            )
            .boxed(),
        ]);

        (
            Caches {
                pods,
                statefulsets,
                deployments,
                daemonsets,
                nodes,
                csinodes,
                mount_failures,
                owned,
                synced,
            },
            Triggers {
                pods: pod_stream,
                statefulsets: sts_stream,
                deployments: deploy_stream,
                daemonsets: ds_stream,
                nodes: node_stream,
                csinodes: csinode_stream,
                mount_failures: failure_stream,
                supporting,
            },
        )
    }

    /// Caches that watch nothing and stay empty (unit tests of a reconcile
    /// against a mocked API server); synced from the start.
    #[cfg(test)]
    pub fn empty() -> Caches {
        Caches {
            pods: PodCache::default(),
            statefulsets: reflector::store().0,
            deployments: reflector::store().0,
            daemonsets: reflector::store().0,
            nodes: NodeCache::default(),
            csinodes: CsiNodeDrivers::default(),
            mount_failures: MountFailures::default(),
            owned: Owned::default(),
            synced: SyncGate::default(),
        }
    }

    /// The live object of kind `K` named `name` in `namespace`, from `store`.
    pub fn get<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = ()> + Clone,
    {
        store
            .get(&ObjectRef::new(name).within(namespace))
            .map(|o| (*o).clone())
    }

    /// This object's pods.
    pub fn pods_of(&self, namespace: &str, instance: &str) -> Vec<PodView> {
        self.pods.pods_of(namespace, instance)
    }

    /// The object a pod belongs to, by its instance label.
    pub fn owner_of_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<ObjectRef<CSIDriverDeployment>> {
        let owner = self.pods.owner_of(namespace, name)?;
        Some(ObjectRef::new(&owner).within(namespace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn daemonset(ns: &str, owner: Option<(&str, &str, bool)>) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("x-node".into()),
                namespace: Some(ns.into()),
                owner_references: owner.map(|(api_version, kind, controller)| {
                    vec![OwnerReference {
                        api_version: api_version.into(),
                        kind: kind.into(),
                        name: "x".into(),
                        uid: "u".into(),
                        controller: Some(controller),
                        ..OwnerReference::default()
                    }]
                }),
                ..ObjectMeta::default()
            },
            ..DaemonSet::default()
        }
    }

    #[test]
    fn only_workloads_a_csidriverdeployment_controls_in_scope_are_ours() {
        let all = Namespaces::default();
        let some = Namespaces::from_list(["storage"]);
        let owned = Some(("csiops.dev/v1alpha1", "CSIDriverDeployment", true));
        assert!(ours(daemonset("storage", owned).meta(), &all));
        assert!(ours(daemonset("storage", owned).meta(), &some));
        assert!(
            !ours(daemonset("team-a", owned).meta(), &some),
            "outside --watch-namespaces"
        );
        assert!(
            !ours(daemonset("storage", None).meta(), &all),
            "the label alone"
        );
        for (api, kind, controller) in [
            ("csiops.dev/v1alpha1", "CSIDriverDeployment", false),
            ("example.com/v1", "CSIDriverDeployment", true),
            ("apps/v1", "ReplicaSet", true),
        ] {
            assert!(
                !ours(
                    daemonset("storage", Some((api, kind, controller))).meta(),
                    &all
                ),
                "{api} {kind} controller={controller}"
            );
        }
    }

    #[test]
    fn a_workload_that_stops_being_ours_leaves_the_store() {
        let all = Namespaces::default();
        let foreign = daemonset("storage", None);
        assert!(only_ours(Ok(Event::InitApply(foreign.clone())), &all).is_none());
        assert!(matches!(
            only_ours(Ok(Event::Apply(foreign.clone())), &all),
            Some(Ok(Event::Delete(_)))
        ));
        assert!(matches!(
            only_ours(Ok(Event::Delete(foreign)), &all),
            Some(Ok(Event::Delete(_)))
        ));
        let owned = daemonset(
            "storage",
            Some(("csiops.dev/v1alpha1", "CSIDriverDeployment", true)),
        );
        assert!(matches!(
            only_ours(Ok(Event::Apply(owned)), &all),
            Some(Ok(Event::Apply(_)))
        ));
    }
}
