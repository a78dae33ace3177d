//! The provisioner library's metrics, with upstream's names and `class` label
//! (sig-storage-lib-external-provisioner), so provisioning dashboards keep
//! working: `controller_persistentvolumeclaim_provision_{total,failed_total,
//! duration_seconds}` and `controller_persistentvolume_delete_{total,
//! failed_total,duration_seconds}`. Durations count successful operations.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: String,
}

type Histograms = Family<ClassLabel, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    // Upstream uses Prometheus' default buckets (5ms … 10s); provisioning
    // often takes longer, so ours go from 10ms to about 20 minutes.
    Histogram::new(exponential_buckets(0.01, 2.0, 18))
}

/// Provision and delete counts and durations per StorageClass.
#[derive(Debug)]
pub struct OperationMetrics {
    provisioned: Family<ClassLabel, Counter>,
    provision_failed: Family<ClassLabel, Counter>,
    provision_seconds: Histograms,
    deleted: Family<ClassLabel, Counter>,
    delete_failed: Family<ClassLabel, Counter>,
    delete_seconds: Histograms,
}

impl Default for OperationMetrics {
    fn default() -> Self {
        let histograms = || Histograms::new_with_constructor(histogram as fn() -> Histogram);
        OperationMetrics {
            provisioned: Family::default(),
            provision_failed: Family::default(),
            provision_seconds: histograms(),
            deleted: Family::default(),
            delete_failed: Family::default(),
            delete_seconds: histograms(),
        }
    }
}

/// Which operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Provision,
    Delete,
}

impl OperationMetrics {
    /// Registers the families in `registry` (prometheus-client appends
    /// `_total` to counters).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "controller_persistentvolumeclaim_provision",
            "Total number of persistent volumes provisioned succesfully",
            self.provisioned.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_failed",
            "Total number of persistent volume provision failed attempts",
            self.provision_failed.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_duration_seconds",
            "Latency in seconds to provision persistent volumes",
            self.provision_seconds.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete",
            "Total number of persistent volumes deleted succesfully",
            self.deleted.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_failed",
            "Total number of persistent volume delete failed attempts",
            self.delete_failed.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_duration_seconds",
            "Latency in seconds to delete persistent volumes",
            self.delete_seconds.clone(),
        );
    }

    pub fn succeeded(&self, op: Operation, class: &str, took: Duration) {
        let label = ClassLabel {
            class: class.to_string(),
        };
        let (count, seconds) = match op {
            Operation::Provision => (&self.provisioned, &self.provision_seconds),
            Operation::Delete => (&self.deleted, &self.delete_seconds),
        };
        count.get_or_create(&label).inc();
        seconds.get_or_create(&label).observe(took.as_secs_f64());
    }

    pub fn failed(&self, op: Operation, class: &str) {
        let label = ClassLabel {
            class: class.to_string(),
        };
        match op {
            Operation::Provision => &self.provision_failed,
            Operation::Delete => &self.delete_failed,
        }
        .get_or_create(&label)
        .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names_with_class_label() {
        let m = OperationMetrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.succeeded(Operation::Provision, "fast", Duration::from_millis(30));
        m.failed(Operation::Provision, "fast");
        m.failed(Operation::Provision, "fast");
        m.succeeded(Operation::Delete, "slow", Duration::from_secs(2));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in [
            "controller_persistentvolumeclaim_provision_total{class=\"fast\"} 1",
            "controller_persistentvolumeclaim_provision_failed_total{class=\"fast\"} 2",
            "controller_persistentvolumeclaim_provision_duration_seconds_count{class=\"fast\"} 1",
            "controller_persistentvolume_delete_total{class=\"slow\"} 1",
            "controller_persistentvolume_delete_duration_seconds_sum{class=\"slow\"} 2.0",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("controller_persistentvolume_delete_failed_total{"));
    }
}
