//! `csiops_kube_api_requests_total{verb}`: every request a csiops process
//! sends to the API server, by HTTP method (watches and lists are GETs).
//!
//! One counter for the operator and the sidecars alike, so that what a
//! process costs the API server is read the same way everywhere (the
//! benchmarks report it). [`CountLayer`] counts in front of kube's HTTP
//! stack; a process with its own layer there (the sidecars' rate limiter)
//! calls [`ApiRequests::count`] itself, when the request really goes out.

use std::task::{Context, Poll};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The metric's name as registered (the `_total` suffix is the encoder's).
pub const METRIC: &str = "csiops_kube_api_requests";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabel {
    verb: String,
}

/// The counter. Clones share their counts.
#[derive(Clone, Debug, Default)]
pub struct ApiRequests {
    by_verb: Family<VerbLabel, Counter>,
}

impl ApiRequests {
    /// Registers [`METRIC`] in `registry` (which must have no prefix: the
    /// name is complete).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            METRIC,
            "Requests sent to the Kubernetes API server, by HTTP method",
            self.by_verb.clone(),
        );
    }

    /// Counts one request sent with `method`.
    pub fn count(&self, method: &http::Method) {
        self.by_verb
            .get_or_create(&VerbLabel {
                verb: method.as_str().to_string(),
            })
            .inc();
    }

    /// Requests so far with `method` (`GET`, `PATCH`, …).
    pub fn get(&self, method: &str) -> u64 {
        self.by_verb
            .get_or_create(&VerbLabel {
                verb: method.to_string(),
            })
            .get()
    }
}

/// A tower layer that counts every request passing through it.
#[derive(Clone, Debug)]
pub struct CountLayer(pub ApiRequests);

impl<S> tower::Layer<S> for CountLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            requests: self.0.clone(),
        }
    }
}

/// The service of [`CountLayer`].
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    requests: ApiRequests,
}

impl<S, B> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        self.requests.count(req.method());
        self.inner.call(req)
    }
}

/// A client of `config` whose every request is counted in `requests`.
pub fn counted_client(
    config: kube::Config,
    requests: &ApiRequests,
) -> Result<kube::Client, kube::Error> {
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&CountLayer(requests.clone()))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service};

    #[tokio::test]
    async fn the_layer_counts_each_request_by_method() {
        let requests = ApiRequests::default();
        let inner = tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        });
        let mut svc = CountLayer(requests.clone()).layer(inner);
        for method in [http::Method::GET, http::Method::GET, http::Method::PATCH] {
            let req = http::Request::builder()
                .method(method)
                .body(())
                .expect("request");
            svc.call(req).await.expect("served");
        }
        assert_eq!(requests.get("GET"), 2);
        assert_eq!(requests.get("PATCH"), 1);
        assert_eq!(requests.get("POST"), 0);

        let mut registry = Registry::default();
        requests.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("csiops_kube_api_requests_total{verb=\"GET\"} 2"),
            "{text}"
        );
    }
}
