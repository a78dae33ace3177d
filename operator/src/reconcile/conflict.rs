//! Which object owns a driver name when several claim it. Pure.
//!
//! The oldest object wins (creation time, then namespace/name as a stable tie
//! break); every later one is Degraded with reason Conflict and changes nothing.

use csiops_crds::CSIDriverDeployment;
use kube::ResourceExt;

/// The object that owns `me`'s driver name, if it is not `me`.
pub fn rival<'a, I>(me: &CSIDriverDeployment, all: I) -> Option<&'a CSIDriverDeployment>
where
    I: IntoIterator<Item = &'a CSIDriverDeployment>,
{
    let my_key = sort_key(me);
    all.into_iter()
        .filter(|o| o.spec.driver_name == me.spec.driver_name && o.uid() != me.uid())
        .filter(|o| sort_key(o) < my_key)
        .min_by(|a, b| sort_key(a).cmp(&sort_key(b)))
}

/// Creation time (seconds, nanoseconds), then namespace and name.
fn sort_key(o: &CSIDriverDeployment) -> (i64, i32, String, String) {
    let (secs, nanos) = o
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or((i64::MAX, 0), |t| {
            (t.0.as_second(), t.0.subsec_nanosecond())
        });
    (secs, nanos, o.namespace().unwrap_or_default(), o.name_any())
}

/// How a Conflict is told to the user.
pub fn message(me: &CSIDriverDeployment, owner: &CSIDriverDeployment) -> String {
    format!(
        "driver {} is already deployed by CSIDriverDeployment {}/{}; this object changes nothing until that one is deleted",
        me.spec.driver_name,
        owner.namespace().unwrap_or_default(),
        owner.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdd(ns: &str, name: &str, driver: &str, created: &str, uid: &str) -> CSIDriverDeployment {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "csiops.dev/v1alpha1",
            "kind": "CSIDriverDeployment",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "creationTimestamp": created},
            "spec": {"driverName": driver, "version": "v1", "driver": {"image": "x"}}
        }))
        .expect("fixture")
    }

    #[test]
    fn the_oldest_claim_wins_and_later_ones_see_it() {
        let a = cdd(
            "ns-a",
            "hp",
            "hostpath.csi.k8s.io",
            "2026-11-21T10:00:00Z",
            "1",
        );
        let b = cdd(
            "ns-b",
            "hp",
            "hostpath.csi.k8s.io",
            "2026-11-21T10:05:00Z",
            "2",
        );
        let other = cdd(
            "ns-c",
            "x",
            "other.csi.example.com",
            "2026-11-21T09:00:00Z",
            "3",
        );
        let all = [a.clone(), b.clone(), other];
        assert!(rival(&a, &all).is_none());
        let owner = rival(&b, &all).expect("b conflicts");
        assert_eq!(owner.uid().as_deref(), Some("1"));
        assert!(message(&b, owner).contains("ns-a/hp"));
    }

    #[test]
    fn same_second_ties_break_on_namespace_then_name() {
        let a = cdd("ns-a", "hp", "d.example.com", "2026-11-21T10:00:00Z", "1");
        let b = cdd("ns-b", "hp", "d.example.com", "2026-11-21T10:00:00Z", "2");
        let all = [b.clone(), a.clone()];
        assert!(rival(&a, &all).is_none());
        assert!(rival(&b, &all).is_some());
    }
}
