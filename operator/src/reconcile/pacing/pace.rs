//! At most one reconcile of an object per [`MIN_INTERVAL`], however many
//! watch events arrive, unless something a rollout waits on has moved.
//!
//! During a node roll every pod change of a driver wakes its object, a few
//! per second on a large cluster; each reconcile reads the object and may
//! write its status. kube's own debounce delays a reconcile until events
//! stop for a while, which on a busy object means never. This pacer limits
//! the rate instead: a reconcile that comes too soon after the last one
//! does nothing and asks to run again when the interval is over, and the
//! events that arrive meanwhile all fold into that one run.
//!
//! The interval is short (a quarter second) because every step of a
//! rollout that waits on the cluster may notice its end up to one interval
//! late; a quarter second still bounds a busy object to four reads (and
//! status writes, when its counts moved) a second.
//!
//! Folding is only for the churn of pods and nodes. The few changes a
//! rollout's next step waits on ([`Waypoints`]: the object edited, its node
//! DaemonSet settling, any change of its controller workload) let a
//! reconcile through at once, interval or not: they often come right after
//! the last reconcile (each phase of the controller's surge roll, the end
//! of the node roll), and holding them would add an interval to every such
//! step. They are rare (a handful per rollout), so they cost no rate.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use csiops_crds::CSIDriverDeployment;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};

/// The shortest time between two reconciles of one object.
pub const MIN_INTERVAL: Duration = Duration::from_millis(250);

/// What of an object and its workloads, changed since its last reconcile,
/// lets the next one through at once: what a rollout's next step waits on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Waypoints {
    /// The object's generation: an edit.
    pub generation: Option<i64>,
    /// The node DaemonSet's generation and whether it has [`settled`].
    /// Not its counts: those move with every pod of a node roll.
    pub node: Option<(i64, bool)>,
    /// The resource versions of the controller StatefulSet and Deployment:
    /// each phase of a controller roll changes its spec or its status.
    pub controller: [Option<String>; 2],
}

impl Waypoints {
    /// Those of `obj`, with its node DaemonSet and controller workloads as
    /// cached (absent ones count as such).
    pub fn of(
        obj: &CSIDriverDeployment,
        ds: Option<&DaemonSet>,
        sts: Option<&StatefulSet>,
        deploy: Option<&Deployment>,
    ) -> Self {
        Waypoints {
            generation: obj.metadata.generation,
            node: ds.map(|d| (d.metadata.generation.unwrap_or(0), settled(d))),
            controller: [
                sts.and_then(|s| s.metadata.resource_version.clone()),
                deploy.and_then(|d| d.metadata.resource_version.clone()),
            ],
        }
    }

    fn digest(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

/// Whether a DaemonSet's controller has its current spec out on every node
/// it schedules on, every pod available: the end of a node roll as the
/// DaemonSet counts it (lost nodes keep it unsettled; the rollout judges
/// them apart, at the paced rate).
pub fn settled(ds: &DaemonSet) -> bool {
    let Some(s) = &ds.status else {
        return false;
    };
    let desired = s.desired_number_scheduled;
    s.observed_generation.unwrap_or(0) >= ds.metadata.generation.unwrap_or(0)
        && s.updated_number_scheduled.unwrap_or(0) == desired
        && s.number_available.unwrap_or(0) == desired
        && s.number_unavailable.unwrap_or(0) == 0
}

/// When an object's last reconcile started, and what its [`Waypoints`]
/// were then (kept with the object's other state).
#[derive(Clone, Copy, Debug, Default)]
pub struct Last(Option<(Instant, u64)>);

/// At most one reconcile of an object per interval, judged against the
/// object's [`Last`].
#[derive(Debug)]
pub struct Pacer {
    interval: Duration,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::new(MIN_INTERVAL)
    }
}

impl Pacer {
    /// A pacer of `interval` (zero: never holds).
    pub fn new(interval: Duration) -> Self {
        Pacer { interval }
    }

    /// `None`: go ahead (recorded as started now). `Some(wait)`: too soon,
    /// come back after `wait`.
    pub fn hold(&self, last: &mut Last, now: Instant) -> Option<Duration> {
        self.hold_unless_moved(last, now, &Waypoints::default())
    }

    /// [`Pacer::hold`], but go ahead at once when `waypoints` differ from
    /// those of the last reconcile let through.
    pub fn hold_unless_moved(
        &self,
        last: &mut Last,
        now: Instant,
        waypoints: &Waypoints,
    ) -> Option<Duration> {
        let digest = waypoints.digest();
        if let Some((at, seen)) = last.0 {
            let since = now.saturating_duration_since(at);
            if since < self.interval && seen == digest {
                return Some(self.interval - since);
            }
        }
        *last = Last(Some((now, digest)));
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_reconcile_within_the_interval_waits_for_the_rest_of_it() {
        let pacer = Pacer::new(Duration::from_secs(1));
        let t = Instant::now();
        let (mut a, mut b) = (Last::default(), Last::default());
        assert_eq!(pacer.hold(&mut a, t), None);
        let wait = pacer.hold(&mut a, t + Duration::from_millis(300));
        assert_eq!(wait, Some(Duration::from_millis(700)));
        // Other objects are not held.
        assert_eq!(pacer.hold(&mut b, t + Duration::from_millis(300)), None);
        assert_eq!(pacer.hold(&mut a, t + Duration::from_secs(1)), None);
        let pacer = Pacer::default();
        let mut a = Last::default();
        assert_eq!(pacer.hold(&mut a, t), None);
        assert!(pacer.hold(&mut a, t + MIN_INTERVAL / 2).is_some());
        assert_eq!(pacer.hold(&mut a, t + MIN_INTERVAL), None);
        // A forgotten object (its state dropped) starts afresh.
        let mut a = Last::default();
        assert_eq!(pacer.hold(&mut a, t + MIN_INTERVAL), None);
        let off = Pacer::new(Duration::ZERO);
        let mut x = Last::default();
        assert_eq!((off.hold(&mut x, t), off.hold(&mut x, t)), (None, None));
    }

    fn ds(generation: i64, observed: i64, updated: i32, available: i32) -> DaemonSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hp-node", "generation": generation},
            "status": {"observedGeneration": observed, "desiredNumberScheduled": 4,
                "currentNumberScheduled": 4, "numberMisscheduled": 0, "numberReady": available,
                "updatedNumberScheduled": updated, "numberAvailable": available,
                "numberUnavailable": 4 - available}
        }))
        .expect("a DaemonSet")
    }

    #[test]
    fn a_daemonset_settles_when_its_spec_is_out_and_every_pod_available() {
        assert!(settled(&ds(2, 2, 4, 4)));
        assert!(!settled(&ds(2, 1, 4, 4)), "the new spec not observed");
        assert!(!settled(&ds(2, 2, 3, 4)), "a pod on the old template");
        assert!(!settled(&ds(2, 2, 4, 3)), "a pod unavailable");
        let mut no_status = ds(2, 2, 4, 4);
        no_status.status = None;
        assert!(!settled(&no_status));
    }

    #[test]
    fn waypoints_move_with_an_edit_a_settling_node_side_and_the_controller_not_with_pod_counts() {
        let mut obj: CSIDriverDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "csiops.dev/v1alpha1", "kind": "CSIDriverDeployment",
            "metadata": {"name": "hp", "namespace": "ns", "generation": 3},
            "spec": {"driverName": "hp.example.com", "version": "v1",
                "driver": {"image": "d:1"}, "csiDriver": {"attachRequired": false}}
        }))
        .expect("an object");
        let mut sts = StatefulSet::default();
        sts.metadata.resource_version = Some("10".into());
        let rolling = Waypoints::of(&obj, Some(&ds(2, 2, 1, 3)), Some(&sts), None);
        assert_eq!(
            rolling,
            Waypoints::of(&obj, Some(&ds(2, 2, 2, 3)), Some(&sts), None),
            "a node roll's pod counts"
        );
        assert_ne!(
            rolling,
            Waypoints::of(&obj, Some(&ds(2, 2, 4, 4)), Some(&sts), None),
            "the node side settled"
        );
        assert_ne!(
            rolling,
            Waypoints::of(&obj, Some(&ds(3, 2, 1, 3)), Some(&sts), None),
            "the DaemonSet applied anew"
        );
        let mut moved = sts.clone();
        moved.metadata.resource_version = Some("11".into());
        assert_ne!(
            rolling,
            Waypoints::of(&obj, Some(&ds(2, 2, 1, 3)), Some(&moved), None),
            "the controller moved"
        );
        obj.metadata.generation = Some(4);
        assert_ne!(
            rolling,
            Waypoints::of(&obj, Some(&ds(2, 2, 1, 3)), Some(&sts), None),
            "an edit"
        );
    }

    #[test]
    fn moved_waypoints_let_a_reconcile_through_within_the_interval() {
        let pacer = Pacer::default();
        let t = Instant::now();
        let mut a = Last::default();
        let still = Waypoints::default();
        let moved = Waypoints {
            generation: Some(2),
            ..Waypoints::default()
        };
        assert_eq!(pacer.hold_unless_moved(&mut a, t, &still), None);
        let soon = t + MIN_INTERVAL / 5;
        assert!(pacer.hold_unless_moved(&mut a, soon, &still).is_some());
        assert_eq!(pacer.hold_unless_moved(&mut a, soon, &moved), None);
        // Now the moved ones are the last seen: the same again is held,
        // for the rest of an interval counted from the last run.
        let later = soon + MIN_INTERVAL / 5;
        assert_eq!(
            pacer.hold_unless_moved(&mut a, later, &moved),
            Some(MIN_INTERVAL - MIN_INTERVAL / 5)
        );
    }
}
