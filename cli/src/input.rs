//! Reading Kubernetes objects: multi-document YAML from files, from a
//! directory (recursively, `*.yaml` and `*.yml`, in path order) or from
//! stdin (`-`), so `helm template … | kubectl csiops import -f -` works.
//! `kind: List` documents (`kubectl get -o yaml`) are flattened.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// Why the input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{origin}: not valid YAML: {source}")]
    Yaml {
        origin: String,
        source: serde_yaml::Error,
    },
    #[error(
        "{origin}: a Kubernetes object must be a mapping with apiVersion, kind and metadata.name"
    )]
    NotAnObject { origin: String },
    #[error("{origin}: {what} is missing")]
    Missing { origin: String, what: &'static str },
    #[error("{path}: no *.yaml or *.yml file in this directory")]
    EmptyDir { path: String },
}

/// Where an object came from: file (or `stdin`) and document number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub source: String,
    /// 1-based document number in its source.
    pub doc: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (document {})", self.source, self.doc)
    }
}

/// One Kubernetes object of the input, kept as JSON so nothing of it is
/// lost before the mapping has accounted for it.
#[derive(Clone, Debug)]
pub struct Object {
    pub origin: Origin,
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
    pub value: Value,
}

impl Object {
    /// `Kind/name`, how the report names the object.
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// Builds an object from a JSON value, checking the fields every object has.
    pub fn from_value(value: Value, origin: Origin) -> Result<Object, InputError> {
        let text = |v: &Value, what: &'static str| -> Result<String, InputError> {
            v.as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .ok_or_else(|| InputError::Missing {
                    origin: origin.to_string(),
                    what,
                })
        };
        if !value.is_object() {
            return Err(InputError::NotAnObject {
                origin: origin.to_string(),
            });
        }
        let api_version = text(&value["apiVersion"], "apiVersion")?;
        let kind = text(&value["kind"], "kind")?;
        let name = text(&value["metadata"]["name"], "metadata.name")?;
        let namespace = value["metadata"]["namespace"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        Ok(Object {
            origin,
            api_version,
            kind,
            name,
            namespace,
            value,
        })
    }
}

/// Parses one YAML stream. Empty documents (a leading `---`, Helm's
/// templates that render to nothing) are skipped.
pub fn parse_stream(text: &str, source: &str) -> Result<Vec<Object>, InputError> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let origin = Origin {
            source: source.to_string(),
            doc: i + 1,
        };
        let mut value = Value::deserialize(doc).map_err(|source| InputError::Yaml {
            origin: origin.to_string(),
            source,
        })?;
        octal_modes(&mut value);
        push_value(value, &origin, &mut out)?;
    }
    Ok(out)
}

/// File modes written as YAML 1.1 octal integers (`defaultMode: 0555`):
/// Kubernetes reads YAML 1.1, where a plain scalar with a leading zero is
/// an octal number, but serde_yaml reads YAML 1.2 and makes it the string
/// `"0555"`. A `mode` or `defaultMode` (the volume sources' file
/// permissions, integers in every Kubernetes type) given as such a string
/// becomes the number Kubernetes would read: `0555` is 365. (A quoted
/// `"0555"` reads the same here, and the API server would refuse it.)
fn octal_modes(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if key == "mode" || key == "defaultMode" {
                    let octal = v.as_str().and_then(|t| {
                        let digits = t.strip_prefix("0o").or_else(|| t.strip_prefix('0'))?;
                        (!digits.is_empty()).then(|| i64::from_str_radix(digits, 8).ok())?
                    });
                    if let Some(n) = octal {
                        *v = Value::from(n);
                        continue;
                    }
                }
                octal_modes(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(octal_modes),
        _ => {}
    }
}

fn push_value(value: Value, origin: &Origin, out: &mut Vec<Object>) -> Result<(), InputError> {
    match value {
        Value::Null => Ok(()),
        Value::Object(map) if map.is_empty() => Ok(()),
        Value::Object(map)
            if map.get("kind").and_then(Value::as_str) == Some("List")
                || map
                    .get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List") && map.contains_key("items")) =>
        {
            let items = match map.get("items") {
                Some(Value::Array(items)) => items.clone(),
                Some(Value::Null) | None => Vec::new(),
                Some(_) => {
                    return Err(InputError::NotAnObject {
                        origin: origin.to_string(),
                    })
                }
            };
            for item in items {
                push_value(item, origin, out)?;
            }
            Ok(())
        }
        other => {
            out.push(Object::from_value(other, origin.clone())?);
            Ok(())
        }
    }
}

/// Reads every source: `-` is stdin, a directory is read recursively.
pub fn read_sources(sources: &[PathBuf]) -> Result<Vec<Object>, InputError> {
    let mut out = Vec::new();
    for source in sources {
        if source.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| InputError::Read {
                    path: "stdin".into(),
                    source,
                })?;
            out.extend(parse_stream(&text, "stdin")?);
        } else if source.is_dir() {
            let mut files = Vec::new();
            yaml_files(source, &mut files)?;
            if files.is_empty() {
                return Err(InputError::EmptyDir {
                    path: source.display().to_string(),
                });
            }
            for file in files {
                out.extend(read_file(&file)?);
            }
        } else {
            out.extend(read_file(source)?);
        }
    }
    Ok(out)
}

fn read_file(path: &Path) -> Result<Vec<Object>, InputError> {
    let text = std::fs::read_to_string(path).map_err(|source| InputError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_stream(&text, &path.display().to_string())
}

/// `*.yaml` and `*.yml` under `dir`, sorted, so the output does not depend
/// on the file system's order.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), InputError> {
    let read_err = |source| InputError::Read {
        path: dir.display().to_string(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(read_err)?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            yaml_files(&path, out)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_skip_empty_documents_and_flatten_lists() {
        let text = "---\n# only a comment\n---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: b, namespace: ns}\n";
        let objs = parse_stream(text, "t.yaml").expect("parses");
        let ids: Vec<String> = objs.iter().map(Object::id).collect();
        assert_eq!(ids, ["ConfigMap/a", "Secret/b"]);
        assert_eq!(objs[1].namespace.as_deref(), Some("ns"));
        assert_eq!(objs[1].origin.doc, 3);
    }

    #[test]
    fn modes_are_read_as_kubernetes_reads_them() {
        // The shape of a node DaemonSet's ConfigMap volume with a script
        // in it: YAML 1.1's octal `0555` (365), a decimal mode, an item mode.
        let text = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: n}\nspec:\n  template:\n    spec:\n      volumes:\n      - name: script\n        configMap:\n          name: s\n          defaultMode: 0555\n          items:\n          - {key: run, path: run, mode: 0o700}\n      - name: other\n        secret: {secretName: x, defaultMode: 420}\n      containers:\n      - name: c\n        args: [\"--mode\", \"0555\"]\n        env: [{name: mode, value: \"0555\"}]\n";
        let objs = parse_stream(text, "t.yaml").expect("parses");
        let volumes = &objs[0].value["spec"]["template"]["spec"]["volumes"];
        assert_eq!(volumes[0]["configMap"]["defaultMode"], 365);
        assert_eq!(volumes[0]["configMap"]["items"][0]["mode"], 448);
        assert_eq!(volumes[1]["secret"]["defaultMode"], 420);
        let c = &objs[0].value["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["args"][1], "0555", "only modes are numbers");
        assert_eq!(c["env"][0]["value"], "0555");
    }

    #[test]
    fn bad_input_is_an_error_naming_the_document() {
        let err = parse_stream("kind: [\n", "x.yaml").expect_err("malformed");
        assert!(err.to_string().starts_with("x.yaml (document 1)"), "{err}");
        let err = parse_stream("apiVersion: v1\nkind: ConfigMap\n", "y.yaml").expect_err("no name");
        assert!(err.to_string().contains("metadata.name"), "{err}");
        let err = parse_stream("- a\n- b\n", "z.yaml").expect_err("a list");
        assert!(err.to_string().contains("mapping"), "{err}");
    }
}
