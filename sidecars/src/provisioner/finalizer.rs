//! Finalizer edits that never drop someone else's finalizer:
//!
//! - adding is a merge patch of the whole list pinned to the
//!   `resourceVersion` it was computed from (409 if the object changed);
//! - removing is a JSON patch that tests our entry at its index and removes
//!   it, so it applies over unrelated changes (the PV controller binding the
//!   claim a moment after its PV was created) and fails only when the list
//!   itself moved. That saves a conflict, a GET and a retry per claim.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};

/// The patch adding `name`, or `None` when it is already there.
pub fn add(meta: &ObjectMeta, name: &str) -> Option<Value> {
    let mut finalizers = meta.finalizers.clone().unwrap_or_default();
    if finalizers.iter().any(|f| f == name) {
        return None;
    }
    finalizers.push(name.to_string());
    Some(patch(meta, finalizers))
}

/// The JSON patch removing `name` at its current index, or `None` when it
/// is not there.
pub fn remove_at_index(meta: &ObjectMeta, name: &str) -> Option<json_patch::Patch> {
    let index = meta.finalizers.as_ref()?.iter().position(|f| f == name)?;
    let path = format!("/metadata/finalizers/{index}");
    // The patch is built from known-good JSON; a failure would be a bug in
    // this function, reported as "no patch" rather than a panic.
    serde_json::from_value(json!([
        {"op": "test", "path": path, "value": name},
        {"op": "remove", "path": path},
    ]))
    .ok()
}

fn patch(meta: &ObjectMeta, finalizers: Vec<String>) -> Value {
    json!({
        "metadata": {
            "resourceVersion": meta.resource_version,
            "finalizers": finalizers,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(finalizers: Option<&[&str]>) -> ObjectMeta {
        ObjectMeta {
            resource_version: Some("42".into()),
            finalizers: finalizers.map(|f| f.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn add_keeps_others_and_pins_the_version() {
        assert_eq!(
            add(&meta(Some(&["kubernetes.io/pvc-protection"])), "x/y"),
            Some(
                json!({"metadata": {"resourceVersion": "42", "finalizers": ["kubernetes.io/pvc-protection", "x/y"]}})
            )
        );
        assert_eq!(
            add(&meta(None), "x/y"),
            Some(json!({"metadata": {"resourceVersion": "42", "finalizers": ["x/y"]}}))
        );
        assert_eq!(add(&meta(Some(&["x/y"])), "x/y"), None);
    }

    #[test]
    fn remove_at_index_tests_the_entry() {
        let p = remove_at_index(&meta(Some(&["a", "x/y", "b"])), "x/y").expect("patch");
        assert_eq!(
            serde_json::to_value(&p).expect("json"),
            json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": "x/y"},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ])
        );
        assert!(remove_at_index(&meta(Some(&["a"])), "x/y").is_none());
        assert!(remove_at_index(&meta(None), "x/y").is_none());
    }
}
