//! Golden tests: every case of `testdata/cases.json` translated here and by
//! csi-translation-lib v0.34.4 (`testdata/golden.json`, written by
//! `e2e/cluster-bins/kube/translate-golden`; the e2e test
//! `migration_golden` regenerates it and checks it is unchanged). Outputs
//! are compared as the API server would store them: absent, `null`, `{}`
//! and `[]` are the same.

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::Deserialize;
use serde_json::Value;

use super::*;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Case {
    name: String,
    op: String,
    #[serde(default)]
    plugin: String,
    #[serde(default)]
    pod_namespace: String,
    object: Value,
}

#[derive(Deserialize)]
struct Golden {
    name: String,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    error: Option<String>,
}

/// Cases where we knowingly differ, with why.
const DIFFERENT: &[(&str, &str)] = &[(
    "vsphere inline: storage policy (upstream crashes)",
    "csi-translation-lib reads the storage policy from the PV it is making and dereferences nil",
)];

/// Drops what the API server would not store: nulls, empty objects and
/// empty lists (after their own contents are dropped), and the top-level
/// apiVersion and kind (Go's objects are written without them).
fn normalize(v: Value, top: bool) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Array(items) => {
            let items: Vec<Value> = items
                .into_iter()
                .filter_map(|i| normalize(i, false))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let map: serde_json::Map<String, Value> = map
                .into_iter()
                .filter(|(k, _)| !(top && (k == "apiVersion" || k == "kind")))
                .filter_map(|(k, v)| normalize(v, false).map(|v| (k, v)))
                .collect();
            (!map.is_empty()).then_some(Value::Object(map))
        }
        other => Some(other),
    }
}

fn ours(case: &Case) -> Result<Value, MigrationError> {
    let object = case.object.clone();
    let out = match case.op.as_str() {
        "storage-class" => {
            let sc: StorageClass = serde_json::from_value(object).expect("case decodes");
            let plugin = Plugin::for_in_tree(&case.plugin).expect("case names a plugin");
            serde_json::to_value(storage_class_to_csi(plugin, &sc)?)
        }
        "in-tree-pv-to-csi" => {
            let pv: PersistentVolume = serde_json::from_value(object).expect("case decodes");
            serde_json::to_value(in_tree_pv_to_csi(&pv)?)
        }
        "csi-pv-to-in-tree" => {
            let pv: PersistentVolume = serde_json::from_value(object).expect("case decodes");
            serde_json::to_value(csi_pv_to_in_tree(&pv)?)
        }
        "inline-to-csi" => {
            let v: Volume = serde_json::from_value(object).expect("case decodes");
            serde_json::to_value(inline_volume_to_csi(&v, &case.pod_namespace)?)
        }
        other => panic!("unknown op {other}"),
    };
    Ok(out.expect("serializes"))
}

#[test]
fn translations_match_csi_translation_lib() {
    let cases: Vec<Case> =
        serde_json::from_str(include_str!("testdata/cases.json")).expect("cases.json");
    let golden: Vec<Golden> =
        serde_json::from_str(include_str!("testdata/golden.json")).expect("golden.json");
    assert_eq!(
        cases.len(),
        golden.len(),
        "golden.json is out of date: regenerate it (testdata/README.md)"
    );
    let mut failures = Vec::new();
    let mut errors = 0;
    for (case, want) in cases.iter().zip(&golden) {
        assert_eq!(case.name, want.name, "golden.json is out of date");
        if DIFFERENT.iter().any(|(n, _)| *n == case.name) {
            continue;
        }
        let got = ours(case);
        match (&got, &want.error, &want.output) {
            (Err(_), Some(_), _) => errors += 1,
            (Ok(got), None, Some(want)) => {
                let (got, want) = (normalize(got.clone(), true), normalize(want.clone(), true));
                if got != want {
                    failures.push(format!(
                        "{}:\n  ours:     {}\n  upstream: {}",
                        case.name,
                        serde_json::to_string(&got).unwrap_or_default(),
                        serde_json::to_string(&want).unwrap_or_default()
                    ));
                }
            }
            (got, error, _) => failures.push(format!(
                "{}: ours {got:?}, upstream error {error:?}",
                case.name
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        errors >= 15,
        "the cases that fail upstream fail here too ({errors})"
    );
}

/// The one case we translate where csi-translation-lib crashes.
#[test]
fn vsphere_inline_keeps_the_storage_policy() {
    let cases: Vec<Case> =
        serde_json::from_str(include_str!("testdata/cases.json")).expect("cases.json");
    let golden: Vec<Golden> =
        serde_json::from_str(include_str!("testdata/golden.json")).expect("golden.json");
    let name = DIFFERENT[0].0;
    let (case, want) = cases
        .iter()
        .zip(&golden)
        .find(|(c, _)| c.name == name)
        .expect("the case is there");
    assert!(
        want.error
            .as_deref()
            .is_some_and(|e| e.starts_with("panic:")),
        "upstream no longer crashes: drop the exception ({:?})",
        want.error
    );
    let pv: PersistentVolume =
        serde_json::from_value(ours(case).expect("translates")).expect("a PV");
    let csi = pv.spec.and_then(|s| s.csi).expect("a CSI source");
    assert_eq!(
        csi.volume_attributes
            .unwrap_or_default()
            .get("storagepolicyname")
            .map(String::as_str),
        Some("gold")
    );
}

#[test]
fn plugin_names() {
    for p in Plugin::ALL {
        assert_eq!(Plugin::for_driver(p.driver_name()), Some(p));
        assert_eq!(Plugin::for_in_tree(p.in_tree_name()), Some(p));
    }
    assert_eq!(Plugin::for_driver("kubernetes.io/aws-ebs"), None);
    assert_eq!(Plugin::for_in_tree("ebs.csi.aws.com"), None);
    assert_eq!(Plugin::for_driver("hostpath.csi.k8s.io"), None);
}

#[test]
fn csi_view_translates_only_in_tree_volumes() {
    let mut csi = PersistentVolume::default();
    csi.spec.get_or_insert_default().csi = Some(Default::default());
    assert!(matches!(csi_view(&csi), Ok(Cow::Borrowed(_))));
    let mut ebs = PersistentVolume::default();
    ebs.spec.get_or_insert_default().aws_elastic_block_store = Some(
        k8s_openapi::api::core::v1::AWSElasticBlockStoreVolumeSource {
            volume_id: "aws://us-east-1a/vol-1".into(),
            ..Default::default()
        },
    );
    let view = csi_view(&ebs).expect("translates");
    let source = view
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .expect("CSI");
    assert_eq!(
        (source.driver.as_str(), source.volume_handle.as_str()),
        ("ebs.csi.aws.com", "vol-1")
    );
}

#[test]
fn repair_only_gce_handles() {
    assert_eq!(
        repair_volume_handle("ebs.csi.aws.com", "vol-1", "i-1").as_deref(),
        Ok("vol-1")
    );
    assert_eq!(
        repair_volume_handle(
            "pd.csi.storage.gke.io",
            "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
            "projects/p/zones/us-east1-b/instances/n"
        )
        .as_deref(),
        Ok("projects/p/zones/us-east1-b/disks/d")
    );
    assert!(repair_volume_handle("hostpath.csi.k8s.io", "h", "n").is_err());
}

#[test]
fn partitions_as_atoi() {
    assert_eq!(atoi32("7"), Ok(7));
    assert_eq!(atoi32("+7"), Ok(7));
    assert_eq!(atoi32("-1"), Ok(-1));
    assert_eq!(
        atoi32("4294967297"),
        Ok(1),
        "truncated to 32 bits as upstream"
    );
    for bad in ["", "+", "1.0", " 1", "one", "99999999999999999999"] {
        assert!(atoi32(bad).is_err(), "{bad:?}");
    }
}
