//! Benchmark (not a test): the sidecars at cluster scale, ours and
//! upstream's side by side (issue 39). See `csiops_e2e::bench::scale` and
//! `e2e/bench/README.md`.
//!
//! ```text
//! csiops-bench-scale [--volumes N] [--burst-claims M] [--csinodes C]
//!     [--upstream-provisioner PATH] [--upstream-attacher PATH] [--upstream-registrar PATH]
//!     [--phases steady,failover,registrar,burst]
//! ```

use clap::Parser;
use csiops_e2e::bench::scale::{self, Args};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    scale::run(Args::parse()).await?;
    Ok(())
}
