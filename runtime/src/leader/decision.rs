//! The pure side of the election: what to do with the Lease as read, the
//! Lease to write for it, and what a watched Lease shows. No I/O and no
//! clock reading of its own, so the rules are tested without a cluster.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use tokio::time::Instant;

use super::{LeaderConfig, LeaderError};

/// What to do with the lease, given its current state. Computed by [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No lease exists: create it with us as holder.
    Create,
    /// The lease was released (no holder) or has expired: take it over.
    /// `previous_holder` is `None` when it was released.
    TakeOver {
        /// The expired holder, for logging.
        previous_holder: Option<String>,
    },
    /// We hold the lease: renew it.
    Renew,
    /// Someone else holds a valid lease: wait and retry.
    Wait {
        /// The current holder.
        holder: String,
    },
}

/// The lease record as this process last saw it change, and when: client-go's
/// `observedRecord` and `observedTime`. `at` is on the local monotonic clock,
/// so it means the same to this process whatever the wall clocks say.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    record: Option<LeaseSpec>,
    at: Instant,
}

impl Observation {
    /// What is known after reading `lease` at `now`: `previous`, if the
    /// record is unchanged (metadata such as the resourceVersion aside), else
    /// a new observation at `now`.
    pub fn update(previous: Option<&Observation>, lease: &Lease, now: Instant) -> Observation {
        match previous {
            Some(p) if p.record == lease.spec => p.clone(),
            _ => Observation {
                record: lease.spec.clone(),
                at: now,
            },
        }
    }

    /// When the record was last seen to change.
    pub fn at(&self) -> Instant {
        self.at
    }
}

/// Decides how `identity` should act on `lease` at `now`, the record having
/// last changed (as far as this process saw) at `observed_at`.
///
/// Pure, so the election rules can be tested without a cluster. The lease
/// has expired once its `leaseDurationSeconds` (else `cfg.lease_duration`)
/// have passed since `observed_at`: a holder that renews changes the record
/// every retry period, one that stopped does not. `renewTime` is not read.
pub fn decide(
    lease: Option<&Lease>,
    identity: &str,
    observed_at: Instant,
    now: Instant,
    cfg: &LeaderConfig,
) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty());
    let (Some(holder), Some(spec)) = (holder, spec) else {
        return Decision::TakeOver {
            previous_holder: None,
        };
    };
    if holder == identity {
        return Decision::Renew;
    }
    let duration_secs = spec
        .lease_duration_seconds
        .unwrap_or_else(|| cfg.lease_duration_seconds())
        .max(0);
    let duration = Duration::from_secs(u64::from(duration_secs.unsigned_abs()));
    // client-go: valid while observedTime + duration is after now. A sum
    // past the clock's range never comes.
    let expired = observed_at
        .checked_add(duration)
        .is_some_and(|expiry| expiry <= now);
    if expired {
        Decision::TakeOver {
            previous_holder: Some(holder.to_owned()),
        }
    } else {
        Decision::Wait {
            holder: holder.to_owned(),
        }
    }
}

/// The lease to write for `decision`, or `None` for [`Decision::Wait`].
///
/// Metadata (including `resourceVersion`) is copied from `current`, so the
/// write fails with a conflict if someone changed the lease since it was read.
pub(super) fn build_lease(
    current: Option<&Lease>,
    decision: &Decision,
    now: DateTime<Utc>,
    cfg: &LeaderConfig,
) -> Result<Option<Lease>, LeaderError> {
    let now = micro_time(now)?;
    let lease = match (decision, current) {
        (Decision::Wait { .. }, _) => return Ok(None),
        (Decision::Create, _) | (_, None) => Lease {
            metadata: ObjectMeta {
                name: Some(cfg.lease_name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(cfg.lease_duration_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        },
        (Decision::TakeOver { .. }, Some(current)) => {
            let mut lease = current.clone();
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(cfg.identity.clone());
            spec.lease_duration_seconds = Some(cfg.lease_duration_seconds());
            spec.acquire_time = Some(now.clone());
            spec.renew_time = Some(now);
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            lease
        }
        (Decision::Renew, Some(current)) => {
            let mut lease = current.clone();
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(cfg.identity.clone());
            spec.lease_duration_seconds = Some(cfg.lease_duration_seconds());
            if spec.acquire_time.is_none() {
                spec.acquire_time = Some(now.clone());
            }
            spec.renew_time = Some(now);
            lease
        }
    };
    Ok(Some(with_labels(lease, cfg)))
}

/// `lease` with [`LeaderConfig::labels`] set (others' labels kept).
fn with_labels(mut lease: Lease, cfg: &LeaderConfig) -> Lease {
    if !cfg.labels.is_empty() {
        let labels = lease.metadata.labels.get_or_insert_with(Default::default);
        labels.extend(cfg.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    lease
}

/// `current` with the holder cleared and a 1s duration, so a standby can take
/// it over on its next attempt instead of waiting for expiry.
pub(super) fn released_lease(current: &Lease, now: DateTime<Utc>) -> Result<Lease, LeaderError> {
    let now = micro_time(now)?;
    let mut lease = current.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now);
    Ok(lease)
}

fn micro_time(t: DateTime<Utc>) -> Result<MicroTime, LeaderError> {
    k8s_openapi::jiff::Timestamp::from_microsecond(t.timestamp_micros())
        .map(MicroTime)
        .map_err(LeaderError::Time)
}

/// What a watch of the Lease shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum LeaseSeen {
    /// Held by this identity.
    Held(String),
    /// No holder: released.
    Free,
    /// The Lease was deleted.
    Gone,
}

/// The holder a watched Lease names.
pub(super) fn seen(lease: &Lease) -> LeaseSeen {
    match lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
    {
        Some(h) => LeaseSeen::Held(h.to_owned()),
        None => LeaseSeen::Free,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const ME: &str = "csiops-0";
    const OTHER: &str = "csiops-1";

    fn cfg() -> LeaderConfig {
        LeaderConfig::new("csiops-leader", "csiops-system", ME)
    }

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + secs, 0).unwrap()
    }

    fn lease(holder: Option<&str>, renewed: Option<DateTime<Utc>>, duration: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("csiops-leader".into()),
                namespace: Some("csiops-system".into()),
                resource_version: Some("42".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                renew_time: renewed.map(|r| micro_time(r).unwrap()),
                acquire_time: renewed
                    .map(|r| micro_time(r - chrono::Duration::seconds(100)).unwrap()),
                lease_duration_seconds: duration,
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    /// A monotonic instant `secs` after a fixed origin.
    fn at(origin: Instant, secs: u64) -> Instant {
        origin + Duration::from_secs(secs)
    }

    #[test]
    fn no_lease_means_create() {
        let o = Instant::now();
        assert_eq!(decide(None, ME, o, o, &cfg()), Decision::Create);
    }

    #[test]
    fn own_lease_is_renewed_even_if_expired() {
        let o = Instant::now();
        let l = lease(Some(ME), Some(t(0)), Some(15));
        assert_eq!(decide(Some(&l), ME, o, at(o, 5), &cfg()), Decision::Renew);
        assert_eq!(decide(Some(&l), ME, o, at(o, 100), &cfg()), Decision::Renew);
    }

    #[test]
    fn foreign_lease_expires_a_lease_duration_after_its_last_change() {
        let o = Instant::now();
        let l = lease(Some(OTHER), Some(t(0)), Some(15));
        let wait = Decision::Wait {
            holder: OTHER.into(),
        };
        assert_eq!(decide(Some(&l), ME, o, at(o, 1), &cfg()), wait);
        assert_eq!(
            decide(
                Some(&l),
                ME,
                o,
                at(o, 15) - Duration::from_micros(1),
                &cfg()
            ),
            wait
        );
        // client-go: valid while observedTime + duration is after now.
        assert_eq!(
            decide(Some(&l), ME, o, at(o, 15), &cfg()),
            Decision::TakeOver {
                previous_holder: Some(OTHER.into())
            }
        );
    }

    /// The holder's clock is hours off ours, either way. Its renewTime says
    /// nothing to us: only whether the record keeps changing does.
    #[test]
    fn skewed_renew_times_neither_cut_a_live_lease_short_nor_keep_a_dead_one() {
        let o = Instant::now();
        let c = cfg();
        for skew in [-3600 * 24 * 365, -3600, 3600, 3600 * 24 * 365] {
            // First sight of a lease renewed "a year ago" (or "in a year"):
            // a live holder, to be waited for.
            let first = lease(Some(OTHER), Some(t(skew)), Some(15));
            let seen = Observation::update(None, &first, o);
            assert!(
                matches!(
                    decide(Some(&first), ME, seen.at(), at(o, 10), &c),
                    Decision::Wait { .. }
                ),
                "skew {skew}: taken over at first sight"
            );
            // It renews every 5 s (its clock still off): still alive at 40 s.
            let mut last = seen;
            let mut current = first;
            for i in 1..=8 {
                current = lease(Some(OTHER), Some(t(skew + 5 * i)), Some(15));
                let now = at(o, 5 * i as u64);
                last = Observation::update(Some(&last), &current, now);
                assert!(
                    matches!(
                        decide(Some(&current), ME, last.at(), now, &c),
                        Decision::Wait { .. }
                    ),
                    "skew {skew}: a renewing holder lost its lease at {}s",
                    5 * i
                );
            }
            // Then it stops: the same record, read again and again, expires
            // one lease duration after it last changed, and not before.
            let before = at(o, 40 + 14);
            let unchanged = Observation::update(Some(&last), &current.clone(), before);
            assert_eq!(unchanged.at(), at(o, 40), "skew {skew}");
            assert!(matches!(
                decide(Some(&current), ME, unchanged.at(), before, &c),
                Decision::Wait { .. }
            ));
            assert_eq!(
                decide(Some(&current), ME, unchanged.at(), at(o, 40 + 15), &c),
                Decision::TakeOver {
                    previous_holder: Some(OTHER.into())
                },
                "skew {skew}: a dead holder's lease kept"
            );
        }
    }

    #[test]
    fn metadata_changes_are_not_renewals() {
        let o = Instant::now();
        let l = lease(Some(OTHER), Some(t(0)), Some(15));
        let seen = Observation::update(None, &l, o);
        let mut touched = l.clone();
        touched.metadata.resource_version = Some("43".into());
        touched.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        assert_eq!(Observation::update(Some(&seen), &touched, at(o, 9)).at(), o);
        let mut renewed = l;
        if let Some(spec) = renewed.spec.as_mut() {
            spec.renew_time = Some(micro_time(t(-1)).unwrap());
        }
        assert_eq!(
            Observation::update(Some(&seen), &renewed, at(o, 9)).at(),
            at(o, 9),
            "any change of the record counts, even to an older renewTime"
        );
    }

    #[test]
    fn lease_duration_falls_back_to_config() {
        let o = Instant::now();
        let l = lease(Some(OTHER), Some(t(0)), None);
        let mut c = cfg();
        c.lease_duration = Duration::from_secs(30);
        assert!(matches!(
            decide(Some(&l), ME, o, at(o, 20), &c),
            Decision::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&l), ME, o, at(o, 31), &c),
            Decision::TakeOver { .. }
        ));
    }

    #[test]
    fn foreign_lease_without_renew_time_is_judged_like_any_other() {
        let o = Instant::now();
        let l = lease(Some(OTHER), None, Some(15));
        assert!(matches!(
            decide(Some(&l), ME, o, o, &cfg()),
            Decision::Wait { .. }
        ));
        assert!(matches!(
            decide(Some(&l), ME, o, at(o, 15), &cfg()),
            Decision::TakeOver { .. }
        ));
    }

    #[test]
    fn released_lease_is_taken_over() {
        let o = Instant::now();
        let released = Decision::TakeOver {
            previous_holder: None,
        };
        // Holder cleared, renewed just now: still free to take.
        let l = lease(None, Some(t(0)), Some(1));
        assert_eq!(decide(Some(&l), ME, o, o, &cfg()), released);
        // Empty-string holder, as client-go writes it.
        let l = lease(Some(""), Some(t(0)), Some(15));
        assert_eq!(decide(Some(&l), ME, o, o, &cfg()), released);
        // Lease object without a spec.
        let l = Lease::default();
        assert_eq!(decide(Some(&l), ME, o, o, &cfg()), released);
    }

    #[test]
    fn create_builds_a_fresh_lease() {
        let l = build_lease(None, &Decision::Create, t(0), &cfg())
            .unwrap()
            .unwrap();
        assert_eq!(l.metadata.name.as_deref(), Some("csiops-leader"));
        assert_eq!(l.metadata.namespace.as_deref(), Some("csiops-system"));
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.acquire_time, Some(micro_time(t(0)).unwrap()));
        assert_eq!(spec.renew_time, Some(micro_time(t(0)).unwrap()));
    }

    #[test]
    fn takeover_increments_transitions_and_sets_acquire_time() {
        let old = lease(Some(OTHER), Some(t(0)), Some(15));
        let o = Instant::now();
        let decision = decide(Some(&old), ME, o, at(o, 20), &cfg());
        let l = build_lease(Some(&old), &decision, t(20), &cfg())
            .unwrap()
            .unwrap();
        assert_eq!(l.metadata.resource_version.as_deref(), Some("42"));
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(micro_time(t(20)).unwrap()));
        assert_eq!(spec.renew_time, Some(micro_time(t(20)).unwrap()));
    }

    #[test]
    fn renew_only_moves_renew_time() {
        let old = lease(Some(ME), Some(t(0)), Some(15));
        let l = build_lease(Some(&old), &Decision::Renew, t(2), &cfg())
            .unwrap()
            .unwrap();
        assert_eq!(l.metadata.resource_version.as_deref(), Some("42"));
        let old_spec = old.spec.unwrap();
        let spec = l.spec.unwrap();
        assert_eq!(spec.lease_transitions, old_spec.lease_transitions);
        assert_eq!(spec.acquire_time, old_spec.acquire_time);
        assert_eq!(spec.renew_time, Some(micro_time(t(2)).unwrap()));
    }

    #[test]
    fn every_write_carries_the_configured_labels() {
        let labelled = LeaderConfig {
            labels: [("app".to_string(), "csi".to_string())].into(),
            ..cfg()
        };
        let created = build_lease(None, &Decision::Create, t(0), &labelled)
            .unwrap()
            .unwrap();
        assert_eq!(
            created.metadata.labels,
            Some([("app".to_string(), "csi".to_string())].into())
        );
        let mut old = lease(Some(ME), Some(t(0)), Some(15));
        old.metadata.labels = Some([("other".to_string(), "kept".to_string())].into());
        let renewed = build_lease(Some(&old), &Decision::Renew, t(2), &labelled)
            .unwrap()
            .unwrap();
        let labels = renewed.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("app").map(String::as_str), Some("csi"));
        assert_eq!(labels.get("other").map(String::as_str), Some("kept"));
        // Without labels configured, none are added.
        let plain = build_lease(None, &Decision::Create, t(0), &cfg())
            .unwrap()
            .unwrap();
        assert_eq!(plain.metadata.labels, None);
    }

    #[test]
    fn wait_builds_nothing() {
        let old = lease(Some(OTHER), Some(t(0)), Some(15));
        let decision = Decision::Wait {
            holder: OTHER.into(),
        };
        assert!(build_lease(Some(&old), &decision, t(1), &cfg())
            .unwrap()
            .is_none());
    }

    #[test]
    fn release_clears_holder_so_others_take_over() {
        let old = lease(Some(ME), Some(t(0)), Some(15));
        let l = released_lease(&old, t(1)).unwrap();
        let spec = l.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity, None);
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.lease_transitions, Some(3));
        let o = Instant::now();
        assert_eq!(
            decide(Some(&l), OTHER, o, o, &cfg()),
            Decision::TakeOver {
                previous_holder: None
            }
        );
    }

    #[test]
    fn micro_time_serializes_with_microseconds() {
        let at = t(0) + chrono::Duration::microseconds(123_456);
        let json = serde_json::to_value(micro_time(at).unwrap()).unwrap();
        assert_eq!(json, serde_json::json!("2023-11-14T22:13:20.123456Z"));
    }

    #[test]
    fn a_watched_lease_shows_its_holder() {
        assert_eq!(
            seen(&lease(Some(ME), None, None)),
            LeaseSeen::Held(ME.into())
        );
        assert_eq!(seen(&lease(None, None, None)), LeaseSeen::Free);
        assert_eq!(seen(&lease(Some(""), None, None)), LeaseSeen::Free);
        assert_eq!(seen(&Lease::default()), LeaseSeen::Free);
    }
}
