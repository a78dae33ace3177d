//! The attacher's own metrics next to the shared CSI call histogram: the
//! depth of each work queue and the age of its oldest waiting key (read at
//! scrape time), and the API writes by kind — the number the "fewest writes
//! per attach" claim is checked against.
//!
//! Served by a router of our own on the same `--http-endpoint` and
//! `--metrics-path`: the shared registry is built before the controller
//! exists, so ours is encoded after it into one exposition.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::common::http::HealthCheck;
use crate::common::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `va_finalizer`, `va_status`, `pv_finalizer`, `event`.
    pub write: String,
}

/// What a write changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    VaFinalizer,
    VaStatus,
    PvFinalizer,
    Event,
}

impl Write {
    fn label(self) -> &'static str {
        match self {
            Write::VaFinalizer => "va_finalizer",
            Write::VaStatus => "va_status",
            Write::PvFinalizer => "pv_finalizer",
            Write::Event => "event",
        }
    }
}

/// A queue as the metrics see it.
pub trait QueueStats: Send + Sync {
    fn depth(&self) -> usize;
    fn oldest_age_seconds(&self) -> f64;
}

impl<K: Clone + Eq + std::hash::Hash + Send> QueueStats for crate::common::workqueue::WorkQueue<K> {
    fn depth(&self) -> usize {
        self.len()
    }
    fn oldest_age_seconds(&self) -> f64 {
        self.oldest_age().as_secs_f64()
    }
}

pub struct AttacherMetrics {
    registry: Registry,
    depth: Family<QueueLabels, Gauge>,
    oldest: Family<QueueLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    writes: Family<WriteLabels, Counter>,
    queues: std::sync::Mutex<Vec<(String, Arc<dyn QueueStats>)>>,
}

impl Default for AttacherMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AttacherMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let depth = Family::<QueueLabels, Gauge>::default();
        let oldest = Family::<QueueLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "workqueue_depth",
            "Current depth of the work queue (keys ready to be processed)",
            depth.clone(),
        );
        registry.register(
            "workqueue_oldest_item_age_seconds",
            "How long the oldest key of the work queue has been waiting",
            oldest.clone(),
        );
        registry.register(
            "csiops_attacher_api_writes",
            "Writes to the API server by kind",
            writes.clone(),
        );
        AttacherMetrics {
            registry,
            depth,
            oldest,
            writes,
            queues: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Adds a queue to report as `name`.
    pub fn watch_queue(&self, name: &str, q: Arc<dyn QueueStats>) {
        if let Ok(mut qs) = self.queues.lock() {
            qs.push((name.to_string(), q));
        }
    }

    pub fn wrote(&self, w: Write) {
        self.writes
            .get_or_create(&WriteLabels {
                write: w.label().to_string(),
            })
            .inc();
    }

    /// Writes so far of one kind.
    pub fn writes(&self, w: Write) -> u64 {
        self.writes
            .get_or_create(&WriteLabels {
                write: w.label().to_string(),
            })
            .get()
    }

    /// Text exposition, after refreshing the queue gauges.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        if let Ok(qs) = self.queues.lock() {
            for (name, q) in qs.iter() {
                let labels = QueueLabels { name: name.clone() };
                self.depth
                    .get_or_create(&labels)
                    .set(i64::try_from(q.depth()).unwrap_or(i64::MAX));
                self.oldest
                    .get_or_create(&labels)
                    .set(q.oldest_age_seconds());
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[derive(Clone)]
struct AppState {
    shared: Arc<Metrics>,
    ours: Arc<AttacherMetrics>,
    health: HealthCheck,
}

async fn healthz(State(state): State<AppState>) -> Response {
    match (state.health)().await {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(reason) => (StatusCode::INTERNAL_SERVER_ERROR, reason).into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    let body = state.shared.encode().and_then(|shared| {
        // One exposition: the first part's end-of-stream marker goes.
        let shared = shared
            .strip_suffix("# EOF\n")
            .unwrap_or(&shared)
            .to_string();
        Ok(shared + &state.ours.encode()?)
    });
    match body {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `/healthz` and the metrics of both registries at `metrics_path`.
pub fn router(
    shared: Arc<Metrics>,
    ours: Arc<AttacherMetrics>,
    metrics_path: &str,
    health: HealthCheck,
) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route(metrics_path, get(metrics))
        .with_state(AppState {
            shared,
            ours,
            health,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::workqueue::{Backoff, WorkQueue};
    use std::time::Duration;

    #[tokio::test]
    async fn queues_and_writes_are_exported() {
        let m = AttacherMetrics::new();
        let q = Arc::new(WorkQueue::<String>::new(Backoff {
            start: Duration::from_secs(1),
            max: Duration::from_secs(2),
        }));
        q.add("a".into());
        q.add("b".into());
        m.watch_queue("attach", q.clone());
        m.wrote(Write::VaStatus);
        m.wrote(Write::VaStatus);
        m.wrote(Write::PvFinalizer);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let text = m.encode().expect("encodes");
        assert!(
            text.contains("workqueue_depth{name=\"attach\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("csiops_attacher_api_writes_total{write=\"va_status\"} 2"),
            "{text}"
        );
        assert_eq!(m.writes(Write::PvFinalizer), 1);
        let age_line = text
            .lines()
            .find(|l| l.starts_with("workqueue_oldest_item_age_seconds{name=\"attach\"}"))
            .unwrap_or_default();
        let age: f64 = age_line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(age >= 0.01, "{text}");
        let _ = q.next().await;
        let _ = q.next().await;
        assert!(m
            .encode()
            .expect("encodes")
            .contains("workqueue_depth{name=\"attach\"} 0"));
    }
}
