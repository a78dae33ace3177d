//! The one error type of the harness.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// Everything that can go wrong while bringing up, using or tearing down the
/// local test bed. Variants carry the log tails that explain a failure, so a
/// failing test prints the cause without anyone digging in a temp dir.
#[derive(Debug, Error)]
pub enum Error {
    #[error("test-bed binaries: {0}")]
    Bins(String),

    #[error("{context} ({path}): {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("generating certificates: {0}")]
    Certs(#[from] rcgen::Error),

    #[error("spawning {name} ({path}): {source}")]
    Spawn {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{name} exited early ({status})\n--- last lines of {log} ---\n{tail}")]
    ProcessExited {
        name: String,
        status: String,
        log: PathBuf,
        tail: String,
    },

    #[error("timed out after {after:?} waiting for {what}{last}\n{logs}")]
    Timeout {
        what: String,
        after: Duration,
        /// The last observation, e.g. "2/3 nodes Ready".
        last: String,
        /// Log tails of every process of the cluster.
        logs: String,
    },

    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),

    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    /// A YAML fragment given to [`crate::testkit::DriverCr::merge_yaml`]
    /// does not parse.
    #[error("CSIDriverDeployment fragment {fragment:?}: {source}")]
    CrFragment {
        fragment: String,
        #[source]
        source: serde_yaml::Error,
    },

    /// A fragment given to [`crate::testkit::DriverCr::merge_yaml`] is a
    /// YAML value but not a mapping of fields.
    #[error("CSIDriverDeployment fragment {fragment:?} is not a mapping of fields")]
    CrFragmentNotMapping { fragment: String },

    #[error("{0}")]
    Other(String),
}

/// Shorthand used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches a path and a short description to an I/O error.
pub(crate) fn io(
    context: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io {
        context,
        path,
        source,
    }
}
