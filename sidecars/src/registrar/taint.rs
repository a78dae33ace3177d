//! The driver-readiness taint: a node can be registered (kubelet's
//! `--register-with-taints`) or tainted by an admin with
//! `csiops.dev/driver-not-ready.<driver>:NoSchedule`, so that no pod lands on
//! it before the CSI driver can serve it. The registrar removes exactly that
//! key from its own node once kubelet has accepted the registration and the
//! CSINode entry is written; every other taint is left as it is.
//!
//! The key comes from `--readiness-taint-key`: the operator renders it
//! (`csiops_crds::readiness_taint_key`), and a manifest of ours can name any key.
//!
//! The registrar never adds the taint: it cannot tell a pod restart from the
//! driver being uninstalled, and a taint added on the way out of an
//! uninstall would leave the node unschedulable for good.

use k8s_openapi::api::core::v1::{Node, Taint};

/// The node's taints without `key` (whatever their effect), or `None` when
/// the node does not carry `key`: then there is nothing to write.
pub fn without_taint(node: &Node, key: &str) -> Option<Vec<Taint>> {
    let taints = node.spec.as_ref()?.taints.as_ref()?;
    if !taints.iter().any(|t| t.key == key) {
        return None;
    }
    Some(taints.iter().filter(|t| t.key != key).cloned().collect())
}

/// A merge patch setting the node's taints to `taints`. A merge patch
/// replaces the whole list, so it carries the resourceVersion the list was
/// read at: a taint added meanwhile (by kubelet, the node lifecycle
/// controller or an admin) makes the patch fail with a conflict instead of
/// being dropped, and the pass retries on a fresh read.
pub fn taints_patch(taints: &[Taint], resource_version: Option<&str>) -> serde_json::Value {
    let mut patch = serde_json::json!({ "spec": { "taints": taints } });
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    fn node(taints: Option<Vec<Taint>>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("node-a".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_drivers_own_key_is_removed() {
        let key = "csiops.dev/driver-not-ready.hostpath.csiops.dev";
        let other_driver = "csiops.dev/driver-not-ready.other.csiops.dev";
        let n = node(Some(vec![
            taint("node.kubernetes.io/not-ready", "NoSchedule"),
            taint(key, "NoSchedule"),
            taint(other_driver, "NoSchedule"),
            // The same key with another effect is the same readiness signal.
            taint(key, "NoExecute"),
        ]));
        let left = without_taint(&n, key).expect("the key is there");
        let keys: Vec<_> = left.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["node.kubernetes.io/not-ready", other_driver]);
    }

    #[test]
    fn nothing_to_write_when_the_key_is_absent() {
        let key = "csiops.dev/driver-not-ready.hostpath.csiops.dev";
        assert_eq!(without_taint(&node(None), key), None);
        assert_eq!(
            without_taint(&node(Some(vec![taint("example.com/x", "NoSchedule")])), key),
            None
        );
        // A key that only starts like ours is someone else's.
        let longer = format!("{key}-2");
        assert_eq!(
            without_taint(&node(Some(vec![taint(&longer, "NoSchedule")])), key),
            None
        );
        assert_eq!(without_taint(&Node::default(), key), None);
    }

    #[test]
    fn patch_replaces_the_list_guarded_by_the_version_read() {
        let p = taints_patch(&[taint("example.com/x", "NoSchedule")], Some("42"));
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert_eq!(p["spec"]["taints"][0]["key"], "example.com/x");
        let empty = taints_patch(&[], None);
        assert_eq!(empty["spec"]["taints"], serde_json::json!([]));
        assert!(empty.get("metadata").is_none());
    }
}
