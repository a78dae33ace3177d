//! Compiles the .proto files with protox (pure Rust, no system `protoc`) and
//! generates prost messages plus tonic clients and servers from the result.
//!
//! Outputs in `OUT_DIR`:
//! - `csi.v1.rs`, `pluginregistration.rs`: generated code;
//! - `kubernetes.rs`: the Kubernetes API messages of `kubernetes/*.proto`
//!   (messages only, no service), as nested modules by package;
//! - `csi_descriptor.bin`: encoded `FileDescriptorSet` of both files and their
//!   imports, custom options (`csi_secret`, `alpha_*`) included, for runtime
//!   reflection (log redaction).

use std::{env, error::Error, fs, path::PathBuf};

const PROTOS: &[&str] = &["csi.proto", "pluginregistration.proto"];

/// The Kubernetes messages the operator's protobuf pod watch reads.
const KUBERNETES: &[&str] = &[
    "kubernetes/runtime.proto",
    "kubernetes/meta.proto",
    "kubernetes/core.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    for proto in PROTOS.iter().chain(KUBERNETES) {
        println!("cargo:rerun-if-changed={proto}");
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let mut compiler = protox::Compiler::new(["."])?;
    compiler.include_imports(true);
    compiler.open_files(PROTOS)?;

    // Runtime descriptor: without source info (comments are not needed at
    // runtime), encoded by protox so extension options survive (prost-types
    // would drop them as unknown fields).
    compiler.include_source_info(false);
    fs::write(
        out_dir.join("csi_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    // Code generation: with source info so our comments become rustdoc.
    compiler.include_source_info(true);
    let fds = compiler.file_descriptor_set();

    let mut config = prost_build::Config::new();
    // `impl prost::Name` for every message, used by `redact` to find a
    // message's descriptor.
    config.enable_type_names();
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds_with_config(fds, config)?;

    kubernetes()
}

/// The Kubernetes messages: plain prost messages, `bytes` fields as
/// [`bytes::Bytes`] so an object's raw encoding is sliced, not copied, and
/// one `kubernetes.rs` that nests the three packages (their types refer to
/// each other by relative module paths).
fn kubernetes() -> Result<(), Box<dyn Error>> {
    let mut compiler = protox::Compiler::new(["."])?;
    compiler.include_source_info(true);
    compiler.open_files(KUBERNETES)?;
    let mut config = prost_build::Config::new();
    config.bytes(["."]).include_file("kubernetes.rs");
    config.compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
