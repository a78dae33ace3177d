//! The operator's check of a node-local object, the same rules the CRD's
//! CEL applies ([`crate::topology`]): what it asks for that cannot run
//! without controller pods.

use crate::spec::{CSIDriverDeploymentSpec, ControllerKind, ControllerSpec, ExtraContainerPod};
use crate::topology::{
    Topology, ATTACH_MESSAGE, CONTROLLER_MESSAGE, EXTRA_MESSAGE, HELPERS_MESSAGE,
};

impl ControllerSpec {
    /// The fields of [`CONTROLLER_FIELDS`] that are set, plus `kind` and
    /// `replicas` when they differ from their defaults, by their names in
    /// the API.
    pub fn set_fields(&self) -> Vec<&'static str> {
        let d = &self.driver;
        let p = &self.pod;
        let set = [
            ("kind", self.kind != ControllerKind::StatefulSet),
            ("replicas", self.replicas != 1),
            ("nodeSelector", !self.node_selector.is_empty()),
            ("tolerations", !self.tolerations.is_empty()),
            ("affinity", self.affinity.is_some()),
            ("priorityClassName", self.priority_class_name.is_some()),
            ("disruptionBudget", self.disruption_budget.is_some()),
            ("image", d.image.is_some()),
            ("args", d.args.as_ref().is_some_and(|a| !a.is_empty())),
            ("env", !d.env.is_empty()),
            ("resources", d.resources.is_some()),
            ("volumeMounts", !d.volume_mounts.is_empty()),
            ("securityContext", d.security_context.is_some()),
            ("volumes", !p.volumes.is_empty()),
            ("hostNetwork", p.host_network),
            ("dnsPolicy", p.dns_policy.is_some()),
            ("hostPID", p.host_pid),
            ("podAnnotations", !p.pod_annotations.is_empty()),
            ("podLabels", !p.pod_labels.is_empty()),
        ];
        set.into_iter()
            .filter_map(|(name, is_set)| is_set.then_some(name))
            .collect()
    }
}

/// A part of a node-local spec that cannot be deployed, with the field
/// that asks for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLocalConflict {
    /// The field, e.g. `spec.controller.replicas`.
    pub field: String,
    /// Why it cannot be, as the CRD's rule says it.
    pub why: &'static str,
}

impl CSIDriverDeploymentSpec {
    /// The controller replicas the object asks for: `spec.controller.replicas`,
    /// or 0 without a controller workload (topology NodeLocal).
    pub fn controller_replicas(&self) -> i32 {
        if self.topology.has_controller() {
            self.controller.replicas
        } else {
            0
        }
    }

    /// Everything a node-local object asks for that cannot run without
    /// controller pods (empty for a central one, and for a valid one).
    pub fn node_local_conflicts(&self) -> Vec<NodeLocalConflict> {
        if self.topology != Topology::NodeLocal {
            return Vec::new();
        }
        let conflict = |field: String, why| NodeLocalConflict { field, why };
        let mut out = Vec::new();
        if self.csi_driver.attach_required {
            out.push(conflict(
                "spec.csiDriver.attachRequired".into(),
                ATTACH_MESSAGE,
            ));
        }
        out.extend(
            self.controller
                .set_fields()
                .into_iter()
                .map(|f| conflict(format!("spec.controller.{f}"), CONTROLLER_MESSAGE)),
        );
        let helpers = [
            ("resizer", self.sidecars.resizer.enabled),
            ("snapshotter", self.sidecars.snapshotter.enabled),
            ("healthMonitor", self.sidecars.health_monitor.enabled),
        ];
        out.extend(
            helpers
                .into_iter()
                .filter(|(_, on)| *on)
                .map(|(h, _)| conflict(format!("spec.sidecars.{h}.enabled"), HELPERS_MESSAGE)),
        );
        out.extend(
            self.sidecars
                .extra
                .iter()
                .enumerate()
                .filter(|(_, e)| e.pod != ExtraContainerPod::Node)
                .map(|(i, _)| conflict(format!("spec.sidecars.extra[{i}].pod"), EXTRA_MESSAGE)),
        );
        out
    }
}
