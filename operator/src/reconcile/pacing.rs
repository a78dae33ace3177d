//! How often an object is reconciled: the per-object pacer, the pod-trigger
//! throttle, which cached copy of an object is current, and the backoff of
//! failing writes.

pub(crate) mod fresh;
pub(crate) mod pace;
pub(crate) mod retry;
pub(crate) mod throttle;
