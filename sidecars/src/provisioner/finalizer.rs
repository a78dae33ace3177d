//! Finalizer edits as merge patches that carry the `resourceVersion` they were
//! computed from: the API server applies them only to that version (409
//! otherwise), so a finalizer another controller added meanwhile is never
//! dropped by our rewrite of the list.

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

/// The patch removing `name`, or `None` when it is not there.
pub fn remove(meta: &ObjectMeta, name: &str) -> Option<Value> {
    let finalizers = meta.finalizers.as_ref()?;
    if !finalizers.iter().any(|f| f == name) {
        return None;
    }
    let kept: Vec<String> = finalizers.iter().filter(|f| *f != name).cloned().collect();
    Some(patch(meta, kept))
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
    fn remove_keeps_others() {
        assert_eq!(
            remove(&meta(Some(&["a", "x/y", "b"])), "x/y"),
            Some(json!({"metadata": {"resourceVersion": "42", "finalizers": ["a", "b"]}}))
        );
        assert_eq!(remove(&meta(Some(&["a"])), "x/y"), None);
        assert_eq!(remove(&meta(None), "x/y"), None);
    }
}
