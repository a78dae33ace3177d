//! `csiops-sidecar <role>`.

use std::process::ExitCode;

use csiops_runtime::{chain, logging};
use csiops_sidecars::cli::{self, Role};
use csiops_sidecars::{attacher, liveness, provisioner, registrar};

// One thread: a node sidecar has little to do at once, and every thread
// costs memory on every node of the cluster.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let parsed = match cli::parse_from(std::env::args_os().collect()) {
        Ok(p) => p,
        Err(e) => e.exit(),
    };
    let common = parsed.cli.role.common();
    let started = common
        .log_filter()
        .map_err(|e| chain(&e).to_string())
        .and_then(|filter| {
            logging::init(common.log_format, &filter).map_err(|e| chain(&e).to_string())
        });
    if let Err(e) = started {
        eprintln!("csiops-sidecar: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(i) = &parsed.inferred {
        tracing::info!(
            role = i.role,
            "no role named; {} makes this the {}",
            i.because,
            i.role
        );
    }
    if !parsed.ignored.is_empty() {
        tracing::warn!(
            "accepted for compatibility with upstream and ignored (see README, \"Upstream flags\"): {}",
            parsed.ignored.join(" ")
        );
    }
    let res = match parsed.cli.role {
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
