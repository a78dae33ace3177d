//! What a bench samples while something runs: the API server's latency as
//! another client sees it ([`LatencyProbe`]), and percentiles of it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;

/// A client that GETs `/api/v1/namespaces/default` every `period` until
/// stopped, timing each answer: how the API server serves the rest of the
/// cluster while a sidecar loads it (API priority and fairness). Failed
/// requests count as their time too, and are counted.
pub struct LatencyProbe {
    task: tokio::task::JoinHandle<()>,
    samples: Arc<Mutex<Vec<Duration>>>,
    errors: Arc<Mutex<usize>>,
}

impl LatencyProbe {
    pub fn start(client: kube::Client, period: Duration) -> LatencyProbe {
        let samples: Arc<Mutex<Vec<Duration>>> = Arc::default();
        let errors: Arc<Mutex<usize>> = Arc::default();
        let (s, e) = (samples.clone(), errors.clone());
        let task = tokio::spawn(async move {
            let api: Api<Namespace> = Api::all(client);
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let t0 = Instant::now();
                let ok = api.get("default").await.is_ok();
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(t0.elapsed());
                if !ok {
                    *e.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                }
            }
        });
        LatencyProbe {
            task,
            samples,
            errors,
        }
    }

    /// Stops the probe: its latencies so far.
    pub fn stop(self) -> Latencies {
        self.task.abort();
        let mut all = std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()));
        all.sort();
        let errors = *self.errors.lock().unwrap_or_else(|p| p.into_inner());
        Latencies {
            sorted: all,
            errors,
        }
    }
}

/// Latencies of a [`LatencyProbe`], sorted.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    pub sorted: Vec<Duration>,
    pub errors: usize,
}

impl Latencies {
    /// The `p`-th percentile (0–100, nearest rank), zero when empty.
    pub fn percentile(&self, p: f64) -> Duration {
        percentile(&self.sorted, p)
    }

    /// `p50 / p99 / max` in milliseconds, for a table cell.
    pub fn cell(&self) -> String {
        format!(
            "{:.1} / {:.1} / {:.1} ms ({} GETs{})",
            ms(self.percentile(50.0)),
            ms(self.percentile(99.0)),
            ms(self.sorted.last().copied().unwrap_or_default()),
            self.sorted.len(),
            if self.errors > 0 {
                format!(", {} failed", self.errors)
            } else {
                String::new()
            }
        )
    }
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// KiB as MiB, one decimal.
pub fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&d, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&d, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&d[..1], 99.0), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }
}
