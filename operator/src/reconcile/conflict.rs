//! Which object owns a driver name when several claim it. Pure.
//!
//! The oldest object wins (creation time, then UID as a stable tie break);
//! every later one is Degraded with reason Conflict and changes nothing.
//! The reconciler asks the API server's list, not its cache, until the
//! winner's CSIDriver exists: a cache may not have seen a rival yet.

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

/// Creation time (seconds, nanoseconds), then UID.
fn sort_key(o: &CSIDriverDeployment) -> (i64, i32, String) {
    let (secs, nanos) = o
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or((i64::MAX, 0), |t| {
            (t.0.as_second(), t.0.subsec_nanosecond())
        });
    (secs, nanos, o.uid().unwrap_or_default())
}

/// How long after its creation an object waits before it claims its driver
/// name: creation times are whole seconds, so a rival created in the same
/// second (which may win the UID tie break) is listed by then; the margin
/// covers clock skew between the API server and the operator.
pub const SETTLE: chrono::Duration = chrono::Duration::seconds(3);

/// `Some(wait)` while an object created at `created` is younger than
/// [`SETTLE`] at `now`.
pub fn too_early(
    created: Option<chrono::DateTime<chrono::Utc>>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<std::time::Duration> {
    let created = created?;
    let left = created + SETTLE - now;
    (left > chrono::Duration::zero()).then(|| left.to_std().unwrap_or_default())
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
    fn same_second_ties_break_on_the_uid() {
        // The namespace no longer decides: "ns-z" wins with the lower UID.
        let a = cdd("ns-z", "hp", "d.example.com", "2026-11-21T10:00:00Z", "1");
        let b = cdd("ns-a", "hp", "d.example.com", "2026-11-21T10:00:00Z", "2");
        let all = [b.clone(), a.clone()];
        assert!(rival(&a, &all).is_none());
        assert_eq!(rival(&b, &all).and_then(|r| r.uid()).as_deref(), Some("1"));
    }

    #[test]
    fn a_claim_waits_until_a_same_second_rival_must_be_listed() {
        let t = |s: &str| {
            chrono::DateTime::parse_from_rfc3339(s)
                .map(|t| t.with_timezone(&chrono::Utc))
                .expect("time")
        };
        let created = Some(t("2026-11-21T10:00:00Z"));
        assert_eq!(
            too_early(created, t("2026-11-21T10:00:01Z")),
            Some(std::time::Duration::from_secs(2))
        );
        assert_eq!(too_early(created, t("2026-11-21T10:00:03Z")), None);
        assert_eq!(too_early(None, t("2026-11-21T10:00:00Z")), None);
    }
}
