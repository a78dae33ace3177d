//! Compares our .proto files with the published ones, descriptor for
//! descriptor (everything but file name and comments: packages, options,
//! services, methods, messages, fields, numbers, types, enums, custom
//! options).
//!
//! The published files are not part of this repository. The test uses, in
//! this order, `CSIOPS_UPSTREAM_CSI_PROTO` / `CSIOPS_UPSTREAM_PLUGINREGISTRATION_PROTO`
//! (paths to the files) or the Go module cache, and skips with a message when
//! neither has them. To fill the module cache:
//!
//! ```sh
//! go mod download -json github.com/container-storage-interface/spec@v1.12.0
//! go mod download -json k8s.io/kubelet@v0.34.4
//! ```

use std::path::{Path, PathBuf};

use prost_reflect::{DynamicMessage, SerializeOptions};
use serde_json::Value;

const CSI_MODULE: &str = "github.com/container-storage-interface/spec@v1.12.0/csi.proto";
const KUBELET_MODULE: &str = "k8s.io/kubelet@v0.34.4/pkg/apis/pluginregistration/v1/api.proto";

fn module_cache() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("GOMODCACHE") {
        return Some(dir.into());
    }
    let gopath = std::env::var_os("GOPATH")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join("go")))?;
    Some(gopath.join("pkg/mod"))
}

fn upstream(env: &str, module_path: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(path.into());
    }
    let path = module_cache()?.join(module_path);
    path.exists().then_some(path)
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

fn compare(ours: &str, env: &str, module_path: &str) {
    let Some(theirs) = upstream(env, module_path) else {
        eprintln!("SKIPPED: published {module_path} not found (set {env} or `go mod download` it)");
        return;
    };
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
    compare("csi.proto", "CSIOPS_UPSTREAM_CSI_PROTO", CSI_MODULE);
}

#[test]
fn pluginregistration_proto_matches_published_v1() {
    compare(
        "pluginregistration.proto",
        "CSIOPS_UPSTREAM_PLUGINREGISTRATION_PROTO",
        KUBELET_MODULE,
    );
}
