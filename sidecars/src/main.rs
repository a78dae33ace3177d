//! `csiops-sidecar <role>`: every role. The node roles are handed to
//! `csiops-node-sidecar` when it sits beside this binary (see `entry`).

use std::process::ExitCode;

use csiops_sidecars::cli::{self, Role};
use csiops_sidecars::{attacher, entry, liveness, provisioner, registrar};

// One thread: a sidecar has little to do at once, and every thread costs
// memory on every node of the cluster.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let argv: Vec<_> = std::env::args_os().collect();
    let parsed = match cli::parse_from(argv.clone()) {
        Ok(p) => p,
        Err(e) => e.exit(),
    };
    let node = std::env::current_exe()
        .ok()
        .and_then(|exe| entry::node_handoff(&parsed.cli.role, &exe));
    if let Some(node) = node {
        // Before logging is set up, so the node binary says everything once.
        let err = entry::exec_node(&node, &argv);
        eprintln!(
            "csiops-sidecar: could not start {}: {err}; running the role in this binary",
            node.display()
        );
    }
    if let Err(code) = entry::start(&parsed) {
        return code;
    }
    entry::finish(match parsed.cli.role {
        Role::Registrar(a) => registrar::run(a).await,
        Role::LivenessProbe(a) => liveness::run(a).await,
        Role::Provisioner(a) => provisioner::run(a).await,
        Role::Attacher(a) => attacher::run(a).await,
    })
}
