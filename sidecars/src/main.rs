//! `csiops-sidecar <role>`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use csiops_runtime::{chain, logging};
use csiops_sidecars::{attacher, liveness, provisioner, registrar};

/// Rust replacements of the kubernetes-csi sidecars.
#[derive(Debug, Parser)]
#[command(name = "csiops-sidecar", version, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Debug, Subcommand)]
enum Role {
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

// One thread: a node sidecar has little to do at once, and every thread
// costs memory on every node of the cluster.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let common = match &cli.role {
        Role::Registrar(a) => &a.common,
        Role::LivenessProbe(a) => &a.common,
        Role::Provisioner(a) => &a.common,
        Role::Attacher(a) => &a.common,
    };
    if let Err(e) = logging::init(common.log_format, &logging::klog_filter(common.verbosity)) {
        eprintln!("csiops-sidecar: {}", chain(&e));
        return ExitCode::FAILURE;
    }
    let res = match cli.role {
        Role::Registrar(a) => registrar::run(a).await,
        Role::LivenessProbe(a) => liveness::run(a).await,
        Role::Provisioner(a) => provisioner::run(a).await,
        Role::Attacher(a) => attacher::run(a).await,
    };
    match res {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %chain(&e), "stopped with an error");
            ExitCode::FAILURE
        }
    }
}
