//! The Kubernetes clients of the controller sidecars: `--kubeconfig`, and
//! client-go's client-side rate limit (`--kube-api-qps`, `--kube-api-burst`)
//! as a token bucket in front of every request, served by priority (see
//! `ratelimit`).
//!
//! The limit matters for the same reason it does upstream: a provisioner or
//! attacher that catches up on thousands of objects after a restart must not
//! flood the API server. Long-lived watches take one token when they start.

use std::path::PathBuf;

use clap::Args;

use super::args::FlagError;

pub use super::ratelimit::ApiRequests;
use super::ratelimit::{Limiter, Priority, PriorityLayer};
use csiops_runtime::leader::LeaseGuard;

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

/// The sidecar's clients, one per [`Priority`], sharing one token bucket
/// of `--kube-api-qps`/`--kube-api-burst` (see `ratelimit`). Every request
/// is counted in `requests`.
#[derive(Clone)]
pub struct Clients {
    /// Reads, watches and writes on the way to a volume.
    pub normal: kube::Client,
    /// Writes a user waits on: PV create and delete.
    pub critical: kube::Client,
    /// Writes after the fact (finalizers off).
    pub bookkeeping: kube::Client,
    /// Events; shed under pressure.
    pub events: kube::Client,
    /// The token bucket behind all four, for a writer that takes its token
    /// before it builds its request (see `ratelimit::Prepaid`).
    pub limiter: Limiter,
}

/// [`Clients`] for `args`, whose writes go out only while `lease` is held
/// (see `ratelimit::Throttled`).
pub async fn clients(
    args: &KubeArgs,
    requests: &ApiRequests,
    lease: &LeaseGuard,
) -> Result<Clients, KubeError> {
    let config = config(args).await?;
    let limiter = Limiter::new(
        args.kube_api_qps,
        args.kube_api_burst,
        requests.limiter.clone(),
    );
    let client = |priority| -> Result<kube::Client, KubeError> {
        let layer = PriorityLayer {
            limiter: limiter.clone(),
            priority,
            requests: requests.clone(),
            lease: lease.clone(),
        };
        Ok(kube::client::ClientBuilder::try_from(config.clone())
            .map_err(KubeError::Client)?
            .with_layer(&layer)
            .build())
    };
    Ok(Clients {
        normal: client(Priority::Normal)?,
        critical: client(Priority::Critical)?,
        bookkeeping: client(Priority::Bookkeeping)?,
        events: client(Priority::Events)?,
        limiter,
    })
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
        (Some(url), None) => {
            let mut config = kube::Config::new(url);
            csiops_runtime::kube::identify(&mut config);
            Ok(config)
        }
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
}
