//! A CSI controller service (and a node service, for the registrar) in the
//! test process, for tests of the syncs against a mocked API server: every
//! call is noted in the same [`Log`](csiops_runtime::testing::Log) as the
//! API requests (`CSI <method>`), so a test sees both in one sequence.

use std::sync::Arc;
use std::time::Duration;

use csiops_proto::csi::v1::controller_server::{Controller, ControllerServer};
use csiops_proto::csi::v1::node_server::{Node, NodeServer};
use csiops_proto::csi::v1::*;
use csiops_runtime::testing::Log;
use tonic::{Request, Response, Status};

use super::driver::Driver;
use super::metrics::Metrics;

type Answer<T> = Arc<dyn Fn() -> Result<T, Status> + Send + Sync>;

/// What the fake driver answers.
#[derive(Clone)]
pub struct FakeController {
    pub log: Log,
    pub publish: Answer<ControllerPublishVolumeResponse>,
    pub create: Answer<CreateVolumeResponse>,
    /// GetCapacity (Unimplemented unless a test says otherwise).
    pub capacity: Answer<GetCapacityResponse>,
}

impl FakeController {
    /// Publishes and creates succeed (the volume: `vol-1`, 1 GiB).
    pub fn new(log: Log) -> Self {
        FakeController {
            log,
            publish: Arc::new(|| Ok(ControllerPublishVolumeResponse::default())),
            create: Arc::new(|| {
                Ok(CreateVolumeResponse {
                    volume: Some(Volume {
                        volume_id: "vol-1".into(),
                        capacity_bytes: 1 << 30,
                        ..Default::default()
                    }),
                })
            }),
            capacity: Arc::new(|| Err(Status::unimplemented("GetCapacity"))),
        }
    }

    /// Serves on a socket in `dir` and connects a [`Driver`] to it.
    pub async fn serve(self, dir: &std::path::Path) -> Driver {
        let path = dir.join("csi.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind the fake driver");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ControllerServer::new(self))
                .serve_with_incoming(csiops_proto::authority::incoming(listener)),
        );
        Driver::connect(
            path.to_str().expect("a UTF-8 path"),
            Duration::from_secs(5),
            Arc::new(Metrics::new()),
        )
        .await
        .expect("connect to the fake driver")
    }
}

/// The RPCs no test calls, written as `#[async_trait]` expands an `async
/// fn` (it does not see into macros).
macro_rules! unimplemented_rpcs {
    ($($name:ident($request:ty) -> $response:ty;)*) => {
        $(
            fn $name<'life0, 'async_trait>(
                &'life0 self,
                _: Request<$request>,
            ) -> std::pin::Pin<
                Box<
                    dyn std::future::Future<Output = Result<Response<$response>, Status>>
                        + Send
                        + 'async_trait,
                >,
            >
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async { Err(Status::unimplemented(stringify!($name))) })
            }
        )*
    };
}

#[tonic::async_trait]
impl Controller for FakeController {
    async fn controller_publish_volume(
        &self,
        _: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        self.log.note("CSI", "ControllerPublishVolume");
        (self.publish)().map(Response::new)
    }

    async fn create_volume(
        &self,
        _: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        self.log.note("CSI", "CreateVolume");
        (self.create)().map(Response::new)
    }

    async fn delete_volume(
        &self,
        _: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.log.note("CSI", "DeleteVolume");
        Ok(Response::new(DeleteVolumeResponse::default()))
    }

    async fn get_capacity(
        &self,
        _: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        self.log.note("CSI", "GetCapacity");
        (self.capacity)().map(Response::new)
    }

    unimplemented_rpcs! {
        controller_unpublish_volume(ControllerUnpublishVolumeRequest) -> ControllerUnpublishVolumeResponse;
        validate_volume_capabilities(ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse;
        list_volumes(ListVolumesRequest) -> ListVolumesResponse;
        controller_get_capabilities(ControllerGetCapabilitiesRequest) -> ControllerGetCapabilitiesResponse;
        create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse;
        delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse;
        list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse;
        get_snapshot(GetSnapshotRequest) -> GetSnapshotResponse;
        controller_expand_volume(ControllerExpandVolumeRequest) -> ControllerExpandVolumeResponse;
        controller_get_volume(ControllerGetVolumeRequest) -> ControllerGetVolumeResponse;
        controller_modify_volume(ControllerModifyVolumeRequest) -> ControllerModifyVolumeResponse;
    }
}

/// What the fake node service answers to NodeGetInfo: `Ok` answers, `Err`
/// fails; a test swaps it while the service runs.
pub type NodeInfoAnswer = Arc<std::sync::Mutex<Result<NodeGetInfoResponse, Status>>>;

/// A CSI node service that answers only NodeGetInfo, with what `info`
/// holds at the time of the call.
#[derive(Clone)]
pub struct FakeNode {
    pub log: Log,
    pub info: NodeInfoAnswer,
}

impl FakeNode {
    /// Serves on `dir/csi.sock` and connects a [`Driver`] to it whose
    /// calls time out after `timeout` (the registrar's `--timeout`).
    pub async fn serve(self, dir: &std::path::Path, timeout: Duration) -> Driver {
        let path = dir.join("csi.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind the fake driver");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NodeServer::new(self))
                .serve_with_incoming(csiops_proto::authority::incoming(listener)),
        );
        Driver::connect(
            path.to_str().expect("a UTF-8 path"),
            timeout,
            Arc::new(Metrics::new()),
        )
        .await
        .expect("connect to the fake driver")
    }
}

#[tonic::async_trait]
impl Node for FakeNode {
    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        self.log.note("CSI", "NodeGetInfo");
        let answer = self
            .info
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        answer.map(Response::new)
    }

    unimplemented_rpcs! {
        node_stage_volume(NodeStageVolumeRequest) -> NodeStageVolumeResponse;
        node_unstage_volume(NodeUnstageVolumeRequest) -> NodeUnstageVolumeResponse;
        node_publish_volume(NodePublishVolumeRequest) -> NodePublishVolumeResponse;
        node_unpublish_volume(NodeUnpublishVolumeRequest) -> NodeUnpublishVolumeResponse;
        node_get_volume_stats(NodeGetVolumeStatsRequest) -> NodeGetVolumeStatsResponse;
        node_expand_volume(NodeExpandVolumeRequest) -> NodeExpandVolumeResponse;
        node_get_capabilities(NodeGetCapabilitiesRequest) -> NodeGetCapabilitiesResponse;
    }
}
