//! `/healthz` of the registrar, as upstream's: the registration socket is
//! there and answers GetInfo with this driver's name — what kubelet's plugin
//! watcher needs of it. The driver itself is not asked (its health is the
//! liveness probe's business): restarting the registrar because the driver
//! is slow would only deregister the driver from kubelet.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use csiops_proto::pluginregistration::registration_client::RegistrationClient;
use csiops_proto::pluginregistration::InfoRequest;
use csiops_runtime::admin::HealthCheck;
use csiops_runtime::chain;

/// The check of `socket` serving `driver`; each call dials anew (as
/// upstream) and waits at most `timeout` (`--timeout`).
pub fn check(socket: PathBuf, driver: String, timeout: Duration) -> HealthCheck {
    Arc::new(move || {
        let (socket, driver) = (socket.clone(), driver.clone());
        Box::pin(async move { probe(&socket, &driver, timeout).await })
    })
}

async fn probe(socket: &std::path::Path, driver: &str, timeout: Duration) -> Result<(), String> {
    if !socket.exists() {
        return Err(format!(
            "registration socket {} does not exist",
            socket.display()
        ));
    }
    let channel = csiops_proto::client::connect(&socket.to_string_lossy(), timeout)
        .await
        .map_err(|e| format!("cannot connect to the registration socket: {}", chain(&e)))?;
    let mut client = RegistrationClient::new(channel);
    let info = tokio::time::timeout(timeout, client.get_info(InfoRequest {}))
        .await
        .map_err(|_| format!("GetInfo on the registration socket timed out after {timeout:?}"))?
        .map_err(|s| format!("GetInfo on the registration socket failed: {}", s.message()))?
        .into_inner();
    if info.name != driver {
        return Err(format!(
            "the registration socket serves {:?}, not {driver:?}",
            info.name
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registrar::server::{RegistrationService, Verdict};
    use csiops_proto::pluginregistration::registration_server::RegistrationServer;

    #[tokio::test]
    async fn healthy_only_while_the_socket_answers_getinfo_for_the_driver() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d-reg.sock");
        let t = Duration::from_secs(2);
        let err = probe(&path, "d", t).await.expect_err("no socket");
        assert!(err.contains("does not exist"), "{err}");

        let (listener, _) = crate::registrar::socket::bind_private(&path).expect("bind");
        let (verdict, _) = tokio::sync::watch::channel(Verdict::Pending);
        let service = RegistrationService {
            driver_name: "d".into(),
            endpoint: "/k/csi.sock".into(),
            verdict,
        };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(service))
                .serve_with_incoming(csiops_proto::authority::incoming(listener)),
        );
        assert_eq!(probe(&path, "d", t).await, Ok(()));
        let err = probe(&path, "other", t).await.expect_err("wrong name");
        assert!(err.contains("serves \"d\""), "{err}");
        server.abort();
        let _ = server.await;
        let err = probe(&path, "d", t).await.expect_err("nobody serves");
        assert!(err.contains("registration socket"), "{err}");
    }
}
