//! SIGTERM/SIGINT as a future every task can wait on.

use tokio::sync::watch;

/// A shutdown signal that many tasks can await; fired once.
#[derive(Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// The sending side, for tests and for roles that stop on their own.
#[derive(Clone)]
pub struct Trigger {
    tx: std::sync::Arc<watch::Sender<bool>>,
}

impl Trigger {
    pub fn fire(&self) {
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    /// A signal with its trigger, not tied to OS signals.
    pub fn new() -> (Shutdown, Trigger) {
        let (tx, rx) = watch::channel(false);
        (
            Shutdown { rx },
            Trigger {
                tx: std::sync::Arc::new(tx),
            },
        )
    }

    /// A signal fired by SIGTERM or SIGINT.
    pub fn on_signals() -> (Shutdown, Trigger) {
        let (shutdown, trigger) = Self::new();
        let t = trigger.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested");
            t.fire();
        });
        (shutdown, trigger)
    }

    /// Resolves once fired.
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(|fired| *fired).await;
    }

    pub fn is_fired(&self) -> bool {
        *self.rx.borrow()
    }
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
    async fn fires_once_for_every_waiter() {
        let (s, t) = Shutdown::new();
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.wait().await });
        assert!(!s.is_fired());
        t.fire();
        waiter.await.expect("waiter ends");
        assert!(s.is_fired());
        s.wait().await;
    }
}
