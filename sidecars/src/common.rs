//! What every role shares besides [`csiops_runtime`]: flags, metrics, the
//! instrumented CSI driver connection, the API client's rate limit, the work
//! queue, and the start-up of a role.

pub mod args;
pub mod cache;
pub mod compact;
pub mod compat;
pub mod controller;
pub mod driver;
#[cfg(test)]
pub mod fake_csi;
pub mod goflags;
pub mod kube;
pub mod metrics;
pub mod migration;
pub mod ratelimit;
pub mod role;
pub mod vmodule;
pub mod watch;
pub mod workqueue;
