//! The one driver of the controllers' watch streams: every event to the
//! controller's handler, every watch error logged (the stream backs off and
//! re-lists by itself). The stream ending is the caller's to judge.

use futures::{Stream, StreamExt};
use kube::runtime::watcher;

/// Drives `stream` to its end, handing each event to `on_event`.
pub async fn drive<K, S>(
    stream: S,
    kind: impl std::fmt::Display,
    mut on_event: impl FnMut(watcher::Event<K>),
) where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => on_event(event),
            Err(e) => {
                tracing::warn!(%kind, error = %csiops_runtime::chain(&e), "watch failed; retrying")
            }
        }
    }
}
