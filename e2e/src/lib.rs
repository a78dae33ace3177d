//! End-to-end test bed for csiops: a real Kubernetes control plane on
//! 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler) with kwok standing in for kubelets, all as local child
//! processes of the test, plus the operator binary under test; optionally
//! one real node (containerd, kubelet, kube-proxy) running our images.
//!
//! ```no_run
//! # async fn demo() -> csiops_e2e::Result<()> {
//! use csiops_e2e::{Cluster, ClusterOptions};
//! let cluster = Cluster::start(ClusterOptions::kwok(3)).await?;
//! let client = cluster.client()?;
//! let out = cluster.kubectl(["get", "nodes"]).await?;
//! cluster.stop().await?;
//! # let _ = (client, out); Ok(()) }
//! ```
//!
//! Binaries come from `e2e/cluster-bins/build.sh` (or `CSIOPS_BIN_DIR`).

pub mod apimetrics;
pub mod attach;
pub mod bench;
pub mod bins;
pub mod certs;
pub mod cluster;
mod components;
pub mod conformance;
pub mod error;
pub mod fleet;
pub mod kwok;
pub mod node_local;
pub mod node_side;
pub mod operator;
pub mod ports;
pub mod process;
pub mod provisioning;
pub mod realnode;
pub mod rollout_clock;
pub mod testdriver;
pub mod testkit;
pub mod testrun;
pub mod timeline;
pub mod wait;
pub mod walkthrough;
mod workdir;
pub mod workload;

pub use bins::{bin_dir, k8s_version, operator_bin, sidecar_bin, versions};
pub use cluster::{Cluster, ClusterOptions, START_TIMEOUT};
pub use error::{Error, Result};
pub use operator::OperatorProcess;
pub use ports::free_port;
pub use process::{pid_alive, sigterm_and_wait};
pub use wait::{wait_for, WaitTimeout};
