//! The API reference, `docs/api-reference.md`, generated from the same Rust
//! types as the CRD (`make api-docs`; a test fails when the file is stale).
//!
//! The CRD inlines every type, so a walk of it cannot tell csiops' own types
//! from the Kubernetes ones it embeds (affinity, volumes, security contexts),
//! whose reference is `kubectl explain`. The schema generator is therefore
//! asked for named definitions instead: csiops' types get a section each,
//! Kubernetes' types (schema names `io.k8s.…`) are named and not expanded.

use std::collections::{BTreeSet, VecDeque};
use std::fmt::Write as _;

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value};

use crate::{CSIDriverDeploymentSpec, CSIDriverDeploymentStatus};

/// Path of the generated reference, relative to the workspace root.
pub const API_REFERENCE_FILE: &str = "docs/api-reference.md";

/// Where the generator puts named definitions (`#/components/schemas/<name>`).
const REF_PREFIX: &str = "#/components/schemas/";

/// Names of the root types as the reference shows them.
const ROOTS: [(&str, &str); 2] = [
    ("spec", "CSIDriverDeploymentSpec"),
    ("status", "CSIDriverDeploymentStatus"),
];

/// The whole reference as Markdown.
pub fn api_reference() -> String {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let spec = generator.subschema_for::<CSIDriverDeploymentSpec>();
    let status = generator.subschema_for::<CSIDriverDeploymentStatus>();
    let mut defs = generator.take_definitions(true);
    // The roots may come back inline or as references; name them either way.
    for ((_, name), schema) in ROOTS.iter().zip([spec, status]) {
        if let Some(inline) = schema.as_object().filter(|o| !o.contains_key("$ref")) {
            defs.insert((*name).to_string(), Value::Object(inline.clone()));
        }
    }
    hoist_inline_objects(&mut defs);
    render(&defs)
}

/// Types that derive their schema inline (those with CEL rules do) have no
/// definition of their own: give each a name after its field (`node` →
/// `NodeSpec`) and refer to it, so it gets a section like the others.
fn hoist_inline_objects(defs: &mut Map<String, Value>) {
    let mut names: BTreeSet<String> = defs.keys().cloned().collect();
    let mut pending: Vec<String> = names
        .iter()
        .filter(|n| !is_kubernetes_type(n))
        .cloned()
        .collect();
    while let Some(owner) = pending.pop() {
        let Some(props) = defs
            .get_mut(&owner)
            .and_then(|d| d.get_mut("properties"))
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        let mut hoisted = Vec::new();
        for (field, prop) in props.iter_mut() {
            let inline = if prop.get("properties").is_some() {
                prop
            } else {
                match prop.get_mut("items") {
                    Some(items) if items.get("properties").is_some() => items,
                    _ => continue,
                }
            };
            let base = format!("{}Spec", upper_first(field.trim_end_matches('s')));
            let name = if names.contains(&base) {
                format!("{owner}{base}")
            } else {
                base
            };
            names.insert(name.clone());
            let mut body = std::mem::replace(inline, json_ref(&name));
            // What describes the field stays on the field.
            if let (Value::Object(field_schema), Value::Object(type_schema)) = (inline, &mut body) {
                for key in ["description", "default", "nullable"] {
                    if let Some(v) = type_schema.remove(key) {
                        field_schema.insert(key.to_string(), v);
                    }
                }
            }
            hoisted.push((name, body));
        }
        for (name, body) in hoisted {
            defs.insert(name.clone(), body);
            pending.push(name);
        }
    }
}

fn json_ref(name: &str) -> Value {
    let mut m = Map::new();
    m.insert(
        "$ref".to_string(),
        Value::String(format!("{REF_PREFIX}{name}")),
    );
    Value::Object(m)
}

fn render(defs: &Map<String, Value>) -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from crds/src by `make api-docs`; do not edit by hand. -->\n\
         # API reference: `csiops.dev/v1alpha1` `CSIDriverDeployment`\n\n\
         Namespaced, short name `csidd`, category `storage`. Every field below is\n\
         also in the CRD schema, so `kubectl explain csidriverdeployment.spec.<field>`\n\
         prints the same descriptions. Types named `core/v1 …` or `storage/v1 …` are\n\
         Kubernetes' own: see `kubectl explain` for their fields.\n\n\
         Constraints listed here are enforced by the API server when the object is\n\
         created or updated (schema and CEL rules), so a bad object is refused at\n\
         `kubectl apply` with the message shown.\n",
    );
    let mut queue: VecDeque<String> = ROOTS.iter().map(|(_, n)| (*n).to_string()).collect();
    let mut seen: BTreeSet<String> = queue.iter().cloned().collect();
    while let Some(name) = queue.pop_front() {
        let Some(schema) = defs.get(&name) else {
            continue;
        };
        section(&mut out, &name, schema, defs);
        for child in referenced_types(schema) {
            if !is_kubernetes_type(&child) && seen.insert(child.clone()) {
                queue.push_back(child);
            }
        }
    }
    out
}

/// One type's section: its description, rules and fields (or values).
fn section(out: &mut String, name: &str, schema: &Value, defs: &Map<String, Value>) {
    let _ = write!(out, "\n## {name}\n\n");
    if let Some(root) = ROOTS.iter().find(|(_, n)| *n == name) {
        let _ = writeln!(out, "The object's `.{}`.\n", root.0);
    }
    if let Some(d) = description(schema) {
        let _ = writeln!(out, "{d}\n");
    }
    let rules = cel_rules(schema);
    if !rules.is_empty() {
        out.push_str("Rules checked by the API server:\n\n");
        for r in rules {
            let _ = writeln!(out, "- {r}");
        }
        out.push('\n');
    }
    if let Some(values) = enum_values(schema) {
        out.push_str("| value | meaning |\n|---|---|\n");
        for (v, d) in values {
            let _ = writeln!(out, "| `{v}` | {} |", cell(d.as_deref().unwrap_or("")));
        }
        return;
    }
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str("| field | type | description |\n|---|---|---|\n");
    for (field, prop) in props {
        let mut text = description(prop).unwrap_or_default();
        for note in constraints(prop, required.contains(field.as_str()), defs) {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&note);
        }
        let _ = writeln!(out, "| `{field}` | {} | {} |", type_name(prop), cell(&text));
    }
}

/// The description of a schema, or of the type it refers to.
fn description(schema: &Value) -> Option<String> {
    schema
        .get("description")
        .and_then(Value::as_str)
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
}

/// A description as one table cell: one line, no unescaped pipes.
fn cell(text: &str) -> String {
    text.split('\n')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The messages of the CEL rules on a schema (`x-kubernetes-validations`).
fn cel_rules(schema: &Value) -> Vec<String> {
    schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .map(|rules| {
            rules
                .iter()
                .filter_map(|r| r.get("message").or_else(|| r.get("rule")))
                .filter_map(Value::as_str)
                .map(|m| m.to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Required, default, bounds, pattern and CEL messages of one field.
fn constraints(prop: &Value, required: bool, defs: &Map<String, Value>) -> Vec<String> {
    let mut notes = Vec::new();
    if required {
        notes.push("**Required.**".to_string());
    }
    if let Some(d) = prop.get("default") {
        notes.push(format!("Default: `{}`.", compact(d)));
    }
    let target = resolve(prop, defs);
    for (key, label) in [
        ("minLength", "at least {} characters"),
        ("maxLength", "at most {} characters"),
        ("minItems", "at least {} items"),
        ("maxItems", "at most {} items"),
        ("minimum", "minimum {}"),
        ("maximum", "maximum {}"),
    ] {
        if let Some(v) = prop.get(key).or_else(|| target.and_then(|t| t.get(key))) {
            notes.push(format!(
                "{}.",
                upper_first(&label.replace("{}", &compact(v)))
            ));
        }
    }
    if let Some(p) = prop.get("pattern").and_then(Value::as_str) {
        notes.push(format!("Pattern: `{p}`."));
    }
    if let Some(values) = prop.get("enum").and_then(Value::as_array) {
        let list: Vec<String> = values.iter().map(|v| format!("`{}`", compact(v))).collect();
        notes.push(format!("One of {}.", list.join(", ")));
    }
    for m in cel_rules(prop) {
        notes.push(format!("Rule: {m}."));
    }
    if let Some(items) = prop.get("items") {
        for m in cel_rules(items) {
            notes.push(format!("Each item: {m}."));
        }
    }
    notes
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + c.as_str(),
        None => String::new(),
    }
}

/// A JSON value as written in YAML-ish flow style: strings unquoted.
fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The named type a field refers to (directly, or through `allOf`/`anyOf`
/// as generated for optional fields).
fn ref_name(prop: &Value) -> Option<&str> {
    if let Some(r) = prop.get("$ref").and_then(Value::as_str) {
        return r.strip_prefix(REF_PREFIX);
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        let refs: Vec<&str> = prop
            .get(key)
            .and_then(Value::as_array)
            .map(|alts| alts.iter().filter_map(ref_name).collect())
            .unwrap_or_default();
        if let [one] = refs.as_slice() {
            return Some(one);
        }
    }
    None
}

fn resolve<'a>(prop: &Value, defs: &'a Map<String, Value>) -> Option<&'a Value> {
    ref_name(prop).and_then(|n| defs.get(n))
}

fn is_kubernetes_type(name: &str) -> bool {
    name.starts_with("io.k8s.")
}

/// `io.k8s.api.core.v1.Affinity` → `core/v1 Affinity`.
fn kubernetes_type_name(name: &str) -> String {
    let rest = name
        .trim_start_matches("io.k8s.api.")
        .trim_start_matches("io.k8s.apimachinery.pkg.apis.")
        .trim_start_matches("io.k8s.apimachinery.pkg.");
    match rest.rsplit_once('.') {
        Some((group, kind)) => match group.rsplit_once('.') {
            Some((g, v)) => format!("{g}/{v} {kind}"),
            None => format!("{group} {kind}"),
        },
        None => rest.to_string(),
    }
}

/// The type column: scalars by name, lists and maps by their element type,
/// csiops' types as links to their section.
fn type_name(prop: &Value) -> String {
    if let Some(name) = ref_name(prop) {
        return if name == "io.k8s.apimachinery.pkg.util.intstr.IntOrString" {
            "integer or string".to_string()
        } else if is_kubernetes_type(name) {
            kubernetes_type_name(name)
        } else {
            format!("[{name}](#{})", name.to_lowercase())
        };
    }
    if prop.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "integer or string".to_string();
    }
    match scalar_type(prop) {
        Some("array") => match prop.get("items") {
            Some(items) => format!("[]{}", type_name(items)),
            None => "array".to_string(),
        },
        Some("object") => match prop.get("additionalProperties") {
            Some(v @ Value::Object(_)) => format!("map[string]{}", type_name(v)),
            _ => "object".to_string(),
        },
        Some(t) => t.to_string(),
        None => "object".to_string(),
    }
}

/// The schema's `type`, also when written as `["string", "null"]`.
fn scalar_type(prop: &Value) -> Option<&str> {
    match prop.get("type")? {
        Value::String(t) => Some(t),
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        _ => None,
    }
}

/// Named types a schema refers to, in the order its fields name them.
fn referenced_types(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_refs(schema, &mut out);
    out
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(name) = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix(REF_PREFIX))
            {
                if !out.iter().any(|n| n == name) {
                    out.push(name.to_string());
                }
            }
            for child in map.values() {
                collect_refs(child, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_refs(i, out)),
        _ => {}
    }
}

/// The values of an enum type with their descriptions: plain `enum` lists,
/// or the `oneOf` of documented constants the generator writes when the
/// variants carry doc comments.
fn enum_values(schema: &Value) -> Option<Vec<(String, Option<String>)>> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return Some(values.iter().map(|v| (compact(v), None)).collect());
    }
    let alts = schema.get("oneOf").and_then(Value::as_array)?;
    let mut out = Vec::new();
    for alt in alts {
        let values: Vec<String> = match (alt.get("const"), alt.get("enum")) {
            (Some(c), _) => vec![compact(c)],
            (None, Some(Value::Array(e))) => e.iter().map(compact).collect(),
            _ => return None,
        };
        for v in values {
            out.push((v, description(alt)));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubernetes_types_are_named_by_group_and_version() {
        assert_eq!(
            kubernetes_type_name("io.k8s.api.core.v1.Affinity"),
            "core/v1 Affinity"
        );
        assert_eq!(
            kubernetes_type_name("io.k8s.api.storage.v1.TokenRequest"),
            "storage/v1 TokenRequest"
        );
        assert_eq!(
            kubernetes_type_name("io.k8s.apimachinery.pkg.apis.meta.v1.Condition"),
            "meta/v1 Condition"
        );
    }

    #[test]
    fn type_column_follows_lists_maps_and_optional_references() {
        let optional_ref =
            json!({"anyOf": [{"$ref": "#/components/schemas/NodeSpec"}, {"type": "null"}]});
        assert_eq!(type_name(&optional_ref), "[NodeSpec](#nodespec)");
        let list = json!({"type": "array", "items": {"$ref": "#/components/schemas/io.k8s.api.core.v1.Volume"}});
        assert_eq!(type_name(&list), "[]core/v1 Volume");
        let map = json!({"type": "object", "additionalProperties": {"type": "string"}});
        assert_eq!(type_name(&map), "map[string]string");
    }

    #[test]
    fn cells_are_one_line_with_escaped_pipes() {
        assert_eq!(cell("a\n  b | c"), "a b \\| c");
    }

    #[test]
    fn the_reference_documents_every_spec_field() {
        let doc = api_reference();
        for field in [
            "driverName",
            "version",
            "topology",
            "csiDriver",
            "storageClasses",
            "rollout",
        ] {
            assert!(
                doc.contains(&format!("| `{field}` |")),
                "no row for {field}"
            );
        }
        assert!(doc.contains("## CSIDriverDeploymentStatus"));
        assert!(
            doc.contains("driverName is immutable"),
            "CEL messages are listed"
        );
        // Kubernetes' own types are named, not expanded.
        assert!(doc.contains("core/v1 Affinity"));
        assert!(!doc.contains("## io.k8s."));
    }
}
