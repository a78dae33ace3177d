use super::*;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const D: &str = "test.csi.csiops.dev";
const ZONE: &str = "topology.kubernetes.io/zone";
const RACK: &str = "example.com/rack";

fn seg(pairs: &[(&str, &str)]) -> Segment {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn csi_node(name: &str, drivers: &[(&str, Option<&[&str]>)]) -> Arc<CSINode> {
    Arc::new(CSINode {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: CSINodeSpec {
            drivers: drivers
                .iter()
                .map(|(d, keys)| CSINodeDriver {
                    name: d.to_string(),
                    node_id: name.into(),
                    topology_keys: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
                    allocatable: None,
                })
                .collect(),
        },
    })
}

fn node(name: &str, labels: &[(&str, &str)]) -> Arc<Node> {
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(seg(labels)),
            ..Default::default()
        },
        ..Default::default()
    })
}

/// The Node named `name` among `nodes`, as the Node cache answers.
fn by_name(nodes: &[Arc<Node>], name: &str) -> Option<Arc<Node>> {
    nodes
        .iter()
        .find(|x| x.metadata.name.as_deref() == Some(name))
        .cloned()
}

#[test]
fn segments_are_unique_combinations_of_the_drivers_keys() {
    let keys: &[&str] = &[ZONE, RACK];
    let csi_nodes = vec![
        csi_node("a", &[(D, Some(keys))]),
        csi_node("b", &[(D, Some(keys))]),
        csi_node("c", &[(D, Some(keys))]),
        // Another driver only: not ours.
        csi_node("d", &[("other", Some(keys))]),
        // Label not written yet: skipped until it is.
        csi_node("e", &[(D, Some(keys))]),
        // CSINode without a Node: skipped.
        csi_node("gone", &[(D, Some(keys))]),
    ];
    let nodes = [
        node("a", &[(ZONE, "z1"), (RACK, "r1"), ("other", "x")]),
        node("b", &[(ZONE, "z1"), (RACK, "r1")]),
        node("c", &[(ZONE, "z2"), (RACK, "r1")]),
        node("d", &[(ZONE, "z3"), (RACK, "r3")]),
        node("e", &[(ZONE, "z4")]),
    ];
    assert_eq!(
        segments(D, true, &csi_nodes, |n| by_name(&nodes, n)),
        BTreeSet::from([
            seg(&[(RACK, "r1"), (ZONE, "z1")]),
            seg(&[(RACK, "r1"), (ZONE, "z2")]),
        ])
    );
}

#[test]
fn a_driver_without_keys_or_without_topology_has_the_empty_segment() {
    let csi_nodes = vec![csi_node("a", &[(D, None)])];
    let nodes = [node("a", &[(ZONE, "z1")])];
    assert_eq!(
        segments(D, true, &csi_nodes, |n| by_name(&nodes, n)),
        BTreeSet::from([Segment::new()])
    );
    assert_eq!(
        segments(D, false, &[], |_| None),
        BTreeSet::from([Segment::new()])
    );
    assert_eq!(segments(D, true, &[], |_| None), BTreeSet::new());
}

fn class(name: &str, provisioner: &str, mode: Option<&str>) -> Arc<StorageClass> {
    Arc::new(StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        volume_binding_mode: mode.map(str::to_string),
        parameters: Some(seg(&[("type", name)])),
        ..Default::default()
    })
}

#[test]
fn classes_of_the_driver_with_late_binding() {
    let classes = vec![
        class("late", D, Some("WaitForFirstConsumer")),
        class("now", D, Some("Immediate")),
        class("unset", D, None),
        class("foreign", "other", Some("WaitForFirstConsumer")),
    ];
    assert_eq!(
        tracked_classes(D, false, &classes),
        BTreeMap::from([("late".to_string(), seg(&[("type", "late")]))])
    );
    assert_eq!(
        tracked_classes(D, true, &classes)
            .keys()
            .collect::<Vec<_>>(),
        ["late", "now", "unset"]
    );
}

#[test]
fn desired_is_the_product() {
    let s = BTreeSet::from([seg(&[(ZONE, "z1")]), seg(&[(ZONE, "z2")])]);
    let c = BTreeMap::from([
        ("a".to_string(), BTreeMap::new()),
        ("b".to_string(), BTreeMap::new()),
    ]);
    let d = desired(&s, &c);
    assert_eq!(d.len(), 4);
    assert!(d.contains(&WorkItem {
        segment: seg(&[(ZONE, "z2")]),
        class: "a".into()
    }));
    assert!(desired(&s, &BTreeMap::new()).is_empty());
}

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: "ctrl".into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn item(zone: &str, class: &str) -> WorkItem {
    WorkItem {
        segment: seg(&[(ZONE, zone)]),
        class: class.into(),
    }
}

#[test]
fn rendered_object() {
    let o = owner("u1");
    let obj = render(
        D,
        MANAGED_BY,
        "ns",
        Some(&o),
        &item("z1", "late"),
        Reported {
            capacity: 100 << 30,
            maximum_volume_size: Some(1536),
        },
    );
    let json = serde_json::to_value(&obj).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIStorageCapacity",
            "metadata": {
                "generateName": "csisc-",
                "namespace": "ns",
                "labels": {
                    "csi.storage.k8s.io/drivername": D,
                    "csi.storage.k8s.io/managed-by": "external-provisioner",
                },
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "Deployment", "name": "ctrl",
                    "uid": "u1", "controller": true,
                }],
            },
            "storageClassName": "late",
            "nodeTopology": {"matchLabels": {ZONE: "z1"}},
            "capacity": "100Gi",
            "maximumVolumeSize": "1536",
        })
    );
    let bare = render(
        D,
        MANAGED_BY,
        "ns",
        None,
        &WorkItem {
            segment: Segment::new(),
            class: "c".into(),
        },
        Reported {
            capacity: 0,
            maximum_volume_size: None,
        },
    );
    assert_eq!(bare.metadata.owner_references, None);
    assert_eq!(bare.capacity, Some(Quantity("0".into())));
    assert_eq!(bare.maximum_volume_size, None);
    assert_eq!(
        bare.node_topology,
        Some(LabelSelector {
            match_labels: Some(BTreeMap::new()),
            match_expressions: None
        })
    );
}

fn existing(name: &str, item: &WorkItem, age: i64, driver: &str) -> Arc<CSIStorageCapacity> {
    let mut o = render(
        driver,
        MANAGED_BY,
        "ns",
        None,
        item,
        Reported {
            capacity: 1 << 30,
            maximum_volume_size: None,
        },
    );
    o.metadata.name = Some(name.into());
    o.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 - age).unwrap(),
    ));
    Arc::new(o)
}

#[test]
fn managed_by_values_are_upstreams() {
    assert_eq!(managed_by(None), "external-provisioner");
    assert_eq!(managed_by(Some("node1")), "external-provisioner-node1");
    // Cut as upstream cuts it (its getNameWithMaxLength test case).
    let long = format!("node{}", "a".repeat(39));
    assert_eq!(
        managed_by(Some(&long)),
        format!("external-p-53f40b57-{long}")
    );
}

#[test]
fn managed_means_both_labels() {
    let i = item("z1", "c");
    assert!(is_managed(&existing("a", &i, 0, D), D, MANAGED_BY));
    assert!(!is_managed(&existing("a", &i, 0, "other"), D, MANAGED_BY));
    let mut other_manager = (*existing("a", &i, 0, D)).clone();
    other_manager
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(MANAGED_BY_LABEL.into(), "external-provisioner-node1".into());
    assert!(!is_managed(&other_manager, D, MANAGED_BY));
    // A node's instance manages only its own.
    assert!(is_managed(&other_manager, D, &managed_by(Some("node1"))));
    assert!(!is_managed(&other_manager, D, &managed_by(Some("node2"))));
    let mut unlabelled = other_manager;
    unlabelled.metadata.labels = None;
    assert!(!is_managed(&unlabelled, D, MANAGED_BY));
}

#[test]
fn existing_objects_are_adopted_duplicates_and_strays_obsolete() {
    let (a, b, gone) = (
        item("z1", "c"),
        item("z2", "c"),
        item("z1", "deleted-class"),
    );
    let want = BTreeSet::from([a.clone(), b.clone()]);
    let objs = vec![
        existing("csisc-new", &a, 10, D),
        existing("csisc-old", &a, 100, D),
        existing("csisc-gone", &gone, 50, D),
    ];
    let got = assign(&want, &objs);
    assert_eq!(
        got.objects
            .iter()
            .map(|(i, o)| (i.clone(), o.metadata.name.clone().unwrap()))
            .collect::<BTreeMap<_, _>>(),
        BTreeMap::from([(a.clone(), "csisc-old".to_string())])
    );
    assert_eq!(
        got.obsolete,
        BTreeSet::from(["csisc-gone".to_string(), "csisc-new".to_string()])
    );
    // An object with expressions or no topology serves no pair.
    let mut expr = (*existing("csisc-expr", &b, 0, D)).clone();
    expr.node_topology = Some(LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![Default::default()]),
    });
    let mut none = (*existing("csisc-none", &b, 0, D)).clone();
    none.node_topology = None;
    let got = assign(&want, &[Arc::new(expr), Arc::new(none)]);
    assert!(got.objects.is_empty());
    assert_eq!(got.obsolete.len(), 2);
}

#[test]
fn an_empty_topology_from_the_server_is_the_empty_segment() {
    let mut o = (*existing("x", &item("z", "c"), 0, D)).clone();
    o.node_topology = Some(LabelSelector::default());
    assert_eq!(
        item_of(&o),
        Some(WorkItem {
            segment: Segment::new(),
            class: "c".into()
        })
    );
}

#[test]
fn request_strips_reserved_keys_and_passes_the_segment() {
    let params = seg(&[
        ("type", "ssd"),
        ("csi.storage.k8s.io/provisioner-secret-name", "s"),
        ("csi.storage.k8s.io/fstype", "xfs"),
    ]);
    let r = request(&item("z1", "c"), &params);
    assert_eq!(
        r.parameters,
        HashMap::from([("type".to_string(), "ssd".to_string())])
    );
    assert_eq!(
        r.accessible_topology,
        Some(Topology {
            segments: HashMap::from([(ZONE.to_string(), "z1".to_string())])
        })
    );
    assert!(r.volume_capabilities.is_empty());
    let r = request(
        &WorkItem {
            segment: Segment::new(),
            class: "c".into(),
        },
        &params,
    );
    assert_eq!(r.accessible_topology, None);
}

#[test]
fn update_only_when_numbers_or_owner_differ() {
    let i = item("z1", "c");
    let o = owner("u1");
    let mut obj = render(
        D,
        MANAGED_BY,
        "ns",
        Some(&o),
        &i,
        Reported {
            capacity: 1 << 30,
            maximum_volume_size: Some(1 << 20),
        },
    );
    obj.capacity = Some(Quantity("1073741824".into()));
    let same = Reported {
        capacity: 1 << 30,
        maximum_volume_size: Some(1 << 20),
    };
    assert_eq!(updated(&obj, Some(&o), same), None);
    assert_eq!(updated(&obj, None, same), None);

    let lower = updated(
        &obj,
        Some(&o),
        Reported {
            capacity: 1 << 29,
            maximum_volume_size: None,
        },
    )
    .expect("changed");
    assert_eq!(lower.capacity, Some(Quantity("512Mi".into())));
    assert_eq!(lower.maximum_volume_size, None);
    assert_eq!(lower.metadata.owner_references, Some(vec![o.clone()]));

    // A new owner (the Deployment was re-created) is added.
    let o2 = owner("u2");
    let adopted = updated(&obj, Some(&o2), same).expect("owner added");
    assert_eq!(adopted.metadata.owner_references, Some(vec![o, o2]));
    assert_eq!(adopted.capacity, Some(Quantity("1Gi".into())));
}

/// `(key, operator, values)` of one node selector term.
type Term<'a> = Vec<(&'a str, &'a str, Vec<&'a str>)>;

fn pv(terms: Option<Vec<Term<'_>>>, class: Option<&str>) -> PersistentVolume {
    PersistentVolume {
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: D.into(),
                volume_handle: "v".into(),
                ..Default::default()
            }),
            storage_class_name: class.map(str::to_string),
            node_affinity: terms.map(|terms| VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: terms
                        .into_iter()
                        .map(|exprs| NodeSelectorTerm {
                            match_expressions: Some(
                                exprs
                                    .into_iter()
                                    .map(|(k, op, v)| NodeSelectorRequirement {
                                        key: k.into(),
                                        operator: op.into(),
                                        values: Some(v.into_iter().map(str::to_string).collect()),
                                    })
                                    .collect(),
                            ),
                            match_fields: None,
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn volumes_touch_their_segments_or_their_class() {
    let p = pv(
        Some(vec![
            vec![(ZONE, "In", vec!["z1"]), (RACK, "In", vec!["r1"])],
            vec![(ZONE, "In", vec!["z2"])],
            vec![(ZONE, "In", vec!["z3", "z4"])],
            vec![(ZONE, "NotIn", vec!["z5"])],
        ]),
        Some("c"),
    );
    let t = touched(&p);
    assert_eq!(
        t,
        Touched::Segments(vec![
            seg(&[(RACK, "r1"), (ZONE, "z1")]),
            seg(&[(ZONE, "z2")])
        ])
    );
    let want = BTreeSet::from([
        item("z1", "c"),
        item("z2", "c"),
        item("z2", "d"),
        item("z3", "c"),
    ]);
    assert_eq!(
        to_refresh(&want, &t).cloned().collect::<Vec<_>>(),
        vec![item("z2", "c"), item("z2", "d")]
    );
    let by_class = touched(&pv(None, Some("d")));
    assert_eq!(by_class, Touched::Class("d".into()));
    assert_eq!(
        to_refresh(&want, &by_class).cloned().collect::<Vec<_>>(),
        vec![item("z2", "d")]
    );
    assert_eq!(touched(&pv(None, None)), Touched::Unknown);
}

#[test]
fn a_pass_queues_changes_only() {
    let (a, b) = (item("z1", "c"), item("z2", "c"));
    let desired = BTreeSet::from([a.clone(), b.clone()]);
    let obj_a = existing("csisc-a", &a, 0, D);
    let with_a = assign(&desired, std::slice::from_ref(&obj_a));
    let pv = |zone: &str| Touched::Segments(vec![seg(&[(ZONE, zone)])]);

    // First pass (a poll): everything; PVs taken as they are.
    let vols = HashMap::from([("pv1".to_string(), pv("z1"))]);
    let (q, seen) = changes(&desired, &with_a, vols.clone(), true, &Seen::default());
    assert_eq!(q.sync, desired);
    assert!(q.delete.is_empty());
    assert_eq!(seen.missing, BTreeSet::from([b.clone()]));

    // Nothing changed (b's create failed and waits for its backoff).
    let (q, seen2) = changes(&desired, &with_a, vols.clone(), false, &seen);
    assert_eq!(q, Queued::default());
    assert_eq!(seen2, seen);

    // Someone deleted a's object: a is queued once.
    let none = assign(&desired, &[]);
    let (q, seen3) = changes(&desired, &none, vols.clone(), false, &seen);
    assert_eq!(q.sync, BTreeSet::from([a.clone()]));
    let (q, _) = changes(&desired, &none, vols.clone(), false, &seen3);
    assert_eq!(q, Queued::default());

    // A new PV in z2 and the old one gone from z1: both refreshed.
    let vols2 = HashMap::from([("pv2".to_string(), pv("z2"))]);
    let (q, _) = changes(&desired, &with_a, vols2, false, &seen);
    assert_eq!(q.sync, desired);

    // The class went: a's object is deleted once.
    let gone = assign(&BTreeSet::new(), &[obj_a]);
    let (q, seen4) = changes(&BTreeSet::new(), &gone, vols.clone(), false, &seen);
    assert_eq!(q.delete, BTreeSet::from(["csisc-a".to_string()]));
    assert!(q.sync.is_empty());
    let (q, _) = changes(&BTreeSet::new(), &gone, vols, false, &seen4);
    assert_eq!(q, Queued::default());
}
