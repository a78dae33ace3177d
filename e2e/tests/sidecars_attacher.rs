//! `csiops-sidecar attacher` on a real control plane with `csi-test-driver`
//! as the CSI driver process. The test creates PVs and VolumeAttachments the
//! way kube-controller-manager's attach/detach controller would (it cannot:
//! kwok nodes run no pods that use these volumes), and the CSINode the
//! registrar would write, then checks the API objects against the driver's
//! persisted state.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csiops_e2e::attach::{self, attached, has_finalizer};
use csiops_e2e::process::ManagedProcess;
use csiops_e2e::testdriver::{load_state, TestDriverProcess};
use csiops_e2e::{free_port, sidecar_bin, testkit, wait_for, Cluster, ClusterOptions};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Secret, SecretReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const TEST_DRIVER: &str = env!("CARGO_BIN_EXE_csi-test-driver");
const NODE: &str = "kwok-node-0";
/// The driver's node ID differs from the node name, so a publish to the
/// right node proves the CSINode lookup.
const NODE_ID: &str = "test-node-id-0";
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
const SECRET_VALUE: &str = "s3cr3t-do-not-log";

struct Setup {
    driver: TestDriverProcess,
    driver_name: String,
    finalizer: String,
    socket: PathBuf,
}

async fn start_driver(cluster: &Cluster, name: &str, args: &[&str]) -> Setup {
    let dir = cluster.work_dir().join(name);
    std::fs::create_dir_all(&dir).expect("driver dir");
    let socket = dir.join("csi.sock");
    let mut all = vec![
        format!("--drivername={name}"),
        format!("--nodeid={NODE_ID}"),
    ];
    all.extend(args.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let driver = TestDriverProcess::start(
        Path::new(TEST_DRIVER),
        &socket,
        &dir.join("state"),
        &refs,
        &cluster.log_dir().join(format!("{name}.log")),
    )
    .await
    .expect("csi-test-driver starts");
    attach::register_driver(&cluster.client().expect("client"), NODE, name, NODE_ID, &[])
        .await
        .expect("CSINode entry");
    Setup {
        driver,
        driver_name: name.to_string(),
        finalizer: attach::finalizer(name),
        socket,
    }
}

fn start_attacher(
    cluster: &Cluster,
    s: &Setup,
    port: u16,
    extra: &[&str],
    n: usize,
) -> ManagedProcess {
    let args = attach::attacher_args(&s.socket, cluster.kubeconfig_path(), port, extra);
    let log = cluster
        .log_dir()
        .join(format!("attacher-{}-{n}.log", s.driver_name));
    ManagedProcess::spawn(
        "attacher",
        &sidecar_bin().expect("csiops-sidecar built"),
        &args,
        &log,
    )
    .expect("attacher starts")
}

/// Published node IDs of a volume in the driver's persisted state.
fn published(s: &Setup, volume: &str) -> Vec<String> {
    load_state(s.driver.state_dir())
        .expect("driver state")
        .volumes
        .get(volume)
        .map(|v| v.published_node_ids())
        .unwrap_or_default()
}

async fn wait_va<F: Fn(Option<&VolumeAttachment>) -> bool>(
    vas: &Api<VolumeAttachment>,
    name: &str,
    what: &str,
    attacher: &ManagedProcess,
    pred: F,
) -> Option<VolumeAttachment> {
    wait_for(DEADLINE, POLL, || async {
        let va = vas.get_opt(name).await.ok()?;
        pred(va.as_ref()).then_some(va)
    })
    .await
    .unwrap_or_else(|_| panic!("VolumeAttachment {name}: {what}\n{}", attacher.log_tail(40)))
}

async fn writes(port: u16) -> BTreeSet<(String, u64)> {
    let (_, body) = testkit::http_get_async(([127, 0, 0, 1], port).into(), "/metrics")
        .await
        .expect("metrics served");
    body.lines()
        .filter_map(|l| l.strip_prefix("csiops_attacher_api_writes_total{write=\""))
        .filter_map(|l| {
            let (kind, rest) = l.split_once("\"} ")?;
            Some((kind.to_string(), rest.trim().parse().ok()?))
        })
        .collect()
}

fn count(w: &BTreeSet<(String, u64)>, kind: &str) -> u64 {
    w.iter().find(|(k, _)| k == kind).map_or(0, |(_, n)| *n)
}

/// PVs `pv-<i>` of the volumes `ids`; `pv-6` carries a controller-publish
/// secret, `default/publish-secret`, created here.
async fn create_pvs(client: &kube::Client, driver_name: &str, ids: &[String]) {
    let pp = PostParams::default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    secrets
        .create(
            &pp,
            &Secret {
                metadata: ObjectMeta {
                    name: Some("publish-secret".into()),
                    ..Default::default()
                },
                string_data: Some([("password".to_string(), SECRET_VALUE.to_string())].into()),
                ..Default::default()
            },
        )
        .await
        .expect("Secret");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for (i, id) in ids.iter().enumerate() {
        let mut pv = attach::pv(&format!("pv-{i}"), driver_name, id);
        if i == 6 {
            if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
                csi.controller_publish_secret_ref = Some(SecretReference {
                    name: Some("publish-secret".into()),
                    namespace: Some("default".into()),
                });
            }
        }
        pvs.create(&pp, &pv).await.expect("PV");
    }
}

/// The first driver (attach enabled, its first three publishes failing),
/// its attacher and volumes with their PVs, and what every phase uses.
struct Bed {
    // Dropped in this order, as the locals of the one function were: the
    // processes before the cluster.
    /// The volumes of `pv-<i>`.
    ids: Vec<String>,
    attacher: ManagedProcess,
    /// The attacher's metrics port.
    port: u16,
    s: Setup,
    pp: PostParams,
    pvs: Api<PersistentVolume>,
    vas: Api<VolumeAttachment>,
    client: kube::Client,
    cluster: Cluster,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_detach_errors_pv_deletion_and_trivial_mode() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pp = PostParams::default();

    // The first three publishes fail: the error must show, then go.
    let s = start_driver(
        &cluster,
        "attach.test.csi.csiops.dev",
        &[
            "--enable-attach",
            "--fail=ControllerPublishVolume=Internal:3",
        ],
    )
    .await;
    let port = free_port().expect("port");
    let attacher = start_attacher(
        &cluster,
        &s,
        port,
        &[
            "--retry-interval-start=1s",
            "--kube-api-qps=50",
            "--kube-api-burst=100",
            // Debug logs include the (redacted) CSI requests.
            "--v=5",
        ],
        0,
    );
    let csi = s.driver.client().await.expect("driver client");
    let ids = attach::create_volumes(&csi, "vol", 8)
        .await
        .expect("volumes");
    create_pvs(&client, &s.driver_name, &ids).await;

    let mut bed = Bed {
        cluster,
        client,
        vas,
        pvs,
        pp,
        s,
        port,
        attacher,
        ids,
    };

    a_failing_publish_shows_its_error_then_recovers(&bed).await;
    fresh_attachments_write_once_each(&bed).await;
    a_detach_unpublishes_with_one_write(&bed).await;
    a_pv_is_deleted_only_after_its_attachment(&bed).await;
    an_attachment_of_a_pv_being_deleted_is_refused(&bed).await;
    node_id_fallbacks_and_the_publish_secret(&bed).await;
    // Each phase's drivers and attachers run on to the end, as they did
    // when this was one function.
    let _trivial = trivial_mode_writes_no_finalizer(&mut bed).await;
    let _slow = detaches_never_starve_attaches(&bed).await;
    let _leader = only_the_lease_holder_acts(&bed).await;
    metrics_name_the_csi_calls_and_queues(&mut bed).await;
}

/// Step 1: A failing publish: attachError and an Event, then recovery.
async fn a_failing_publish_shows_its_error_then_recovers(bed: &Bed) {
    let Bed {
        client,
        vas,
        pvs,
        pp,
        s,
        attacher,
        ids,
        ..
    } = bed;
    vas.create(pp, &attach::va("va-0", &s.driver_name, "pv-0", NODE))
        .await
        .expect("VA");
    let failed = wait_va(vas, "va-0", "attachError", attacher, |va| {
        va.and_then(|v| v.status.as_ref())
            .and_then(|s| s.attach_error.as_ref())
            .is_some()
    })
    .await
    .expect("exists");
    let err = failed
        .status
        .and_then(|s| s.attach_error)
        .expect("attachError");
    assert!(
        err.message.as_deref().unwrap_or("").contains("Internal"),
        "{err:?}"
    );
    assert!(err.time.is_some(), "{err:?}");
    // The driver's gRPC code (Internal), which kubelet reads (KEP-4876).
    assert_eq!(err.error_code, Some(13), "{err:?}");
    assert!(
        has_finalizer(&failed.metadata, &s.finalizer),
        "finalizer precedes the publish"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    wait_for(DEADLINE, POLL, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("AttachFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("va-0")
                    && e.type_.as_deref() == Some("Warning")
            })
            .then_some(())
    })
    .await
    .expect("an AttachFailed Event for va-0");
    let ok = wait_va(vas, "va-0", "attached after the failures", attacher, |va| {
        va.is_some_and(|v| attached(v, &s.finalizer))
    })
    .await
    .expect("exists");
    let st = ok.status.expect("status");
    assert!(st.attach_error.is_none(), "attachError cleared: {st:?}");
    assert_eq!(
        st.attachment_metadata
            .as_ref()
            .and_then(|m| m.get("devicePath")),
        Some(&format!("/dev/test-{}", ids[0]))
    );
    assert_eq!(published(s, &ids[0]), vec![NODE_ID.to_string()]);
    let pv0 = pvs.get("pv-0").await.expect("pv-0");
    assert!(has_finalizer(&pv0.metadata, &s.finalizer), "PV finalizer");
}

/// Step 2: Five fresh attachments: both finalizers, metadata, driver state,
/// and exactly one PV write and two VolumeAttachment writes each.
async fn fresh_attachments_write_once_each(bed: &Bed) {
    let port = bed.port;
    let Bed {
        vas,
        pvs,
        pp,
        s,
        attacher,
        ids,
        ..
    } = bed;
    let before = writes(port).await;
    for i in 1..=5 {
        vas.create(
            pp,
            &attach::va(&format!("va-{i}"), &s.driver_name, &format!("pv-{i}"), NODE),
        )
        .await
        .expect("VA");
    }
    for (i, id) in ids.iter().enumerate().take(6).skip(1) {
        let va = wait_va(vas, &format!("va-{i}"), "attached", attacher, |va| {
            va.is_some_and(|v| attached(v, &s.finalizer))
        })
        .await
        .expect("exists");
        let meta = va
            .status
            .and_then(|s| s.attachment_metadata)
            .unwrap_or_default();
        assert_eq!(meta.get("devicePath"), Some(&format!("/dev/test-{id}")));
        assert_eq!(published(s, id), vec![NODE_ID.to_string()]);
        let pv = pvs.get(&format!("pv-{i}")).await.expect("pv");
        assert!(has_finalizer(&pv.metadata, &s.finalizer));
    }
    let after = writes(port).await;
    assert_eq!(
        count(&after, "va_finalizer") - count(&before, "va_finalizer"),
        5,
        "{after:?}"
    );
    assert_eq!(
        count(&after, "va_status") - count(&before, "va_status"),
        5,
        "{after:?}"
    );
    assert_eq!(
        count(&after, "pv_finalizer") - count(&before, "pv_finalizer"),
        5,
        "{after:?}"
    );
    let publishes = load_state(s.driver.state_dir()).expect("state");
    assert_eq!(
        publishes
            .volumes
            .values()
            .filter(|v| !v.published_nodes.is_empty())
            .count(),
        6
    );
}

/// Step 3: Detach: unpublished in the driver, then the object is gone, with
/// one write each.
async fn a_detach_unpublishes_with_one_write(bed: &Bed) {
    let port = bed.port;
    let Bed {
        vas,
        s,
        attacher,
        ids,
        ..
    } = bed;
    let before = writes(port).await;
    for i in 1..=3 {
        vas.delete(&format!("va-{i}"), &DeleteParams::default())
            .await
            .expect("delete VA");
    }
    for (i, id) in ids.iter().enumerate().take(4).skip(1) {
        wait_va(vas, &format!("va-{i}"), "gone", attacher, |va| va.is_none()).await;
        assert!(published(s, id).is_empty(), "volume {i} unpublished");
    }
    let after = writes(port).await;
    assert_eq!(
        count(&after, "va_finalizer") - count(&before, "va_finalizer"),
        3,
        "{after:?}"
    );
    assert_eq!(
        count(&after, "va_status"),
        count(&before, "va_status"),
        "{after:?}"
    );
}

/// Step 4: PV deletion waits for its attachment: pv-4 is attached (va-4), pv-1
/// is not attached any more. Both keep our finalizer until deleted.
async fn a_pv_is_deleted_only_after_its_attachment(bed: &Bed) {
    let Bed {
        vas,
        pvs,
        s,
        attacher,
        ids,
        ..
    } = bed;
    for pv in ["pv-1", "pv-4"] {
        pvs.delete(pv, &DeleteParams::default())
            .await
            .expect("delete PV");
    }
    wait_for(DEADLINE, POLL, || async {
        pvs.get_opt("pv-1").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("pv-1 not deleted\n{}", attacher.log_tail(30)));
    // A moment for a wrong finalizer removal to show, then pv-4 must still be there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pv4 = pvs.get("pv-4").await.expect("pv-4 still exists");
    assert!(pv4.metadata.deletion_timestamp.is_some());
    assert!(
        has_finalizer(&pv4.metadata, &s.finalizer),
        "kept while va-4 exists"
    );
    vas.delete("va-4", &DeleteParams::default())
        .await
        .expect("delete va-4");
    wait_for(DEADLINE, POLL, || async {
        pvs.get_opt("pv-4").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "pv-4 not deleted after its attachment\n{}",
            attacher.log_tail(30)
        )
    });
    assert!(published(s, &ids[4]).is_empty());
}

/// A new attachment of a PV being deleted is refused and never published.
async fn an_attachment_of_a_pv_being_deleted_is_refused(bed: &Bed) {
    let Bed {
        vas,
        pvs,
        pp,
        s,
        attacher,
        ids,
        ..
    } = bed;
    let pv7 = pvs.get("pv-7").await.expect("pv-7");
    assert!(!has_finalizer(&pv7.metadata, &s.finalizer));
    let mut protect = pv7.clone();
    protect
        .metadata
        .finalizers
        .get_or_insert_with(Vec::new)
        .push("e2e.csiops.dev/hold".into());
    pvs.replace("pv-7", pp, &protect).await.expect("hold pv-7");
    pvs.delete("pv-7", &DeleteParams::default())
        .await
        .expect("delete pv-7");
    vas.create(pp, &attach::va("va-7", &s.driver_name, "pv-7", NODE))
        .await
        .expect("VA");
    let refused = wait_va(vas, "va-7", "refused", attacher, |va| {
        va.and_then(|v| v.status.as_ref())
            .and_then(|s| s.attach_error.as_ref())
            .is_some()
    })
    .await
    .expect("exists");
    let refusal = refused
        .status
        .and_then(|s| s.attach_error)
        .expect("attachError");
    let msg = refusal.message.clone().unwrap_or_default();
    assert!(msg.contains("marked for deletion"), "{msg}");
    // Refused before any CSI call: no gRPC code to report.
    assert_eq!(refusal.error_code, None, "{refusal:?}");
    assert!(published(s, &ids[7]).is_empty());
    assert!(!has_finalizer(&refused.metadata, &s.finalizer));
}

/// Node-ID fallbacks: without the driver's CSINode entry, a detach uses
/// the ID the attach stored on the attachment, and an attach the Node's
/// `csi.volume.kubernetes.io/nodeid` annotation. The publish carries the
/// PV's controller-publish secret; its value is never logged.
async fn node_id_fallbacks_and_the_publish_secret(bed: &Bed) {
    let Bed {
        cluster,
        client,
        vas,
        pp,
        s,
        attacher,
        ids,
        ..
    } = bed;
    let va5 = vas.get("va-5").await.expect("va-5");
    assert_eq!(
        va5.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("csi.alpha.kubernetes.io/node-id"))
            .map(String::as_str),
        Some(NODE_ID)
    );
    attach::unregister_driver(client, NODE, &s.driver_name)
        .await
        .expect("CSINode entry removed");
    vas.delete("va-5", &DeleteParams::default())
        .await
        .expect("delete va-5");
    wait_va(
        vas,
        "va-5",
        "detached without a CSINode entry",
        attacher,
        |va| va.is_none(),
    )
    .await;
    assert!(published(s, &ids[5]).is_empty(), "va-5 unpublished");
    let nodes: Api<Node> = Api::all(client.clone());
    let ann = serde_json::json!({"metadata": {"annotations": {
        "csi.volume.kubernetes.io/nodeid": serde_json::json!({ s.driver_name.clone(): NODE_ID }).to_string()
    }}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&ann))
        .await
        .expect("node annotation");

    // The publish carries the PV's controller-publish secret; its value is
    // never logged. (Attached through the Node annotation, see above.)
    vas.create(pp, &attach::va("va-6", &s.driver_name, "pv-6", NODE))
        .await
        .expect("VA");
    let va6 = wait_va(vas, "va-6", "attached with a secret", attacher, |va| {
        va.is_some_and(|v| attached(v, &s.finalizer))
    })
    .await;
    let state = load_state(s.driver.state_dir()).expect("state");
    let publication = state
        .volumes
        .get(&ids[6])
        .and_then(|v| v.published_nodes.get(NODE_ID))
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "va-6 attached but not published: {va6:?}\n{:?}\n{}",
                state.volumes.get(&ids[6]),
                attacher.log_tail(60)
            )
        });
    assert_eq!(publication.secret_keys, vec!["password".to_string()]);
    vas.delete("va-6", &DeleteParams::default())
        .await
        .expect("delete");
    wait_va(vas, "va-6", "gone", attacher, |va| va.is_none()).await;
    let log = std::fs::read_to_string(
        cluster
            .log_dir()
            .join(format!("attacher-{}-0.log", s.driver_name)),
    )
    .expect("attacher log");
    assert!(
        !log.contains(SECRET_VALUE),
        "the secret leaked into the log"
    );
}

/// Step 5: Trivial mode: a driver without PUBLISH_UNPUBLISH_VOLUME. Its driver
/// and attacher, to keep running.
async fn trivial_mode_writes_no_finalizer(bed: &mut Bed) -> (Setup, ManagedProcess) {
    let Bed {
        cluster,
        vas,
        pvs,
        pp,
        attacher,
        ..
    } = bed;
    let t = start_driver(cluster, "trivial.test.csi.csiops.dev", &[]).await;
    let tport = free_port().expect("port");
    let trivial = start_attacher(cluster, &t, tport, &[], 0);
    let tcsi = t.driver.client().await.expect("client");
    let tid = attach::create_volumes(&tcsi, "tvol", 1)
        .await
        .expect("volume");
    pvs.create(pp, &attach::pv("tpv-0", &t.driver_name, &tid[0]))
        .await
        .expect("PV");
    vas.create(pp, &attach::va("tva-0", &t.driver_name, "tpv-0", NODE))
        .await
        .expect("VA");
    let tva = wait_va(vas, "tva-0", "attached (trivial)", &trivial, |va| {
        va.and_then(|v| v.status.as_ref())
            .is_some_and(|s| s.attached)
    })
    .await
    .expect("exists");
    assert!(
        tva.metadata.finalizers.unwrap_or_default().is_empty(),
        "no finalizers in trivial mode"
    );
    assert!(!has_finalizer(
        &pvs.get("tpv-0").await.expect("PV").metadata,
        &t.finalizer
    ));
    let tstate = load_state(t.driver.state_dir()).expect("state");
    assert!(tstate
        .volumes
        .values()
        .all(|v| v.published_nodes.is_empty()));
    let tw = writes(tport).await;
    assert_eq!(count(&tw, "va_status"), 1, "{tw:?}");
    assert_eq!(
        count(&tw, "va_finalizer") + count(&tw, "pv_finalizer"),
        0,
        "{tw:?}"
    );
    // The real-mode attacher left the other driver's attachment alone.
    assert!(
        attacher.check_running().is_ok(),
        "{}",
        attacher.log_tail(20)
    );
    vas.delete("tva-0", &DeleteParams::default())
        .await
        .expect("delete");
    wait_va(vas, "tva-0", "gone", &trivial, |va| va.is_none()).await;

    (t, trivial)
}

/// Step 6: Detaches never starve attaches: two workers per queue, four
/// detaches of 6 s each queued; a new attachment is attached while at
/// least two of them are still waiting (one shared pool of two would take
/// ~12 s of detaches first). Its driver and attacher, to keep running.
async fn detaches_never_starve_attaches(bed: &Bed) -> (Setup, ManagedProcess) {
    let Bed {
        cluster,
        vas,
        pvs,
        pp,
        ..
    } = bed;
    let slow = start_driver(
        cluster,
        "slow.test.csi.csiops.dev",
        &["--enable-attach", "--delay=ControllerUnpublishVolume=6s"],
    )
    .await;
    let slow_attacher = start_attacher(
        cluster,
        &slow,
        free_port().expect("port"),
        &[
            "--worker-threads=2",
            "--kube-api-qps=50",
            "--kube-api-burst=100",
        ],
        0,
    );
    let scsi = slow.driver.client().await.expect("client");
    let sids = attach::create_volumes(&scsi, "svol", 5)
        .await
        .expect("volumes");
    for (i, id) in sids.iter().enumerate() {
        pvs.create(pp, &attach::pv(&format!("spv-{i}"), &slow.driver_name, id))
            .await
            .expect("PV");
    }
    for i in 0..4 {
        let name = format!("sva-{i}");
        vas.create(
            pp,
            &attach::va(&name, &slow.driver_name, &format!("spv-{i}"), NODE),
        )
        .await
        .expect("VA");
        wait_va(vas, &name, "attached", &slow_attacher, |va| {
            va.is_some_and(|v| attached(v, &slow.finalizer))
        })
        .await;
    }
    for i in 0..4 {
        vas.delete(&format!("sva-{i}"), &DeleteParams::default())
            .await
            .expect("delete");
    }
    // The attachment comes once both detach workers are busy (the driver
    // has their calls), not while the deletions may still be on their way
    // to the attacher: only then does "attached during the detaches" say
    // anything about starvation.
    wait_for(DEADLINE, POLL, || async {
        (slow.driver.received_count("ControllerUnpublishVolume", "") >= 2).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("two detaches in flight\n{}", slow_attacher.log_tail(30)));
    vas.create(pp, &attach::va("sva-4", &slow.driver_name, "spv-4", NODE))
        .await
        .expect("VA");
    wait_va(
        vas,
        "sva-4",
        "attached during the detaches",
        &slow_attacher,
        |va| va.is_some_and(|v| attached(v, &slow.finalizer)),
    )
    .await;
    let mut still_detaching = 0;
    for i in 0..4 {
        if vas
            .get_opt(&format!("sva-{i}"))
            .await
            .expect("get")
            .is_some()
        {
            still_detaching += 1;
        }
    }
    assert!(
        still_detaching >= 2,
        "only {still_detaching} detaches were pending when the attach finished"
    );
    for i in 0..4 {
        wait_va(vas, &format!("sva-{i}"), "detached", &slow_attacher, |va| {
            va.is_none()
        })
        .await;
    }

    (slow, slow_attacher)
}

/// Step 7: Leader election: of two attachers only the Lease holder acts; when
/// it is killed, the other takes over. The driver and both attachers, to
/// keep running.
async fn only_the_lease_holder_acts(bed: &Bed) -> (Setup, ManagedProcess, ManagedProcess) {
    let Bed {
        cluster,
        client,
        vas,
        pvs,
        pp,
        ..
    } = bed;
    let l = start_driver(cluster, "leader.test.csi.csiops.dev", &["--enable-attach"]).await;
    let election = [
        "--leader-election",
        "--leader-election-namespace=default",
        "--leader-election-lease-duration=3s",
        "--leader-election-renew-deadline=2s",
        "--leader-election-retry-period=500ms",
    ];
    let mut first = start_attacher(cluster, &l, free_port().expect("port"), &election, 0);
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease_name = "external-attacher-leader-leader-test-csi-csiops-dev";
    wait_for(DEADLINE, POLL, || async {
        let lease = leases.get_opt(lease_name).await.ok()??;
        let holder = lease.spec?.holder_identity?;
        holder.ends_with(&format!("_{}", first.pid())).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("the first attacher leads\n{}", first.log_tail(20)));
    let second = start_attacher(cluster, &l, free_port().expect("port"), &election, 1);
    let second_log = || std::fs::read_to_string(second.log_path()).unwrap_or_default();
    // The standby is in the election before the leader gets work: a
    // standby still starting up would pass "the standby acted" trivially.
    wait_for(DEADLINE, POLL, || async {
        second_log()
            .contains("waiting to acquire leader lease")
            .then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("the second attacher waits for the Lease\n{}", second_log()));
    let lcsi = l.driver.client().await.expect("client");
    let lids = attach::create_volumes(&lcsi, "lvol", 2)
        .await
        .expect("volumes");
    for (i, id) in lids.iter().enumerate() {
        pvs.create(pp, &attach::pv(&format!("lpv-{i}"), &l.driver_name, id))
            .await
            .expect("PV");
    }
    vas.create(pp, &attach::va("lva-0", &l.driver_name, "lpv-0", NODE))
        .await
        .expect("VA");
    wait_va(vas, "lva-0", "attached by the leader", &first, |va| {
        va.is_some_and(|v| attached(v, &l.finalizer))
    })
    .await;
    assert!(
        !second_log().contains("attaching"),
        "the standby acted:\n{}",
        second_log()
    );
    first.kill9();
    vas.create(pp, &attach::va("lva-1", &l.driver_name, "lpv-1", NODE))
        .await
        .expect("VA");
    wait_va(vas, "lva-1", "attached by the new leader", &second, |va| {
        va.is_some_and(|v| attached(v, &l.finalizer))
    })
    .await;
    assert!(second_log().contains("attaching"), "{}", second_log());

    (l, first, second)
}

/// Metrics with the upstream name for the CSI calls, and the queues; then
/// the first attacher stops.
async fn metrics_name_the_csi_calls_and_queues(bed: &mut Bed) {
    let port = bed.port;
    let Bed { attacher, .. } = bed;
    let (_, body) = testkit::http_get_async(([127, 0, 0, 1], port).into(), "/metrics")
        .await
        .expect("metrics");
    assert!(
        body.contains("method_name=\"/csi.v1.Controller/ControllerPublishVolume\",grpc_status_code=\"Internal\""),
        "{body}"
    );
    assert!(body.contains("workqueue_depth{name=\"detach\"}"), "{body}");
    let (code, _) = testkit::http_get_async(([127, 0, 0, 1], port).into(), "/healthz")
        .await
        .expect("healthz");
    assert_eq!(code, 200);
    attacher.terminate(Duration::from_secs(5));
}

/// A deterministic pseudo-random sequence (no extra dependency needed).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

/// The attachment lanes of the kill -9 run, and the attach/detach cycles of
/// each.
const LANES: usize = 10;
const CYCLES: usize = 10;

/// The attacher restarted by [`a_killer_restarts_the_attacher_with_kill9`],
/// and how many times it was killed.
type Killer = tokio::task::JoinHandle<(ManagedProcess, usize)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_during_100_attach_detach_cycles_ends_consistent() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let s = start_driver(
        &cluster,
        "crash.test.csi.csiops.dev",
        // Slow calls widen the windows between the writes around them.
        &[
            "--enable-attach",
            "--delay=ControllerPublishVolume=100ms",
            "--delay-after=ControllerUnpublishVolume=100ms",
        ],
    )
    .await;
    let csi = s.driver.client().await.expect("client");
    let ids = attach::create_volumes(&csi, "vol", LANES)
        .await
        .expect("volumes");
    create_pvs(&client, &s.driver_name, &ids).await;

    let (stop, killer) = a_killer_restarts_the_attacher_with_kill9(&cluster, &s);
    ten_lanes_attach_and_detach_ten_times_each(&vas, &s).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (attacher, kills) = killer.await.expect("killer");
    kills_landed_between_the_calls_and_their_writes(&s, kills);
    every_live_attachment_is_published_and_no_deleted_one(&vas, &s, &ids).await;
    deleting_the_pvs_finds_no_stale_finalizer(&vas, &pvs, &s, &attacher).await;
}

/// The killer restarts the attacher with kill -9 every 0.15–0.9 s until
/// `stop` is set.
fn a_killer_restarts_the_attacher_with_kill9(
    cluster: &Cluster,
    s: &Setup,
) -> (std::sync::Arc<std::sync::atomic::AtomicBool>, Killer) {
    let port = free_port().expect("port");
    let extra = [
        "--retry-interval-start=200ms",
        "--retry-interval-max=2s",
        "--kube-api-qps=100",
        "--kube-api-burst=200",
    ];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The killer: restarts the attacher with kill -9 every 0.15–0.9 s.
    let killer = {
        let stop = stop.clone();
        let args = attach::attacher_args(&s.socket, cluster.kubeconfig_path(), port, &extra);
        let log = cluster.log_dir().join("attacher-crash.log");
        let bin = sidecar_bin().expect("csiops-sidecar built");
        tokio::spawn(async move {
            let mut rng = Lcg(42);
            let mut kills = 0usize;
            let mut p = ManagedProcess::spawn("attacher", &bin, &args, &log).expect("starts");
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(150 + rng.next(750))).await;
                p.kill9();
                kills += 1;
                p = ManagedProcess::spawn("attacher", &bin, &args, &log).expect("restarts");
            }
            (p, kills)
        })
    };
    (stop, killer)
}

/// Each lane attaches and detaches its volume ten times; the last
/// attachment of half the lanes stays.
async fn ten_lanes_attach_and_detach_ten_times_each(vas: &Api<VolumeAttachment>, s: &Setup) {
    let lanes = (0..LANES).map(|lane| {
        let vas = vas.clone();
        let driver_name = s.driver_name.clone();
        let finalizer = s.finalizer.clone();
        async move {
            let pv = format!("pv-{lane}");
            let name = format!("va-{lane}");
            for cycle in 0..CYCLES {
                vas.create(
                    &PostParams::default(),
                    &attach::va(&name, &driver_name, &pv, NODE),
                )
                .await
                .unwrap_or_else(|e| panic!("lane {lane} cycle {cycle}: create: {e}"));
                wait_for(Duration::from_secs(120), POLL, || async {
                    let va = vas.get_opt(&name).await.ok()??;
                    attached(&va, &finalizer).then_some(())
                })
                .await
                .unwrap_or_else(|_| panic!("lane {lane} cycle {cycle}: not attached"));
                // The last cycle of half the lanes stays attached.
                if cycle == CYCLES - 1 && lane % 2 == 1 {
                    break;
                }
                vas.delete(&name, &DeleteParams::default())
                    .await
                    .unwrap_or_else(|e| panic!("lane {lane} cycle {cycle}: delete: {e}"));
                wait_for(Duration::from_secs(120), POLL, || async {
                    vas.get_opt(&name).await.ok()?.is_none().then_some(())
                })
                .await
                .unwrap_or_else(|_| panic!("lane {lane} cycle {cycle}: not detached"));
            }
        }
    });
    futures::future::join_all(lanes).await;
}

/// Kills landed between a (un)publish and the write that records it: the
/// driver saw more calls than attaches and detaches.
fn kills_landed_between_the_calls_and_their_writes(s: &Setup, kills: usize) {
    // Kills landed inside the windows this test is about: between a
    // (un)publish and the write that records it. Without a kill there,
    // each attach publishes once and each detach unpublishes once (writes
    // read back through the caches never repeat a call); a killed attacher's
    // successor calls again. The driver logs every call that reached it.
    let driver_log = s.driver.log();
    let calls = |method: &str| {
        driver_log
            .lines()
            .filter(|l| l.contains(&format!(" call method=\"{method}\"")))
            .count()
    };
    let (publishes, unpublishes) = (
        calls("ControllerPublishVolume"),
        calls("ControllerUnpublishVolume"),
    );
    let (attaches, detaches) = (LANES * CYCLES, LANES * CYCLES - LANES / 2);
    eprintln!(
        "attacher killed {kills} times during {attaches} attaches and {detaches} detaches: \
         {publishes} publishes, {unpublishes} unpublishes"
    );
    assert!(
        publishes >= attaches && unpublishes >= detaches,
        "fewer calls than attaches/detaches: is the driver log still parsed? {}",
        s.driver.log_path().display()
    );
    assert!(
        publishes + unpublishes > attaches + detaches,
        "none of the {kills} kills interrupted an attach or a detach after its call"
    );
}

/// Every live attachment is attached, finalized and published; every
/// deleted one unpublished.
async fn every_live_attachment_is_published_and_no_deleted_one(
    vas: &Api<VolumeAttachment>,
    s: &Setup,
    ids: &[String],
) {
    // Consistent: every live attachment attached, finalized and published;
    // every deleted one unpublished.
    let state = load_state(s.driver.state_dir()).expect("state");
    for (lane, id) in ids.iter().enumerate() {
        let nodes = state
            .volumes
            .get(id)
            .map(|v| v.published_node_ids())
            .unwrap_or_default();
        let va = vas.get_opt(&format!("va-{lane}")).await.expect("get");
        if lane % 2 == 1 {
            let va = va.expect("live attachment");
            assert!(attached(&va, &s.finalizer), "lane {lane}: {va:?}");
            assert_eq!(nodes, vec![NODE_ID.to_string()], "lane {lane}");
        } else {
            assert!(va.is_none(), "lane {lane}");
            assert!(
                nodes.is_empty(),
                "lane {lane}: still published to {nodes:?}"
            );
        }
    }
}

/// No stale finalizers: deleting every PV lets the detached ones go at once,
/// the attached ones after their attachments; nothing stays published.
async fn deleting_the_pvs_finds_no_stale_finalizer(
    vas: &Api<VolumeAttachment>,
    pvs: &Api<PersistentVolume>,
    s: &Setup,
    attacher: &ManagedProcess,
) {
    // No stale finalizers: deleting every PV lets the detached ones go at
    // once; the attached ones go after their attachments.
    for lane in 0..LANES {
        pvs.delete(&format!("pv-{lane}"), &DeleteParams::default())
            .await
            .expect("delete PV");
    }
    for lane in (0..LANES).step_by(2) {
        wait_for(DEADLINE, POLL, || async {
            pvs.get_opt(&format!("pv-{lane}"))
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("pv-{lane} kept a finalizer\n{}", attacher.log_tail(30)));
    }
    for lane in (1..LANES).step_by(2) {
        let pv = pvs
            .get(&format!("pv-{lane}"))
            .await
            .expect("attached PV stays");
        assert!(has_finalizer(&pv.metadata, &s.finalizer));
        vas.delete(&format!("va-{lane}"), &DeleteParams::default())
            .await
            .expect("delete VA");
    }
    for lane in (1..LANES).step_by(2) {
        wait_for(DEADLINE, POLL, || async {
            pvs.get_opt(&format!("pv-{lane}"))
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("pv-{lane} not released\n{}", attacher.log_tail(30)));
    }
    let state = load_state(s.driver.state_dir()).expect("state");
    assert!(
        state.volumes.values().all(|v| v.published_nodes.is_empty()),
        "{state:?}"
    );
    assert!(vas
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .is_empty());
}

/// ControllerPublishVolume calls that failed with Internal, per the
/// attacher's own `csi_sidecar_operations_seconds` histogram; `None` while
/// its HTTP server is not up.
async fn failed_publishes(port: u16) -> Option<u64> {
    let (_, body) = testkit::http_get_async(([127, 0, 0, 1], port).into(), "/metrics").await?;
    Some(
        body.lines()
            .filter(|l| l.starts_with("csi_sidecar_operations_seconds_count{"))
            .filter(|l| l.contains("ControllerPublishVolume") && l.contains("\"Internal\""))
            .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<u64>().ok())
            .sum(),
    )
}

/// A driver whose error message differs on every call (a request ID in it)
/// must still be retried on the backoff schedule: the attacher's own
/// `attachError` write is a change of the object, but not one that calls
/// for another attempt (upstream's `shouldEnqueueVAChange`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_error_messages_do_not_bypass_the_backoff() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pp = PostParams::default();
    let s = start_driver(
        &cluster,
        "backoff.test.csi.csiops.dev",
        &[
            "--enable-attach",
            "--fail=ControllerPublishVolume=Internal",
            "--numbered-failures",
        ],
    )
    .await;
    let port = free_port().expect("port");
    // A generous API budget, so only the backoff can hold the retries back.
    let attacher = start_attacher(
        &cluster,
        &s,
        port,
        &[
            "--retry-interval-start=1s",
            "--retry-interval-max=1m",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
        ],
        0,
    );
    let csi = s.driver.client().await.expect("driver client");
    let ids = attach::create_volumes(&csi, "vol", 1)
        .await
        .expect("volume");
    pvs.create(&pp, &attach::pv("pv-0", &s.driver_name, &ids[0]))
        .await
        .expect("PV");
    vas.create(&pp, &attach::va("va-0", &s.driver_name, "pv-0", NODE))
        .await
        .expect("VA");
    wait_for(DEADLINE, POLL, || async {
        failed_publishes(port).await.filter(|&n| n >= 1)
    })
    .await
    .unwrap_or_else(|_| panic!("no failed publish\n{}", attacher.log_tail(40)));
    let first = writes(port).await;

    // Attempts at 0 s, at once again (the first attempt's finalizer write is
    // a real change), then after 1 s and 2 s more: four in the first 8 s.
    // Without the filter every new message brings the next attempt at once.
    const WINDOW: Duration = Duration::from_secs(8);
    tokio::time::sleep(WINDOW).await;
    let attempts = failed_publishes(port).await.expect("metrics served");
    let later = writes(port).await;
    assert!(
        attempts <= 5,
        "{attempts} publishes in {WINDOW:?} with --retry-interval-start=1s\n{}",
        attacher.log_tail(40)
    );
    assert!(attempts >= 3, "retries stopped: {attempts}");
    // The messages did change, and each new one was recorded.
    assert!(
        count(&later, "va_status") > count(&first, "va_status"),
        "no new attachError written: {first:?} → {later:?}"
    );
    let va = vas.get("va-0").await.expect("va-0");
    let message = va
        .status
        .and_then(|s| s.attach_error)
        .and_then(|e| e.message)
        .unwrap_or_default();
    assert!(message.contains("(#"), "numbered message: {message:?}");
}

/// `--reconcile-sync`: the driver loses an attachment behind the attacher's
/// back (ControllerUnpublishVolume called directly, as an array failover or
/// an admin would); ListVolumes no longer reports it, and the attacher
/// attaches it again. The other attachment is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_the_driver_lost_is_attached_again() {
    let cluster = Cluster::start(ClusterOptions::kwok(1))
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let s = start_driver(
        &cluster,
        "reconcile.test.csi.csiops.dev",
        &["--enable-attach"],
    )
    .await;
    let port = free_port().expect("port");
    let attacher = start_attacher(
        &cluster,
        &s,
        port,
        &[
            "--reconcile-sync=1s",
            "--kube-api-qps=50",
            "--kube-api-burst=100",
        ],
        0,
    );
    let csi = s.driver.client().await.expect("driver client");
    let ids = attach::create_volumes(&csi, "vol", 2)
        .await
        .expect("volumes");
    create_pvs(&client, &s.driver_name, &ids).await;
    let pp = PostParams::default();
    for (i, id) in ids.iter().enumerate() {
        vas.create(
            &pp,
            &attach::va(&format!("va-{i}"), &s.driver_name, &format!("pv-{i}"), NODE),
        )
        .await
        .expect("VA");
        wait_va(&vas, &format!("va-{i}"), "attached", &attacher, |va| {
            va.is_some_and(|v| attached(v, &s.finalizer))
        })
        .await;
        assert_eq!(published(&s, id), [NODE_ID]);
    }
    let before = writes(port).await;

    // The driver loses va-0's publication.
    csi.controller()
        .controller_unpublish_volume(csiops_proto::csi::v1::ControllerUnpublishVolumeRequest {
            volume_id: ids[0].clone(),
            node_id: NODE_ID.to_string(),
            ..Default::default()
        })
        .await
        .expect("ControllerUnpublishVolume");
    assert!(published(&s, &ids[0]).is_empty(), "the driver lost it");

    // Published again, and the VolumeAttachment attached.
    wait_for(DEADLINE, POLL, || async {
        (published(&s, &ids[0]) == [NODE_ID]).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("never attached again\n{}", attacher.log_tail(40)));
    wait_va(&vas, "va-0", "attached again", &attacher, |va| {
        va.is_some_and(|v| attached(v, &s.finalizer))
    })
    .await;
    let log = attacher.log_tail(200);
    assert!(
        log.contains("marking the attachment detached to attach it again") && log.contains("va-0"),
        "{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("marking the attachment detached") && l.contains("va-1")),
        "va-1 was never touched:\n{log}"
    );
    assert_eq!(published(&s, &ids[1]), [NODE_ID]);
    // Two status writes for va-0: attached false, then true again.
    let after = writes(port).await;
    assert_eq!(
        count(&after, "va_status") - count(&before, "va_status"),
        2,
        "{before:?} -> {after:?}"
    );
    drop(attacher);
    cluster.stop().await.expect("cluster stops");
}
