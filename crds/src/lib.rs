//! `csiops.dev/v1alpha1` API types and CRD generation.
//!
//! The CRD YAML in `crds/csidriverdeployments.csiops.dev.yaml` is generated from
//! these types by `cargo run -p csiops-crds --bin crdgen` and checked in; the
//! test `crd_yaml_is_up_to_date` fails when the two drift.

#![allow(clippy::duplicated_attributes)] // kube(printcolumn(..)) repeats keys by design

pub mod adoption;
pub mod apidoc;
pub mod node_local;
pub mod security;
pub mod spec;
pub mod status;
pub mod topology;

pub use adoption::*;
pub use node_local::NodeLocalConflict;
pub use spec::*;
pub use status::*;
pub use topology::Topology;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

/// API group of every csiops resource.
pub const GROUP: &str = "csiops.dev";
/// Path of the checked-in CRD, relative to the workspace root.
/// The prefix of every driver-readiness taint key (`spec.node.readinessTaint`);
/// the driver's name follows it.
pub const READINESS_TAINT_PREFIX: &str = "csiops.dev/driver-not-ready.";

/// The driver-readiness taint key of `driver_name`.
pub fn readiness_taint_key(driver_name: &str) -> String {
    format!("{READINESS_TAINT_PREFIX}{driver_name}")
}

pub const CRD_FILE: &str = "crds/csidriverdeployments.csiops.dev.yaml";

/// The Kubernetes quantity syntax (`resource.Quantity`), as the API server's
/// own OpenAPI and controller-gen write it. Without it a bad value such as
/// `memory: lots` passes the CRD and only fails later, when the operator
/// applies the workload.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Start of the description k8s-openapi gives every `Quantity` schema; how
/// quantities are recognised in the generated schema.
const QUANTITY_DESCRIPTION_START: &str = "Quantity is a fixed-point representation";

/// The CRD as installed: the derived one, with every `Quantity` validated by
/// [`QUANTITY_PATTERN`] (and its 2 KB description shortened), and without
/// the descriptions inside the embedded core `Volume` schemas: they are
/// Kubernetes' own (`kubectl explain pod.spec.volumes`) and would be 80 KB
/// for each list of volumes.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = CSIDriverDeployment::crd();
    for version in &mut crd.spec.versions {
        let Some(validation) = version.schema.as_mut() else {
            continue;
        };
        let Some(schema) = validation.open_api_v3_schema.take() else {
            continue;
        };
        // Round-trip through JSON: JSONSchemaProps nests its children in
        // several shapes (properties, items, additionalProperties, anyOf…),
        // a JSON walk reaches them all.
        let patched = serde_json::to_value(&schema).ok().and_then(|mut v| {
            add_quantity_patterns(&mut v);
            strip_volume_descriptions(&mut v);
            serde_json::from_value(v).ok()
        });
        validation.open_api_v3_schema = Some(patched.unwrap_or(schema));
    }
    crd
}

fn add_quantity_patterns(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let is_quantity = map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
                && map
                    .get("description")
                    .and_then(Value::as_str)
                    .is_some_and(|d| d.starts_with(QUANTITY_DESCRIPTION_START));
            if is_quantity {
                map.insert("pattern".into(), QUANTITY_PATTERN.into());
                map.insert(
                    "description".into(),
                    "A Kubernetes quantity, e.g. 100m, 64Mi, 1Gi or 2.".into(),
                );
            }
            map.values_mut().for_each(add_quantity_patterns);
        }
        Value::Array(items) => items.iter_mut().for_each(add_quantity_patterns),
        _ => {}
    }
}

/// Properties whose schemas are Kubernetes' own core types, documented by
/// `kubectl explain pod.spec…`: their descriptions are dropped below the
/// property's own one (lists: below `items`).
const CORE_TYPED: &[&str] = &[
    "volumes",
    "initContainers",
    "affinity",
    "podSecurityContext",
    "lifecycle",
];

/// Drops every description below the core-typed properties ([`CORE_TYPED`]).
fn strip_volume_descriptions(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some(props) = map.get_mut("properties").and_then(Value::as_object_mut) {
                for name in CORE_TYPED {
                    let Some(prop) = props.get_mut(*name) else {
                        continue;
                    };
                    if let Some(items) = prop.get_mut("items") {
                        drop_descriptions(items);
                    } else if let Some(inner) = prop.get_mut("properties") {
                        drop_descriptions(inner);
                    }
                }
            }
            map.values_mut().for_each(strip_volume_descriptions);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_volume_descriptions),
        _ => {}
    }
}

fn drop_descriptions(v: &mut Value) {
    match v {
        Value::Object(map) => {
            // A property may itself be called "description": only drop the
            // keyword, i.e. a string value.
            if map.get("description").is_some_and(Value::is_string) {
                map.remove("description");
            }
            map.values_mut().for_each(drop_descriptions);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_descriptions),
        _ => {}
    }
}

/// The CRD rendered as YAML, with a header saying how it is made.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(&crd())?;
    Ok(format!(
        "# Generated from crds/src by `make crds`; do not edit by hand.\n{body}"
    ))
}
