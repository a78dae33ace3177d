//! client-go's client-side rate limit (`--kube-api-qps`, `--kube-api-burst`),
//! with priorities.
//!
//! One token bucket is shared by every request of the sidecar, as upstream's
//! is. Unlike upstream's first-come-first-served limiter, a request waiting
//! for a token waits in the queue of its [`Priority`], and the next token
//! goes to the oldest request of the highest non-empty queue:
//!
//! - writes that unblock a user (a PV created for a claim, a PV deleted)
//!   never wait behind bookkeeping or Events;
//! - Events are shed when too many already wait: under pressure they are
//!   what client-go's event correlator drops too, and nobody waits on them.
//!   A request of any other priority is never dropped.
//!
//! Each priority is a `kube::Client` of its own (see `kube::Clients`): the
//! priority is known where the write is made, not from the request.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::buffer::Buffer;
use tower::{BoxError, Service, ServiceExt};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use csiops_runtime::leader::{LeaseGuard, NotLeading};

/// A request to the API server, as kube's client stack carries it.
type Request = http::Request<kube::client::Body>;

/// Who waits for a token first: lower variants before higher ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// Writes a user waits on: PV create, PV delete and its finalizer.
    Critical = 0,
    /// Reads, watches, and writes on the way to a volume.
    Normal = 1,
    /// Writes after the fact: finalizers taken off a bound claim.
    Bookkeeping = 2,
    /// Events: shed when [`MAX_QUEUED_EVENTS`] already wait.
    Events = 3,
}

impl Priority {
    pub const ALL: [Priority; 4] = [
        Priority::Critical,
        Priority::Normal,
        Priority::Bookkeeping,
        Priority::Events,
    ];

    fn label(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Normal => "normal",
            Priority::Bookkeeping => "bookkeeping",
            Priority::Events => "events",
        }
    }
}

/// Events allowed to wait for a token; more are dropped. client-go's event
/// correlator lets 25 events of one object through in a burst and then one
/// per five minutes; a sidecar's Events are about many objects, so the bound
/// is on the backlog instead.
pub const MAX_QUEUED_EVENTS: usize = 100;

/// A request refused without being sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("Event dropped: {MAX_QUEUED_EVENTS} Events already wait for the API rate limit")]
    EventBacklog,
    #[error("the API rate limiter stopped")]
    Stopped,
    /// A write of a replica that does not hold the leader Lease (any more).
    #[error("write not sent")]
    NotLeading(#[from] NotLeading),
}

/// Whether a kube error is a request this limiter refused to send (an
/// Event shed under pressure, or any write once the Lease is lost): worth a
/// debug line, not a warning.
pub fn was_shed(error: &kube::Error) -> bool {
    match error {
        kube::Error::Service(e) => e
            .downcast_ref::<Refused>()
            .is_some_and(|r| matches!(r, Refused::EventBacklog | Refused::NotLeading(_))),
        _ => false,
    }
}

/// Whether a request changes something: every method but GET (reads,
/// lists and watches are GETs).
fn is_write(method: &http::Method) -> bool {
    method != http::Method::GET
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PriorityLabel {
    priority: &'static str,
}

/// `csiops_kube_api_throttled_total{priority}` (requests that had to wait
/// for a token) and `csiops_kube_api_dropped_total{priority}` (requests shed).
#[derive(Clone, Debug, Default)]
pub struct LimiterMetrics {
    throttled: Family<PriorityLabel, Counter>,
    dropped: Family<PriorityLabel, Counter>,
}

impl LimiterMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "csiops_kube_api_throttled",
            "Requests that waited for the client-side rate limit, by priority",
            self.throttled.clone(),
        );
        registry.register(
            "csiops_kube_api_dropped",
            "Requests dropped by the client-side rate limit (only Events are), by priority",
            self.dropped.clone(),
        );
    }

    /// Requests of `priority` dropped so far.
    pub fn dropped(&self, priority: Priority) -> u64 {
        self.dropped
            .get_or_create(&PriorityLabel {
                priority: priority.label(),
            })
            .get()
    }

    fn count(family: &Family<PriorityLabel, Counter>, priority: Priority) {
        family
            .get_or_create(&PriorityLabel {
                priority: priority.label(),
            })
            .inc();
    }
}

type Queue = VecDeque<(Instant, oneshot::Sender<()>)>;

struct Waiter {
    priority: Priority,
    grant: oneshot::Sender<()>,
}

/// The shared limiter: cheap to clone, one dispatcher task behind it.
#[derive(Clone)]
pub struct Limiter {
    waiters: mpsc::UnboundedSender<Waiter>,
    queued_events: Arc<AtomicUsize>,
    metrics: LimiterMetrics,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("queued_events", &self.queued_events)
            .finish_non_exhaustive()
    }
}

impl Limiter {
    /// A full bucket of `burst` tokens refilled at `qps`; spawns the
    /// dispatcher, which ends when the last `Limiter` clone is dropped.
    pub fn new(qps: f64, burst: u32, metrics: LimiterMetrics) -> Limiter {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued_events = Arc::new(AtomicUsize::new(0));
        tokio::spawn(dispatch(
            rx,
            TokenBucket::new(qps, burst),
            queued_events.clone(),
            metrics.clone(),
        ));
        Limiter {
            waiters: tx,
            queued_events,
            metrics,
        }
    }

    /// Waits for a token for a request of `priority`. An Event is refused
    /// at once when [`MAX_QUEUED_EVENTS`] already wait.
    pub async fn acquire(&self, priority: Priority) -> Result<(), Refused> {
        if priority == Priority::Events {
            let queued = self.queued_events.fetch_add(1, Ordering::SeqCst);
            if queued >= MAX_QUEUED_EVENTS {
                self.queued_events.fetch_sub(1, Ordering::SeqCst);
                LimiterMetrics::count(&self.metrics.dropped, priority);
                return Err(Refused::EventBacklog);
            }
        }
        let (grant, granted) = oneshot::channel();
        if self.waiters.send(Waiter { priority, grant }).is_err() {
            return Err(Refused::Stopped);
        }
        granted.await.map_err(|_| Refused::Stopped)
    }
}

/// Hands out tokens: everything already sent is queued by priority before
/// each decision, so a critical request that arrives while others wait is
/// the next one served.
async fn dispatch(
    mut incoming: mpsc::UnboundedReceiver<Waiter>,
    mut bucket: TokenBucket,
    queued_events: Arc<AtomicUsize>,
    metrics: LimiterMetrics,
) {
    // Each waiter with the time it came, to count the ones that waited.
    let mut queues: [Queue; 4] = Default::default();
    let enqueue = |queues: &mut [Queue; 4], w: Waiter| {
        queues[w.priority as usize].push_back((Instant::now(), w.grant));
    };
    loop {
        while let Ok(w) = incoming.try_recv() {
            enqueue(&mut queues, w);
        }
        // Requests given up (their future dropped) take no token.
        for (i, queue) in queues.iter_mut().enumerate() {
            while queue.front().is_some_and(|(_, g)| g.is_closed()) {
                queue.pop_front();
                if i == Priority::Events as usize {
                    queued_events.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        let Some(next) = queues.iter().position(|q| !q.is_empty()) else {
            match incoming.recv().await {
                Some(w) => {
                    enqueue(&mut queues, w);
                    continue;
                }
                None => return,
            }
        };
        match bucket.try_take(Instant::now()) {
            Ok(()) => {
                if let Some((came, grant)) = queues[next].pop_front() {
                    if next == Priority::Events as usize {
                        queued_events.fetch_sub(1, Ordering::SeqCst);
                    }
                    if came < Instant::now() {
                        LimiterMetrics::count(&metrics.throttled, Priority::ALL[next]);
                    }
                    if grant.send(()).is_err() {
                        // Given up between the check and now.
                        bucket.refund();
                    }
                }
            }
            Err(wait) => {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    w = incoming.recv() => match w {
                        Some(w) => enqueue(&mut queues, w),
                        None => return,
                    },
                }
            }
        }
    }
}

/// A request extension: the request's token was taken beforehand with
/// [`Limiter::acquire`], so [`Throttled`] sends it at once. A batching
/// writer takes its token first and fills its request after, so that what
/// queues while it waits for the token rides in that request (see
/// `provisioner::journal`).
#[derive(Clone, Copy, Debug)]
pub struct Prepaid;

/// Puts a [`Throttled`] of one priority in front of kube's HTTP stack.
#[derive(Clone, Debug)]
pub struct PriorityLayer {
    pub limiter: Limiter,
    pub priority: Priority,
    pub requests: ApiRequests,
    /// Consulted before every write: none is sent without the Lease.
    pub lease: LeaseGuard,
}

impl<S> tower::Layer<S> for PriorityLayer
where
    S: Service<Request> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = Throttled<Buffer<Request, S::Future>>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttled {
            // A handle per request: each request waits for its token in its
            // own future, so one waiting request never holds up a request of
            // a higher priority (kube's own buffer in front of this service
            // serves requests in arrival order, and this service is always
            // ready for it).
            inner: Buffer::new(inner, 1024),
            limiter: self.limiter.clone(),
            priority: self.priority,
            requests: self.requests.clone(),
            lease: self.lease.clone(),
        }
    }
}

/// Waits for a token of its priority (unless the request is [`Prepaid`]),
/// then sends the request — a write only while the [`LeaseGuard`] is held,
/// checked after the wait for the token (which may be long), right before
/// it goes out.
#[derive(Clone, Debug)]
pub struct Throttled<S> {
    inner: S,
    limiter: Limiter,
    priority: Priority,
    requests: ApiRequests,
    lease: LeaseGuard,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<Request> for Throttled<S>
where
    S: Service<Request> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    S::Response: Send,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let (inner, limiter, priority, requests, lease) = (
            self.inner.clone(),
            self.limiter.clone(),
            self.priority,
            self.requests.clone(),
            self.lease.clone(),
        );
        Box::pin(async move {
            let write = is_write(req.method());
            if write {
                lease.check().map_err(Refused::from)?;
            }
            if req.extensions().get::<Prepaid>().is_none() {
                limiter.acquire(priority).await?;
            }
            if write {
                lease.check().map_err(Refused::from)?;
            }
            requests.count(req.method());
            inner.oneshot(req).await.map_err(Into::into)
        })
    }
}

/// `csiops_kube_api_requests_total{verb}` (the counter every csiops process
/// shares, see `csiops_runtime::requests`): every request the sidecar sent,
/// counted by its rate limiter when the request goes out. What the QPS
/// limit is spent on, and the write counts the benchmarks report. With it,
/// the rate limiter's own counts (see `ratelimit::LimiterMetrics`).
#[derive(Clone, Debug, Default)]
pub struct ApiRequests {
    sent: csiops_runtime::requests::ApiRequests,
    pub limiter: LimiterMetrics,
}

impl ApiRequests {
    pub fn register(&self, registry: &mut Registry) {
        self.sent.register(registry);
        self.limiter.register(registry);
    }

    pub(crate) fn count(&self, method: &http::Method) {
        self.sent.count(method);
    }

    /// Requests so far with `method` (`GET`, `PATCH`, …).
    pub fn get(&self, method: &str) -> u64 {
        self.sent.get(method)
    }
}

/// A token bucket: `burst` tokens, refilled at `qps` per second.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Puts back a token taken for a request that was then not sent.
    pub fn refund(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }

    /// Takes a token now, or says how long until one is available.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Starts `n` requests of each priority in `order`, all at once, and
    /// returns the priorities in the order they got their tokens.
    async fn served_order(limiter: &Limiter, order: &[(Priority, usize)]) -> Vec<Priority> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        for &(priority, n) in order {
            for _ in 0..n {
                let (limiter, tx) = (limiter.clone(), tx.clone());
                tokio::spawn(async move {
                    if limiter.acquire(priority).await.is_ok() {
                        let _ = tx.send(priority);
                    }
                });
                // Each request is queued before the next is started.
                tokio::task::yield_now().await;
            }
        }
        drop(tx);
        let mut served = Vec::new();
        while let Some(p) = rx.recv().await {
            served.push(p);
        }
        served
    }

    #[tokio::test(start_paused = true)]
    async fn critical_writes_overtake_queued_bookkeeping_and_events() {
        let limiter = Limiter::new(5.0, 1, LimiterMetrics::default());
        // The burst token goes to the first request; the rest wait.
        let served = served_order(
            &limiter,
            &[
                (Priority::Events, 3),
                (Priority::Bookkeeping, 3),
                (Priority::Normal, 2),
                (Priority::Critical, 2),
            ],
        )
        .await;
        use Priority::*;
        assert_eq!(
            served,
            vec![
                Events, // took the only token at once
                Critical,
                Critical,
                Normal,
                Normal,
                Bookkeeping,
                Bookkeeping,
                Bookkeeping,
                Events,
                Events
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_come_at_the_rate_whatever_the_priority() {
        let limiter = Limiter::new(4.0, 2, LimiterMetrics::default());
        let start = Instant::now();
        let mut times = Vec::new();
        for p in [
            Priority::Critical,
            Priority::Normal,
            Priority::Events,
            Priority::Bookkeeping,
        ] {
            limiter.acquire(p).await.expect("granted");
            times.push((Instant::now() - start).as_millis());
        }
        assert_eq!(times, vec![0, 0, 250, 500]);
    }

    #[tokio::test(start_paused = true)]
    async fn events_beyond_the_backlog_are_dropped_and_nothing_else_is() {
        let metrics = LimiterMetrics::default();
        let limiter = Limiter::new(1.0, 1, metrics.clone());
        // Hold the bucket empty with one request served.
        limiter.acquire(Priority::Normal).await.expect("burst");
        let mut waiting = Vec::new();
        for _ in 0..MAX_QUEUED_EVENTS {
            let l = limiter.clone();
            waiting.push(tokio::spawn(
                async move { l.acquire(Priority::Events).await },
            ));
            tokio::task::yield_now().await;
        }
        assert_eq!(
            limiter.acquire(Priority::Events).await,
            Err(Refused::EventBacklog)
        );
        assert_eq!(metrics.dropped(Priority::Events), 1);
        // A bookkeeping write is never dropped: it waits, behind nothing
        // but its betters, and gets the next token.
        let bookkeeping = limiter.clone();
        let write = tokio::spawn(async move { bookkeeping.acquire(Priority::Bookkeeping).await });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(write.is_finished());
        assert_eq!(write.await.expect("task"), Ok(()));
        assert_eq!(metrics.dropped(Priority::Bookkeeping), 0);
        for w in waiting {
            w.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_given_up_takes_no_token() {
        let limiter = Limiter::new(1.0, 1, LimiterMetrics::default());
        limiter.acquire(Priority::Normal).await.expect("burst");
        let l = limiter.clone();
        let abandoned = tokio::spawn(async move { l.acquire(Priority::Critical).await });
        tokio::task::yield_now().await;
        abandoned.abort();
        let start = Instant::now();
        limiter.acquire(Priority::Events).await.expect("granted");
        // The token after one second goes to the Event, not the dropped request.
        assert_eq!((Instant::now() - start).as_millis(), 1000);
    }

    /// Clients of two priorities over one limiter: the server sees the
    /// critical requests first, although they were sent last.
    #[tokio::test(start_paused = true)]
    async fn clients_of_one_limiter_are_served_by_priority() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let server = {
            let seen = seen.clone();
            tower::service_fn(move |req: Request| {
                let seen = seen.clone();
                async move {
                    if let Ok(mut s) = seen.lock() {
                        s.push(req.uri().path().to_string());
                    }
                    http::Response::builder()
                        .status(200)
                        .body(kube::client::Body::from(b"{}".to_vec()))
                }
            })
        };
        let requests = ApiRequests::default();
        let limiter = Limiter::new(2.0, 1, requests.limiter.clone());
        let client = |priority| {
            let layer = PriorityLayer {
                limiter: limiter.clone(),
                priority,
                requests: requests.clone(),
                lease: LeaseGuard::unconditional(),
            };
            kube::Client::new(tower::Layer::layer(&layer, server.clone()), "default")
        };
        let (bookkeeping, critical) = (client(Priority::Bookkeeping), client(Priority::Critical));
        let mut sent = Vec::new();
        for (c, path) in [
            (&bookkeeping, "/b1"),
            (&bookkeeping, "/b2"),
            (&bookkeeping, "/b3"),
            (&critical, "/c1"),
            (&critical, "/c2"),
        ] {
            let c = c.clone();
            let req = http::Request::get(path).body(Vec::new()).expect("request");
            sent.push(tokio::spawn(async move { c.request_text(req).await }));
            tokio::task::yield_now().await;
        }
        for s in sent {
            s.await.expect("task").expect("answered");
        }
        let order = seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(order, ["/b1", "/c1", "/c2", "/b2", "/b3"]);
        assert_eq!(requests.get("GET"), 5);
        // Four of them waited for a token.
        let throttled: u64 = Priority::ALL
            .iter()
            .map(|p| {
                requests
                    .limiter
                    .throttled
                    .get_or_create(&PriorityLabel {
                        priority: p.label(),
                    })
                    .get()
            })
            .sum();
        assert_eq!(throttled, 4);
    }

    /// A server noting `METHOD path` of each request it answers.
    fn server_of(
        seen: &Arc<std::sync::Mutex<Vec<String>>>,
    ) -> impl Service<
        Request,
        Response = http::Response<kube::client::Body>,
        Error = http::Error,
        Future = impl Future<Output = Result<http::Response<kube::client::Body>, http::Error>> + Send,
    > + Clone
           + Send
           + 'static {
        let seen = seen.clone();
        tower::service_fn(move |req: Request| {
            let seen = seen.clone();
            async move {
                if let Ok(mut s) = seen.lock() {
                    s.push(format!("{} {}", req.method(), req.uri().path()));
                }
                http::Response::builder()
                    .status(200)
                    .body(kube::client::Body::from(b"{}".to_vec()))
            }
        })
    }

    /// Without the Lease no write goes out (reads do), and a Lease lost
    /// while a write waits for its token stops it before it is sent.
    #[tokio::test(start_paused = true)]
    async fn writes_go_out_only_while_the_lease_is_held() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let server = server_of(&seen);
        let requests = ApiRequests::default();
        let limiter = Limiter::new(1.0, 1, requests.limiter.clone());
        let lease = LeaseGuard::new();
        let layer = PriorityLayer {
            limiter: limiter.clone(),
            priority: Priority::Normal,
            requests: requests.clone(),
            lease: lease.clone(),
        };
        let client = kube::Client::new(tower::Layer::layer(&layer, server), "default");
        let send = |method: &str, path: &str| {
            let req = http::Request::builder()
                .method(method)
                .uri(path)
                .body(Vec::new())
                .expect("request");
            let client = client.clone();
            async move { client.request_text(req).await }
        };
        // Not leading: the read goes, the writes do not.
        send("GET", "/read").await.expect("a read needs no Lease");
        for method in ["POST", "PUT", "PATCH", "DELETE"] {
            let refused = send(method, "/write").await.expect_err(method);
            assert!(was_shed(&refused), "{method}: {refused:?}");
        }
        assert_eq!(
            requests.get("POST"),
            0,
            "refused writes are not counted as sent"
        );

        // Leading: writes go. One waits for its token (the bucket is
        // empty) while the Lease is lost: it is stopped before it is sent.
        let held = LeaseGuard::held_until(Instant::now() + Duration::from_secs(60));
        let layer = PriorityLayer {
            lease: held.clone(),
            ..layer
        };
        let client = kube::Client::new(tower::Layer::layer(&layer, server_of(&seen)), "default");
        let patch = |path: &'static str| {
            let req = http::Request::patch(path)
                .body(Vec::new())
                .expect("request");
            let client = client.clone();
            async move { client.request_text(req).await }
        };
        patch("/sent").await.expect("a leader's write goes");
        let waiting = tokio::spawn(patch("/late"));
        tokio::task::yield_now().await;
        held.lose();
        tokio::time::advance(Duration::from_secs(2)).await;
        let late = waiting
            .await
            .expect("task")
            .expect_err("sent without the Lease");
        assert!(was_shed(&late), "{late:?}");
        assert_eq!(
            seen.lock().map(|s| s.clone()).unwrap_or_default(),
            ["GET /read", "PATCH /sent"]
        );
    }

    /// A prepaid request takes no second token, and is still counted.
    #[tokio::test(start_paused = true)]
    async fn a_prepaid_request_is_sent_at_once() {
        let server = tower::service_fn(|_req: Request| async {
            http::Response::builder()
                .status(200)
                .body(kube::client::Body::from(b"{}".to_vec()))
        });
        let requests = ApiRequests::default();
        let limiter = Limiter::new(1.0, 1, requests.limiter.clone());
        let layer = PriorityLayer {
            limiter: limiter.clone(),
            priority: Priority::Normal,
            requests: requests.clone(),
            lease: LeaseGuard::unconditional(),
        };
        let client = kube::Client::new(tower::Layer::layer(&layer, server), "default");
        let start = Instant::now();
        limiter
            .acquire(Priority::Normal)
            .await
            .expect("the burst token");
        let mut req = http::Request::get("/prepaid")
            .body(Vec::new())
            .expect("request");
        req.extensions_mut().insert(Prepaid);
        client.request_text(req).await.expect("answered");
        assert_eq!((Instant::now() - start).as_millis(), 0, "sent at once");
        // An ordinary request waits for the next token.
        let req = http::Request::get("/plain")
            .body(Vec::new())
            .expect("request");
        client.request_text(req).await.expect("answered");
        assert_eq!((Instant::now() - start).as_millis(), 1000);
        assert_eq!(requests.get("GET"), 2);
    }

    #[test]
    fn bucket_allows_a_burst_then_the_rate() {
        let mut b = TokenBucket::new(10.0, 3);
        let t0 = b.last;
        for _ in 0..3 {
            assert_eq!(b.try_take(t0), Ok(()));
        }
        let wait = b.try_take(t0).expect_err("bucket empty");
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // 100ms later exactly one token is back.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(b.try_take(t1), Ok(()));
        assert!(b.try_take(t1).is_err());
        // A long pause refills to the burst, not beyond.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.try_take(t2), Ok(()));
        }
        assert!(b.try_take(t2).is_err());
    }
}
