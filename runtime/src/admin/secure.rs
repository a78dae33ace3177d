//! `--metrics-auth` and its certificate flags, shared by the operator and
//! every sidecar role so they read and behave the same everywhere.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::access::{KubeReviewer, MetricsGate};
use super::tls::{server_config, CertSource};
use super::{AdminError, AdminState};

/// Flags of authenticated metrics.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct MetricsAuthArgs {
    /// Serve the HTTP endpoint over HTTPS, and answer the metrics only to
    /// callers whose bearer token the API server authenticates (TokenReview)
    /// and who may `get` the metrics path (SubjectAccessReview); /healthz and
    /// /readyz stay unauthenticated for kubelet's probes.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub metrics_auth: bool,

    /// PEM certificate (chain) of the HTTPS endpoint, e.g. a mounted
    /// kubernetes.io/tls Secret's tls.crt; re-read when it changes. Without
    /// it a self-signed certificate is made at start.
    #[arg(long, requires = "metrics_tls_key_file")]
    pub metrics_tls_cert_file: Option<PathBuf>,

    /// PEM private key of --metrics-tls-cert-file.
    #[arg(long, requires = "metrics_tls_cert_file")]
    pub metrics_tls_key_file: Option<PathBuf>,
}

impl MetricsAuthArgs {
    /// Where the certificate comes from.
    pub fn cert_source(&self) -> CertSource {
        match (&self.metrics_tls_cert_file, &self.metrics_tls_key_file) {
            (Some(cert), Some(key)) => CertSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => CertSource::SelfSigned {
                names: self_signed_names(),
            },
        }
    }

    /// `state` as the flags want it: unchanged without `--metrics-auth`;
    /// else HTTPS and a gate that reviews callers with a client of
    /// `kubeconfig` (else in-cluster or `KUBECONFIG`). A client of its own:
    /// reviews must never wait behind a sidecar's QPS-limited work queue.
    pub async fn secure(
        &self,
        state: AdminState,
        kubeconfig: Option<&Path>,
    ) -> Result<AdminState, AdminError> {
        if !self.metrics_auth {
            if self.metrics_tls_cert_file.is_some() {
                tracing::warn!("--metrics-tls-cert-file has no effect without --metrics-auth");
            }
            return Ok(state);
        }
        let client = crate::kube::client(kubeconfig)
            .await
            .map_err(AdminError::Client)?;
        self.secure_with(state, client)
    }

    /// [`secure`](Self::secure) with a client the caller has.
    pub fn secure_with(
        &self,
        state: AdminState,
        client: kube::Client,
    ) -> Result<AdminState, AdminError> {
        if !self.metrics_auth {
            return Ok(state);
        }
        let source = self.cert_source();
        let config = server_config(&source)?;
        let self_signed = matches!(source, CertSource::SelfSigned { .. });
        tracing::info!(
            self_signed,
            "metrics: HTTPS, callers checked by TokenReview and SubjectAccessReview"
        );
        let gate = MetricsGate::new(Arc::new(KubeReviewer::new(client)));
        Ok(state.metrics_auth(Arc::new(gate), config))
    }
}

/// Names of a self-signed certificate: the pod's name (its host name) and
/// `localhost`. Scrapers reach pods by IP and do not verify a self-signed
/// certificate anyway; the names only make it recognizable.
fn self_signed_names() -> Vec<String> {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && h != "localhost");
    host.into_iter()
        .chain(std::iter::once("localhost".to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        auth: MetricsAuthArgs,
    }

    #[test]
    fn flags() {
        let c = Cli::try_parse_from(["x"]).unwrap();
        assert!(!c.auth.metrics_auth);
        let c = Cli::try_parse_from(["x", "--metrics-auth"]).unwrap();
        assert!(c.auth.metrics_auth);
        assert!(
            matches!(c.auth.cert_source(), CertSource::SelfSigned { names } if names.contains(&"localhost".to_string()))
        );
        let c = Cli::try_parse_from(["x", "--metrics-auth=false"]).unwrap();
        assert!(!c.auth.metrics_auth);
        let c = Cli::try_parse_from([
            "x",
            "--metrics-auth",
            "--metrics-tls-cert-file=/t/tls.crt",
            "--metrics-tls-key-file=/t/tls.key",
        ])
        .unwrap();
        assert_eq!(
            c.auth.cert_source(),
            CertSource::Files {
                cert: "/t/tls.crt".into(),
                key: "/t/tls.key".into()
            }
        );
        // A certificate without its key (or the reverse) is refused.
        assert!(
            Cli::try_parse_from(["x", "--metrics-auth", "--metrics-tls-cert-file=/c"]).is_err()
        );
        assert!(Cli::try_parse_from(["x", "--metrics-auth", "--metrics-tls-key-file=/k"]).is_err());
    }
}
