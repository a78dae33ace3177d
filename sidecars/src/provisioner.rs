//! `csiops-sidecar provisioner`: the external-provisioner behaviour of the
//! upstream README and the CSI design doc, plus one guarantee upstream lacks:
//! a crash or a deleted claim at any point never leaks a volume (see
//! [`claim`]).
//!
//! The pure decision logic, each piece a function of its inputs with
//! table-driven tests:
//!
//! - [`naming`]: `<--volume-name-prefix>-<PVC UID>`, the volume and PV name;
//! - [`params`]: StorageClass parameters → CreateVolume parameters (reserved
//!   `csi.storage.k8s.io/` keys stripped), per-operation secret references
//!   with their templates, fsType, `--extra-create-metadata`;
//! - [`capabilities`]: access modes and volume mode → CSI volume
//!   capabilities, the claim's size → capacity range, the check of the size
//!   the driver answered with ([`quantity`] reads and writes quantities);
//! - [`topology`]: requisite/preferred accessibility requirements, per the
//!   README's table;
//! - [`attributes_class`]: a claim's VolumeAttributesClass → CreateVolume's
//!   mutable parameters;
//! - [`pv`]: the PersistentVolume for a created volume;
//! - [`plan`]: the above composed into the two steps around CreateVolume;
//! - [`decide`]: what a claim or a PV needs; [`finalizer`]: the patches;
//! - [`journal`]: the intent journal that makes provisioning leak-free
//!   (group-committed writes) and the sweep's decision for an intent;
//! - [`content_source`]: restore from a VolumeSnapshot and clone of a claim
//!   (the checks, and the reads around them);
//! - CSI migration ([`crate::common::migration`]): for a driver that
//!   replaces an in-tree plugin, [`decide`] takes the plugin's classes and
//!   PVs for the driver's, [`plan`] translates the class and writes the PV
//!   with the in-tree source, [`volume`] deletes through the CSI view;
//! - [`node_deployment`]: `--node-deployment`, a provisioner per node —
//!   which claims and PVs are this node's, the race for claims with
//!   immediate binding (whose one write [`become_owner`] makes).
//!
//! [`cloning`] runs the workers taking the cloning-protection finalizer off
//! a clone's source claim once no clone of it is pending.
//!
//! Around it: [`controller`] (caches, queues, workers), [`claim`],
//! [`volume`] and [`sweep`] (the syncs; [`trust`]: what the sweep checks
//! before it acts on an intent), [`csi`], [`secrets`], [`metrics`],
//! [`args`]; [`capacity`] publishes CSIStorageCapacity objects
//! (`--enable-capacity`).

pub mod args;
pub mod attributes_class;
pub mod become_owner;
pub mod capabilities;
pub mod capacity;
pub mod claim;
pub mod cloning;
pub mod content_source;
pub mod context;
pub mod controller;
pub mod csi;
pub mod decide;
pub mod finalizer;
#[cfg(test)]
mod fixture;
pub mod infeasible;
pub mod journal;
pub mod metrics;
pub mod naming;
pub mod node_deployment;
pub mod params;
pub mod plan;
pub mod pv;
pub mod quantity;
pub mod secrets;
pub mod snapshot_api;
pub mod snapshot_protection;
pub mod sweep;
pub mod topology;
pub mod trust;
pub mod volume;

use std::sync::Arc;

use csiops_proto::csi::v1::controller_service_capability::rpc::Type as Rpc;
use csiops_proto::csi::v1::plugin_capability::service::Type as Service;

pub use args::ProvisionerArgs;
pub use capabilities::DriverCapabilities;
pub use plan::{finish, prepare, Cluster, FinishError, PrepareError, Prepared, ProvisionerConfig};

use crate::common::controller::lease_name;
use crate::common::driver::{code_name, Driver};
use crate::common::kube::{self as kube_client, Clients};
use crate::common::metrics::Metrics;
use crate::common::role::{lead, lease_guard, Role, Wait};
use crate::common::workqueue::QueueMetrics;
use crate::SidecarError;
use context::Queues;
use controller::Setup;
use csiops_runtime::admin::HealthCheck;
use csiops_runtime::shutdown::CancellationToken;

/// Why the provisioner could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionerError {
    #[error("driver {call} failed: {code}: {message}")]
    DriverInfo {
        call: &'static str,
        code: &'static str,
        message: String,
    },
    #[error(transparent)]
    DriverName(#[from] crate::common::driver::NameMismatch),
    #[error("the driver answered GetPluginInfo with an empty name")]
    NoName,
    #[error("driver {driver:?} does not provide the controller service with CREATE_DELETE_VOLUME; the provisioner cannot work with it")]
    CannotProvision { driver: String },
    #[error(transparent)]
    Capacity(#[from] capacity::CapacityError),
    #[error(transparent)]
    NodeDeployment(#[from] node_deployment::NodeDeploymentError),
}

fn info_error(call: &'static str) -> impl Fn(tonic::Status) -> ProvisionerError {
    move |s| ProvisionerError::DriverInfo {
        call,
        code: code_name(s.code()),
        message: s.message().to_string(),
    }
}

/// Runs until SIGTERM, or until leadership is lost.
pub async fn run(args: ProvisionerArgs) -> Result<(), SidecarError> {
    // Flags first: nothing below may wait (for the driver, the API server)
    // before a wrong flag is reported.
    let checked = args.check()?;
    let capacity_env = args
        .capacity
        .env(|k| std::env::var(k).ok())
        .map_err(ProvisionerError::from)?;
    let deployment = args
        .node_deployment(|k| std::env::var(k).ok())
        .map_err(ProvisionerError::from)?;
    if let Some(d) = &deployment {
        if args.controller.leader_election {
            tracing::warn!("--leader-election is ignored with --node-deployment: every node's provisioner works at once, on its own node's claims");
        }
        tracing::info!(
            node = %d.node_name,
            immediate_binding = d.immediate_binding,
            base_delay = ?d.base_delay,
            max_delay = ?d.max_delay,
            "node deployment"
        );
    }
    let mut role = Role::start();

    let queues = Queues::new(checked.backoff);
    let operations = Arc::new(metrics::OperationMetrics::default());
    let mut registry = Metrics::new();
    operations.register(registry.registry_mut());
    let requests = kube_client::ApiRequests::default();
    requests.register(registry.registry_mut());
    let mut queue_metrics = QueueMetrics::default();
    queue_metrics.add("claims", queues.claims.clone());
    queue_metrics.add("volumes", queues.volumes.clone());
    queue_metrics.add("intents", queues.intents.clone());
    queue_metrics.add("cloning", queues.cloning.queue.clone());
    let capacity_metrics = capacity_env
        .as_ref()
        .map(|_| capacity::CapacityMetrics::new(checked.backoff));
    if let Some(m) = &capacity_metrics {
        m.register(registry.registry_mut(), &mut queue_metrics);
    }
    registry
        .registry_mut()
        .register_collector(Box::new(queue_metrics));
    let metrics = Arc::new(registry);

    // Served before the driver answers: the provisioner is alive while it
    // waits (upstream serves no driver check here either).
    let ok: HealthCheck = Arc::new(|| Box::pin(async { Ok(()) }));
    role.serve_admin(
        checked.http_addr,
        &args.common,
        &metrics,
        ok,
        args.kube.kubeconfig.as_deref(),
    )
    .await?;

    let Some(driver) = role.connect(&args.common, &metrics, Wait::Ready).await else {
        return role.finish(Ok(())).await;
    };
    let (driver_name, caps) = match driver_facts(&driver).await {
        Ok(facts) => facts,
        Err(e) => return role.finish(Err(e.into())).await,
    };
    metrics.set_driver_name(&driver_name);
    // On a node: the node as its driver describes it (NodeGetInfo), all
    // that is known of topology there; a failure ends the process, as
    // upstream's.
    let node = match &deployment {
        Some(d) => match driver.node_get_info().await {
            Ok(info) => {
                let local = node_deployment::LocalNode::new(&d.node_name, &info);
                if local.segment.is_none() {
                    tracing::warn!("the driver reports no accessible topology: every node's provisioner takes every PV of the driver for its own to delete, as upstream's does");
                }
                tracing::info!(node_id = %local.node_id, segment = ?local.segment, "this node");
                Some(Arc::new(node_deployment::ThisNode::new(d, local)))
            }
            Err(e) => {
                let e = info_error("NodeGetInfo")(e);
                return role.finish(Err(e.into())).await;
            }
        },
        None => None,
    };
    let node_name = node.as_ref().map(|n| n.name().to_string());
    let mut config = args.config(&driver_name, &checked, node_name.as_deref());
    let caps = DriverCapabilities {
        topology: caps.topology && checked.gates.topology,
        ..caps
    };
    tracing::info!(
        driver = %driver_name,
        topology = caps.topology,
        snapshot_restore = caps.create_delete_snapshot,
        clone = caps.clone_volume,
        modify = caps.modify_volume,
        "driver ready"
    );
    if let Some(plugin) = crate::common::migration::Plugin::for_driver(&driver_name) {
        tracing::info!(
            in_tree = plugin.in_tree_name(),
            "CSI migration target: claims of the plugin's StorageClasses are provisioned with in-tree PVs, and those PVs deleted"
        );
    }

    // Held while this replica leads (always on a node, which has no
    // election): every API write and every CreateVolume/DeleteVolume
    // consults it, and losing the Lease aborts the workers at once.
    let guard = match &node {
        Some(_) => csiops_runtime::leader::LeaseGuard::unconditional(),
        None => lease_guard(&args.controller),
    };
    let clients = match kube_client::clients(&args.kube, &requests, &guard).await {
        Ok(clients) => clients,
        Err(e) => return role.finish(Err(e.into())).await,
    };
    // As upstream: the gate, unless set, follows what the API server serves.
    config.volume_attributes_class = match checked.gates.volume_attributes_class {
        Some(set) => set,
        None => {
            let served = attributes_class_served(&clients.normal).await;
            let on = checked.gates.attributes_class_enabled(served);
            if !on {
                tracing::info!("the API server serves no storage.k8s.io/v1 VolumeAttributesClass: the VolumeAttributesClass gate is off");
            }
            on
        }
    };
    let capacity = match capacity_env.zip(capacity_metrics) {
        Some((env, metrics)) => {
            let setup = capacity::CapacitySetup {
                args: &args.capacity,
                env,
                kube: &args.kube,
                requests: &requests,
                driver: &driver,
                driver_name: &driver_name,
                topology: caps.topology,
                timeout: args.common.timeout,
                metrics,
                lease: guard.clone(),
                managed_by: capacity::objects::managed_by(node_name.as_deref()),
                fixed_segment: node
                    .as_ref()
                    .map(|n| n.local.segment.clone().unwrap_or_default()),
            };
            match capacity::CapacityController::prepare(setup).await {
                Ok(c) => c,
                Err(e) => return role.finish(Err(ProvisionerError::from(e).into())).await,
            }
        }
        None => None,
    };
    let workers = args.worker_threads;
    let setup = Setup {
        driver,
        config,
        caps,
        timeout: args.common.timeout,
        workers,
        queues,
        metrics: operations,
        node: node.clone(),
        lease: guard.clone(),
    };
    let stop = role.shutdown.clone();
    let lease = lease_name("", &driver_name);
    // Centrally the leader's journal; on a node, the node's own.
    let journal_at = (
        args.controller.namespace(),
        match &node_name {
            Some(n) => journal::node_journal_name(&driver_name, n),
            None => journal::journal_name(&driver_name),
        },
    );
    let finalizer = node
        .as_ref()
        .map_or(decide::CLAIM_FINALIZER.to_string(), |n| n.finalizer.clone());
    let work = move || async move {
        {
            let (namespace, name) = journal_at;
            let journal = open_journal(&clients, &namespace, &name, &finalizer, &stop).await;
            let (provisioner, watches) = controller::build(clients, setup, journal);
            // Capacity is published by the leader only (on a node, by each
            // node for itself), from the provisioner's caches.
            let publish = async {
                if let Some(c) = capacity {
                    let inputs = capacity::controller::Inputs {
                        classes: provisioner.caches.classes.clone(),
                        csi_nodes: provisioner.caches.csi_nodes.clone(),
                        nodes: provisioner.caches.nodes.clone(),
                        volumes: provisioner.caches.volumes.clone(),
                    };
                    c.run(inputs, stop.clone()).await;
                }
            };
            tokio::join!(
                controller::run(provisioner.clone(), watches, workers, stop.clone()),
                publish
            );
            Ok::<(), std::convert::Infallible>(())
        }
    };
    let outcome = if node.is_some() {
        // No leader election on a node (see `node_deployment`).
        work().await.map_err(|never| match never {})
    } else {
        lead(
            &args.kube,
            &args.controller,
            &lease,
            guard,
            &role.shutdown,
            work,
        )
        .await
    };
    role.finish(outcome).await
}

/// The leader's journal (a node's own in node deployment): read (or made)
/// before any claim is looked at. Without RBAC for it, each claim carries
/// `finalizer` instead (one warning says so); other errors are retried
/// until it opens.
async fn open_journal(
    clients: &Clients,
    namespace: &str,
    name: &str,
    finalizer: &str,
    shutdown: &CancellationToken,
) -> Option<Arc<journal::Journal>> {
    loop {
        let opened = journal::Journal::open(
            clients.normal.clone(),
            clients.limiter.clone(),
            namespace,
            name,
        )
        .await;
        match opened {
            Ok((journal, unreadable)) => {
                for key in unreadable {
                    tracing::warn!(journal = %journal.display(), %key, "a journal entry does not parse; left as it is");
                }
                tracing::info!(journal = %journal.display(), intents = journal.names().len(), "intent journal open");
                return Some(journal);
            }
            Err(e @ journal::JournalError::Forbidden { .. }) => {
                tracing::warn!(error = %e, "no intent journal: each claim carries the finalizer {finalizer} while its volume is made instead (slower at a low --kube-api-qps)");
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the intent journal; retrying");
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
                    () = shutdown.cancelled() => return None,
                }
            }
        }
    }
}

/// Whether the API server serves `storage.k8s.io/v1` VolumeAttributesClass:
/// `None` when discovery fails for another reason than the group version
/// being absent (upstream keeps the gate on then).
async fn attributes_class_served(client: &kube::Client) -> Option<bool> {
    match client.list_api_group_resources("storage.k8s.io/v1").await {
        Ok(list) => Some(
            list.resources
                .iter()
                .any(|r| r.kind == "VolumeAttributesClass"),
        ),
        Err(kube::Error::Api(s)) if s.is_not_found() => Some(false),
        Err(e) => {
            tracing::warn!(error = %csiops_runtime::chain(&e), "cannot tell whether the API server serves VolumeAttributesClass; the gate stays on");
            None
        }
    }
}

/// GetPluginInfo, GetPluginCapabilities and ControllerGetCapabilities: the
/// driver's name and what it supports. Any failure ends the process.
async fn driver_facts(driver: &Driver) -> Result<(String, DriverCapabilities), ProvisionerError> {
    let info = driver
        .plugin_info()
        .await
        .map_err(info_error("GetPluginInfo"))?;
    if info.name.is_empty() {
        return Err(ProvisionerError::NoName);
    }
    crate::common::driver::check_name_from_env(&info.name)?;
    let plugin = driver
        .plugin_capabilities()
        .await
        .map_err(info_error("GetPluginCapabilities"))?;
    if !plugin.contains(&Service::ControllerService) {
        return Err(ProvisionerError::CannotProvision { driver: info.name });
    }
    let controller = driver
        .controller_capabilities()
        .await
        .map_err(info_error("ControllerGetCapabilities"))?;
    if !controller.contains(&Rpc::CreateDeleteVolume) {
        return Err(ProvisionerError::CannotProvision { driver: info.name });
    }
    Ok((
        info.name,
        DriverCapabilities {
            topology: plugin.contains(&Service::VolumeAccessibilityConstraints),
            single_node_multi_writer: controller.contains(&Rpc::SingleNodeMultiWriter),
            create_delete_snapshot: controller.contains(&Rpc::CreateDeleteSnapshot),
            clone_volume: controller.contains(&Rpc::CloneVolume),
            publish_unpublish: controller.contains(&Rpc::PublishUnpublishVolume),
            modify_volume: controller.contains(&Rpc::ModifyVolume),
        },
    ))
}
