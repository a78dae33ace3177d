//! The command line of `csiops-sidecar`: a role, then its flags in any form
//! Go's flag package accepts (see `common::goflags`).

use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::common::args::{CommonArgs, FlagError};
use crate::common::goflags::{self, Inferred};
use crate::{attacher, liveness, provisioner, registrar};

/// Rust replacements of the kubernetes-csi sidecars.
#[derive(Debug, Parser)]
#[command(
    name = "csiops-sidecar",
    version,
    propagate_version = true,
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub role: Role,
}

#[derive(Debug, Subcommand)]
pub enum Role {
    /// Registers the driver with kubelet and keeps this node's CSINode entry.
    Registrar(registrar::RegistrarArgs),
    /// Serves /healthz by calling the driver's Probe.
    LivenessProbe(liveness::LivenessArgs),
    /// Creates and deletes volumes for PersistentVolumeClaims.
    // Upstream's --timeout default for the provisioner is 10s.
    #[command(mut_arg("timeout", |a| a.default_value("10s")))]
    Provisioner(provisioner::ProvisionerArgs),
    /// Attaches and detaches volumes for VolumeAttachments (ControllerPublish/Unpublish).
    Attacher(attacher::AttacherArgs),
}

impl Role {
    /// Upstream's program name for this role: the first word of the sidecar's
    /// `User-Agent`, so the API server names the same field manager for its
    /// writes as for upstream's (see `csiops_runtime::kube::set_agent`).
    pub fn upstream_program(&self) -> &'static str {
        match self {
            Role::Registrar(_) => "csi-node-driver-registrar",
            Role::LivenessProbe(_) => "livenessprobe",
            Role::Provisioner(_) => "csi-provisioner",
            Role::Attacher(_) => "csi-attacher",
        }
    }

    /// The flags every role has.
    pub fn common(&self) -> &CommonArgs {
        match self {
            Role::Registrar(a) => &a.common,
            Role::LivenessProbe(a) => &a.common,
            Role::Provisioner(a) => &a.common,
            Role::Attacher(a) => &a.common,
        }
    }
}

impl Role {
    /// Every check of the role's flags that clap cannot make, as the role
    /// makes them first thing when it runs (for tests and tools; `run`
    /// repeats them).
    pub fn check(&self) -> Result<(), FlagError> {
        self.common().log_filter()?;
        match self {
            Role::Registrar(a) => a.admin_addr().map(|_| ()),
            Role::LivenessProbe(a) => a.endpoints().map(|_| ()),
            Role::Provisioner(a) => a.check().map(|_| ()),
            Role::Attacher(a) => a.check().map(|_| ()),
        }
    }
}

/// The clap command of [`Cli`].
pub fn command() -> clap::Command {
    Cli::command()
}

/// A parsed command line, with what the role should say once logging is up.
#[derive(Debug)]
pub struct Parsed {
    pub cli: Cli,
    /// Flags given that are accepted and ignored (`--name` each).
    pub ignored: Vec<String>,
    /// The role, when the command line named none (an upstream manifest).
    pub inferred: Option<Inferred>,
}

/// Parses `argv` (`argv[0]` first). The error is clap's: `exit()` prints it
/// (help and version included) with clap's exit code.
pub fn parse_from(argv: Vec<OsString>) -> Result<Parsed, clap::Error> {
    let cmd = command();
    let (argv, inferred) = goflags::normalize(&cmd, argv);
    let matches = cmd.clone().try_get_matches_from(argv)?;
    let cli = Cli::from_arg_matches(&matches)?;
    let ignored = matches
        .subcommand()
        .and_then(|(name, sub)| {
            cmd.find_subcommand(name)
                .map(|role| goflags::ignored_given(role, sub))
        })
        .unwrap_or_default();
    Ok(Parsed {
        cli,
        ignored,
        inferred,
    })
}
