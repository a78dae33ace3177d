//! Every write to the API server: ownership-checked apply, the supporting
//! objects, the workloads, the monitoring objects, pruning, status, the
//! finalizer and the ordered teardown.

pub(crate) mod adoption;
pub(crate) mod apply;
pub(crate) mod cluster;
pub(crate) mod finalizer;
pub(crate) mod monitoring;
pub(crate) mod namespaced;
pub(crate) mod status;
pub(crate) mod supporting;
pub(crate) mod teardown;
pub(crate) mod workloads;
