//! Checks a `-storage.testdriver=` definition against what e2e.test really
//! read. The suite decodes the file into its `driverDefinition` struct with
//! case-sensitive keys and ignores every key it does not know, so a typo
//! silently turns tests off. e2e.test logs the struct it loaded
//! (`Driver loaded from path [<file>]: &{DriverInfo:{Name:… }}`); every key
//! and value we wrote must be in that dump, and every capability must be
//! one the suite knows (`capabilities.txt` of the built suite, taken from
//! its `Capability` constants).

use std::collections::BTreeSet;
use std::path::Path;

use serde_yaml::Value;

use crate::error::{io, Error, Result};

/// The problems of `definition` (YAML text) against the `dump` e2e.test
/// logged for it and the `known` capability names; empty when every key
/// was read.
pub fn problems(definition: &str, dump: &str, known: &BTreeSet<String>) -> Result<Vec<String>> {
    let doc: Value = serde_yaml::from_str(definition)
        .map_err(|e| Error::Other(format!("the driver definition is not YAML: {e}")))?;
    let mut out = Vec::new();
    walk(&doc, "", dump, known, &mut out);
    Ok(out)
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Where `key:` starts in `text` as a field (after `{`, a space, or at the
/// start): the offset just after the colon.
fn field_at(text: &str, key: &str) -> Option<usize> {
    let pat = format!("{key}:");
    let mut from = 0;
    while let Some(i) = text[from..].find(&pat) {
        let at = from + i;
        let before = text[..at].chars().next_back();
        if matches!(before, None | Some('{') | Some(' ')) {
            return Some(at + pat.len());
        }
        from = at + pat.len();
    }
    None
}

/// The value of field `key` in Go's `%+v` text: a balanced `{…}`, `[…]`
/// or `map[…]`, or the text up to the next space or closing brace.
fn field_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let start = field_at(text, key)?;
    let rest = &text[start..];
    let open = if rest.starts_with('{') {
        Some(('{', '}'))
    } else if rest.starts_with('[') || rest.starts_with("map[") {
        Some(('[', ']'))
    } else {
        None
    };
    match open {
        Some((o, c)) => {
            let mut depth = 0;
            for (i, ch) in rest.char_indices() {
                if ch == o {
                    depth += 1;
                } else if ch == c {
                    depth -= 1;
                    if depth == 0 {
                        return Some(&rest[..=i]);
                    }
                }
            }
            Some(rest)
        }
        None => Some(&rest[..rest.find([' ', '}']).unwrap_or(rest.len())]),
    }
}

fn walk(v: &Value, path: &str, dump: &str, known: &BTreeSet<String>, out: &mut Vec<String>) {
    let Value::Mapping(m) = v else {
        return;
    };
    for (k, v) in m {
        let Some(key) = k.as_str() else {
            out.push(format!("{path}: a key that is not a string: {k:?}"));
            continue;
        };
        let here = if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        };
        // The struct's field, exactly as spelled (Go prints `Field:value`).
        let Some(loaded) = field_value(dump, key) else {
            out.push(format!("{here}: no field {key:?} in what e2e.test loaded"));
            continue;
        };
        if key == "Capabilities" {
            capabilities(v, &here, loaded, known, out);
            continue;
        }
        match v {
            Value::Mapping(_) => walk(v, &here, loaded, known, out),
            Value::Sequence(items) if items.iter().any(Value::is_mapping) => {
                // A list of structs (`InlineVolumes`): `[{…} {…}]`, one
                // element per item, each walked against its own.
                let loaded = structs(loaded);
                if loaded.len() != items.len() {
                    out.push(format!(
                        "{here}: e2e.test loaded {} items, not {}",
                        loaded.len(),
                        items.len()
                    ));
                    continue;
                }
                for (i, (item, element)) in items.iter().zip(loaded).enumerate() {
                    walk(item, &format!("{here}[{i}]"), element, known, out);
                }
            }
            Value::Sequence(items) => {
                let items: Vec<String> = items.iter().filter_map(scalar).collect();
                let want = format!("[{}]", items.join(" "));
                if loaded != want {
                    out.push(format!("{here}: e2e.test loaded {loaded}, not {want}"));
                }
            }
            other => {
                if let Some(s) = scalar(other) {
                    if loaded != s {
                        out.push(format!("{here}: e2e.test loaded {loaded:?}, not {s:?}"));
                    }
                }
            }
        }
    }
}

/// The top-level `{…}` elements of Go's `%+v` text of a slice of structs.
fn structs(list: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, ch) in list.char_indices() {
        match ch {
            '{' => {
                if depth == 0 {
                    start = i;
                }
                depth += 1;
            }
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    out.push(&list[start..=i]);
                }
            }
            _ => {}
        }
    }
    out
}

fn capabilities(
    v: &Value,
    path: &str,
    loaded: &str,
    known: &BTreeSet<String>,
    out: &mut Vec<String>,
) {
    let Value::Mapping(m) = v else {
        out.push(format!("{path}: not a map"));
        return;
    };
    // `map[a:true b:false]`
    let loaded: BTreeSet<&str> = loaded
        .trim_start_matches("map[")
        .trim_end_matches(']')
        .split(' ')
        .collect();
    for (k, v) in m {
        let (Some(cap), Some(val)) = (k.as_str(), scalar(v)) else {
            out.push(format!("{path}: {k:?}: {v:?} is not a name and a boolean"));
            continue;
        };
        if !known.contains(cap) {
            out.push(format!(
                "{path}.{cap}: not a capability the suite knows ({})",
                known.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        if !loaded.contains(format!("{cap}:{val}").as_str()) {
            out.push(format!("{path}.{cap}: e2e.test did not load {cap}:{val}"));
        }
    }
}

/// The dump e2e.test logs for `file` (its `Driver loaded from path` line):
/// `e2e.test --ginkgo.dry-run` with nothing focused runs no spec and needs
/// no cluster, but loads the definition as a real run does.
pub fn loaded_dump(e2e_test: &Path, file: &Path) -> Result<String> {
    let out = std::process::Command::new(e2e_test)
        .arg("--ginkgo.dry-run")
        .arg("--ginkgo.focus=this-matches-no-spec")
        .arg(format!("-storage.testdriver={}", file.display()))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(io("running", e2e_test))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let marker = format!("Driver loaded from path [{}]: ", file.display());
    text.lines()
        .find_map(|l| l.split_once(&marker).map(|(_, dump)| dump.to_string()))
        .ok_or_else(|| {
            Error::Other(format!(
                "e2e.test did not say it loaded {}:\n{}",
                file.display(),
                text.lines().rev().take(20).collect::<Vec<_>>().join("\n")
            ))
        })
}

/// Every problem of the definition file at `file`, checked by loading it
/// with the suite's e2e.test.
pub fn check_file(e2e_test: &Path, known: &BTreeSet<String>, file: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(file).map_err(io("reading", file))?;
    let dump = loaded_dump(e2e_test, file)?;
    problems(&text, &dump, known)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "&{DriverInfo:{Name:x.csi InTreePluginName: TestTags:[] MaxFileSize:0 \
        SupportedSizeRange:{Max: Min:1Mi} Capabilities:map[block:true persistence:true] \
        TopologyKeys:[a/zone] NumAllowedTopologies:0} StorageClass:{FromName:false \
        FromFile:sc.yaml FromExistingClassName:} SnapshotClass:{FromName:true FromFile: \
        FromExistingClassName:} ClientNodeName: Timeouts:map[]}";

    fn known() -> BTreeSet<String> {
        ["block", "persistence", "topology"]
            .into_iter()
            .map(String::from)
            .collect()
    }

    #[test]
    fn a_definition_that_was_read_has_no_problems() {
        let def = "StorageClass:\n  FromFile: sc.yaml\nSnapshotClass:\n  FromName: true\n\
            DriverInfo:\n  Name: x.csi\n  SupportedSizeRange:\n    Min: 1Mi\n  TopologyKeys: [a/zone]\n\
            \n  Capabilities:\n    block: true\n    persistence: true\n";
        assert_eq!(problems(def, DUMP, &known()).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_miscased_key_an_unknown_capability_and_an_unread_value_are_problems() {
        let def = "storageClass:\n  FromName: true\nDriverInfo:\n  Name: x.csi\n\
            \n  Capabilities:\n    Block: true\n    topology: true\n";
        let p = problems(def, DUMP, &known()).unwrap();
        assert!(p.iter().any(|l| l.starts_with("storageClass:")), "{p:?}");
        assert!(
            p.iter()
                .any(|l| l.contains("Capabilities.Block: not a capability")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|l| l.contains("did not load topology:true")),
            "{p:?}"
        );
        assert_eq!(p.len(), 4, "{p:?}");
    }

    #[test]
    fn a_list_of_structs_is_checked_item_by_item() {
        let dump = "&{DriverInfo:{Name:x.csi} InlineVolumes:[{Attributes:map[] Shared:false \
            ReadOnly:false} {Attributes:map[a:b] Shared:true ReadOnly:false}] ClientNodeName:}";
        let read = "InlineVolumes:\n- {}\n- {Shared: true}\n";
        assert_eq!(
            problems(read, dump, &known()).unwrap(),
            Vec::<String>::new()
        );
        // Upstream hostpath's own definition spells it `shared`: not read.
        let miscased = "InlineVolumes:\n- {}\n- {shared: true}\n";
        assert_eq!(
            problems(miscased, dump, &known()).unwrap(),
            ["InlineVolumes[1].shared: no field \"shared\" in what e2e.test loaded"]
        );
        let unread = "InlineVolumes:\n- {}\n- {ReadOnly: true}\n";
        assert_eq!(
            problems(unread, dump, &known()).unwrap(),
            ["InlineVolumes[1].ReadOnly: e2e.test loaded \"false\", not \"true\""]
        );
        let short = "InlineVolumes:\n- {}\n";
        assert_eq!(
            problems(short, dump, &known()).unwrap(),
            ["InlineVolumes: e2e.test loaded 2 items, not 1"]
        );
    }

    #[test]
    fn a_value_is_looked_up_in_its_own_section() {
        // SnapshotClass has FromName:true, StorageClass has not.
        let def = "StorageClass:\n  FromName: true\n";
        let p = problems(def, DUMP, &known()).unwrap();
        assert_eq!(
            p,
            ["StorageClass.FromName: e2e.test loaded \"false\", not \"true\""],
            "{p:?}"
        );
    }
}
