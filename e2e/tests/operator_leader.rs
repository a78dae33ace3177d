//! Two operator replicas on a real control plane: one leads on the Lease, the
//! other waits ready; SIGTERM on the leader hands over at once (the Lease is
//! released) and the new leader carries on reconciling.

use std::time::Duration;

use csiops_e2e::{
    operator_bin, sigterm_and_wait, testkit, wait_for, Cluster, ClusterOptions, OperatorProcess,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

const NS: &str = "csi-hostpath";
const DEADLINE: Duration = Duration::from_secs(90);
/// How soon after the leader's exit the standby must hold the Lease.
const TAKEOVER: Duration = Duration::from_secs(3);

async fn http(op: &OperatorProcess, path: &'static str) -> Option<(u16, String)> {
    testkit::http_get_async(op.http_endpoint(), path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_when_the_leader_stops() {
    let cluster = Cluster::start(ClusterOptions::kwok(3))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    testkit::install_crd(&cluster).await.expect("CRD installs");
    let bin = operator_bin().expect("operator built");
    let replica = |id: &str| {
        let args = [
            "--leader-election=true".to_string(),
            "--leader-election-namespace=default".to_string(),
            format!("--identity={id}"),
        ];
        cluster
            .run_operator_with(&bin, &args)
            .expect("operator starts")
    };
    let a = replica("replica-a");
    let b = replica("replica-b");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let holder = || async {
        leases
            .get_opt("csiops-operator")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec.and_then(|s| s.holder_identity))
            .filter(|h| !h.is_empty())
    };
    let first = wait_for(DEADLINE, Duration::from_millis(200), holder)
        .await
        .expect("a leader is elected");
    let (leader, standby, standby_id) = if first == "replica-a" {
        (a, b, "replica-b")
    } else {
        (b, a, "replica-a")
    };

    // Both are healthy and ready; only the leader says it leads.
    wait_for(DEADLINE, Duration::from_millis(200), || async {
        let l = http(&leader, "/readyz").await?;
        let s = http(&standby, "/readyz").await?;
        (l.0 == 200 && s.0 == 200).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "both replicas should be ready\nleader:\n{}\nstandby:\n{}",
            leader.log_tail(60),
            standby.log_tail(15)
        )
    });
    assert!(http(&leader, "/metrics")
        .await
        .expect("metrics")
        .1
        .contains("csiops_leader 1"));
    assert!(http(&standby, "/metrics")
        .await
        .expect("metrics")
        .1
        .contains("csiops_leader 0"));

    let _nodes =
        testkit::node_side(&cluster, NS, "hostpath", "hostpath.csi.k8s.io").expect("node side");
    let example = testkit::central_fixture_path();
    cluster
        .kubectl_ok(["apply", "-f", &example.to_string_lossy()])
        .await
        .expect("central fixture applies");
    testkit::wait_running(&cluster, NS, "hostpath", "v1.17.0", 3, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\nleader log:\n{}", leader.log_tail(30)));

    // SIGTERM the leader: the Lease is released and the standby takes it.
    assert!(
        sigterm_and_wait(leader.pid(), Duration::from_secs(15)).await,
        "leader did not exit on SIGTERM:\n{}",
        leader.log_tail(20)
    );
    // At once: the leader released the Lease before it exited, and the
    // standby watches the Lease, so it takes a released one at once. A Lease
    // left to expire would take its duration (15s) from the last renewal the
    // standby saw; 3s tells the two apart.
    let next = wait_for(TAKEOVER, Duration::from_millis(50), || async {
        holder().await.filter(|h| h == standby_id)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "standby did not take over within {TAKEOVER:?} of the leader's exit:\n{}",
            standby.log_tail(30)
        )
    });
    assert_eq!(next, standby_id);

    // The new leader reconciles: an upgrade goes through.
    cluster
        .kubectl_ok([
            "-n",
            NS,
            "patch",
            "csidd",
            "hostpath",
            "--type=merge",
            "-p",
            r#"{"spec":{"version":"v1.18.0"}}"#,
        ])
        .await
        .expect("edit applies");
    testkit::wait_running(&cluster, NS, "hostpath", "v1.18.0", 3, DEADLINE)
        .await
        .unwrap_or_else(|e| panic!("{e}\nnew leader log:\n{}", standby.log_tail(30)));
    drop(standby);
    drop(leader);
    cluster.stop().await.expect("cluster stops");
}
