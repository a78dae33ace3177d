//! Pod churn folded before it reaches the controller: at most one trigger
//! per object every [`pace::MIN_INTERVAL`](super::pace::MIN_INTERVAL).
//!
//! During a node roll a driver's pods change many times a second (deleted,
//! created, scheduled, running, ready, on every node). The pacer turns most
//! of those triggers away, but each would still cost the controller's
//! scheduling and a reconcile call that only finds it is too soon, many
//! times the passes that do work. This stream passes an object's first
//! trigger at once and folds every later one within the interval into a
//! single trigger at its end, so the last change of a burst is never lost,
//! only late by at most the interval, the same delay the pacer would have
//! imposed.
//!
//! Only pod triggers go through here. What a rollout step waits on (the
//! object, its workloads, nodes, CSINodes) keeps its own unthrottled
//! triggers and the pacer's [`Waypoints`](super::pace::Waypoints).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::time::Instant;

/// What the throttle keeps between items.
struct State<S, T> {
    input: S,
    interval: Duration,
    /// When each recently passed item last went out.
    last: HashMap<T, Instant>,
    /// Items held, by when they are due.
    due: BTreeMap<Instant, Vec<T>>,
    held: HashSet<T>,
    /// Items due now, not yet handed out.
    ready: Vec<T>,
    input_done: bool,
}

/// `input`, with each item passed at most once per `interval`: the first
/// at once, later ones within the interval folded into one at its end.
/// Ends when `input` ends (items still held are dropped then: nothing is
/// left to reconcile for a controller that is shutting down).
pub fn throttle<S, T>(input: S, interval: Duration) -> impl Stream<Item = T> + Send
where
    S: Stream<Item = T> + Send + Unpin + 'static,
    T: Clone + Eq + Hash + Send + Sync + 'static,
{
    let state: State<S, T> = State {
        input,
        interval,
        last: HashMap::new(),
        due: BTreeMap::new(),
        held: HashSet::new(),
        ready: Vec::new(),
        input_done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(item) = st.ready.pop() {
                st.last.insert(item.clone(), Instant::now());
                return Some((item, st));
            }
            if st.input_done {
                return None;
            }
            let next_due = st.due.keys().next().copied();
            tokio::select! {
                item = st.input.next() => match item {
                    Some(item) => st.offer(item),
                    None => st.input_done = true,
                },
                _ = sleep_until(next_due) => st.release(Instant::now()),
            }
        }
    })
}

/// Sleeps until `at`, or forever when nothing is held.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

impl<S, T: Clone + Eq + Hash> State<S, T> {
    /// An item came in: out at once, or held until its interval ends.
    fn offer(&mut self, item: T) {
        let now = Instant::now();
        self.forget_before(now);
        match self.last.get(&item) {
            Some(at) if now.saturating_duration_since(*at) < self.interval => {
                if self.held.insert(item.clone()) {
                    self.due.entry(*at + self.interval).or_default().push(item);
                }
            }
            _ => self.ready.push(item),
        }
    }

    /// Held items whose interval has ended become ready.
    fn release(&mut self, now: Instant) {
        let later = self.due.split_off(&(now + Duration::from_nanos(1)));
        let due = std::mem::replace(&mut self.due, later);
        for item in due.into_values().flatten() {
            self.held.remove(&item);
            self.ready.push(item);
        }
    }

    /// Drops what is too old to hold anything back (deleted objects do not
    /// pile up).
    fn forget_before(&mut self, now: Instant) {
        if self.last.len() > 64 {
            let interval = self.interval;
            self.last
                .retain(|_, at| now.saturating_duration_since(*at) < interval);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;

    const I: Duration = Duration::from_millis(250);

    /// The items out of the throttle within `wait` of virtual time.
    async fn drain<T>(out: &mut (impl Stream<Item = T> + Unpin), wait: Duration) -> Vec<T> {
        let mut got = Vec::new();
        let until = Instant::now() + wait;
        while let Ok(Some(item)) = tokio::time::timeout_at(until, out.next()).await {
            got.push(item);
        }
        got
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_goes_at_once_a_burst_after_it_folds_into_one_at_the_interval_end() {
        let (tx, rx) = mpsc::unbounded::<&str>();
        let mut out = Box::pin(throttle(rx, I));
        tx.unbounded_send("a").unwrap();
        assert_eq!(drain(&mut out, Duration::from_millis(1)).await, ["a"]);
        for _ in 0..50 {
            tx.unbounded_send("a").unwrap();
        }
        tx.unbounded_send("b").unwrap();
        // b is another object: not held by a's interval.
        assert_eq!(drain(&mut out, Duration::from_millis(10)).await, ["b"]);
        let t = Instant::now();
        assert_eq!(drain(&mut out, I).await, ["a"], "the burst, once");
        assert!(t.elapsed() <= I);
        // Quiet for an interval: the next one goes at once again.
        tokio::time::sleep(I).await;
        tx.unbounded_send("a").unwrap();
        assert_eq!(drain(&mut out, Duration::from_millis(1)).await, ["a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn steady_churn_passes_once_per_interval_and_its_last_change_is_not_lost() {
        let (tx, rx) = mpsc::unbounded::<u8>();
        let mut out = Box::pin(throttle(rx, I));
        let start = Instant::now();
        let feed = tokio::spawn(async move {
            // One every 6 ms (about 166 a second) for 1.8 s, a node
            // roll's pace.
            for _ in 0..300 {
                tx.unbounded_send(7).unwrap();
                tokio::time::sleep(Duration::from_millis(1000 / 150)).await;
            }
            (tx, Instant::now())
        });
        let mut times = Vec::new();
        let until = start + Duration::from_millis(2600);
        while let Ok(Some(_)) = tokio::time::timeout_at(until, out.next()).await {
            times.push(Instant::now());
        }
        let (_tx, fed_until) = feed.await.unwrap();
        assert!(
            (8..=10).contains(&times.len()),
            "about one per interval over 1.8 s and the wait after it, {} out",
            times.len()
        );
        for pair in times.windows(2) {
            assert!(pair[1] - pair[0] >= I, "two within an interval");
        }
        let last = times.last().copied().unwrap_or(start);
        assert!(
            last + Duration::from_millis(10) >= fed_until,
            "the churn's end went out ({:?} after the last send)",
            fed_until.saturating_duration_since(last)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ends_with_its_input() {
        let (tx, rx) = mpsc::unbounded::<u8>();
        let mut out = Box::pin(throttle(rx, I));
        tx.unbounded_send(1).unwrap();
        tx.unbounded_send(1).unwrap();
        drop(tx);
        assert_eq!(out.next().await, Some(1));
        assert_eq!(out.next().await, None);
    }
}
