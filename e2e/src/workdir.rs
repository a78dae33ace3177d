//! The per-cluster temp dir and everything written into it before any
//! process starts: PKI, token file, kubeconfig, picked ports.

use std::path::{Path, PathBuf};

use crate::certs::Pki;
use crate::error::{io, Result};
use crate::ports;
use crate::process;

/// Prefix of the per-cluster temp dirs, also used to sweep stale ones.
const DIR_PREFIX: &str = "csiops-e2e-";

/// Loopback ports picked for one start attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ports {
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub apiserver: u16,
    pub controller_manager: u16,
    pub scheduler: u16,
}

/// The temp dir's layout.
#[derive(Debug)]
pub(crate) struct WorkDir {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub pki: Pki,
    /// `--token-auth-file`: one admin token in group system:masters.
    pub tokens: PathBuf,
    pub kubeconfig: PathBuf,
    pub etcd_data: PathBuf,
    pub logs: PathBuf,
    /// Parent of each component's `--cert-dir` (self-signed serving certs).
    pub serving_certs: PathBuf,
    pub ports: Ports,
    /// Where the apiserver listens: 127.0.0.1, or the real node's bridge
    /// address so pods can reach it.
    pub host: std::net::Ipv4Addr,
}

impl WorkDir {
    /// A fresh temp dir under `CSIOPS_E2E_TMPDIR` or the system temp dir,
    /// after removing those left by test processes that died without
    /// cleaning up (SIGKILL). Kept short: Unix socket paths put in it later
    /// must stay under 108 bytes.
    pub fn create(host: std::net::Ipv4Addr) -> Result<WorkDir> {
        let parent = std::env::var_os("CSIOPS_E2E_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        sweep_stale_dirs(&parent);
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir_in(&parent)
            .map_err(io("creating temp dir in", &parent))?;
        let root = dir.path().to_path_buf();
        write(&root.join("owner.pid"), &std::process::id().to_string())?;

        let sub = |name: &str| -> Result<PathBuf> {
            let p = root.join(name);
            std::fs::create_dir_all(&p).map_err(io("creating dir", &p))?;
            Ok(p)
        };
        let (pki_dir, etcd_data, logs, serving_certs) = (
            sub("pki")?,
            sub("etcd")?,
            sub("logs")?,
            sub("serving-certs")?,
        );
        // etcd warns about (and may refuse) a data dir that is not 0700.
        std::fs::set_permissions(
            &etcd_data,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(io("chmod", &etcd_data))?;

        let pki = Pki::generate(&pki_dir)?;
        let token = random_token()?;
        let tokens = pki_dir.join("tokens.csv");
        write(
            &tokens,
            &format!("{token},admin,admin,\"system:masters\"\n"),
        )?;

        let p = ports::free_ports(5)?;
        let ports = Ports {
            etcd_client: p[0],
            etcd_peer: p[1],
            apiserver: p[2],
            controller_manager: p[3],
            scheduler: p[4],
        };
        let kubeconfig = root.join("kubeconfig");
        write(
            &kubeconfig,
            &kubeconfig_yaml(host, ports.apiserver, &pki.ca_cert, &token),
        )?;

        Ok(WorkDir {
            dir,
            root,
            pki,
            tokens,
            kubeconfig,
            etcd_data,
            logs,
            serving_certs,
            ports,
            host,
        })
    }
}

fn sweep_stale_dirs(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let owner = std::fs::read_to_string(entry.path().join("owner.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if let Some(pid) = owner {
            // Never delete through a mount (a real node's leftovers could
            // lead into host directories): unmount first, skip if stuck.
            if !process::pid_alive(pid)
                && crate::realnode::host::unmount_all_under(&entry.path()).is_empty()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Admin kubeconfig: static token, CA by path (kube-rs, kubectl and kwok
/// all read `certificate-authority` files), namespace `default`.
fn kubeconfig_yaml(host: std::net::Ipv4Addr, api_port: u16, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: csiops-e2e
  cluster:
    server: https://{host}:{api_port}
    certificate-authority: {ca}
users:
- name: admin
  user:
    token: {token}
contexts:
- name: csiops-e2e
  context:
    cluster: csiops-e2e
    user: admin
    namespace: default
current-context: csiops-e2e
",
        ca = ca.display()
    )
}

/// 128 random bits, hex.
fn random_token() -> Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(io("reading", "/dev/urandom"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(io("writing", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_only_dirs_of_dead_owners() {
        let parent = tempfile::tempdir().unwrap();
        let mk = |name: &str, owner: Option<&str>| {
            let d = parent.path().join(name);
            std::fs::create_dir(&d).unwrap();
            if let Some(o) = owner {
                std::fs::write(d.join("owner.pid"), o).unwrap();
            }
            d
        };
        // pid_max is at most 2^22, so this pid cannot exist.
        let dead = mk("csiops-e2e-dead", Some("99999999"));
        let alive = mk("csiops-e2e-alive", Some(&std::process::id().to_string()));
        let unowned = mk("csiops-e2e-unowned", None);
        let other = mk("other-dead", Some("99999999"));
        sweep_stale_dirs(parent.path());
        assert!(!dead.exists());
        assert!(alive.exists() && unowned.exists() && other.exists());
    }

    #[test]
    fn token_is_random_hex() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
