//! Admin HTTP server: Prometheus metrics and Kubernetes probes.
//!
//! It runs on its own port, separate from anything user-facing, and serves:
//! - `GET /metrics`: [`Metrics`] in the OpenMetrics text format;
//! - `GET /healthz`: liveness, `200 ok` as long as the process serves HTTP;
//! - `GET /readyz`: readiness, `200 ok` when [`AdminState::ready`] is true,
//!   `503 not ready` otherwise.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Content type of `/metrics`; Prometheus uses it to pick the OpenMetrics
/// parser, which understands the `# UNIT` and `# EOF` lines we emit. One
/// definition, shared with the sidecars' `/metrics`.
pub use csiops_sidecars::common::metrics::OPENMETRICS_CONTENT_TYPE;

/// What the admin handlers read. Both fields are shared with the rest of the
/// process, which updates them; the server only reads.
#[derive(Clone, Debug)]
pub struct AdminState {
    /// Metrics rendered on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Readiness reported on `/readyz`. The caller decides what "ready" means
    /// (leader with a synced controller, or a healthy standby) and flips it.
    pub ready: Arc<AtomicBool>,
}

impl AdminState {
    /// Bundles the shared metrics and readiness flag for the server.
    pub fn new(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Self {
        Self { metrics, ready }
    }
}

/// Why the admin server stopped with an error. Both are fatal for the admin
/// port only; the caller decides whether that is fatal for the process (it
/// should be: without probes, Kubernetes cannot manage the pod).
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The listen address could not be bound (in use, or not permitted).
    #[error("cannot bind admin server to {addr}")]
    Bind {
        /// The address we tried.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The server failed while running.
    #[error("admin server failed")]
    Serve(#[source] std::io::Error),
}

/// Builds the admin routes. Public so that tests and embedders can mount or
/// drive it without opening a socket.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Binds `addr` and serves the admin routes until `shutdown` completes, then
/// lets in-flight requests finish. Returns once the server has stopped.
pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdminError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind { addr, source })?;
    serve_on(listener, state, shutdown).await
}

/// Like [`serve`], on an already bound listener. Useful when the caller needs
/// the actual port (e.g. after binding port 0) or binds the socket itself.
pub async fn serve_on(
    listener: TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AdminError> {
    match listener.local_addr() {
        Ok(local) => tracing::info!(addr = %local, "admin server listening"),
        Err(error) => tracing::warn!(%error, "admin server listening on unknown address"),
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(AdminError::Serve)?;
    tracing::info!("admin server stopped");
    Ok(())
}

async fn metrics(State(state): State<AdminState>) -> Response {
    match state.metrics.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            body,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "failed to encode metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "failed to encode metrics",
            )
                .into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use tokio::sync::oneshot;

    struct Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
    }

    /// Minimal HTTP/1.1 client: one request per connection, `Connection: close`.
    /// Blocking std I/O on the blocking pool, because tokio's `io-util` feature
    /// (async read/write helpers) is not enabled in this crate.
    async fn get(addr: SocketAddr, path: &str) -> Reply {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let raw = tokio::task::spawn_blocking(move || {
            let mut stream = std::net::TcpStream::connect(addr).unwrap();
            stream
                .set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            stream.write_all(request.as_bytes()).unwrap();
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).unwrap();
            raw
        })
        .await
        .unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let mut lines = head.lines();
        let status = lines
            .next()
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_owned(), v.trim().to_owned())
            })
            .collect();
        Reply {
            status,
            headers,
            body: body.to_owned(),
        }
    }

    struct Server {
        addr: SocketAddr,
        stop: Option<oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<Result<(), AdminError>>,
    }

    async fn start(state: AdminState) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_on(listener, state, async move {
            let _ = stopped.await;
        }));
        Server {
            addr,
            stop: Some(stop),
            task,
        }
    }

    impl Server {
        async fn shutdown(mut self) {
            if let Some(stop) = self.stop.take() {
                stop.send(()).unwrap();
            }
            let result = tokio::time::timeout(std::time::Duration::from_secs(5), self.task)
                .await
                .expect("server did not shut down")
                .unwrap();
            result.unwrap();
        }
    }

    fn state() -> (AdminState, Arc<Metrics>, Arc<AtomicBool>) {
        let metrics = Arc::new(Metrics::new());
        let ready = Arc::new(AtomicBool::new(false));
        (
            AdminState::new(metrics.clone(), ready.clone()),
            metrics,
            ready,
        )
    }

    #[tokio::test]
    async fn metrics_endpoint_serves_openmetrics() {
        let (state, metrics, _) = state();
        metrics.reconcile_failed("conflict");
        let server = start(state).await;

        let reply = get(server.addr, "/metrics").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("content-type"), Some(OPENMETRICS_CONTENT_TYPE));
        assert!(
            reply
                .body
                .contains("csiops_reconcile_errors_total{kind=\"conflict\"} 1"),
            "{}",
            reply.body
        );
        assert!(reply.body.ends_with("# EOF\n"));

        server.shutdown().await;
    }

    #[tokio::test]
    async fn healthz_is_always_ok() {
        let (state, _, _) = state();
        let server = start(state).await;

        let reply = get(server.addr, "/healthz").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "ok");

        server.shutdown().await;
    }

    #[tokio::test]
    async fn readyz_follows_the_flag() {
        let (state, _, ready) = state();
        let server = start(state).await;

        let reply = get(server.addr, "/readyz").await;
        assert_eq!(reply.status, 503);
        assert_eq!(reply.body, "not ready");

        ready.store(true, Ordering::Release);
        let reply = get(server.addr, "/readyz").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "ok");

        ready.store(false, Ordering::Release);
        let reply = get(server.addr, "/readyz").await;
        assert_eq!(reply.status, 503);

        server.shutdown().await;
    }

    #[tokio::test]
    async fn unknown_path_is_404() {
        let (state, _, _) = state();
        let server = start(state).await;
        assert_eq!(get(server.addr, "/nope").await.status, 404);
        server.shutdown().await;
    }

    #[tokio::test]
    async fn serve_reports_bind_errors() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let (state, _, _) = state();
        let err = serve(addr, state, std::future::pending())
            .await
            .unwrap_err();
        assert!(matches!(err, AdminError::Bind { addr: a, .. } if a == addr));
    }
}
