//! `csi_sidecar_operations_seconds{driver_name,method_name,grpc_status_code}`,
//! the histogram every upstream sidecar exports, with the same buckets, so
//! existing dashboards keep working when the image is swapped.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upstream's buckets (csi-lib-utils), in seconds.
pub const BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// Labels of one CSI call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub driver_name: String,
    pub method_name: String,
    pub grpc_status_code: String,
}

fn new_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The sidecar's metrics registry.
pub struct Metrics {
    registry: Registry,
    operations: Family<CallLabels, Histogram, fn() -> Histogram>,
    /// Driver name for the label; "unknown-driver" until GetPluginInfo answered.
    driver: Mutex<String>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let operations = Family::<CallLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            new_histogram as fn() -> Histogram,
        );
        registry.register(
            "csi_sidecar_operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total",
            operations.clone(),
        );
        Self {
            registry,
            operations,
            driver: Mutex::new("unknown-driver".to_string()),
        }
    }

    /// The registry, for a role to add its own metrics before sharing `self`.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Sets the driver_name label of later observations.
    pub fn set_driver_name(&self, name: &str) {
        if let Ok(mut d) = self.driver.lock() {
            *d = name.to_string();
        }
    }

    /// Records one CSI call: `method` like `/csi.v1.Identity/Probe`, `code` like `OK`.
    pub fn observe(&self, method: &str, code: &str, elapsed: Duration) {
        let driver_name = self
            .driver
            .lock()
            .map(|d| d.clone())
            .unwrap_or_else(|_| "unknown-driver".to_string());
        self.operations
            .get_or_create(&CallLabels {
                driver_name,
                method_name: method.to_string(),
                grpc_status_code: code.to_string(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
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

    #[test]
    fn calls_are_recorded_with_upstream_name_and_labels() {
        let m = Metrics::new();
        m.observe("/csi.v1.Identity/Probe", "OK", Duration::from_millis(3));
        m.set_driver_name("hostpath.csi.k8s.io");
        m.observe(
            "/csi.v1.Node/NodeGetInfo",
            "DeadlineExceeded",
            Duration::from_secs(2),
        );
        let text = m.encode().expect("encodes");
        assert!(text.contains("csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1"), "{text}");
        assert!(text.contains("driver_name=\"hostpath.csi.k8s.io\",method_name=\"/csi.v1.Node/NodeGetInfo\",grpc_status_code=\"DeadlineExceeded\""), "{text}");
        assert!(text.contains("le=\"600.0\""), "{text}");
    }
}
