//! What the journal sweep checks before it acts on an intent.
//!
//! The journal is a ConfigMap in the driver's namespace: whoever may write
//! ConfigMaps there may write an intent, and the sweep acts on intents with
//! the provisioner's rights (CreateVolume and DeleteVolume through the
//! driver, `get` on Secrets in every namespace). So an intent is acted on
//! only if it is one this provisioner could have written:
//!
//! - its key (the volume and PV name the sweep looks up) is the name its
//!   stored request creates, so the PV check and the volume deleted are the
//!   same volume: a key `x` whose request names a live volume `y` would
//!   otherwise find no PV `x` and delete `y`;
//! - its provisioner Secret is the one its StorageClass gives that claim
//!   (the class read from the API server, for this driver), or none when
//!   the class gives none: an intent cannot hand the driver a Secret of its
//!   choosing;
//! - when that Secret depends on the claim's namespace or name (templates
//!   `${pvc.namespace}`, `${pvc.name}`), the claim must still exist with the
//!   recorded UID: a forged claim reference would otherwise select another
//!   namespace's Secret.
//!
//! An intent that fails a check is neither swept nor trimmed: the sweep is
//! blocked and reports it (see `sweep`), since a human must tell a forgery
//! from a volume that really leaked.

use std::collections::BTreeMap;

use std::borrow::Cow;

use k8s_openapi::api::storage::v1::StorageClass;

use super::decide;
use super::journal::Record;
use super::params::{self, SecretKind, SecretRef, TemplateContext};

/// Why an intent is not acted on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Distrust {
    #[error("its key is {key:?} but its stored request creates volume {request:?}")]
    KeyMismatch { key: String, request: String },
    #[error("it names provisioner Secret {stored} but StorageClass {class:?} is gone, so that Secret cannot be checked")]
    ClassGone { class: String, stored: Shown },
    #[error("it names StorageClass {class:?}, which is {provisioner:?}'s, not this driver's")]
    OtherDriver { class: String, provisioner: String },
    #[error("it names provisioner Secret {stored} but StorageClass {class:?} gives {expected} for its claim")]
    SecretMismatch {
        class: String,
        stored: Shown,
        expected: Shown,
    },
    #[error("StorageClass {class:?} resolves its provisioner Secret from the claim's namespace or name, and claim {claim} no longer exists with the recorded UID to vouch for them")]
    UnverifiedClaim { class: String, claim: String },
    #[error("StorageClass {class:?}'s provisioner Secret does not resolve: {source}")]
    Params {
        class: String,
        source: params::ParamsError,
    },
    #[error("in-tree StorageClass {class:?} does not translate to CSI: {source}")]
    Migration {
        class: String,
        source: crate::common::migration::MigrationError,
    },
}

/// A Secret reference (or none) in messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown(pub Option<SecretRef>);

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(r) => write!(f, "{}/{}", r.namespace, r.name),
            None => f.write_str("none"),
        }
    }
}

/// The provisioner Secret of `class` for a claim `namespace/name`.
fn resolve(
    class_params: &BTreeMap<String, String>,
    volume: &str,
    namespace: &str,
    name: &str,
) -> Result<Option<SecretRef>, params::ParamsError> {
    params::secret_ref(
        SecretKind::Provisioner,
        class_params,
        &TemplateContext {
            pv_name: volume,
            pvc_name: name,
            pvc_namespace: namespace,
            // Refused in the provisioner Secret's templates anyway.
            pvc_annotations: None,
        },
    )
}

/// Whether the intent of volume `key` may be acted on: `Ok` with the
/// Secret to fetch, if any. `request_name` is its decoded request's name;
/// `class` the server's StorageClass of the record (needed only when the
/// record names a Secret); `claim_verified`: the claim exists with the
/// recorded UID.
pub fn check(
    key: &str,
    record: &Record,
    request_name: &str,
    class: Option<&StorageClass>,
    driver: &str,
    claim_verified: bool,
) -> Result<Option<SecretRef>, Distrust> {
    if request_name != key {
        return Err(Distrust::KeyMismatch {
            key: key.to_string(),
            request: request_name.to_string(),
        });
    }
    let stored = record.secret_ref();
    if stored.is_none() {
        // No Secret is read: DeleteVolume of the very volume the key names
        // (its PV was looked up under the same name) is all the intent can
        // cause, and that is what a real intent of a gone claim asks for.
        return Ok(None);
    }
    let Some(class) = class else {
        return Err(Distrust::ClassGone {
            class: record.class.clone(),
            stored: Shown(stored),
        });
    };
    // An in-tree class of the plugin that migrates to the driver: its
    // Secret as the provisioning resolved it, from the translated class.
    let class = match decide::migrated_plugin(class, driver) {
        Some(plugin) => Cow::Owned(
            crate::common::migration::storage_class_to_csi(plugin, class).map_err(|source| {
                Distrust::Migration {
                    class: record.class.clone(),
                    source,
                }
            })?,
        ),
        None if class.provisioner != driver => {
            return Err(Distrust::OtherDriver {
                class: record.class.clone(),
                provisioner: class.provisioner.clone(),
            })
        }
        None => Cow::Borrowed(class),
    };
    let class_params = class.parameters.clone().unwrap_or_default();
    let params_error = |source| Distrust::Params {
        class: record.class.clone(),
        source,
    };
    let claim = &record.claim;
    let expected =
        resolve(&class_params, key, &claim.namespace, &claim.name).map_err(params_error)?;
    if expected != stored {
        return Err(Distrust::SecretMismatch {
            class: record.class.clone(),
            stored: Shown(stored),
            expected: Shown(expected),
        });
    }
    if !claim_verified {
        // Does the claim's namespace or name choose the Secret? Resolve for
        // two other claims and compare.
        let probe = |ns: &str, name: &str| resolve(&class_params, key, ns, name).ok().flatten();
        let depends = probe("csiops-probe-a", "csiops-probe-a") != expected
            || probe("csiops-probe-b", "csiops-probe-b") != expected;
        if depends {
            return Err(Distrust::UnverifiedClaim {
                class: record.class.clone(),
                claim: format!("{}/{}", claim.namespace, claim.name),
            });
        }
    }
    Ok(expected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provisioner::journal::{ClaimId, SecretName};
    use k8s_openapi::ByteString;

    const DRIVER: &str = "d.csi";

    fn record(secret: Option<(&str, &str)>) -> Record {
        Record {
            claim: ClaimId {
                namespace: "team-a".into(),
                name: "data".into(),
                uid: "u1".into(),
            },
            class: "fast".into(),
            request: ByteString(Vec::new()),
            secret: secret.map(|(ns, name)| SecretName {
                namespace: ns.into(),
                name: name.into(),
            }),
        }
    }

    fn class(provisioner: &str, secret: Option<(&str, &str)>) -> StorageClass {
        let mut c = StorageClass {
            provisioner: provisioner.into(),
            ..Default::default()
        };
        if let Some((ns, name)) = secret {
            c.parameters = Some(BTreeMap::from([
                (
                    "csi.storage.k8s.io/provisioner-secret-namespace".to_string(),
                    ns.to_string(),
                ),
                (
                    "csi.storage.k8s.io/provisioner-secret-name".to_string(),
                    name.to_string(),
                ),
            ]));
        }
        c
    }

    fn sref(ns: &str, name: &str) -> Option<SecretRef> {
        Some(SecretRef {
            namespace: ns.into(),
            name: name.into(),
        })
    }

    #[test]
    fn the_key_must_be_the_requested_volume() {
        let err =
            check("pvc-a", &record(None), "pvc-live", None, DRIVER, false).expect_err("forged");
        assert!(matches!(err, Distrust::KeyMismatch { .. }), "{err}");
        assert_eq!(
            check("pvc-a", &record(None), "pvc-a", None, DRIVER, false),
            Ok(None)
        );
    }

    #[test]
    fn the_secret_must_be_the_classs() {
        let fixed = class(DRIVER, Some(("storage", "prov")));
        // What the class gives: fetched, whether the claim exists or not.
        for verified in [true, false] {
            assert_eq!(
                check(
                    "v",
                    &record(Some(("storage", "prov"))),
                    "v",
                    Some(&fixed),
                    DRIVER,
                    verified
                ),
                Ok(sref("storage", "prov"))
            );
        }
        // Another Secret, or one where the class gives none.
        for (stored, class) in [
            (("kube-system", "admin"), fixed.clone()),
            (("storage", "prov"), class(DRIVER, None)),
        ] {
            let err = check("v", &record(Some(stored)), "v", Some(&class), DRIVER, true)
                .expect_err("not the class's");
            assert!(matches!(err, Distrust::SecretMismatch { .. }), "{err}");
        }
        // No class to check against, or another driver's.
        let err = check(
            "v",
            &record(Some(("storage", "prov"))),
            "v",
            None,
            DRIVER,
            true,
        )
        .expect_err("gone");
        assert!(matches!(err, Distrust::ClassGone { .. }), "{err}");
        let other = class("other.csi", Some(("storage", "prov")));
        let err = check(
            "v",
            &record(Some(("storage", "prov"))),
            "v",
            Some(&other),
            DRIVER,
            true,
        )
        .expect_err("other driver");
        assert!(matches!(err, Distrust::OtherDriver { .. }), "{err}");
    }

    /// An in-tree class (CSI migration): its Secret is the translated
    /// class's, here Portworx's auth Secret as the provisioner Secret.
    #[test]
    fn an_in_tree_class_is_checked_translated() {
        let mut px = class("kubernetes.io/portworx-volume", None);
        px.parameters = Some(BTreeMap::from([
            (
                "openstorage.io/auth-secret-name".to_string(),
                "px-auth".to_string(),
            ),
            (
                "openstorage.io/auth-secret-namespace".to_string(),
                "kube-system".to_string(),
            ),
        ]));
        let stored = record(Some(("kube-system", "px-auth")));
        assert_eq!(
            check("v", &stored, "v", Some(&px), "pxd.portworx.com", false),
            Ok(sref("kube-system", "px-auth"))
        );
        let err = check("v", &stored, "v", Some(&px), DRIVER, true)
            .expect_err("not a migration target of the class");
        assert!(matches!(err, Distrust::OtherDriver { .. }), "{err}");
    }

    #[test]
    fn a_secret_chosen_by_the_claim_needs_the_claim() {
        let per_namespace = class(DRIVER, Some(("${pvc.namespace}", "prov")));
        let per_claim = class(DRIVER, Some(("storage", "${pvc.name}")));
        for (c, stored) in [
            (&per_namespace, ("team-a", "prov")),
            (&per_claim, ("storage", "data")),
        ] {
            assert_eq!(
                check("v", &record(Some(stored)), "v", Some(c), DRIVER, true),
                Ok(sref(stored.0, stored.1))
            );
            let err = check("v", &record(Some(stored)), "v", Some(c), DRIVER, false)
                .expect_err("unverified");
            assert!(matches!(err, Distrust::UnverifiedClaim { .. }), "{err}");
        }
        // ${pv.name} is the key, checked above: no claim needed.
        let per_volume = class(DRIVER, Some(("storage", "${pv.name}")));
        assert_eq!(
            check(
                "v",
                &record(Some(("storage", "v"))),
                "v",
                Some(&per_volume),
                DRIVER,
                false
            ),
            Ok(sref("storage", "v"))
        );
    }
}
