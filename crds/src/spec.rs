//! The desired state of a `CSIDriverDeployment`: what a storage admin writes.
//!
//! Every default here is also written into the CRD schema, so `kubectl get -o yaml`
//! shows the values the operator actually uses.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EnvVar, Lifecycle, PodSecurityContext,
    ResourceRequirements, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::status::CSIDriverDeploymentStatus;
use crate::topology::Topology;

/// Default kubelet root directory on most distributions.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
/// Default name of the CSI socket file inside the socket directory.
pub const DEFAULT_SOCKET_NAME: &str = "csi.sock";
/// Default deadline of one rollout step.
pub const DEFAULT_STEP_TIMEOUT_SECONDS: i64 = 600;
/// Longest `CSIDriverDeployment` name: the controller StatefulSet
/// `<name>-controller` must stay within 52 characters, because the StatefulSet
/// controller writes `<statefulset>-<revision hash>` (up to 63 characters) into
/// a pod label. Enforced at admission by a CEL rule on `metadata.name`.
pub const MAX_NAME_LEN: usize = 41;

/// A CSI driver deployed by csiops: the controller StatefulSet, the node
/// DaemonSet, the `CSIDriver` object, RBAC and optional StorageClasses.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "csiops.dev",
    version = "v1alpha1",
    kind = "CSIDriverDeployment",
    plural = "csidriverdeployments",
    singular = "csidriverdeployment",
    shortname = "csidd",
    category = "storage",
    namespaced,
    status = "CSIDriverDeploymentStatus",
    doc = "CSIDriverDeployment deploys, health-checks and upgrades one CSI driver.",
    printcolumn(name = "Driver", type_ = "string", json_path = ".spec.driverName"),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.currentVersion"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Controller",
        type_ = "string",
        json_path = ".status.summary.controller",
        description = "ready/desired controller replicas"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "string",
        json_path = ".status.summary.nodes",
        description = "ready/desired node pods"
    ),
    printcolumn(
        name = "Registered",
        type_ = "string",
        json_path = ".status.summary.registered",
        description = "nodes whose CSINode lists the driver / desired node pods"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Topology",
        type_ = "string",
        json_path = ".spec.topology",
        priority = 1
    ),
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".status.targetVersion",
        priority = 1
    ),
    printcolumn(
        name = "Step",
        type_ = "string",
        json_path = ".status.rollout.step",
        priority = 1
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        priority = 1
    )
)]
#[kube(validation = kube::core::Rule::new(
    "size(self.metadata.name) <= 41"
).message("metadata.name must be at most 41 characters: the operator names the controller workload <name>-controller, and a StatefulSet name longer than 52 characters cannot carry its pods' revision label"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.node) || !has(self.node.readinessTaint) || !self.node.readinessTaint || size(self.driverName) <= 46"
).message("node.readinessTaint needs a driverName of at most 46 characters: the taint key csiops.dev/driver-not-ready.<driverName> has a name part of at most 63"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.node) || !has(self.node.readinessTaint) || !self.node.readinessTaint || !has(self.sidecars) || !has(self.sidecars.registrar) || !has(self.sidecars.registrar.enabled) || self.sidecars.registrar.enabled"
).message("node.readinessTaint needs the registrar (sidecars.registrar.enabled): the registrar is what removes the taint"))]
#[x_kube(validation = crate::topology::attach_rule())]
#[x_kube(validation = crate::topology::controller_fields_rule())]
#[x_kube(validation = crate::topology::helpers_rule())]
#[x_kube(validation = crate::topology::extra_rule())]
#[x_kube(validation = crate::security::registrar_env_rule())]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.controller) || !has(self.controller.disruptionBudget) || !has(self.controller.disruptionBudget.minAvailable) || string(self.controller.disruptionBudget.minAvailable).endsWith('%') || !has(self.controller.replicas) || self.controller.replicas <= 1 || int(string(self.controller.disruptionBudget.minAvailable)) < self.controller.replicas"
).message(DISRUPTION_BUDGET_MIN_MESSAGE))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.storageClasses) || self.storageClasses.all(a, self.storageClasses.exists_one(b, b.name == a.name))"
).message("storageClasses names must be unique"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.storageClasses) || self.storageClasses.filter(s, has(s.isDefault) && s.isDefault).size() <= 1"
).message("at most one storageClass may set isDefault"))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.volumeAttributesClasses) || self.volumeAttributesClasses.all(a, self.volumeAttributesClasses.exists_one(b, b.name == a.name))"
).message("volumeAttributesClasses names must be unique"))]
#[serde(rename_all = "camelCase")]
pub struct CSIDriverDeploymentSpec {
    /// Name of the CSI driver as its GetPluginInfo reports it, for example
    /// `hostpath.csi.k8s.io`. A DNS-1123 subdomain of at most 63 characters.
    /// Immutable: a new driver name is a new driver.
    #[schemars(
        length(min = 1, max = 63),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("driverName is immutable"))]
    pub driver_name: String,

    /// Version of the driver being deployed. Reported in status; changing it
    /// starts an ordered upgrade.
    #[schemars(length(min = 1, max = 128))]
    pub version: String,

    /// Where the driver's controller service runs. `Central` (default): a
    /// controller workload (`spec.controller`) with the provisioner, the
    /// attacher and the helpers, plus the node DaemonSet with the driver,
    /// the registrar and the liveness probe. `NodeLocal`: the node DaemonSet
    /// only, each node's pod running the driver, the provisioner with
    /// `--node-deployment`, the registrar and the liveness probe, for
    /// drivers whose volumes live on one node (csi-driver-host-path,
    /// TopoLVM, local engines); it needs `csiDriver.attachRequired: false`
    /// and refuses `spec.controller` settings, the helpers and extra
    /// containers of controller pods.
    #[serde(default)]
    pub topology: Topology,

    /// The CSI driver container, shared by controller and node pods.
    pub driver: DriverSpec,

    /// The controller (cluster-level) workload: a StatefulSet or a
    /// Deployment. Topology `Central` only: under `NodeLocal` it keeps its
    /// defaults (there is no controller workload).
    #[serde(default)]
    pub controller: ControllerSpec,

    /// The node DaemonSet.
    #[serde(default)]
    pub node: NodeSpec,

    /// The bundled sidecars, the upstream helpers (resizer, snapshotter,
    /// health monitor) and extra containers.
    #[serde(default)]
    pub sidecars: SidecarsSpec,

    /// Fields of the cluster's `CSIDriver` object for this driver.
    #[serde(default)]
    pub csi_driver: CsiDriverObjectSpec,

    /// StorageClasses created for this driver and removed with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub storage_classes: Vec<StorageClassSpec>,

    /// Where the driver's controller sidecars and helpers (and, with
    /// `topology: NodeLocal`, its node provisioners) may read Secrets. By
    /// default only in the namespaces that `storageClasses` name for the
    /// controller side (`csi.storage.k8s.io/provisioner-secret-namespace`,
    /// `controller-publish-…`, `controller-expand-…`,
    /// `controller-modify-…`), through a RoleBinding in each: a token of
    /// the driver's pods reads no other Secret. Node-side secrets
    /// (`node-stage-…`, `node-publish-…`, `node-expand-…`) are read by
    /// kubelet and need nothing here.
    #[serde(default, skip_serializing_if = "SecretAccess::is_default")]
    pub secret_access: SecretAccess,

    /// VolumeAttributesClasses of this driver (`driverName` is set to the
    /// driver), created and removed with it. A claim naming one gets its
    /// parameters at CreateVolume (the provisioner's mutable parameters),
    /// and a claim switched to another is modified by the `resizer` helper
    /// (ControllerModifyVolume); both need a driver with the MODIFY_VOLUME
    /// controller capability. Parameters are immutable in Kubernetes: a
    /// change deletes and re-creates the class, which Kubernetes delays
    /// until no claim or PV uses it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub volume_attributes_classes: Vec<VolumeAttributesClassSpec>,

    /// Names of Secrets in this namespace used to pull the images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,

    /// Log verbosity passed to the sidecars as `-v`.
    #[serde(default = "default_log_level")]
    #[schemars(range(min = 0, max = 10))]
    pub log_level: i32,

    /// When true the operator changes nothing of the deployed objects (status
    /// is still reported). Use it to hold a rollout.
    #[serde(default)]
    pub paused: bool,

    /// Rollout tuning.
    #[serde(default)]
    pub rollout: RolloutSpec,

    /// Metrics of the bundled sidecars: a Service for their metrics ports,
    /// optionally authenticated access and a Prometheus Operator PodMonitor.
    /// Unset: the sidecars serve plain-HTTP metrics and nothing more is
    /// created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<MonitoringSpec>,

    /// Take over a running deployment of this driver (from its vendor's
    /// manifests, a Helm chart or another operator) without a volume
    /// outage: its CSIDriver is kept, its node pods are replaced node by
    /// node, its controller once this object's is Ready, and its objects
    /// are removed at the end. See docs/adoption.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption: Option<crate::adoption::AdoptionSpec>,
}

fn default_log_level() -> i32 {
    2
}

/// Image pull policy of a container.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
        }
    }
}

/// The vendor's CSI driver container.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriverSpec {
    /// Image of the driver, for example `registry.k8s.io/sig-storage/hostpathplugin:v1.17.0`.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Pull policy of the driver image; unset: Kubernetes' default
    /// (`IfNotPresent` for a tagged image, `Always` for `:latest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Arguments of the driver. `$(CSI_ENDPOINT)` and `$(KUBE_NODE_NAME)` are
    /// set by the operator in every driver container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the driver container, after `CSI_ENDPOINT` and
    /// `KUBE_NODE_NAME`, which the operator sets (a variable of the same
    /// name replaces the operator's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Resource requests and limits of the driver container, in controller
    /// and node pods (`controller.resources` and `node.resources` replace
    /// them per workload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// File name of the CSI socket the driver listens on (no slashes).
    #[serde(default = "default_socket_name")]
    #[schemars(length(min = 1, max = 64), pattern(r"^[A-Za-z0-9._-]+$"))]
    pub socket_name: String,
    /// Mount the pod's ServiceAccount token (with the cluster CA and the
    /// namespace, at `/var/run/secrets/kubernetes.io/serviceaccount`) into
    /// the driver container, in controller and node pods, for drivers that
    /// call the Kubernetes API. Default false: the pods mount no token
    /// automatically and only the operator's sidecars and helpers get one.
    /// The token carries every grant of the pod's ServiceAccount (the
    /// provisioner's `get` on Secrets in controller pods, the registrar's
    /// Node and CSINode writes in node pods).
    #[serde(default)]
    pub mount_service_account_token: bool,
}

fn default_socket_name() -> String {
    DEFAULT_SOCKET_NAME.to_string()
}

/// Per-workload overrides of the driver container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriverOverride {
    /// Replaces `driver.image` in this workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Replaces `driver.args` in this workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Added to `driver.env` (same name wins here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Replaces `driver.resources` in this workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Mounts of the driver container in this workload, after the ones the
    /// operator manages (`socket-dir` at `/csi`; in node pods also the
    /// kubelet directory). Each names a volume of this workload's `volumes`.
    /// `mountPropagation: Bidirectional` needs a privileged container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Replaces the driver container's securityContext in this workload.
    /// Default: none in controller pods; privileged in node pods (the
    /// kubelet directory is mounted with Bidirectional propagation, which
    /// Kubernetes only allows in a privileged container), so a node override
    /// must keep `privileged: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    /// Ports of the driver container in this workload, after the `healthz`
    /// port the operator manages: a driver's own metrics endpoint, for
    /// example. A name or number the operator uses in the pod is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
    /// Lifecycle hooks of the driver container in this workload: a
    /// `preStop` hook that unmounts or flushes before the node plugin stops
    /// (vendors ship one, e.g. to clean up a FUSE daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
}

/// DNS policy of a workload's pods.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DnsPolicy {
    ClusterFirst,
    ClusterFirstWithHostNet,
    Default,
    None,
}

impl DnsPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            DnsPolicy::ClusterFirst => "ClusterFirst",
            DnsPolicy::ClusterFirstWithHostNet => "ClusterFirstWithHostNet",
            DnsPolicy::Default => "Default",
            DnsPolicy::None => "None",
        }
    }
}

/// Pod-level settings of a workload that real drivers need: host volumes
/// (`/dev`, `/sys`, `/lib/modules`, a data directory…), the host network or
/// PID namespace, and labels/annotations for the pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSettings {
    /// Volumes added to the pods, after the ones the operator manages
    /// (`socket-dir`; in node pods also `registration-dir` and `kubelet-dir`).
    /// Any core volume source; mount them with `volumeMounts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Run the pods in the host's network namespace (ceph-csi, iSCSI…).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    /// DNS policy of the pods. With `hostNetwork: true` and no policy set,
    /// `ClusterFirstWithHostNet` is used so cluster names still resolve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_policy: Option<DnsPolicy>,
    /// Run the pods in the host's PID namespace.
    #[serde(
        default,
        rename = "hostPID",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub host_pid: bool,
    /// Annotations added to the pods. Keys the operator sets are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// Labels added to the pods. Keys the operator sets (the
    /// `app.kubernetes.io/*` labels it selects pods by) are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    /// The pods' securityContext: `fsGroup`, `seLinuxOptions`,
    /// `seccompProfile`, `runAsUser`… for every container of the pod (a
    /// container's own securityContext still wins). Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
    /// Init containers of the pods, run in order before the driver and the
    /// sidecars start (a vendor's module loader, a config renderer, a
    /// wait for a backend). They get nothing from the operator: mount
    /// `volumes` of this workload explicitly.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<Container>,
}

/// Workload kind of the controller (the CSI design's "cluster-level
/// deployment").
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ControllerKind {
    /// A StatefulSet: at most one pod per ordinal, even while a node is
    /// unreachable (the design's recommendation).
    #[default]
    StatefulSet,
    /// A Deployment; the sidecars' leader election keeps one active.
    Deployment,
}

impl ControllerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ControllerKind::StatefulSet => "StatefulSet",
            ControllerKind::Deployment => "Deployment",
        }
    }
}

/// The controller workload.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerSpec {
    /// `StatefulSet` (default) or `Deployment`. Switching is a
    /// controller-only rollout: the old workload is removed and its pods are
    /// gone before the new one starts.
    #[serde(default)]
    pub kind: ControllerKind,
    /// Replicas of the controller; more than one relies on the sidecars'
    /// leader election, which the operator always enables.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0, max = 10))]
    pub replicas: i32,
    /// Node labels the controller pods must match to be scheduled.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the controller pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Affinity of the controller pods, e.g. anti-affinity to spread the
    /// replicas over nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// PriorityClass of the controller pods. Unset:
    /// `system-cluster-critical`, which Kubernetes creates in every cluster,
    /// so a drain or a busy node never preempts the controller for ordinary
    /// workloads. `""`: no priority class (the cluster's default priority).
    /// On a cluster whose admin limits the `system-*` classes to some
    /// namespaces (OpenShift: `kube-system` and `openshift-*`), set a class
    /// of your own or `""`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        pattern(r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub priority_class_name: Option<String>,
    /// PodDisruptionBudget of the controller pods, rendered when
    /// `replicas` is more than 1 so a node drain (`kubectl drain`, a
    /// cluster upgrade) evicts them one at a time and a replica always
    /// stays to serve. Unset: enabled, `maxUnavailable: 1`. Never rendered
    /// for one replica: a budget there either allows the eviction anyway
    /// or blocks every drain of its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<DisruptionBudgetSpec>,
    /// Overrides of the driver container in controller pods.
    #[serde(default, flatten)]
    pub driver: DriverOverride,
    /// Volumes, host namespaces, labels and annotations of controller pods.
    #[serde(default, flatten)]
    pub pod: PodSettings,
}

fn default_replicas() -> i32 {
    1
}

/// PriorityClass of the controller pods when `spec.controller.priorityClassName`
/// is unset: built into every cluster, below only the node-critical class.
pub const DEFAULT_CONTROLLER_PRIORITY_CLASS: &str = "system-cluster-critical";
/// PriorityClass of the node pods when `spec.node.priorityClassName` is
/// unset: what upstream's and OpenShift's CSI node plugins run with.
pub const DEFAULT_NODE_PRIORITY_CLASS: &str = "system-node-critical";

/// The PriorityClass a pod gets from a `priorityClassName` field: the field
/// when set (`None` for `""`, which asks for none), else `default`.
pub fn effective_priority_class<'a>(
    field: Option<&'a str>,
    default: &'static str,
) -> Option<&'a str> {
    match field {
        None => Some(default),
        Some("") => None,
        Some(name) => Some(name),
    }
}

/// Message of the rule that refuses both bounds in one disruption budget.
pub const DISRUPTION_BUDGET_BOTH_MESSAGE: &str = "disruptionBudget: set maxUnavailable or minAvailable, not both (a PodDisruptionBudget takes one)";
/// Message of the rule that refuses a count `minAvailable` that would
/// block every drain.
pub const DISRUPTION_BUDGET_MIN_MESSAGE: &str = "controller.disruptionBudget.minAvailable must be less than controller.replicas: with every replica required, no controller pod can ever be evicted and every drain of its node waits forever";

/// The controller's PodDisruptionBudget (`spec.controller.disruptionBudget`).
/// At most one of `maxUnavailable` and `minAvailable`; neither:
/// `maxUnavailable: 1`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "!(has(self.maxUnavailable) && has(self.minAvailable))"
).message(DISRUPTION_BUDGET_BOTH_MESSAGE))]
pub struct DisruptionBudgetSpec {
    /// Render the budget (with more than one replica). `false`: none, and
    /// one the operator made before is removed.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// How many controller pods an eviction may leave unavailable: a count
    /// of at least 1 or a percentage (rounded up, so at least one pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // string(): one form for a count and a percentage, without type(),
    // which the client-side CEL of the tests cannot evaluate.
    #[x_kube(validation = kube::core::Rule::new("string(self).matches('^[1-9][0-9]*$|^(100|[1-9][0-9]?)%$')").message("disruptionBudget.maxUnavailable must be a count of at least 1 or a percentage from 1% to 100%: 0 would block every drain"))]
    pub max_unavailable: Option<IntOrString>,
    /// How many controller pods must stay available through evictions: a
    /// count below `replicas`, or a percentage (rounded up: it must leave
    /// at least one pod evictable, e.g. at most 50% of 2 replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("string(self).matches('^[0-9]+$|^([0-9]|[1-9][0-9])%$')").message("disruptionBudget.minAvailable must be a count of at least 0 or a percentage from 0% to 99%"))]
    pub min_available: Option<IntOrString>,
}

impl Default for DisruptionBudgetSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            max_unavailable: None,
            min_available: None,
        }
    }
}

impl Default for ControllerSpec {
    fn default() -> Self {
        Self {
            kind: ControllerKind::default(),
            replicas: default_replicas(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            affinity: None,
            priority_class_name: None,
            disruption_budget: None,
            driver: DriverOverride::default(),
            pod: PodSettings::default(),
        }
    }
}

/// The node DaemonSet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// Node labels a node must carry to run the driver's node pod. A
    /// selector no node matches makes the object Degraded
    /// (`NoMatchingNodes`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the node pods: add the taints of the nodes that must
    /// run the driver (with `readinessTaint`, the operator adds its own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Affinity of the node pods, e.g. a node affinity keeping them off
    /// nodes the driver cannot serve (architecture, instance type, a
    /// storage label). A takeover (`spec.adoption`) adds its own
    /// requirement to each required term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Kubelet root directory on the nodes. Some distributions move it
    /// (k0s: `/var/lib/k0s/kubelet`, microk8s: `/var/snap/microk8s/common/var/lib/kubelet`).
    #[serde(default = "default_kubelet_dir")]
    #[schemars(length(min = 2, max = 4096), pattern(r"^/"))]
    #[x_kube(validation = kube::core::Rule::new("!self.contains('/../') && !self.endsWith('/..') && !self.contains('/./') && !self.endsWith('/.') && !self.contains('//') && !self.endsWith('/')").message("kubeletDir must be a clean absolute path: no '.' or '..' segments, no '//', no trailing '/' (for example /var/lib/kubelet)"))]
    pub kubelet_dir: String,
    /// How many nodes may be without a working node pod at once during a
    /// node roll: a count (`1`, the default) or a percentage of the nodes
    /// that run the driver (`10%`, rounded up). Lost nodes (NotReady,
    /// unreachable, cordoned with a pod that is not up) are not charged
    /// against it: the operator adds them to the DaemonSet's
    /// `maxUnavailable`, so they never hold the roll back. On a large
    /// cluster use a percentage: at `1`, a 1000-node roll replaces one
    /// node pod at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("type(self) == int ? self >= 1 : self.matches('^(100|[1-9][0-9]?)%$')").message("maxUnavailable must be a count of at least 1 or a percentage from 1% to 100% (for example 10%)"))]
    pub max_unavailable: Option<IntOrString>,
    /// PriorityClass of the node pods. Unset: `system-node-critical`, the
    /// class of upstream's and OpenShift's CSI node plugins: the scheduler
    /// preempts other pods to place a node pod, and kubelet evicts it last
    /// under node pressure, since every volume of the node needs it. `""`:
    /// no priority class (the cluster's default priority). On a cluster
    /// whose admin limits the `system-*` classes to some namespaces
    /// (OpenShift: `kube-system` and `openshift-*`), set a class of your
    /// own or `""`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        pattern(r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub priority_class_name: Option<String>,
    /// Driver-readiness taint. When true, nodes may carry the taint
    /// `csiops.dev/driver-not-ready.<driverName>:NoSchedule` (placed by
    /// kubelet's `--register-with-taints` or by an admin) and the registrar
    /// removes it from its node once kubelet accepted the driver and the
    /// CSINode entry exists, so no pod lands on a node before its driver
    /// can serve it. Node pods tolerate the taint; status counts the nodes
    /// still carrying it. A taint key's name part is at most 63 characters,
    /// so the driver name is then at most 46.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub readiness_taint: bool,
    /// Overrides of the driver container in node pods.
    #[serde(default, flatten)]
    pub driver: DriverOverride,
    /// Volumes, host namespaces, labels and annotations of node pods.
    #[serde(default, flatten)]
    pub pod: PodSettings,
}

fn default_kubelet_dir() -> String {
    DEFAULT_KUBELET_DIR.to_string()
}

impl Default for NodeSpec {
    fn default() -> Self {
        Self {
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            affinity: None,
            kubelet_dir: default_kubelet_dir(),
            max_unavailable: None,
            priority_class_name: None,
            readiness_taint: false,
            driver: DriverOverride::default(),
            pod: PodSettings::default(),
        }
    }
}

/// The bundled sidecars, the upstream helpers and extra containers.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarsSpec {
    /// Image of `csiops-sidecar`; defaults to the operator's bundled image of
    /// the same version as the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Pull policy of the `csiops-sidecar` containers; unset: Kubernetes'
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// First of the eight ports the bundled sidecars and helpers listen on
    /// in the pods (health, metrics): `portBase` to `portBase + 7`. Unset:
    /// 9808, upstream's defaults (liveness probe 9808, provisioner and
    /// registrar 9809, attacher 9810…). Two drivers with `hostNetwork:
    /// true` on one node share its ports: give each its own base (for
    /// example 9808 and 9828).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 65520))]
    pub port_base: Option<i32>,
    /// The provisioner (`csi-provisioner`): creates and deletes volumes for
    /// PVCs of the driver's StorageClasses. Runs in the controller pods, or
    /// with topology `NodeLocal` in every node pod (`--node-deployment`).
    #[serde(default)]
    pub provisioner: SidecarSpec,
    /// The attacher (`csi-attacher`): ControllerPublish/Unpublish for
    /// VolumeAttachments. Runs in the controller pods, only when
    /// `csiDriver.attachRequired` is true.
    #[serde(default)]
    pub attacher: SidecarSpec,
    /// The node registrar (`node-driver-registrar`): registers the driver
    /// with kubelet on every node and keeps the node's CSINode entry.
    /// Without it the driver is never registered and `readinessTaint`
    /// cannot be used.
    #[serde(default)]
    pub registrar: SidecarSpec,
    /// The liveness probe (`liveness-probe`): `/healthz` calls the driver's
    /// Probe; the driver container's liveness probe uses it. In controller
    /// and node pods.
    #[serde(default)]
    pub liveness_probe: SidecarSpec,
    /// Upstream `csi-resizer` in controller pods: expands volumes
    /// (ControllerExpandVolume) when a PVC asks for more.
    #[serde(default)]
    pub resizer: HelperSpec,
    /// Upstream `csi-snapshotter` in controller pods: CreateSnapshot and
    /// DeleteSnapshot for VolumeSnapshotContents. Needs the VolumeSnapshot
    /// CRDs and the snapshot-controller installed in the cluster.
    #[serde(default)]
    pub snapshotter: HelperSpec,
    /// Upstream `csi-external-health-monitor-controller` in controller pods:
    /// reports abnormal volumes as Events on their PVCs.
    #[serde(default)]
    pub health_monitor: HelperSpec,
    /// More containers for controller or node pods, such as a vendor's own
    /// sidecars. Each gets the CSI socket directory at `/csi`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub extra: Vec<ExtraContainer>,
}

/// One of the upstream kubernetes-csi helper sidecars (resizer, snapshotter,
/// health monitor). Off unless enabled: each needs cluster features (the
/// snapshot CRDs, expandable StorageClasses…) and driver capabilities that
/// not every driver has.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HelperSpec {
    /// Run this helper in the controller pods.
    #[serde(default)]
    pub enabled: bool,
    /// Image of the helper. Default: the upstream
    /// `registry.k8s.io/sig-storage` image at the tag this operator version
    /// pins (see docs/writing-a-deployment.md); left unset, an operator
    /// upgrade moves to its newer pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub image: Option<String>,
    /// Pull policy of the helper's image; unset: Kubernetes' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Extra flags, appended after the operator's. Flags the operator manages
    /// (`--csi-address`, `--leader-election`, `--leader-election-namespace`,
    /// `--http-endpoint`, `--metrics-address`, `--v`) are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Environment of the helper container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Resource requests and limits of the helper container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Mounts after `socket-dir`; each names a volume of the controller pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
}

/// Which pods an extra container runs in.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ExtraContainerPod {
    /// The controller pods (default); a change rolls only the controller.
    #[default]
    Controller,
    /// The node pods; a change is a node-side change (ordered rollout).
    Node,
}

/// An arbitrary container added to controller or node pods, for a vendor's
/// sidecars. It shares the CSI socket directory, mounted at `/csi`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExtraContainer {
    /// Container name, a DNS-1123 label; must not be one the operator uses.
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// `Controller` (default) or `Node`.
    #[serde(default)]
    pub pod: ExtraContainerPod,
    /// Image of the container.
    #[schemars(length(min = 1))]
    pub image: String,
    /// Pull policy of the image; unset: Kubernetes' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Replaces the image's entrypoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments of the container, as written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the container, as written (the operator sets none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Resource requests and limits of the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Mounts after `socket-dir` at `/csi`; each names a volume of the pods
    /// the container runs in (`spec.controller.volumes` or `spec.node.volumes`,
    /// or one the operator manages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// The container's securityContext; none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
    /// Mount the pod's ServiceAccount token (as `driver.mountServiceAccountToken`
    /// does for the driver). Default false: no token.
    #[serde(default)]
    pub mount_service_account_token: bool,
}

/// One sidecar.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    /// Run this sidecar.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Extra flags, appended after the operator's. Flags the operator manages
    /// (`--csi-address`, `--kubelet-registration-path`, …) are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Environment of the sidecar container, after the variables the
    /// operator sets (a variable of the same name replaces the operator's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Resource requests and limits of the sidecar container; they replace
    /// csiops' defaults whole. Unset: a CPU request, a memory request and a
    /// memory limit sized by the sidecar's role (docs/sizing.md has the
    /// values and the volumes per cluster each limit holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Mounts after `socket-dir` (and, in the registrar, `registration-dir`);
    /// each names a volume of the pod the sidecar runs in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
}

impl Default for SidecarSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            extra_args: Vec::new(),
            env: Vec::new(),
            resources: None,
            volume_mounts: Vec::new(),
        }
    }
}

fn default_true() -> bool {
    true
}

/// `CSIDriver.spec.fsGroupPolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FsGroupPolicy {
    None,
    File,
    ReadWriteOnceWithFSType,
}

impl FsGroupPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FsGroupPolicy::None => "None",
            FsGroupPolicy::File => "File",
            FsGroupPolicy::ReadWriteOnceWithFSType => "ReadWriteOnceWithFSType",
        }
    }
}

/// `CSIDriver.spec.volumeLifecycleModes` entries.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum VolumeLifecycleMode {
    Persistent,
    Ephemeral,
}

impl VolumeLifecycleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeLifecycleMode::Persistent => "Persistent",
            VolumeLifecycleMode::Ephemeral => "Ephemeral",
        }
    }
}

/// The cluster's `CSIDriver` object for this driver. Each field is the
/// `CSIDriver.spec` field of the same name (the Kubernetes 1.35 API, the
/// oldest supported, and one field of 1.36), with the API server's own limits written into
/// the schema.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.serviceAccountTokenInSecrets) || (has(self.tokenRequests) && size(self.tokenRequests) > 0)"
).message(SERVICE_ACCOUNT_TOKEN_IN_SECRETS_MESSAGE))]
pub struct CsiDriverObjectSpec {
    /// Whether volumes need ControllerPublish (attach). When false the
    /// attacher sidecar is left out. Must be false with topology
    /// `NodeLocal` (nothing attaches a node's own volumes).
    #[serde(default = "default_true")]
    pub attach_required: bool,
    /// Kubelet passes the pod's name, namespace, UID and ServiceAccount name
    /// to NodePublishVolume in the volume context (keys
    /// `csi.storage.k8s.io/pod.*` and `csi.storage.k8s.io/serviceAccount.name`).
    #[serde(default)]
    pub pod_info_on_mount: bool,
    /// Whether kubelet changes a volume's ownership and permissions to the
    /// pod's `fsGroup` before mounting it: `ReadWriteOnceWithFSType` only for
    /// ReadWriteOnce volumes with an fsType, `File` always, `None` never.
    /// Unset: the API server's default, `ReadWriteOnceWithFSType`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_group_policy: Option<FsGroupPolicy>,
    /// The kinds of volume the driver serves: `Persistent` (PersistentVolumes
    /// and their claims) and `Ephemeral` (CSI volumes written inline in a
    /// pod, mounted by kubelet without a claim). Empty: `Persistent` only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2))]
    pub volume_lifecycle_modes: Vec<VolumeLifecycleMode>,
    /// The scheduler places WaitForFirstConsumer claims only on nodes whose
    /// CSIStorageCapacity objects show room. Set it when the provisioner
    /// publishes capacity (`--enable-capacity`).
    #[serde(default)]
    pub storage_capacity: bool,
    /// Kubelet calls NodePublishVolume again periodically on mounted volumes,
    /// for drivers whose mounts must be refreshed (for example with new
    /// `tokenRequests` tokens before the old ones expire).
    #[serde(default)]
    pub requires_republish: bool,
    /// The driver supports mounting with `-o context=…`: kubelet then mounts
    /// a volume with the pod's SELinux label instead of relabelling every
    /// file on it.
    #[serde(default)]
    pub se_linux_mount: bool,
    /// Service account tokens kubelet requests for the pod whose volume it
    /// mounts and passes to NodePublishVolume (volume context key
    /// `csi.storage.k8s.io/serviceAccount.tokens`; the secrets with
    /// `serviceAccountTokenInSecrets`). Audiences must differ
    /// (at most one empty: the API server's audiences); the list is keyed
    /// by audience, so the API server refuses a duplicate. Pair it with
    /// `requiresRepublish: true` for a fresh token before expiry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["audience"]))]
    pub token_requests: Vec<TokenRequestSpec>,
    /// KEP-4876: kubelet re-asks the driver's NodeGetInfo this often (and
    /// after an attach fails for lack of room) and updates the node's
    /// CSINode `allocatable.count`. At least 10 seconds. Needs the
    /// `MutableCSINodeAllocatableCount` feature gate on kube-apiserver and
    /// kubelet (on by default from Kubernetes 1.35, GA in 1.36); where the API
    /// server has it off, it does not store the field, and the operator
    /// says so with a Warning Event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10))]
    pub node_allocatable_update_period_seconds: Option<i64>,
    /// True: kubelet hands the `tokenRequests` tokens to NodePublishVolume
    /// in its secrets (key `csi.storage.k8s.io/serviceAccount.tokens`), not
    /// in the volume context, which drivers and sidecars tend to log. Only
    /// for a driver that reads them there. Needs `tokenRequests` (the API
    /// server refuses the field without them, even `false`). Kubernetes
    /// 1.35 or later with the `CSIServiceAccountTokenSecrets` feature gate
    /// (beta and on by default in 1.35, GA in 1.36), and kubelet 1.35 or
    /// later on the nodes; an older API server does not store it, and the
    /// operator says so with a Warning Event. Unset: tokens go in the
    /// volume context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token_in_secrets: Option<bool>,
    /// True: the scheduler does not place a pod that uses this driver's
    /// volumes on a node whose CSINode does not list the driver (not
    /// installed or not registered there yet). Cluster-autoscaler and other
    /// simulators of the scheduler must then simulate CSINode objects too.
    /// Needs Kubernetes 1.36 or later with the `VolumeLimitScaling` feature
    /// gate on kube-apiserver and kube-scheduler (alpha and off by default
    /// in 1.36, beta and on from 1.37); an API server without it does not
    /// store the field, and the operator says so with a Warning Event.
    /// Unset: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prevent_pod_scheduling_if_missing: Option<bool>,
}

/// Why the CRD refuses `csiDriver.serviceAccountTokenInSecrets` without
/// `tokenRequests`, as the API server would.
pub const SERVICE_ACCOUNT_TOKEN_IN_SECRETS_MESSAGE: &str = "csiDriver.serviceAccountTokenInSecrets needs csiDriver.tokenRequests: it says where kubelet puts the requested tokens, and the API server refuses it (true or false) on a CSIDriver that requests none";

impl Default for CsiDriverObjectSpec {
    fn default() -> Self {
        Self {
            attach_required: true,
            pod_info_on_mount: false,
            fs_group_policy: None,
            volume_lifecycle_modes: Vec::new(),
            storage_capacity: false,
            requires_republish: false,
            se_linux_mount: false,
            token_requests: Vec::new(),
            node_allocatable_update_period_seconds: None,
            service_account_token_in_secrets: None,
            prevent_pod_scheduling_if_missing: None,
        }
    }
}

/// `CSIDriver.spec.tokenRequests` entry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenRequestSpec {
    /// The token's audience; empty: the API server's own audiences.
    pub audience: String,
    /// How long the token is valid: 10 minutes to 2^32 seconds, as the API
    /// server allows. Unset: the TokenRequest API's default (1 hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 600, max = 4_294_967_296_i64))]
    pub expiration_seconds: Option<i64>,
}

/// `StorageClass.reclaimPolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ReclaimPolicy {
    #[default]
    Delete,
    Retain,
}

impl ReclaimPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimPolicy::Delete => "Delete",
            ReclaimPolicy::Retain => "Retain",
        }
    }
}

/// `StorageClass.volumeBindingMode`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum VolumeBindingMode {
    #[default]
    Immediate,
    WaitForFirstConsumer,
}

impl VolumeBindingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeBindingMode::Immediate => "Immediate",
            VolumeBindingMode::WaitForFirstConsumer => "WaitForFirstConsumer",
        }
    }
}

/// `spec.secretAccess`: more Secret reads than the classes name, each a
/// grant to every token of the driver's pods (host access: the admission
/// policy guards this field as it guards the pods).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretAccess {
    /// More namespaces whose Secrets the driver may read, beside those its
    /// `storageClasses` name: for classes made outside this object, or
    /// volumes whose secret references name another namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub namespaces: Vec<String>,
    /// Every namespace's Secrets (a ClusterRoleBinding): needed when a
    /// class names the namespace by template (`${pvc.namespace}`), as
    /// per-tenant credentials do. Root on a node that runs a node-local
    /// provisioner then reads every Secret of the cluster.
    #[serde(default)]
    pub cluster_wide: bool,
}

impl SecretAccess {
    pub fn is_default(&self) -> bool {
        *self == SecretAccess::default()
    }
}

/// A StorageClass provisioned by this driver.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageClassSpec {
    /// Name of the StorageClass (cluster-scoped; its provisioner is
    /// `driverName`).
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// Parameters passed to the driver's CreateVolume; the
    /// `csi.storage.k8s.io/` keys (secrets, fstype) are read by the
    /// provisioner and not passed on. A change re-creates the class
    /// (parameters are immutable); existing volumes are not affected.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// What happens to a volume when its claim is deleted: `Delete`
    /// (DeleteVolume) or `Retain`.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,
    /// `Immediate`: provisioned when the claim is created.
    /// `WaitForFirstConsumer`: once a pod using it is scheduled, with that
    /// node's topology (needed by node-local drivers).
    #[serde(default)]
    pub volume_binding_mode: VolumeBindingMode,
    /// Whether claims of this class may be expanded (needs the `resizer`
    /// helper and a driver that can expand).
    #[serde(default)]
    pub allow_volume_expansion: bool,
    /// Mount options of the volumes of this class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_options: Vec<String>,
    /// Marks the class as the cluster default.
    #[serde(default)]
    pub is_default: bool,
}

/// A VolumeAttributesClass of this driver.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeAttributesClassSpec {
    /// Name of the VolumeAttributesClass (cluster-scoped; its driverName is
    /// `driverName`).
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// The driver's mutable parameters: passed as they are to CreateVolume
    /// (`mutable_parameters`) and ControllerModifyVolume. At least one, as
    /// Kubernetes requires, and at most 512; no key may be empty.
    #[schemars(extend("minProperties" = 1, "maxProperties" = 512))]
    #[x_kube(validation = kube::core::Rule::new("self.all(k, size(k) > 0)").message("volumeAttributesClasses parameters keys must not be empty"))]
    pub parameters: BTreeMap<String, String>,
}

/// How a change of the node side (the node DaemonSet) is rolled out.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutStrategy {
    /// The default: storage keeps serving throughout. The nodes roll first
    /// while the old controller keeps provisioning, attaching and
    /// detaching; then the controller rolls with a surge (a new replica is
    /// Ready before an old one stops), so a Ready controller replica exists
    /// at every moment. Controller and node plugins of two adjacent driver
    /// versions run side by side meanwhile, as they do in every CSI upgrade
    /// that is not a full stop.
    #[default]
    NonDisruptive,
    /// For drivers that document that their controller and node plugins of
    /// different versions must never run together: the controller is scaled
    /// to zero, the nodes roll, then the new controller starts. Nothing in
    /// the cluster can provision, attach or detach this driver's volumes for
    /// the whole node roll.
    StopController,
}

impl RolloutStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutStrategy::NonDisruptive => "NonDisruptive",
            RolloutStrategy::StopController => "StopController",
        }
    }
}

/// Rollout tuning.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// How long one rollout step may take before the object turns Degraded.
    /// The rollout keeps waiting after that; it only stops being silent.
    /// Also how long a node may stay lost (NotReady, unreachable, or
    /// cordoned with a node pod that is not up) before the object turns
    /// Degraded; lost nodes never hold a rollout back.
    #[serde(default = "default_step_timeout")]
    #[schemars(range(min = 10, max = 86400))]
    pub step_timeout_seconds: i64,
    /// `NonDisruptive` (default): nodes first while the old controller
    /// serves, then the controller with a surge. `StopController`: the
    /// controller is stopped for the node roll (opt-in, for drivers that
    /// cannot bear controller/node version skew).
    #[serde(default)]
    pub strategy: RolloutStrategy,
}

fn default_step_timeout() -> i64 {
    DEFAULT_STEP_TIMEOUT_SECONDS
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            step_timeout_seconds: default_step_timeout(),
            strategy: RolloutStrategy::default(),
        }
    }
}

/// Metrics of the bundled sidecars (provisioner, attacher, registrar,
/// liveness-probe). The upstream helpers (resizer, snapshotter, health
/// monitor) serve their own plain-HTTP metrics and are not covered.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.tlsSecretName) || self.metricsAuth"
).message("tlsSecretName is the certificate of authenticated metrics: set metricsAuth: true"))]
pub struct MonitoringSpec {
    /// Serve every bundled sidecar's metrics over HTTPS, only to callers
    /// whose bearer token the API server authenticates (TokenReview) and who
    /// may `get` the non-resource URL `/metrics` (SubjectAccessReview), as
    /// kube-rbac-proxy does, without a proxy container. The sidecars'
    /// ServiceAccounts get `create` on tokenreviews and
    /// subjectaccessreviews. Probes keep working unauthenticated (scheme
    /// HTTPS). Off: plain HTTP, readable by anyone who reaches the pod.
    #[serde(default)]
    pub metrics_auth: bool,

    /// A `kubernetes.io/tls` Secret in this namespace (`tls.crt`,
    /// `tls.key`, e.g. issued by cert-manager) with the sidecars' serving
    /// certificate; renewals are picked up without a restart. Unset: each
    /// sidecar makes a self-signed certificate when it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub tls_secret_name: Option<String>,

    /// A PodMonitor (`monitoring.coreos.com/v1`) for the sidecars' metrics.
    #[serde(default)]
    pub pod_monitor: PodMonitorSpec,
}

/// The Prometheus Operator PodMonitor of a driver's sidecars.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodMonitorSpec {
    /// Create the PodMonitor. Only when the PodMonitor CRD is installed: on a
    /// cluster without the Prometheus Operator nothing is created and
    /// nothing fails, and the PodMonitor follows once the CRD appears.
    #[serde(default)]
    pub enabled: bool,

    /// Scrape interval (Prometheus duration, e.g. `30s`); unset: the
    /// Prometheus' default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"))]
    pub interval: Option<String>,

    /// Labels of the PodMonitor, e.g. the one your Prometheus'
    /// `podMonitorSelector` selects (`release: prometheus`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,

    /// With `metricsAuth`: the key of a Secret in this namespace holding a
    /// token of a ServiceAccount allowed to `get` `/metrics`, which
    /// Prometheus sends as bearer token (a PodMonitor cannot use
    /// Prometheus' own ServiceAccount token file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_secret: Option<SecretKeyRef>,
}

/// One key of a Secret in the object's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub name: String,
    /// Key in the Secret's data.
    #[schemars(length(min = 1, max = 253), pattern(r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}
