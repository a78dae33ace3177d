//! `csiops-sidecar`: the Rust sidecars of csiops, one binary with a
//! subcommand per role. Flags keep the upstream kubernetes-csi names so an
//! existing driver manifest can swap the image.

pub mod attacher;
pub mod common;
pub mod liveness;
pub mod provisioner;
pub mod registrar;

use std::net::SocketAddr;

/// Why a sidecar stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error("invalid flag: {0}")]
    Flag(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
    #[error("task failed: {0}")]
    Task(String),
    #[error(transparent)]
    Registrar(#[from] registrar::RegistrarError),
    #[error(transparent)]
    Attacher(#[from] attacher::AttacherError),
    #[error(transparent)]
    Provisioner(#[from] provisioner::ProvisionerError),
}
