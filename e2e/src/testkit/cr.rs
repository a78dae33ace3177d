//! [`DriverCr`]: a CSIDriverDeployment (and its Namespace) for a test,
//! built field by field and written by serde_yaml, so a test names the
//! fields it cares about instead of repeating the whole manifest.

use serde_json::{json, Map, Value};

use crate::{Error, Result};

/// The CSIDriverDeployment API version the tests apply.
pub const API_VERSION: &str = "csiops.dev/v1alpha1";

/// A CSIDriverDeployment under construction. [`DriverCr::yaml`] writes the
/// Namespace and the object, [`DriverCr::object_yaml`] the object alone.
///
/// ```
/// use csiops_e2e::testkit::DriverCr;
/// let yaml = DriverCr::new("csi-x", "x", "x.csi.example.com", "v1.0.0")
///     .image("registry.example.com/x:v1.0.0")
///     .with("csiDriver.attachRequired", false)
///     .yaml();
/// assert!(yaml.contains("kind: CSIDriverDeployment"));
/// ```
#[derive(Clone, Debug)]
pub struct DriverCr {
    namespace: String,
    name: String,
    spec: Map<String, Value>,
}

impl DriverCr {
    /// `name` in `namespace`, for the driver `driver_name` at `version`
    /// (the two fields the schema requires besides `driver.image`).
    pub fn new(namespace: &str, name: &str, driver_name: &str, version: &str) -> DriverCr {
        let mut spec = Map::new();
        spec.insert("driverName".into(), json!(driver_name));
        spec.insert("version".into(), json!(version));
        DriverCr {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            spec,
        }
    }

    /// `spec.driver.image`.
    pub fn image(self, image: &str) -> DriverCr {
        self.with("driver.image", image)
    }

    /// `spec.driver.args`.
    pub fn driver_args<I, S>(self, args: I) -> DriverCr
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args: Vec<String> = args.into_iter().map(Into::into).collect();
        self.with("driver.args", args)
    }

    /// `spec.topology` (`Central` or `NodeLocal`).
    pub fn topology(self, topology: &str) -> DriverCr {
        self.with("topology", topology)
    }

    /// One directory of the host, `host_path`, mounted at `mount_path` in
    /// both the controller and the node pods as the volume `name`: a test
    /// driver's backend, shared as a real storage backend is.
    pub fn shared_host_dir(self, name: &str, host_path: &str, mount_path: &str) -> DriverCr {
        let volumes = json!([{
            "name": name,
            "hostPath": {"path": host_path, "type": "DirectoryOrCreate"},
        }]);
        let mounts = json!([{"name": name, "mountPath": mount_path}]);
        self.with("controller.volumes", volumes.clone())
            .with("controller.volumeMounts", mounts.clone())
            .with("node.volumes", volumes)
            .with("node.volumeMounts", mounts)
    }

    /// Sets the spec field at the dotted `path` (`node.kubeletDir`),
    /// creating the mappings on the way. A mapping replaces a value that is
    /// not one: the last call wins, as in a YAML merge.
    pub fn with(mut self, path: &str, value: impl Into<Value>) -> DriverCr {
        set(&mut self.spec, path, value.into());
        self
    }

    /// Merges a YAML mapping into the spec field at the dotted `path` (the
    /// spec itself when empty): for tests whose subject is a piece of spec
    /// written as a user would (bad input, every field of a section). Keys
    /// of the fragment win; mappings are merged, anything else replaced. An
    /// empty fragment changes nothing.
    pub fn merge_yaml(mut self, path: &str, fragment: &str) -> Result<DriverCr> {
        let value: Value = serde_yaml::from_str(fragment).map_err(|source| Error::CrFragment {
            fragment: fragment.to_owned(),
            source,
        })?;
        match value {
            Value::Null => {}
            Value::Object(fields) => {
                let at = if path.is_empty() {
                    &mut self.spec
                } else {
                    mapping_at(&mut self.spec, path)
                };
                merge(at, fields);
            }
            _ => {
                return Err(Error::CrFragmentNotMapping {
                    fragment: fragment.to_owned(),
                })
            }
        }
        Ok(self)
    }

    /// The CSIDriverDeployment as JSON.
    pub fn object(&self) -> Value {
        json!({
            "apiVersion": API_VERSION,
            "kind": "CSIDriverDeployment",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self.spec,
        })
    }

    /// The CSIDriverDeployment alone as YAML, for a namespace that exists.
    pub fn object_yaml(&self) -> String {
        to_yaml(&self.object())
    }

    /// The Namespace and the CSIDriverDeployment as one YAML stream.
    pub fn yaml(&self) -> String {
        let namespace = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace},
        });
        format!("{}---\n{}", to_yaml(&namespace), self.object_yaml())
    }
}

/// A JSON value as block YAML. Written here rather than by serde_yaml,
/// which leaves `yes` or `on` plain: kubectl reads YAML 1.1, where those
/// are booleans, so a string is quoted unless it is plainly a string in
/// both YAML 1.1 and 1.2 (see [`plain`]).
fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_mapping(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => write_sequence(&mut out, items, 0),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

/// `map`'s entries, one per line at `indent`.
fn write_mapping(out: &mut String, map: &Map<String, Value>, indent: usize) {
    for (key, value) in map {
        out.push_str(&" ".repeat(indent));
        out.push_str(&string(key));
        out.push(':');
        write_value(out, value, indent + 2, indent);
    }
}

/// `items`, one `- ` per item at `indent`; a mapping item starts on the
/// dash's line.
fn write_sequence(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        match item {
            Value::Object(map) if !map.is_empty() => {
                let mut nested = String::new();
                write_mapping(&mut nested, map, indent + 2);
                out.push(' ');
                out.push_str(&nested[indent + 2..]);
            }
            _ => write_value(out, item, indent + 2, indent + 2),
        }
    }
}

/// What follows a `key:` or a `-`: a scalar or empty collection on the same
/// line, else the mapping at `mapping_indent` or the sequence at
/// `sequence_indent` on the next lines.
fn write_value(out: &mut String, value: &Value, mapping_indent: usize, sequence_indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_mapping(out, map, mapping_indent);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_sequence(out, items, sequence_indent);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

/// A scalar or an empty collection, in flow style.
fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => string(s),
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
        // null, booleans and numbers read the same in JSON and YAML.
        other => other.to_string(),
    }
}

/// `s` plain when [`plain`] allows it, else double-quoted (a JSON string
/// is a valid YAML double-quoted scalar).
fn string(s: &str) -> String {
    if plain(s) {
        s.to_owned()
    } else {
        Value::String(s.to_owned()).to_string()
    }
}

/// Whether `s` reads as the same string unquoted in YAML 1.1 and 1.2: it
/// starts with a letter (no number, date, anchor or indicator), holds no
/// space or `#` (no `: ` or comment), does not end in `:`, and is not one
/// of YAML 1.1's booleans or nulls.
fn plain(s: &str) -> bool {
    const WORDS: [&str; 9] = ["y", "n", "yes", "no", "on", "off", "true", "false", "null"];
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "._/:=$()@+-".contains(c))
        && !s.ends_with(':')
        && !WORDS.contains(&s.to_ascii_lowercase().as_str())
}

/// The mapping at the dotted `path` below `map`, created (or put in place
/// of a non-mapping) where missing.
fn mapping_at<'m>(map: &'m mut Map<String, Value>, path: &str) -> &'m mut Map<String, Value> {
    path.split('.').fold(map, |map, key| {
        let slot = map
            .entry(key.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        match slot {
            Value::Object(inner) => inner,
            _ => unreachable!("made a mapping just above"),
        }
    })
}

/// Sets the dotted `path` below `map` to `value`.
fn set(map: &mut Map<String, Value>, path: &str, value: Value) {
    let (parent, key) = match path.rsplit_once('.') {
        Some((parent, key)) => (mapping_at(map, parent), key),
        None => (map, path),
    };
    parent.insert(key.to_owned(), value);
}

/// Merges `from` into `into`: mappings recursively, anything else replaced.
fn merge(into: &mut Map<String, Value>, from: Map<String, Value>) {
    for (key, value) in from {
        match (into.get_mut(&key), value) {
            (Some(Value::Object(inner)), Value::Object(fields)) => merge(inner, fields),
            (_, value) => {
                into.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documents of a YAML stream, parsed.
    fn documents(yaml: &str) -> Vec<Value> {
        serde_yaml::Deserializer::from_str(yaml)
            .map(|doc| serde::Deserialize::deserialize(doc).expect("each document parses"))
            .collect()
    }

    #[test]
    fn writes_the_namespace_and_the_object() {
        let cr = DriverCr::new("csi-x", "x", "x.csi.example.com", "v1.0.0")
            .image("registry.example.com/x:v1.0.0")
            .driver_args(["--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(KUBE_NODE_NAME)"])
            .topology("NodeLocal")
            .with("node.kubeletDir", "/var/lib/kubelet")
            .with("node.maxUnavailable", 1)
            .with("csiDriver.attachRequired", false)
            .with("storageClasses", json!([{"name": "x"}]));
        let docs = documents(&cr.yaml());
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0]["kind"], "Namespace");
        assert_eq!(docs[0]["metadata"]["name"], "csi-x");
        let obj = &docs[1];
        assert_eq!(obj["apiVersion"], API_VERSION);
        assert_eq!(obj["kind"], "CSIDriverDeployment");
        assert_eq!(obj["metadata"], json!({"name": "x", "namespace": "csi-x"}));
        let spec = &obj["spec"];
        assert_eq!(spec["driverName"], "x.csi.example.com");
        assert_eq!(spec["version"], "v1.0.0");
        assert_eq!(spec["topology"], "NodeLocal");
        assert_eq!(spec["driver"]["image"], "registry.example.com/x:v1.0.0");
        assert_eq!(
            spec["driver"]["args"],
            json!(["--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(KUBE_NODE_NAME)"])
        );
        assert_eq!(spec["node"]["kubeletDir"], "/var/lib/kubelet");
        assert_eq!(spec["node"]["maxUnavailable"], 1, "an int stays an int");
        assert_eq!(spec["csiDriver"]["attachRequired"], false);
        assert_eq!(spec["storageClasses"][0]["name"], "x");
        assert_eq!(documents(&cr.object_yaml()), std::slice::from_ref(obj));
    }

    #[test]
    fn a_shared_host_dir_is_mounted_in_both_pods() {
        let cr = DriverCr::new("csi-x", "x", "x.csi.example.com", "v1")
            .with("node.kubeletDir", "/var/lib/kubelet")
            .shared_host_dir("data", "/srv/x data", "/data");
        let spec = &documents(&cr.object_yaml())[0]["spec"];
        for side in ["controller", "node"] {
            assert_eq!(
                spec[side]["volumes"],
                json!([{"name": "data", "hostPath": {"path": "/srv/x data", "type": "DirectoryOrCreate"}}]),
                "{side}"
            );
            assert_eq!(
                spec[side]["volumeMounts"],
                json!([{"name": "data", "mountPath": "/data"}]),
                "{side}"
            );
        }
        assert_eq!(
            spec["node"]["kubeletDir"], "/var/lib/kubelet",
            "other fields kept"
        );
    }

    #[test]
    fn strings_that_look_like_other_types_stay_strings() {
        // kubectl reads YAML 1.1: `yes`, `1.10` or `10%` unquoted would
        // change type on the way.
        let cr = DriverCr::new("n", "x", "d", "1.10")
            .with("node.maxUnavailable", "10%")
            .with("a", "yes")
            .with("b", "0755");
        let yaml = cr.object_yaml();
        for quoted in [
            "version: \"1.10\"\n",
            "a: \"yes\"\n",
            "b: \"0755\"\n",
            "maxUnavailable: \"10%\"\n",
        ] {
            assert!(yaml.contains(quoted), "{quoted:?} in {yaml}");
        }
        let spec = &documents(&yaml)[0]["spec"];
        assert_eq!(spec["version"], "1.10");
        assert_eq!(spec["node"]["maxUnavailable"], "10%");
        assert_eq!(spec["a"], "yes");
        assert_eq!(spec["b"], "0755");
    }

    #[test]
    fn fragments_merge_into_the_spec() {
        let cr = DriverCr::new("n", "x", "d", "v1")
            .with("csiDriver.attachRequired", true)
            .merge_yaml(
                "",
                "  node:\n    kubeletDir: var/lib/kubelet\n  csiDriver:\n    attachRequired: false\n",
            )
            .expect("a mapping")
            .merge_yaml("csiDriver", "    podInfoOnMount: true\n    tokenRequests:\n    - {audience: a, expirationSeconds: 4294967297}\n")
            .expect("a mapping")
            .merge_yaml("", "")
            .expect("empty is nothing");
        let spec = &cr.object()["spec"];
        assert_eq!(spec["node"]["kubeletDir"], "var/lib/kubelet");
        assert_eq!(
            spec["csiDriver"],
            json!({
                "attachRequired": false,
                "podInfoOnMount": true,
                "tokenRequests": [{"audience": "a", "expirationSeconds": 4294967297u64}],
            })
        );
        assert_eq!(spec["driverName"], "d");

        let err = DriverCr::new("n", "x", "d", "v1")
            .merge_yaml("", "- a list")
            .unwrap_err();
        assert!(matches!(err, Error::CrFragmentNotMapping { .. }), "{err}");
        let err = DriverCr::new("n", "x", "d", "v1")
            .merge_yaml("", "a: [unclosed")
            .unwrap_err();
        assert!(matches!(err, Error::CrFragment { .. }), "{err}");
    }

    #[test]
    fn the_yaml_reads_back_as_the_same_value() {
        let value = json!({
            "empty": {}, "none": [], "null": null, "n": -1.5, "b": true,
            "list": [
                {"name": "x", "hostPath": {"path": "/d", "type": "Directory"}, "l": [1, [2, {}]]},
                ["nested", []],
                "--flag=$(VAR)",
            ],
            "text": "two\nlines: # not a comment",
            "": "empty key", "key: with colon": "on", "Y": "~", "ends:": "x:",
        });
        let back: Value = serde_yaml::from_str(&to_yaml(&value)).expect("parses");
        assert_eq!(back, value, "{}", to_yaml(&value));
    }

    #[test]
    fn a_path_through_a_scalar_replaces_it() {
        let cr = DriverCr::new("n", "x", "d", "v1")
            .with("node", "scalar")
            .with("node.kubeletDir", "/k");
        assert_eq!(cr.object()["spec"]["node"], json!({"kubeletDir": "/k"}));
    }
}
