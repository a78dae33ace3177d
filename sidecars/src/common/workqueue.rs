//! A keyed work queue with the semantics of client-go's rate-limited
//! workqueue, which the controller sidecars are built around:
//!
//! - a key queued several times is processed once (events coalesce);
//! - a key is never handed to two workers at once: one added while it is
//!   being processed is queued again when the worker calls [`WorkQueue::done`];
//! - [`WorkQueue::add_rate_limited`] re-queues a failed key after a per-key
//!   exponential backoff (`--retry-interval-start` doubling up to
//!   `--retry-interval-max`), which [`WorkQueue::forget`] resets on success;
//! - [`WorkQueue::add_after`] re-queues a key at a given time (earliest wins);
//!   a plain [`WorkQueue::add`] meanwhile does not cancel it (client-go's
//!   semantics): the key is processed now and again at that time.
//!
//! The ready keys are served in FIFO order. Depth and the age of the oldest
//! ready key are exposed for metrics: a queue whose oldest key keeps ageing is
//! a controller that cannot keep up.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Per-key exponential backoff between two bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub start: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay before retry number `failures + 1`: `start * 2^failures`,
    /// at most `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.min(31));
        self.start.saturating_mul(factor).min(self.max)
    }
}

/// See the module documentation.
pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    /// Wakes workers waiting in [`WorkQueue::next`].
    wake: Notify,
    backoff: Backoff,
}

struct State<K> {
    /// Keys ready to be handed out, in order.
    ready: VecDeque<K>,
    /// Keys that need processing (in `ready`, or waiting for their worker to
    /// finish), with when they were first queued.
    dirty: HashMap<K, Instant>,
    /// Keys a worker holds.
    processing: HashSet<K>,
    /// Keys to add at a future time; `delayed_at` is the inverse index so a
    /// key has at most one pending time.
    delayed: BTreeSet<(Instant, u64)>,
    delayed_keys: HashMap<u64, K>,
    delayed_at: HashMap<K, (Instant, u64)>,
    next_seq: u64,
    failures: HashMap<K, u32>,
    shut_down: bool,
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    pub fn new(backoff: Backoff) -> Self {
        WorkQueue {
            state: Mutex::new(State {
                ready: VecDeque::new(),
                dirty: HashMap::new(),
                processing: HashSet::new(),
                delayed: BTreeSet::new(),
                delayed_keys: HashMap::new(),
                delayed_at: HashMap::new(),
                next_seq: 0,
                failures: HashMap::new(),
                shut_down: false,
            }),
            wake: Notify::new(),
            backoff,
        }
    }

    // A panic while holding the lock leaves consistent-enough state (every
    // method is a few map operations), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `key` now.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.add_now(key, Instant::now()) {
            drop(s);
            self.wake.notify_one();
        }
    }

    /// Queues `key` after `delay`. If it is already due earlier, nothing changes.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let at = Instant::now() + delay;
        let mut s = self.lock();
        if s.shut_down {
            return;
        }
        if let Some(&(existing, seq)) = s.delayed_at.get(&key) {
            if existing <= at {
                return;
            }
            s.delayed.remove(&(existing, seq));
            s.delayed_keys.remove(&seq);
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        s.delayed.insert((at, seq));
        s.delayed_keys.insert(seq, key.clone());
        s.delayed_at.insert(key, (at, seq));
        drop(s);
        // A waiting worker may need to shorten its sleep.
        self.wake.notify_one();
    }

    /// Queues `key` after its backoff, and counts one more failure for it.
    pub fn add_rate_limited(&self, key: K) {
        let delay = {
            let mut s = self.lock();
            let failures = s.failures.entry(key.clone()).or_insert(0);
            let delay = self.backoff.delay(*failures);
            *failures = failures.saturating_add(1);
            delay
        };
        self.add_after(key, delay);
    }

    /// How many times `key` was re-queued by [`Self::add_rate_limited`]
    /// since it was last forgotten.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Resets `key`'s backoff (call on success).
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// The next key to process, waiting until one is ready; `None` once the
    /// queue is shut down. The caller must call [`Self::done`] with it.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            // Register before looking, so an add between the look and the
            // wait is not missed.
            notified.as_mut().enable();
            let wake_at = {
                let mut s = self.lock();
                if s.shut_down {
                    return None;
                }
                let now = Instant::now();
                s.promote_due(now);
                if let Some(key) = s.ready.pop_front() {
                    // No longer dirty: an add from now on means "again".
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    let more = !s.ready.is_empty();
                    drop(s);
                    if more {
                        // Pass the baton: notify_one woke only us.
                        self.wake.notify_one();
                    }
                    return Some(key);
                }
                s.delayed.first().map(|&(at, _)| at)
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// The worker finished `key`; if it was queued meanwhile it is ready again.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if s.dirty.contains_key(key) && !s.shut_down {
            s.ready.push_back(key.clone());
            drop(s);
            self.wake.notify_one();
        }
    }

    /// Stops handing out keys: every [`Self::next`] returns `None`.
    pub fn shut_down(&self) {
        self.lock().shut_down = true;
        self.wake.notify_waiters();
    }

    /// Number of keys ready to be processed (client-go's depth).
    pub fn len(&self) -> usize {
        self.lock().ready.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of keys waiting for a backoff or a requeue time.
    pub fn delayed_len(&self) -> usize {
        self.lock().delayed.len()
    }

    /// How long the oldest ready key has waited.
    pub fn oldest_age(&self) -> Duration {
        let s = self.lock();
        let now = Instant::now();
        s.ready
            .iter()
            .filter_map(|k| s.dirty.get(k))
            .map(|&t| now.saturating_duration_since(t))
            .max()
            .unwrap_or_default()
    }
}

impl<K: Clone + Eq + Hash> State<K> {
    /// Marks `key` dirty; true when it became ready.
    fn add_now(&mut self, key: K, now: Instant) -> bool {
        if self.shut_down || self.dirty.contains_key(&key) {
            return false;
        }
        self.dirty.insert(key.clone(), now);
        // A pending later time (a retry's backoff) stays: the key is
        // processed now and again then, as client-go's delaying queue does
        // (its Add leaves the waiting AddAfter entry alone). Cancelling it
        // would let any event cut a backoff short.
        if self.processing.contains(&key) {
            // `done` will queue it; handing it out now would run it twice.
            return false;
        }
        self.ready.push_back(key);
        true
    }

    fn promote_due(&mut self, now: Instant) {
        while let Some(&(at, seq)) = self.delayed.first() {
            if at > now {
                break;
            }
            self.delayed.pop_first();
            if let Some(key) = self.delayed_keys.remove(&seq) {
                self.delayed_at.remove(&key);
                self.add_now(key, now);
            }
        }
    }
}

/// What the metrics read of a queue, whatever its key type.
pub trait QueueStats: Send + Sync {
    fn depth(&self) -> usize;
    fn delayed(&self) -> usize;
    fn oldest_age(&self) -> Duration;
}

impl<K: Clone + Eq + Hash + Send> QueueStats for WorkQueue<K> {
    fn depth(&self) -> usize {
        self.len()
    }
    fn delayed(&self) -> usize {
        self.delayed_len()
    }
    fn oldest_age(&self) -> Duration {
        WorkQueue::oldest_age(self)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    name: String,
}

/// Exports, read at every scrape, `workqueue_depth{name}` (client-go's name)
/// plus `workqueue_oldest_item_age_seconds{name}` and
/// `workqueue_delayed_items{name}` (keys waiting for a backoff).
#[derive(Default)]
pub struct QueueMetrics {
    queues: Vec<(QueueLabel, std::sync::Arc<dyn QueueStats>)>,
}

impl std::fmt::Debug for QueueMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.queues.iter().map(|(l, _)| l.name.as_str()).collect();
        f.debug_struct("QueueMetrics")
            .field("queues", &names)
            .finish()
    }
}

impl QueueMetrics {
    pub fn add(&mut self, name: &str, queue: std::sync::Arc<dyn QueueStats>) {
        self.queues.push((
            QueueLabel {
                name: name.to_string(),
            },
            queue,
        ));
    }

    fn gauge(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        value: impl Fn(&dyn QueueStats) -> f64,
    ) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (label, queue) in &self.queues {
            ConstGauge::new(value(queue.as_ref())).encode(family.encode_family(label)?)?;
        }
        Ok(())
    }
}

impl Collector for QueueMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.gauge(
            &mut encoder,
            "workqueue_depth",
            "Current depth of workqueue",
            |q| q.depth() as f64,
        )?;
        self.gauge(
            &mut encoder,
            "workqueue_oldest_item_age_seconds",
            "How long the oldest ready item of the workqueue has waited",
            |q| q.oldest_age().as_secs_f64(),
        )?;
        self.gauge(
            &mut encoder,
            "workqueue_delayed_items",
            "Items waiting for their retry backoff or requeue time",
            |q| q.delayed() as f64,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new(Backoff {
            start: Duration::from_secs(1),
            max: Duration::from_secs(8),
        })
    }

    #[test]
    fn backoff_doubles_to_the_cap() {
        let b = Backoff {
            start: Duration::from_millis(500),
            max: Duration::from_secs(5),
        };
        let got: Vec<u128> = (0..6).map(|f| b.delay(f).as_millis()).collect();
        assert_eq!(got, vec![500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn duplicate_adds_coalesce_in_fifo_order() {
        let q = queue();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_is_never_handed_out_twice_at_once() {
        let q = Arc::new(queue());
        q.add("a");
        let k = q.next().await;
        assert_eq!(k, Some("a"));
        // Changed while processing: not ready until done.
        q.add("a");
        assert_eq!(q.len(), 0);
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.next().await })
        };
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!waiter.is_finished(), "handed out while still processing");
        q.done(&"a");
        assert_eq!(waiter.await.expect("join"), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn done_without_a_new_add_drops_the_key() {
        let q = queue();
        q.add("a");
        assert_eq!(q.next().await, Some("a"));
        q.done(&"a");
        assert!(q.is_empty());
        assert_eq!(q.delayed_len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_retries_back_off_until_forgotten() {
        let q = queue();
        let start = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..5 {
            q.add_rate_limited("a");
            let t = Instant::now();
            assert_eq!(q.next().await, Some("a"));
            waits.push((Instant::now() - t).as_secs());
            q.done(&"a");
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 8]);
        assert_eq!(q.failures(&"a"), 5);
        q.forget(&"a");
        q.add_rate_limited("a");
        let t = Instant::now();
        assert_eq!(q.next().await, Some("a"));
        assert_eq!((Instant::now() - t).as_secs(), 1);
        assert!(Instant::now() > start);
    }

    #[tokio::test(start_paused = true)]
    async fn earliest_requeue_time_wins_and_add_keeps_the_delay() {
        let q = queue();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(3));
        q.add_after("a", Duration::from_secs(20));
        assert_eq!(q.delayed_len(), 1);
        let t = Instant::now();
        assert_eq!(q.next().await, Some("a"));
        assert_eq!((Instant::now() - t).as_secs(), 3);
        q.done(&"a");

        q.add_after("b", Duration::from_secs(30));
        q.add("b");
        assert_eq!(q.delayed_len(), 1);
        let t = Instant::now();
        assert_eq!(q.next().await, Some("b"));
        assert_eq!(Instant::now(), t);
        q.done(&"b");
        assert_eq!(q.next().await, Some("b"));
        assert_eq!((Instant::now() - t).as_secs(), 30);
    }

    #[tokio::test(start_paused = true)]
    async fn a_plain_add_does_not_cancel_a_pending_retry() {
        let q = queue();
        q.add_rate_limited("a");
        // A change arrives while the retry waits: processed at once...
        q.add("a");
        let t = Instant::now();
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(Instant::now(), t);
        q.done(&"a");
        // ...and the retry still comes when its backoff is over, as in
        // client-go, whose Add leaves a waiting AddAfter alone.
        let retried = tokio::time::timeout(Duration::from_secs(60), q.next()).await;
        assert_eq!(retried, Ok(Some("a")));
        assert_eq!((Instant::now() - t).as_secs(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleeping_worker_picks_up_an_earlier_delay() {
        let q = Arc::new(queue());
        q.add_after("late", Duration::from_secs(100));
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let k = q.next().await;
                (k, (Instant::now() - t).as_secs())
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.add_after("soon", Duration::from_secs(2));
        assert_eq!(waiter.await.expect("join"), (Some("soon"), 3));
    }

    #[tokio::test(start_paused = true)]
    async fn many_workers_each_get_a_key() {
        let q = Arc::new(queue());
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move { q.next().await })
            })
            .collect();
        tokio::task::yield_now().await;
        for k in ["a", "b", "c", "d"] {
            q.add(k);
        }
        let mut got = Vec::new();
        for w in workers {
            got.push(w.await.expect("join").expect("key"));
        }
        got.sort_unstable();
        assert_eq!(got, vec!["a", "b", "c", "d"]);
    }

    #[tokio::test(start_paused = true)]
    async fn queue_metrics_are_read_at_scrape_time() {
        let q = Arc::new(queue());
        let mut metrics = QueueMetrics::default();
        metrics.add("claims", q.clone());
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(metrics));
        q.add("a");
        q.add_rate_limited("b");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("workqueue_depth{name=\"claims\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_delayed_items{name=\"claims\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_oldest_item_age_seconds{name=\"claims\"} 0.5"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn oldest_age_and_shutdown() {
        let q = Arc::new(queue());
        q.add("a");
        tokio::time::sleep(Duration::from_secs(5)).await;
        q.add("b");
        assert_eq!(q.oldest_age().as_secs(), 5);
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move {
                let _ = q.next().await;
                let _ = q.next().await;
                q.next().await
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.shut_down();
        assert_eq!(waiter.await.expect("join"), None);
        q.add("c");
        assert!(q.next().await.is_none());
    }
}
