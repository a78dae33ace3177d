//! `csi-test-driver` as a real process: state that survives `kill -9`,
//! idempotency across restarts, fault injection, attach bookkeeping, and
//! `--node-local` (volumes of one node, real loop devices and mounts; the
//! tests with real mounts need root and fail saying so without it).
//!
//! `CSIOPS_CSI_SANITY=/path/to/csi-sanity` also runs upstream csi-sanity
//! against it (see `csi_sanity_passes`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use csiops_e2e::testdriver::leftovers::{leftovers_under, LeftoverGuard};
use csiops_e2e::testdriver::{load_state, TestDriverProcess, Volume};
use csiops_proto::client::{self, CsiClient};
use csiops_proto::csi::v1::{
    controller_service_capability, volume_capability, ControllerGetCapabilitiesRequest,
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, CreateVolumeRequest,
    DeleteVolumeRequest, GetCapacityRequest, GetPluginInfoRequest, ListVolumesRequest,
    NodeGetInfoRequest, NodeGetVolumeStatsRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, Topology,
    TopologyRequirement, ValidateVolumeCapabilitiesRequest, VolumeCapability,
};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_csi-test-driver");

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::Builder::new().prefix("ctd").tempdir().unwrap(),
        }
    }
    fn socket(&self) -> PathBuf {
        self.dir.path().join("csi.sock")
    }
    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    fn log(&self) -> PathBuf {
        self.dir.path().join("driver.log")
    }
    async fn start(&self, args: &[&str]) -> TestDriverProcess {
        TestDriverProcess::start(
            Path::new(BIN),
            &self.socket(),
            &self.state_dir(),
            args,
            &self.log(),
        )
        .await
        .unwrap()
    }
}

fn mount_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
    }
}

fn create_req(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![mount_cap()],
        parameters: HashMap::from([("type".into(), "fast".into())]),
        secrets: HashMap::from([("password".into(), "s3cr3t-value".into())]),
        ..Default::default()
    }
}

async fn create(csi: &CsiClient, name: &str) -> Result<String, tonic::Status> {
    csi.controller()
        .create_volume(create_req(name))
        .await
        .map(|r| r.into_inner().volume.unwrap().volume_id)
}

fn names(vols: &[Volume]) -> Vec<&str> {
    vols.iter().map(|v| v.name.as_str()).collect()
}

fn cli_list(state_dir: &Path) -> Vec<Volume> {
    let out = std::process::Command::new(BIN)
        .args(["list", "--state-dir"])
        .arg(state_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn create_volume_is_idempotent_across_kill9_and_restart() {
    let env = Env::new();
    let mut driver = env.start(&["--nodeid=node-a"]).await;
    let csi = driver.client().await.unwrap();

    let info = csi
        .identity()
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "test.csi.csiops.dev");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));

    let id = create(&csi, "pvc-1").await.unwrap();
    let pid = driver.pid().unwrap();
    driver.kill9();
    assert!(!csiops_e2e::pid_alive(pid));
    // kill -9 leaves the socket behind; the restart removes it.
    assert!(env.socket().exists());
    driver.restart().await.unwrap();

    let csi = driver.client().await.unwrap();
    assert_eq!(
        create(&csi, "pvc-1").await.unwrap(),
        id,
        "same name, same volume"
    );
    let other = create(&csi, "pvc-2").await.unwrap();
    assert_ne!(other, id);

    let state = driver.state().unwrap();
    let vols: Vec<Volume> = state.volumes_by_seq().into_iter().cloned().collect();
    assert_eq!(names(&vols), ["pvc-1", "pvc-2"]);
    let v = &vols[0];
    assert_eq!(v.id, id);
    assert_eq!(v.capacity_bytes, 1 << 30, "default size");
    assert_eq!(
        v.parameters,
        BTreeMap::from([("type".into(), "fast".into())])
    );
    assert_eq!(v.secret_keys, ["password"]);
    assert_eq!(
        v.accessible_topology,
        [BTreeMap::from([(
            "topology.test.csi.csiops.dev/node".to_owned(),
            "node-a".to_owned()
        )])]
    );
    // The inspection CLI prints the same thing.
    assert_eq!(cli_list(&env.state_dir()), vols);

    // Same name, incompatible capacity or parameters: ALREADY_EXISTS.
    let mut bigger = create_req("pvc-1");
    bigger.capacity_range = Some(csiops_proto::csi::v1::CapacityRange {
        required_bytes: 2 << 30,
        limit_bytes: 0,
    });
    let err = csi.controller().create_volume(bigger).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    let mut other_params = create_req("pvc-1");
    other_params.parameters.insert("type".into(), "slow".into());
    let err = csi
        .controller()
        .create_volume(other_params)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    // Secret values are neither stored nor logged.
    driver.stop(Duration::from_secs(5));
    let state_text = std::fs::read_to_string(env.state_dir().join("state.json")).unwrap();
    assert!(!state_text.contains("s3cr3t-value"));
    let log = std::fs::read_to_string(env.log()).unwrap();
    assert!(log.contains("method=\"CreateVolume\" code=OK"), "{log}");
    assert!(!log.contains("s3cr3t-value"), "{log}");
}

#[tokio::test]
async fn delete_volume_of_unknown_id_is_ok_and_deletes_are_idempotent() {
    let env = Env::new();
    let driver = env.start(&["--nodeid=node-a"]).await;
    let csi = driver.client().await.unwrap();

    for _ in 0..2 {
        csi.controller()
            .delete_volume(DeleteVolumeRequest {
                volume_id: "no-such-volume".into(),
                secrets: HashMap::new(),
            })
            .await
            .unwrap();
    }
    let err = csi
        .controller()
        .delete_volume(DeleteVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    let id = create(&csi, "pvc-del").await.unwrap();
    for _ in 0..2 {
        csi.controller()
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                secrets: HashMap::from([("token".into(), "xyz-secret".into())]),
            })
            .await
            .unwrap();
    }
    let state = driver.state().unwrap();
    assert!(state.volumes.is_empty());
    assert_eq!(state.deleted.len(), 1, "{:?}", state.deleted);
    assert_eq!(state.deleted[0].id, id);
    assert_eq!(state.deleted[0].name, "pvc-del");
    assert_eq!(state.deleted[0].secret_keys, ["token"]);
    // A new volume of the same name after deletion is a new volume.
    assert_ne!(create(&csi, "pvc-del").await.unwrap(), id);
}

#[tokio::test]
async fn state_survives_kill9_with_the_answer_lost() {
    let env = Env::new();
    let mut driver = env
        .start(&["--nodeid=node-a", "--delay-after=CreateVolume=60s"])
        .await;
    let csi = driver.client().await.unwrap();

    // The volume is persisted before the (delayed) answer; kill the driver
    // while the caller waits.
    let call = {
        let csi = csi.clone();
        tokio::spawn(async move { create(&csi, "pvc-lost").await })
    };
    let state_dir = env.state_dir();
    let persisted =
        csiops_e2e::wait_for(Duration::from_secs(10), Duration::from_millis(10), || {
            let dir = state_dir.clone();
            async move {
                load_state(&dir)
                    .unwrap()
                    .volume_by_name("pvc-lost")
                    .map(|v| v.id.clone())
            }
        })
        .await
        .unwrap();
    driver.kill9();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    // Restarted without the delay: the retry finds the volume, no duplicate.
    drop(driver);
    let driver = env.start(&["--nodeid=node-a"]).await;
    let csi = driver.client().await.unwrap();
    assert_eq!(create(&csi, "pvc-lost").await.unwrap(), persisted);
    assert_eq!(driver.state().unwrap().volumes.len(), 1);
}

#[tokio::test]
async fn state_file_survives_kill9_mid_burst() {
    let env = Env::new();
    let mut driver = env.start(&["--nodeid=node-a", "--capacity=1Ti"]).await;
    let csi = driver.client().await.unwrap();

    // Four callers create volumes as fast as they can; kill -9 after 40
    // acknowledgements, with calls in flight.
    let acked = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<String, String>::new()));
    let attempted = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (csi, acked, attempted) = (csi.clone(), acked.clone(), attempted.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("burst-{t}-{i}");
                attempted.lock().unwrap().push(name.clone());
                match create(&csi, &name).await {
                    Ok(id) => {
                        acked.lock().unwrap().insert(name, id);
                    }
                    Err(_) => return,
                }
            }
        }));
    }
    csiops_e2e::wait_for(Duration::from_secs(30), Duration::from_millis(1), || {
        let n = acked.lock().unwrap().len();
        async move { (n >= 40).then_some(()) }
    })
    .await
    .unwrap();
    driver.kill9();
    for t in tasks {
        t.await.unwrap();
    }

    // The file parses and holds every acknowledged volume with its ID, and
    // nothing that was never asked for.
    let acked = acked.lock().unwrap().clone();
    let attempted = attempted.lock().unwrap().clone();
    let state = load_state(&env.state_dir()).unwrap();
    for (name, id) in &acked {
        assert_eq!(
            state.volume_by_name(name).map(|v| &v.id),
            Some(id),
            "acknowledged {name} lost"
        );
    }
    for v in state.volumes.values() {
        assert!(attempted.contains(&v.name), "unexpected volume {}", v.name);
    }
    assert!(state.volumes.len() <= attempted.len());

    // Replaying every attempted name after a restart duplicates nothing.
    driver.restart().await.unwrap();
    let csi = driver.client().await.unwrap();
    for name in &attempted {
        let id = create(&csi, name).await.unwrap();
        if let Some(acked_id) = acked.get(name) {
            assert_eq!(&id, acked_id, "{name}");
        }
    }
    let state = driver.state().unwrap();
    assert_eq!(state.volumes.len(), attempted.len());
}

#[tokio::test]
async fn failure_injection() {
    let env = Env::new();
    let driver = env
        .start(&[
            "--nodeid=node-a",
            "--fail=CreateVolume=Unavailable:2",
            "--fail-after=DeleteVolume=DeadlineExceeded:1",
            "--fail=NodeGetInfo=INTERNAL",
            "--delay=ListVolumes=1s",
        ])
        .await;
    let csi = driver.client().await.unwrap();

    // --fail: before any work.
    for _ in 0..2 {
        let err = create(&csi, "pvc-f").await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(err.message().contains("injected"), "{err:?}");
        assert!(driver.state().unwrap().volumes.is_empty());
    }
    let id = create(&csi, "pvc-f").await.unwrap();

    // --fail-after: the work is done, the answer is an error.
    let err = csi
        .controller()
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(driver.state().unwrap().volumes.is_empty(), "deleted anyway");
    csi.controller()
        .delete_volume(DeleteVolumeRequest {
            volume_id: id,
            secrets: HashMap::new(),
        })
        .await
        .unwrap();

    // No count: every call.
    for _ in 0..3 {
        let err = csi
            .node()
            .node_get_info(NodeGetInfoRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Internal);
    }

    // --delay: a caller with a shorter deadline times out.
    let err = csi
        .controller()
        .list_volumes(client::with_timeout(
            ListVolumesRequest::default(),
            Duration::from_millis(200),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");

    let log = driver.log();
    assert!(log.contains("code=Unavailable"), "{log}");
}

#[tokio::test]
async fn delayed_work_completes_even_when_the_caller_gives_up() {
    let env = Env::new();
    let driver = env
        .start(&["--nodeid=node-a", "--delay=CreateVolume=500ms"])
        .await;
    let csi = driver.client().await.unwrap();
    let err = csi
        .controller()
        .create_volume(client::with_timeout(
            create_req("pvc-slow"),
            Duration::from_millis(100),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(driver.state().unwrap().volumes.is_empty());
    // Like a real backend, the storage side finishes: a leak unless the CO
    // retries with the same name.
    let state_dir = env.state_dir();
    let id = csiops_e2e::wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
        let dir = state_dir.clone();
        async move {
            load_state(&dir)
                .unwrap()
                .volume_by_name("pvc-slow")
                .map(|v| v.id.clone())
        }
    })
    .await
    .unwrap();
    assert_eq!(create(&csi, "pvc-slow").await.unwrap(), id);
    // The abandoned call is logged too, with its real outcome.
    let logged = csiops_e2e::wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
        let n = driver
            .log()
            .matches("method=\"CreateVolume\" code=OK")
            .count();
        async move { (n == 2).then_some(()) }
    })
    .await;
    assert!(logged.is_ok(), "{}", driver.log());
}

/// A ControllerPublishVolume of volume `id` to `node_id`, with a secret.
fn controller_publish(id: &str, node_id: &str) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: node_id.into(),
        volume_capability: Some(mount_cap()),
        secrets: HashMap::from([("pub-key".into(), "pub-secret".into())]),
        ..Default::default()
    }
}

#[tokio::test]
async fn attach_and_node_publish_with_a_shared_state_dir() {
    let env = Env::new();
    // A controller instance and a node instance share the state dir, as in
    // the e2e (one controller, one driver per simulated node).
    let controller = env.start(&["--nodeid=ctrl-0", "--enable-attach"]).await;
    let node_socket = env.dir.path().join("node-1.sock");
    let node = TestDriverProcess::start(
        Path::new(BIN),
        &node_socket,
        &env.state_dir(),
        &[
            "--nodeid=node-1",
            "--enable-attach",
            "--max-volumes-per-node=1",
        ],
        &env.dir.path().join("node-1.log"),
    )
    .await
    .unwrap();
    let csi = controller.client().await.unwrap();
    let node_csi = node.client().await.unwrap();

    the_controller_advertises_attach_capabilities(&csi).await;
    the_node_reports_its_id_limit_and_segment(&node_csi).await;

    let id = create(&csi, "pvc-att").await.unwrap();
    let target = controller.state_dir().join("pods/p1/target");
    let node_publish = NodePublishVolumeRequest {
        volume_id: id.clone(),
        target_path: target.to_str().unwrap().into(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    };
    early_publishes_are_refused(&csi, &node_csi, &id, &node_publish).await;
    controller_publish_is_idempotent_and_single_node(&csi, &id).await;
    node_publish_is_idempotent_and_recorded(&controller, &node_csi, &id, &target, node_publish)
        .await;
    a_volume_in_use_is_deleted_only_once_unpublished(&controller, &csi, &node_csi, &id, &target)
        .await;
}

/// The controller advertises volumes, capacity, attach and the attached
/// nodes in ListVolumes.
async fn the_controller_advertises_attach_capabilities(csi: &CsiClient) {
    let caps = csi
        .controller()
        .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let caps: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| {
            c.r#type
                .map(|controller_service_capability::Type::Rpc(r)| r.r#type)
        })
        .collect();
    use controller_service_capability::rpc::Type as T;
    for t in [
        T::CreateDeleteVolume,
        T::ListVolumes,
        T::GetCapacity,
        T::PublishUnpublishVolume,
        T::ListVolumesPublishedNodes,
    ] {
        assert!(caps.contains(&(t as i32)), "{t:?} missing from {caps:?}");
    }
}

/// The node instance reports its ID, its volume limit and its segment.
async fn the_node_reports_its_id_limit_and_segment(node_csi: &CsiClient) {
    let info = node_csi
        .node()
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-1");
    assert_eq!(info.max_volumes_per_node, 1);
    assert_eq!(
        info.accessible_topology.unwrap().segments,
        HashMap::from([("topology.test.csi.csiops.dev/node".into(), "node-1".into())])
    );
}

/// A publish to an unknown node is NOT_FOUND; a NodePublish before the
/// ControllerPublish is refused.
async fn early_publishes_are_refused(
    csi: &CsiClient,
    node_csi: &CsiClient,
    id: &str,
    node_publish: &NodePublishVolumeRequest,
) {
    let err = csi
        .controller()
        .controller_publish_volume(controller_publish(id, "node-unknown"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    // NodePublish before ControllerPublish is a CO bug.
    let err = node_csi
        .node()
        .node_publish_volume(node_publish.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
}

/// ControllerPublish is idempotent, refused for a second node (single-node
/// writer), and listed with its node.
async fn controller_publish_is_idempotent_and_single_node(csi: &CsiClient, id: &str) {
    for _ in 0..2 {
        let ctx = csi
            .controller()
            .controller_publish_volume(controller_publish(id, "node-1"))
            .await
            .unwrap()
            .into_inner()
            .publish_context;
        assert_eq!(ctx["devicePath"], format!("/dev/test-{id}"));
    }
    // Single-node writer: another node is refused.
    let err = csi
        .controller()
        .controller_publish_volume(controller_publish(id, "ctrl-0"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    let list = csi
        .controller()
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.entries.len(), 1);
    assert_eq!(
        list.entries[0].status.as_ref().unwrap().published_node_ids,
        ["node-1"]
    );
}

/// NodePublish is idempotent, creates the target and is recorded with its
/// node and the publish secret's keys.
async fn node_publish_is_idempotent_and_recorded(
    controller: &TestDriverProcess,
    node_csi: &CsiClient,
    id: &str,
    target: &Path,
    node_publish: NodePublishVolumeRequest,
) {
    node_csi
        .node()
        .node_publish_volume(node_publish.clone())
        .await
        .unwrap();
    node_csi
        .node()
        .node_publish_volume(node_publish)
        .await
        .unwrap();
    assert!(target.is_dir(), "target inside the state dir is created");
    let state = controller.state().unwrap();
    let v = &state.volumes[id];
    assert_eq!(v.published_nodes["node-1"].secret_keys, ["pub-key"]);
    let np = &v.node_publications[target.to_str().unwrap()];
    assert_eq!(np.node_id, "node-1");
    assert!(np.created_dir);
    assert_eq!(state.nodes.iter().collect::<Vec<_>>(), ["ctrl-0", "node-1"]);
}

/// A volume in use is not deleted; unpublished (idempotently) it is, and an
/// unpublish of the deleted volume is still OK.
async fn a_volume_in_use_is_deleted_only_once_unpublished(
    controller: &TestDriverProcess,
    csi: &CsiClient,
    node_csi: &CsiClient,
    id: &str,
    target: &Path,
) {
    // In use: DeleteVolume refuses.
    let del = DeleteVolumeRequest {
        volume_id: id.to_string(),
        secrets: HashMap::new(),
    };
    let err = csi
        .controller()
        .delete_volume(del.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: id.to_string(),
        target_path: target.to_str().unwrap().into(),
    };
    node_csi
        .node()
        .node_unpublish_volume(unpublish.clone())
        .await
        .unwrap();
    node_csi
        .node()
        .node_unpublish_volume(unpublish)
        .await
        .unwrap();
    assert!(!target.exists());
    let unpublish = ControllerUnpublishVolumeRequest {
        volume_id: id.to_string(),
        node_id: "node-1".into(),
        secrets: HashMap::new(),
    };
    csi.controller()
        .controller_unpublish_volume(unpublish.clone())
        .await
        .unwrap();
    csi.controller().delete_volume(del).await.unwrap();
    // Unpublish of a deleted volume is still OK (it is not attached).
    csi.controller()
        .controller_unpublish_volume(unpublish)
        .await
        .unwrap();
    assert!(controller.state().unwrap().volumes.is_empty());
}

#[tokio::test]
async fn list_volumes_pages_survive_deletions_and_capacity_is_tracked() {
    let env = Env::new();
    let driver = env.start(&["--nodeid=node-a", "--capacity=10Gi"]).await;
    let csi = driver.client().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(create(&csi, &format!("pvc-{i}")).await.unwrap());
    }
    let capacity = csi
        .controller()
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(capacity.available_capacity, 5 << 30);

    let page = |token: String| ListVolumesRequest {
        max_entries: 2,
        starting_token: token,
    };
    let first = csi
        .controller()
        .list_volumes(page(String::new()))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<String> = first
        .entries
        .iter()
        .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
        .collect();
    assert_eq!(got, ids[0..2]);
    assert!(!first.next_token.is_empty());
    // Deleting the listed volumes does not shift the next page.
    for id in &ids[0..2] {
        csi.controller()
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                secrets: HashMap::new(),
            })
            .await
            .unwrap();
    }
    let second = csi
        .controller()
        .list_volumes(page(first.next_token))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<String> = second
        .entries
        .iter()
        .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
        .collect();
    assert_eq!(got, ids[2..4]);

    let err = csi
        .controller()
        .list_volumes(page("not-a-token".into()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);

    // 3 GiB used of 10: 8 GiB does not fit.
    let mut big = create_req("pvc-big");
    big.capacity_range = Some(csiops_proto::csi::v1::CapacityRange {
        required_bytes: 8 << 30,
        limit_bytes: 0,
    });
    let err = csi
        .controller()
        .create_volume(big.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    big.capacity_range.as_mut().unwrap().required_bytes = 11 << 30;
    let err = csi.controller().create_volume(big).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
}

#[tokio::test]
async fn sigterm_removes_the_socket_and_a_live_socket_is_not_stolen() {
    let env = Env::new();
    let mut driver = env.start(&["--nodeid=node-a"]).await;

    // A second instance on the same, live socket refuses to start.
    let second = std::process::Command::new(BIN)
        .arg(format!("--endpoint=unix://{}", env.socket().display()))
        .arg(format!("--state-dir={}", env.state_dir().display()))
        .arg("--nodeid=node-b")
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("in use"), "{stderr}");

    driver.stop(Duration::from_secs(5));
    assert!(!env.socket().exists(), "socket removed on SIGTERM");
    let log = driver.log();
    assert!(log.contains("SIGTERM: stopping"), "{log}");
    assert!(log.contains("stopped"), "{log}");
}

/// Upstream csi-sanity against csi-test-driver, recording-only node
/// service (target paths inside the state dir are created and removed).
#[tokio::test]
async fn csi_sanity_passes() {
    run_csi_sanity(&Env::new(), &[]).await;
}

/// Upstream csi-sanity with `--data-dir`: real volumes, NodeStageVolume
/// and NodePublishVolume with real bind mounts (needs root).
#[tokio::test]
async fn csi_sanity_passes_with_real_mounts() {
    let env = Env::new();
    let data = env.dir.path().join("data");
    run_csi_sanity(&env, &[&format!("--data-dir={}", data.display())]).await;
    let left: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&*env.dir.path().to_string_lossy()))
        .map(String::from)
        .collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
}

/// Runs upstream csi-sanity (`CSIOPS_CSI_SANITY`, which `make test` sets:
/// `e2e/cluster-bins/csi-sanity.sh` builds it) against a driver started
/// with `extra` flags; no failure and no volume left.
async fn run_csi_sanity(env: &Env, extra: &[&str]) {
    let sanity = std::env::var_os("CSIOPS_CSI_SANITY")
        .filter(|s| !s.is_empty())
        .expect(
            "CSIOPS_CSI_SANITY is not set: run `make test`, or set it to the binary \
             e2e/cluster-bins/csi-sanity.sh prints",
        );
    let mut args = vec![
        "--nodeid=node-a",
        "--enable-attach",
        "--max-volumes-per-node=3",
    ];
    args.extend_from_slice(extra);
    let driver = env.start(&args).await;
    let params = env.dir.path().join("params.yaml");
    std::fs::write(&params, "type: fast\n").unwrap();
    let state = env.state_dir();
    let out = std::process::Command::new(sanity)
        .arg(format!("--csi.endpoint={}", env.socket().display()))
        .arg(format!("--csi.testvolumeparameters={}", params.display()))
        .arg("--csi.testnodevolumeattachlimit")
        // Target paths inside the state dir are really created and removed.
        .arg(format!("--csi.mountdir={}", state.join("mnt").display()))
        .arg(format!(
            "--csi.stagingdir={}",
            state.join("stage").display()
        ))
        .arg("--ginkgo.no-color")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("0 Failed"), "{stdout}");
    println!(
        "{}",
        stdout
            .lines()
            .filter(|l| l.contains("Passed") || l.contains("Ran "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        driver.state().unwrap().volumes.is_empty(),
        "csi-sanity cleans up"
    );
}

// ---- --node-local ----

const TOPOLOGY_KEY: &str = "topology.test.csi.csiops.dev/node";

/// Real mounts and loop devices need root; say so rather than skip.
fn require_root(test: &str) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "{test} needs root (real bind mounts and loop devices): run it as root, \
         e.g. `sudo -E cargo test -p csiops-e2e --test testdriver`"
    );
}

/// The paths of one simulated node's node-local instance under the env.
struct NodeDirs {
    base: PathBuf,
}

impl NodeDirs {
    fn new(env: &Env, node: &str) -> NodeDirs {
        NodeDirs {
            base: env.dir.path().join(node),
        }
    }
    fn state(&self) -> PathBuf {
        self.base.join("state")
    }
    fn data(&self) -> PathBuf {
        self.base.join("data")
    }
    fn socket(&self) -> PathBuf {
        self.base.join("csi.sock")
    }
}

/// Starts `bin` (the driver, or a wrapper that execs it) as the node-local
/// instance of `node`, with its own state and data dir.
async fn start_node_local_with(
    bin: &Path,
    env: &Env,
    node: &str,
    extra: &[&str],
) -> TestDriverProcess {
    let dirs = NodeDirs::new(env, node);
    std::fs::create_dir_all(&dirs.base).unwrap();
    let mut args = vec![
        format!("--nodeid={node}"),
        "--node-local".to_owned(),
        format!("--data-dir={}", dirs.data().display()),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    TestDriverProcess::start(
        bin,
        &dirs.socket(),
        &dirs.state(),
        &args,
        &dirs.base.join("driver.log"),
    )
    .await
    .unwrap()
}

async fn start_node_local(env: &Env, node: &str, extra: &[&str]) -> TestDriverProcess {
    start_node_local_with(Path::new(BIN), env, node, extra).await
}

fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume::default(),
        )),
    }
}

fn node_topology(node: &str) -> Topology {
    Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_owned(), node.to_owned())]),
    }
}

fn requiring(name: &str, requisite: &[&str], preferred: &[&str]) -> CreateVolumeRequest {
    CreateVolumeRequest {
        accessibility_requirements: Some(TopologyRequirement {
            requisite: requisite.iter().map(|n| node_topology(n)).collect(),
            preferred: preferred.iter().map(|n| node_topology(n)).collect(),
        }),
        ..create_req(name)
    }
}

fn segments(v: &csiops_proto::csi::v1::Volume) -> Vec<HashMap<String, String>> {
    v.accessible_topology
        .iter()
        .map(|t| t.segments.clone())
        .collect()
}

async fn available(csi: &CsiClient, node: Option<&str>) -> i64 {
    csi.controller()
        .get_capacity(GetCapacityRequest {
            accessible_topology: node.map(node_topology),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .available_capacity
}

fn stage_req(id: &str, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_str().unwrap().into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_str().unwrap().into(),
        target_path: target.to_str().unwrap().into(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

fn not_found_here(err: &tonic::Status, id: &str) {
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert_eq!(
        err.message(),
        format!("volume id {id} does not exist in the volumes list")
    );
}

/// A volume created by node A's instance exists for A only: B's node
/// service answers NOT_FOUND as hostpathplugin's does (what kubelet reports
/// as `MountVolume.MountDevice failed … NotFound`), its topology is A's
/// whatever was preferred, requisites without A are refused, attach to B is
/// NOT_FOUND and each instance reports capacity for its own node only.
#[tokio::test]
async fn node_local_volumes_live_on_the_node_that_created_them() {
    let env = Env::new();
    let a = start_node_local(&env, "node-a", &["--enable-attach", "--capacity=10Gi"]).await;
    let b = start_node_local(&env, "node-b", &["--capacity=10Gi"]).await;
    let (a_csi, b_csi) = (a.client().await.unwrap(), b.client().await.unwrap());

    node_a_reports_its_id_and_segment(&a_csi).await;
    let id = a_volume_is_created_on_a_whatever_was_preferred(&env, &a, &a_csi).await;
    a_requirement_without_a_is_refused(&a, &a_csi).await;
    b_has_never_heard_of_it(&env, &a, &b_csi, &id).await;
    attach_to_another_node_is_not_found(&a_csi, &id).await;
    capacity_is_per_node_and_delete_removes_the_data(&env, &a, &a_csi, &b_csi, &id).await;
    requirements_are_ignored_as_by_hostpathplugin(&env).await;
}

/// Node A's instance reports its node ID and segment.
async fn node_a_reports_its_id_and_segment(a_csi: &CsiClient) {
    let info = a_csi
        .node()
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-a");
    assert_eq!(info.accessible_topology, Some(node_topology("node-a")));
}

/// Preferred B, B or A required: the volume is created on A, accessible
/// from A only; returns its ID.
async fn a_volume_is_created_on_a_whatever_was_preferred(
    env: &Env,
    a: &TestDriverProcess,
    a_csi: &CsiClient,
) -> String {
    // Preferred B, B or A required: created on A, accessible from A only.
    let vol = a_csi
        .controller()
        .create_volume(requiring("pvc-1", &["node-b", "node-a"], &["node-b"]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(segments(&vol), [node_topology("node-a").segments]);
    let id = vol.volume_id;
    let state = a.state().unwrap();
    assert_eq!(state.volumes[&id].node_id, "node-a");
    assert_eq!(state.node_local_owner.as_deref(), Some("node-a"));
    assert!(NodeDirs::new(env, "node-a").data().join(&id).is_dir());
    id
}

/// Only B allowed: refused, nothing created.
async fn a_requirement_without_a_is_refused(a: &TestDriverProcess, a_csi: &CsiClient) {
    // Only B allowed: refused, nothing created.
    let err = a_csi
        .controller()
        .create_volume(requiring("pvc-2", &["node-b"], &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("does not include this node"),
        "{err:?}"
    );
    assert_eq!(a.state().unwrap().volumes.len(), 1);
}

/// B's node and controller services answer NOT_FOUND for A's volume, touch
/// nothing, list nothing, and its DeleteVolume leaves the volume on A.
async fn b_has_never_heard_of_it(env: &Env, a: &TestDriverProcess, b_csi: &CsiClient, id: &str) {
    // B has never heard of it.
    let elsewhere = env.dir.path().join("node-b/kubelet");
    let staging = elsewhere.join("staging");
    let target = elsewhere.join("pods/p1/vol");
    let err = b_csi
        .node()
        .node_stage_volume(stage_req(id, &staging, mount_cap()))
        .await
        .unwrap_err();
    not_found_here(&err, id);
    let err = b_csi
        .node()
        .node_publish_volume(publish_req(id, &staging, &target, mount_cap()))
        .await
        .unwrap_err();
    not_found_here(&err, id);
    let err = b_csi
        .node()
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.to_string(),
            volume_path: target.to_str().unwrap().into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    not_found_here(&err, id);
    let err = b_csi
        .node()
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.to_string(),
            target_path: target.to_str().unwrap().into(),
        })
        .await
        .unwrap_err();
    not_found_here(&err, id);
    let err = b_csi
        .node()
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.to_string(),
            staging_target_path: staging.to_str().unwrap().into(),
        })
        .await
        .unwrap_err();
    not_found_here(&err, id);
    let err = b_csi
        .controller()
        .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
            volume_id: id.to_string(),
            volume_capabilities: vec![mount_cap()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    not_found_here(&err, id);
    assert!(!staging.exists() && !target.exists(), "B touched nothing");
    let listed = b_csi
        .controller()
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.entries.is_empty());
    // DeleteVolume of a volume B does not know is OK (idempotent, as
    // hostpathplugin): a central controller "deletes" a node's volume and
    // it stays on the node.
    b_csi
        .controller()
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.to_string(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap();
    assert!(a.state().unwrap().volumes.contains_key(id));
}

/// Attach to and detach from another node: NOT_FOUND before the volume is
/// looked at; to and from A: OK.
async fn attach_to_another_node_is_not_found(a_csi: &CsiClient, id: &str) {
    // Attach to another node: NOT_FOUND before the volume is looked at.
    let publish = |node: &str| ControllerPublishVolumeRequest {
        volume_id: id.to_string(),
        node_id: node.into(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    };
    let err = a_csi
        .controller()
        .controller_publish_volume(publish("node-b"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("node ID node-b"), "{err:?}");
    a_csi
        .controller()
        .controller_publish_volume(publish("node-a"))
        .await
        .unwrap();
    let unpublish = |node: &str| ControllerUnpublishVolumeRequest {
        volume_id: id.to_string(),
        node_id: node.into(),
        secrets: HashMap::new(),
    };
    let err = a_csi
        .controller()
        .controller_unpublish_volume(unpublish("node-b"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    a_csi
        .controller()
        .controller_unpublish_volume(unpublish("node-a"))
        .await
        .unwrap();
}

/// Capacity is per node (1 GiB used on A, none on B), and deleting the
/// volume on A removes its data.
async fn capacity_is_per_node_and_delete_removes_the_data(
    env: &Env,
    a: &TestDriverProcess,
    a_csi: &CsiClient,
    b_csi: &CsiClient,
    id: &str,
) {
    // Capacity per node: 1 GiB used on A, none on B.
    assert_eq!(available(a_csi, None).await, 9 << 30);
    assert_eq!(available(a_csi, Some("node-a")).await, 9 << 30);
    assert_eq!(available(a_csi, Some("node-b")).await, 0);
    assert_eq!(available(b_csi, Some("node-b")).await, 10 << 30);
    assert_eq!(available(b_csi, Some("node-a")).await, 0);

    a_csi
        .controller()
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.to_string(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap();
    assert!(a.state().unwrap().volumes.is_empty());
    assert!(!NodeDirs::new(env, "node-a").data().join(id).exists());
}

/// hostpathplugin's own behaviour: requirements are not read at all.
async fn requirements_are_ignored_as_by_hostpathplugin(env: &Env) {
    // hostpathplugin's own behaviour: requirements are not read at all.
    let c = start_node_local(env, "node-c", &["--ignore-accessibility-requirements"]).await;
    let vol = c
        .client()
        .await
        .unwrap()
        .controller()
        .create_volume(requiring("pvc-3", &["node-b"], &["node-b"]))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(segments(&vol), [node_topology("node-c").segments]);
}

/// A second process on a node-local state dir refuses to start while the
/// owner runs, whatever its mode; after the owner is gone the dir still
/// refuses another node, and the owner's restart (even after `kill -9`)
/// finds its volumes.
#[tokio::test]
async fn node_local_state_dir_belongs_to_one_process_and_node() {
    let env = Env::new();
    let mut a = start_node_local(&env, "node-a", &[]).await;
    let id = create(&a.client().await.unwrap(), "pvc-1").await.unwrap();
    let dirs = NodeDirs::new(&env, "node-a");

    let second = |node: &str, node_local: bool| {
        let mut cmd = std::process::Command::new(BIN);
        cmd.arg(format!(
            "--endpoint=unix://{}",
            env.dir.path().join("second.sock").display()
        ))
        .arg(format!("--state-dir={}", dirs.state().display()))
        .arg(format!("--nodeid={node}"));
        if node_local {
            cmd.arg("--node-local");
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = second("node-a", true);
    assert!(
        stderr.contains("is in use by another node-local csi-test-driver (node=node-a pid="),
        "{stderr}"
    );
    let stderr = second("ctrl-0", false);
    assert!(
        stderr.contains("belongs to the node-local instance of node node-a"),
        "{stderr}"
    );

    a.kill9();
    let stderr = second("node-b", true);
    assert!(
        stderr.contains("holds the state of node(s) [\"node-a\"], not of node-b"),
        "{stderr}"
    );
    // kill -9 released the lock: the owner starts again with its volume.
    a.restart().await.unwrap();
    let csi = a.client().await.unwrap();
    assert_eq!(create(&csi, "pvc-1").await.unwrap(), id);
    let state = a.state().unwrap();
    assert_eq!(state.nodes.iter().collect::<Vec<_>>(), ["node-a"]);
}

/// With root and `--data-dir`, a node-local block volume is a sparse file
/// with a real loop device from CreateVolume on (as hostpathplugin's), is
/// published as that block device, keeps it across unstage, and both are
/// gone after DeleteVolume.
#[tokio::test]
async fn node_local_block_volume_has_a_loop_device_from_create_to_delete() {
    require_root("node_local_block_volume_has_a_loop_device_from_create_to_delete");
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::FileTypeExt;
    let env = Env::new();
    let guard = LeftoverGuard::new(env.dir.path());
    let a = start_node_local(&env, "node-a", &[]).await;
    let csi = a.client().await.unwrap();

    let mut req = create_req("pvc-block");
    req.volume_capabilities = vec![block_cap()];
    req.capacity_range = Some(csiops_proto::csi::v1::CapacityRange {
        required_bytes: 64 << 20,
        limit_bytes: 0,
    });
    let id = csi
        .controller()
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let image = NodeDirs::new(&env, "node-a")
        .data()
        .canonicalize()
        .unwrap()
        .join(format!("{id}.img"));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 << 20);
    // The loop device exists before any node call.
    let loops = leftovers_under(env.dir.path()).loops;
    assert_eq!(loops.len(), 1, "{loops:?}");
    let (device, backing) = loops[0].clone();
    assert_eq!(backing, image);

    let kubelet = env.dir.path().join("kubelet");
    let staging = kubelet.join("plugins/staging").join(&id);
    std::fs::create_dir_all(&staging).unwrap();
    let target = kubelet.join("pods/p1/volumeDevices/dev");
    csi.node()
        .node_stage_volume(stage_req(&id, &staging, block_cap()))
        .await
        .unwrap();
    csi.node()
        .node_publish_volume(publish_req(&id, &staging, &target, block_cap()))
        .await
        .unwrap();
    let meta = std::fs::metadata(&target).unwrap();
    assert!(meta.file_type().is_block_device(), "{meta:?}");
    assert_eq!(
        std::os::unix::fs::MetadataExt::rdev(&meta),
        std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(&device).unwrap())
    );

    // Data written to the published device lands in the backing file.
    let text = b"node-local block data";
    {
        let mut dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&target)
            .unwrap();
        dev.write_all(text).unwrap();
        dev.sync_all().unwrap();
        let mut back = vec![0u8; text.len()];
        dev.seek(SeekFrom::Start(0)).unwrap();
        dev.read_exact(&mut back).unwrap();
        assert_eq!(back, text);
    }
    let mut head = vec![0u8; text.len()];
    std::fs::File::open(&image)
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert_eq!(head, text);
    let stats = csi
        .node()
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.to_str().unwrap().into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.usage[0].total, 64 << 20);

    csi.node()
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.to_str().unwrap().into(),
        })
        .await
        .unwrap();
    csi.node()
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.to_str().unwrap().into(),
        })
        .await
        .unwrap();
    assert!(!target.exists());
    let left = leftovers_under(env.dir.path());
    assert!(left.mounts.is_empty(), "{left:?}");
    assert_eq!(
        left.loops, loops,
        "the loop device stays until DeleteVolume"
    );

    csi.controller()
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap();
    assert!(!image.exists(), "backing file removed");
    let left = leftovers_under(env.dir.path());
    assert!(left.is_empty(), "{left:?}");
    assert!(
        !std::fs::read_dir("/sys/block")
            .unwrap()
            .filter_map(
                |e| std::fs::read_to_string(e.unwrap().path().join("loop/backing_file")).ok()
            )
            .any(|b| b.contains(&id)),
        "no loop device names the volume"
    );
    assert!(guard.clean().is_empty());
}

/// With root and `--data-dir`, a node-local filesystem volume is a
/// directory, staged and published with bind mounts; what a pod writes is
/// in the volume and is there again at the next publish.
#[tokio::test]
async fn node_local_filesystem_volume_is_bind_mounted_and_keeps_its_data() {
    require_root("node_local_filesystem_volume_is_bind_mounted_and_keeps_its_data");
    let env = Env::new();
    let guard = LeftoverGuard::new(env.dir.path());
    let a = start_node_local(&env, "node-a", &[]).await;
    let csi = a.client().await.unwrap();
    let id = create(&csi, "pvc-fs").await.unwrap();
    let data = NodeDirs::new(&env, "node-a").data().join(&id);
    assert!(data.is_dir());

    let kubelet = env.dir.path().join("kubelet");
    let staging = kubelet.join("plugins/staging").join(&id);
    let publish =
        |pod: &str| publish_req(&id, &staging, &kubelet.join(pod).join("vol"), mount_cap());
    let unpublish = |pod: &str| NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: kubelet.join(pod).join("vol").to_str().unwrap().into(),
    };
    let unstage = NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.to_str().unwrap().into(),
    };

    csi.node()
        .node_stage_volume(stage_req(&id, &staging, mount_cap()))
        .await
        .unwrap();
    csi.node().node_publish_volume(publish("p1")).await.unwrap();
    let target = kubelet.join("p1/vol");
    let mounted = leftovers_under(env.dir.path()).mounts;
    let canon = |p: &Path| p.canonicalize().unwrap();
    assert!(mounted.contains(&canon(&staging)), "{mounted:?}");
    assert!(mounted.contains(&canon(&target)), "{mounted:?}");
    std::fs::write(target.join("hello.txt"), "round trip").unwrap();
    assert_eq!(
        std::fs::read_to_string(data.join("hello.txt")).unwrap(),
        "round trip"
    );
    let stats = csi
        .node()
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.to_str().unwrap().into(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        stats.usage.len() == 2 && stats.usage[0].total > 0,
        "{stats:?}"
    );

    csi.node()
        .node_unpublish_volume(unpublish("p1"))
        .await
        .unwrap();
    csi.node()
        .node_unstage_volume(unstage.clone())
        .await
        .unwrap();
    assert!(!target.exists());
    assert!(leftovers_under(env.dir.path()).mounts.is_empty());

    // Another pod later: the data is there.
    csi.node()
        .node_stage_volume(stage_req(&id, &staging, mount_cap()))
        .await
        .unwrap();
    csi.node().node_publish_volume(publish("p2")).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(kubelet.join("p2/vol/hello.txt")).unwrap(),
        "round trip"
    );
    csi.node()
        .node_unpublish_volume(unpublish("p2"))
        .await
        .unwrap();
    csi.node().node_unstage_volume(unstage).await.unwrap();

    csi.controller()
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap();
    assert!(!data.exists());
    assert!(guard.clean().is_empty());
}

/// The central deployment of a node-local driver, reproduced: a
/// "controller" whose `/dev` is an empty tmpfs (an unprivileged pod) fails
/// CreateVolume for block exactly as hostpathplugin does (`failed to attach
/// device …: losetup -f --show … failed`, UNKNOWN) and leaves no file; it
/// creates filesystem volumes, which the node's own instance then does not
/// know (NOT_FOUND at NodeStageVolume: kubelet's MountDevice failure).
#[tokio::test]
async fn node_local_central_controller_fails_as_hostpath_does() {
    require_root("node_local_central_controller_fails_as_hostpath_does");
    let env = Env::new();
    let guard = LeftoverGuard::new(env.dir.path());
    // A private mount namespace with an empty /dev, then the driver.
    let wrapper = env.dir.path().join("no-dev.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec unshare --mount --propagation private -- /bin/sh -c \
             'mount -t tmpfs -o size=64k tmpfs /dev && exec \"$0\" \"$@\"' {BIN} \"$@\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let ctrl = start_node_local_with(&wrapper, &env, "ctrl-node", &[]).await;
    let csi = ctrl.client().await.unwrap();

    let mut req = create_req("pvc-block");
    req.volume_capabilities = vec![block_cap()];
    let err = csi.controller().create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::Unknown, "{err:?}");
    let data = NodeDirs::new(&env, "ctrl-node").data();
    let data = data.canonicalize().unwrap();
    assert!(
        err.message()
            .starts_with(&format!("failed to attach device {}/", data.display())),
        "{err:?}"
    );
    assert!(err.message().contains(".img failed: "), "{err:?}");
    assert!(err.message().contains(": losetup -f --show "), "{err:?}");
    assert!(ctrl.state().unwrap().volumes.is_empty());
    let files: Vec<_> = std::fs::read_dir(&data).unwrap().collect();
    assert!(files.is_empty(), "the backing file is removed: {files:?}");

    // Filesystem volumes need no /dev: created, then unknown on the node.
    let id = create(&csi, "pvc-fs").await.unwrap();
    let node = start_node_local(&env, "node-1", &[]).await;
    let staging = env.dir.path().join("kubelet/staging");
    let err = node
        .client()
        .await
        .unwrap()
        .node()
        .node_stage_volume(stage_req(&id, &staging, mount_cap()))
        .await
        .unwrap_err();
    not_found_here(&err, &id);
    assert!(guard.clean().is_empty());
}

/// Upstream csi-sanity against a node-local instance with real volumes
/// (loop devices at CreateVolume, bind mounts; GET_VOLUME_STATS advertised).
#[tokio::test]
async fn csi_sanity_passes_node_local() {
    require_root("csi_sanity_passes_node_local");
    let env = Env::new();
    let guard = LeftoverGuard::new(env.dir.path());
    let data = env.dir.path().join("data");
    run_csi_sanity(
        &env,
        &["--node-local", &format!("--data-dir={}", data.display())],
    )
    .await;
    let left = guard.clean();
    assert!(left.is_empty(), "left behind: {left:?}");
}
