//! Where the test-bed binaries, the pinned versions and the operator binary are.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::error::{io, Error, Result};

/// The binaries `build.sh` puts in its bin dir, all required.
pub const CLUSTER_BINARIES: &[&str] = &[
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "csi-mock-driver",
    "kubelet",
    "kube-proxy",
    "regclient",
];

/// `<workspace>/e2e`.
pub fn e2e_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `<workspace>`.
pub fn workspace_dir() -> &'static Path {
    e2e_dir().parent().expect("e2e/ has a parent")
}

/// The directory holding the cluster binaries.
///
/// `CSIOPS_BIN_DIR` when set (no build, no checks beyond presence);
/// otherwise the stdout of `e2e/cluster-bins/build.sh`, which reuses its
/// version-keyed cache and builds only on a miss (minutes, cold). Resolved
/// once per process.
pub fn bin_dir() -> Result<PathBuf> {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    if let Some(d) = DIR.get() {
        return Ok(d.clone());
    }
    let dir = checked_bin_dir(resolve_bin_dir()?)?;
    Ok(DIR.get_or_init(|| dir).clone())
}

/// `dir` if it holds every one of [`CLUSTER_BINARIES`]: a bin dir given
/// explicitly (`ClusterOptions::bin_dir`, an upgrade's target) is checked
/// the way the default one is, so a half-built dir fails here, naming the
/// missing binary, not later as a process that cannot be spawned.
pub fn checked_bin_dir(dir: PathBuf) -> Result<PathBuf> {
    for b in CLUSTER_BINARIES {
        if !dir.join(b).is_file() {
            return Err(Error::Bins(format!("{} has no {b}", dir.display())));
        }
    }
    Ok(dir)
}

/// The Kubernetes version a binary of a bin dir reports (`kubelet
/// --version` prints `Kubernetes v1.37.2`): `v1.37.2`.
pub fn kube_version(binary: &Path) -> Result<String> {
    let out = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(io("running", binary))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim().strip_prefix("Kubernetes ") {
        Some(v) if out.status.success() && v.starts_with('v') => Ok(v.to_string()),
        _ => Err(Error::Bins(format!(
            "{} --version printed {text:?} ({})",
            binary.display(),
            out.status
        ))),
    }
}

/// The minor of a version such as `v1.37.2` (`37`).
pub fn minor_of(version: &str) -> Result<u32> {
    version
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .and_then(|m| m.trim_end_matches('+').parse().ok())
        .ok_or_else(|| Error::Bins(format!("{version:?} has no minor version")))
}

fn resolve_bin_dir() -> Result<PathBuf> {
    dir_from_env_or_script("CSIOPS_BIN_DIR", "cluster-bins/build.sh")
}

/// `$env_var` when set; otherwise the one directory the cached build script
/// `e2e/<script>` prints on stdout (it builds only on a cache miss; its
/// stderr is inherited so a cold build reports progress to the test log).
pub(crate) fn dir_from_env_or_script(env_var: &str, script: &str) -> Result<PathBuf> {
    if let Some(d) = std::env::var_os(env_var).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let script = e2e_dir().join(script);
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(io("running", &script))?;
    if !out.status.success() {
        return Err(Error::Bins(format!(
            "{} failed: {}",
            script.display(),
            out.status
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = stdout.trim();
    if dir.is_empty() || dir.contains('\n') {
        return Err(Error::Bins(format!(
            "{} printed {stdout:?}, expected one directory",
            script.display()
        )));
    }
    Ok(PathBuf::from(dir))
}

/// `e2e/versions.env` as a map (`K8S_VERSION` → `v1.37.2`, …); with
/// `CSIOPS_K8S_MINOR` (`make test-matrix`), that support-matrix entry's
/// versions over it (`e2e/cluster-bins/matrix/<minor>/versions.env`), as
/// `build.sh` reads them.
pub fn versions() -> Result<BTreeMap<String, String>> {
    let path = e2e_dir().join("versions.env");
    let mut text = std::fs::read_to_string(&path).map_err(io("reading", &path))?;
    if let Some(minor) = std::env::var("CSIOPS_K8S_MINOR")
        .ok()
        .filter(|m| !m.is_empty())
    {
        let entry = e2e_dir()
            .join("cluster-bins/matrix")
            .join(&minor)
            .join("versions.env");
        let more = std::fs::read_to_string(&entry).map_err(io("reading", &entry))?;
        text.push('\n');
        text.push_str(&more);
    }
    Ok(parse_env(&text))
}

/// The pinned Kubernetes version, e.g. `v1.37.2`.
pub fn k8s_version() -> Result<String> {
    versions()?
        .remove("K8S_VERSION")
        .ok_or_else(|| Error::Bins("versions.env has no K8S_VERSION".into()))
}

pub(crate) fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The `csiops-operator` binary: `CSIOPS_OPERATOR_BIN`, else the newest of
/// `<target>/{debug,release}/csiops-operator`, where `<target>` is
/// `CARGO_TARGET_DIR` or `<workspace>/target`. Tests of another package
/// cannot use `CARGO_BIN_EXE_*`, hence the search; build it first with
/// `cargo build --workspace --bins`.
pub fn operator_bin() -> Result<PathBuf> {
    workspace_bin("csiops-operator", "CSIOPS_OPERATOR_BIN")
}

/// The `csiops-sidecar` binary, found like [`operator_bin`] (`CSIOPS_SIDECAR_BIN`).
pub fn sidecar_bin() -> Result<PathBuf> {
    workspace_bin("csiops-sidecar", "CSIOPS_SIDECAR_BIN")
}

/// A binary of this workspace: `$env_var`, else the newest build of it.
pub fn workspace_bin(name: &str, env_var: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::Bins(format!(
                "{env_var}={} does not exist",
                p.display()
            )))
        };
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_dir().join("target"));
    let target = if target.is_relative() {
        workspace_dir().join(target)
    } else {
        target
    };
    ["debug", "release"]
        .iter()
        .map(|profile| target.join(profile).join(name))
        .filter_map(|p| {
            let modified = p.metadata().ok()?.modified().ok()?;
            Some((modified, p))
        })
        .max()
        .map(|(_, p)| p)
        .ok_or_else(|| {
            Error::Bins(format!(
                "no {name} under {}/{{debug,release}}; run `cargo build --workspace --bins` \
                 or set {env_var}",
                target.display()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions_env() {
        let m = parse_env("# c\n\nK8S_VERSION=v1.37.2\nKWOK_VERSION=v0.8.0\n");
        assert_eq!(m["K8S_VERSION"], "v1.37.2");
        assert_eq!(m["KWOK_VERSION"], "v0.8.0");
        assert_eq!(m.len(), 2);
        // A matrix entry's lines come last and win.
        let m = parse_env("K8S_VERSION=v1.37.2\nETCD_VERSION=v3.7.0\nK8S_VERSION=v1.35.4\n");
        assert_eq!(m["K8S_VERSION"], "v1.35.4");
        assert_eq!(m["ETCD_VERSION"], "v3.7.0");
    }

    #[test]
    fn minor_versions() {
        assert_eq!(minor_of("v1.37.2").unwrap(), 37);
        assert_eq!(minor_of("1.36.3").unwrap(), 36);
        assert!(minor_of("v1").is_err());
    }

    #[test]
    fn the_test_bed_runs_the_newest_supported_minor() {
        let text = std::fs::read_to_string(e2e_dir().join("versions.env")).unwrap();
        assert!(parse_env(&text)["K8S_VERSION"].starts_with("v1.37."));
    }
}
