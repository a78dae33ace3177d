//! What every csiops process shares, the operator and the sidecars alike:
//! leader election ([`leader`]), the shutdown signal ([`shutdown`]), logging
//! ([`logging`]), the admin HTTP server ([`admin`]), the Kubernetes client
//! configuration and this replica's identity ([`kube`]), the count of its
//! API requests ([`requests`]), and the rendering of errors ([`error`]).
//!
//! Kept small on purpose: no CSI, no gRPC, nothing of one role, so that the
//! operator does not build the sidecars to reach leader election.

pub mod admin;
pub mod error;
pub mod kube;
pub mod leader;
pub mod logging;
pub mod requests;
pub mod shutdown;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use error::{chain, truncate, ErrorChain};
