//! `csiops-operator`: the binary. Wires flags, logging, the admin server,
//! leader election and the controller, and shuts down cleanly on SIGTERM.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Parser;
use csiops_operator::admin::{self, AdminState};
use csiops_operator::cli::Args;
use csiops_operator::metrics::Metrics;
use csiops_operator::reconcile::{self, RunConfig};
use csiops_operator::render::RenderConfig;
use csiops_operator::telemetry;
use csiops_sidecars::common::leader::{LeaderConfig, LeaderElector};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::watch;
use tracing::{error, info};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = telemetry::init(args.log_format, &args.log_level) {
        eprintln!("csiops-operator: {e}");
        return ExitCode::FAILURE;
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "csiops-operator stopped");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum MainError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("cannot infer a Kubernetes config: {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("leader election: {0}")]
    Leader(#[from] csiops_sidecars::common::leader::LeaderError),
    #[error("admin server: {0}")]
    Admin(#[from] admin::AdminError),
}

async fn client(args: &Args) -> Result<Client, MainError> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?
        }
        None => Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn run(args: Args) -> Result<(), MainError> {
    let client = client(&args).await?;
    let version = client.apiserver_version().await?;
    info!(
        operator = env!("CARGO_PKG_VERSION"),
        apiserver = %version.git_version,
        "csiops-operator starting"
    );

    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let stop_tx = Arc::new(stop_tx);
    let signal_tx = stop_tx.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        info!("shutdown requested");
        let _ = signal_tx.send(true);
    });

    // Bind first so a taken port fails the start, not the shutdown.
    let listener = tokio::net::TcpListener::bind(args.http_endpoint)
        .await
        .map_err(|source| admin::AdminError::Bind {
            addr: args.http_endpoint,
            source,
        })?;
    let admin_state = AdminState::new(metrics.clone(), ready.clone());
    let admin = tokio::spawn(admin::serve_on(listener, admin_state, stopped()));

    let identity = args.identity();
    let elector = if args.leader_election {
        let cfg = LeaderConfig::new(
            args.leader_election_lease_name.clone(),
            args.leader_election_namespace.clone(),
            identity.clone(),
        );
        let elector = LeaderElector::new(client.clone(), cfg)?;
        // A standby is healthy and ready: it serves its role by waiting.
        ready.store(true, Ordering::SeqCst);
        info!(%identity, "waiting for leadership");
        tokio::select! {
            res = elector.acquire() => res?,
            _ = stopped() => {
                elector.release().await;
                return Ok(());
            }
        }
        ready.store(false, Ordering::SeqCst);
        info!(%identity, "leading");
        metrics.set_leader(true);
        Some(elector)
    } else {
        metrics.set_leader(true);
        None
    };

    let ready_flag = ready.clone();
    let controller = reconcile::run(
        client.clone(),
        metrics.clone(),
        RunConfig {
            render: RenderConfig {
                sidecar_image: args.sidecar_image.clone(),
                operator_version: env!("CARGO_PKG_VERSION").to_string(),
            },
            concurrency: args.concurrency,
            instance: Some(identity),
        },
        move || ready_flag.store(true, Ordering::SeqCst),
        stopped(),
    );

    let result = match &elector {
        Some(elector) => {
            tokio::select! {
                () = controller => Ok(()),
                lost = elector.renew_loop() => {
                    // Losing the lease means another replica may lead now:
                    // stop reconciling at once, and exit non-zero to be restarted.
                    metrics.set_leader(false);
                    match lost {
                        Err(e) => Err(MainError::Leader(e)),
                        Ok(never) => match never {},
                    }
                }
            }
        }
        None => {
            controller.await;
            Ok(())
        }
    };
    if let Some(elector) = &elector {
        elector.release().await;
    }
    ready.store(false, Ordering::SeqCst);
    let _ = stop_tx.send(true);
    match admin.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if result.is_ok() => return Err(e.into()),
        Ok(Err(e)) => error!(error = %e, "admin server"),
        Err(e) => error!(error = %e, "admin server task"),
    }
    info!("csiops-operator stopped");
    result
}
