use serde_json::json;

use super::*;

fn controller_pod(name: &str, revision: &str, ready: bool) -> PodView {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {COMPONENT: "controller", REVISION_LABEL: revision}},
        "spec": {"nodeName": "n1", "containers": []},
        "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
    }))
    .expect("pod fixture")
}

#[test]
fn controller_observation_comes_from_the_live_statefulset() {
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "x-controller", "generation": 4, "annotations": {"h": "abc"}},
        "spec": {"replicas": 2, "selector": {}, "serviceName": "x", "template": {},
                 "updateStrategy": {"rollingUpdate": {"partition": 1}}},
        "status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "observedGeneration": 3,
                   "updateRevision": "x-controller-new"}
    }))
    .expect("sts fixture");
    let c = controller_obs(&sts, "h");
    assert_eq!(c.hash.as_deref(), Some("abc"));
    assert_eq!(
        (
            c.generation,
            c.observed_generation,
            c.spec_replicas,
            c.partition
        ),
        (4, 3, 2, 1)
    );

    // The surge replica's progress: Ready pods at the update revision.
    let pods = [
        controller_pod("x-controller-0", "x-controller-old", true),
        controller_pod("x-controller-1", "x-controller-new", true),
        controller_pod("x-controller-2", "x-controller-new", false),
    ];
    assert_eq!(statefulset_updated_ready(&sts, &pods), 1);
}

#[test]
fn a_deleting_or_node_pod_is_not_surge_progress() {
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "x-controller"},
        "spec": {"selector": {}, "serviceName": "x", "template": {}},
        "status": {"replicas": 1, "updateRevision": "new"}
    }))
    .expect("sts fixture");
    let mut deleting = controller_pod("x-controller-0", "new", true);
    deleting.terminating = true;
    let mut node_pod = controller_pod("x-node-abc", "new", true);
    node_pod.set_label(COMPONENT, "node");
    assert_eq!(statefulset_updated_ready(&sts, &[deleting, node_pod]), 0);
    // Without an update revision nothing is "updated".
    let mut bare = sts.clone();
    bare.status = None;
    assert_eq!(
        statefulset_updated_ready(&bare, &[controller_pod("x-controller-1", "new", true)]),
        0
    );
}

#[test]
fn node_and_deployment_observations_come_from_the_live_objects() {
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "x-node", "generation": 7, "annotations": {"h": "n1"}},
        "spec": {"selector": {}, "template": {}},
        "status": {"currentNumberScheduled": 1, "desiredNumberScheduled": 1, "numberMisscheduled": 0,
                   "numberReady": 1, "observedGeneration": 6}
    }))
    .expect("ds fixture");
    let n = node_obs(&ds, "h");
    assert_eq!(
        (n.hash.as_deref(), n.generation, n.observed_generation),
        (Some("n1"), 7, 6)
    );

    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "x-controller", "generation": 2},
        "spec": {"replicas": 3, "selector": {}, "template": {}},
        "status": {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 1, "observedGeneration": 2}
    }))
    .expect("deployment fixture");
    let c = deployment_obs(&d, "h");
    assert_eq!(
        (
            c.hash,
            c.spec_replicas,
            c.replicas,
            c.ready,
            c.updated,
            c.partition
        ),
        (None, 3, 3, 2, 1, 0)
    );
}
