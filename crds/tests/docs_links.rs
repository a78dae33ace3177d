//! Every relative link of `README.md` and `docs/*.md` resolves: the file
//! exists, and a `#fragment` into a Markdown file names one of its headings
//! (GitHub's anchors). Links out of the repository (`http…`, `mailto:`) are
//! not followed. It lives here beside the API reference's freshness test,
//! the crate that generates `docs/api-reference.md`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crds/ has a parent")
        .to_path_buf()
}

/// The Markdown files whose links are checked.
fn documents() -> Vec<PathBuf> {
    let root = workspace();
    let mut files = vec![root.join("README.md")];
    let docs = std::fs::read_dir(root.join("docs")).expect("docs/ exists");
    let mut md: Vec<PathBuf> = docs
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    md.sort();
    files.extend(md);
    files
}

/// Lines outside fenced code blocks, with inline code spans removed.
fn prose(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            }
        }
        out.push(kept);
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped but `-`
/// and `_`, spaces to `-`; a repeated anchor gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(title) = line.strip_prefix('#').filter(|_| !fenced) else {
            continue;
        };
        let title = title.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{slug}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// `(target)` of every `[text](target)` in `line`.
fn targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) => {
                out.push(after[..j].to_string());
                rest = &after[j + 1..];
            }
            None => break,
        }
    }
    out
}

#[test]
fn relative_links_of_the_readme_and_docs_resolve() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("readable");
        let dir = doc.parent().expect("in a directory");
        for line in prose(&text) {
            for target in targets(&line) {
                if target.starts_with("http://")
                    || target.starts_with("https://")
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                checked += 1;
                let (path, fragment) = match target.split_once('#') {
                    Some((p, f)) => (p, Some(f)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    doc.clone()
                } else {
                    dir.join(path)
                };
                if !file.exists() {
                    broken.push(format!("{}: {target}: no such file", doc.display()));
                    continue;
                }
                let Some(fragment) = fragment else { continue };
                if file.extension().is_none_or(|x| x != "md") {
                    continue;
                }
                let linked = std::fs::read_to_string(&file).expect("readable");
                if !anchors(&linked).contains(fragment) {
                    broken.push(format!(
                        "{}: {target}: no heading with anchor #{fragment}",
                        doc.display()
                    ));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_follow_github() {
    let a = anchors(
        "# Title\n## `node.maxUnavailable` at scale\n## Hand-back, deletion, errors\n## Title\n```\n# not a heading\n```\n",
    );
    let want: BTreeSet<String> = [
        "title",
        "nodemaxunavailable-at-scale",
        "hand-back-deletion-errors",
        "title-1",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(a, want);
}

#[test]
fn readme_names_the_two_commands() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
    for command in ["make demo", "make test"] {
        assert!(readme.contains(command), "README.md lacks `{command}`");
    }
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; keep it at most 250 and move detail into docs/"
    );
}
