//! What every role shares: flags, logging, metrics, the HTTP server, the
//! shutdown signal and the instrumented CSI driver connection.

pub mod args;
pub mod controller;
pub mod driver;
pub mod http;
pub mod kube;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod shutdown;
pub mod workqueue;
