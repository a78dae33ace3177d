//! `csiops.dev/v1alpha1` API types and CRD generation.
//!
//! The CRD YAML in `crds/csidriverdeployments.csiops.dev.yaml` is generated from
//! these types by `cargo run -p csiops-crds --bin crdgen` and checked in; the
//! test `crd_yaml_is_up_to_date` fails when the two drift.

#![allow(clippy::duplicated_attributes)] // kube(printcolumn(..)) repeats keys by design

pub mod spec;
pub mod status;

pub use spec::*;
pub use status::*;

use kube::CustomResourceExt;

/// API group of every csiops resource.
pub const GROUP: &str = "csiops.dev";
/// Path of the checked-in CRD, relative to the workspace root.
pub const CRD_FILE: &str = "crds/csidriverdeployments.csiops.dev.yaml";

/// The CRD rendered as YAML, with a header saying how it is made.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(&CSIDriverDeployment::crd())?;
    Ok(format!(
        "# Generated from crds/src by `make crds`; do not edit by hand.\n{body}"
    ))
}
