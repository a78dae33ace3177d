//! Command-line flags of `csiops-operator`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

use csiops_runtime::logging::LogFormat;

/// The bundled sidecar image of this operator version.
pub fn default_sidecar_image() -> String {
    format!(
        "ghcr.io/csiops/csiops-sidecar:v{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Deploys, health-checks and upgrades CSI drivers from CSIDriverDeployment objects.
#[derive(Debug, Parser)]
#[command(name = "csiops-operator", version, args_override_self = true)]
pub struct Args {
    /// Kubeconfig to use; without it KUBECONFIG, ~/.kube/config or the in-cluster config.
    #[arg(long, env = "KUBECONFIG_PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Image of csiops-sidecar used when an object does not set spec.sidecars.image.
    #[arg(long, default_value_t = default_sidecar_image())]
    pub sidecar_image: String,

    /// Address of the admin server (/metrics, /healthz, /readyz).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub http_endpoint: SocketAddr,

    /// Elect a leader on a Lease so that several replicas may run.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the leader-election Lease (defaults to POD_NAMESPACE, else csiops-system).
    #[arg(long, env = "POD_NAMESPACE", default_value = "csiops-system")]
    pub leader_election_namespace: String,

    /// Name of the leader-election Lease.
    #[arg(long, default_value = "csiops-operator")]
    pub leader_election_lease_name: String,

    /// This replica's identity in the Lease and in Events (defaults to POD_NAME, else host name and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Reconciliations run in parallel.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u16,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter (tracing EnvFilter syntax); RUST_LOG overrides it.
    #[arg(long, default_value = "info")]
    pub log_level: String,

    /// Check that the shipped admission policies are in force; while one is
    /// missing or not enforced, every object is Degraded
    /// (AdmissionPoliciesMissing). Turn off only where the same rules are
    /// enforced by other means.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub admission_check: bool,

    /// Seconds between looks at the shipped admission policies.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub admission_check_seconds: u64,

    /// Namespaces whose CSIDriverDeployments are acted on, comma-separated;
    /// empty: every namespace. Objects elsewhere are left alone.
    #[arg(long, value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,

    /// `--metrics-auth` (HTTPS, callers checked by TokenReview and
    /// SubjectAccessReview) and its certificate, as in every sidecar.
    #[command(flatten)]
    pub metrics_auth: csiops_runtime::admin::MetricsAuthArgs,
}

impl Args {
    /// The identity, falling back to host name and process id (as the
    /// sidecars do outside a pod: `<host>_<pid>`).
    pub fn identity(&self) -> String {
        csiops_runtime::kube::identity(self.identity.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let a = Args::try_parse_from(["csiops-operator"]).expect("parses");
        assert!(a.leader_election);
        assert_eq!(a.http_endpoint.port(), 8080);
        assert!(a
            .sidecar_image
            .ends_with(&format!(":v{}", env!("CARGO_PKG_VERSION"))));
        let a = Args::try_parse_from([
            "csiops-operator",
            "--leader-election=false",
            "--log-format=json",
            "--sidecar-image=example.com/s:1",
        ])
        .expect("parses");
        assert!(!a.leader_election);
        assert_eq!(a.log_format, LogFormat::Json);
        assert_eq!(a.sidecar_image, "example.com/s:1");
        // As with Go flags, a later occurrence wins (wrappers append overrides).
        let a = Args::try_parse_from([
            "csiops-operator",
            "--leader-election=false",
            "--leader-election=true",
        ])
        .expect("parses");
        assert!(a.leader_election);
    }
}
