//! SIGTERM/SIGINT as a [`CancellationToken`] every task can wait on, and a
//! [`TaskTracker`] for the background tasks a process waits for on the way
//! out.

pub use tokio_util::sync::CancellationToken;
pub use tokio_util::task::TaskTracker;

/// A token cancelled by SIGTERM or SIGINT (and by whoever else cancels it:
/// a role that stops on its own, a test).
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let fire = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = wait_for_signal() => tracing::info!("shutdown requested"),
            () = fire.cancelled() => {}
        }
        fire.cancel();
    });
    token
}

async fn wait_for_signal() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cancel_reaches_every_waiter() {
        let token = on_signals();
        let waiter = tokio::spawn(token.clone().cancelled_owned());
        assert!(!token.is_cancelled());
        token.cancel();
        waiter.await.expect("waiter ends");
        assert!(token.is_cancelled());
    }
}
