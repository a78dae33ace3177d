//! `csiops-operator`: the binary. Wires flags, logging, the admin server,
//! leader election and the controller, and shuts down cleanly on SIGTERM.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Parser;
use csiops_operator::cli::Args;
use csiops_operator::metrics::Metrics;
use csiops_operator::reconcile::{self, RunConfig};
use csiops_operator::render::RenderConfig;
use csiops_runtime::admin::{self, AdminState};
use csiops_runtime::leader::{run_as_leader, LeadError, LeaderConfig, LeaseGuard, Role};
use csiops_runtime::{chain, kube as kube_config, logging, requests, shutdown};
use tracing::{error, info};

// One thread: the operator's work is many small wake-ups (watch events,
// paced reconciles of a few milliseconds), and on a multi-threaded runtime
// each of them would also park and wake a worker thread, which costs more
// than the work; nothing here blocks or needs a second core.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    kube_config::set_agent("csiops-operator");
    if let Err(e) = logging::init(args.log_format, &args.log_level) {
        eprintln!("csiops-operator: {}", chain(&e));
        return ExitCode::FAILURE;
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %chain(&e), "csiops-operator stopped");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum MainError {
    #[error(transparent)]
    Config(#[from] kube_config::ConfigError),
    #[error("cannot reach the API server")]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Leader(#[from] csiops_runtime::leader::LeaderError),
    #[error(transparent)]
    Admin(#[from] admin::AdminError),
}

async fn run(args: Args) -> Result<(), MainError> {
    let metrics = Arc::new(Metrics::new());
    // Every request counted (csiops_kube_api_requests_total), as the
    // sidecars count theirs: leader election, the watches and the reconciles.
    let client = requests::counted_client(
        kube_config::config(args.kubeconfig.as_deref()).await?,
        metrics.api_requests(),
    )
    .map_err(kube_config::ConfigError::Client)?;
    let version = client
        .apiserver_version()
        .await
        .map_err(MainError::Client)?;
    info!(
        operator = env!("CARGO_PKG_VERSION"),
        apiserver = %version.git_version,
        watch_namespaces = ?reconcile::Namespaces::from_list(&args.watch_namespaces)
            .listed()
            .unwrap_or_else(|| vec!["(all)"]),
        "csiops-operator starting"
    );

    let ready = Arc::new(AtomicBool::new(false));
    let stop = shutdown::on_signals();

    // Bind first so a taken port fails the start, not the shutdown.
    let listener = admin::bind(args.http_endpoint).await?;
    let admin_state = AdminState::new(metrics.clone()).ready(ready.clone());
    let admin_state = args.metrics_auth.secure_with(admin_state, client.clone())?;
    let admin = admin::serve_on(listener, admin_state, stop.clone());

    let identity = args.identity();
    let election = args.leader_election.then(|| {
        LeaderConfig::new(
            args.leader_election_lease_name.clone(),
            args.leader_election_namespace.clone(),
            identity.clone(),
        )
    });
    let role = |role: Role| match role {
        // A standby is healthy and ready: it serves its role by waiting.
        Role::Standby => ready.store(true, Ordering::SeqCst),
        // Ready again once the leader's caches have synced.
        Role::Leading => {
            ready.store(false, Ordering::SeqCst);
            metrics.set_leader(true);
        }
        // Another replica may lead now: the controller stops at once, and
        // the process exits non-zero to be restarted.
        Role::Lost => metrics.set_leader(false),
    };
    let ready_flag = ready.clone();
    let run_config = RunConfig {
        render: RenderConfig {
            sidecar_image: args.sidecar_image.clone(),
            operator_version: env!("CARGO_PKG_VERSION").to_string(),
        },
        concurrency: args.concurrency,
        instance: Some(identity),
        scope: reconcile::Namespaces::from_list(&args.watch_namespaces),
        admission_check: args
            .admission_check
            .then(|| std::time::Duration::from_secs(args.admission_check_seconds)),
    };
    let controller_client = client.clone();
    let controller_metrics = metrics.clone();
    let controller_stop = stop.clone();
    // Nothing in the operator consults the guard: a lost Lease drops the
    // controller, and the process exits.
    let result = run_as_leader(
        client,
        election,
        LeaseGuard::new(),
        &stop,
        role,
        move || async move {
            reconcile::run(
                controller_client,
                controller_metrics,
                run_config,
                move || ready_flag.store(true, Ordering::SeqCst),
                controller_stop.cancelled_owned(),
            )
            .await;
            Ok::<(), std::convert::Infallible>(())
        },
    )
    .await
    .map_err(|e| match e {
        LeadError::Leader(e) => MainError::Leader(e),
        LeadError::Controller(never) => match never {},
    });

    ready.store(false, Ordering::SeqCst);
    stop.cancel();
    match admin.wait().await {
        Ok(()) => {}
        Err(e) if result.is_ok() => return Err(e.into()),
        Err(e) => error!(error = %chain(&e), "admin server"),
    }
    info!("csiops-operator stopped");
    result
}
