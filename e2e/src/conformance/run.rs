//! Running the suite the way kubernetes-csi's prow jobs do
//! (csi-release-tools `prow.sh`), and reading its result.
//!
//! prow.sh runs, against one cluster:
//! - parallel: focus `External.Storage`, skip `\[Serial\]`, `\[Disruptive\]`
//!   and the alpha tests `\[Feature:`;
//! - parallel-features: the non-alpha feature-tagged tests, focus
//!   `External.Storage.*(\[Feature:VolumeSnapshotDataSource\])`, skip
//!   `\[Serial\]|\[Disruptive\]`;
//! - serial: focus `External.Storage.*(\[Serial\]|\[Disruptive\])`, skip
//!   `\[Feature:` and its `Disruptive` skip (those tests stop kubelets
//!   through SSH).
//!
//! Each run is one `ginkgo` invocation of `e2e.test` with every driver
//! definition; ginkgo writes a JUnit and a JSON report, the JSON one is
//! read back here ([`RunReport`]) and counted per driver definition.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::drivers::DriverSetup;
use super::suite::Suite;
use crate::error::{io, Error, Result};

/// One ginkgo invocation.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// Name of the run and of its report files (`<name>.junit.xml`, …).
    pub name: String,
    pub focus: String,
    pub skip: Option<String>,
    /// Ginkgo processes (`--procs`; 1 runs serially).
    pub procs: usize,
    /// ginkgo's `--timeout` for the whole run.
    pub timeout: Duration,
}

const SERIAL: &str = r"\[Serial\]|\[Disruptive\]";
const ALPHA: &str = r"\[Feature:";
/// Non-alpha features run explicitly (prow.sh's `CSI_PROW_E2E_FOCUS`).
const FEATURES: &str = r"\[Feature:VolumeSnapshotDataSource\]";

impl RunPlan {
    /// This run narrowed to the specs that also match `regex` (ginkgo
    /// matches `--focus` against the whole spec text).
    pub fn narrowed(mut self, regex: &str) -> RunPlan {
        self.focus = format!("{}.*{regex}", self.focus);
        self
    }

    /// prow.sh's parallel run.
    pub fn parallel(procs: usize) -> RunPlan {
        RunPlan {
            name: "parallel".into(),
            focus: "External.Storage".into(),
            skip: Some(format!("{SERIAL}|{ALPHA}")),
            procs,
            timeout: Duration::from_secs(3 * 3600),
        }
    }

    /// prow.sh's parallel run of the non-alpha feature-tagged tests.
    pub fn parallel_features(procs: usize) -> RunPlan {
        RunPlan {
            name: "parallel-features".into(),
            focus: format!("External.Storage.*({FEATURES})"),
            skip: Some(SERIAL.into()),
            procs,
            timeout: Duration::from_secs(3 * 3600),
        }
    }

    /// prow.sh's serial run.
    pub fn serial() -> RunPlan {
        RunPlan {
            name: "serial".into(),
            focus: format!("External.Storage.*({SERIAL})"),
            skip: Some(format!("{ALPHA}|Disruptive")),
            procs: 1,
            timeout: Duration::from_secs(3 * 3600),
        }
    }
}

/// Where a run's files go.
#[derive(Debug, Clone)]
pub struct RunFiles {
    pub junit: PathBuf,
    pub json: PathBuf,
    pub log: PathBuf,
}

impl RunFiles {
    pub fn new(out_dir: &Path, name: &str) -> RunFiles {
        RunFiles {
            junit: out_dir.join(format!("{name}.junit.xml")),
            json: out_dir.join(format!("{name}.json")),
            log: out_dir.join(format!("{name}.log")),
        }
    }
}

/// The command line of a run: `ginkgo [flags] e2e.test -- [e2e flags]`.
pub fn command(
    suite: &Suite,
    plan: &RunPlan,
    drivers: &[DriverSetup],
    kubeconfig: &Path,
    repo_root: &Path,
    files: &RunFiles,
) -> (PathBuf, Vec<String>) {
    let mut args = vec![
        "run".to_string(),
        format!("--procs={}", plan.procs.max(1)),
        format!("--focus={}", plan.focus),
        format!("--timeout={}s", plan.timeout.as_secs()),
        "--no-color".into(),
        "--silence-skips".into(),
        format!("--junit-report={}", files.junit.display()),
        format!("--json-report={}", files.json.display()),
    ];
    if plan.procs > 1 {
        args.push("-p".into());
    }
    if let Some(skip) = &plan.skip {
        args.push(format!("--skip={skip}"));
    }
    args.push(suite.e2e_test().display().to_string());
    args.push("--".into());
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    // The definitions' StorageClass files are relative to it.
    args.push(format!("--repo-root={}", repo_root.display()));
    for d in drivers {
        args.push(format!("-storage.testdriver={}", d.definition().display()));
    }
    (suite.ginkgo(), args)
}

/// Runs `plan` (blocking: call it from `spawn_blocking`), its output in
/// `files.log`; returns its report. ginkgo's own exit status is not the
/// verdict (it is non-zero for any failed spec): the report is.
pub fn run(
    suite: &Suite,
    plan: &RunPlan,
    drivers: &[DriverSetup],
    kubeconfig: &Path,
    repo_root: &Path,
    files: &RunFiles,
) -> Result<RunReport> {
    let (program, args) = command(suite, plan, drivers, kubeconfig, repo_root, files);
    let log = std::fs::File::create(&files.log).map_err(io("creating", &files.log))?;
    let err = log.try_clone().map_err(io("opening", &files.log))?;
    let status = std::process::Command::new(&program)
        .args(&args)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBE_TEST_REPO_LIST", suite.repo_list())
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err)
        .status()
        .map_err(io("running", &program))?;
    let report = RunReport::read(&files.json).map_err(|e| {
        Error::Other(format!(
            "ginkgo ({status}) left no readable report: {e}; see {}",
            files.log.display()
        ))
    })?;
    tracing::info!(run = %plan.name, %status, "ginkgo done");
    Ok(report)
}

/// Ginkgo's JSON report: one entry per suite run.
/// (Go writes a nil slice as `null`, hence the `Option`s.)
#[derive(Debug, Deserialize)]
struct GinkgoReport {
    #[serde(rename = "SpecReports", default)]
    spec_reports: Option<Vec<SpecReport>>,
}

#[derive(Debug, Deserialize, Clone)]
struct SpecReport {
    #[serde(rename = "ContainerHierarchyTexts", default)]
    containers: Option<Vec<String>>,
    #[serde(rename = "LeafNodeText", default)]
    leaf: String,
    #[serde(rename = "LeafNodeType", default)]
    leaf_type: String,
    #[serde(rename = "State", default)]
    state: String,
    #[serde(rename = "RunTime", default)]
    run_time_ns: i64,
    #[serde(rename = "Failure", default)]
    failure: Option<Failure>,
}

#[derive(Debug, Deserialize, Clone, Default)]
struct Failure {
    #[serde(rename = "Message", default)]
    message: String,
}

/// What happened to one spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Passed,
    Failed,
    /// Skipped while running (the driver lacks a capability, the pattern
    /// does not apply …): a message says why.
    Skipped,
    /// Not selected by the run's focus and skip.
    NotSelected,
}

/// One spec of a run.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub outcome: Outcome,
    pub message: String,
    pub run_time: Duration,
}

/// A run's specs (the `It`s; set-up nodes are left out unless they failed).
#[derive(Debug, Clone, Default)]
pub struct RunReport {
    pub specs: Vec<Spec>,
    /// Failed suite-level nodes (BeforeSuite, AfterSuite, …).
    pub suite_failures: Vec<String>,
}

/// Counts of one driver definition in one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Counts {
    pub fn ran(&self) -> usize {
        self.passed + self.failed
    }
}

impl RunReport {
    pub fn read(path: &Path) -> Result<RunReport> {
        let text = std::fs::read_to_string(path).map_err(io("reading", path))?;
        RunReport::parse(&text)
    }

    pub fn parse(json: &str) -> Result<RunReport> {
        let reports: Vec<GinkgoReport> = serde_json::from_str(json)
            .map_err(|e| Error::Other(format!("ginkgo's JSON report: {e}")))?;
        let mut out = RunReport::default();
        for r in reports {
            for s in r.spec_reports.unwrap_or_default() {
                let message = s.failure.clone().unwrap_or_default().message;
                let failed = matches!(
                    s.state.as_str(),
                    "failed" | "panicked" | "timedout" | "interrupted" | "aborted"
                );
                if s.leaf_type != "It" {
                    if failed {
                        out.suite_failures
                            .push(format!("{} ({}): {message}", s.leaf_type, s.state));
                    }
                    continue;
                }
                let outcome = match s.state.as_str() {
                    "passed" => Outcome::Passed,
                    "skipped" if message.is_empty() => Outcome::NotSelected,
                    "skipped" => Outcome::Skipped,
                    "pending" => Outcome::NotSelected,
                    _ => Outcome::Failed,
                };
                let mut name = s.containers.clone().unwrap_or_default().join(" ");
                name.push(' ');
                name.push_str(&s.leaf);
                out.specs.push(Spec {
                    name,
                    outcome,
                    message,
                    run_time: Duration::from_nanos(u64::try_from(s.run_time_ns).unwrap_or(0)),
                });
            }
        }
        Ok(out)
    }

    /// The specs of one driver definition (`[Driver: …]` in their name).
    pub fn of<'a>(&'a self, driver: &'a DriverSetup) -> impl Iterator<Item = &'a Spec> + 'a {
        let tag = driver.tag();
        self.specs.iter().filter(move |s| s.name.contains(&tag))
    }

    pub fn counts(&self, driver: &DriverSetup) -> Counts {
        let mut c = Counts::default();
        for s in self.of(driver) {
            match s.outcome {
                Outcome::Passed => c.passed += 1,
                Outcome::Failed => c.failed += 1,
                Outcome::Skipped => c.skipped += 1,
                Outcome::NotSelected => {}
            }
        }
        c
    }

    /// One line per driver (`central: 120 passed, 0 failed, 80 skipped`)
    /// and one per failed spec.
    pub fn summary(&self, title: &str, drivers: &[DriverSetup]) -> String {
        let mut text = String::new();
        for d in drivers {
            let c = self.counts(d);
            text.push_str(&format!(
                "{title:<18} {:<11} {:>4} passed {:>4} failed {:>4} skipped\n",
                d.name, c.passed, c.failed, c.skipped
            ));
        }
        for f in &self.suite_failures {
            text.push_str(&format!("  SUITE FAILED: {f}\n"));
        }
        for s in self.specs.iter().filter(|s| s.outcome == Outcome::Failed) {
            let first = s.message.lines().next().unwrap_or_default();
            text.push_str(&format!("  FAILED: {}\n          {first}\n", s.name));
        }
        text
    }

    /// Why specs were skipped while running, with how many each.
    pub fn skip_reasons(&self, driver: &DriverSetup) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for s in self.of(driver).filter(|s| s.outcome == Outcome::Skipped) {
            let reason = s.message.lines().next().unwrap_or_default().to_string();
            *m.entry(reason).or_insert(0) += 1;
        }
        m
    }
}

/// How a run shows that the suite read a capability: a spec that runs only
/// with it (`Ran`), or a spec skipped because of it (`SkippedBy`, for the
/// ones that turn specs off). The substrings are spec names and skip
/// messages of test/e2e/storage/testsuites at K8S_VERSION.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    Ran(&'static str),
    SkippedBy(&'static str),
}

/// The evidence of each capability (its `Cap*` gate in the testsuites).
pub fn evidence(capability: &str) -> Option<Evidence> {
    use Evidence::{Ran, SkippedBy};
    Some(match capability {
        // volumes.go: "should store data" checks the data again from a new
        // pod only with persistence.
        "persistence" => Ran("] volumes should store data"),
        "block" => Ran("(block volmode)]"),
        "fsGroup" => Ran("] fsgroupchangepolicy"),
        "exec" => Ran("should allow exec of files on the volume"),
        "snapshotDataSource" => Ran("] snapshottable "),
        "pvcDataSource" => Ran("with pvc data source"),
        "multipods" => Ran("concurrently access the single volume from pods on the same node"),
        "RWX" => Ran("concurrently access the single volume from pods on different node"),
        "capReadOnlyMany" => Ran("(ROX mode)"),
        "topology" => Ran("] topology "),
        "capacity" => Ran("] capacity "),
        "readWriteOncePod" => Ran("] read-write-once-pod "),
        "multiplePVsSameID" => Ran("should mount multiple PV pointing to the same storage"),
        "singleNodeVolume" => SkippedBy("singleNodeVolume"),
        "FSResizeFromSourceNotSupported" => SkippedBy("does not support filesystem resizing"),
        _ => return None,
    })
}

/// For each capability, how many specs of `driver` across `reports` show
/// that it was read (0: none did, so the key may as well be absent).
pub fn capability_counts(
    reports: &[RunReport],
    driver: &DriverSetup,
    capabilities: &[String],
) -> Vec<(String, Option<usize>)> {
    capabilities
        .iter()
        .map(|cap| {
            let n = evidence(cap).map(|e| {
                reports
                    .iter()
                    .flat_map(|r| r.of(driver))
                    .filter(|s| match e {
                        Evidence::Ran(name) => {
                            matches!(s.outcome, Outcome::Passed | Outcome::Failed)
                                && s.name.contains(name)
                        }
                        Evidence::SkippedBy(msg) => {
                            s.outcome == Outcome::Skipped && s.message.contains(msg)
                        }
                    })
                    .count()
            });
            (cap.clone(), n)
        })
        .collect()
}

/// The capabilities a definition declares true (`DriverInfo.Capabilities`).
pub fn declared_capabilities(definition: &str) -> Result<Vec<String>> {
    let doc: serde_yaml::Value = serde_yaml::from_str(definition)
        .map_err(|e| Error::Other(format!("the driver definition is not YAML: {e}")))?;
    Ok(doc
        .get("DriverInfo")
        .and_then(|d| d.get("Capabilities"))
        .and_then(|c| c.as_mapping())
        .map(|m| {
            m.iter()
                .filter(|(_, v)| v.as_bool() == Some(true))
                .filter_map(|(k, _)| k.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::drivers::{CENTRAL, NODE_LOCAL};

    const JSON: &str = r#"[{"SuiteDescription":"Kubernetes e2e suite","SpecReports":[
      {"ContainerHierarchyTexts":null,"LeafNodeType":"SynchronizedBeforeSuite","State":"passed"},
      {"ContainerHierarchyTexts":["[sig-storage] External Storage [Driver: central.test.csi.csiops.dev]","[Testpattern: Dynamic PV (default fs)] provisioning"],
       "LeafNodeText":"should provision storage with defaults","LeafNodeType":"It","State":"passed","RunTime":2000000000},
      {"ContainerHierarchyTexts":["[sig-storage] External Storage [Driver: central.test.csi.csiops.dev]","[Testpattern: Dynamic PV (block volmode)] volumeLimits"],
       "LeafNodeText":"should support volume limits","LeafNodeType":"It","State":"skipped","Failure":{"Message":"Driver does not support volume limits"}},
      {"ContainerHierarchyTexts":["[sig-storage] External Storage [Driver: local.test.csi.csiops.dev]","[Testpattern: Dynamic PV (default fs)] volumes"],
       "LeafNodeText":"should store data","LeafNodeType":"It","State":"failed","Failure":{"Message":"timed out\nmore"}},
      {"ContainerHierarchyTexts":["[sig-storage] External Storage [Driver: local.test.csi.csiops.dev]","x"],
       "LeafNodeText":"[Serial] not selected","LeafNodeType":"It","State":"skipped"}
    ]}]"#;

    #[test]
    fn a_report_is_counted_per_driver() {
        let r = RunReport::parse(JSON).unwrap();
        assert_eq!(
            r.counts(&CENTRAL),
            Counts {
                passed: 1,
                failed: 0,
                skipped: 1
            }
        );
        assert_eq!(
            r.counts(&NODE_LOCAL),
            Counts {
                passed: 0,
                failed: 1,
                skipped: 0
            }
        );
        assert!(r.suite_failures.is_empty());
        let s = r.summary("parallel", &[CENTRAL, NODE_LOCAL]);
        assert!(
            s.contains("FAILED: [sig-storage] External Storage [Driver: local"),
            "{s}"
        );
        assert!(s.contains("timed out") && !s.contains("more"), "{s}");
        assert_eq!(
            r.skip_reasons(&CENTRAL).into_iter().collect::<Vec<_>>(),
            [("Driver does not support volume limits".to_string(), 1)]
        );
    }

    #[test]
    fn capabilities_are_shown_by_the_specs_they_turn_on_or_off() {
        let r = RunReport::parse(JSON).unwrap();
        let caps = vec![
            "block".to_string(),
            "persistence".into(),
            "frobnicate".into(),
        ];
        assert_eq!(
            capability_counts(std::slice::from_ref(&r), &CENTRAL, &caps),
            [
                ("block".to_string(), Some(0)),
                ("persistence".to_string(), Some(0)),
                ("frobnicate".to_string(), None)
            ]
        );
        assert_eq!(
            capability_counts(&[r], &NODE_LOCAL, &caps[1..2]),
            [("persistence".to_string(), Some(1))]
        );
        let def = "DriverInfo:\n  Capabilities:\n    block: true\n    exec: false\n";
        assert_eq!(declared_capabilities(def).unwrap(), ["block"]);
    }

    #[test]
    fn the_runs_follow_prow() {
        let p = RunPlan::parallel(3);
        assert_eq!(p.focus, "External.Storage");
        assert_eq!(
            p.skip.as_deref(),
            Some(r"\[Serial\]|\[Disruptive\]|\[Feature:")
        );
        let s = RunPlan::serial();
        assert_eq!(s.procs, 1);
        assert!(s.focus.contains(r"\[Serial\]"));
        assert!(RunPlan::parallel_features(2)
            .focus
            .contains("VolumeSnapshotDataSource"));
    }
}
