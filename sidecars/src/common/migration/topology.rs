//! Topology rewrites the plugins share: a PV's node affinity and zone
//! labels between Kubernetes' zone/region keys and a CSI driver's key, and
//! a StorageClass's allowed topologies.
//!
//! In-tree PVs carry their zone either in node affinity or only in labels
//! (older ones), under the GA keys or the `failure-domain.beta` ones; which
//! pair a PV uses is decided once, by [`zone_region_keys`]. Several zones
//! in one label are joined with `__`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    TopologySelectorLabelRequirement, TopologySelectorTerm, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::{MigrationError, ZONES_KEY, ZONE_KEY};

pub const ZONE: &str = "topology.kubernetes.io/zone";
pub const REGION: &str = "topology.kubernetes.io/region";
pub const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
pub const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// Separates the zones of a multi-zone volume in a zone label.
pub const MULTI_ZONE_DELIMITER: &str = "__";

/// Derives a volume's one region from its zones (the plugin's naming).
pub type RegionOf = fn(&[String]) -> Result<String, String>;

/// The one region of `zones`, each zone's from `region` (which says what is
/// wrong with a zone it cannot read).
pub fn one_region(
    zones: &[String],
    region: impl Fn(&str) -> Result<String, String>,
) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".into());
    }
    let regions = zones
        .iter()
        .map(|zone| region(zone))
        .collect::<Result<BTreeSet<_>, _>>()?;
    match regions.len() {
        1 => Ok(regions.into_iter().next().unwrap_or_default()),
        _ => Err(format!(
            "multiple or no regions gotten from zones, got: {regions:?}"
        )),
    }
}

/// The required node selector terms, when there is at least one.
fn terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default()
}

fn terms_mut(pv: &mut PersistentVolume) -> Option<&mut Vec<NodeSelectorTerm>> {
    let terms = &mut pv
        .spec
        .as_mut()?
        .node_affinity
        .as_mut()?
        .required
        .as_mut()?
        .node_selector_terms;
    (!terms.is_empty()).then_some(terms)
}

fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a String> {
    pv.metadata.labels.as_ref()?.get(key)
}

/// Whether some requirement of the PV's required node affinity has `key`.
pub fn affinity_has_key(pv: &PersistentVolume, key: &str) -> bool {
    terms(pv)
        .iter()
        .any(|t| t.match_expressions.iter().flatten().any(|r| r.key == key))
}

/// The zone and region keys the PV uses: GA if its node affinity has the GA
/// zone key, else beta if it has the beta one; then the same by its labels;
/// GA when nothing says.
pub fn zone_region_keys(pv: &PersistentVolume) -> (&'static str, &'static str) {
    if affinity_has_key(pv, ZONE) {
        (ZONE, REGION)
    } else if affinity_has_key(pv, BETA_ZONE) {
        (BETA_ZONE, BETA_REGION)
    } else if label(pv, ZONE).is_some() {
        (ZONE, REGION)
    } else if label(pv, BETA_ZONE).is_some() {
        (BETA_ZONE, BETA_REGION)
    } else {
        (ZONE, REGION)
    }
}

/// Every value of `key` in the PV's node affinity, sorted, once each.
pub fn values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    let set: BTreeSet<&String> = terms(pv)
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|r| r.key == key)
        .flat_map(|r| r.values.iter().flatten())
        .collect();
    set.into_iter().cloned().collect()
}

/// Renames `old` to `new` in every requirement of the node affinity (a
/// requirement already under `new` is left beside it, not merged).
pub fn replace_key(pv: &mut PersistentVolume, old: &str, new: &str) {
    let Some(terms) = terms_mut(pv) else { return };
    for r in terms
        .iter_mut()
        .flat_map(|t| t.match_expressions.iter_mut().flatten())
    {
        if r.key == old {
            r.key = new.to_string();
        }
    }
}

/// Adds `key In zones` (trimmed, empty ones dropped, sorted, once each) to
/// every term, making the affinity (and one term) when there is none.
/// Nothing changes when no zone is left.
pub fn add_requirement(pv: &mut PersistentVolume, key: &str, zones: &[&str]) {
    let zones: BTreeSet<&str> = zones
        .iter()
        .map(|z| z.trim())
        .filter(|z| !z.is_empty())
        .collect();
    if zones.is_empty() {
        return;
    }
    let requirement = NodeSelectorRequirement {
        key: key.to_string(),
        operator: "In".into(),
        values: Some(zones.into_iter().map(str::to_string).collect()),
    };
    let spec = pv.spec.get_or_insert_default();
    let affinity = spec
        .node_affinity
        .get_or_insert_with(VolumeNodeAffinity::default);
    let required = affinity.required.get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_default()
            .push(requirement.clone());
    }
}

fn set_label_if_absent(pv: &mut PersistentVolume, key: &str, value: String) {
    pv.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .entry(key.to_string())
        .or_insert(value);
}

/// An in-tree PV's zone topology under the CSI driver's `csi_key`: the zone
/// requirements renamed, or (without any) one made from the zone label.
/// A beta region requirement becomes a GA one, so nodes without beta
/// labels still match.
pub fn in_tree_to_csi(pv: &mut PersistentVolume, csi_key: &str) {
    let (zone_key, region_key) = zone_region_keys(pv);
    if !values(pv, zone_key).is_empty() {
        replace_key(pv, zone_key, csi_key);
    } else if let Some(zones) = label(pv, zone_key).cloned() {
        let zones: Vec<&str> = zones.split(MULTI_ZONE_DELIMITER).collect();
        add_requirement(pv, csi_key, &zones);
    }
    if region_key == BETA_REGION && !values(pv, region_key).is_empty() {
        replace_key(pv, region_key, REGION);
    }
}

/// A CSI PV's zone topology under Kubernetes' keys, for a PV written with
/// the in-tree source: `csi_key` becomes the zone key; with `region_of`,
/// each term without a region gets the one its zones are in; zone (and a
/// single region) labels are added when missing.
pub fn csi_to_in_tree(
    pv: &mut PersistentVolume,
    csi_key: &str,
    region_of: Option<RegionOf>,
) -> Result<(), MigrationError> {
    let (zone_key, _) = zone_region_keys(pv);
    replace_key(pv, csi_key, zone_key);
    if let Some(region_of) = region_of {
        add_regions(pv, region_of)?;
    }
    let zones = values(pv, zone_key);
    if !zones.is_empty() {
        set_label_if_absent(pv, zone_key, zones.join(MULTI_ZONE_DELIMITER));
    }
    Ok(())
}

/// Every term without a region requirement gets one, derived from the
/// term's zones (an error when a term has none, or zones of several
/// regions); then the region label, if exactly one region is required.
fn add_regions(pv: &mut PersistentVolume, region_of: RegionOf) -> Result<(), MigrationError> {
    let (zone_key, region_key) = zone_region_keys(pv);
    let Some(terms) = terms_mut(pv) else {
        return Ok(());
    };
    for term in terms.iter_mut() {
        let exprs = term.match_expressions.get_or_insert_default();
        if exprs.iter().any(|r| r.key == region_key) {
            continue;
        }
        let zones: Vec<String> = exprs
            .iter()
            .filter(|r| r.key == zone_key)
            .flat_map(|r| r.values.iter().flatten().cloned())
            .collect();
        let region = region_of(&zones).map_err(MigrationError::Topology)?;
        exprs.push(NodeSelectorRequirement {
            key: region_key.to_string(),
            operator: "In".into(),
            values: Some(vec![region]),
        });
    }
    let regions = values(pv, region_key);
    if let [region] = regions.as_slice() {
        set_label_if_absent(pv, region_key, region.clone());
    }
    Ok(())
}

/// A class's allowed topologies with the zone keys (GA and beta) renamed to
/// the driver's `csi_key`; other keys pass as they are.
pub fn allowed_topologies(
    terms: &[TopologySelectorTerm],
    csi_key: &str,
) -> Vec<TopologySelectorTerm> {
    terms
        .iter()
        .map(|term| TopologySelectorTerm {
            match_label_expressions: term.match_label_expressions.as_ref().map(|exprs| {
                exprs
                    .iter()
                    .map(|e| {
                        if e.key == BETA_ZONE || e.key == ZONE {
                            TopologySelectorLabelRequirement {
                                key: csi_key.to_string(),
                                values: e.values.clone(),
                            }
                        } else {
                            e.clone()
                        }
                    })
                    .collect()
            }),
        })
        .collect()
}

/// One term: `key` in `values`.
pub fn selector(key: &str, values: Vec<String>) -> Vec<TopologySelectorTerm> {
    vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
            key: key.to_string(),
            values,
        }]),
    }]
}

/// The selector a class's `zone` or `zones` parameter (`param`, lowercased)
/// makes from its `value` (`zones`: comma-separated), on the driver's `key`.
pub fn zone_param_selector(key: &str, param: &str, value: &str) -> Vec<TopologySelectorTerm> {
    let zones = if param == ZONES_KEY {
        value.split(',').map(str::to_string).collect()
    } else {
        vec![value.to_string()]
    };
    selector(key, zones)
}

/// The class of a zonal plugin: its `zone`/`zones` parameters become
/// allowed topologies under the driver's `key` (see [`class_topologies`]);
/// `param` puts each other parameter (name, value) into the new ones.
pub fn zonal_class(
    sc: &mut StorageClass,
    key: &str,
    mut param: impl FnMut(&str, &str, &mut BTreeMap<String, String>),
) -> Result<(), MigrationError> {
    let mut params = BTreeMap::new();
    let mut generated = None;
    for (k, v) in sc.parameters.iter().flatten() {
        match k.to_lowercase().as_str() {
            zone @ (ZONE_KEY | ZONES_KEY) => generated = Some(zone_param_selector(key, zone, v)),
            _ => param(k, v, &mut params),
        }
    }
    sc.allowed_topologies = class_topologies(sc.allowed_topologies.take(), generated, key)?;
    sc.parameters = (!params.is_empty()).then_some(params);
    Ok(())
}

/// The class's allowed topologies after its `zone`/`zones` parameters
/// (`from_params`, already turned into a selector) are taken into account:
/// both at once is an error; the parameters win over nothing; otherwise
/// the class's own terms, their zone keys renamed to `csi_key`.
pub fn class_topologies(
    allowed: Option<Vec<TopologySelectorTerm>>,
    from_params: Option<Vec<TopologySelectorTerm>>,
    csi_key: &str,
) -> Result<Option<Vec<TopologySelectorTerm>>, MigrationError> {
    let has_allowed = allowed.as_ref().is_some_and(|a| !a.is_empty());
    match from_params {
        Some(_) if has_allowed => Err(MigrationError::ZoneAndAllowedTopologies),
        Some(generated) => Ok(Some(generated)),
        None if has_allowed => Ok(allowed.map(|a| allowed_topologies(&a, csi_key))),
        None => Ok(allowed),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PersistentVolumeSpec;

    use super::*;

    fn req(key: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: "In".into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn pv(terms: Vec<Vec<NodeSelectorRequirement>>, labels: &[(&str, &str)]) -> PersistentVolume {
        let mut pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                node_affinity: (!terms.is_empty()).then(|| VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: terms
                            .into_iter()
                            .map(|t| NodeSelectorTerm {
                                match_expressions: Some(t),
                                match_fields: None,
                            })
                            .collect(),
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        if !labels.is_empty() {
            pv.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
        }
        pv
    }

    fn exprs(pv: &PersistentVolume) -> Vec<Vec<(String, Vec<String>)>> {
        terms(pv)
            .iter()
            .map(|t| {
                t.match_expressions
                    .iter()
                    .flatten()
                    .map(|r| (r.key.clone(), r.values.clone().unwrap_or_default()))
                    .collect()
            })
            .collect()
    }

    fn e(key: &str, values: &[&str]) -> (String, Vec<String>) {
        (
            key.to_string(),
            values.iter().map(|v| v.to_string()).collect(),
        )
    }

    #[test]
    fn keys_by_affinity_then_labels_then_ga() {
        assert_eq!(zone_region_keys(&pv(vec![], &[])), (ZONE, REGION));
        assert_eq!(
            zone_region_keys(&pv(vec![], &[(BETA_ZONE, "a")])),
            (BETA_ZONE, BETA_REGION)
        );
        assert_eq!(
            zone_region_keys(&pv(vec![vec![req(BETA_ZONE, &["a"])]], &[(ZONE, "a")])),
            (BETA_ZONE, BETA_REGION),
            "affinity before labels"
        );
        assert_eq!(
            zone_region_keys(&pv(
                vec![vec![req(BETA_ZONE, &["a"])], vec![req(ZONE, &["b"])]],
                &[]
            )),
            (ZONE, REGION),
            "GA wins in the affinity"
        );
    }

    #[test]
    fn in_tree_zone_from_label_or_affinity() {
        let mut from_label = pv(vec![], &[(ZONE, "b__a__ a ")]);
        in_tree_to_csi(&mut from_label, "csi/zone");
        assert_eq!(exprs(&from_label), vec![vec![e("csi/zone", &["a", "b"])]]);

        let mut both = pv(
            vec![vec![req(BETA_ZONE, &["z1"]), req(BETA_REGION, &["r1"])]],
            &[(BETA_ZONE, "ignored")],
        );
        in_tree_to_csi(&mut both, "csi/zone");
        assert_eq!(
            exprs(&both),
            vec![vec![e("csi/zone", &["z1"]), e(REGION, &["r1"])]],
            "affinity wins; beta region becomes GA"
        );

        let mut empty_label = pv(vec![], &[(ZONE, "")]);
        in_tree_to_csi(&mut empty_label, "csi/zone");
        assert!(
            empty_label
                .spec
                .as_ref()
                .and_then(|s| s.node_affinity.as_ref())
                .is_none(),
            "no zone: no affinity made"
        );
    }

    fn first_region(zones: &[String]) -> Result<String, String> {
        zones
            .first()
            .map(|z| z.trim_end_matches(char::is_alphabetic).to_string())
            .ok_or_else(|| "no zones specified".to_string())
    }

    #[test]
    fn csi_zone_to_in_tree_with_regions_and_labels() {
        let mut translated = pv(
            vec![
                vec![req("csi/zone", &["r1a"])],
                vec![req("csi/zone", &["r1b"]), req(REGION, &["given"])],
            ],
            &[],
        );
        csi_to_in_tree(&mut translated, "csi/zone", Some(first_region)).expect("translates");
        assert_eq!(
            exprs(&translated),
            vec![
                vec![e(ZONE, &["r1a"]), e(REGION, &["r1"])],
                vec![e(ZONE, &["r1b"]), e(REGION, &["given"])],
            ]
        );
        let labels = translated.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(ZONE).map(String::as_str), Some("r1a__r1b"));
        assert_eq!(labels.get(REGION), None, "two regions: no region label");

        let mut no_zone = pv(vec![vec![req("other", &["x"])]], &[]);
        assert_eq!(
            csi_to_in_tree(&mut no_zone, "csi/zone", Some(first_region)),
            Err(MigrationError::Topology("no zones specified".into())),
            "a term without zones has no region"
        );
    }

    #[test]
    fn class_topologies_rules() {
        let mine = selector(ZONE, vec!["a".into()]);
        let generated = selector("csi/zone", vec!["b".into()]);
        assert_eq!(
            class_topologies(Some(mine.clone()), Some(generated.clone()), "csi/zone"),
            Err(MigrationError::ZoneAndAllowedTopologies)
        );
        assert_eq!(
            class_topologies(Some(vec![]), Some(generated.clone()), "csi/zone"),
            Ok(Some(generated.clone())),
            "an empty list is no list"
        );
        assert_eq!(
            class_topologies(Some(mine), None, "csi/zone"),
            Ok(Some(selector("csi/zone", vec!["a".into()])))
        );
        assert_eq!(class_topologies(None, None, "csi/zone"), Ok(None));
    }
}
