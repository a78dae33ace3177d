use super::*;
use serde_json::json;

const DRIVER: &str = "hostpath.csi.k8s.io";

fn desired() -> Desired {
    Desired {
        controller: true,
        registration_required: true,
        batch: 1,
    }
}

fn node(stage: Option<AdoptionStage>, old_pod: bool, new_ready: bool) -> NodeObs {
    NodeObs {
        stage,
        reachable: true,
        old_pod,
        new_pod_ready: new_ready,
        registered: new_ready,
    }
}

/// A running old deployment on nodes a, b and c, before anything happened.
fn fresh() -> Observed {
    Observed {
        csi_driver: Some(CsiDriverObs {
            ours: false,
            differences: vec![],
        }),
        old_node: Some(OldNodeObs {
            confined: false,
            deleting: false,
        }),
        old_controller: Some(OldControllerObs {
            deleting: false,
            unshared: None,
        }),
        new_controller_ready: 0,
        nodes: ["a", "b", "c"]
            .into_iter()
            .map(|n| (n.to_string(), node(None, true, false)))
            .collect(),
        leftovers: 2,
    }
}

fn label(n: &str, s: AdoptionStage) -> Action {
    Action::LabelNode(n.to_string(), s)
}

#[test]
fn a_different_attach_required_is_refused_before_anything_is_written() {
    let differences = immutable_differences(
        &json!({"attachRequired": true, "podInfoOnMount": false}),
        &json!({"attachRequired": false, "volumeLifecycleModes": ["Persistent"]}),
    );
    assert_eq!(
        differences,
        vec!["attachRequired: true running, false asked"]
    );
    let mut o = fresh();
    o.csi_driver = Some(CsiDriverObs {
        ours: false,
        differences,
    });
    let p = plan(&desired(), &o);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    let why = p.refused.expect("refused");
    assert!(
        why.contains("attachRequired") && why.contains("cannot change"),
        "{why}"
    );
}

#[test]
fn defaults_count_as_set_when_comparing_immutable_fields() {
    // attachRequired defaults to true, modes to Persistent.
    assert!(immutable_differences(
        &json!({}),
        &json!({"attachRequired": true, "volumeLifecycleModes": ["Persistent"]})
    )
    .is_empty());
    let d = immutable_differences(&json!({"fsGroupPolicy": "File"}), &json!({}));
    assert_eq!(d.len(), 1, "{d:?}");
}

#[test]
fn the_first_pass_keeps_the_csidriver_and_parks_every_old_node_before_the_new_daemonset_exists() {
    let p = plan(&desired(), &fresh());
    assert_eq!(p.refused, None);
    let pos = |a: &Action| p.actions.iter().position(|x| x == a).expect("action");
    assert_eq!(p.actions[0], Action::KeepCsiDriver);
    for n in ["a", "b", "c"] {
        assert!(pos(&label(n, AdoptionStage::Waiting)) < pos(&Action::ConfineOldNode));
    }
    assert!(pos(&Action::ConfineOldNode) < pos(&Action::ApplyNode));
    // One node at a time, and only after the new DaemonSet is applied.
    let leaving: Vec<_> = p
        .actions
        .iter()
        .filter(|a| matches!(a, Action::LabelNode(_, AdoptionStage::Leaving)))
        .collect();
    assert_eq!(leaving, vec![&label("a", AdoptionStage::Leaving)]);
    assert!(pos(&Action::ApplyNode) < pos(&label("a", AdoptionStage::Leaving)));
    // The controller is not touched while nodes move.
    assert!(!p.actions.contains(&Action::ApplyController));
    assert!(!p.actions.contains(&Action::DeleteOldController));
    assert_eq!(p.phase, Phase::Nodes);
    assert!(p
        .waiting_for
        .is_some_and(|w| w.contains("a: the old node pod to exit")));
}

fn confined(mut o: Observed) -> Observed {
    o.csi_driver = Some(CsiDriverObs {
        ours: true,
        differences: vec![],
    });
    o.old_node = Some(OldNodeObs {
        confined: true,
        deleting: false,
    });
    o
}

#[test]
fn a_node_turns_done_only_once_its_old_pod_is_gone() {
    let mut o = confined(fresh());
    o.nodes
        .insert("a".into(), node(Some(AdoptionStage::Leaving), true, false));
    o.nodes
        .insert("b".into(), node(Some(AdoptionStage::Waiting), true, false));
    o.nodes
        .insert("c".into(), node(Some(AdoptionStage::Waiting), true, false));
    let p = plan(&desired(), &o);
    assert!(!p.actions.contains(&label("a", AdoptionStage::Done)));
    assert!(
        !p.actions.contains(&label("b", AdoptionStage::Leaving)),
        "batch of one"
    );
    assert!(!p.actions.contains(&Action::KeepCsiDriver));
    assert!(!p.actions.contains(&Action::ConfineOldNode));

    o.nodes.get_mut("a").expect("a").old_pod = false;
    let p = plan(&desired(), &o);
    assert!(p.actions.contains(&label("a", AdoptionStage::Done)));
    assert!(
        !p.actions.contains(&label("b", AdoptionStage::Leaving)),
        "the next node waits for a's new pod"
    );
}

#[test]
fn the_next_node_moves_once_the_new_pod_is_ready_and_registered() {
    let mut o = confined(fresh());
    o.nodes
        .insert("a".into(), node(Some(AdoptionStage::Done), false, false));
    o.nodes
        .insert("b".into(), node(Some(AdoptionStage::Waiting), true, false));
    o.nodes
        .insert("c".into(), node(Some(AdoptionStage::Waiting), true, false));
    let p = plan(&desired(), &o);
    assert!(!p.actions.contains(&label("b", AdoptionStage::Leaving)));

    let a = o.nodes.get_mut("a").expect("a");
    a.new_pod_ready = true;
    let p = plan(&desired(), &o);
    assert!(
        !p.actions.contains(&label("b", AdoptionStage::Leaving)),
        "Ready but not registered"
    );

    o.nodes.get_mut("a").expect("a").registered = true;
    let p = plan(&desired(), &o);
    assert!(p.actions.contains(&label("b", AdoptionStage::Leaving)));
    assert!(!p.actions.contains(&label("c", AdoptionStage::Leaving)));
    assert_eq!((p.nodes_done, p.nodes_total), (1, 3));
}

#[test]
fn a_larger_batch_moves_several_nodes_and_lost_nodes_are_never_waited_for() {
    let mut o = confined(fresh());
    for n in ["a", "b", "c"] {
        o.nodes
            .insert(n.into(), node(Some(AdoptionStage::Waiting), true, false));
    }
    o.nodes.get_mut("a").expect("a").reachable = false;
    let d = Desired {
        batch: 2,
        ..desired()
    };
    let p = plan(&d, &o);
    assert!(
        p.actions.contains(&label("a", AdoptionStage::Done)),
        "lost: straight to done"
    );
    assert!(p.actions.contains(&label("b", AdoptionStage::Leaving)));
    assert!(p.actions.contains(&label("c", AdoptionStage::Leaving)));
}

#[test]
fn the_old_controller_goes_only_after_every_node_and_a_ready_new_replica() {
    let mut o = confined(fresh());
    for n in ["a", "b", "c"] {
        o.nodes
            .insert(n.into(), node(Some(AdoptionStage::Done), false, true));
    }
    let p = plan(&desired(), &o);
    assert_eq!(p.phase, Phase::Controller);
    assert!(p.actions.contains(&Action::ApplyController));
    assert!(!p.actions.contains(&Action::DeleteOldController));
    assert_eq!((p.nodes_done, p.nodes_total), (3, 3));

    o.new_controller_ready = 1;
    let p = plan(&desired(), &o);
    assert!(p.actions.contains(&Action::DeleteOldController));
    assert!(
        !p.actions.contains(&Action::DeleteOldNode),
        "cleanup waits for the old controller"
    );

    o.old_controller = Some(OldControllerObs {
        deleting: true,
        unshared: None,
    });
    let p = plan(&desired(), &o);
    assert!(
        !p.actions.contains(&Action::DeleteOldController),
        "deleted once"
    );
    assert!(p.waiting_for.is_some_and(|w| w.contains("old controller")));
}

#[test]
fn cleanup_removes_the_old_daemonset_the_named_objects_and_the_labels_then_is_done() {
    let mut o = confined(fresh());
    o.old_controller = None;
    o.new_controller_ready = 1;
    for n in ["a", "b"] {
        o.nodes
            .insert(n.into(), node(Some(AdoptionStage::Done), false, true));
    }
    o.nodes.remove("c");
    let p = plan(&desired(), &o);
    assert_eq!(p.phase, Phase::Cleanup);
    for a in [
        Action::DeleteOldNode,
        Action::RemoveLeftovers,
        Action::UnlabelNode("a".into()),
        Action::UnlabelNode("b".into()),
    ] {
        assert!(p.actions.contains(&a), "{a:?} in {:?}", p.actions);
    }

    let done = Observed {
        csi_driver: o.csi_driver.clone(),
        new_controller_ready: 1,
        ..Observed::default()
    };
    let p = plan(&desired(), &done);
    assert_eq!((p.phase, p.waiting_for), (Phase::Done, None));
    assert!(!p.actions.contains(&Action::DeleteOldNode));
}

#[test]
fn a_node_local_driver_has_no_controller_to_take_over() {
    let mut o = confined(fresh());
    o.old_controller = None;
    for n in ["a", "b", "c"] {
        o.nodes
            .insert(n.into(), node(Some(AdoptionStage::Done), false, true));
    }
    let d = Desired {
        controller: false,
        ..desired()
    };
    let p = plan(&d, &o);
    assert!(!p.actions.contains(&Action::ApplyController));
    assert_eq!(p.phase, Phase::Cleanup);
}

#[test]
fn confining_adds_the_requirement_to_each_term_and_switches_to_on_delete() {
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]}
        ]}}, "podAntiAffinity": {"x": 1}});
    let patch = confine_patch(DRIVER, &affinity);
    assert_eq!(patch["spec"]["updateStrategy"]["type"], "OnDelete");
    let terms = patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_array()
        .expect("terms")
        .clone();
    assert_eq!(terms.len(), 2);
    assert_eq!(
        terms[0]["matchExpressions"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(terms[1]["matchFields"][0]["values"][0], "x");
    assert_eq!(
        terms[1]["matchExpressions"][0]["key"],
        "adopt.csiops.dev/hostpath.csi.k8s.io"
    );
    assert_eq!(
        patch["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["x"],
        1
    );

    let spec = json!({"updateStrategy": {"type": "OnDelete"},
        "template": {"spec": {"affinity": patch["spec"]["template"]["spec"]["affinity"].clone()}}});
    assert!(is_confined(DRIVER, &spec));
    // Patched twice: still one requirement per term.
    let again = confine_patch(DRIVER, &spec["template"]["spec"]["affinity"]);
    assert_eq!(again, patch);

    assert!(!is_confined(
        DRIVER,
        &json!({"updateStrategy": {"type": "RollingUpdate"}})
    ));
    let plain = confine_patch(DRIVER, &serde_json::Value::Null);
    let terms = &plain["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    assert_eq!(terms.as_array().map(Vec::len), Some(1));
}

#[test]
fn builtin_roles_are_recognised() {
    assert!(is_builtin("system:node"));
    assert!(!is_builtin("csi-provisioner-runner"));
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn sidecars_share_the_leases_only_with_leader_election_in_the_same_namespace() {
    let ns = "storage";
    let plugin = (
        "plugin".to_string(),
        args(&["--endpoint=unix:///csi/csi.sock"]),
    );
    let registrar = (
        "node-driver-registrar".to_string(),
        args(&[
            "--csi-address=/csi/csi.sock",
            "--kubelet-registration-path=/x",
        ]),
    );
    let elected = (
        "csi-provisioner".to_string(),
        args(&["-csi-address=/csi/csi.sock", "-leader-election"]),
    );
    assert_eq!(
        lease_sharing(&[plugin.clone(), registrar, elected.clone()], ns),
        None
    );
    let same_ns = (
        "csi-attacher".to_string(),
        args(&[
            "--csi-address=/csi/csi.sock",
            "--leader-election=true",
            "--leader-election-namespace=storage",
        ]),
    );
    assert_eq!(lease_sharing(&[elected.clone(), same_ns], ns), None);

    let lone = (
        "csi-provisioner".to_string(),
        args(&["--csi-address=/csi/csi.sock"]),
    );
    let why = lease_sharing(&[plugin, lone], ns).expect("unshared");
    assert!(
        why.contains("csi-provisioner") && why.contains("--leader-election"),
        "{why}"
    );
    let elsewhere = (
        "csi-attacher".to_string(),
        args(&[
            "--csi-address=/csi/csi.sock",
            "--leader-election",
            "--leader-election-namespace=kube-system",
        ]),
    );
    let why = lease_sharing(&[elected, elsewhere], ns).expect("unshared");
    assert!(why.contains("kube-system"), "{why}");
}

#[test]
fn an_old_controller_that_shares_no_lease_is_stopped_before_the_new_one_starts() {
    let mut o = confined(fresh());
    for n in ["a", "b", "c"] {
        o.nodes
            .insert(n.into(), node(Some(AdoptionStage::Done), false, true));
    }
    o.old_controller = Some(OldControllerObs {
        deleting: false,
        unshared: Some("container csi-provisioner runs without --leader-election".into()),
    });
    let p = plan(&desired(), &o);
    assert!(p.actions.contains(&Action::DeleteOldController));
    assert!(
        !p.actions.contains(&Action::ApplyController),
        "{:?}",
        p.actions
    );

    o.old_controller = None;
    let p = plan(&desired(), &o);
    assert!(p.actions.contains(&Action::ApplyController));
}
