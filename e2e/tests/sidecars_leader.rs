//! The provisioner under `--leader-election` on a real control plane, with
//! `csi-test-driver` as the truth about which calls arrived: once its Lease
//! is taken away, the old leader sends no CreateVolume and no DeleteVolume.

use std::collections::BTreeSet;
use std::time::Duration;

use csiops_e2e::provisioning::{ProvisionerBed, DRIVER};
use csiops_e2e::{pid_alive, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const NS: &str = "default";
/// The provisioner's Lease (`lease_name("", DRIVER)`).
const LEASE: &str = "test-csi-csiops-dev";
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
/// How long the driver holds each CreateVolume's answer after the volume is
/// made: the one worker is inside that call when the Lease goes.
const ANSWER_DELAY: &str = "2s";
/// The old leader's renewal period: without a watch of its Lease it would
/// notice the loss only at its next renewal, up to this long after.
const RETRY_PERIOD: &str = "8s";

fn claim(name: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some("fast".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".to_string(), Quantity("1Mi".into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Lease's holder and renew time.
async fn lease_state(leases: &Api<Lease>) -> Option<(String, Option<MicroTime>)> {
    let spec = leases.get_opt(LEASE).await.ok()??.spec?;
    Some((spec.holder_identity.unwrap_or_default(), spec.renew_time))
}

/// A CreateVolume or DeleteVolume the driver logged: the method and when
/// the call arrived (its log time less its duration).
#[derive(Debug)]
struct Call {
    method: String,
    started: Timestamp,
    line: String,
}

/// The CreateVolume and DeleteVolume calls in csi-test-driver's log (one
/// `call` line each, written when the call ends, with `duration_ms`).
fn volume_calls(log: &str) -> Vec<Call> {
    log.lines()
        .filter_map(|line| {
            let method = ["CreateVolume", "DeleteVolume"]
                .into_iter()
                .find(|m| line.contains(&format!(" call method=\"{m}\"")))?;
            let logged: Timestamp = line.split_whitespace().next()?.parse().ok()?;
            let ms: i64 = line
                .split("duration_ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            let started = logged
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_millis(ms))
                .ok()?;
            Some(Call {
                method: method.to_string(),
                started,
                line: line.chars().take(200).collect(),
            })
        })
        .collect()
}

/// What the phases work on: the provisioner and its driver, and the claims
/// and Leases of the namespace.
struct Bed {
    prov: ProvisionerBed,
    claims: Api<PersistentVolumeClaim>,
    leases: Api<Lease>,
}

/// What was true when the Lease was taken: the leader then, the time, and
/// the driver's volumes and deletions at that moment.
struct Takeover {
    leader: String,
    taken_at: Timestamp,
    volumes_then: BTreeSet<String>,
    deleted_then: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioner_that_lost_its_lease_sends_no_create_or_delete_volume() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster");
    let prov = ProvisionerBed::start(
        &cluster,
        &[&format!("--delay-after=CreateVolume={ANSWER_DELAY}")],
        &[
            "--leader-election",
            &format!("--leader-election-namespace={NS}"),
            "--leader-election-lease-duration=30s",
            "--leader-election-renew-deadline=20s",
            &format!("--leader-election-retry-period={RETRY_PERIOD}"),
            // One CSI call at a time: while it is in flight nothing else
            // is sent, so the moment of the takeover is chosen exactly.
            "--worker-threads=1",
        ],
    )
    .await
    .expect("provisioner bed");
    let client = cluster.client().expect("client");
    let mut bed = Bed {
        prov,
        claims: Api::namespaced(client.clone(), NS),
        leases: Api::namespaced(client.clone(), NS),
    };
    the_class_exists(&client).await;

    bound_volumes_exist_and_creates_are_queued(&bed).await;
    let takeover = the_lease_is_taken_while_a_create_is_in_flight(&bed).await;
    the_old_leader_says_so_and_exits(&bed, &takeover).await;
    no_volume_call_arrived_after_the_takeover(&bed, &takeover).await;
    claims_stay_pending_under_the_thief(&bed).await;
    bed.prov.stop_sidecar();
    cluster.stop().await.expect("stop");
}

/// The StorageClass `fast` of the test driver exists.
async fn the_class_exists(client: &kube::Client) {
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &StorageClass {
                metadata: ObjectMeta {
                    name: Some("fast".into()),
                    ..Default::default()
                },
                provisioner: DRIVER.into(),
                reclaim_policy: Some("Delete".into()),
                volume_binding_mode: Some("Immediate".into()),
                ..Default::default()
            },
        )
        .await
        .expect("class");
}

/// Three volumes are made, and 20 slow creates keep the leader busy.
async fn bound_volumes_exist_and_creates_are_queued(bed: &Bed) {
    let Bed { prov, claims, .. } = bed;
    // Volumes to delete later: bound claims whose deletion queues a
    // DeleteVolume behind the creates.
    for i in 0..3 {
        claims
            .create(&PostParams::default(), &claim(&format!("old-{i}")))
            .await
            .expect("claim");
    }
    wait_for(DEADLINE, Duration::from_millis(200), || async {
        (prov.driver_volumes().ok()?.len() == 3).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "first volumes not made; log at {}",
            prov.sidecar_log_path().display()
        )
    });
    // Work that keeps the leader busy: 20 creates, 2s each.
    for i in 0..20 {
        claims
            .create(&PostParams::default(), &claim(&format!("c{i:02}")))
            .await
            .expect("claim");
    }
}

/// Right after a renewal and a CreateVolume's start, with deletions queued,
/// a thief takes the Lease; no DeleteVolume came before.
async fn the_lease_is_taken_while_a_create_is_in_flight(bed: &Bed) -> Takeover {
    let Bed {
        prov,
        claims,
        leases,
    } = bed;
    // Take the Lease right after a renewal (so a leader that only polls
    // would act on for most of a retry period) and right after a
    // CreateVolume started (so no call is about to be sent: the one worker
    // waits for that answer for ANSWER_DELAY).
    let (leader, renewed) = wait_for(DEADLINE, POLL, || async {
        let (h, r) = lease_state(leases).await?;
        (!h.is_empty()).then_some((h, r))
    })
    .await
    .expect("a leader");
    wait_for(DEADLINE, POLL, || async {
        let (_, r) = lease_state(leases).await?;
        (r != renewed).then_some(())
    })
    .await
    .expect("a renewal");
    let made = prov.driver_volumes().expect("volumes").len();
    wait_for(DEADLINE, Duration::from_millis(5), || async {
        (prov.driver_volumes().ok()?.len() > made).then_some(())
    })
    .await
    .expect("a CreateVolume in flight");
    // Deletions that wait for the worker behind it.
    for i in 0..3 {
        claims
            .delete(&format!("old-{i}"), &DeleteParams::default())
            .await
            .expect("delete");
    }
    let taken_at = Timestamp::now();
    let patch = Lease {
        spec: Some(LeaseSpec {
            holder_identity: Some("thief".into()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(MicroTime(taken_at)),
            ..Default::default()
        }),
        ..Default::default()
    };
    leases
        .patch(LEASE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the Lease taken");
    let state = prov.driver.state().expect("state");
    let volumes_then: BTreeSet<String> = state.volumes.keys().cloned().collect();
    let deleted_then = state.deleted.len();
    assert_eq!(deleted_then, 0, "a DeleteVolume before the takeover");
    Takeover {
        leader,
        taken_at,
        volumes_then,
        deleted_then,
    }
}

/// The old leader notices at once, logs that it lost the Lease to the
/// thief, and exits (another may act).
async fn the_old_leader_says_so_and_exits(bed: &Bed, takeover: &Takeover) {
    let prov = &bed.prov;
    let leader = &takeover.leader;
    // The old leader notices at once and stops (exits: another may act).
    let pid = prov.sidecar_pid().expect("provisioner running");
    wait_for(DEADLINE, POLL, || async { (!pid_alive(pid)).then_some(()) })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the old leader still runs; log at {}",
                prov.sidecar_log_path().display()
            )
        });
    let log = prov.sidecar_log();
    assert!(
        log.contains("leadership lost") && log.contains("thief"),
        "{leader} did not say it lost the Lease to thief; log at {}",
        prov.sidecar_log_path().display()
    );
}

/// After the answer in flight, the driver made and deleted nothing more,
/// and its log shows no call that arrived after the takeover.
async fn no_volume_call_arrived_after_the_takeover(bed: &Bed, takeover: &Takeover) {
    let prov = &bed.prov;
    let taken_at = takeover.taken_at;
    // The answer in flight at the takeover comes (and is logged) after it.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let state = prov.driver.state().expect("state");
    let new: Vec<&String> = state
        .volumes
        .keys()
        .filter(|v| !takeover.volumes_then.contains(*v))
        .collect();
    assert!(
        new.is_empty(),
        "volumes created after the Lease was taken: {new:?}"
    );
    assert_eq!(
        state.deleted.len(),
        takeover.deleted_then,
        "volumes deleted after the Lease was taken"
    );
    let calls = volume_calls(&prov.driver.log());
    assert!(
        calls.iter().any(|c| c.method == "CreateVolume"),
        "no CreateVolume in the driver's log: is its format still parsed? {}",
        prov.driver.log_path().display()
    );
    let late: Vec<&str> = calls
        .iter()
        .filter(|c| c.started > taken_at)
        .map(|c| c.line.as_str())
        .collect();
    assert!(
        late.is_empty(),
        "calls that arrived after the Lease was taken at {taken_at}: {late:#?}"
    );
}

/// Nobody provisions now: the thief holds the Lease, so claims stay Pending.
async fn claims_stay_pending_under_the_thief(bed: &Bed) {
    // Nobody provisions now: the thief holds the Lease.
    let pending = bed
        .claims
        .list(&ListParams::default())
        .await
        .expect("claims")
        .items
        .iter()
        .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
        .count();
    assert!(
        pending > 0,
        "every claim was provisioned: the takeover came too late"
    );
}
