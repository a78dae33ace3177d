//! `make test`'s test runner: the decisions of `csiops-test-run`.
//!
//! `cargo test` runs the workspace's test binaries one after another. Most of
//! the e2e time is waiting (a control plane starting, a lease expiring, a
//! kubelet's retry), so the binaries run in two lanes instead:
//!
//! - the **real-node lane**, one binary at a time: a real node takes the
//!   machine-wide lock (`realnode::host::NodeLock`), so two such binaries
//!   would only queue on it;
//! - the **shared lane**, everything else (unit tests, kwok clusters,
//!   sidecars against a control plane), `jobs` binaries at a time.
//!
//! Which lane a binary runs in changes only how long the run takes, never
//! what passes: a real-node binary put in the shared lane waits on the lock.
//!
//! The lanes start as soon as what the integration tests need is built (the
//! control plane, the images, their binaries). What only a few binaries
//! need (the [`PREPS`]), the unit-test binaries, the lint and the doc tests
//! are built and run at idle priority beside the lanes, which mostly wait;
//! a binary that needs a prep waits for it, and runs last in its lane
//! ([`order`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// One test binary cargo built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    /// The package, e.g. `csiops-e2e`.
    pub package: String,
    /// The target, e.g. `walkthrough` (an integration test) or the crate's
    /// name (its unit tests).
    pub target: String,
    /// `lib`, `bin` or `test`.
    pub kind: String,
    /// The test source (the crate root for unit tests).
    pub src_path: PathBuf,
    /// The package's directory: cargo runs a test binary there.
    pub package_dir: PathBuf,
    pub executable: PathBuf,
}

impl TestBinary {
    /// How cargo names it in its "Running" line.
    pub fn label(&self) -> String {
        match self.kind.as_str() {
            "test" => format!("{} tests/{}.rs", self.package, self.target),
            "bin" => format!("{} src/bin/{} (unittests)", self.package, self.target),
            _ => format!("{} (unittests)", self.package),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Message {
    reason: String,
    #[serde(default)]
    package_id: String,
    #[serde(default)]
    manifest_path: Option<PathBuf>,
    #[serde(default)]
    target: Option<Target>,
    #[serde(default)]
    profile: Option<Profile>,
    #[serde(default)]
    executable: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct Target {
    name: String,
    kind: Vec<String>,
    src_path: PathBuf,
}

#[derive(Debug, Deserialize)]
struct Profile {
    test: bool,
}

/// The test binaries in `cargo test --no-run --message-format=json`'s
/// output, in the order cargo built them. Lines that are not JSON (cargo's
/// rendered diagnostics) and artifacts that are not test binaries are
/// skipped.
pub fn test_binaries(cargo_json: &str) -> Vec<TestBinary> {
    cargo_json
        .lines()
        .filter_map(|line| serde_json::from_str::<Message>(line).ok())
        .filter(|m| m.reason == "compiler-artifact")
        .filter(|m| m.profile.as_ref().is_some_and(|p| p.test))
        .filter_map(|m| {
            let target = m.target?;
            let executable = m.executable?;
            let manifest = m.manifest_path?;
            Some(TestBinary {
                package: package_name(&m.package_id),
                kind: target.kind.first().cloned().unwrap_or_default(),
                target: target.name,
                src_path: target.src_path,
                package_dir: manifest.parent().map(Path::to_path_buf).unwrap_or_default(),
                executable,
            })
        })
        .collect()
}

/// The package name in a cargo package id: `path+file:///w/e2e#csiops-e2e@0.1.0`
/// (newer cargo) or `csiops-e2e 0.1.0 (path+file:///w/e2e)` (older).
fn package_name(id: &str) -> String {
    if let Some((_, tail)) = id.rsplit_once('#') {
        let name = tail.split('@').next().unwrap_or(tail);
        // `#0.1.0` alone: the name is the directory's.
        if name.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            return id
                .split('#')
                .next()
                .and_then(|p| p.rsplit('/').next())
                .unwrap_or(id)
                .to_string();
        }
        return name.to_string();
    }
    id.split(' ').next().unwrap_or(id).to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    RealNode,
    Shared,
}

/// What in a test's source says it starts a real node: the harness
/// (`csiops_e2e::realnode`) or the ones built on it, the walkthrough's and
/// the conformance bed (two real nodes).
const REAL_NODE_MARKERS: &[&str] = &["realnode", "csiops_e2e::walkthrough", "conformance::Bed"];

/// Which lane a binary runs in, from its source: an integration test that
/// names one of the [`REAL_NODE_MARKERS`].
pub fn lane(kind: &str, source: &str) -> Lane {
    if kind == "test" && REAL_NODE_MARKERS.iter().any(|m| source.contains(m)) {
        Lane::RealNode
    } else {
        Lane::Shared
    }
}

/// A Go tool only some test binaries use, built beside the lanes: its
/// script prints the path the binaries read from `env`.
#[derive(Debug, PartialEq, Eq)]
pub struct Prep {
    pub env: &'static str,
    /// Relative to the workspace root.
    pub script: &'static str,
    /// Text in a binary's source that says it needs this (besides `env`).
    also: Option<&'static str>,
}

/// In the order they are built: the e2e suite first, the longest and needed
/// by a real-node binary.
pub const PREPS: &[Prep] = &[
    Prep {
        env: "CSIOPS_E2E_SUITE",
        script: "e2e/cluster-bins/e2e-suite.sh",
        also: Some("Suite::resolve"),
    },
    Prep {
        env: "CSIOPS_HELM",
        script: "e2e/cluster-bins/helm.sh",
        also: None,
    },
    Prep {
        env: "CSIOPS_CSI_SANITY",
        script: "e2e/cluster-bins/csi-sanity.sh",
        also: None,
    },
    Prep {
        env: "CSIOPS_UPSTREAM_PROTOS",
        script: "e2e/cluster-bins/upstream-protos.sh",
        also: None,
    },
];

/// The preps a binary's source says it needs.
pub fn needs(source: &str) -> Vec<&'static Prep> {
    PREPS
        .iter()
        .filter(|p| source.contains(p.env) || p.also.is_some_and(|a| source.contains(a)))
        .collect()
}

/// A lane's binaries in running order: those that need no prep first (in
/// cargo's order), so the lane does not wait while the preps build.
pub fn order<T>(bins: Vec<(T, Vec<&'static Prep>)>) -> Vec<(T, Vec<&'static Prep>)> {
    let (ready, waiting): (Vec<_>, Vec<_>) = bins.into_iter().partition(|(_, n)| n.is_empty());
    ready.into_iter().chain(waiting).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/e2e#csiops-e2e@0.1.0","manifest_path":"/w/e2e/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"walkthrough","src_path":"/w/e2e/tests/walkthrough.rs","edition":"2021","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"0","debuginfo":1,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/w/target/debug/deps/walkthrough-1"],"executable":"/w/target/debug/deps/walkthrough-1","fresh":true}
{"reason":"compiler-artifact","package_id":"registry+https://github.com/rust-lang/crates.io-index#serde@1.0.0","manifest_path":"/r/serde/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"serde","src_path":"/r/serde/src/lib.rs"},"profile":{"test":false},"executable":null,"fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///w/crds#0.1.0","manifest_path":"/w/crds/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"csiops_crds","src_path":"/w/crds/src/lib.rs"},"profile":{"test":true},"executable":"/w/target/debug/deps/csiops_crds-2","fresh":false}
warning: unused import
{"reason":"build-finished","success":true}"#;

    #[test]
    fn only_test_binaries_are_listed_with_where_cargo_runs_them() {
        let bins = test_binaries(JSON);
        assert_eq!(bins.len(), 2, "{bins:?}");
        assert_eq!(bins[0].package, "csiops-e2e");
        assert_eq!(bins[0].target, "walkthrough");
        assert_eq!(bins[0].kind, "test");
        assert_eq!(bins[0].package_dir, PathBuf::from("/w/e2e"));
        assert_eq!(bins[0].label(), "csiops-e2e tests/walkthrough.rs");
        assert_eq!(
            bins[1].executable,
            PathBuf::from("/w/target/debug/deps/csiops_crds-2")
        );
        assert_eq!(bins[1].package, "crds");
        assert_eq!(bins[1].label(), "crds (unittests)");
    }

    #[test]
    fn package_names_in_both_id_forms() {
        assert_eq!(
            package_name("path+file:///w/e2e#csiops-e2e@0.1.0"),
            "csiops-e2e"
        );
        assert_eq!(
            package_name("csiops-e2e 0.1.0 (path+file:///w/e2e)"),
            "csiops-e2e"
        );
    }

    #[test]
    fn real_node_tests_take_their_own_lane() {
        assert_eq!(
            lane("test", "use csiops_e2e::realnode::images;"),
            Lane::RealNode
        );
        assert_eq!(
            lane("test", "let bed = conformance::Bed::start"),
            Lane::RealNode
        );
        assert_eq!(
            lane("test", "use csiops_e2e::walkthrough::{self, App};"),
            Lane::RealNode
        );
        assert_eq!(lane("test", "use csiops_e2e::Cluster;"), Lane::Shared);
        assert_eq!(
            lane("test", "let bed = ProvisionerBed::start(&cluster)"),
            Lane::Shared
        );
        // Unit tests of the harness itself mention it but start no node.
        assert_eq!(lane("lib", "pub mod realnode;"), Lane::Shared);
    }

    #[test]
    fn a_binary_needs_the_preps_its_source_names() {
        let envs = |s: &str| needs(s).iter().map(|p| p.env).collect::<Vec<_>>();
        assert_eq!(
            envs("let s = Suite::resolve()?; std::env::var_os(\"CSIOPS_HELM\")"),
            ["CSIOPS_E2E_SUITE", "CSIOPS_HELM"]
        );
        assert_eq!(envs("CSIOPS_UPSTREAM_PROTOS"), ["CSIOPS_UPSTREAM_PROTOS"]);
        assert!(envs("use csiops_e2e::Cluster;").is_empty());
    }

    #[test]
    fn every_prep_script_is_there() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for p in PREPS {
            assert!(root.join(p.script).is_file(), "{} is missing", p.script);
        }
    }

    #[test]
    fn binaries_that_wait_for_a_prep_run_last_in_their_lane() {
        let helm = &PREPS[1];
        let ordered = order(vec![
            ("a", vec![helm]),
            ("b", vec![]),
            ("c", vec![]),
            ("d", vec![helm]),
        ]);
        let names: Vec<_> = ordered.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["b", "c", "a", "d"]);
    }
}
