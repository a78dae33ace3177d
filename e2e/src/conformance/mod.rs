//! Kubernetes' own storage e2e suite ("External Storage",
//! `test/e2e/storage/external`) against drivers csiops deploys, on real
//! nodes: the built suite ([`Suite`]).

pub mod suite;

pub use suite::Suite;
