//! Prometheus metrics for the operator, exposed by the admin server.
//!
//! All metrics live in one [`Metrics`] value that is shared via `Arc` between
//! the reconciler, the leader elector and the HTTP handler. Recording is
//! lock-free (atomics) except for the first use of a new label value.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use csiops_runtime::requests::ApiRequests;

/// Upper bounds (seconds) of the reconcile-duration buckets: roughly 1-2.5-5
/// steps from 1ms (a no-op reconcile served from cache) to 60s (a reconcile
/// stuck behind slow API calls), so both ends of the range stay visible.
pub const RECONCILE_DURATION_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Labels of `csiops_reconcile_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: String,
}

/// Labels of `csiops_rollout_steps_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: String,
}

/// The operator's metrics and the registry that encodes them.
///
/// It exists so that every component records into the same registry without
/// knowing about Prometheus types; share it as `Arc<Metrics>` (it is
/// `Send + Sync`, and every method takes `&self`).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciliations: Counter,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Histogram,
    rollout_steps: Family<StepLabels, Counter>,
    leader: Gauge,
    api_requests: ApiRequests,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates the metrics and registers them under the `csiops_` prefix.
    pub fn new() -> Self {
        // Full names, no prefix: the API request counter shared with the
        // sidecars registers its complete name too.
        let mut registry = Registry::default();

        let reconciliations = Counter::default();
        registry.register(
            "csiops_reconciliations",
            "Reconciliations started",
            reconciliations.clone(),
        );

        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "csiops_reconcile_errors",
            "Reconciliations that failed, by error kind",
            reconcile_errors.clone(),
        );

        let reconcile_duration = Histogram::new(RECONCILE_DURATION_BUCKETS);
        registry.register_with_unit(
            "csiops_reconcile_duration",
            "Wall-clock duration of reconciliations",
            Unit::Seconds,
            reconcile_duration.clone(),
        );

        let rollout_steps = Family::<StepLabels, Counter>::default();
        registry.register(
            "csiops_rollout_steps",
            "Rollout steps executed, by step",
            rollout_steps.clone(),
        );

        let leader = Gauge::default();
        registry.register(
            "csiops_leader",
            "1 if this replica holds the leader lease, 0 otherwise",
            leader.clone(),
        );

        let api_requests = ApiRequests::default();
        api_requests.register(&mut registry);

        Self {
            registry,
            reconciliations,
            reconcile_errors,
            reconcile_duration,
            rollout_steps,
            leader,
            api_requests,
        }
    }

    /// `csiops_kube_api_requests_total{verb}`: give it to the API client
    /// (see `csiops_runtime::requests::counted_client`) to count its requests.
    pub fn api_requests(&self) -> &ApiRequests {
        &self.api_requests
    }

    /// Counts a reconciliation and starts timing it. The duration is recorded
    /// when the returned guard is dropped, so early returns and `?` are timed
    /// too; bind it (`let _timer = ...`), since `let _ = ...` drops it at once.
    pub fn reconcile_started(&self) -> ReconcileTimer {
        self.reconciliations.inc();
        ReconcileTimer {
            histogram: self.reconcile_duration.clone(),
            start: Instant::now(),
        }
    }

    /// Counts a failed reconciliation. `kind` should be a short, fixed string
    /// ("render", "kube", "conflict", ...): every distinct value creates a new
    /// time series, so never pass error messages or object names.
    pub fn reconcile_failed(&self, kind: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Counts one executed rollout step. Like `kind` above, `step` must come
    /// from a small fixed set to keep cardinality bounded.
    pub fn rollout_step(&self, step: &str) {
        self.rollout_steps
            .get_or_create(&StepLabels {
                step: step.to_owned(),
            })
            .inc();
    }

    /// Records whether this replica is the leader, so dashboards and alerts
    /// can check that exactly one replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Renders every metric in the OpenMetrics text format (ending in
    /// `# EOF`), ready to serve on `/metrics`.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Times one reconciliation; observes the elapsed time into
/// `csiops_reconcile_duration_seconds` when dropped.
///
/// It is a guard rather than a `finish()` call so that every exit path of the
/// reconciler is measured. It owns a handle to the histogram, so it can be held
/// across `.await` points and moved between tasks.
#[derive(Debug)]
#[must_use = "the duration is recorded when the timer is dropped; bind it to a variable"]
pub struct ReconcileTimer {
    histogram: Histogram,
    start: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

impl csiops_runtime::admin::Exposition for Metrics {
    fn encode(&self) -> Result<String, std::fmt::Error> {
        Metrics::encode(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn line_value(text: &str, prefix: &str) -> Option<String> {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .map(|l| l[prefix.len()..].trim().to_owned())
    }

    #[test]
    fn metrics_is_send_sync() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<Metrics>();
        assert_send_sync::<Arc<Metrics>>();
        assert_send_sync::<ReconcileTimer>();
    }

    #[test]
    fn fresh_registry_encodes_all_metric_families() {
        let m = Metrics::new();
        let text = m.encode().unwrap();
        assert!(text.ends_with("# EOF\n"), "{text}");
        for family in [
            "# TYPE csiops_reconciliations counter",
            "# TYPE csiops_reconcile_duration_seconds histogram",
            "# UNIT csiops_reconcile_duration_seconds seconds",
            "# TYPE csiops_leader gauge",
        ] {
            assert!(text.contains(family), "missing {family:?} in\n{text}");
        }
        // Labelled families are only emitted once they have a label value.
        assert!(!text.contains("csiops_reconcile_errors"), "{text}");
        assert!(!text.contains("csiops_rollout_steps"), "{text}");
        m.reconcile_failed("render");
        m.rollout_step("apply");
        assert_eq!(m.api_requests().get("GET"), 0);
        let text = m.encode().unwrap();
        assert!(text.contains("# TYPE csiops_reconcile_errors counter"));
        assert!(text.contains("# TYPE csiops_rollout_steps counter"));
        // The API request counter shared with the sidecars, under its own name.
        assert!(
            text.contains("csiops_kube_api_requests_total{verb=\"GET\"} 0"),
            "{text}"
        );
        assert_eq!(
            line_value(&text, "csiops_reconciliations_total ").as_deref(),
            Some("0")
        );
        assert_eq!(line_value(&text, "csiops_leader ").as_deref(), Some("0"));
    }

    #[test]
    fn records_reconciliations_errors_and_durations() {
        let m = Metrics::new();
        {
            let _timer = m.reconcile_started();
        }
        {
            let _timer = m.reconcile_started();
            m.reconcile_failed("render");
        }
        m.reconcile_failed("kube");
        m.reconcile_failed("kube");

        let text = m.encode().unwrap();
        assert_eq!(
            line_value(&text, "csiops_reconciliations_total ").as_deref(),
            Some("2")
        );
        assert_eq!(
            line_value(&text, "csiops_reconcile_errors_total{kind=\"render\"} ").as_deref(),
            Some("1")
        );
        assert_eq!(
            line_value(&text, "csiops_reconcile_errors_total{kind=\"kube\"} ").as_deref(),
            Some("2")
        );
        assert_eq!(
            line_value(&text, "csiops_reconcile_duration_seconds_count ").as_deref(),
            Some("2")
        );
        // Both observations are far below a minute, so they land in every
        // bucket from 60s up, including +Inf.
        assert_eq!(
            line_value(
                &text,
                "csiops_reconcile_duration_seconds_bucket{le=\"60.0\"} "
            )
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            line_value(
                &text,
                "csiops_reconcile_duration_seconds_bucket{le=\"+Inf\"} "
            )
            .as_deref(),
            Some("2")
        );
        assert!(text.contains("csiops_reconcile_duration_seconds_bucket{le=\"0.001\"}"));
    }

    #[test]
    fn records_rollout_steps_and_leader() {
        let m = Metrics::new();
        m.rollout_step("apply-controller");
        m.rollout_step("apply-controller");
        m.rollout_step("wait-node-ready");
        m.set_leader(true);

        let text = m.encode().unwrap();
        assert_eq!(
            line_value(
                &text,
                "csiops_rollout_steps_total{step=\"apply-controller\"} "
            )
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            line_value(
                &text,
                "csiops_rollout_steps_total{step=\"wait-node-ready\"} "
            )
            .as_deref(),
            Some("1")
        );
        assert_eq!(line_value(&text, "csiops_leader ").as_deref(), Some("1"));

        m.set_leader(false);
        let text = m.encode().unwrap();
        assert_eq!(line_value(&text, "csiops_leader ").as_deref(), Some("0"));
    }

    #[test]
    fn timer_moves_across_threads() {
        let m = Arc::new(Metrics::new());
        let timer = m.reconcile_started();
        std::thread::spawn(move || drop(timer)).join().unwrap();
        let text = m.encode().unwrap();
        assert_eq!(
            line_value(&text, "csiops_reconcile_duration_seconds_count ").as_deref(),
            Some("1")
        );
    }
}
