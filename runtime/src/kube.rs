//! The Kubernetes client configuration of every csiops process, and this
//! replica's identity in Leases and Events.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The program name this process gives the API server (see [`set_agent`]).
static AGENT: OnceLock<&'static str> = OnceLock::new();

/// Names this process to the API server, once, before its first client is
/// made: the first word of every request's `User-Agent`, which the API
/// server also takes as the field manager of writes that name none (an
/// update of a CSINode or a VolumeAttachment's status). Without it those
/// writes show as manager `unknown` in `managedFields`, and an admin cannot
/// tell which process wrote them. The sidecars use upstream's program names
/// (`csi-provisioner`, …) so tools keyed on them see the same names.
pub fn set_agent(name: &'static str) {
    let _ = AGENT.set(name);
}

/// `<agent>/<version> (linux/<arch>) csiops`, client-go's shape.
pub fn user_agent() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!(
        "{}/v{} (linux/{arch}) csiops",
        AGENT.get().copied().unwrap_or("csiops"),
        env!("CARGO_PKG_VERSION")
    )
}

/// Adds [`user_agent`] to `config`'s headers.
pub fn identify(config: &mut kube::Config) {
    if let Ok(value) = http::HeaderValue::from_str(&user_agent()) {
        config
            .headers
            .retain(|(k, _)| k != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, value));
    }
}

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
/// (`KUBECONFIG`, `~/.kube/config`, in-cluster), with [`user_agent`].
pub async fn config(path: Option<&Path>) -> Result<kube::Config, ConfigError> {
    let mut config = read_config(path).await?;
    identify(&mut config);
    Ok(config)
}

async fn read_config(path: Option<&Path>) -> Result<kube::Config, ConfigError> {
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

/// This replica's identity: `explicit` when given, else the pod's name
/// (`POD_NAME`), else `<host>_<pid>`.
///
/// A pod's name outlives a restart of its container: a leader whose
/// container kubelet restarted takes its own Lease back at once instead of
/// waiting it out (as csi-lib-utils' host-name identity does). No two live
/// processes share it: kubelet restarts a container only once it exited,
/// and one pod at a time holds a name. Outside a pod the pid keeps two
/// processes of one host apart.
pub fn identity(explicit: Option<&str>) -> String {
    identity_from(explicit, std::env::var("POD_NAME").ok().as_deref())
}

fn identity_from<'a>(explicit: Option<&'a str>, pod_name: Option<&'a str>) -> String {
    let given = |s: Option<&'a str>| s.filter(|s| !s.is_empty());
    if let Some(id) = given(explicit).or(given(pod_name)) {
        return id.to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "csiops".to_string());
    format!("{host}_{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_the_explicit_one_else_the_pod_else_host_and_pid() {
        assert_eq!(identity_from(Some("pod-0"), Some("pod-1")), "pod-0");
        assert_eq!(identity_from(None, Some("pod-1")), "pod-1");
        assert_eq!(identity_from(Some(""), Some("pod-1")), "pod-1");
        let id = identity_from(Some(""), Some(""));
        assert!(id.ends_with(&format!("_{}", std::process::id())), "{id}");
        assert_eq!(identity_from(None, None), id);
    }

    #[test]
    fn the_user_agent_names_the_program_once() {
        set_agent("csi-provisioner");
        set_agent("csi-attacher");
        let mut config = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static("other"),
        ));
        identify(&mut config);
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(k, _)| k == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap().to_string())
            .collect();
        assert_eq!(agents.len(), 1, "{agents:?}");
        // The API server takes the part before the first '/' as the field
        // manager.
        assert!(agents[0].starts_with("csi-provisioner/v"), "{agents:?}");
        assert!(agents[0].contains("(linux/"), "{agents:?}");
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_names_its_path() {
        let err = config(Some(Path::new("/nonexistent/kubeconfig")))
            .await
            .expect_err("no such file");
        assert!(err.to_string().contains("/nonexistent/kubeconfig"), "{err}");
    }
}
