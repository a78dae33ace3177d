//! The Kubernetes client of the controller sidecars: `--kubeconfig`, and
//! client-go's client-side rate limit (`--kube-api-qps`, `--kube-api-burst`)
//! as a token bucket in front of every request.
//!
//! The limit matters for the same reason it does upstream: a provisioner or
//! attacher that catches up on thousands of objects after a restart must not
//! flood the API server. Long-lived watches take one token when they start.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use clap::Args;

use super::args::FlagError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::time::{Instant, Sleep};

/// Flags of the sidecars that talk to the API server.
#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// Kubeconfig (out of cluster); default: in-cluster or KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// URL of the API server (out of cluster): overrides the kubeconfig's
    /// server; alone, a plain connection to it without credentials (as
    /// client-go's `BuildConfigFromFlags`).
    #[arg(long)]
    pub master: Option<String>,

    /// Sustained requests per second to the API server (client-go's QPS).
    #[arg(long, default_value_t = 5.0)]
    pub kube_api_qps: f64,

    /// Requests allowed in a burst above the sustained rate.
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: u32,
}

impl KubeArgs {
    /// Checks the rate limits, so a bad value is reported before the sidecar
    /// does anything else.
    pub fn check(&self) -> Result<(), FlagError> {
        if let Some(m) = self.master.as_deref().filter(|m| !m.is_empty()) {
            parse_master(m).map_err(|e| FlagError::new("--master", e))?;
        }
        if !(self.kube_api_qps > 0.0 && self.kube_api_qps.is_finite()) || self.kube_api_burst == 0 {
            return Err(FlagError::new(
                "--kube-api-qps, --kube-api-burst",
                KubeError::Limits {
                    qps: self.kube_api_qps,
                    burst: self.kube_api_burst,
                },
            ));
        }
        Ok(())
    }
}

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(transparent)]
    Config(#[from] csiops_runtime::kube::ConfigError),
    #[error("cannot build a Kubernetes client")]
    Client(#[source] kube::Error),
    #[error("--master {0:?} is not a URL such as https://10.0.0.1:6443")]
    Master(String),
    #[error(
        "--kube-api-qps must be positive and --kube-api-burst at least 1 (got {qps}, {burst})"
    )]
    Limits { qps: f64, burst: u32 },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbLabel {
    verb: String,
}

/// `csiops_kube_api_requests_total{verb}`: every request the sidecar sent to
/// the API server, by HTTP method (watches and lists are GETs). What the
/// QPS limit is spent on, and the write counts the benchmarks report.
#[derive(Clone, Debug, Default)]
pub struct ApiRequests(Family<VerbLabel, Counter>);

impl ApiRequests {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "csiops_kube_api_requests",
            "Requests sent to the Kubernetes API server, by HTTP method",
            self.0.clone(),
        );
    }

    fn count(&self, method: &http::Method) {
        self.0
            .get_or_create(&VerbLabel {
                verb: method.as_str().to_string(),
            })
            .inc();
    }

    /// Requests so far with `method` (`GET`, `PATCH`, …).
    pub fn get(&self, method: &str) -> u64 {
        self.0
            .get_or_create(&VerbLabel {
                verb: method.to_string(),
            })
            .get()
    }
}

/// A client whose every request waits for a token of the QPS/burst bucket
/// and is counted in `requests`.
pub async fn client(args: &KubeArgs, requests: &ApiRequests) -> Result<kube::Client, KubeError> {
    let config = config(args).await?;
    let layer = ThrottleLayer {
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
        requests: requests.clone(),
    };
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(KubeError::Client)?
        .with_layer(&layer)
        .build())
}

/// A client without the rate limit, for leader election only: a Lease
/// renewal must never wait behind the workers' backlog in the bucket (at 5
/// QPS a few hundred queued writes outlast the renew deadline, and the
/// leader would give up while healthy). It makes one request per retry
/// period. Upstream builds a separate client for the same reason.
pub async fn election_client(args: &KubeArgs) -> Result<kube::Client, KubeError> {
    kube::Client::try_from(config(args).await?).map_err(KubeError::Client)
}

/// The client configuration of `--kubeconfig` and `--master`, as client-go's
/// `BuildConfigFromFlags` makes it: neither is in-cluster (here: inferred,
/// so `KUBECONFIG` works too); `--master` replaces the kubeconfig's server,
/// or alone is the whole configuration.
pub async fn config(args: &KubeArgs) -> Result<kube::Config, KubeError> {
    let master = match args.master.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => Some(parse_master(m)?),
        None => None,
    };
    match (master, &args.kubeconfig) {
        (Some(url), None) => Ok(kube::Config::new(url)),
        (Some(url), Some(_)) => {
            let mut config = csiops_runtime::kube::config(args.kubeconfig.as_deref()).await?;
            config.cluster_url = url;
            Ok(config)
        }
        (None, _) => Ok(csiops_runtime::kube::config(args.kubeconfig.as_deref()).await?),
    }
}

fn parse_master(m: &str) -> Result<http::Uri, KubeError> {
    let uri: http::Uri = m.parse().map_err(|_| KubeError::Master(m.to_string()))?;
    if uri.scheme().is_none() || uri.host().is_none() {
        return Err(KubeError::Master(m.to_string()));
    }
    Ok(uri)
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

/// Puts a [`Throttle`] in front of a service.
#[derive(Debug, Clone)]
pub struct ThrottleLayer {
    pub qps: f64,
    pub burst: u32,
    pub requests: ApiRequests,
}

impl<S> tower::Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            bucket: TokenBucket::new(self.qps, self.burst),
            holding: false,
            sleep: None,
            requests: self.requests.clone(),
        }
    }
}

/// Readiness waits for a token; the call spends it. kube's client puts a
/// `Buffer` in front, which polls readiness before every call, so requests
/// from all tasks share one bucket.
pub struct Throttle<S> {
    inner: S,
    bucket: TokenBucket,
    /// A token was taken for the next call.
    holding: bool,
    sleep: Option<Pin<Box<Sleep>>>,
    requests: ApiRequests,
}

impl<S, B> tower::Service<http::Request<B>> for Throttle<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.holding {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.bucket.try_take(Instant::now()) {
                Ok(()) => self.holding = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.holding = false;
        self.requests.count(req.method());
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn master_alone_or_over_a_kubeconfig() {
        let args = |master: &str, kubeconfig: Option<PathBuf>| KubeArgs {
            kubeconfig,
            master: Some(master.to_string()),
            kube_api_qps: 5.0,
            kube_api_burst: 10,
        };
        let c = config(&args("http://10.1.2.3:8080", None))
            .await
            .expect("config");
        assert_eq!(c.cluster_url.to_string(), "http://10.1.2.3:8080/");
        let dir = tempfile::tempdir().expect("tempdir");
        let kc = dir.path().join("kubeconfig");
        std::fs::write(
            &kc,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://1.1.1.1:6443'}}]\n\
             users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        )
        .expect("write kubeconfig");
        let c = config(&args("https://10.9.9.9:6443", Some(kc)))
            .await
            .expect("config");
        assert_eq!(c.cluster_url.to_string(), "https://10.9.9.9:6443/");
        assert!(
            c.auth_info.token.is_some(),
            "the kubeconfig's credentials stay"
        );
        for bad in ["10.0.0.1", "not a url", "/path"] {
            let err = args(bad, None).check().expect_err(bad);
            assert!(csiops_runtime::chain(&err).to_string().contains("--master"));
        }
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

    #[tokio::test(start_paused = true)]
    async fn throttle_spaces_calls_at_the_rate() {
        use tower::{Service, ServiceExt};
        let svc = tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(Instant::now())
        });
        let requests = ApiRequests::default();
        let layer = ThrottleLayer {
            qps: 4.0,
            burst: 2,
            requests: requests.clone(),
        };
        let mut svc = tower::Layer::layer(&layer, svc);
        let start = Instant::now();
        let mut times = Vec::new();
        for _ in 0..6 {
            let ready = svc.ready().await.expect("ready");
            let req = http::Request::patch("/x").body(()).expect("request");
            times.push(ready.call(req).await.expect("call") - start);
        }
        // Two at once (the burst), then one every 250ms.
        let ms: Vec<u128> = times.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, vec![0, 0, 250, 500, 750, 1000]);
        assert_eq!(requests.get("PATCH"), 6);
        assert_eq!(requests.get("GET"), 0);
    }
}
