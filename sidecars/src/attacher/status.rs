//! The bodies of every write the attacher makes to a VolumeAttachment or a
//! PersistentVolume. Finalizers change through strategic merge patches
//! (`metadata.finalizers` merges as a set there), so adding or removing ours
//! never rewrites, or races with, anyone else's finalizer and needs no
//! resourceVersion. Status changes are JSON merge patches on `/status`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{json, Map, Value};

use super::node::VA_NODE_ID_ANNOTATION;
use csiops_runtime::truncate;

/// Longest error message stored in `attachError`/`detachError` (a driver's
/// message can be arbitrarily long; the object should stay small).
pub const MAX_ERROR_MESSAGE: usize = 1024;

/// Strategic merge patch adding `finalizer`; with `node_id`, also the
/// node-ID annotation a later detach falls back to, in the same write.
pub fn add_finalizer(finalizer: &str, node_id: Option<&str>) -> Value {
    let mut meta = json!({ "finalizers": [finalizer] });
    if let Some(id) = node_id {
        meta["annotations"] = json!({ VA_NODE_ID_ANNOTATION: id });
    }
    json!({ "metadata": meta })
}

/// Strategic merge patch removing `finalizer` and nothing else.
pub fn remove_finalizer(finalizer: &str) -> Value {
    json!({ "metadata": { "$deleteFromPrimitiveList/finalizers": [finalizer] } })
}

/// Status merge patch: attached, with `metadata` as `attachmentMetadata`
/// (keys only in `old` are deleted), `attachError` cleared.
pub fn attached(
    old: Option<&BTreeMap<String, String>>,
    metadata: &BTreeMap<String, String>,
) -> Value {
    let mut m: Map<String, Value> = old
        .into_iter()
        .flatten()
        .filter(|(k, _)| !metadata.contains_key(*k))
        .map(|(k, _)| (k.clone(), Value::Null))
        .collect();
    m.extend(
        metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone()))),
    );
    let metadata = if metadata.is_empty() {
        Value::Null
    } else {
        Value::Object(m)
    };
    json!({ "status": { "attached": true, "attachmentMetadata": metadata, "attachError": null } })
}

/// Status merge patch: detached (used when other finalizers keep the object).
pub fn detached() -> Value {
    json!({ "status": { "attached": false, "attachmentMetadata": null, "detachError": null } })
}

/// Status merge patch recording a failed attach; `attached` stays as is (false).
/// `code`: the driver's gRPC code when the CSI call failed (see [`volume_error`]).
pub fn attach_error(message: &str, code: Option<i32>, time: Time) -> Value {
    json!({ "status": { "attachError": volume_error(message, code, time) } })
}

/// Status merge patch recording a failed detach; `attached` stays as is (true).
pub fn detach_error(message: &str, code: Option<i32>, time: Time) -> Value {
    json!({ "status": { "detachError": volume_error(message, code, time) } })
}

/// A `VolumeError`. `errorCode` is set only when the driver answered with a
/// gRPC error: kubelet reads it (KEP-4876) and, on `ResourceExhausted`,
/// refreshes the node's attach limit from the driver, so a code of ours for
/// a failure before the call would mislead it. Always `null` otherwise, so a
/// merge patch never leaves an earlier error's code beside a new message.
fn volume_error(message: &str, code: Option<i32>, time: Time) -> Value {
    json!({
        "message": truncate(message, MAX_ERROR_MESSAGE),
        "errorCode": code,
        "time": time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn finalizer_patches() {
        assert_eq!(
            add_finalizer("external-attacher/d", Some("node-a")),
            json!({"metadata": {"finalizers": ["external-attacher/d"], "annotations": {"csi.alpha.kubernetes.io/node-id": "node-a"}}})
        );
        assert_eq!(
            add_finalizer("f", None),
            json!({"metadata": {"finalizers": ["f"]}})
        );
        assert_eq!(
            remove_finalizer("f"),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["f"]}})
        );
    }

    #[test]
    fn attached_replaces_the_metadata() {
        let cases = [
            (
                None,
                map(&[("devicePath", "/dev/x")]),
                json!({"devicePath": "/dev/x"}),
            ),
            (
                Some(map(&[("old", "1"), ("devicePath", "/dev/y")])),
                map(&[("devicePath", "/dev/x")]),
                json!({"devicePath": "/dev/x", "old": null}),
            ),
            (Some(map(&[("old", "1")])), map(&[]), Value::Null),
            (None, map(&[]), Value::Null),
        ];
        for (old, new, want) in cases {
            let p = attached(old.as_ref(), &new);
            assert_eq!(p["status"]["attachmentMetadata"], want, "{old:?} → {new:?}");
            assert_eq!(p["status"]["attached"], json!(true));
            assert_eq!(p["status"]["attachError"], Value::Null);
            assert!(p["status"]
                .as_object()
                .is_some_and(|s| s.contains_key("attachError")));
        }
    }

    #[test]
    fn errors_carry_time_and_a_bounded_message() {
        let t = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let p = attach_error("rpc error: code = Unavailable", Some(14), t.clone());
        assert_eq!(
            p["status"]["attachError"]["message"],
            json!("rpc error: code = Unavailable")
        );
        assert_eq!(p["status"]["attachError"]["errorCode"], json!(14));
        assert_eq!(
            p["status"]["attachError"]["time"],
            json!("1970-01-01T00:00:00Z")
        );
        assert!(p["status"].get("attached").is_none());
        let long = "é".repeat(MAX_ERROR_MESSAGE);
        let p = detach_error(&long, None, t);
        // Present and null: a merge patch clears an earlier error's code.
        assert!(p["status"]["detachError"]
            .as_object()
            .is_some_and(|e| e.get("errorCode") == Some(&Value::Null)));
        let msg = p["status"]["detachError"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            msg.len() <= MAX_ERROR_MESSAGE && msg.len() > MAX_ERROR_MESSAGE - 4,
            "{}",
            msg.len()
        );
        assert_eq!(detached()["status"]["attached"], json!(false));
    }
}
