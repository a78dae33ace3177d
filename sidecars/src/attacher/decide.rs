//! What to do with a VolumeAttachment or a PersistentVolume, as a pure
//! function of the cached objects. The controller carries out the answer;
//! every rule of the design doc and the upstream README lives here:
//!
//! - only VolumeAttachments whose `spec.attacher` is this driver;
//! - attach (no deletionTimestamp, not yet attached): refuse while the PV is
//!   missing or being deleted; otherwise our finalizer on the PV, then on
//!   the VolumeAttachment, both *before* ControllerPublishVolume, so that
//!   whatever is published is always covered by both finalizers;
//! - detach (deletionTimestamp and our finalizer): ControllerUnpublishVolume,
//!   then drop the finalizer;
//! - trivial mode (driver without PUBLISH_UNPUBLISH_VOLUME): mark attached,
//!   no finalizers, no CSI calls;
//! - PV finalizer: removed only from a PV with a deletionTimestamp that no
//!   VolumeAttachment refers to. Together with "attach only a PV without
//!   deletionTimestamp" this keeps the PV and VolumeAttachment queues from
//!   racing (upstream README, "Concurrency"): once a PV is being deleted, no
//!   new attach can start for it, and an attach that started earlier has its
//!   VolumeAttachment in the same cache the PV worker consults.
//! - CSI migration: a PV (or inline spec) with the in-tree source of a
//!   plugin that migrates to CSI is published through its CSI translation
//!   ([`Volume::csi_spec`]).

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::finalizer;
use crate::common::migration::{self, MigrationError, Plugin};

/// Whether the driver can publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// PUBLISH_UNPUBLISH_VOLUME: finalizers and CSI calls.
    Real,
    /// No PUBLISH_UNPUBLISH_VOLUME: mark attached, nothing else.
    Trivial,
}

/// Why an attach cannot start; recorded as `attachError` and retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("PersistentVolume {0:?} not found")]
    PvMissing(String),
    #[error("PersistentVolume {0:?} is marked for deletion")]
    PvDeleting(String),
    #[error("spec.source must name exactly one of persistentVolumeName and inlineVolumeSpec")]
    BadSource,
}

/// The answer for one VolumeAttachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VaAction {
    /// Another driver's attachment.
    NotOurs,
    /// Attached (or detached) already; nothing to write.
    Done,
    /// Trivial mode: one status write, attached.
    MarkAttached,
    /// Real mode: make sure of the finalizers, publish, mark attached.
    Attach {
        /// Our finalizer is missing on the PV (none for inline volumes).
        add_pv_finalizer: bool,
        /// Our finalizer is missing on the VolumeAttachment.
        add_va_finalizer: bool,
    },
    /// Real mode, but the attach may not start.
    Refuse(Refusal),
    /// Real mode: unpublish, then drop our finalizer.
    Detach {
        /// Other finalizers keep the object after ours is gone: then its
        /// status is also set to detached, so it does not claim a volume
        /// that is no longer attached. Otherwise the object disappears and
        /// the status write would be wasted.
        clear_status: bool,
    },
    /// Trivial mode, being deleted, yet our finalizer is on it (left from
    /// when the driver could publish): drop it without a CSI call, since the
    /// driver no longer offers ControllerUnpublishVolume.
    DropFinalizer,
}

/// The PV an attachment needs, as found in the cache.
#[derive(Debug, Clone, Copy)]
pub enum Volume<'a> {
    /// `spec.source.persistentVolumeName`, found.
    Pv(&'a PersistentVolume),
    /// `spec.source.persistentVolumeName`, not in the cache.
    MissingPv(&'a str),
    /// `spec.source.inlineVolumeSpec`.
    Inline(&'a PersistentVolumeSpec),
    /// Both or neither.
    Invalid,
}

impl<'a> Volume<'a> {
    /// The volume an attachment refers to, looked up with `get_pv`.
    pub fn of(
        va: &'a VolumeAttachment,
        get_pv: impl FnOnce(&str) -> Option<&'a PersistentVolume>,
    ) -> Self {
        let src = &va.spec.source;
        match (
            src.persistent_volume_name.as_deref(),
            src.inline_volume_spec.as_ref(),
        ) {
            (Some(name), None) => get_pv(name).map_or(Volume::MissingPv(name), Volume::Pv),
            (None, Some(spec)) => Volume::Inline(spec),
            _ => Volume::Invalid,
        }
    }

    /// The spec as it is.
    pub fn spec(&self) -> Option<&'a PersistentVolumeSpec> {
        match self {
            Volume::Pv(pv) => pv.spec.as_ref(),
            Volume::Inline(spec) => Some(spec),
            Volume::MissingPv(_) | Volume::Invalid => None,
        }
    }

    /// The spec to build CSI requests from: one with the in-tree source of
    /// a plugin that migrates to CSI translated to the CSI source (a PV
    /// with its labels and annotations, which some translations read), any
    /// other as it is. kube-controller-manager sends migrated pod volumes
    /// as inline specs translated already, and the API server wants a CSI
    /// source in every inline spec; one with an in-tree source would be
    /// translated as a PV of its own.
    pub fn csi_spec(&self) -> Result<Option<Cow<'a, PersistentVolumeSpec>>, MigrationError> {
        match self {
            Volume::Pv(pv) => Ok(match migration::csi_view(pv)? {
                Cow::Borrowed(pv) => pv.spec.as_ref().map(Cow::Borrowed),
                Cow::Owned(pv) => pv.spec.map(Cow::Owned),
            }),
            Volume::Inline(spec) if Plugin::of_spec(spec).is_some() => {
                let pv = PersistentVolume {
                    spec: Some((*spec).clone()),
                    ..Default::default()
                };
                Ok(migration::in_tree_pv_to_csi(&pv)?.spec.map(Cow::Owned))
            }
            Volume::Inline(spec) => Ok(Some(Cow::Borrowed(spec))),
            Volume::MissingPv(_) | Volume::Invalid => Ok(None),
        }
    }

    /// Whether the volume may come from an in-tree plugin (upstream's
    /// `isMigratable`): a PV with an in-tree source, or any inline spec
    /// (kube-controller-manager makes those only of migrated pod volumes).
    pub fn migrated(&self) -> bool {
        match self {
            Volume::Pv(pv) => pv.spec.as_ref().and_then(Plugin::of_spec).is_some(),
            Volume::Inline(_) => true,
            Volume::MissingPv(_) | Volume::Invalid => false,
        }
    }
}

/// What to do with `va`. `finalizer` is [`finalizer::finalizer_name`] of `driver`.
pub fn va_action(
    va: &VolumeAttachment,
    volume: Volume<'_>,
    driver: &str,
    finalizer: &str,
    mode: Mode,
) -> VaAction {
    if va.spec.attacher != driver {
        return VaAction::NotOurs;
    }
    let finalizers = va.metadata.finalizers.as_ref();
    let ours = finalizer::has(finalizers, finalizer);
    if va.metadata.deletion_timestamp.is_some() {
        return match (ours, mode) {
            (false, _) => VaAction::Done,
            (true, Mode::Trivial) => VaAction::DropFinalizer,
            (true, Mode::Real) => VaAction::Detach {
                clear_status: finalizers.is_some_and(|f| f.iter().any(|x| x != finalizer)),
            },
        };
    }
    if va.status.as_ref().is_some_and(|s| s.attached) {
        return VaAction::Done;
    }
    if mode == Mode::Trivial {
        return VaAction::MarkAttached;
    }
    let add_pv_finalizer = match volume {
        Volume::Pv(pv) if pv.metadata.deletion_timestamp.is_some() => {
            return VaAction::Refuse(Refusal::PvDeleting(
                pv.metadata.name.clone().unwrap_or_default(),
            ))
        }
        Volume::Pv(pv) => !finalizer::has(pv.metadata.finalizers.as_ref(), finalizer),
        Volume::MissingPv(name) => return VaAction::Refuse(Refusal::PvMissing(name.to_string())),
        Volume::Inline(_) => false,
        Volume::Invalid => return VaAction::Refuse(Refusal::BadSource),
    };
    VaAction::Attach {
        add_pv_finalizer,
        add_va_finalizer: !ours,
    }
}

/// The answer for one PersistentVolume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PvAction {
    Nothing,
    RemoveFinalizer,
}

/// Whether to drop our finalizer from `pv`; `referenced`: some
/// VolumeAttachment in the cache names it in `spec.source.persistentVolumeName`.
pub fn pv_action(pv: &PersistentVolume, finalizer: &str, referenced: bool) -> PvAction {
    if pv.metadata.deletion_timestamp.is_some()
        && finalizer::has(pv.metadata.finalizers.as_ref(), finalizer)
        && !referenced
    {
        PvAction::RemoveFinalizer
    } else {
        PvAction::Nothing
    }
}

/// Whether an update of a VolumeAttachment calls for a sync: upstream's
/// `shouldEnqueueVAChange`. An update that changed nothing but
/// `attachError`/`detachError` (and the resourceVersion and managed fields
/// that come with any write) is the attacher's own record of a failure; a
/// sync for it would retry at once and cut the failure's backoff short, and
/// with a driver whose messages differ on every call (request IDs) each
/// retry would write a new message and bring the next. An unchanged
/// resourceVersion (a re-list) does call for one.
pub fn is_relevant_change(old: &VolumeAttachment, new: &VolumeAttachment) -> bool {
    if old.metadata.resource_version == new.metadata.resource_version {
        return true;
    }
    let error_free = |va: &VolumeAttachment| {
        va.status
            .as_ref()
            .is_none_or(|s| s.attach_error.is_none() && s.detach_error.is_none())
    };
    if error_free(old) && error_free(new) {
        // Whatever changed, it is not an error record.
        return true;
    }
    // `new` with old's error fields and write metadata: equal to `old` when
    // nothing else changed. A missing status counts as an empty one, as
    // Go's value-typed status does.
    let old_status = old.status.clone().unwrap_or_default();
    let mut sanitized = new.clone();
    sanitized.metadata.resource_version = old.metadata.resource_version.clone();
    sanitized.metadata.managed_fields = old.metadata.managed_fields.clone();
    let mut status = sanitized.status.take().unwrap_or_default();
    status.attach_error = old_status.attach_error.clone();
    status.detach_error = old_status.detach_error.clone();
    sanitized.status = Some(status);
    let mut old = old.clone();
    old.status = Some(old_status);
    sanitized != old
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::CSIPersistentVolumeSource;
    use k8s_openapi::api::storage::v1::{
        VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const D: &str = "test.csi.csiops.dev";
    const F: &str = "external-attacher/test-csi-csiops-dev";
    const OTHER_F: &str = "example.com/keep";

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    fn pv(deleting: bool, finalizers: &[&str]) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv1".into()),
                deletion_timestamp: deleting.then(now),
                finalizers: Some(finalizers.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: D.into(),
                    volume_handle: "h".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[derive(Clone, Copy)]
    struct V {
        attacher: &'static str,
        deleting: bool,
        attached: bool,
        finalizers: &'static [&'static str],
    }

    const NEW: V = V {
        attacher: D,
        deleting: false,
        attached: false,
        finalizers: &[],
    };

    fn va(v: V) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some("va1".into()),
                deletion_timestamp: v.deleting.then(now),
                finalizers: Some(v.finalizers.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: v.attacher.into(),
                node_name: "n1".into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some("pv1".into()),
                    ..Default::default()
                },
            },
            status: Some(VolumeAttachmentStatus {
                attached: v.attached,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn attachment_table() {
        let live_pv = pv(false, &[]);
        let live_pv_f = pv(false, &[F]);
        let dying_pv = pv(true, &[F]);
        let inline = PersistentVolumeSpec::default();
        use VaAction::*;
        let cases: Vec<(&str, V, Volume, Mode, VaAction)> = vec![
            (
                "another driver",
                V {
                    attacher: "other",
                    ..NEW
                },
                Volume::Pv(&live_pv),
                Mode::Real,
                NotOurs,
            ),
            (
                "new: both finalizers",
                NEW,
                Volume::Pv(&live_pv),
                Mode::Real,
                Attach {
                    add_pv_finalizer: true,
                    add_va_finalizer: true,
                },
            ),
            (
                "PV has ours",
                NEW,
                Volume::Pv(&live_pv_f),
                Mode::Real,
                Attach {
                    add_pv_finalizer: false,
                    add_va_finalizer: true,
                },
            ),
            (
                "retry after a failed publish",
                V {
                    finalizers: &[F],
                    ..NEW
                },
                Volume::Pv(&live_pv_f),
                Mode::Real,
                Attach {
                    add_pv_finalizer: false,
                    add_va_finalizer: false,
                },
            ),
            (
                "inline volume: no PV finalizer",
                NEW,
                Volume::Inline(&inline),
                Mode::Real,
                Attach {
                    add_pv_finalizer: false,
                    add_va_finalizer: true,
                },
            ),
            (
                "attached",
                V {
                    attached: true,
                    finalizers: &[F],
                    ..NEW
                },
                Volume::Pv(&live_pv_f),
                Mode::Real,
                Done,
            ),
            (
                "PV missing",
                NEW,
                Volume::MissingPv("pv1"),
                Mode::Real,
                Refuse(Refusal::PvMissing("pv1".into())),
            ),
            (
                "PV being deleted",
                NEW,
                Volume::Pv(&dying_pv),
                Mode::Real,
                Refuse(Refusal::PvDeleting("pv1".into())),
            ),
            (
                "bad source",
                NEW,
                Volume::Invalid,
                Mode::Real,
                Refuse(Refusal::BadSource),
            ),
            (
                "trivial",
                NEW,
                Volume::MissingPv("pv1"),
                Mode::Trivial,
                MarkAttached,
            ),
            (
                "trivial, attached",
                V {
                    attached: true,
                    ..NEW
                },
                Volume::Pv(&live_pv),
                Mode::Trivial,
                Done,
            ),
            (
                "detach",
                V {
                    deleting: true,
                    attached: true,
                    finalizers: &[F],
                    ..NEW
                },
                Volume::Pv(&live_pv_f),
                Mode::Real,
                Detach {
                    clear_status: false,
                },
            ),
            (
                "detach, PV deleting too",
                V {
                    deleting: true,
                    finalizers: &[F],
                    ..NEW
                },
                Volume::Pv(&dying_pv),
                Mode::Real,
                Detach {
                    clear_status: false,
                },
            ),
            (
                "detach, another finalizer stays",
                V {
                    deleting: true,
                    finalizers: &[OTHER_F, F],
                    ..NEW
                },
                Volume::Pv(&live_pv_f),
                Mode::Real,
                Detach { clear_status: true },
            ),
            (
                "detached already",
                V {
                    deleting: true,
                    finalizers: &[OTHER_F],
                    ..NEW
                },
                Volume::Pv(&live_pv_f),
                Mode::Real,
                Done,
            ),
            (
                "trivial, deleted",
                V {
                    deleting: true,
                    ..NEW
                },
                Volume::Pv(&live_pv),
                Mode::Trivial,
                Done,
            ),
            (
                "trivial, leftover finalizer",
                V {
                    deleting: true,
                    finalizers: &[F],
                    ..NEW
                },
                Volume::Pv(&live_pv),
                Mode::Trivial,
                DropFinalizer,
            ),
            (
                "another driver, deleting",
                V {
                    attacher: "other",
                    deleting: true,
                    finalizers: &[F],
                    ..NEW
                },
                Volume::Pv(&live_pv),
                Mode::Real,
                NotOurs,
            ),
        ];
        for (name, v, vol, mode, want) in cases {
            assert_eq!(va_action(&va(v), vol, D, F, mode), want, "{name}");
        }
    }

    #[test]
    fn volume_lookup() {
        let p = pv(false, &[]);
        let mut a = va(NEW);
        assert!(matches!(
            Volume::of(&a, |n| (n == "pv1").then_some(&p)),
            Volume::Pv(_)
        ));
        assert!(matches!(Volume::of(&a, |_| None), Volume::MissingPv("pv1")));
        a.spec.source.inline_volume_spec = Some(PersistentVolumeSpec::default());
        assert!(matches!(Volume::of(&a, |_| Some(&p)), Volume::Invalid));
        a.spec.source.persistent_volume_name = None;
        let v = Volume::of(&a, |_| Some(&p));
        assert!(matches!(v, Volume::Inline(_)));
        assert!(v.spec().is_some());
        a.spec.source.inline_volume_spec = None;
        assert!(matches!(Volume::of(&a, |_| Some(&p)), Volume::Invalid));
    }

    #[test]
    fn pv_finalizer_table() {
        let cases = [
            (pv(true, &[F]), false, PvAction::RemoveFinalizer),
            (
                pv(true, &["kubernetes.io/pv-protection", F]),
                false,
                PvAction::RemoveFinalizer,
            ),
            (pv(true, &[F]), true, PvAction::Nothing),
            (pv(false, &[F]), false, PvAction::Nothing),
            (
                pv(true, &["kubernetes.io/pv-protection"]),
                false,
                PvAction::Nothing,
            ),
        ];
        for (i, (p, referenced, want)) in cases.iter().enumerate() {
            assert_eq!(pv_action(p, F, *referenced), *want, "case {i}");
        }
    }

    mod relevant_change {
        use super::*;
        use k8s_openapi::api::storage::v1::VolumeError;

        fn va(
            rv: &str,
            attach_error: Option<&str>,
            detach_error: Option<&str>,
        ) -> VolumeAttachment {
            let error = |m: &str| VolumeError {
                message: Some(m.into()),
                time: Some(now()),
                ..Default::default()
            };
            VolumeAttachment {
                metadata: ObjectMeta {
                    name: Some("va".into()),
                    resource_version: Some(rv.into()),
                    finalizers: Some(vec![F.into()]),
                    ..Default::default()
                },
                spec: VolumeAttachmentSpec {
                    attacher: D.into(),
                    node_name: "node".into(),
                    source: VolumeAttachmentSource {
                        persistent_volume_name: Some("pv1".into()),
                        ..Default::default()
                    },
                },
                status: (attach_error.is_some() || detach_error.is_some()).then(|| {
                    VolumeAttachmentStatus {
                        attach_error: attach_error.map(error),
                        detach_error: detach_error.map(error),
                        ..Default::default()
                    }
                }),
            }
        }

        #[test]
        fn own_error_records_are_not_relevant() {
            // First error written (no status before), a new message, the
            // detach error: none of them calls for a sync.
            assert!(!is_relevant_change(
                &va("1", None, None),
                &va("2", Some("rpc error (#1)"), None)
            ));
            assert!(!is_relevant_change(
                &va("2", Some("rpc error (#1)"), None),
                &va("3", Some("rpc error (#2)"), None)
            ));
            assert!(!is_relevant_change(
                &va("3", None, None),
                &va("4", None, Some("unpublish failed"))
            ));
            // With managed fields changing too, as every write changes them.
            let mut written = va("5", Some("rpc error (#3)"), None);
            written.metadata.managed_fields = Some(vec![Default::default()]);
            assert!(!is_relevant_change(
                &va("4", Some("rpc error (#2)"), None),
                &written
            ));
        }

        #[test]
        fn everything_else_is() {
            let old = va("2", Some("rpc error"), None);
            // A re-list: same resourceVersion.
            assert!(is_relevant_change(&old, &old.clone()));
            // No error on either side.
            assert!(is_relevant_change(
                &va("1", None, None),
                &va("2", None, None)
            ));
            // Deletion requested along with a new error.
            let mut deleting = va("3", Some("other"), None);
            deleting.metadata.deletion_timestamp = Some(now());
            assert!(is_relevant_change(&old, &deleting));
            // A finalizer change.
            let mut unfinalized = va("3", Some("rpc error"), None);
            unfinalized.metadata.finalizers = None;
            assert!(is_relevant_change(&old, &unfinalized));
            // The attach succeeded (attached flips, the error goes).
            let mut attached = va("3", None, None);
            attached.status = Some(VolumeAttachmentStatus {
                attached: true,
                ..Default::default()
            });
            assert!(is_relevant_change(&old, &attached));
            // The node changed (not possible in the API, but not ours to judge).
            let mut moved = va("3", Some("rpc error"), None);
            moved.spec.node_name = "other".into();
            assert!(is_relevant_change(&old, &moved));
        }
    }

    /// CSI migration: in-tree sources are published through their CSI
    /// translation, whether the PV or the inline spec carries them.
    #[test]
    fn in_tree_volumes_are_seen_as_csi() {
        use k8s_openapi::api::core::v1::AWSElasticBlockStoreVolumeSource;
        let ebs = PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: "aws://us-east-1a/vol-0abc".into(),
                fs_type: Some("xfs".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let in_tree_pv = PersistentVolume {
            spec: Some(ebs.clone()),
            ..pv(false, &[])
        };
        for (name, volume) in [
            ("in-tree PV", Volume::Pv(&in_tree_pv)),
            ("in-tree inline spec", Volume::Inline(&ebs)),
        ] {
            let spec = volume.csi_spec().expect("translates").expect("a spec");
            let csi = spec.csi.as_ref().expect("a CSI source");
            assert_eq!(
                (
                    csi.driver.as_str(),
                    csi.volume_handle.as_str(),
                    csi.fs_type.as_deref()
                ),
                ("ebs.csi.aws.com", "vol-0abc", Some("xfs")),
                "{name}"
            );
            assert!(matches!(spec, Cow::Owned(_)), "{name}");
            assert!(volume.migrated(), "{name}");
        }
        let csi_pv = pv(false, &[]);
        let plain = Volume::Pv(&csi_pv);
        assert!(matches!(plain.csi_spec(), Ok(Some(Cow::Borrowed(_)))));
        assert!(!plain.migrated());
        let bad = PersistentVolumeSpec {
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: "aws://us-east-1a/disk".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(matches!(
            Volume::Inline(&bad).csi_spec(),
            Err(MigrationError::EbsVolumeId(_))
        ));
        assert_eq!(Volume::MissingPv("x").csi_spec(), Ok(None));
    }
}
