use k8s_openapi::api::core::v1::TopologySelectorLabelRequirement;
use k8s_openapi::api::storage::v1::{CSINodeDriver, CSINodeSpec};

use super::*;

const DRIVER: &str = "hostpath.csi.k8s.io";
const ZONE: &str = "topology.example.com/zone";
const RACK: &str = "topology.example.com/rack";

fn node(name: &str, labels: &[(&str, &str)]) -> Arc<Node> {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    Arc::new(n)
}

fn csi_node(name: &str, drivers: &[(&str, &[&str])]) -> Arc<CSINode> {
    let mut c = CSINode {
        spec: CSINodeSpec {
            drivers: drivers
                .iter()
                .map(|(d, keys)| CSINodeDriver {
                    name: d.to_string(),
                    node_id: name.to_string(),
                    topology_keys: (!keys.is_empty())
                        .then(|| keys.iter().map(|k| k.to_string()).collect()),
                    allocatable: None,
                })
                .collect(),
        },
        ..Default::default()
    };
    c.metadata.name = Some(name.into());
    Arc::new(c)
}

fn allowed(terms: &[&[(&str, &[&str])]]) -> Vec<TopologySelectorTerm> {
    terms
        .iter()
        .map(|exprs| TopologySelectorTerm {
            match_label_expressions: Some(
                exprs
                    .iter()
                    .map(|(k, vs)| TopologySelectorLabelRequirement {
                        key: k.to_string(),
                        values: vs.iter().map(|v| v.to_string()).collect(),
                    })
                    .collect(),
            ),
        })
        .collect()
}

fn seg(pairs: &[(&str, &str)]) -> Topology {
    Topology {
        segments: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn zones(z: &[&str]) -> Vec<Topology> {
    z.iter().map(|z| seg(&[(ZONE, z)])).collect()
}

fn req(requisite: Vec<Topology>, preferred: Vec<Topology>) -> Option<TopologyRequirement> {
    Some(TopologyRequirement {
        requisite,
        preferred,
    })
}

/// Three zones, one node each, all with the driver; node-d is labelled but
/// has no driver; node-e has the driver registered without topology.
fn cluster() -> (Vec<Arc<Node>>, Vec<Arc<CSINode>>) {
    let nodes = vec![
        node("node-a", &[(ZONE, "a"), (RACK, "1")]),
        node("node-b", &[(ZONE, "b"), (RACK, "1")]),
        node("node-c", &[(ZONE, "c"), (RACK, "2")]),
        node("node-d", &[(ZONE, "d")]),
        node("node-e", &[]),
    ];
    let csi = vec![
        csi_node("node-a", &[(DRIVER, &[ZONE])]),
        csi_node("node-b", &[(DRIVER, &[ZONE]), ("other.csi", &[RACK])]),
        csi_node("node-c", &[(DRIVER, &[ZONE])]),
        csi_node("node-d", &[("other.csi", &[ZONE])]),
        csi_node("node-e", &[(DRIVER, &[])]),
    ];
    (nodes, csi)
}

fn inputs<'a>(
    nodes: &'a [Arc<Node>],
    csi_nodes: &'a [Arc<CSINode>],
    allowed_topologies: &'a [TopologySelectorTerm],
    selected_node: Option<&'a str>,
    strict_topology: bool,
) -> TopologyInputs<'a> {
    TopologyInputs {
        supports_topology: true,
        driver: DRIVER,
        pvc_name: "cache",
        strict_topology,
        immediate_topology: true,
        allowed_topologies,
        selected_node,
        nodes,
        csi_nodes,
    }
}

#[test]
fn readme_table() {
    let (nodes, csi) = cluster();
    let allowed_bc = allowed(&[&[(ZONE, &["c", "b"])]]);
    let none: Vec<TopologySelectorTerm> = vec![];
    // `pvc_name` "cache": fnv1_32("cache") % 3 == 1 and % 2 == 1, so
    // immediate binding puts the second sorted segment first.
    assert_eq!(fnv1_32(b"cache") % 3, 1);
    assert_eq!(fnv1_32(b"cache") % 2, 1);
    type Case<'a> = (
        &'a str,
        TopologyInputs<'a>,
        Result<Option<TopologyRequirement>, TopologyError>,
    );
    let cases: Vec<Case> = vec![
        (
            // "Yes | Yes | Irrelevant | `Requisite` = `Preferred` = Selected node topology"
            "delayed, strict, no allowed topologies",
            inputs(&nodes, &csi, &none, Some("node-b"), true),
            Ok(req(zones(&["b"]), zones(&["b"]))),
        ),
        (
            "delayed, strict, selected node allowed",
            inputs(&nodes, &csi, &allowed_bc, Some("node-b"), true),
            Ok(req(zones(&["b"]), zones(&["b"]))),
        ),
        (
            // Upstream refuses a selected node outside allowedTopologies
            // under strict topology.
            "delayed, strict, selected node not allowed",
            inputs(&nodes, &csi, &allowed_bc, Some("node-a"), true),
            Err(TopologyError::NotAllowed {
                node: "node-a".into(),
                topology: format!("{{{ZONE}=a}}"),
            }),
        ),
        (
            // "Yes | No | No | `Requisite` = Aggregated cluster topology
            // `Preferred` = `Requisite` with selected node topology as first element"
            // node-d (labelled, no driver) and node-e (no topology) are left out.
            "delayed, not strict, aggregated",
            inputs(&nodes, &csi, &none, Some("node-b"), false),
            Ok(req(zones(&["a", "b", "c"]), zones(&["b", "c", "a"]))),
        ),
        (
            // "Yes | No | Yes | `Requisite` = Allowed topologies
            // `Preferred` = `Requisite` with selected node topology as first element"
            "delayed, not strict, allowed topologies",
            inputs(&nodes, &csi, &allowed_bc, Some("node-c"), false),
            Ok(req(zones(&["b", "c"]), zones(&["c", "b"]))),
        ),
        (
            "delayed, not strict, selected node outside allowed topologies",
            inputs(&nodes, &csi, &allowed_bc, Some("node-a"), false),
            Err(TopologyError::NotInRequisite {
                node: "node-a".into(),
                topology: format!("{{{ZONE}=a}}"),
            }),
        ),
        (
            // "No | Irrelevant | No | `Requisite` = Aggregated cluster topology
            // `Preferred` = `Requisite` with randomly selected node topology as first element"
            "immediate, aggregated",
            inputs(&nodes, &csi, &none, None, false),
            Ok(req(zones(&["a", "b", "c"]), zones(&["b", "c", "a"]))),
        ),
        (
            // --strict-topology: "This option has no effect if ...
            // `Immediate` volume binding mode is used."
            "immediate, strict is irrelevant",
            inputs(&nodes, &csi, &none, None, true),
            Ok(req(zones(&["a", "b", "c"]), zones(&["b", "c", "a"]))),
        ),
        (
            // "No | Irrelevant | Yes | `Requisite` = Allowed topologies
            // `Preferred` = `Requisite` with randomly selected node topology as first element"
            "immediate, allowed topologies",
            inputs(&nodes, &csi, &allowed_bc, None, false),
            Ok(req(zones(&["b", "c"]), zones(&["c", "b"]))),
        ),
        (
            "no topology support",
            TopologyInputs {
                supports_topology: false,
                ..inputs(&nodes, &csi, &allowed_bc, Some("node-b"), true)
            },
            Ok(None),
        ),
        (
            "immediate, --immediate-topology=false",
            TopologyInputs {
                immediate_topology: false,
                ..inputs(&nodes, &csi, &none, None, false)
            },
            Ok(None),
        ),
        (
            "--immediate-topology=false keeps allowed topologies",
            TopologyInputs {
                immediate_topology: false,
                ..inputs(&nodes, &csi, &allowed_bc, None, false)
            },
            Ok(req(zones(&["b", "c"]), zones(&["c", "b"]))),
        ),
    ];
    for (name, i, want) in cases {
        assert_eq!(accessibility_requirements(&i), want, "{name}");
    }
}

#[test]
fn selected_node_problems() {
    let (nodes, csi) = cluster();
    let none: Vec<TopologySelectorTerm> = vec![];
    let mut unlabeled = nodes.clone();
    unlabeled[0] = node("node-a", &[(RACK, "1")]);
    let cases: Vec<(&str, TopologyInputs, TopologyError)> = vec![
        (
            "node gone",
            inputs(&nodes, &csi, &none, Some("node-x"), false),
            TopologyError::SelectedNodeNotFound("node-x".into()),
        ),
        (
            // The CSI design doc: the provisioner "must gracefully handle
            // the case where `CSINodeInfo` is not up-to-date".
            "no CSINode",
            inputs(&nodes, &csi[1..], &none, Some("node-a"), false),
            TopologyError::NoCSINode("node-a".into()),
        ),
        (
            "driver not on the node",
            inputs(&nodes, &csi, &none, Some("node-d"), false),
            TopologyError::NoTopologyKeys {
                node: "node-d".into(),
                driver: DRIVER.into(),
            },
        ),
        (
            "driver without topology keys",
            inputs(&nodes, &csi, &none, Some("node-e"), true),
            TopologyError::NoTopologyKeys {
                node: "node-e".into(),
                driver: DRIVER.into(),
            },
        ),
        (
            "label missing",
            inputs(&unlabeled, &csi, &none, Some("node-a"), true),
            TopologyError::MissingTopologyLabel {
                node: "node-a".into(),
                key: ZONE.into(),
            },
        ),
    ];
    for (name, i, want) in cases {
        assert_eq!(accessibility_requirements(&i), Err(want), "{name}");
    }
}

#[test]
fn immediate_without_registered_topology() {
    let none: Vec<TopologySelectorTerm> = vec![];
    let nodes = vec![node("n1", &[(ZONE, "a")])];
    // No CSINode has keys for the driver: wait for a node to register.
    let csi = vec![csi_node("n1", &[(DRIVER, &[])])];
    assert_eq!(
        accessibility_requirements(&inputs(&nodes, &csi, &none, None, false)),
        Err(TopologyError::NoTopology(DRIVER.into()))
    );
    // Keys registered but no registered node carries the label.
    let csi = vec![csi_node("n1", &[(DRIVER, &[RACK])])];
    assert_eq!(
        accessibility_requirements(&inputs(&nodes, &csi, &none, None, false)),
        Err(TopologyError::NoLabeledNodes(vec![RACK.into()]))
    );
}

#[test]
fn multi_key_segments_and_allowed_subsets() {
    let nodes = vec![
        node("n1", &[(ZONE, "a"), (RACK, "1")]),
        node("n2", &[(ZONE, "a"), (RACK, "2")]),
        node("n3", &[(ZONE, "b"), (RACK, "1")]),
        node("n4", &[(ZONE, "b"), (RACK, "1")]),
    ];
    let csi: Vec<Arc<CSINode>> = ["n1", "n2", "n3", "n4"]
        .iter()
        .map(|n| csi_node(n, &[(DRIVER, &[ZONE, RACK])]))
        .collect();
    let none: Vec<TopologySelectorTerm> = vec![];
    let s = |z: &str, r: &str| seg(&[(ZONE, z), (RACK, r)]);

    // Aggregation deduplicates n3/n4 and sorts by (rack, zone) pairs: keys
    // are compared in order, "…/rack" before "…/zone".
    let got = accessibility_requirements(&inputs(&nodes, &csi, &none, Some("n2"), false));
    assert_eq!(
        got,
        Ok(req(
            vec![s("a", "1"), s("b", "1"), s("a", "2")],
            vec![s("a", "2"), s("a", "1"), s("b", "1")],
        ))
    );

    // allowedTopologies with fewer keys than the node: the node's segment
    // matches the allowed segment it is a superset of; shorter terms sort first.
    let mixed = allowed(&[&[(ZONE, &["b"])], &[(ZONE, &["a"]), (RACK, &["2", "1"])]]);
    let got = accessibility_requirements(&inputs(&nodes, &csi, &mixed, Some("n3"), false));
    assert_eq!(
        got,
        Ok(req(
            vec![seg(&[(ZONE, "b")]), s("a", "1"), s("a", "2")],
            vec![seg(&[(ZONE, "b")]), s("a", "1"), s("a", "2")],
        ))
    );
    let got = accessibility_requirements(&inputs(&nodes, &csi, &mixed, Some("n3"), true));
    assert_eq!(got, Ok(req(vec![s("b", "1")], vec![s("b", "1")])));
    let got = accessibility_requirements(&inputs(&nodes, &csi, &mixed, Some("n2"), false));
    assert_eq!(
        got,
        Ok(req(
            vec![seg(&[(ZONE, "b")]), s("a", "1"), s("a", "2")],
            vec![s("a", "2"), seg(&[(ZONE, "b")]), s("a", "1")],
        ))
    );
}

#[test]
fn flatten_distributes_values() {
    let t = |pairs: &[(&str, &str)]| -> Term {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let cases: Vec<(&str, Vec<TopologySelectorTerm>, Vec<Term>)> = vec![
        (
            "cartesian product",
            allowed(&[&[(ZONE, &["z1", "z2"]), (RACK, &["a", "b"])]]),
            vec![
                t(&[(ZONE, "z1"), (RACK, "a")]),
                t(&[(ZONE, "z1"), (RACK, "b")]),
                t(&[(ZONE, "z2"), (RACK, "a")]),
                t(&[(ZONE, "z2"), (RACK, "b")]),
            ],
        ),
        (
            "terms are OR'ed",
            allowed(&[&[(ZONE, &["z1"])], &[(RACK, &["a"])]]),
            vec![t(&[(ZONE, "z1")]), t(&[(RACK, "a")])],
        ),
        (
            "empty term and empty values contribute nothing",
            vec![
                TopologySelectorTerm {
                    match_label_expressions: None,
                },
                allowed(&[&[(ZONE, &[]), (RACK, &["a"])]]).remove(0),
            ],
            vec![],
        ),
    ];
    for (name, input, want) in cases {
        assert_eq!(flatten(&input), want, "{name}");
    }
    // allowedTopologies made only of empty terms: no requirement
    // (upstream falls back to "topology disabled").
    let (nodes, csi) = cluster();
    let empty = vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![]),
    }];
    assert_eq!(
        accessibility_requirements(&inputs(&nodes, &csi, &empty, None, false)),
        Ok(None)
    );
}

#[test]
fn statefulset_spreading() {
    // FNV-1 32-bit test vectors (Go hash/fnv New32).
    assert_eq!(fnv1_32(b""), 0x811c_9dc5);
    assert_eq!(fnv1_32(b"a"), 0x050c_5d7e);
    assert_eq!(fnv1_32(b"foobar"), 0x31f0_b262);
    let cases: &[(&str, (u32, u32))] = &[
        ("data", (fnv1_32(b"data"), 0)),
        // ClaimName-StatefulSetName-Id: only the StatefulSet name is hashed.
        ("data-web-2", (fnv1_32(b"web"), 2)),
        ("logs-web-2", (fnv1_32(b"web"), 2)),
        // Name-Id: the name is hashed.
        ("web-7", (fnv1_32(b"web"), 7)),
        ("web-007", (fnv1_32(b"web"), 7)),
        // Not an ordinal.
        ("web-x", (fnv1_32(b"web-x"), 0)),
        ("web-+1", (fnv1_32(b"web-+1"), 0)),
        ("web-", (fnv1_32(b"web-"), 0)),
        ("web-99999999999", (fnv1_32(b"web-99999999999"), 0)),
        ("", (0, 0)),
    ];
    for (name, want) in cases {
        assert_eq!(pvc_name_hash_and_index(name), *want, "{name:?}");
    }

    // Consecutive replicas of one StatefulSet get consecutive segments.
    let (nodes, csi) = cluster();
    let none: Vec<TopologySelectorTerm> = vec![];
    let first = |pvc: &str| {
        let i = TopologyInputs {
            pvc_name: pvc,
            ..inputs(&nodes, &csi, &none, None, false)
        };
        accessibility_requirements(&i)
            .ok()
            .flatten()
            .and_then(|r| r.preferred.first().cloned())
    };
    let firsts: Vec<_> = (0..3).map(|i| first(&format!("data-web-{i}"))).collect();
    let base = (fnv1_32(b"web") % 3) as usize;
    let expected: Vec<_> = (0..3)
        .map(|i| Some(zones(&["a", "b", "c"])[(base + i) % 3].clone()))
        .collect();
    assert_eq!(firsts, expected);
    // Two claims of the same replica land together.
    assert_eq!(first("data-web-1"), first("logs-web-1"));
}

#[test]
fn immediate_binding_aggregates_every_registered_key_set() {
    use std::collections::BTreeSet;
    // Nodes register different key sets (mid-upgrade): every claim gets
    // the segments of both sets, whatever its name, and a node with the
    // labels of the finer set is offered at both granularities.
    let nodes = vec![
        node("n1", &[(ZONE, "a"), (RACK, "1")]),
        node("n2", &[(ZONE, "b"), (RACK, "2")]),
        node("n3", &[(ZONE, "c")]),
    ];
    let csi = vec![
        csi_node("n1", &[(DRIVER, &[ZONE])]),
        csi_node("n2", &[(DRIVER, &[ZONE, RACK])]),
        csi_node("n3", &[(DRIVER, &[ZONE])]),
    ];
    let none: Vec<TopologySelectorTerm> = vec![];
    let want_requisite = vec![
        seg(&[(ZONE, "a")]),
        seg(&[(ZONE, "b")]),
        seg(&[(ZONE, "c")]),
        seg(&[(RACK, "1"), (ZONE, "a")]),
        seg(&[(RACK, "2"), (ZONE, "b")]),
    ];
    for pvc in ["data", "data-web-0", "x", "y"] {
        let i = TopologyInputs {
            pvc_name: pvc,
            ..inputs(&nodes, &csi, &none, None, false)
        };
        let req = accessibility_requirements(&i)
            .expect("requirement")
            .expect("some");
        assert_eq!(req.requisite, want_requisite, "{pvc}");
        // Preferred is requisite rotated by the claim's hash: the same
        // segments (compared as sorted maps: a segment's own map has no
        // order).
        let canonical = |v: &[Topology]| -> BTreeSet<BTreeMap<String, String>> {
            v.iter()
                .map(|t| t.segments.clone().into_iter().collect())
                .collect()
        };
        assert_eq!(req.preferred.len(), want_requisite.len(), "{pvc}");
        assert_eq!(
            canonical(&req.preferred),
            canonical(&want_requisite),
            "{pvc}"
        );
    }
    // A key set no registered node has labels for adds nothing; the
    // others still count.
    let csi = vec![
        csi_node("n1", &[(DRIVER, &[ZONE])]),
        csi_node("n3", &[(DRIVER, &["topology.example.com/row"])]),
    ];
    let req = accessibility_requirements(&inputs(&nodes, &csi, &none, None, false))
        .expect("requirement")
        .expect("some");
    assert_eq!(req.requisite, zones(&["a", "c"]));
    // No set with labels at all: wait, naming every key.
    let csi = vec![csi_node(
        "n3",
        &[(DRIVER, &["topology.example.com/row", RACK])],
    )];
    assert_eq!(
        accessibility_requirements(&inputs(&nodes, &csi, &none, None, false)),
        Err(TopologyError::NoLabeledNodes(vec![
            RACK.into(),
            "topology.example.com/row".into()
        ]))
    );
}

#[test]
fn selected_node_annotation() {
    let claim = |pairs: &[(&str, &str)]| {
        let mut c = PersistentVolumeClaim::default();
        c.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        c
    };
    type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);
    let cases: &[Case] = &[
        (&[], None),
        (&[(SELECTED_NODE_ANNOTATION, "n1")], Some("n1")),
        (&[(ALPHA_SELECTED_NODE_ANNOTATION, "n2")], Some("n2")),
        (
            &[
                (SELECTED_NODE_ANNOTATION, "n1"),
                (ALPHA_SELECTED_NODE_ANNOTATION, "n2"),
            ],
            Some("n1"),
        ),
        (&[(SELECTED_NODE_ANNOTATION, "")], None),
    ];
    for (pairs, want) in cases {
        assert_eq!(selected_node(&claim(pairs)), *want, "{pairs:?}");
    }
    assert_eq!(selected_node(&PersistentVolumeClaim::default()), None);
}
