//! klog's `--vmodule=pattern=N,...` as `tracing` filter directives.
//!
//! klog raises (or lowers) the verbosity of the Go files whose name (without
//! `.go`) matches a pattern. Our equivalent of a Go file is a module, so a
//! pattern selects the modules with that last path segment
//! (`--vmodule=controller=5` is every `…::controller` module) at the level
//! `-v=N` would give (see `logging::level_for`). A literal name needs no
//! list and works for any module; a glob (`*`, `?`, as `filepath.Match`) is
//! matched against [`MODULES`].

use csiops_runtime::logging::level_for;

/// Where our modules live: the crate roots and the role directories.
const PARENTS: &[&str] = &[
    "csiops_sidecars",
    "csiops_sidecars::common",
    "csiops_sidecars::attacher",
    "csiops_sidecars::provisioner",
    "csiops_sidecars::registrar",
    "csiops_sidecars::liveness",
    "csiops_runtime",
];

/// The module names a glob pattern is matched against (a test checks each
/// exists). A module missing here is still reached by its literal name.
pub const MODULES: &[&str] = &[
    "attacher",
    "common",
    "liveness",
    "provisioner",
    "registrar",
    "admin",
    "cache",
    "capabilities",
    "claim",
    "controller",
    "csi",
    "decide",
    "driver",
    "finalizer",
    "goflags",
    "kube",
    "leader",
    "logging",
    "metrics",
    "naming",
    "node",
    "nodeinfo",
    "params",
    "plan",
    "pv",
    "quantity",
    "request",
    "role",
    "secrets",
    "server",
    "shutdown",
    "socket",
    "status",
    "sync",
    "topology",
    "volume",
    "vmodule",
    "watch",
    "workqueue",
];

/// The `EnvFilter` directives of a `--vmodule` value; an item that is not
/// `pattern=N` (N an integer ≥ 0) is an error, as in klog.
pub fn directives(spec: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in spec.split(',').filter(|i| !i.is_empty()) {
        let (pattern, level) = item
            .split_once('=')
            .filter(|(p, _)| !p.is_empty())
            .ok_or_else(|| format!("{item:?} is not pattern=N"))?;
        let level: u8 = level
            .parse()
            .map_err(|_| format!("{item:?}: N must be a number from 0 to 255"))?;
        let level = level_for(level);
        // A path pattern is matched on its last element (ours have no files
        // in common with Go's paths anyway).
        let pattern = pattern.rsplit('/').next().unwrap_or(pattern);
        let names: Vec<&str> = if pattern.contains(['*', '?', '[']) {
            MODULES
                .iter()
                .copied()
                .filter(|m| glob(pattern, m))
                .collect()
        } else {
            vec![pattern]
        };
        for name in names {
            for parent in PARENTS {
                out.push(format!("{parent}::{name}={level}"));
            }
        }
    }
    Ok(out)
}

/// `filepath.Match` for `*` and `?` (a `[` class matches nothing here).
fn glob(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|i| go(rest, &n[i..])),
            Some((b'?', rest)) => !n.is_empty() && go(rest, &n[1..]),
            Some((b'[', _)) => false,
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_and_glob_patterns_become_target_directives() {
        let d = directives("controller=5").expect("parses");
        assert!(d.contains(&"csiops_sidecars::attacher::controller=trace".to_string()));
        assert!(d.contains(&"csiops_sidecars::common::controller=trace".to_string()));
        let d = directives("nodeinf*=3,leader=0").expect("parses");
        assert!(d.contains(&"csiops_sidecars::registrar::nodeinfo=debug".to_string()));
        assert!(d.contains(&"csiops_runtime::leader=info".to_string()));
        assert!(!d.iter().any(|x| x.contains("::node=")), "{d:?}");
        assert_eq!(directives("").expect("empty"), Vec::<String>::new());
        for bad in ["controller", "=3", "x=high", "x=-1"] {
            assert!(directives(bad).is_err(), "{bad}");
        }
        // Every directive is one EnvFilter accepts.
        let all = directives("*=4").expect("glob").join(",");
        assert!(tracing_subscriber::EnvFilter::try_new(all).is_ok());
    }

    #[test]
    fn globs_as_filepath_match() {
        assert!(glob("*", "sync"));
        assert!(glob("s?nc", "sync"));
        assert!(glob("*info", "nodeinfo"));
        assert!(!glob("node", "nodeinfo"));
    }

    #[test]
    fn every_listed_module_exists() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut found = std::collections::BTreeSet::new();
        for dir in [root.join("src"), root.join("../runtime/src")] {
            let mut stack = vec![dir];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).expect("read src").flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        found.insert(p.file_name().expect("name").to_string_lossy().into_owned());
                        stack.push(p);
                    } else if let Some(stem) = p.file_stem() {
                        found.insert(stem.to_string_lossy().into_owned());
                    }
                }
            }
        }
        for m in MODULES {
            assert!(found.contains(*m), "{m} is no module of ours");
        }
    }
}
