//! `csiops-sidecar`: the Rust sidecars of csiops, one binary with a
//! subcommand per role. Flags keep the upstream kubernetes-csi names so an
//! existing driver manifest can swap the image.

pub mod attacher;
pub mod cli;
pub mod common;
pub mod entry;
pub mod liveness;
pub mod provisioner;
pub mod registrar;

/// Why a sidecar stopped with an error. Logged once, with its chain, by
/// `main`.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    #[error(transparent)]
    Flag(#[from] common::args::FlagError),
    #[error(transparent)]
    Admin(#[from] csiops_runtime::admin::AdminError),
    #[error(transparent)]
    Kube(#[from] common::kube::KubeError),
    #[error(transparent)]
    Leader(#[from] csiops_runtime::leader::LeaderError),
    #[error(transparent)]
    Registrar(#[from] registrar::RegistrarError),
    #[error(transparent)]
    Attacher(#[from] attacher::AttacherError),
    #[error(transparent)]
    Provisioner(#[from] provisioner::ProvisionerError),
    #[error(transparent)]
    DriverName(#[from] common::driver::NameMismatch),
}

impl From<std::convert::Infallible> for SidecarError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}
