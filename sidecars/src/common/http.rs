//! The sidecar's HTTP server: `/healthz` answered by the role's own check and
//! the metrics at `--metrics-path`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::metrics::{Metrics, OPENMETRICS_CONTENT_TYPE};

/// A health check: `Ok` for 200 "ok", `Err(reason)` for 500 with the reason.
pub type HealthCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: HealthCheck,
}

async fn healthz(State(state): State<AppState>) -> Response {
    match (state.health)().await {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(reason) => {
            tracing::debug!(%reason, "health check failed");
            (StatusCode::INTERNAL_SERVER_ERROR, reason).into_response()
        }
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    match state.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The routes, for tests and for [`serve`].
pub fn router(metrics: Arc<Metrics>, metrics_path: &str, health: HealthCheck) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route(metrics_path, get(self::metrics))
        .with_state(AppState { metrics, health })
}

/// Binds `addr` (failing at once if taken) and serves until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    Ok(serve_on(listener, router, shutdown))
}

/// Serves on a listener the caller bound, until `shutdown`. The socket is
/// the one bound: nothing can take the port between a bind and a serve.
pub fn serve_on(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    match listener.local_addr() {
        Ok(addr) => tracing::info!(%addr, "HTTP server listening"),
        Err(e) => tracing::info!(error = %e, "HTTP server listening (address unknown)"),
    }
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn healthz_follows_the_check_and_metrics_are_served() {
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
        let metrics = Arc::new(Metrics::new());
        metrics.observe(
            "/csi.v1.Identity/Probe",
            "OK",
            std::time::Duration::from_millis(1),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = serve_on(listener, router(metrics, "/metrics", check), async {
            let _ = rx.await;
        });

        let ok = tokio::task::spawn_blocking(move || get(addr, "/healthz"))
            .await
            .expect("join");
        assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ok"), "{ok}");
        healthy.store(false, Ordering::SeqCst);
        let bad = tokio::task::spawn_blocking(move || get(addr, "/healthz"))
            .await
            .expect("join");
        assert!(
            bad.starts_with("HTTP/1.1 500") && bad.ends_with("driver not ready"),
            "{bad}"
        );
        let m = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
            .await
            .expect("join");
        assert!(m.contains("csi_sidecar_operations_seconds_bucket"), "{m}");
        // The body is OpenMetrics text (it ends with `# EOF`), so it must be
        // labelled as such, or Prometheus parses it with the wrong parser.
        let content_type = m
            .lines()
            .find_map(|l| l.strip_prefix("content-type: "))
            .unwrap_or_default();
        assert_eq!(content_type, OPENMETRICS_CONTENT_TYPE, "{m}");
        assert!(m.trim_end().ends_with("# EOF"), "{m}");

        let _ = tx.send(());
        task.await.expect("join").expect("clean shutdown");
    }
}
