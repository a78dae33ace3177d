//! Kubernetes' own storage e2e suite ("External Storage",
//! `test/e2e/storage/external`) against drivers csiops deploys, on two real
//! nodes, run the way kubernetes-csi's prow jobs run it:
//! - [`Suite`]: the built suite (`e2e/cluster-bins/e2e-suite.sh`);
//! - [`drivers`]: the driver definitions and the CSIDriverDeployments of
//!   `e2e/conformance/`;
//! - [`definition`]: checks that e2e.test read every key of a definition;
//! - [`Bed`]: the cluster, the operator and the drivers;
//! - [`run`]: the ginkgo runs and their reports, counted per driver.
//!
//! `make conformance` (`src/bin/csiops-conformance.rs`) runs it all;
//! `tests/conformance.rs` runs a bounded subset in `make test`.

pub mod bed;
pub mod definition;
pub mod drivers;
pub mod run;
pub mod suite;

pub use bed::{Bed, Deploy};
pub use drivers::DriverSetup;
pub use run::{RunPlan, RunReport};
pub use suite::Suite;
