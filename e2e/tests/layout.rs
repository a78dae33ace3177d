//! The layering of the workspace, checked from the code's own `use` lines
//! and paths (no cluster): within each crate no two files import each
//! other round a circle, the operator depends on nothing under `sidecars/`,
//! and no production file outgrows what a reader takes in.
//!
//! A child module may use its parent and the parent its children (that is
//! how a folder exposes itself), so only imports between files that are not
//! each other's ancestors count. Test code (`x/tests.rs`, `mod tests { … }`
//! at the end of a file, `tests/`) is left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use csiops_e2e::testkit::workspace_root;

/// The crates whose files are scanned, by source folder.
const CRATES: &[&str] = &[
    "cli/src",
    "crds/src",
    "operator/src",
    "runtime/src",
    "sidecars/src",
    "proto/src",
    "e2e/src",
];

/// Production files allowed over [`MAX_LINES`], with why.
const LONG_FILES: &[(&str, &str)] = &[(
    "crds/src/spec.rs",
    "the CRD's schema: every field with its API documentation",
)];

/// About what a reader takes in at once; the rest goes into submodules.
const MAX_LINES: usize = 900;

/// A module path inside its crate (`["reconcile", "pass"]`); empty is the root.
type ModPath = Vec<String>;

struct File {
    path: PathBuf,
    module: ModPath,
    /// The production part: everything before a trailing test module.
    code: String,
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.push(p.clone());
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of `file` under the crate's `src`, or `None` for test
/// files and binaries (each binary is a crate root of its own).
fn module_of(src: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if stem == "tests" || parts.iter().any(|p| p == "tests") {
        return None;
    }
    match stem {
        "lib" | "main" if parts.is_empty() => {}
        "mod" => {}
        _ => parts.push(stem.to_string()),
    }
    Some(parts)
}

/// The file without its trailing `#[cfg(test)] mod tests { … }`.
fn production_part(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|n| n.starts_with("mod tests {") || n.starts_with("mod test {"))
        {
            break;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Drops comments and string literals, which may name paths they do not use.
fn strip_comments_and_strings(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        let mut in_str = false;
        let mut prev = '\0';
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                }
                prev = if prev == '\\' && c == '\\' { '\0' } else { c };
                continue;
            }
            if c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '\'' && chars.peek() == Some(&'"') {
                // The character literal '"'.
                chars.next();
                chars.next();
                continue;
            }
            if c == '"' {
                in_str = true;
                prev = '\0';
                continue;
            }
            out.push(c);
        }
        out.push('\n');
    }
    out
}

/// Every path the code names that starts at `crate`, `super` or `self`,
/// with `use` groups (`use super::{a, b::c}`) expanded.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    // `use` statements, which may span lines and nest braces.
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        rest = &rest[at + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(end) = rest.find(';') else { break };
        expand(&rest[..end], &mut Vec::new(), &mut paths);
        rest = &rest[end..];
    }
    // Inline paths: `crate::fleet::X`, `super::monitoring::f(…)`.
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let start_ok = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
        if start_ok && bytes[i].is_ascii_alphabetic() {
            let mut j = i;
            while j < bytes.len()
                && (bytes[j].is_alphanumeric()
                    || bytes[j] == '_'
                    || (bytes[j] == ':' && bytes.get(j + 1) == Some(&':'))
                    || (bytes[j] == ':' && j > 0 && bytes[j - 1] == ':'))
            {
                j += 1;
            }
            let word: String = bytes[i..j].iter().collect();
            let segs: Vec<String> = word
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if segs.len() > 1 && matches!(segs[0].as_str(), "crate" | "super" | "self") {
                paths.push(segs);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    paths
}

/// Expands one `use` tree into its paths.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim().trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let Some(close) = tree.rfind('}') else { return };
        let inner = &tree[open + 1..close];
        let depth_before = prefix.len();
        prefix.extend(head);
        for part in split_top_level(inner) {
            expand(part, prefix, out);
        }
        prefix.truncate(depth_before);
    } else {
        let path = tree.split(" as ").next().unwrap_or(tree);
        let mut full = prefix.clone();
        full.extend(
            path.split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty() && *s != "*")
                .map(str::to_string),
        );
        if full.last().is_some_and(|s| s == "self") {
            full.pop();
        }
        if !full.is_empty() {
            out.push(full);
        }
    }
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// The module a path from `from` lands in: the longest known module prefix
/// of its absolute form. Paths not starting at `crate`/`super`/`self` are
/// other crates, the prelude, or the file's own children.
fn resolve(from: &ModPath, path: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut abs: ModPath = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" => from.clone(),
        "super" => from.clone(),
        _ => return None,
    };
    let mut segs = path
        .iter()
        .skip(usize::from(path[0] == "crate" || path[0] == "self"));
    let mut rest = Vec::new();
    for s in segs.by_ref() {
        if s == "super" && rest.is_empty() {
            abs.pop()?;
        } else {
            rest.push(s.clone());
        }
    }
    abs.extend(rest);
    while !abs.is_empty() && !modules.contains(&abs) {
        abs.pop();
    }
    Some(abs)
}

fn is_ancestor(a: &ModPath, b: &ModPath) -> bool {
    a.len() <= b.len() && b[..a.len()] == a[..]
}

fn scan(src_rel: &str) -> Vec<File> {
    let src = workspace_root().join(src_rel);
    let mut paths = Vec::new();
    rs_files(&src, &mut paths);
    let mut files = Vec::new();
    for p in paths.into_iter().filter(|p| p.is_file()) {
        let Some(module) = module_of(&src, &p) else {
            continue;
        };
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        files.push(File {
            path: p,
            module,
            code: production_part(&text),
        });
    }
    assert!(!files.is_empty(), "no source files under {src_rel}");
    files
}

/// The file-to-file imports of one crate that are not between a module and
/// its ancestor, with the paths that make each.
fn imports(files: &[File]) -> BTreeMap<(ModPath, ModPath), BTreeSet<String>> {
    let modules: BTreeSet<ModPath> = files.iter().map(|f| f.module.clone()).collect();
    let mut edges: BTreeMap<(ModPath, ModPath), BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let code = strip_comments_and_strings(&f.code);
        for path in named_paths(&code) {
            let Some(to) = resolve(&f.module, &path, &modules) else {
                continue;
            };
            if is_ancestor(&to, &f.module) || is_ancestor(&f.module, &to) {
                continue;
            }
            edges
                .entry((f.module.clone(), to))
                .or_default()
                .insert(path.join("::"));
        }
    }
    edges
}

/// Strongly connected components of more than one module (Tarjan).
fn circles(edges: &BTreeMap<(ModPath, ModPath), BTreeSet<String>>) -> Vec<Vec<ModPath>> {
    let mut graph: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        graph.entry(a).or_default().push(b);
        graph.entry(b).or_default();
    }
    struct Tarjan<'a> {
        graph: &'a BTreeMap<&'a ModPath, Vec<&'a ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a ModPath) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for &w in &self.graph[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

#[test]
fn no_crate_has_an_import_circle_between_its_files() {
    let mut found = Vec::new();
    let mut seen = 0;
    for src in CRATES {
        let files = scan(src);
        let edges = imports(&files);
        seen += edges.len();
        for scc in circles(&edges) {
            let members: BTreeSet<&ModPath> = scc.iter().collect();
            let ties: Vec<String> = edges
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|((a, b), via)| {
                    let via: Vec<&str> = via.iter().map(String::as_str).collect();
                    format!("    {} -> {}: {}", name(a), name(b), via.join(", "))
                })
                .collect();
            found.push(format!("{src}:\n{}", ties.join("\n")));
        }
    }
    // The operator and the sidecars alone import across hundreds of files.
    assert!(seen > 200, "only {seen} imports seen; the scan is broken");
    assert!(
        found.is_empty(),
        "import circles (move what both need into a module below them):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_sees_a_circle_when_there_is_one() {
    // Two siblings naming each other, one through a `use` group, one inline.
    let files = vec![
        File {
            path: "a.rs".into(),
            module: vec!["a".into()],
            code: "use super::{b::{self, B}, c};\nfn f() {}\n".into(),
        },
        File {
            path: "b.rs".into(),
            module: vec!["b".into()],
            code: "fn g() { crate::a::f() } // crate::c::X is only a comment\n".into(),
        },
        File {
            path: "c.rs".into(),
            module: vec!["c".into()],
            code: "const X: &str = \"crate::a::f\";\n".into(),
        },
        File {
            path: "lib.rs".into(),
            module: vec![],
            code: "mod a; mod b; mod c; use a::f;".into(),
        },
    ];
    let edges = imports(&files);
    let c = circles(&edges);
    assert_eq!(c.len(), 1, "{edges:?}");
    let members: BTreeSet<ModPath> = c[0].iter().cloned().collect();
    assert_eq!(
        members,
        BTreeSet::from([vec!["a".to_string()], vec!["b".to_string()]])
    );
    assert!(!edges.contains_key(&(vec!["c".to_string()], vec!["a".to_string()])));
}

#[test]
fn the_operator_depends_on_nothing_under_sidecars() {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("operator/Cargo.toml")).expect("Cargo.toml");
    let offending: Vec<&str> = manifest
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains("sidecars"))
        .collect();
    assert!(offending.is_empty(), "operator/Cargo.toml: {offending:?}");
    for f in scan("operator/src") {
        assert!(
            !f.code.contains("csiops_sidecars"),
            "{} uses csiops_sidecars",
            f.path.display()
        );
    }
}

#[test]
fn no_production_file_outgrows_a_reader() {
    let root = workspace_root();
    let mut long = Vec::new();
    for src in CRATES {
        for f in scan(src) {
            let rel = f
                .path
                .strip_prefix(&root)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            let lines = f.code.lines().count();
            if lines > MAX_LINES && !LONG_FILES.iter().any(|(p, _)| *p == rel) {
                long.push(format!("{rel}: {lines} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "production files over {MAX_LINES} lines (split them by concern):\n{}",
        long.join("\n")
    );
}
