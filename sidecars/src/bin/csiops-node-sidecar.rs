//! `csiops-node-sidecar`: the node roles of `csiops-sidecar` (registrar,
//! liveness-probe) in a binary built for size, which `csiops-sidecar` hands
//! them to. Same command line; the controller roles are refused here.

use std::process::ExitCode;

use csiops_sidecars::cli::{self, Role};
use csiops_sidecars::{entry, liveness, registrar};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let parsed = match cli::parse_from(std::env::args_os().collect()) {
        Ok(p) => p,
        Err(e) => e.exit(),
    };
    if let Err(code) = entry::start(&parsed) {
        return code;
    }
    entry::finish(match parsed.cli.role {
        Role::Registrar(a) => registrar::run(a).await,
        Role::LivenessProbe(a) => liveness::run(a).await,
        Role::Provisioner(_) | Role::Attacher(_) => {
            tracing::error!(
                "{} runs the registrar and liveness-probe roles only; csiops-sidecar runs this one",
                entry::NODE_BINARY
            );
            return ExitCode::FAILURE;
        }
    })
}
