//! What both binaries do around a role: logging set up from the role's
//! flags, the start-up messages, the exit code, and the hand-off of the node
//! roles from `csiops-sidecar` to `csiops-node-sidecar`.
//!
//! Why two binaries: the registrar and the liveness probe run on every node,
//! and most of a sidecar's idle memory is the binary's own code mapped from
//! the file (the kernel maps 64 KiB around every page touched). The node
//! binary carries only the node roles and is built for size
//! (`[profile.node]` in the workspace `Cargo.toml`), so it maps a fraction
//! of what the full binary does. The image ships both, and its entrypoint
//! stays `csiops-sidecar`: a manifest that names the role, or an upstream
//! manifest whose flags imply it, starts the node binary in place of itself
//! (`exec`, same pid, same arguments), which keeps the image a drop-in.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use csiops_runtime::{chain, logging};

use crate::cli::{Parsed, Role};
use crate::SidecarError;

/// The file name of the node binary, beside `csiops-sidecar` in the image.
pub const NODE_BINARY: &str = "csiops-node-sidecar";

/// Sets up logging from the role's flags and says what the command line
/// implied. On error, prints it and returns the exit code to stop with.
pub fn start(parsed: &Parsed) -> Result<(), ExitCode> {
    csiops_runtime::kube::set_agent(parsed.cli.role.upstream_program());
    let common = parsed.cli.role.common();
    let started = common
        .log_filter()
        .map_err(|e| chain(&e).to_string())
        .and_then(|filter| {
            logging::init(common.log_format, &filter).map_err(|e| chain(&e).to_string())
        });
    if let Err(e) = started {
        eprintln!("csiops-sidecar: {e}");
        return Err(ExitCode::FAILURE);
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
            "accepted for compatibility with upstream and ignored (see docs/sidecars.md, \"Upstream flags\"): {}",
            parsed.ignored.join(" ")
        );
    }
    Ok(())
}

/// Logs how the role ended and turns it into the exit code.
pub fn finish(res: Result<(), SidecarError>) -> ExitCode {
    match res {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %chain(&e), "stopped with an error");
            write_termination_message(Path::new(TERMINATION_LOG), &chain(&e).to_string());
            ExitCode::FAILURE
        }
    }
}

/// Where kubelet reads a container's termination message from (the
/// default `terminationMessagePath`); it shows in the pod's
/// `lastState.terminated.message`, which the operator reports.
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// Writes `message` (at most kubelet's 4096 bytes) to `path` if that file
/// exists (outside a pod it does not: nothing is written).
pub fn write_termination_message(path: &Path, message: &str) {
    if !path.exists() {
        return;
    }
    let mut end = message.len().min(4096);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    if let Err(e) = std::fs::write(path, &message[..end]) {
        tracing::debug!(error = %e, "cannot write the termination message");
    }
}

/// Whether `role` is one the node binary runs.
pub fn is_node_role(role: &Role) -> bool {
    matches!(role, Role::Registrar(_) | Role::LivenessProbe(_))
}

/// The node binary to hand `role` to: `csiops-node-sidecar` in the
/// directory of the running binary `exe`, for a node role, when that file
/// exists and is not older than `exe`. `None` runs the role in this binary:
/// a build without the node binary beside it (`cargo run`), or a
/// `csiops-sidecar` rebuilt alone since, whose code the stale node binary
/// would not have. (The image builds both together.)
pub fn node_handoff(role: &Role, exe: &Path) -> Option<PathBuf> {
    if !is_node_role(role) {
        return None;
    }
    let node = exe.parent()?.join(NODE_BINARY);
    let meta = std::fs::metadata(&node).ok().filter(|m| m.is_file())?;
    let built = |m: std::fs::Metadata| m.modified().ok();
    let older = match (built(meta), std::fs::metadata(exe).ok().and_then(built)) {
        (Some(n), Some(e)) => n < e,
        _ => false,
    };
    (!older).then_some(node)
}

/// Replaces this process with `node`, given the same arguments (`argv[0]`
/// included, so messages and `ps` still read `csiops-sidecar`). Returns
/// only if the exec failed, with the error.
pub fn exec_node(node: &Path, argv: &[OsString]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(node);
    if let Some((argv0, rest)) = argv.split_first() {
        cmd.arg0(argv0).args(rest);
    }
    cmd.exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_of_a_failure_is_left_where_kubelet_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("termination-log");
        // Outside a pod the file does not exist: nothing is created.
        write_termination_message(&log, "x");
        assert!(!log.exists());
        std::fs::write(&log, "").unwrap();
        write_termination_message(&log, "the driver reports the name \"a\"");
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "the driver reports the name \"a\""
        );
        // Cut to kubelet's 4096 bytes, on a character boundary.
        write_termination_message(&log, &"é".repeat(3000));
        let kept = std::fs::read_to_string(&log).unwrap();
        assert!(
            kept.len() <= 4096 && kept.chars().all(|c| c == 'é'),
            "{}",
            kept.len()
        );
    }
    use crate::cli;

    fn role(args: &[&str]) -> Role {
        let argv = std::iter::once("csiops-sidecar")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        cli::parse_from(argv).expect("parses").cli.role
    }

    #[test]
    fn node_roles_go_to_the_node_binary_when_it_is_beside_us() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("csiops-sidecar");
        std::fs::write(&exe, "").unwrap();
        let registrar = role(&[
            "registrar",
            "--csi-address=/csi/csi.sock",
            "--kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock",
        ]);
        // An upstream livenessprobe command line, no role named.
        let liveness = role(&["--csi-address=/csi/csi.sock", "--probe-timeout=3s"]);
        let provisioner = role(&["provisioner", "--csi-address=/csi/csi.sock"]);

        // No node binary yet: everything runs here.
        assert_eq!(node_handoff(&registrar, &exe), None);

        let node = dir.path().join(NODE_BINARY);
        std::fs::write(&node, "").unwrap();
        assert_eq!(node_handoff(&registrar, &exe), Some(node.clone()));
        assert_eq!(node_handoff(&liveness, &exe), Some(node));
        // The controller roles never leave the full binary.
        assert_eq!(node_handoff(&provisioner, &exe), None);
    }

    #[test]
    fn an_older_node_binary_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("csiops-sidecar");
        let node = dir.path().join(NODE_BINARY);
        std::fs::write(&exe, "").unwrap();
        std::fs::write(&node, "").unwrap();
        let now = std::time::SystemTime::now();
        let set = |p: &Path, t| {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(t)
                .unwrap()
        };
        let liveness = role(&["liveness-probe", "--csi-address=/csi/csi.sock"]);
        // Built together (the image's files share one time): used.
        set(&exe, now);
        set(&node, now);
        assert_eq!(node_handoff(&liveness, &exe), Some(node.clone()));
        // csiops-sidecar rebuilt alone since: the role runs in it.
        set(&node, now - std::time::Duration::from_secs(60));
        assert_eq!(node_handoff(&liveness, &exe), None);
    }

    #[test]
    fn a_directory_named_like_the_node_binary_is_not_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(NODE_BINARY)).unwrap();
        let registrar = role(&[
            "registrar",
            "--csi-address=/csi/csi.sock",
            "--kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock",
        ]);
        assert_eq!(
            node_handoff(&registrar, &dir.path().join("csiops-sidecar")),
            None
        );
    }
}
