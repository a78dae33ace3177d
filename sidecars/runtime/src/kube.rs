//! The Kubernetes client configuration of every csiops process, and this
//! replica's identity in Leases and Events.

use std::path::{Path, PathBuf};

/// Why no client configuration could be made.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no Kubernetes configuration (in-cluster or KUBECONFIG)")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("cannot build a Kubernetes client")]
    Client(#[source] kube::Error),
}

/// The client configuration: the kubeconfig at `path`, else inferred
/// (`KUBECONFIG`, `~/.kube/config`, in-cluster).
pub async fn config(path: Option<&Path>) -> Result<kube::Config, ConfigError> {
    match path {
        Some(path) => {
            let kubeconfig_error = |source| ConfigError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_error)
        }
        None => kube::Config::infer().await.map_err(ConfigError::Infer),
    }
}

/// A client of [`config`].
pub async fn client(path: Option<&Path>) -> Result<kube::Client, ConfigError> {
    kube::Client::try_from(config(path).await?).map_err(ConfigError::Client)
}

/// This replica's identity: `explicit` when given, else `<POD_NAME>_<pid>`
/// (the host name when `POD_NAME` is unset), as client-go's users make it:
/// the pid keeps two processes of one pod or host apart.
pub fn identity(explicit: Option<&str>) -> String {
    if let Some(id) = explicit.filter(|s| !s.is_empty()) {
        return id.to_string();
    }
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "csiops".to_string());
    format!("{host}_{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_the_explicit_one_else_host_and_pid() {
        assert_eq!(identity(Some("pod-0")), "pod-0");
        let id = identity(Some(""));
        assert!(id.ends_with(&format!("_{}", std::process::id())), "{id}");
        assert_eq!(identity(None), id);
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_names_its_path() {
        let err = config(Some(Path::new("/nonexistent/kubeconfig")))
            .await
            .expect_err("no such file");
        assert!(err.to_string().contains("/nonexistent/kubeconfig"), "{err}");
    }
}
