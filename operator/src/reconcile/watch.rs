//! What the operator knows of the cluster, kept by watches: pods, the
//! workloads, nodes, CSINodes, mount failures and the objects applied, and
//! when every cache has its first full list.

pub(crate) mod admission;
pub(crate) mod caches;
pub(crate) mod csinodes;
pub(crate) mod nodes;
pub(crate) mod owned;
pub(crate) mod paging;
pub(crate) mod pod_cache;
pub(crate) mod pod_events;
pub(crate) mod pod_watch;
pub(crate) mod sync;
