use super::*;
use csiops_proto::csi::v1::Topology;
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorTerm, PersistentVolumeSpec, VolumeNodeAffinity,
};

const NODE: &str = "n1";
const KEY: &str = "topology.hostpath.csi/node";

fn local(segment: Option<&[(&str, &str)]>) -> LocalNode {
    LocalNode::new(
        NODE,
        &NodeGetInfoResponse {
            node_id: "id-1".into(),
            accessible_topology: segment.map(|s| Topology {
                segments: s
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }),
            ..Default::default()
        },
    )
}

fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

fn term(exprs: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(exprs),
        match_fields: None,
    }
}

fn pv(terms: Option<Vec<NodeSelectorTerm>>) -> PersistentVolume {
    PersistentVolume {
        spec: Some(PersistentVolumeSpec {
            node_affinity: terms.map(|t| VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: t,
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn the_local_objects_carry_the_drivers_topology() {
    let (node, csi_node) = local(Some(&[(KEY, NODE), ("zone", "z1")])).objects("d");
    assert_eq!(node.metadata.name.as_deref(), Some(NODE));
    assert_eq!(
        node.metadata.labels,
        Some(Segment::from([
            (KEY.to_string(), NODE.to_string()),
            ("zone".to_string(), "z1".to_string()),
        ]))
    );
    assert_eq!(csi_node.metadata.name.as_deref(), Some(NODE));
    let entry = &csi_node.spec.drivers[0];
    assert_eq!((entry.name.as_str(), entry.node_id.as_str()), ("d", "id-1"));
    assert_eq!(
        entry.topology_keys,
        Some(vec![KEY.to_string(), "zone".to_string()])
    );
    // Without topology: no labels, no keys.
    let (node, csi_node) = local(None).objects("d");
    assert_eq!(node.metadata.labels, None);
    assert_eq!(csi_node.spec.drivers[0].topology_keys, None);
}

#[test]
fn a_pv_is_here_when_its_affinity_holds_for_the_drivers_topology() {
    let here = local(Some(&[(KEY, NODE)]));
    let cases: Vec<(&str, PersistentVolume, Result<bool, ()>)> = vec![
        ("no affinity", pv(None), Ok(true)),
        (
            "this node",
            pv(Some(vec![term(vec![req(KEY, "In", &[NODE])])])),
            Ok(true),
        ),
        (
            "another node",
            pv(Some(vec![term(vec![req(KEY, "In", &["n2"])])])),
            Ok(false),
        ),
        (
            "ORed terms, the second ours",
            pv(Some(vec![
                term(vec![req(KEY, "In", &["n2"])]),
                term(vec![req(KEY, "In", &[NODE])]),
            ])),
            Ok(true),
        ),
        (
            "ANDed requirements, one failing",
            pv(Some(vec![term(vec![
                req(KEY, "In", &[NODE]),
                req("zone", "Exists", &[]),
            ])])),
            Ok(false),
        ),
        (
            "NotIn a missing label",
            pv(Some(vec![term(vec![req("zone", "NotIn", &["z1"])])])),
            Ok(true),
        ),
        (
            "DoesNotExist",
            pv(Some(vec![term(vec![req("zone", "DoesNotExist", &[])])])),
            Ok(true),
        ),
        ("no terms", pv(Some(vec![])), Ok(false)),
        (
            "an empty term matches nothing",
            pv(Some(vec![NodeSelectorTerm::default()])),
            Ok(false),
        ),
        (
            "fields are not compared (upstream's Node has no name)",
            pv(Some(vec![NodeSelectorTerm {
                match_expressions: None,
                match_fields: Some(vec![req("metadata.name", "In", &["n2"])]),
            }])),
            Ok(true),
        ),
        (
            "a malformed term",
            pv(Some(vec![term(vec![req(KEY, "In", &[])])])),
            Err(()),
        ),
        (
            "a malformed term beside a matching one",
            pv(Some(vec![
                term(vec![req(KEY, "Gt", &["x"])]),
                term(vec![req(KEY, "In", &[NODE])]),
            ])),
            Ok(true),
        ),
    ];
    for (name, pv, want) in cases {
        assert_eq!(here.holds(&pv).map_err(drop), want, "{name}");
    }
    // A driver without topology holds every PV.
    let anywhere = local(None);
    let elsewhere = pv(Some(vec![term(vec![req(KEY, "In", &["n2"])])]));
    assert_eq!(anywhere.holds(&elsewhere), Ok(true));
}

#[test]
fn numeric_requirements() {
    let labels = Segment::from([("size".to_string(), "10".to_string())]);
    for (op, bound, want) in [
        ("Gt", "9", true),
        ("Gt", "10", false),
        ("Lt", "11", true),
        ("Lt", "10", false),
    ] {
        assert_eq!(
            label_matches(&req("size", op, &[bound]), &labels),
            want,
            "{op} {bound}"
        );
    }
    assert!(!label_matches(&req("other", "Gt", &["1"]), &labels));
    assert!(label_error(&req("size", "Lt", &["1", "2"])).is_some());
    assert!(label_error(&req("size", "Exists", &["1"])).is_some());
    assert!(label_error(&req("size", "Near", &["1"])).is_some());
    assert!(field_error(&req("metadata.name", "Exists", &[])).is_some());
}

#[test]
fn finalizers_are_per_node_and_qualified_names() {
    assert_eq!(
        claim_finalizer("worker-1"),
        "csiops.dev/volume-provisioning-worker-1"
    );
    let long = format!("node.{}.example.com", "x".repeat(200));
    let f = claim_finalizer(&long);
    let name = f.strip_prefix("csiops.dev/").expect("prefix");
    assert!(name.len() <= 63, "{f}");
    assert_ne!(f, claim_finalizer(&format!("{long}x")));
    assert_eq!(f, claim_finalizer(&long), "deterministic");
}

fn claim(selected: Option<&str>, finalizer: bool) -> PersistentVolumeClaim {
    let mut c = PersistentVolumeClaim::default();
    if let Some(n) = selected {
        c.metadata.annotations = Some(BTreeMap::from([(
            SELECTED_NODE_ANNOTATION.to_string(),
            n.to_string(),
        )]));
    }
    if finalizer {
        c.metadata.finalizers = Some(vec![claim_finalizer(NODE)]);
    }
    c
}

fn class(mode: Option<&str>) -> StorageClass {
    StorageClass {
        volume_binding_mode: mode.map(String::from),
        ..Default::default()
    }
}

#[test]
fn claim_decisions_on_a_node() {
    use ClaimAction::*;
    let finalizer = claim_finalizer(NODE);
    let view = |immediate_binding, pv| View {
        node: NODE,
        immediate_binding,
        finalizer: &finalizer,
        pv,
    };
    let immediate = class(Some("Immediate"));
    let wffc = class(Some("WaitForFirstConsumer"));
    let unset = class(None);
    let missing = || ClassMissing("fast".into());
    let alpha = {
        let mut c = claim(None, false);
        c.metadata.annotations = Some(BTreeMap::from([(
            "volume.alpha.kubernetes.io/selected-node".to_string(),
            NODE.to_string(),
        )]));
        c
    };
    /// name, central decision, claim, class, view, decision
    type Case<'a> = (
        &'a str,
        ClaimAction,
        PersistentVolumeClaim,
        Option<&'a StorageClass>,
        View<'a>,
        ClaimAction,
    );
    #[rustfmt::skip]
    let cases: Vec<Case<'_>> = vec![
        ("this node's claim", Provision, claim(Some(NODE), false), Some(&wffc), view(true, PvSeen::Absent), Provision),
        ("another node's claim", Provision, claim(Some("n2"), false), Some(&wffc), view(true, PvSeen::Absent), Nothing("another node is selected")),
        ("immediate, unselected: race", Provision, claim(None, false), Some(&immediate), view(true, PvSeen::Absent), BecomeOwner),
        ("immediate binding off", Provision, claim(None, false), Some(&immediate), view(false, PvSeen::Absent), Nothing("no node selected")),
        ("unset mode is not Immediate to upstream", Provision, claim(None, false), Some(&unset), view(true, PvSeen::Absent), Nothing("no node selected")),
        ("only the GA annotation counts", Provision, alpha, Some(&wffc), view(true, PvSeen::Absent), Nothing("no node selected")),
        ("nothing centrally", Nothing("claim already has a volume"), claim(Some(NODE), false), Some(&immediate), view(true, PvSeen::Elsewhere), Nothing("claim already has a volume")),
        ("class missing, this node's", missing(), claim(Some(NODE), false), None, view(true, PvSeen::Absent), missing()),
        ("class missing, another's", missing(), claim(Some("n2"), false), None, view(true, PvSeen::Absent), Nothing("another node is selected")),
        ("class missing, unselected", missing(), claim(None, false), None, view(true, PvSeen::Absent), RetryQuietly("the StorageClass is missing (no node selected yet)")),
        ("our finalizer, still ours", Provision, claim(Some(NODE), true), Some(&wffc), view(true, PvSeen::Absent), Provision),
        ("our finalizer, moved away", Provision, claim(Some("n2"), true), Some(&wffc), view(true, PvSeen::Absent), CleanUp),
        ("our finalizer, handed back", Provision, claim(None, true), Some(&immediate), view(true, PvSeen::Absent), CleanUp),
        ("our finalizer, class gone, moved away", missing(), claim(Some("n2"), true), None, view(true, PvSeen::Absent), CleanUp),
        ("our PV made", ReleaseClaim, claim(Some(NODE), true), Some(&wffc), view(true, PvSeen::Here), ReleaseClaim),
        ("a PV made elsewhere", ReleaseClaim, claim(Some("n2"), true), Some(&wffc), view(true, PvSeen::Elsewhere), CleanUp),
        ("bound, PV not cached", ReleaseClaim, claim(Some(NODE), true), Some(&wffc), view(true, PvSeen::Absent), CleanUp),
        ("deleted with our finalizer", CleanUp, claim(Some("n2"), true), Some(&wffc), view(true, PvSeen::Absent), CleanUp),
    ];
    for (name, central, c, class, view, want) in cases {
        assert_eq!(claim_action(central, &c, class, view), want, "{name}");
    }
}

#[test]
fn only_the_node_holding_the_volume_deletes_it() {
    use VolumeAction::*;
    let cases = [
        (Delete, true, Delete),
        (Delete, false, Nothing("the volume is on another node")),
        (RemoveFinalizer, false, RemoveFinalizer),
        (RemoveFinalizer, true, RemoveFinalizer),
        (Nothing("x"), true, Nothing("x")),
    ];
    for (central, here, want) in cases {
        assert_eq!(
            volume_action(central.clone(), here),
            want,
            "{central:?} {here}"
        );
    }
}

#[test]
fn a_node_watches_attachments_only_for_a_driver_that_publishes() {
    let publishes = DriverCapabilities {
        publish_unpublish: true,
        ..Default::default()
    };
    let local_only = DriverCapabilities::default();
    assert!(watches_attachments(false, local_only));
    assert!(watches_attachments(false, publishes));
    assert!(watches_attachments(true, publishes));
    assert!(!watches_attachments(true, local_only));
}

#[test]
fn owner_delays_grow_from_the_base_to_the_max_less_the_jitter() {
    let s = Duration::from_secs;
    let (base, max) = (s(20), s(60));
    #[rustfmt::skip]
    let cases = [
        // attempts, jitter, delay
        (0, 0.0, s(20)), (0, 0.5, s(10)), (0, 0.75, s(5)),
        (1, 0.0, s(40)), (1, 0.25, s(35)),
        (2, 0.0, s(60)), (2, 0.5, s(50)),
        (9, 0.0, s(60)), (40, 0.5, s(50)),
    ];
    for (attempts, jitter, want) in cases {
        assert_eq!(
            owner_delay(attempts, base, max, jitter),
            want,
            "{attempts} {jitter}"
        );
    }
    // A jitter past the delay (max below base) waits not at all.
    assert_eq!(owner_delay(0, s(20), s(5), 0.5), Duration::ZERO);
    assert_eq!(owner_delay(3, Duration::ZERO, s(60), 0.5), Duration::ZERO);
}

#[test]
fn jitter_is_a_fraction() {
    let draws: Vec<f64> = (0..64).map(|_| jitter()).collect();
    assert!(draws.iter().all(|j| (0.0..1.0).contains(j)), "{draws:?}");
    assert!(draws.windows(2).any(|w| w[0] != w[1]), "{draws:?}");
}

#[tokio::test(start_paused = true)]
async fn a_race_waits_then_tries_then_waits_longer() {
    let s = Duration::from_secs;
    let races = Races::new(s(20), s(60));
    let t0 = Instant::now();
    assert_eq!(races.turn("u", t0), Turn::Start);
    assert_eq!(races.wait_with("u", t0, 0.5), s(10));
    assert_eq!(races.turn("u", t0 + s(4)), Turn::Wait(s(6)));
    assert_eq!(races.turn("u", t0 + s(10)), Turn::Now);
    // The wait is over: the next look starts another.
    assert_eq!(races.turn("u", t0 + s(11)), Turn::Start);
    // A conflict: the second wait is longer.
    assert_eq!(races.wait_with("u", t0 + s(11), 0.5), s(30));
    assert_eq!(races.len(), 1);
    races.forget("u");
    assert!(races.is_empty());
    assert_eq!(races.turn("u", t0), Turn::Start);
    assert_eq!(races.wait_with("u", t0, 0.0), s(20), "from the base again");
}
