//! Who may read `/metrics` when `--metrics-auth` is on: the caller's bearer
//! token is authenticated with a TokenReview and its user authorized with a
//! SubjectAccessReview (`get` on the non-resource URL of the metrics path) —
//! the checks kube-rbac-proxy makes, in-process, so a driver pod needs no
//! proxy container per sidecar. Verdicts are remembered briefly
//! ([`super::verdicts`]). Concurrent requests with one token wait for one
//! review instead of each making their own, and reviews of tokens not yet
//! judged are bounded in rate (429 beyond it): a caller spraying tokens
//! cannot make this port flood the API server.
//!
//! A token is never logged, and never kept: only its digest is.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use std::collections::HashMap;

use super::verdicts::{digest, ReviewBudget, TokenDigest, Verdict, Verdicts};
use crate::error::chain;

/// Why a caller could not be checked (the API server did not answer the
/// review). Not the caller's fault: answered 503, and not remembered.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("TokenReview failed")]
    TokenReview(#[source] kube::Error),
    #[error("SubjectAccessReview failed")]
    SubjectAccessReview(#[source] kube::Error),
}

/// Why the gate let a caller neither in nor out.
#[derive(Clone, Debug, thiserror::Error)]
pub enum GateError {
    /// The review failed (shared by every request that waited for it): 503.
    #[error("the access review failed")]
    Review(#[source] Arc<ReviewError>),
    /// Too many tokens not yet judged this second: 429, try again.
    #[error("too many new callers to review now")]
    Throttled,
}

/// Future of one review.
pub type ReviewFuture<'a> = Pin<Box<dyn Future<Output = Result<Verdict, ReviewError>> + Send + 'a>>;

/// Decides on a token for a path. The API server in production; a fake in
/// unit tests.
pub trait Reviewer: Send + Sync + 'static {
    /// Authenticates `token`, then authorizes `get` on `path` for its user.
    fn review<'a>(&'a self, token: &'a str, path: &'a str) -> ReviewFuture<'a>;
}

/// The API server's TokenReview and SubjectAccessReview. The process's
/// ServiceAccount needs `create` on both (the operator grants it when
/// `spec.monitoring.metricsAuth` is on).
#[derive(Clone)]
pub struct KubeReviewer {
    client: kube::Client,
}

impl KubeReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Reviewer for KubeReviewer {
    fn review<'a>(&'a self, token: &'a str, path: &'a str) -> ReviewFuture<'a> {
        Box::pin(async move {
            let reviews: Api<TokenReview> = Api::all(self.client.clone());
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_string()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answer = reviews
                .create(&PostParams::default(), &review)
                .await
                .map_err(ReviewError::TokenReview)?;
            let status = answer.status.unwrap_or_default();
            let user = match (status.authenticated, status.user) {
                (Some(true), Some(user)) => user,
                _ => {
                    // The API server's reason names no secret (e.g. "token
                    // has expired"); the token itself is never logged.
                    tracing::debug!(reason = ?status.error, "metrics caller not authenticated");
                    return Ok(Verdict::Unauthenticated);
                }
            };
            let sars: Api<SubjectAccessReview> = Api::all(self.client.clone());
            let answer = sars
                .create(&PostParams::default(), &access_review(&user, path))
                .await
                .map_err(ReviewError::SubjectAccessReview)?;
            let allowed = answer.status.is_some_and(|s| s.allowed);
            tracing::debug!(user = ?user.username, allowed, "metrics caller authorized");
            Ok(if allowed {
                Verdict::Allowed
            } else {
                Verdict::Forbidden
            })
        })
    }
}

/// The SubjectAccessReview of `user` reading `path` (`get` on a
/// non-resource URL, as `kubectl get --raw` and Prometheus are authorized
/// against `/metrics` on the API server itself).
pub fn access_review(user: &UserInfo, path: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.to_string()),
                verb: Some("get".to_string()),
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme
/// case-insensitive, as RFC 6750 allows); `None` without one.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The one review of a token that concurrent requests share.
type InFlight = Arc<tokio::sync::OnceCell<Result<Verdict, GateError>>>;

/// The gate in front of the metrics handler: a reviewer and its verdicts.
pub struct MetricsGate {
    reviewer: Arc<dyn Reviewer>,
    verdicts: Mutex<Verdicts>,
    budget: Mutex<ReviewBudget>,
    in_flight: Mutex<HashMap<TokenDigest, InFlight>>,
}

impl std::fmt::Debug for MetricsGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsGate").finish_non_exhaustive()
    }
}

impl MetricsGate {
    pub fn new(reviewer: Arc<dyn Reviewer>) -> Self {
        Self::with_budget(reviewer, ReviewBudget::default())
    }

    /// A gate reviewing at most what `budget` allows.
    pub fn with_budget(reviewer: Arc<dyn Reviewer>, budget: ReviewBudget) -> Self {
        Self {
            reviewer,
            verdicts: Mutex::new(Verdicts::default()),
            budget: Mutex::new(budget),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict on the caller of `path` with `headers`, remembered or
    /// asked.
    pub async fn check(&self, headers: &HeaderMap, path: &str) -> Result<Verdict, GateError> {
        self.check_at(headers, path, Instant::now()).await
    }

    /// [`check`](Self::check) at `now` (the verdicts' clock).
    async fn check_at(
        &self,
        headers: &HeaderMap,
        path: &str,
        now: Instant,
    ) -> Result<Verdict, GateError> {
        let Some(token) = bearer_token(headers) else {
            return Ok(Verdict::Unauthenticated);
        };
        let key = digest(token);
        if let Some(verdict) = lock(&self.verdicts).get(&key, now) {
            return Ok(verdict);
        }
        // One review per token at a time: later callers wait for it (if the
        // one reviewing goes away, a waiter takes over).
        let cell: InFlight = lock(&self.in_flight).entry(key).or_default().clone();
        let outcome = cell
            .get_or_init(|| async {
                // Another caller may have just finished the review.
                if let Some(verdict) = lock(&self.verdicts).get(&key, now) {
                    return Ok(verdict);
                }
                // The budget is for tokens never allowed: a scraper whose
                // allow just expired is reviewed whatever a sprayer spent.
                let known = lock(&self.verdicts).was_allowed(&key, now);
                if !known && !lock(&self.budget).take(now) {
                    return Err(GateError::Throttled);
                }
                let verdict = self
                    .reviewer
                    .review(token, path)
                    .await
                    .map_err(|e| GateError::Review(Arc::new(e)))?;
                lock(&self.verdicts).insert(key, verdict, now);
                Ok(verdict)
            })
            .await
            .clone();
        // Done: the next review of this token (after its verdict expires,
        // or after a failure) is a new one.
        let mut in_flight = lock(&self.in_flight);
        if in_flight.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            in_flight.remove(&key);
        }
        outcome
    }

    /// How many tokens are being reviewed right now.
    pub fn reviews_in_flight(&self) -> usize {
        lock(&self.in_flight).len()
    }
}

/// `mutex`'s content; a panic elsewhere while holding it leaves it
/// consistent (every update is one map or counter operation), so poisoning
/// is ignored.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The answer to a caller who is not let in; `None` when allowed.
pub fn refusal(outcome: &Result<Verdict, GateError>) -> Option<Response> {
    match outcome {
        Ok(Verdict::Allowed) => None,
        Ok(Verdict::Unauthenticated) => Some(
            (
                StatusCode::UNAUTHORIZED,
                [(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"csiops metrics\""),
                )],
                "Unauthorized\n",
            )
                .into_response(),
        ),
        Ok(Verdict::Forbidden) => Some((StatusCode::FORBIDDEN, "Forbidden\n").into_response()),
        Err(GateError::Throttled) => {
            tracing::debug!("metrics caller throttled: too many new tokens to review");
            Some(
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, HeaderValue::from_static("1"))],
                    "too many new callers to check now; retry\n",
                )
                    .into_response(),
            )
        }
        Err(error) => {
            tracing::warn!(error = %chain(error), "cannot check a metrics caller");
            Some(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "cannot check the caller's access now\n",
                )
                    .into_response(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token(&headers("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&headers("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(&headers("Basic YWxhZGRpbjpvcGVu")), None);
        assert_eq!(bearer_token(&headers("Bearer ")), None);
        assert_eq!(bearer_token(&headers("Bearer")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn the_access_review_is_get_on_the_path_for_the_whole_identity() {
        let user = UserInfo {
            username: Some("system:serviceaccount:monitoring:prometheus".into()),
            uid: Some("u-1".into()),
            groups: Some(vec!["system:serviceaccounts".into()]),
            extra: Some([("k".to_string(), vec!["v".to_string()])].into()),
        };
        let sar = access_review(&user, "/metrics");
        assert_eq!(sar.spec.user, user.username);
        assert_eq!(sar.spec.uid, user.uid);
        assert_eq!(sar.spec.groups, user.groups);
        assert_eq!(sar.spec.extra, user.extra);
        let attrs = sar.spec.non_resource_attributes.unwrap();
        assert_eq!(attrs.path.as_deref(), Some("/metrics"));
        assert_eq!(attrs.verb.as_deref(), Some("get"));
        assert!(sar.spec.resource_attributes.is_none());
    }

    /// Allows "good", forbids "other", rejects everything else; counts calls.
    #[derive(Default)]
    struct Fake(AtomicUsize);

    impl Reviewer for Fake {
        fn review<'a>(&'a self, token: &'a str, path: &'a str) -> ReviewFuture<'a> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                assert_eq!(path, "/metrics");
                Ok(match token {
                    "good" => Verdict::Allowed,
                    "other" => Verdict::Forbidden,
                    _ => Verdict::Unauthenticated,
                })
            })
        }
    }

    #[tokio::test]
    async fn verdicts_are_asked_once_then_remembered() {
        let fake = Arc::new(Fake::default());
        let gate = MetricsGate::new(fake.clone());
        let good = headers("Bearer good");
        assert_eq!(
            gate.check(&good, "/metrics").await.unwrap(),
            Verdict::Allowed
        );
        assert_eq!(
            gate.check(&good, "/metrics").await.unwrap(),
            Verdict::Allowed
        );
        assert_eq!(fake.0.load(Ordering::SeqCst), 1);
        let other = headers("Bearer other");
        assert_eq!(
            gate.check(&other, "/metrics").await.unwrap(),
            Verdict::Forbidden
        );
        assert_eq!(
            gate.check(&headers("Bearer bad"), "/metrics")
                .await
                .unwrap(),
            Verdict::Unauthenticated
        );
        // No token: refused without asking anyone.
        assert_eq!(
            gate.check(&HeaderMap::new(), "/metrics").await.unwrap(),
            Verdict::Unauthenticated
        );
        assert_eq!(fake.0.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn refusals_map_to_401_403_503() {
        assert!(refusal(&Ok(Verdict::Allowed)).is_none());
        let r = refusal(&Ok(Verdict::Unauthenticated)).unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(r.headers().contains_key(header::WWW_AUTHENTICATE));
        assert_eq!(
            refusal(&Ok(Verdict::Forbidden)).unwrap().status(),
            StatusCode::FORBIDDEN
        );
        // The API server did not answer the review: not the caller's fault.
        let down = kube::Error::Api(Box::new(
            kube::core::Status::failure("etcdserver: request timed out", "Timeout").with_code(504),
        ));
        let r = refusal(&Err(GateError::Review(Arc::new(ReviewError::TokenReview(
            down,
        )))))
        .unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!r.headers().contains_key(header::WWW_AUTHENTICATE));
    }

    /// Fails its first review (the API server is down), then allows.
    #[derive(Default)]
    struct Flaky(AtomicUsize);

    impl Reviewer for Flaky {
        fn review<'a>(&'a self, _: &'a str, _: &'a str) -> ReviewFuture<'a> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if n == 0 {
                    Err(ReviewError::SubjectAccessReview(kube::Error::Api(
                        Box::new(
                            kube::core::Status::failure("unavailable", "ServiceUnavailable")
                                .with_code(503),
                        ),
                    )))
                } else {
                    Ok(Verdict::Allowed)
                }
            })
        }
    }

    #[tokio::test]
    async fn a_failed_review_is_answered_503_and_not_remembered() {
        let fake = Arc::new(Flaky::default());
        let gate = MetricsGate::new(fake.clone());
        let good = headers("Bearer good");
        let first = gate.check(&good, "/metrics").await;
        assert!(first.is_err());
        assert_eq!(
            refusal(&first).map(|r| r.status()),
            Some(StatusCode::SERVICE_UNAVAILABLE)
        );
        // Asked again, not answered from memory.
        assert_eq!(
            gate.check(&good, "/metrics").await.unwrap(),
            Verdict::Allowed
        );
        assert_eq!(fake.0.load(Ordering::SeqCst), 2);
    }

    /// Allows every token after `gate` is notified; counts reviews.
    struct Slow {
        calls: AtomicUsize,
        gate: tokio::sync::Notify,
    }

    impl Reviewer for Slow {
        fn review<'a>(&'a self, _: &'a str, _: &'a str) -> ReviewFuture<'a> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                self.gate.notified().await;
                Ok(Verdict::Allowed)
            })
        }
    }

    #[tokio::test]
    async fn concurrent_requests_with_one_token_share_one_review() {
        let slow = Arc::new(Slow {
            calls: AtomicUsize::new(0),
            gate: tokio::sync::Notify::new(),
        });
        let gate = Arc::new(MetricsGate::new(slow.clone()));
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move { gate.check(&headers("Bearer same"), "/metrics").await })
            })
            .collect();
        // Every request is waiting on the one review.
        while slow.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.reviews_in_flight(), 1);
        slow.gate.notify_waiters();
        for t in tasks {
            assert_eq!(t.await.expect("task").expect("checked"), Verdict::Allowed);
        }
        assert_eq!(slow.calls.load(Ordering::SeqCst), 1, "one TokenReview");
        assert_eq!(gate.reviews_in_flight(), 0);
    }

    #[tokio::test]
    async fn new_tokens_beyond_the_budget_are_refused_429_and_known_ones_pass() {
        let fake = Arc::new(Fake::default());
        let gate = MetricsGate::with_budget(fake.clone(), ReviewBudget::new(1, 3));
        // The scraper is judged first.
        assert_eq!(
            gate.check(&headers("Bearer good"), "/metrics")
                .await
                .unwrap(),
            Verdict::Allowed
        );
        // A spray of fresh tokens: two more reviews, then throttled.
        let mut throttled = 0;
        for i in 0..50 {
            match gate
                .check(&headers(&format!("Bearer spray{i}")), "/metrics")
                .await
            {
                Ok(Verdict::Unauthenticated) => {}
                Err(GateError::Throttled) => throttled += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(fake.0.load(Ordering::SeqCst), 3, "the burst, no more");
        assert_eq!(throttled, 48);
        let r = refusal(&Err(GateError::Throttled)).expect("refused");
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            r.headers().get(header::RETRY_AFTER).map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        // The scraper's remembered verdict costs nothing: still let in.
        assert_eq!(
            gate.check(&headers("Bearer good"), "/metrics")
                .await
                .unwrap(),
            Verdict::Allowed
        );
        assert_eq!(fake.0.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_sprayer_cannot_keep_a_known_scraper_out_once_its_verdict_expires() {
        use super::super::verdicts::{ALLOWED_REMEMBERED, ALLOWED_TTL};
        let fake = Arc::new(Fake::default());
        let gate = MetricsGate::with_budget(fake.clone(), ReviewBudget::new(1, 1));
        let t0 = Instant::now();
        let good = headers("Bearer good");
        assert_eq!(
            gate.check_at(&good, "/metrics", t0).await.unwrap(),
            Verdict::Allowed
        );
        // The scraper's verdict expires while a sprayer keeps the budget spent.
        let later = t0 + ALLOWED_TTL + std::time::Duration::from_secs(1);
        for i in 0..20 {
            let _ = gate
                .check_at(&headers(&format!("Bearer spray{i}")), "/metrics", later)
                .await;
        }
        assert!(matches!(
            gate.check_at(&headers("Bearer never-seen"), "/metrics", later)
                .await,
            Err(GateError::Throttled)
        ));
        let reviews = fake.0.load(Ordering::SeqCst);
        // The known scraper is reviewed again, not throttled…
        assert_eq!(
            gate.check_at(&good, "/metrics", later).await.unwrap(),
            Verdict::Allowed
        );
        assert_eq!(fake.0.load(Ordering::SeqCst), reviews + 1, "one re-review");
        // …but not forever: a token long gone waits for the budget again.
        let much_later = later + ALLOWED_TTL + ALLOWED_REMEMBERED;
        for i in 0..5 {
            let _ = gate
                .check_at(
                    &headers(&format!("Bearer again{i}")),
                    "/metrics",
                    much_later,
                )
                .await;
        }
        assert!(matches!(
            gate.check_at(&good, "/metrics", much_later).await,
            Err(GateError::Throttled)
        ));
    }
}
