//! csiops operator: reconciles `CSIDriverDeployment` objects into running CSI drivers.
pub mod adoption;
pub mod cli;
pub mod fleet;
pub mod health;
pub mod helm;
pub mod install;
pub mod metrics;
pub mod pods;
pub mod policy;
pub mod reconcile;
pub mod render;
pub mod report;
pub mod rollout;
