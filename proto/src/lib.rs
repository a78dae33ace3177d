//! gRPC bindings the csiops sidecars speak, generated at build time from
//! `proto/*.proto` by prost + tonic (compiled with protox, no system `protoc`).
//!
//! - [`csi::v1`]: the Container Storage Interface, spec v1.12 (messages plus
//!   tonic clients and servers for Identity, Controller, Node, GroupController
//!   and SnapshotMetadata).
//! - [`pluginregistration`]: kubelet's plugin registration API v1 (served by
//!   the registrar sidecar, called by kubelet).
//! - [`kubernetes`]: the few Kubernetes API messages (pods, their list and
//!   watch envelopes) the operator reads in protobuf, trimmed to the fields
//!   it uses.
//! - [`client`]: dialling a driver's unix socket, per-call deadlines.
//! - [`redact`]: rendering requests for logs with `csi_secret` fields stripped.
//! - [`authority`]: serving gRPC clients that send a socket path as
//!   `:authority` (kubelet's plugin registration, grpc-go by path).
//!
//! Well-known types (`google.protobuf.*`) map to [`prost_types`].

pub mod authority;
pub mod client;
pub mod redact;

/// CSI v1.12, package `csi.v1`.
pub mod csi {
    /// Generated from `proto/csi.proto`.
    pub mod v1 {
        #![allow(
            missing_docs,
            clippy::all,
            clippy::pedantic,
            rustdoc::invalid_html_tags,
            rustdoc::bare_urls
        )]
        include!(concat!(env!("OUT_DIR"), "/csi.v1.rs"));
    }
}

/// Kubelet plugin registration v1, package `pluginregistration`. Generated
/// from `proto/pluginregistration.proto`.
pub mod pluginregistration {
    #![allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        rustdoc::invalid_html_tags,
        rustdoc::bare_urls
    )]
    include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));
}

/// Kubernetes API messages as kube-apiserver encodes them in protobuf,
/// generated from `proto/kubernetes/*.proto`: nested by package, so
/// `kubernetes::k8s::io::api::core::v1::Pod` is Kubernetes' `core/v1` Pod
/// (with only the fields csiops reads).
pub mod kubernetes {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/kubernetes.rs"));
}

use std::sync::LazyLock;

use prost_reflect::DescriptorPool;

/// Encoded `google.protobuf.FileDescriptorSet` of `csi.proto` and
/// `pluginregistration.proto` plus their imports, custom options included.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/csi_descriptor.bin"));

/// Reflection view of [`FILE_DESCRIPTOR_SET`], decoded once.
pub fn descriptor_pool() -> &'static DescriptorPool {
    static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
        DescriptorPool::decode(FILE_DESCRIPTOR_SET)
            .expect("descriptor set embedded at build time is valid")
    });
    &POOL
}
