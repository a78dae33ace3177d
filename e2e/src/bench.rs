//! Pieces of the benchmarks that more than one bench uses, and the
//! cluster-scale bench (`csiops-bench-scale`, [`scale`]).
//!
//! - [`objects`]: claims, PVs and VolumeAttachments laid out directly
//!   through the API as if provisioned and attached long ago, thousands at
//!   a time, and the driver state that goes with them;
//! - [`sample`]: a process's memory and CPU over time, and the API
//!   server's latency as another client sees it;
//! - [`sidecar`]: a controller sidecar (ours or upstream's) as a process,
//!   with its flags and, for leader election, a host name of its own.

pub mod objects;
pub mod sample;
pub mod scale;
pub mod sidecar;
