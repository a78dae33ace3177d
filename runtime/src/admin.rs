//! The admin HTTP server of every csiops process: metrics and probes, on a
//! port of its own.
//!
//! - `GET <metrics path>` (`/metrics` unless configured): the process's
//!   metrics in the OpenMetrics text format;
//! - `GET /healthz`: liveness, `200 ok` while the [`HealthCheck`] passes (no
//!   check: as long as the process serves HTTP), else `500` with the reason;
//! - `GET /readyz`, when a readiness flag is given: `200 ok` while it is
//!   true, `503 not ready` otherwise.
//!
//! The listener is bound once, by [`bind`], before anything else starts: a
//! taken port fails the start, and nothing can take the port between a bind
//! and a serve.
//!
//! With `--metrics-auth` ([`MetricsAuthArgs`]) the same port speaks HTTPS
//! only ([`tls`]) and the metrics answer only callers whose bearer token the
//! API server authenticates and authorizes ([`access`]): 401 without a
//! valid token, 403 without the permission. `/healthz` and `/readyz` stay
//! open on that HTTPS port, on purpose: kubelet's probes carry no
//! credentials (and skip certificate verification for `scheme: HTTPS`, so a
//! self-signed certificate is fine), the answers say only what the pod's
//! status already shows, and a second, plain port just for probes would be
//! one more port on every node to open, document and keep unauthenticated
//! anyway.

pub mod access;
mod secure;
pub mod tls;
pub mod verdicts;

pub use secure::MetricsAuthArgs;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::chain;

/// Content type of every `/metrics`: `prometheus_client` writes OpenMetrics
/// text (`# UNIT`, `# EOF`), which Prometheus parses only when told so by
/// this header.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Metrics the server can render: the process's registry.
pub trait Exposition: Send + Sync + 'static {
    /// The OpenMetrics text of all metrics.
    fn encode(&self) -> Result<String, std::fmt::Error>;
}

/// A health check: `Ok` for 200 "ok", `Err(reason)` for 500 with the reason.
pub type HealthCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// What the admin handlers read. The process updates the metrics and the
/// readiness flag; the server only reads them.
#[derive(Clone)]
pub struct AdminState {
    metrics: Arc<dyn Exposition>,
    metrics_path: String,
    health: Option<HealthCheck>,
    ready: Option<Arc<AtomicBool>>,
    /// `--metrics-auth`: who may read the metrics.
    gate: Option<Arc<access::MetricsGate>>,
    /// `--metrics-auth`: the HTTPS configuration of the whole server.
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("metrics_path", &self.metrics_path)
            .field("ready", &self.ready)
            .field("metrics_auth", &self.gate.is_some())
            .finish_non_exhaustive()
    }
}

impl AdminState {
    /// `metrics` on `/metrics` and an unconditional `/healthz`.
    pub fn new(metrics: Arc<dyn Exposition>) -> Self {
        Self {
            metrics,
            metrics_path: "/metrics".to_string(),
            health: None,
            ready: None,
            gate: None,
            tls: None,
        }
    }

    /// Serves the metrics at `path` instead of `/metrics`.
    pub fn metrics_path(mut self, path: &str) -> Self {
        self.metrics_path = path.to_string();
        self
    }

    /// Answers `/healthz` with `check`.
    pub fn health(mut self, check: HealthCheck) -> Self {
        self.health = Some(check);
        self
    }

    /// Serves `/readyz` from `ready`. The caller decides what "ready" means
    /// (leader with a synced controller, or a healthy standby) and flips it.
    pub fn ready(mut self, ready: Arc<AtomicBool>) -> Self {
        self.ready = Some(ready);
        self
    }

    /// Serves HTTPS with `config` and lets only callers `gate` allows read
    /// the metrics (see [`MetricsAuthArgs::secure`]).
    pub fn metrics_auth(
        mut self,
        gate: Arc<access::MetricsGate>,
        config: Arc<rustls::ServerConfig>,
    ) -> Self {
        self.gate = Some(gate);
        self.tls = Some(config);
        self
    }

    /// Whether the server speaks HTTPS and checks metrics callers.
    pub fn is_metrics_auth(&self) -> bool {
        self.gate.is_some()
    }
}

/// Why the admin server stopped with an error. The caller decides whether
/// that is fatal for the process (it should be: without probes, Kubernetes
/// cannot manage the pod).
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The listen address could not be bound (in use, or not permitted).
    #[error("cannot listen on {addr}")]
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
    /// The server's task panicked or was aborted.
    #[error("admin server task failed")]
    Task(#[source] tokio::task::JoinError),
    /// `--metrics-auth`: no usable certificate.
    #[error("cannot serve metrics over HTTPS")]
    Tls(#[from] tls::TlsError),
    /// `--metrics-auth`: no client to review callers with.
    #[error("cannot check metrics callers")]
    Client(#[source] crate::kube::ConfigError),
}

/// Builds the admin routes. Public so that tests can drive it without a
/// socket.
pub fn router(state: AdminState) -> Router {
    let mut router = Router::new()
        .route("/healthz", get(healthz))
        .route(&state.metrics_path, get(metrics));
    if state.ready.is_some() {
        router = router.route("/readyz", get(readyz));
    }
    router.with_state(state)
}

/// Binds `addr`; call it before anything else starts.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, AdminError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind { addr, source })
}

/// A running admin server: cancel the token it was given, then [`wait`](Server::wait).
#[derive(Debug)]
pub struct Server(tokio::task::JoinHandle<Result<(), AdminError>>);

impl Server {
    /// Waits until the server stopped, in-flight requests finished.
    pub async fn wait(self) -> Result<(), AdminError> {
        self.0.await.map_err(AdminError::Task)?
    }
}

/// Serves the admin routes on `listener` until `shutdown` is cancelled, then
/// lets in-flight requests finish.
pub fn serve_on(listener: TcpListener, state: AdminState, shutdown: CancellationToken) -> Server {
    let https = state.tls.is_some();
    match listener.local_addr() {
        Ok(local) => tracing::info!(addr = %local, https, "admin server listening"),
        Err(error) => {
            tracing::warn!(error = %chain(&error), "admin server listening on unknown address")
        }
    }
    Server(tokio::spawn(async move {
        match state.tls.clone() {
            Some(config) => {
                axum::serve(tls::TlsListener::new(listener, config), router(state))
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await
            }
            None => {
                axum::serve(listener, router(state))
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await
            }
        }
        .map_err(AdminError::Serve)?;
        tracing::info!("admin server stopped");
        Ok(())
    }))
}

/// [`bind`] then [`serve_on`].
pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    shutdown: CancellationToken,
) -> Result<Server, AdminError> {
    Ok(serve_on(bind(addr).await?, state, shutdown))
}

async fn metrics(State(state): State<AdminState>, headers: HeaderMap) -> Response {
    if let Some(gate) = &state.gate {
        let outcome = gate.check(&headers, &state.metrics_path).await;
        if let Some(refused) = access::refusal(&outcome) {
            return refused;
        }
    }
    match state.metrics.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            body,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(error = %chain(&error), "failed to encode metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "failed to encode metrics",
            )
                .into_response()
        }
    }
}

async fn healthz(State(state): State<AdminState>) -> Response {
    let Some(check) = &state.health else {
        return (StatusCode::OK, "ok").into_response();
    };
    match check().await {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(reason) => {
            tracing::debug!(%reason, "health check failed");
            (StatusCode::INTERNAL_SERVER_ERROR, reason).into_response()
        }
    }
}

async fn readyz(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if state
        .ready
        .as_ref()
        .is_some_and(|r| r.load(Ordering::Acquire))
    {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

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

    /// A registry with one counter, rendered like `prometheus_client` does.
    #[derive(Default)]
    struct Fake(std::sync::atomic::AtomicU64);

    impl Exposition for Fake {
        fn encode(&self) -> Result<String, std::fmt::Error> {
            Ok(format!(
                "# TYPE errors counter\nerrors_total{{kind=\"conflict\"}} {}\n# EOF\n",
                self.0.load(Ordering::SeqCst)
            ))
        }
    }

    struct Running {
        addr: SocketAddr,
        stop: CancellationToken,
        server: Server,
    }

    async fn start(state: AdminState) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = serve_on(listener, state, stop.clone());
        Running { addr, stop, server }
    }

    impl Running {
        async fn shutdown(self) {
            self.stop.cancel();
            tokio::time::timeout(std::time::Duration::from_secs(5), self.server.wait())
                .await
                .expect("server did not shut down")
                .unwrap();
        }
    }

    fn state() -> (AdminState, Arc<Fake>, Arc<AtomicBool>) {
        let metrics = Arc::new(Fake::default());
        let ready = Arc::new(AtomicBool::new(false));
        (
            AdminState::new(metrics.clone()).ready(ready.clone()),
            metrics,
            ready,
        )
    }

    #[tokio::test]
    async fn metrics_endpoint_serves_openmetrics() {
        let (state, metrics, _) = state();
        metrics.0.store(1, Ordering::SeqCst);
        let server = start(state).await;

        let reply = get(server.addr, "/metrics").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("content-type"), Some(OPENMETRICS_CONTENT_TYPE));
        assert!(
            reply.body.contains("errors_total{kind=\"conflict\"} 1"),
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
        let err = serve(addr, state, CancellationToken::new())
            .await
            .unwrap_err();
        assert!(matches!(err, AdminError::Bind { addr: a, .. } if a == addr));
    }

    #[tokio::test]
    async fn healthz_follows_the_check_and_metrics_path_is_configurable() {
        let healthy = Arc::new(AtomicBool::new(true));
        let flag = healthy.clone();
        let check: HealthCheck = Arc::new(move || {
            let ok = flag.load(Ordering::SeqCst);
            Box::pin(async move {
                if ok {
                    Ok(())
                } else {
                    Err("driver not ready".to_string())
                }
            })
        });
        let state = AdminState::new(Arc::new(Fake::default()))
            .metrics_path("/m")
            .health(check);
        let server = start(state).await;
        let reply = get(server.addr, "/healthz").await;
        assert_eq!((reply.status, reply.body.as_str()), (200, "ok"));
        healthy.store(false, Ordering::SeqCst);
        let reply = get(server.addr, "/healthz").await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (500, "driver not ready")
        );
        let reply = get(server.addr, "/m").await;
        assert_eq!(reply.header("content-type"), Some(OPENMETRICS_CONTENT_TYPE));
        // Without a readiness flag there is no /readyz.
        assert_eq!(get(server.addr, "/readyz").await.status, 404);
        assert_eq!(get(server.addr, "/metrics").await.status, 404);
        server.shutdown().await;
    }
    /// Allows the token "good", forbids "other", rejects the rest.
    struct Tokens;

    impl access::Reviewer for Tokens {
        fn review<'a>(&'a self, token: &'a str, _path: &'a str) -> access::ReviewFuture<'a> {
            Box::pin(async move {
                Ok(match token {
                    "good" => verdicts::Verdict::Allowed,
                    "other" => verdicts::Verdict::Forbidden,
                    _ => verdicts::Verdict::Unauthenticated,
                })
            })
        }
    }

    /// One HTTPS request trusting only `ca`; the status and the body.
    async fn get_tls(
        addr: SocketAddr,
        ca: &rustls::pki_types::CertificateDer<'static>,
        path: &str,
        token: Option<&str>,
    ) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
        tls.write_all(request.as_bytes()).await.unwrap();
        let mut raw = String::new();
        // rustls reports a peer that closes without close_notify as an
        // error after the whole response was read; the text is what counts.
        let _ = tls.read_to_string(&mut raw).await;
        let status = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = raw.split_once("\r\n\r\n").unwrap().1.to_string();
        (status, body)
    }

    #[tokio::test]
    async fn metrics_auth_serves_https_and_checks_callers_but_not_probes() {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        let config = tls::server_config(&tls::CertSource::Files {
            cert: cert.clone(),
            key,
        })
        .unwrap();
        let gate = Arc::new(access::MetricsGate::new(Arc::new(Tokens)));
        let (state, _, ready) = state();
        let state = state.metrics_auth(gate, config);
        assert!(state.is_metrics_auth());
        let server = start(state).await;
        let ca = made.cert.der().clone();

        let (status, body) = get_tls(server.addr, &ca, "/metrics", Some("good")).await;
        assert_eq!(status, 200);
        assert!(body.contains("errors_total"), "{body}");
        assert_eq!(
            get_tls(server.addr, &ca, "/metrics", Some("other")).await.0,
            403
        );
        assert_eq!(
            get_tls(server.addr, &ca, "/metrics", Some("bad")).await.0,
            401
        );
        assert_eq!(get_tls(server.addr, &ca, "/metrics", None).await.0, 401);
        // Probes need no token.
        assert_eq!(get_tls(server.addr, &ca, "/healthz", None).await.0, 200);
        ready.store(true, Ordering::Release);
        assert_eq!(get_tls(server.addr, &ca, "/readyz", None).await.0, 200);
        // Plain HTTP gets no answer: the port speaks TLS only.
        let plain = tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(server.addr).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut raw = Vec::new();
            let _ = s.read_to_end(&mut raw);
            raw
        })
        .await
        .unwrap();
        assert!(!String::from_utf8_lossy(&plain).contains("errors_total"));

        server.shutdown().await;
    }

    #[test]
    fn unusable_certificate_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        std::fs::write(&cert, "not pem").unwrap();
        let err = tls::server_config(&tls::CertSource::Files {
            cert: cert.clone(),
            key: dir.path().join("missing.key"),
        })
        .unwrap_err();
        assert!(
            chain(&err).to_string().contains("tls.crt"),
            "{}",
            chain(&err)
        );
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        std::fs::write(&cert, made.cert.pem()).unwrap();
        let err = tls::server_config(&tls::CertSource::Files {
            cert,
            key: dir.path().join("missing.key"),
        })
        .unwrap_err();
        assert!(
            chain(&err).to_string().contains("missing.key"),
            "{}",
            chain(&err)
        );
        assert!(tls::server_config(&tls::CertSource::SelfSigned {
            names: vec!["localhost".into()]
        })
        .is_ok());
    }
}
