//! Rendering CSI messages for logs without their secrets.
//!
//! Fields marked `[(csi.v1.csi_secret) = true]` in `csi.proto` (field option
//! 1059) are replaced by `"***stripped***"`, at any depth: in the message
//! itself, in nested messages, in repeated fields and in map values. Other
//! fields are kept. The output is compact JSON with proto field names and
//! default values omitted, e.g.
//!
//! ```text
//! {"name":"pvc-1","parameters":{"type":"ssd"},"secrets":"***stripped***"}
//! ```
//!
//! ```
//! use csiops_proto::{csi::v1::CreateVolumeRequest, redact};
//!
//! let request = CreateVolumeRequest {
//!     name: "pvc-1".into(),
//!     secrets: [("password".to_owned(), "hunter2".to_owned())].into(),
//!     ..Default::default()
//! };
//! tracing::info!(request = %redact::redacted(&request), "CreateVolume");
//! assert!(!redact::redacted_debug(&request).contains("hunter2"));
//! ```

use std::fmt;

use prost_reflect::{
    DescriptorPool, DynamicMessage, ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor,
    SerializeOptions,
};
use serde_json::Value;

/// What a secret field's value is replaced with.
pub const STRIPPED: &str = "***stripped***";

/// Full name of the field option that marks secrets.
pub const CSI_SECRET_OPTION: &str = "csi.v1.csi_secret";

/// Renders `msg` for logging with every `csi_secret` field replaced by
/// [`STRIPPED`].
///
/// Works for every message of this crate. A message type unknown to the
/// embedded descriptor set (not from this crate) renders as
/// `<pkg.Type: not in descriptor set>` rather than risk printing secrets.
pub fn redacted_debug<M: prost::Message + prost::Name>(msg: &M) -> String {
    let name = M::full_name();
    render(crate::descriptor_pool(), &name, &msg.encode_to_vec())
        .unwrap_or_else(|| format!("<{name}: not in descriptor set>"))
}

/// Lazy form of [`redacted_debug`] for log macros: `%redacted(&request)`
/// renders only if the event is actually recorded.
pub fn redacted<M: prost::Message + prost::Name>(msg: &M) -> Redacted<'_, M> {
    Redacted(msg)
}

/// See [`redacted`]. `Display` and `Debug` both print [`redacted_debug`].
#[derive(Clone, Copy)]
pub struct Redacted<'a, M>(&'a M);

impl<M: prost::Message + prost::Name> fmt::Display for Redacted<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redacted_debug(self.0))
    }
}

impl<M: prost::Message + prost::Name> fmt::Debug for Redacted<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Renders the encoded message `full_name` from `pool`, or `None` if the
/// pool does not know the type or the bytes do not decode as it.
pub(crate) fn render(pool: &DescriptorPool, full_name: &str, encoded: &[u8]) -> Option<String> {
    let desc = pool.get_message_by_name(full_name)?;
    let msg = DynamicMessage::decode(desc.clone(), encoded).ok()?;
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false);
    let mut value = msg
        .serialize_with_options(serde_json::value::Serializer, &options)
        .ok()?;
    if let Some(secret) = pool.get_extension_by_name(CSI_SECRET_OPTION) {
        strip(&desc, &mut value, &secret);
    }
    Some(value.to_string())
}

fn is_secret(field: &FieldDescriptor, secret: &ExtensionDescriptor) -> bool {
    let options = field.options();
    options.has_extension(secret) && options.get_extension(secret).as_bool() == Some(true)
}

/// Replaces the secret fields of the JSON rendering `value` of a `desc`
/// message, recursing into message-typed fields.
fn strip(desc: &MessageDescriptor, value: &mut Value, secret: &ExtensionDescriptor) {
    let Value::Object(object) = value else {
        // Well-known types render as scalars; they hold no secrets.
        return;
    };
    for field in desc.fields() {
        let Some(field_value) = object.get_mut(field.name()) else {
            continue;
        };
        if is_secret(&field, secret) {
            *field_value = Value::String(STRIPPED.to_owned());
            continue;
        }
        let Kind::Message(field_type) = field.kind() else {
            continue;
        };
        if field.is_map() {
            if let Kind::Message(value_type) = field_type.map_entry_value_field().kind() {
                if let Value::Object(entries) = field_value {
                    for entry in entries.values_mut() {
                        strip(&value_type, entry, secret);
                    }
                }
            }
        } else if field.is_list() {
            if let Value::Array(items) = field_value {
                for item in items {
                    strip(&field_type, item, secret);
                }
            }
        } else {
            strip(&field_type, field_value, secret);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::v1::{
        volume_capability, ControllerPublishVolumeRequest, CreateVolumeRequest,
        NodeGetInfoResponse, NodeStageVolumeRequest, Topology, VolumeCapability,
    };
    use crate::pluginregistration::PluginInfo;

    fn map(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn json(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    #[test]
    fn create_volume_secrets_are_stripped_parameters_kept() {
        let request = CreateVolumeRequest {
            name: "pvc-1234".into(),
            parameters: map(&[("type", "ssd"), ("replicas", "3")]),
            secrets: map(&[("password", "hunter2")]),
            volume_capabilities: vec![VolumeCapability {
                access_type: Some(volume_capability::AccessType::Mount(
                    volume_capability::MountVolume {
                        fs_type: "ext4".into(),
                        ..Default::default()
                    },
                )),
                access_mode: Some(volume_capability::AccessMode {
                    mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
            }],
            ..Default::default()
        };
        let text = redacted_debug(&request);
        assert!(!text.contains("hunter2"), "{text}");
        assert!(
            !text.contains("password"),
            "secret keys are stripped too: {text}"
        );
        let value = json(&text);
        assert_eq!(value["secrets"], STRIPPED);
        assert_eq!(value["name"], "pvc-1234");
        assert_eq!(value["parameters"]["type"], "ssd");
        assert_eq!(value["parameters"]["replicas"], "3");
        assert_eq!(
            value["volume_capabilities"][0]["mount"]["fs_type"], "ext4",
            "{text}"
        );
        assert_eq!(
            value["volume_capabilities"][0]["access_mode"]["mode"],
            "SINGLE_NODE_WRITER"
        );
        // The lazy wrapper prints the same.
        assert_eq!(redacted(&request).to_string(), text);
        assert_eq!(format!("{:?}", redacted(&request)), text);
    }

    #[test]
    fn request_without_secrets_renders_normally() {
        let request = CreateVolumeRequest {
            name: "pvc-1".into(),
            parameters: map(&[("type", "ssd")]),
            ..Default::default()
        };
        let text = redacted_debug(&request);
        assert!(!text.contains(STRIPPED), "{text}");
        assert_eq!(
            json(&text),
            json(r#"{"name":"pvc-1","parameters":{"type":"ssd"}}"#)
        );

        let response = NodeGetInfoResponse {
            node_id: "node-1".into(),
            max_volumes_per_node: 16,
            accessible_topology: Some(Topology {
                segments: map(&[("topology.example.com/zone", "z1")]),
            }),
        };
        assert_eq!(
            json(&redacted_debug(&response)),
            json(
                r#"{"node_id":"node-1","max_volumes_per_node":16,
                    "accessible_topology":{"segments":{"topology.example.com/zone":"z1"}}}"#
            )
        );
    }

    #[test]
    fn publish_and_stage_secrets_are_stripped() {
        let publish = ControllerPublishVolumeRequest {
            volume_id: "vol-1".into(),
            node_id: "node-1".into(),
            secrets: map(&[("token", "s3cr3t")]),
            volume_context: map(&[("pool", "fast")]),
            ..Default::default()
        };
        let text = redacted_debug(&publish);
        assert!(!text.contains("s3cr3t"), "{text}");
        let value = json(&text);
        assert_eq!(value["secrets"], STRIPPED);
        assert_eq!(value["volume_context"]["pool"], "fast");
        assert_eq!(value["node_id"], "node-1");

        let stage = NodeStageVolumeRequest {
            volume_id: "vol-1".into(),
            staging_target_path: "/var/lib/kubelet/staging".into(),
            secrets: map(&[("key", "s3cr3t")]),
            ..Default::default()
        };
        let text = redacted_debug(&stage);
        assert!(!text.contains("s3cr3t"), "{text}");
        assert_eq!(json(&text)["secrets"], STRIPPED);
    }

    #[test]
    fn messages_of_the_registration_api_render_too() {
        let info = PluginInfo {
            r#type: "CSIPlugin".into(),
            name: "csi.example.com".into(),
            endpoint: "/csi/csi.sock".into(),
            supported_versions: vec!["1.0.0".into()],
        };
        assert_eq!(
            json(&redacted_debug(&info)),
            json(
                r#"{"type":"CSIPlugin","name":"csi.example.com","endpoint":"/csi/csi.sock",
                    "supported_versions":["1.0.0"]}"#
            )
        );
    }

    #[test]
    fn embedded_descriptor_keeps_the_secret_option() {
        let pool = crate::descriptor_pool();
        let secret = pool.get_extension_by_name(CSI_SECRET_OPTION).unwrap();
        assert_eq!(secret.number(), 1059);
        let create = pool
            .get_message_by_name("csi.v1.CreateVolumeRequest")
            .unwrap();
        assert!(is_secret(
            &create.get_field_by_name("secrets").unwrap(),
            &secret
        ));
        assert!(!is_secret(
            &create.get_field_by_name("parameters").unwrap(),
            &secret
        ));
    }

    /// Secrets below the top level: a test-only proto that reuses the
    /// option from csi.proto in nested, repeated and map-valued messages.
    #[test]
    fn nested_secrets_are_stripped_at_any_depth() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let pool = protox::Compiler::new([dir.join("testdata"), dir.to_path_buf()])
            .unwrap()
            .open_file("redact_test.proto")
            .unwrap()
            .descriptor_pool();
        let outer = pool.get_message_by_name("csiops.test.Outer").unwrap();
        let input = r#"{
            "name": "outer",
            "single": {"user": "alice", "password": "pw-single"},
            "list": [{"user": "bob", "password": "pw-list"}, {"user": "carol"}],
            "byKey": {"k": {"user": "dave", "password": "pw-map"}},
            "deeper": {"inner": {"user": "erin", "password": "pw-deep"}},
            "create": {"name": "pvc-9", "secrets": {"password": "pw-create"}},
            "token": "pw-top"
        }"#;
        let mut de = serde_json::Deserializer::from_str(input);
        let msg = DynamicMessage::deserialize(outer, &mut de).unwrap();
        let text = render(
            &pool,
            "csiops.test.Outer",
            &prost::Message::encode_to_vec(&msg),
        )
        .unwrap();
        assert!(!text.contains("pw-"), "{text}");
        assert_eq!(
            json(&text),
            json(
                r#"{
                "name": "outer",
                "single": {"user": "alice", "password": "***stripped***"},
                "list": [{"user": "bob", "password": "***stripped***"}, {"user": "carol"}],
                "by_key": {"k": {"user": "dave", "password": "***stripped***"}},
                "deeper": {"inner": {"user": "erin", "password": "***stripped***"}},
                "create": {"name": "pvc-9", "secrets": "***stripped***"},
                "token": "***stripped***"
            }"#
            )
        );
    }

    #[test]
    fn unknown_type_or_garbage_gives_none() {
        let pool = crate::descriptor_pool();
        assert_eq!(render(pool, "csi.v1.NoSuchMessage", &[]), None);
        assert_eq!(
            render(pool, "csi.v1.CreateVolumeRequest", &[0xff, 0xff, 0xff]),
            None
        );
    }
}
