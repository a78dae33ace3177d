//! The attacher's own metric, registered in the shared registry next to the
//! CSI call histogram and the queue gauges (`workqueue_depth{name}`,
//! `workqueue_oldest_item_age_seconds{name}`, `workqueue_delayed_items{name}`
//! of the `attach`, `detach` and `pv` queues): the API writes by kind, the
//! number the "fewest writes per attach" claim is checked against.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    write: &'static str,
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

/// `csiops_attacher_api_writes_total{write}`.
#[derive(Clone, Debug, Default)]
pub struct Writes(Family<WriteLabels, Counter>);

impl Writes {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "csiops_attacher_api_writes",
            "Writes of the attacher to the API server by kind: va_finalizer, va_status, pv_finalizer, event",
            self.0.clone(),
        );
    }

    pub fn wrote(&self, w: Write) {
        self.0
            .get_or_create(&WriteLabels { write: w.label() })
            .inc();
    }

    /// Writes so far of one kind.
    pub fn count(&self, w: Write) -> u64 {
        self.0
            .get_or_create(&WriteLabels { write: w.label() })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_exported_by_kind() {
        let w = Writes::default();
        let mut registry = Registry::default();
        w.register(&mut registry);
        w.wrote(Write::VaStatus);
        w.wrote(Write::VaStatus);
        w.wrote(Write::PvFinalizer);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains("csiops_attacher_api_writes_total{write=\"va_status\"} 2"),
            "{text}"
        );
        assert_eq!(w.count(Write::PvFinalizer), 1);
        assert_eq!(w.count(Write::Event), 0);
    }
}
