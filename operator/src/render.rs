//! Pure rendering of a `CSIDriverDeployment` into the Kubernetes objects that
//! run its CSI driver, following the Kubernetes CSI design's recommended
//! deployment: a controller StatefulSet, a node DaemonSet, the `CSIDriver`
//! object, least-privilege RBAC and optional StorageClasses and
//! VolumeAttributesClasses.
//!
//! With `spec.topology: NodeLocal` there is no controller workload: the node
//! DaemonSet's pods also run the provisioner in node-deployment mode, and
//! the node ServiceAccount gets its grants (upstream csi-driver-host-path's
//! `deploy/kubernetes-distributed`).
//!
//! Nothing here talks to the API server: the same object and config always
//! render the same objects (checked by golden files in
//! `operator/tests/golden/`). Every object carries `apiVersion` and `kind`
//! when serialized, ready for server-side apply.

mod api_access;
mod attributes_class;
mod containers;
pub mod controller;
pub(crate) mod csidriver;
pub mod disruption;
mod error;
pub mod hash;
pub mod labels;
pub mod monitoring;
pub mod names;
pub mod node;
pub mod ports;
pub mod rbac;
pub mod sizing;
mod storageclass;
pub mod validate;

use std::collections::BTreeMap;

use csiops_crds::{
    CSIDriverDeployment, CSIDriverDeploymentSpec, DnsPolicy, ExtraContainerPod, PodSettings,
    Topology,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{LocalObjectReference, PodSpec, Service, ServiceAccount, Volume};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use api_access::{API_ACCESS_MOUNT, TOKEN_EXPIRATION_SECONDS};
pub use containers::{
    Helper, DEFAULT_HEALTH_MONITOR_IMAGE, DEFAULT_RESIZER_IMAGE, DEFAULT_SNAPSHOTTER_IMAGE,
    ENV_CSI_ENDPOINT, ENV_KUBE_NODE_NAME,
};
pub use controller::ControllerWorkload;
pub use csidriver::{AppliedCSIDriver, AppliedCSIDriverSpec};
pub use error::RenderError;
pub use labels::Component;
pub use ports::{
    ATTACHER_HTTP_PORT, HEALTHZ_PORT, HEALTHZ_PORT_NAME, HEALTH_MONITOR_HTTP_PORT,
    NODE_PROVISIONER_HTTP_PORT, PROVISIONER_HTTP_PORT, REGISTRAR_HTTP_PORT, REGISTRAR_PORT_NAME,
    RESIZER_HTTP_PORT, SNAPSHOTTER_HTTP_PORT,
};

use labels::{common_labels, owner_reference, DEFAULT_CONTAINER, OPERATOR_VERSION, VERSION};

/// Operator-wide inputs of rendering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderConfig {
    /// Sidecar image used when `spec.sidecars.image` is unset or empty.
    pub sidecar_image: String,
    /// Version of the running operator, written as the
    /// [`labels::OPERATOR_VERSION`] annotation on workloads (not pods).
    pub operator_version: String,
}

/// Everything one `CSIDriverDeployment` needs in the cluster.
///
/// Namespaced objects carry an owner reference to the CR; cluster-scoped ones
/// carry [`labels::cluster_owner_labels`] instead.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    /// `None` without a controller workload (topology NodeLocal).
    pub controller_service_account: Option<ServiceAccount>,
    pub node_service_account: ServiceAccount,
    /// Bindings of the shipped cluster-wide roles (`rbac::SHIPPED_ROLES`)
    /// to the ServiceAccounts whose pods run them, one per role.
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    /// Bindings, in the CR's namespace, of the shipped namespaced roles
    /// (leader-election leases, the provisioner's journal, capacity
    /// objects), one per role.
    pub role_bindings: Vec<RoleBinding>,
    /// `csiops:secret-reader` bound in each namespace whose Secrets the
    /// driver reads (`rbac::secret_scope`), with the owner labels: an
    /// owner reference cannot cross namespaces.
    pub secret_reader_bindings: Vec<RoleBinding>,
    /// The CSIDriver, with the `spec` fields newer than the pinned API.
    pub csi_driver: AppliedCSIDriver,
    /// The controller StatefulSet or Deployment (`spec.controller.kind`);
    /// `None` with topology NodeLocal.
    pub controller: Option<ControllerWorkload>,
    /// The controller's PodDisruptionBudget (more than one replica, not
    /// disabled); `None`: delete a leftover one.
    pub controller_disruption_budget: Option<PodDisruptionBudget>,
    pub daemonset: DaemonSet,
    pub storage_classes: Vec<StorageClass>,
    pub attributes_classes: Vec<VolumeAttributesClass>,
    /// The headless metrics Service (`spec.monitoring` set); `None`: delete
    /// a leftover one.
    pub metrics_service: Option<Service>,
    /// The PodMonitor (`spec.monitoring.podMonitor.enabled`), applied only
    /// where its CRD exists; `None`: delete a leftover one.
    pub pod_monitor: Option<kube::api::DynamicObject>,
    /// Hash of the controller workload's spec (including replicas and kind);
    /// empty without a controller workload.
    pub controller_hash: String,
    /// Hash of the DaemonSet spec.
    pub node_hash: String,
}

/// Renders every object of `obj`.
///
/// Fails without rendering anything when the object is unusable; see
/// [`RenderError`].
pub fn render(obj: &CSIDriverDeployment, cfg: &RenderConfig) -> Result<Rendered, RenderError> {
    let meta = validate::validate(obj)?;
    let ctx = Ctx {
        obj,
        namespace: meta.namespace,
        kubelet_dir: validate::normalize_kubelet_dir(&obj.spec.node.kubelet_dir)?,
        cfg,
    };

    let (controller, controller_hash) = if ctx.node_local() {
        (None, String::new())
    } else {
        let (workload, hash) = controller::controller(&ctx)?;
        (Some(workload), hash)
    };
    let controller_disruption_budget = disruption::controller_budget(&ctx)?;
    let (daemonset, node_hash) = node::daemonset(&ctx)?;
    let bindings = rbac::bindings(&ctx);

    Ok(Rendered {
        controller_service_account: (!ctx.node_local())
            .then(|| rbac::service_account(&ctx, Component::Controller)),
        node_service_account: rbac::service_account(&ctx, Component::Node),
        cluster_role_bindings: bindings.cluster,
        role_bindings: bindings.namespaced,
        secret_reader_bindings: bindings.secret_readers,
        csi_driver: csidriver::csi_driver(&ctx),
        controller,
        controller_disruption_budget,
        daemonset,
        storage_classes: storageclass::storage_classes(&ctx),
        attributes_classes: attributes_class::attributes_classes(&ctx),
        metrics_service: monitoring::service(&ctx),
        pod_monitor: monitoring::pod_monitor(&ctx),
        controller_hash,
        node_hash,
    })
}

/// Validated inputs shared by the builders.
pub(crate) struct Ctx<'a> {
    pub obj: &'a CSIDriverDeployment,
    pub namespace: &'a str,
    /// `spec.node.kubeletDir` without trailing slash.
    pub kubelet_dir: String,
    pub cfg: &'a RenderConfig,
}

impl Ctx<'_> {
    /// A sidecar's port (a default of [`ports`]) under
    /// `spec.sidecars.portBase`.
    pub fn port(&self, default: i32) -> i32 {
        ports::shifted(default, self.spec().sidecars.port_base)
    }

    pub fn spec(&self) -> &CSIDriverDeploymentSpec {
        &self.obj.spec
    }

    /// The socket as every container sees it.
    pub fn csi_address(&self) -> String {
        format!(
            "{}/{}",
            names::SOCKET_DIR_MOUNT,
            self.spec().driver.socket_name
        )
    }

    /// Host directory of the node socket (`<kubeletDir>/plugins/<driver>/`).
    pub fn host_plugin_dir(&self) -> String {
        format!("{}/plugins/{}/", self.kubelet_dir, self.spec().driver_name)
    }

    /// The node socket as kubelet sees it on the host.
    pub fn host_socket_path(&self) -> String {
        format!(
            "{}{}",
            self.host_plugin_dir(),
            self.spec().driver.socket_name
        )
    }

    /// Topology NodeLocal: no controller workload; the provisioner runs in
    /// the node pods with `--node-deployment`.
    pub fn node_local(&self) -> bool {
        self.spec().topology == Topology::NodeLocal
    }

    pub fn provisioner_enabled(&self) -> bool {
        self.spec().sidecars.provisioner.enabled
    }

    /// The provisioner publishes CSIStorageCapacity objects: it runs and
    /// `csiDriver.storageCapacity` tells the scheduler to use them.
    pub fn capacity_enabled(&self) -> bool {
        self.provisioner_enabled() && self.spec().csi_driver.storage_capacity
    }

    /// The attacher only runs when the driver needs attach at all: with
    /// `attachRequired: false` Kubernetes never creates VolumeAttachments.
    /// Never node-locally, where validation refuses `attachRequired: true`.
    pub fn attacher_enabled(&self) -> bool {
        !self.node_local()
            && self.spec().sidecars.attacher.enabled
            && self.spec().csi_driver.attach_required
    }

    pub fn registrar_enabled(&self) -> bool {
        self.spec().sidecars.registrar.enabled
    }

    pub fn liveness_probe_enabled(&self) -> bool {
        self.spec().sidecars.liveness_probe.enabled
    }

    /// The helpers run in controller pods only (validation refuses them
    /// node-locally).
    pub fn helper_enabled(&self, helper: containers::Helper) -> bool {
        !self.node_local() && helper.spec(&self.spec().sidecars).enabled
    }

    /// `spec.sidecars.extra` entries for one workload's pods, in spec order.
    pub fn extra_containers(
        &self,
        pod: ExtraContainerPod,
    ) -> impl Iterator<Item = &csiops_crds::ExtraContainer> {
        self.spec()
            .sidecars
            .extra
            .iter()
            .filter(move |c| c.pod == pod)
    }

    /// `spec.sidecars.image`, else the operator's bundled image.
    pub fn sidecar_image(&self, sidecar: &'static str) -> Result<String, RenderError> {
        [
            self.spec().sidecars.image.as_deref(),
            Some(self.cfg.sidecar_image.as_str()),
        ]
        .into_iter()
        .flatten()
        .map(str::trim)
        .find(|image| !image.is_empty())
        .map(str::to_string)
        .ok_or(RenderError::NoSidecarImage { sidecar })
    }
}

/// Metadata of a namespaced child: name, namespace, common labels, owner ref.
pub(crate) fn namespaced_meta(ctx: &Ctx<'_>, name: String, component: Component) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(ctx.namespace.to_string()),
        labels: Some(common_labels(ctx.obj, component)),
        owner_references: Some(vec![owner_reference(ctx.obj)]),
        ..Default::default()
    }
}

/// Metadata of a workload: [`namespaced_meta`] plus the version annotations
/// (the template hash is added once the spec is final).
pub(crate) fn workload_meta(ctx: &Ctx<'_>, name: String, component: Component) -> ObjectMeta {
    let mut meta = namespaced_meta(ctx, name, component);
    meta.annotations = Some(BTreeMap::from([
        (VERSION.to_string(), ctx.spec().version.clone()),
        (
            OPERATOR_VERSION.to_string(),
            ctx.cfg.operator_version.clone(),
        ),
    ]));
    meta
}

/// Pod template annotations: the version the pod runs (a version change
/// therefore rolls the pods even if no image changed) and the default
/// container for `kubectl logs`.
pub(crate) fn pod_annotations(ctx: &Ctx<'_>, default_container: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (VERSION.to_string(), ctx.spec().version.clone()),
        (DEFAULT_CONTAINER.to_string(), default_container.to_string()),
    ])
}

/// Adds the user's pod-level settings to a rendered pod: volumes after the
/// operator's, host namespaces, DNS policy, labels and annotations (whose
/// keys validation made sure never replace the operator's).
pub(crate) fn apply_pod_settings(
    pod: &mut PodSpec,
    template: &mut ObjectMeta,
    managed_volumes: Vec<Volume>,
    settings: &PodSettings,
) {
    let mut volumes = managed_volumes;
    volumes.extend(settings.volumes.iter().cloned());
    pod.volumes = none_if_empty(volumes);
    if settings.host_network {
        pod.host_network = Some(true);
    }
    if settings.host_pid {
        pod.host_pid = Some(true);
    }
    // On the host network, ClusterFirst falls back to the node's resolver;
    // ClusterFirstWithHostNet keeps cluster names resolvable, which is what
    // drivers that talk to in-cluster services (ceph-csi…) need.
    let dns = settings.dns_policy.or(settings
        .host_network
        .then_some(DnsPolicy::ClusterFirstWithHostNet));
    pod.dns_policy = dns.map(|p| p.as_str().to_string());
    if !settings.pod_labels.is_empty() {
        let labels = template.labels.get_or_insert_with(BTreeMap::new);
        for (k, v) in &settings.pod_labels {
            labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    if !settings.pod_annotations.is_empty() {
        let annotations = template.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in &settings.pod_annotations {
            annotations.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    pod.security_context = settings.pod_security_context.clone();
    pod.init_containers = none_if_empty(settings.init_containers.clone());
}

pub(crate) fn image_pull_secrets(
    spec: &CSIDriverDeploymentSpec,
) -> Option<Vec<LocalObjectReference>> {
    none_if_empty(
        spec.image_pull_secrets
            .iter()
            .map(|name| LocalObjectReference { name: name.clone() })
            .collect(),
    )
}

pub(crate) fn none_if_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

pub(crate) fn none_if_map_empty(
    map: &BTreeMap<String, String>,
) -> Option<BTreeMap<String, String>> {
    (!map.is_empty()).then(|| map.clone())
}
