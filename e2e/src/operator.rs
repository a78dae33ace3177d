//! The operator under test as a local process.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::ports;
use crate::process::{ManagedProcess, DEFAULT_GRACE};

/// A running `csiops-operator`; killed (SIGTERM, then SIGKILL) on drop.
///
/// Its log lives in the cluster's temp dir, so drop it before the cluster
/// if the log should still be readable.
#[derive(Debug)]
pub struct OperatorProcess {
    proc: ManagedProcess,
    http: SocketAddr,
}

impl OperatorProcess {
    pub(crate) fn spawn(
        bin: &Path,
        kubeconfig: &Path,
        log: &Path,
        extra_args: &[String],
    ) -> Result<Self> {
        if !bin.is_file() {
            return Err(Error::Bins(format!(
                "operator binary {} does not exist",
                bin.display()
            )));
        }
        let http = SocketAddr::from((Ipv4Addr::LOCALHOST, ports::free_port()?));
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-election=false".to_string(),
            format!("--http-endpoint={http}"),
            "--log-format=text".to_string(),
        ];
        // The test bed has install.yaml's admission policies only where a
        // test applies them (`testkit::install_operator_rbac`), so the
        // operator does not look for them unless the test asks.
        if !extra_args
            .iter()
            .any(|a| a.starts_with("--admission-check"))
        {
            args.push("--admission-check=false".to_string());
        }
        args.extend_from_slice(extra_args);
        // The log is a file, not a terminal: no ANSI colour codes in it
        // (tracing-subscriber honours NO_COLOR).
        let env = [("NO_COLOR", "1")];
        let proc = ManagedProcess::spawn_with_env("csiops-operator", bin, &args, &env, log)?;
        Ok(OperatorProcess { proc, http })
    }

    /// The admin server (`/metrics`, `/healthz`, `/readyz`) address.
    pub fn http_endpoint(&self) -> SocketAddr {
        self.http
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn log_path(&self) -> &Path {
        self.proc.log_path()
    }

    /// The last `lines` lines of the operator's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.proc.log_tail(lines)
    }

    /// `Err(ProcessExited)` with the log tail if the operator has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.proc.check_running()
    }

    /// Stops the operator, waiting for it to exit (SIGKILL after `grace`).
    pub async fn stop_with_grace(mut self, grace: Duration) {
        // terminate() blocks while polling; keep it off the async workers.
        let _ = tokio::task::spawn_blocking(move || self.proc.terminate(grace)).await;
    }

    /// [`OperatorProcess::stop_with_grace`] with the default grace period.
    pub async fn stop(self) {
        self.stop_with_grace(DEFAULT_GRACE).await
    }
}

/// What the operator sent to the API server, from its own counter
/// (`csiops_kube_api_requests_total{verb}`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ApiRequests {
    /// Every request (watches and lists are GETs).
    pub all: f64,
    /// Every request but GETs.
    pub writes: f64,
}

impl OperatorProcess {
    /// The operator's requests so far, from its `/metrics`.
    pub async fn api_requests(&self) -> Result<ApiRequests> {
        let addr = self.http;
        match crate::testkit::http_get_async(addr, "/metrics").await {
            Some((200, body)) => crate::apimetrics::own_requests(&body)
                .map(|(writes, all)| ApiRequests { all, writes })
                .ok_or_else(|| {
                    Error::Other(
                        "the operator's metrics have no csiops_kube_api_requests_total".into(),
                    )
                }),
            other => Err(Error::Other(format!("GET {addr}/metrics: {other:?}"))),
        }
    }

    /// How long after `since` the operator sent its next write, the count
    /// of writes having been `writes` before (read every 5 ms).
    pub async fn next_write(&self, writes: f64, since: Instant) -> Result<Duration> {
        let limit = Duration::from_secs(60);
        crate::wait_for(limit, Duration::from_millis(5), || async {
            let now = self.api_requests().await.ok()?;
            (now.writes > writes).then(|| since.elapsed())
        })
        .await
        .map_err(|_| Error::Other(format!("the operator wrote nothing within {limit:?}")))
    }

    /// Waits until the operator has sent no write for `quiet` (at most `limit`).
    pub async fn wait_quiet(&self, quiet: Duration, limit: Duration) -> Result<()> {
        let last = std::sync::Mutex::new((self.api_requests().await?.writes, Instant::now()));
        crate::wait_for(limit, Duration::from_millis(500), || async {
            let writes = self.api_requests().await.ok()?.writes;
            let mut last = last.lock().ok()?;
            if writes != last.0 {
                *last = (writes, Instant::now());
            }
            (last.1.elapsed() >= quiet).then_some(())
        })
        .await
        .map_err(|_| Error::Other(format!("the operator kept writing for {limit:?}")))
    }
}
