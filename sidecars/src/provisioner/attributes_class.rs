//! VolumeAttributesClass at provisioning (the `VolumeAttributesClass`
//! gate, on by default as in upstream v6): a claim naming a class in
//! `spec.volumeAttributesClassName` gets that class's parameters as
//! `CreateVolumeRequest.mutable_parameters`, and its PV names the class in
//! `spec.volumeAttributesClassName` (the PV controller binds a claim only to
//! a PV of the same class).
//!
//! What upstream does, and so this:
//! - the driver must report the controller capability MODIFY_VOLUME, or the
//!   claim is refused (a VolumeAttributesClass promises the attributes can
//!   be changed later with ControllerModifyVolume);
//! - the class must exist: until it does, the claim waits (retried, with a
//!   Warning Event naming the class). Here the classes are watched, so the
//!   claim is tried again as soon as its class appears;
//! - the class must be for this driver (`driverName`);
//! - its parameters are passed as they are: no key is reserved or stripped
//!   (the `csi.storage.k8s.io/controller-modify-secret-*` keys belong to
//!   the StorageClass, see [`super::params::SecretKind::ControllerModify`]).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::VolumeAttributesClass;

/// Why a claim's VolumeAttributesClass cannot be used (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttributesClassError {
    /// Upstream's words.
    #[error("CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported")]
    Unsupported,
    /// The API server's words for a missing object, and what happens next.
    #[error("volumeattributesclasses.storage.k8s.io {0:?} not found: the claim waits for VolumeAttributesClass {0:?} to be created")]
    Missing(String),
    #[error("VolumeAttributesClass {name:?} named by the claim is for driver {class_driver:?}, not {driver:?}")]
    OtherDriver {
        name: String,
        class_driver: String,
        driver: String,
    },
}

/// The VolumeAttributesClass the claim names, if the gate is on and the
/// name is not empty (an empty name means none, as upstream).
pub fn requested(claim: &PersistentVolumeClaim, enabled: bool) -> Option<&str> {
    if !enabled {
        return None;
    }
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// `CreateVolumeRequest.mutable_parameters` for a claim naming `requested`
/// (see [`requested`]); `class` is that class as cached (`None`: it does
/// not exist), `modify_volume` whether the driver has MODIFY_VOLUME.
/// Empty when the claim names no class.
pub fn mutable_parameters(
    requested: Option<&str>,
    class: Option<&VolumeAttributesClass>,
    driver: &str,
    modify_volume: bool,
) -> Result<HashMap<String, String>, AttributesClassError> {
    let Some(name) = requested else {
        return Ok(HashMap::new());
    };
    if !modify_volume {
        return Err(AttributesClassError::Unsupported);
    }
    let class = class.ok_or_else(|| AttributesClassError::Missing(name.to_string()))?;
    if class.driver_name != driver {
        return Err(AttributesClassError::OtherDriver {
            name: name.to_string(),
            class_driver: class.driver_name.clone(),
            driver: driver.to_string(),
        });
    }
    Ok(class
        .parameters
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect())
}

/// Whether a claim waiting for VolumeAttributesClass `class` may go on now
/// that the class appeared: its class is that one and it has no volume.
pub fn waits_for(claim: &PersistentVolumeClaim, class: &str, enabled: bool) -> bool {
    requested(claim, enabled) == Some(class)
        && claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;

    use super::*;

    const DRIVER: &str = "d.csi";

    fn claim(class: Option<&str>, volume: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                volume_attributes_class_name: class.map(str::to_string),
                volume_name: volume.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn class(driver: &str, params: &[(&str, &str)]) -> VolumeAttributesClass {
        VolumeAttributesClass {
            driver_name: driver.into(),
            parameters: (!params.is_empty()).then(|| {
                params
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_gate_and_an_empty_name_mean_no_class() {
        assert_eq!(requested(&claim(Some("gold"), None), true), Some("gold"));
        assert_eq!(requested(&claim(Some("gold"), None), false), None);
        assert_eq!(requested(&claim(Some(""), None), true), None);
        assert_eq!(requested(&claim(None, None), true), None);
        assert_eq!(requested(&PersistentVolumeClaim::default(), true), None);
    }

    #[test]
    fn mutable_parameters_decisions() {
        let gold = class(
            DRIVER,
            &[("iops", "3000"), ("csi.storage.k8s.io/x", "kept")],
        );
        let theirs = class("other.csi", &[("iops", "1")]);
        let empty = class(DRIVER, &[]);
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            Option<&'a VolumeAttributesClass>,
            bool,
            Result<Vec<(&'a str, &'a str)>, AttributesClassError>,
        );
        let cases: Vec<Case> = vec![
            ("no class named", None, None, false, Ok(vec![])),
            (
                // Parameters go through whole: nothing is reserved in a
                // VolumeAttributesClass.
                "class named and found",
                Some("gold"),
                Some(&gold),
                true,
                Ok(vec![("iops", "3000"), ("csi.storage.k8s.io/x", "kept")]),
            ),
            (
                "class without parameters",
                Some("gold"),
                Some(&empty),
                true,
                Ok(vec![]),
            ),
            (
                "driver without MODIFY_VOLUME, even with the class missing",
                Some("gold"),
                None,
                false,
                Err(AttributesClassError::Unsupported),
            ),
            (
                "class missing",
                Some("gold"),
                None,
                true,
                Err(AttributesClassError::Missing("gold".into())),
            ),
            (
                "class of another driver",
                Some("gold"),
                Some(&theirs),
                true,
                Err(AttributesClassError::OtherDriver {
                    name: "gold".into(),
                    class_driver: "other.csi".into(),
                    driver: DRIVER.into(),
                }),
            ),
        ];
        for (name, requested, class, modify, want) in cases {
            let want = want.map(|w| {
                w.into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<HashMap<_, _>>()
            });
            assert_eq!(
                mutable_parameters(requested, class, DRIVER, modify),
                want,
                "{name}"
            );
        }
        let missing = AttributesClassError::Missing("gold".into()).to_string();
        assert!(
            missing.contains("not found")
                && missing.contains("waits for VolumeAttributesClass \"gold\""),
            "{missing}"
        );
    }

    #[test]
    fn which_claims_a_new_class_wakes() {
        assert!(waits_for(&claim(Some("gold"), None), "gold", true));
        assert!(waits_for(&claim(Some("gold"), Some("")), "gold", true));
        assert!(!waits_for(&claim(Some("gold"), Some("pv-1")), "gold", true));
        assert!(!waits_for(&claim(Some("silver"), None), "gold", true));
        assert!(!waits_for(&claim(Some("gold"), None), "gold", false));
    }
}
