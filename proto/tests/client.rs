//! The unix-socket client against an in-process tonic server.

use std::{collections::HashMap, path::Path, time::Duration};

use csiops_proto::{
    client::{self, ConnectError, CsiClient},
    csi::v1::{
        identity_client::IdentityClient,
        identity_server::{Identity, IdentityServer},
        plugin_capability, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse,
        GetPluginInfoRequest, GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
    },
    pluginregistration::{
        registration_client::RegistrationClient,
        registration_server::{Registration, RegistrationServer},
        InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    },
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{transport::Server, Code, Request, Response, Status};

/// Identity whose Probe takes `probe_delay`.
struct TestIdentity {
    probe_delay: Duration,
}

#[tonic::async_trait]
impl Identity for TestIdentity {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: "test.csi.csiops.dev".into(),
            vendor_version: "0.0.1".into(),
            manifest: HashMap::from([("commit".into(), "abc".into())]),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let service = plugin_capability::Service {
            r#type: plugin_capability::service::Type::ControllerService as i32,
        };
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![PluginCapability {
                r#type: Some(plugin_capability::Type::Service(service)),
            }],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        tokio::time::sleep(self.probe_delay).await;
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

/// Serves `TestIdentity` on `dir/csi.sock`; returns the socket path.
fn serve_identity(dir: &Path, probe_delay: Duration) -> String {
    let path = dir.join("csi.sock");
    let listener = UnixListener::bind(&path).expect("bind unix socket");
    tokio::spawn(
        Server::builder()
            .add_service(IdentityServer::new(TestIdentity { probe_delay }))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    path.to_str().unwrap().to_owned()
}

const TIMEOUT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn get_plugin_info_over_unix_socket_in_every_address_form() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_identity(dir.path(), Duration::ZERO);

    for address in [
        format!("unix://{path}"),
        format!("unix:{path}"),
        path.clone(),
    ] {
        let channel = client::connect(&address, TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{address}: {e}"));
        let info = IdentityClient::new(channel)
            .get_plugin_info(client::with_timeout(GetPluginInfoRequest {}, TIMEOUT))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, "test.csi.csiops.dev", "{address}");
        assert_eq!(info.vendor_version, "0.0.1");
        assert_eq!(info.manifest["commit"], "abc");
    }
}

#[tokio::test]
async fn csi_client_accessors_and_default_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_identity(dir.path(), Duration::from_millis(300));
    let csi = CsiClient::connect(&format!("unix://{path}"), TIMEOUT)
        .await
        .unwrap();

    let caps = csi
        .identity()
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 1);

    // Probe takes 300 ms: fine with the 5 s default ...
    let probe = csi.identity().probe(ProbeRequest {}).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));

    // ... too slow for a 50 ms default ...
    let impatient = CsiClient::new(csi.channel().clone(), Duration::from_millis(50));
    let status = impatient
        .identity()
        .probe(ProbeRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");

    // ... and a per-call deadline overrides the default.
    let probe = impatient
        .identity()
        .probe(client::with_timeout(ProbeRequest {}, TIMEOUT))
        .await
        .unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));

    // The controller/node clients exist on the same channel; this driver
    // does not serve them.
    let status = csi
        .node()
        .node_get_info(csiops_proto::csi::v1::NodeGetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    let _ = csi.controller();
    let _ = csi.group_controller();
}

#[tokio::test]
async fn slow_probe_exceeds_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = serve_identity(dir.path(), Duration::from_secs(30));
    let channel = client::connect(&format!("unix://{path}"), TIMEOUT)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let status = IdentityClient::new(channel.clone())
        .probe(client::with_timeout(
            ProbeRequest {},
            Duration::from_millis(200),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // The channel is still usable afterwards.
    let info = IdentityClient::new(channel)
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap();
    assert_eq!(info.into_inner().name, "test.csi.csiops.dev");
}

#[tokio::test]
async fn missing_socket_gives_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let address = format!("unix://{}", path.display());
    let err = client::connect(&address, TIMEOUT).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot connect to CSI driver at {}: No such file or directory",
            path.display()
        )
    );
    match &err {
        ConnectError::Io { error, .. } => {
            assert_eq!(error.kind(), std::io::ErrorKind::NotFound)
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(err.path(), Some(path.as_path()));
}

#[tokio::test]
async fn socket_without_listener_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dead.sock");
    // A socket file nobody listens on any more.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let err = client::connect(path.to_str().unwrap(), TIMEOUT)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "cannot connect to CSI driver at {}: Connection refused",
            path.display()
        )
    );
}

#[tokio::test]
async fn invalid_addresses_are_rejected() {
    for (address, reason) in [
        ("tcp://127.0.0.1:10000", "only unix sockets are supported"),
        ("unix://relative/csi.sock", "unix:// needs an absolute path"),
        ("", "empty socket path"),
        ("unix:", "empty socket path"),
    ] {
        let err = client::connect(address, TIMEOUT).await.unwrap_err();
        assert!(
            matches!(err, ConnectError::InvalidAddress { .. }),
            "{address}: {err:?}"
        );
        assert!(err.to_string().contains(reason), "{address}: {err}");
        assert_eq!(err.path(), None);
    }
    assert_eq!(
        client::socket_path("unix:///csi/csi.sock").unwrap(),
        Path::new("/csi/csi.sock")
    );
    assert_eq!(
        client::socket_path("unix:/csi/csi.sock").unwrap(),
        Path::new("/csi/csi.sock")
    );
    assert_eq!(
        client::socket_path("unix:csi.sock").unwrap(),
        Path::new("csi.sock")
    );
    assert_eq!(
        client::socket_path("/csi/csi.sock").unwrap(),
        Path::new("/csi/csi.sock")
    );
}

/// Serves `TestIdentity` on `path` from its own runtime in a thread, so that
/// dropping the returned guard really kills the server and its connections
/// (like a driver container restart).
struct DriverProcess {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DriverProcess {
    fn start(path: &Path) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async move {
                let listener = UnixListener::from_std(listener).unwrap();
                tokio::spawn(
                    Server::builder()
                        .add_service(IdentityServer::new(TestIdentity {
                            probe_delay: Duration::ZERO,
                        }))
                        .serve_with_incoming(UnixListenerStream::new(listener)),
                );
                let _ = tokio::task::spawn_blocking(move || stopped.recv()).await;
            });
            runtime.shutdown_timeout(Duration::from_secs(1));
        });
        Self {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

#[tokio::test]
async fn channel_reconnects_after_driver_restart_with_clear_errors_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let driver = DriverProcess::start(&path);
    let channel = client::connect(path.to_str().unwrap(), TIMEOUT)
        .await
        .unwrap();
    assert_eq!(channel.path(), path);
    let mut identity = IdentityClient::new(channel);
    identity.probe(ProbeRequest {}).await.unwrap();

    // Driver gone, socket removed: calls fail fast with Unavailable and say
    // where and why. The first call may still hit the dead connection;
    // later ones fail to dial.
    drop(driver);
    std::fs::remove_file(&path).unwrap();
    let lost = format!("connection to CSI driver at {} failed: ", path.display());
    let gone = format!(
        "cannot connect to CSI driver at {}: No such file or directory",
        path.display()
    );
    let mut messages = Vec::new();
    for _ in 0..100 {
        let status = identity.probe(ProbeRequest {}).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(
            status.message() == gone || status.message().starts_with(&lost),
            "{status:?}"
        );
        messages.push(status.message().to_owned());
        if status.message() == gone {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(messages.last(), Some(&gone), "{messages:#?}");

    // Driver back: the same channel dials again on the next call.
    let _driver = DriverProcess::start(&path);
    let probe = identity.probe(ProbeRequest {}).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
}

struct TestRegistration;

#[tonic::async_trait]
impl Registration for TestRegistration {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".into(),
            name: "test.csi.csiops.dev".into(),
            endpoint: "/var/lib/kubelet/plugins/test/csi.sock".into(),
            supported_versions: vec!["1.0.0".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            Ok(Response::new(RegistrationStatusResponse {}))
        } else {
            Err(Status::failed_precondition(status.error))
        }
    }
}

#[tokio::test]
async fn plugin_registration_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test.csi.csiops.dev-reg.sock");
    let listener = UnixListener::bind(&path).unwrap();
    tokio::spawn(
        Server::builder()
            .add_service(RegistrationServer::new(TestRegistration))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let channel = client::connect(path.to_str().unwrap(), TIMEOUT)
        .await
        .unwrap();
    let mut kubelet = RegistrationClient::new(channel);
    let info = kubelet.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.supported_versions, ["1.0.0"]);
    kubelet
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    let status = kubelet
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "version mismatch".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.message(), "version mismatch");
}
