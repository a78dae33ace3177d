//! `kubectl-csiops`: the kubectl plugin (`kubectl csiops …` once on PATH).
//! Only the command line lives here; see the library for the commands.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use kubectl_csiops::{cluster, diff, import, input, render_cmd};

/// Import CSI driver manifests into a CSIDriverDeployment, render one
/// offline, and diff the two.
#[derive(Debug, Parser)]
#[command(name = "kubectl-csiops", bin_name = "kubectl csiops", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the objects the operator would create for a CSIDriverDeployment (offline).
    Render {
        /// The CR (a file, or - for stdin).
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        /// The csiops-sidecar image when the CR sets none (default: the operator's).
        #[arg(long)]
        sidecar_image: Option<String>,
    },
    /// Turn a driver's manifests into one CSIDriverDeployment and a report.
    /// Exit code 2: something is not representable (unless --allow-partial).
    Import {
        /// Files or directories (recursively *.yaml, *.yml); - for stdin.
        #[arg(
            short = 'f',
            long = "filename",
            required_unless_present = "from_cluster"
        )]
        files: Vec<PathBuf>,
        /// metadata.name of the CR (default: from the driver name).
        #[arg(long)]
        name: Option<String>,
        /// metadata.namespace of the CR (default: the workloads').
        #[arg(long, short = 'n')]
        namespace: Option<String>,
        /// Write the report here instead of stderr.
        #[arg(long)]
        report: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
        report_format: ReportFormat,
        /// Exit 0 even when something is not representable.
        #[arg(long)]
        allow_partial: bool,
        /// Read the live objects of --driver from the cluster (kubeconfig).
        #[arg(long, requires = "driver")]
        from_cluster: bool,
        /// The driver's name (CSIDriver); with --from-cluster, what to read.
        #[arg(long)]
        driver: Option<String>,
        /// Write spec.adoption: applying the CR takes the running
        /// deployment over in place (docs/adoption.md).
        #[arg(long)]
        adopt: bool,
    },
    /// Show the differences that matter between manifests and what a CR
    /// renders. Exit code 1: differences; 0: none; 2: trouble.
    Diff {
        /// The driver's manifests (files, directories, -).
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// The CR to compare with (default: the manifests' own import).
        #[arg(long)]
        cr: Option<PathBuf>,
        #[arg(long)]
        sidecar_image: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ReportFormat {
    Text,
    Json,
}

/// What went wrong, for the user.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error(transparent)]
    Input(#[from] input::InputError),
    #[error(transparent)]
    Import(#[from] import::ImportError),
    #[error(transparent)]
    Render(#[from] render_cmd::RenderCmdError),
    #[error(transparent)]
    Diff(#[from] diff::DiffError),
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
    #[error("cannot write {what}: {source}")]
    Write {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot serialize: {0}")]
    Serialize(String),
}

fn write_out(text: &str) -> Result<(), Error> {
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|source| Error::Write {
            what: "stdout".into(),
            source,
        })
}

fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Render {
            file,
            sidecar_image,
        } => {
            let objects = input::read_sources(&[file])?;
            let cr = render_cmd::find_cr(&objects)?;
            let cfg = import::render_config(sidecar_image.as_deref());
            write_out(&render_cmd::render_yaml(&cr, &cfg)?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Import {
            files,
            name,
            namespace,
            report,
            report_format,
            allow_partial,
            from_cluster,
            driver,
            adopt,
        } => {
            let objects = if from_cluster {
                let driver = driver.clone().unwrap_or_default();
                cluster::read_driver(&driver)?
            } else {
                input::read_sources(&files)?
            };
            let opts = import::Options {
                name,
                namespace,
                driver_name: driver,
                adopt,
            };
            let imported = import::import(&objects, &opts, &import::render_config(None))?;
            let yaml =
                import::cr_yaml(&imported.cr).map_err(|e| Error::Serialize(e.to_string()))?;
            write_out(&yaml)?;
            let text = match report_format {
                ReportFormat::Text => imported.report.to_text(),
                ReportFormat::Json => imported
                    .report
                    .to_json()
                    .map_err(|e| Error::Serialize(e.to_string()))?,
            };
            match report {
                Some(path) => std::fs::write(&path, text).map_err(|source| Error::Write {
                    what: path.display().to_string(),
                    source,
                })?,
                None => eprint!("{text}"),
            }
            Ok(if imported.report.partial() && !allow_partial {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Diff {
            files,
            cr,
            sidecar_image,
        } => {
            let objects = input::read_sources(&files)?;
            let cfg = import::render_config(sidecar_image.as_deref());
            let cr = match cr {
                Some(path) => render_cmd::find_cr(&input::read_sources(&[path])?)?,
                None => import::import(&objects, &import::Options::default(), &cfg)?.cr,
            };
            let diffs = diff::diff(&objects, &cr, &cfg)?;
            write_out(&diff::to_text(&diffs))?;
            Ok(if diffs.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let is_diff = matches!(cli.command, Command::Diff { .. });
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                let s_text = s.to_string();
                if !msg.contains(&s_text) {
                    msg.push_str(": ");
                    msg.push_str(&s_text);
                }
                source = s.source();
            }
            eprintln!("kubectl csiops: {msg}");
            // diff(1): 2 is trouble, 1 is differences.
            ExitCode::from(if is_diff { 2 } else { 1 })
        }
    }
}
