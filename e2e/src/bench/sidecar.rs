//! A controller sidecar under bench, ours (`csiops-sidecar <role>`) or
//! upstream's (its own binary), as a process with the flags both share;
//! a replica gets a host name of its own (a UTS namespace), since
//! upstream's leader-election identity is the host name and two replicas
//! on one machine would otherwise both hold the Lease.

use std::path::{Path, PathBuf};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use crate::process::ManagedProcess;
use crate::Result;

/// Which sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Provisioner,
    Attacher,
}

impl Role {
    /// Our subcommand.
    pub fn subcommand(self) -> &'static str {
        match self {
            Role::Provisioner => "provisioner",
            Role::Attacher => "attacher",
        }
    }

    /// The variable (and Makefile setting) naming upstream's binary.
    pub fn upstream_env(self) -> &'static str {
        match self {
            Role::Provisioner => "UPSTREAM_PROVISIONER",
            Role::Attacher => "UPSTREAM_ATTACHER",
        }
    }

    /// The Lease both ours and upstream's take for `driver` in leader
    /// election (csi-lib-utils' names).
    pub fn lease(self, driver: &str) -> String {
        let sanitized = crate::attach::csi_lib_utils_name(driver);
        match self {
            Role::Provisioner => sanitized,
            Role::Attacher => format!("external-attacher-leader-{sanitized}"),
        }
    }
}

/// One side of a side-by-side run.
#[derive(Clone, Debug)]
pub struct Side {
    /// `csiops` or `upstream`.
    pub name: String,
    pub bin: PathBuf,
    pub upstream: bool,
}

impl Side {
    pub fn ours(bin: PathBuf) -> Side {
        Side {
            name: "csiops".into(),
            bin,
            upstream: false,
        }
    }

    pub fn upstream(bin: PathBuf) -> Side {
        Side {
            name: "upstream".into(),
            bin,
            upstream: true,
        }
    }
}

/// `NAME=PATH` of `--ours`: one build of our sidecar under a name of its
/// own. The name goes into the run's driver and class names, so it must be
/// a DNS label.
pub fn parse_named_build(s: &str) -> std::result::Result<(String, PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=PATH"))?;
    let label = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !label || name == "upstream" {
        return Err(format!(
            "{name:?}: a build's name is a lower-case DNS label of at most 40 characters, not \"upstream\""
        ));
    }
    let path = PathBuf::from(path);
    if !path.is_file() {
        return Err(format!("{}: no such file", path.display()));
    }
    Ok((name.to_string(), path))
}

/// Our sides of a run: each `--ours NAME=PATH` in the order given, or
/// `csiops` from `CSIOPS_SIDECAR_BIN` when none is. Two builds of ours in one
/// run, against the same control plane, are how a change is shown to be
/// within noise of the build it replaced.
pub fn our_sides(builds: &[(String, PathBuf)]) -> Result<Vec<Side>> {
    if builds.is_empty() {
        return Ok(vec![Side::ours(crate::sidecar_bin()?)]);
    }
    Ok(builds
        .iter()
        .map(|(name, bin)| Side {
            name: name.clone(),
            bin: bin.clone(),
            upstream: false,
        })
        .collect())
}

/// The flags both sides get.
#[derive(Clone, Debug)]
pub struct Flags {
    pub socket: PathBuf,
    pub kubeconfig: PathBuf,
    pub qps: f64,
    pub burst: u32,
    pub workers: usize,
    pub timeout: String,
    pub leader_election: bool,
    pub http_port: u16,
}

impl Flags {
    fn argv(&self) -> Vec<String> {
        let mut v = vec![
            format!("--csi-address=unix://{}", self.socket.display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--kube-api-qps={}", self.qps),
            format!("--kube-api-burst={}", self.burst),
            format!("--worker-threads={}", self.workers),
            format!("--timeout={}", self.timeout),
            format!("--http-endpoint=127.0.0.1:{}", self.http_port),
            "--v=1".to_string(),
        ];
        if self.leader_election {
            v.push("--leader-election".into());
            v.push("--leader-election-namespace=default".into());
        }
        v
    }
}

/// Starts `side`'s `role` with `flags`; `replica` names its host (and so
/// its leader-election identity), `None` runs it in this host's UTS. Ours
/// also gets `replica` as `POD_NAME`, its identity in a pod: a replica
/// started again under the same name is a container restarted in its pod.
pub fn spawn(
    side: &Side,
    role: Role,
    flags: &Flags,
    replica: Option<&str>,
    log: &Path,
) -> Result<ManagedProcess> {
    let mut argv = Vec::new();
    if !side.upstream {
        argv.push(role.subcommand().to_string());
    }
    argv.extend(flags.argv());
    let name = format!(
        "{}-{}{}",
        side.name,
        role.subcommand(),
        replica.map_or(String::new(), |r| format!("-{r}"))
    );
    match replica {
        None => ManagedProcess::spawn(&name, &side.bin, &argv, log),
        Some(host) => {
            // unshare and sh exec in place: the pid is the sidecar's.
            let mut wrapped = vec![
                "--uts".to_string(),
                "sh".into(),
                "-c".into(),
                "hostname \"$0\" && exec \"$@\"".into(),
                host.into(),
                side.bin.display().to_string(),
            ];
            wrapped.extend(argv);
            let env: &[(&str, &str)] = match side.upstream {
                true => &[],
                false => &[("POD_NAME", host)],
            };
            ManagedProcess::spawn_with_env(&name, Path::new("unshare"), &wrapped, env, log)
        }
    }
}

/// The Lease's holder, if any.
pub async fn holder(client: &kube::Client, lease: &str) -> Result<Option<String>> {
    Ok(holder_at(client, lease).await?.0)
}

/// The Lease's holder, if any, and its resourceVersion (a write by the
/// same holder, a renewal, changes only the latter).
pub async fn holder_at(
    client: &kube::Client,
    lease: &str,
) -> Result<(Option<String>, Option<String>)> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease = api.get_opt(lease).await?;
    let version = lease
        .as_ref()
        .and_then(|l| l.metadata.resource_version.clone());
    let holder = lease
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty());
    Ok((holder, version))
}

/// A kubeconfig that acts as ServiceAccount `default/<name>`, bound to
/// cluster-admin: a sidecar (or another client) then goes through API
/// priority and fairness as a workload does (the admin of the test bed is
/// in `system:masters`, which APF exempts). Its path.
pub async fn service_account_kubeconfig(cluster: &crate::Cluster, name: &str) -> Result<PathBuf> {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
    use kube::api::PostParams;
    let bindings: Api<ClusterRoleBinding> = Api::all(cluster.client()?);
    let binding = ClusterRoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("bench-{name}")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "cluster-admin".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some("default".into()),
            ..Default::default()
        }]),
    };
    bindings.create(&PostParams::default(), &binding).await?;
    cluster.impersonating_kubeconfig("default", name)
}

/// A client from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_as_csi_lib_utils() {
        assert_eq!(
            Role::Provisioner.lease("scale.bench.csiops.dev"),
            "scale-bench-csiops-dev"
        );
        assert_eq!(
            Role::Attacher.lease("scale.bench.csiops.dev"),
            "external-attacher-leader-scale-bench-csiops-dev"
        );
        assert_eq!(Role::Provisioner.lease("a/"), "a-X");
    }

    #[test]
    fn named_builds_are_dns_labels_of_existing_files() {
        let bin = std::env::current_exe().expect("the test binary's path");
        let ok = parse_named_build(&format!("before={}", bin.display())).expect("a valid build");
        assert_eq!(ok, ("before".to_string(), bin.clone()));
        for bad in ["Before", "a.b", "-a", "upstream", ""] {
            let arg = format!("{bad}={}", bin.display());
            assert!(parse_named_build(&arg).is_err(), "{arg} was taken");
        }
        assert!(parse_named_build("no-equals-sign").is_err());
        assert!(parse_named_build("x=/nonexistent/csiops-sidecar").is_err());
    }
}
