//! Who may read `/metrics` when `--metrics-auth` is on: the caller's bearer
//! token is authenticated with a TokenReview and its user authorized with a
//! SubjectAccessReview (`get` on the non-resource URL of the metrics path) —
//! the checks kube-rbac-proxy makes, in-process, so a driver pod needs no
//! proxy container per sidecar. Verdicts are remembered briefly
//! ([`super::verdicts`]).
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

use super::verdicts::{digest, Verdict, Verdicts};
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

/// The gate in front of the metrics handler: a reviewer and its verdicts.
pub struct MetricsGate {
    reviewer: Arc<dyn Reviewer>,
    verdicts: Mutex<Verdicts>,
}

impl std::fmt::Debug for MetricsGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsGate").finish_non_exhaustive()
    }
}

impl MetricsGate {
    pub fn new(reviewer: Arc<dyn Reviewer>) -> Self {
        Self {
            reviewer,
            verdicts: Mutex::new(Verdicts::default()),
        }
    }

    /// The verdict on the caller of `path` with `headers`, remembered or
    /// asked.
    pub async fn check(&self, headers: &HeaderMap, path: &str) -> Result<Verdict, ReviewError> {
        let Some(token) = bearer_token(headers) else {
            return Ok(Verdict::Unauthenticated);
        };
        let key = digest(token);
        if let Some(verdict) = self.lock().get(&key, Instant::now()) {
            return Ok(verdict);
        }
        let verdict = self.reviewer.review(token, path).await?;
        self.lock().insert(key, verdict, Instant::now());
        Ok(verdict)
    }

    /// The verdicts; a panic elsewhere while holding the lock leaves them
    /// consistent (every update is one map operation), so poisoning is
    /// ignored.
    fn lock(&self) -> std::sync::MutexGuard<'_, Verdicts> {
        self.verdicts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The answer to a caller who is not let in; `None` when allowed.
pub fn refusal(outcome: &Result<Verdict, ReviewError>) -> Option<Response> {
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
        let r = refusal(&Err(ReviewError::TokenReview(down))).unwrap();
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
}
