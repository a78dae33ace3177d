//! Stable hash of a rendered workload spec.
//!
//! The reconciler compares the hash annotation of the live workload with the
//! freshly rendered one to decide whether a workload must be rolled, and which
//! one (controller only, or node first): comparing hashes is immune to the
//! defaults the API server adds to the live object.

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::error::RenderError;

/// Number of hex characters kept from the sha256.
pub const HASH_LEN: usize = 16;

/// First [`HASH_LEN`] hex chars of sha256 over the JSON of `spec`.
///
/// Deterministic: k8s-openapi serializes struct fields in declaration order
/// and maps are `BTreeMap`s.
pub fn spec_hash<T: Serialize>(what: &'static str, spec: &T) -> Result<String, RenderError> {
    let bytes = serde_json::to_vec(spec).map_err(|source| RenderError::Hash { what, source })?;
    let digest = Sha256::digest(&bytes);
    let mut hex = String::with_capacity(HASH_LEN);
    for byte in digest.iter().take(HASH_LEN / 2) {
        hex.push_str(&format!("{byte:02x}"));
    }
    Ok(hex)
}
