//! Compares our .proto files with the published ones: CSI and plugin
//! registration descriptor for descriptor (everything but file name and
//! comments: packages, options, services, methods, messages, fields,
//! numbers, types, enums, custom options); the trimmed Kubernetes messages
//! field for field, as a subset of Kubernetes' own.
//!
//! The published files are not part of this repository: `make test` (and
//! `make unit`) fetch them through the Go module proxy with
//! `e2e/cluster-bins/upstream-protos.sh` — the CSI spec at `CSI_SPEC_VERSION`
//! and k8s.io/kubelet, api and apimachinery at the staging version of
//! `K8S_VERSION`, all pinned in `e2e/versions.env` — and name the
//! directory in `CSIOPS_UPSTREAM_PROTOS`.
//! Without it these tests fail: a comparison that silently does not run
//! proves nothing. By hand:
//!
//! ```sh
//! CSIOPS_UPSTREAM_PROTOS="$(e2e/cluster-bins/upstream-protos.sh)" cargo test -p csiops-proto --test upstream
//! ```

use std::path::{Path, PathBuf};

use prost_reflect::{DynamicMessage, SerializeOptions};
use serde_json::Value;

const ENV: &str = "CSIOPS_UPSTREAM_PROTOS";

/// The published `file` from the directory in [`ENV`]; panics saying how to
/// get it when the variable or the file is missing.
fn upstream(file: &str) -> PathBuf {
    let Some(dir) = std::env::var_os(ENV).filter(|d| !d.is_empty()) else {
        panic!(
            "{ENV} is not set: it must name the directory of the published protos. \
             Run `make test`, or set {ENV}=\"$(e2e/cluster-bins/upstream-protos.sh)\""
        );
    };
    let path = Path::new(&dir).join(file);
    assert!(
        path.is_file(),
        "{ENV}={}: no {file} there; run e2e/cluster-bins/upstream-protos.sh for the directory",
        Path::new(&dir).display()
    );
    path
}

/// Compiles `file` alone and renders its `FileDescriptorProto` (no source
/// info, name cleared) as JSON, custom options included.
fn descriptor_json(file: &Path) -> Value {
    let dir = file.parent().unwrap();
    let mut compiler = protox::Compiler::new([dir]).unwrap();
    compiler.include_source_info(false);
    compiler
        .open_file(file.file_name().unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let bytes = compiler.encode_file_descriptor_set();
    // Decode with our pool: it knows descriptor.proto and the csi.v1 options.
    let set_type = csiops_proto::descriptor_pool()
        .get_message_by_name("google.protobuf.FileDescriptorSet")
        .unwrap();
    let set = DynamicMessage::decode(set_type, bytes.as_slice()).unwrap();
    let mut value = set
        .serialize_with_options(
            serde_json::value::Serializer,
            &SerializeOptions::new().use_proto_field_name(true),
        )
        .unwrap();
    let mut file = value["file"][0].take();
    file.as_object_mut().unwrap().remove("name");
    file
}

/// First differing path between two JSON values.
fn first_difference(path: &str, ours: &Value, theirs: &Value) -> Option<String> {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys()) {
                let (x, y) = (a.get(key), b.get(key));
                match (x, y) {
                    (Some(x), Some(y)) => {
                        if let Some(d) = first_difference(&format!("{path}.{key}"), x, y) {
                            return Some(d);
                        }
                    }
                    _ => return Some(format!("{path}.{key}: ours {x:?}, upstream {y:?}")),
                }
            }
            None
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                // Name the element if it has one.
                let label = x["name"].as_str().map(|n| format!("[{i} {n}]"));
                let p = format!("{path}{}", label.unwrap_or(format!("[{i}]")));
                if let Some(d) = first_difference(&p, x, y) {
                    return Some(d);
                }
            }
            (a.len() != b.len())
                .then(|| format!("{path}: ours has {} entries, upstream {}", a.len(), b.len()))
        }
        _ => (ours != theirs).then(|| format!("{path}: ours {ours}, upstream {theirs}")),
    }
}

/// Compares our `ours` with the published `theirs` (a file name in [`ENV`]).
fn compare(ours: &str, theirs: &str) {
    let theirs = upstream(theirs);
    let ours = Path::new(env!("CARGO_MANIFEST_DIR")).join(ours);
    let (a, b) = (descriptor_json(&ours), descriptor_json(&theirs));
    if let Some(diff) = first_difference("", &a, &b) {
        panic!(
            "{} differs from {}:\n{diff}",
            ours.display(),
            theirs.display()
        );
    }
    assert_eq!(a, b);
    eprintln!(
        "{} matches {} ({} messages, {} services)",
        ours.display(),
        theirs.display(),
        a["message_type"].as_array().map_or(0, Vec::len),
        a["service"].as_array().map_or(0, Vec::len),
    );
}

#[test]
fn csi_proto_matches_published_v1_12() {
    compare("csi.proto", "csi.proto");
}

#[test]
fn pluginregistration_proto_matches_published_v1() {
    compare("pluginregistration.proto", "pluginregistration.proto");
}

/// The descriptors of `file` and everything it imports, compiled from the
/// include root `root`.
fn pool(root: &Path, file: &str) -> prost_reflect::DescriptorPool {
    let mut compiler = protox::Compiler::new([root]).unwrap();
    compiler.include_imports(true);
    compiler.include_source_info(false);
    compiler
        .open_file(file)
        .unwrap_or_else(|e| panic!("{}/{file}: {e}", root.display()));
    prost_reflect::DescriptorPool::decode(compiler.encode_file_descriptor_set().as_slice()).unwrap()
}

/// How a field reads on the wire and in the generated code: its number,
/// name, cardinality and type (a message or map entry by full name).
fn field_shape(f: &prost_reflect::FieldDescriptor) -> String {
    use prost_reflect::Kind;
    let kind = match f.kind() {
        Kind::Message(m) => m.full_name().to_string(),
        Kind::Enum(e) => e.full_name().to_string(),
        other => format!("{other:?}"),
    };
    format!(
        "{} = {}: {:?} {kind}",
        f.name(),
        f.number(),
        f.cardinality()
    )
}

/// `proto/kubernetes/*.proto` trims Kubernetes' `generated.proto` files:
/// every message of ours (map entries included) must be one of the
/// published messages, under the same full name, and every field of it the
/// published field of that name, with its number, cardinality and type.
#[test]
fn kubernetes_protos_are_trimmed_published_ones() {
    let root = upstream("k8s.io/api/core/v1/generated.proto")
        .ancestors()
        .nth(5)
        .expect("the include root above k8s.io/")
        .to_path_buf();
    let theirs = pool(&root, "k8s.io/api/core/v1/generated.proto");
    let ours = pool(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        "kubernetes/core.proto",
    );
    let mut checked = (0, 0);
    for message in ours.all_messages() {
        let name = message.full_name();
        let published = theirs
            .get_message_by_name(name)
            .unwrap_or_else(|| panic!("{name}: no such published message"));
        for field in message.fields() {
            let upstream = published
                .get_field_by_name(field.name())
                .unwrap_or_else(|| panic!("{name}.{}: no such published field", field.name()));
            assert_eq!(
                field_shape(&field),
                field_shape(&upstream),
                "{name}: ours differs from the published field"
            );
            checked.1 += 1;
        }
        checked.0 += 1;
    }
    // What `operator/src/pods/wire.rs` decodes must be among what was checked.
    for decoded in [
        "k8s.io.apimachinery.pkg.runtime.Unknown",
        "k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent",
        "k8s.io.apimachinery.pkg.apis.meta.v1.Status",
        "k8s.io.api.core.v1.Pod",
        "k8s.io.api.core.v1.PodList",
    ] {
        assert!(
            ours.get_message_by_name(decoded).is_some(),
            "proto/kubernetes has no {decoded}"
        );
    }
    eprintln!(
        "proto/kubernetes: {} messages, {} fields, each the published one",
        checked.0, checked.1
    );
}
