//! Polling until a condition holds. Tests wait on observed state, never on
//! fixed sleeps.

use std::future::Future;
use std::time::Duration;

use thiserror::Error;
use tokio::time::Instant;

/// The condition did not hold within the deadline.
#[derive(Debug, Error)]
#[error("condition not met within {0:?}")]
pub struct WaitTimeout(pub Duration);

/// Calls `check` every `poll` until it returns `Some`, for at most `deadline`.
///
/// The check runs at least once, even with a zero deadline, and once more at
/// the deadline so a slow poll interval never hides a last-moment success.
pub async fn wait_for<T, F, Fut>(
    deadline: Duration,
    poll: Duration,
    mut check: F,
) -> Result<T, WaitTimeout>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= end {
            return Err(WaitTimeout(deadline));
        }
        tokio::time::sleep(poll.min(end - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn returns_the_first_some() {
        let n = AtomicU32::new(0);
        let v = wait_for(Duration::from_secs(5), Duration::from_millis(1), || async {
            let i = n.fetch_add(1, Ordering::SeqCst);
            (i == 3).then_some(i)
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
    }

    #[tokio::test]
    async fn times_out() {
        let r: Result<(), _> = wait_for(
            Duration::from_millis(20),
            Duration::from_millis(5),
            || async { None },
        )
        .await;
        assert_eq!(r.unwrap_err().0, Duration::from_millis(20));
    }
}
