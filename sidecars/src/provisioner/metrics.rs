//! The provisioner library's metrics, with upstream's names and `class` label
//! (sig-storage-lib-external-provisioner), so provisioning dashboards keep
//! working: `controller_persistentvolumeclaim_provision_{total,failed_total,
//! duration_seconds}` and `controller_persistentvolume_delete_{total,
//! failed_total,duration_seconds}`. Durations count successful operations.
//! Beside them, the intent journal's own ([`JournalMetrics`]).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::journal::IntentAction;

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
    pub journal: JournalMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: &'static str,
}

/// The intent journal's metrics:
/// - `csiops_provisioner_journal_recovered_total{action}`: intents an
///   earlier leader left without a PV (it stopped between the intent and
///   the PV), by what the sweep did: `provision_again` (the claim is still
///   wanted), `clean_up` (it is not), `trim` (its PV came and went);
/// - `csiops_provisioner_journal_blocked_intents`: intents whose volume the
///   sweep cannot find out about now (the driver refuses the stored
///   request, or the name is taken): kept, and each needs a look.
#[derive(Debug, Default)]
pub struct JournalMetrics {
    recovered: Family<ActionLabel, Counter>,
    blocked_intents: Gauge,
    blocked: Mutex<BTreeSet<String>>,
}

impl JournalMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "csiops_provisioner_journal_recovered",
            "Intents an earlier leader left without a PV, by what the sweep did with them",
            self.recovered.clone(),
        );
        registry.register(
            "csiops_provisioner_journal_blocked_intents",
            "Intents the sweep cannot resolve now: whether their volume exists cannot be told",
            self.blocked_intents.clone(),
        );
    }

    /// The sweep decided `action` for an intent an earlier leader left
    /// without a PV.
    pub fn recovered(&self, action: IntentAction) {
        let action = match action {
            IntentAction::Keep => "provision_again",
            IntentAction::Trim => "trim",
            IntentAction::CleanUp => "clean_up",
        };
        self.recovered.get_or_create(&ActionLabel { action }).inc();
    }

    /// How many inherited intents without a PV the sweep saw, all actions.
    pub fn recovered_total(&self) -> u64 {
        ["provision_again", "trim", "clean_up"]
            .into_iter()
            .map(|action| self.recovered.get_or_create(&ActionLabel { action }).get())
            .sum()
    }

    /// The sweep of `name` is blocked (`true`) or not (any other outcome).
    pub fn set_blocked(&self, name: &str, blocked: bool) {
        let mut names = self.blocked.lock().unwrap_or_else(|p| p.into_inner());
        if blocked {
            names.insert(name.to_string());
        } else {
            names.remove(name);
        }
        self.blocked_intents
            .set(i64::try_from(names.len()).unwrap_or(i64::MAX));
    }

    /// Intents blocked now.
    pub fn blocked_intents(&self) -> i64 {
        self.blocked_intents.get()
    }
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
            journal: JournalMetrics::default(),
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
        self.journal.register(registry);
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

    #[test]
    fn the_journal_counts_recoveries_and_blocked_intents() {
        let m = OperationMetrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.journal.recovered(IntentAction::Keep);
        m.journal.recovered(IntentAction::CleanUp);
        m.journal.recovered(IntentAction::CleanUp);
        // A name blocked again is counted once; an outcome unblocks it.
        m.journal.set_blocked("pvc-a", true);
        m.journal.set_blocked("pvc-a", true);
        m.journal.set_blocked("pvc-b", true);
        m.journal.set_blocked("pvc-b", false);
        assert_eq!(m.journal.recovered_total(), 3);
        assert_eq!(m.journal.blocked_intents(), 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in [
            "csiops_provisioner_journal_recovered_total{action=\"provision_again\"} 1",
            "csiops_provisioner_journal_recovered_total{action=\"clean_up\"} 2",
            "csiops_provisioner_journal_blocked_intents 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
