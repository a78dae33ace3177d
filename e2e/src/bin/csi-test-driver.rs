//! `csi-test-driver`: a CSI driver with persistent, inspectable state for
//! the e2e tests. See `csiops_e2e::testdriver`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use csiops_e2e::testdriver::{self, serve, Config};
use csiops_e2e::workload;
use tracing_subscriber::EnvFilter;

/// A hostpath-style CSI test driver whose volumes survive restarts.
#[derive(Debug, Parser)]
#[command(
    name = "csi-test-driver",
    version,
    args_conflicts_with_subcommands = true,
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    serve: Config,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the volumes of a state dir as a JSON array (creation order).
    List {
        #[arg(long)]
        state_dir: PathBuf,
    },
    /// Print the whole state file of a state dir as JSON.
    State {
        #[arg(long)]
        state_dir: PathBuf,
    },
    /// A workload for e2e pods: write `--text` to `<dir>/<file>` (or at the
    /// start of `--device`), read it back, then append `<n> <unix ms>` to
    /// `<dir>/counter` every `--interval-ms` until SIGTERM.
    App(workload::AppArgs),
    /// Print a file (for `kubectl exec`; the image has no shell).
    Cat { path: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::List { state_dir }) => print_json(&state_dir, |s| {
            serde_json::to_string_pretty(&s.volumes_by_seq())
        }),
        Some(Command::State { state_dir }) => {
            print_json(&state_dir, |s| serde_json::to_string_pretty(&s))
        }
        Some(Command::App(args)) => workload::run(&args),
        Some(Command::Cat { path }) => match std::fs::read(&path) {
            Ok(bytes) => {
                use std::io::Write;
                let mut out = std::io::stdout();
                if out.write_all(&bytes).and_then(|()| out.flush()).is_ok() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("csi-test-driver cat: {}: {e}", path.display());
                ExitCode::FAILURE
            }
        },
        None => serve_main(cli.serve),
    }
}

fn print_json(
    dir: &std::path::Path,
    render: impl FnOnce(&testdriver::State) -> serde_json::Result<String>,
) -> ExitCode {
    let text = testdriver::load_state(dir)
        .map_err(|e| e.to_string())
        .and_then(|s| render(&s).map_err(|e| e.to_string()));
    match text {
        Ok(t) => {
            println!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("csi-test-driver: {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

fn serve_main(cfg: Config) -> ExitCode {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::new(v),
        _ => EnvFilter::new("info,h2=warn,hyper=warn,tower=warn"),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("csi-test-driver: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(serve::run(cfg));
    // State transactions still running on the blocking pool get a moment.
    runtime.shutdown_timeout(serve::SHUTDOWN_GRACE);
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "csi-test-driver failed");
            ExitCode::FAILURE
        }
    }
}
