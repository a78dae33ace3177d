//! The requests and limits csiops' own sidecars get when the object sets
//! none (`spec.sidecars.<name>.resources` replaces them whole).
//!
//! Why these shapes:
//! - **Memory is limited, CPU is not.** A sidecar whose memory grew without
//!   bound would take the node's memory from the workloads; its limit makes
//!   it the one to restart. CPU is compressible: a limit would only throttle
//!   the bursts that matter (a leader's first list, thousands of claims at
//!   once), so CPU gets a request only.
//! - **The controller sidecars' memory grows with the cluster's volumes**
//!   (they cache every claim, PV and VolumeAttachment, compressed); their
//!   limit leaves room for the largest clusters measured, with the sizing
//!   table in docs/sizing.md saying where to raise it.
//! - **The node sidecars' memory does not grow with the cluster** (the
//!   registrar reads its own Node and CSINode, the liveness probe nothing).
//!
//! The upstream helpers (resizer, snapshotter, health monitor) get none:
//! their images are upstream's, and their needs were never measured here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// One sidecar's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    pub cpu_request: &'static str,
    pub memory_request: &'static str,
    pub memory_limit: &'static str,
}

/// The provisioner (central or node-local) and the attacher.
pub const CONTROLLER_SIDECAR: Sizing = Sizing {
    cpu_request: "10m",
    memory_request: "64Mi",
    memory_limit: "512Mi",
};

/// The registrar and the liveness probe.
pub const NODE_SIDECAR: Sizing = Sizing {
    cpu_request: "5m",
    memory_request: "16Mi",
    memory_limit: "64Mi",
};

/// The defaults of the sidecar `key` (the name of its `spec.sidecars` field).
pub fn for_sidecar(key: &str) -> Sizing {
    match key {
        "provisioner" | "attacher" => CONTROLLER_SIDECAR,
        _ => NODE_SIDECAR,
    }
}

impl Sizing {
    /// As a container's `resources`.
    pub fn requirements(self) -> ResourceRequirements {
        let q = |v: &str| Quantity(v.to_string());
        ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), q(self.cpu_request)),
                ("memory".to_string(), q(self.memory_request)),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                q(self.memory_limit),
            )])),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_sidecars_get_room_to_grow_and_node_sidecars_stay_small() {
        assert_eq!(for_sidecar("provisioner"), CONTROLLER_SIDECAR);
        assert_eq!(for_sidecar("attacher"), CONTROLLER_SIDECAR);
        assert_eq!(for_sidecar("registrar"), NODE_SIDECAR);
        assert_eq!(for_sidecar("livenessProbe"), NODE_SIDECAR);
        let r = CONTROLLER_SIDECAR.requirements();
        let limits = r.limits.expect("limits");
        assert!(limits.contains_key("memory"));
        assert!(!limits.contains_key("cpu"), "CPU is never limited");
    }
}
