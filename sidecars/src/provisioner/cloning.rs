//! Cloning protection: the provisioner puts [`CLONE_FINALIZER`] on a
//! clone's source claim before CreateVolume (see
//! [`super::content_source::fetch::protect_source`]), so the source cannot be deleted while
//! the driver copies it; `--cloning-protection-threads` workers take it off
//! again once no clone of that claim is pending.
//!
//! Unlike upstream's CloningProtectionController, which looks only at
//! sources being deleted, the finalizer comes off as soon as the last clone
//! is bound (or deleted): a finalizer left on every clone source until its
//! deletion would be one more write at deletion time and would make a
//! provisioner that is down at that moment block the deletion. The queue is
//! fed from the claim watch: a claim carrying the finalizer, and the source
//! of any clone claim that changed or went away.
//!
//! Removing it early has a race upstream's way has not: a new clone may
//! find the finalizer still there (and not write it) while a worker that
//! has not seen that clone yet removes it. [`Cloning::lock`] closes it: the
//! provisioner's check-and-add and the worker's check-and-remove hold it,
//! and the worker records its write in the cache before letting go, so a
//! provisioner after it sees the finalizer gone and adds it again, and a
//! worker after a provisioner sees the clone (which the provisioner found
//! in the same cache) pending.

use std::borrow::Borrow;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::content_source::{clone_source_of, CLONE_FINALIZER};
use super::decide::ClaimKey;
use crate::common::workqueue::{Backoff, WorkQueue};

pub mod release;

/// The queue of clone sources to look at, and the lock ordering finalizer
/// checks (see the module docs).
pub struct Cloning {
    pub queue: Arc<WorkQueue<ClaimKey>>,
    pub lock: tokio::sync::Mutex<()>,
}

impl Cloning {
    pub fn new(backoff: Backoff) -> Self {
        Cloning {
            queue: Arc::new(WorkQueue::new(backoff)),
            lock: tokio::sync::Mutex::new(()),
        }
    }
}

/// Whether a claim still waits for its volume (a claim without a status
/// yet has just been created, and waits too).
fn pending(claim: &PersistentVolumeClaim) -> bool {
    matches!(
        claim.status.as_ref().and_then(|s| s.phase.as_deref()),
        None | Some("Pending")
    )
}

/// Whether [`CLONE_FINALIZER`] may come off `source`: it carries it and no
/// claim among `claims` is a pending clone of it. A pending clone being
/// deleted still counts: the provisioner may need the source to clean up
/// after it.
pub fn may_release<C: Borrow<PersistentVolumeClaim>>(
    source: &PersistentVolumeClaim,
    claims: impl IntoIterator<Item = C>,
) -> bool {
    let has = source
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == CLONE_FINALIZER));
    if !has {
        return false;
    }
    let key = ObjectRef::from_obj(source);
    !claims.into_iter().any(|c| {
        let c = c.borrow();
        pending(c) && clone_source_of(c).as_ref() == Some(&key)
    })
}

/// The claims a claim watch event asks the cloning queue to look at.
pub fn keys_to_check(event: &watcher::Event<PersistentVolumeClaim>) -> Vec<ClaimKey> {
    match event {
        watcher::Event::Apply(c) | watcher::Event::InitApply(c) => {
            let mut keys = Vec::new();
            if c.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == CLONE_FINALIZER))
            {
                keys.push(ObjectRef::from_obj(c));
            }
            keys.extend(clone_source_of(c));
            keys
        }
        watcher::Event::Delete(c) => clone_source_of(c).into_iter().collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, TypedLocalObjectReference,
        TypedObjectReference,
    };

    use super::*;

    fn claim(name: &str, phase: Option<&str>, source: Option<&str>) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                data_source: source.map(|s| TypedLocalObjectReference {
                    kind: "PersistentVolumeClaim".into(),
                    name: s.into(),
                    api_group: None,
                }),
                ..Default::default()
            }),
            status: phase.map(|p| PersistentVolumeClaimStatus {
                phase: Some(p.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ns".into());
        c
    }

    fn protected(name: &str) -> PersistentVolumeClaim {
        let mut c = claim(name, Some("Bound"), None);
        c.metadata.finalizers = Some(vec![
            "kubernetes.io/pvc-protection".into(),
            CLONE_FINALIZER.into(),
        ]);
        c
    }

    #[test]
    fn released_once_no_clone_is_pending() {
        let src = protected("src");
        assert!(may_release(&src, vec![src.clone()]));
        assert!(!may_release(
            &src,
            vec![src.clone(), claim("clone", Some("Pending"), Some("src"))]
        ));
        assert!(
            !may_release(&src, vec![claim("clone", None, Some("src"))]),
            "a claim without status yet is pending"
        );
        assert!(may_release(
            &src,
            vec![claim("clone", Some("Bound"), Some("src"))]
        ));
        assert!(
            may_release(&src, vec![claim("other", Some("Pending"), Some("x"))]),
            "a clone of another claim"
        );
        let mut elsewhere = claim("clone", Some("Pending"), Some("src"));
        elsewhere.metadata.namespace = Some("other".into());
        assert!(may_release(&src, vec![elsewhere]));
        // dataSourceRef of another namespace naming this claim.
        let mut cross = claim("clone", Some("Pending"), None);
        cross.metadata.namespace = Some("other".into());
        if let Some(s) = cross.spec.as_mut() {
            s.data_source_ref = Some(TypedObjectReference {
                kind: "PersistentVolumeClaim".into(),
                name: "src".into(),
                namespace: Some("ns".into()),
                api_group: None,
            });
        }
        assert!(!may_release(&src, vec![cross]));
        assert!(
            !may_release(
                &claim("src", Some("Bound"), None),
                Vec::<PersistentVolumeClaim>::new()
            ),
            "nothing to remove"
        );
    }

    #[test]
    fn events_queue_the_protected_claim_and_the_sources_of_clones() {
        let key = |n: &str| ObjectRef::<PersistentVolumeClaim>::new(n).within("ns");
        assert_eq!(
            keys_to_check(&watcher::Event::Apply(protected("src"))),
            vec![key("src")]
        );
        assert_eq!(
            keys_to_check(&watcher::Event::Apply(claim(
                "clone",
                Some("Bound"),
                Some("src")
            ))),
            vec![key("src")]
        );
        assert_eq!(
            keys_to_check(&watcher::Event::Delete(claim(
                "clone",
                Some("Pending"),
                Some("src")
            ))),
            vec![key("src")]
        );
        assert_eq!(
            keys_to_check(&watcher::Event::Apply(claim("plain", Some("Bound"), None))),
            Vec::<ClaimKey>::new()
        );
        assert_eq!(
            keys_to_check(&watcher::Event::Delete(protected("src"))),
            Vec::<ClaimKey>::new()
        );
    }
}
