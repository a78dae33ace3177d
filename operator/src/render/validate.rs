//! Checks on a `CSIDriverDeployment` that the CRD schema cannot express (or
//! that must hold even if the schema was bypassed), done before anything is
//! rendered so a bad object changes nothing in the cluster.

use csiops_crds::{CSIDriverDeployment, SidecarSpec};

use super::error::RenderError;
use super::names::{MAX_CR_NAME_LEN, MAX_STATEFULSET_NAME_LEN};

/// Flags of the provisioner and attacher that the operator sets itself.
pub const CONTROLLER_SIDECAR_MANAGED_FLAGS: &[&str] = &[
    "csi-address",
    "leader-election",
    "leader-election-namespace",
    "http-endpoint",
    "v",
];
/// Flags of the registrar that the operator sets itself.
pub const REGISTRAR_MANAGED_FLAGS: &[&str] = &[
    "csi-address",
    "kubelet-registration-path",
    "plugin-registration-path",
    "http-endpoint",
];
/// Flags of the liveness probe that the operator sets itself.
pub const LIVENESS_PROBE_MANAGED_FLAGS: &[&str] = &["csi-address", "http-endpoint"];

/// Metadata the renderer needs, checked present.
pub(crate) struct Meta<'a> {
    pub namespace: &'a str,
}

/// Validates everything `render` relies on; see [`RenderError`] for the cases.
///
/// The extraArgs of every sidecar are checked, enabled or not, so enabling a
/// sidecar later never turns a previously accepted object into an error.
pub(crate) fn validate(obj: &CSIDriverDeployment) -> Result<Meta<'_>, RenderError> {
    let name = obj
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(RenderError::MissingMetadata { field: "name" })?;
    let namespace = obj
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(RenderError::MissingMetadata { field: "namespace" })?;
    obj.metadata
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(RenderError::MissingMetadata { field: "uid" })?;
    if name.len() > MAX_CR_NAME_LEN {
        return Err(RenderError::NameTooLong {
            name: name.to_string(),
            len: name.len(),
            max: MAX_CR_NAME_LEN,
            sts_max: MAX_STATEFULSET_NAME_LEN,
        });
    }

    let spec = &obj.spec;
    if spec.driver.image.trim().is_empty() {
        return Err(RenderError::EmptyImage {
            field: "spec.driver.image",
        });
    }
    if matches!(spec.controller.driver.image.as_deref(), Some(i) if i.trim().is_empty()) {
        return Err(RenderError::EmptyImage {
            field: "spec.controller.image",
        });
    }
    if matches!(spec.node.driver.image.as_deref(), Some(i) if i.trim().is_empty()) {
        return Err(RenderError::EmptyImage {
            field: "spec.node.image",
        });
    }
    let sock = &spec.driver.socket_name;
    if sock.is_empty() || sock.contains('/') || sock == "." || sock == ".." {
        return Err(RenderError::InvalidSocketName { name: sock.clone() });
    }
    normalize_kubelet_dir(&spec.node.kubelet_dir)?;

    let sidecars = &spec.sidecars;
    check_extra_args(
        "provisioner",
        &sidecars.provisioner,
        CONTROLLER_SIDECAR_MANAGED_FLAGS,
    )?;
    check_extra_args(
        "attacher",
        &sidecars.attacher,
        CONTROLLER_SIDECAR_MANAGED_FLAGS,
    )?;
    check_extra_args("registrar", &sidecars.registrar, REGISTRAR_MANAGED_FLAGS)?;
    check_extra_args(
        "livenessProbe",
        &sidecars.liveness_probe,
        LIVENESS_PROBE_MANAGED_FLAGS,
    )?;

    Ok(Meta { namespace })
}

/// `kubeletDir` without a trailing slash, refused unless a clean absolute path
/// (it becomes hostPath volumes and the registration path kubelet dials).
pub(crate) fn normalize_kubelet_dir(dir: &str) -> Result<String, RenderError> {
    let invalid = |reason| RenderError::InvalidKubeletDir {
        dir: dir.to_string(),
        reason,
    };
    if !dir.starts_with('/') {
        return Err(invalid("it must be an absolute path"));
    }
    let trimmed = dir.trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(invalid("it must not be the root directory"));
    }
    if trimmed.contains("//") {
        return Err(invalid("it must not contain empty path segments ('//')"));
    }
    if trimmed.split('/').any(|seg| seg == ".." || seg == ".") {
        return Err(invalid("it must not contain '.' or '..' segments"));
    }
    Ok(trimmed.to_string())
}

/// Refuses an extraArgs entry that sets one of `managed` (`--flag`, `-flag`,
/// `--flag=value`, `-flag=value`). Entries not starting with `-` are values of
/// a preceding flag and are left alone.
fn check_extra_args(
    sidecar: &'static str,
    spec: &SidecarSpec,
    managed: &[&str],
) -> Result<(), RenderError> {
    for arg in &spec.extra_args {
        let Some(flag) = flag_name(arg) else { continue };
        if managed.contains(&flag) {
            return Err(RenderError::ManagedFlag {
                sidecar,
                flag: flag.to_string(),
                arg: arg.clone(),
            });
        }
    }
    Ok(())
}

/// The flag name an argument sets, without dashes and value.
fn flag_name(arg: &str) -> Option<&str> {
    let arg = arg.trim();
    let rest = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    let name = rest.split_once('=').map_or(rest, |(name, _)| name);
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_names() {
        assert_eq!(flag_name("--v=5"), Some("v"));
        assert_eq!(flag_name("-v"), Some("v"));
        assert_eq!(
            flag_name("--leader-election-lease-duration=1s"),
            Some("leader-election-lease-duration")
        );
        assert_eq!(flag_name("5"), None);
        assert_eq!(flag_name("--"), None);
    }

    #[test]
    fn kubelet_dir() {
        assert_eq!(
            normalize_kubelet_dir("/var/lib/kubelet/").unwrap(),
            "/var/lib/kubelet"
        );
        assert_eq!(
            normalize_kubelet_dir("/var/lib/kubelet").unwrap(),
            "/var/lib/kubelet"
        );
        assert!(normalize_kubelet_dir("var/lib/kubelet").is_err());
        assert!(normalize_kubelet_dir("/").is_err());
        assert!(normalize_kubelet_dir("/var/../etc").is_err());
        assert!(normalize_kubelet_dir("/var//lib").is_err());
    }
}
