//! `make test`'s runner: runs the workspace's integration-test binaries,
//! which `make test` built, in two lanes (see `csiops_e2e::testrun`); beside
//! them, at idle priority, builds the preps some binaries wait for and the
//! unit-test binaries (which then join the shared lane), runs the lint and
//! the doc tests; and fails if anything failed, naming what.
//!
//! Each binary's output is kept whole and printed when it ends, under the
//! line cargo would print ("Running …"), so a CI log reads as cargo's does.
//! `csiops-test-run [NAME...] [-- ARG...]`: with names, only the binaries
//! whose target or package is named run (with the preps they need, without
//! the doc tests and the lint); arguments after `--` go to every test
//! binary (e.g. `--include-ignored`).
//!
//! Environment: `CARGO` (default `cargo`); `CSIOPS_TEST_JOBS`, how many
//! shared-lane binaries run at once (default 1: two cores are shared with
//! the control planes the tests start). A prep's variable already set (e.g.
//! `CSIOPS_E2E_SUITE`) is used as it is, and that prep is not built.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, ExitCode, Output, Stdio};
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::Instant;

use csiops_e2e::testrun::{lane, needs, order, test_binaries, Lane, Prep, TestBinary, PREPS};

/// A binary with the preps it waits for.
type Entry = (TestBinary, Vec<&'static Prep>);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (names, pass) = match args.iter().position(|a| a == "--") {
        Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
        None => (args, Vec::new()),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let jobs = std::env::var("CSIOPS_TEST_JOBS")
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .filter(|j| *j > 0)
        .unwrap_or(1);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    // The named binaries (all without names), each with its lane and the
    // preps it needs, both read from its source.
    let selected = |bins: Vec<TestBinary>| -> Vec<(Lane, Entry)> {
        bins.into_iter()
            .filter(|b| names.is_empty() || names.iter().any(|n| *n == b.target || *n == b.package))
            .map(|b| {
                let source = std::fs::read_to_string(&b.src_path).unwrap_or_default();
                (lane(&b.kind, &source), (b, needs(&source)))
            })
            .collect()
    };

    // The integration tests (every e2e test among them), which `make test`
    // built before: the lanes start on them at once.
    let integration = match build(&cargo, INTEGRATION_TESTS, false) {
        Ok(bins) => selected(bins),
        Err(e) => {
            eprintln!("csiops-test-run: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (real, shared): (Vec<_>, Vec<_>) = integration
        .into_iter()
        .partition(|(lane, _)| *lane == Lane::RealNode);
    let real = order(real.into_iter().map(|(_, e)| e).collect());
    let shared: Vec<Entry> = shared.into_iter().map(|(_, e)| e).collect();
    // The preps some selected binary needs and the environment does not
    // already name. (Unit-test binaries need none.)
    let wanted: Vec<&'static Prep> = PREPS
        .iter()
        .filter(|p| real.iter().chain(&shared).any(|(_, n)| n.contains(p)))
        .filter(|p| std::env::var_os(p.env).is_none_or(|v| v.is_empty()))
        .collect();
    let beside: Vec<&str> = std::iter::once("the unit-test binaries")
        .chain(wanted.iter().map(|p| p.env))
        .chain(names.is_empty().then_some("lint, doc tests"))
        .collect();
    eprintln!(
        "csiops-test-run: {} integration test binaries: {} in the real-node lane, {} shared ({} at a time); beside them, at idle priority: {}",
        real.len() + shared.len(),
        real.len(),
        shared.len(),
        jobs,
        beside.join(", ")
    );

    let started = Instant::now();
    let run = Run::default();
    let preps = Preps::default();
    let queue = Shared::new(order(shared));
    thread::scope(|scope| {
        let mut workers = vec![scope.spawn(|| {
            for (b, needed) in &real {
                run.binary(b, needed, &preps, &pass);
            }
        })];
        for _ in 0..jobs {
            workers.push(scope.spawn(|| {
                while let Some((b, needed)) = queue.next() {
                    run.binary(&b, &needed, &preps, &pass);
                }
            }));
        }
        // At idle priority: the lanes mostly wait on control planes and
        // kubelets, and these only fill the CPU they leave. The Go preps
        // first (real-node binaries at the end of their lane wait for them).
        workers.push(scope.spawn(|| {
            for p in &wanted {
                preps.build(p, &root, &run);
            }
        }));
        // The unit-test binaries join the shared lane once built; then the
        // lint and the doc tests (cargo runs one of these at a time).
        workers.push(scope.spawn(|| {
            match build(&cargo, UNIT_TESTS, true) {
                // Unit-test binaries are never in the real-node lane.
                Ok(bins) => queue.add(selected(bins).into_iter().map(|(_, e)| e).collect()),
                Err(e) => run.fail(format!("building the unit tests: {e}")),
            }
            queue.close();
            if names.is_empty() {
                run.lint(&cargo);
                run.doc_tests(&cargo);
            }
        }));
        for w in workers {
            if w.join().is_err() {
                run.fail("a runner thread panicked".to_string());
            }
        }
    });

    let failed = run.failed.into_inner().unwrap_or_else(|e| e.into_inner());
    eprintln!(
        "csiops-test-run: finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("csiops-test-run: {} failed:", failed.len());
        for f in &failed {
            eprintln!("    {f}");
        }
        ExitCode::from(101)
    }
}

/// `cargo test --no-run` target selections: the integration tests (what
/// `make test` builds before the runner), and the crates' and binaries'
/// own unit tests (built beside the lanes).
const INTEGRATION_TESTS: &[&str] = &["--test", "*"];
const UNIT_TESTS: &[&str] = &["--lib", "--bins"];

/// The shared lane's queue, which grows once the unit-test binaries are
/// built: workers wait on it until it is closed and empty.
struct Shared {
    state: Mutex<(VecDeque<Entry>, bool)>,
    changed: Condvar,
}

impl Shared {
    fn new(entries: Vec<Entry>) -> Shared {
        Shared {
            state: Mutex::new((entries.into(), true)),
            changed: Condvar::new(),
        }
    }

    /// Adds binaries that wait for no prep ahead of those that do.
    fn add(&self, entries: Vec<Entry>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<Entry> = state.0.drain(..).collect();
        all.extend(entries);
        state.0 = order(all).into();
        self.changed.notify_all();
    }

    fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = false;
        self.changed.notify_all();
    }

    /// The next binary; `None` once closed and empty.
    fn next(&self) -> Option<Entry> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(entry) = state.0.pop_front() {
                return Some(entry);
            }
            if !state.1 {
                return None;
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// `cmd` at idle CPU and I/O priority.
fn idle(program: &str) -> Command {
    let mut c = Command::new("nice");
    c.args(["-n", "19", "ionice", "-c", "3", program]);
    c
}

/// The preps built so far: the value of each one's variable, or `None` if
/// its script failed. Lanes wait on `built` for the ones they need.
#[derive(Default)]
struct Preps {
    done: Mutex<BTreeMap<&'static str, Option<String>>>,
    built: Condvar,
}

impl Preps {
    fn build(&self, p: &'static Prep, root: &Path, run: &Run) {
        let started = Instant::now();
        let result = idle("bash")
            .arg(root.join(p.script))
            .stdin(Stdio::null())
            .output();
        let value = match &result {
            Ok(o) if o.status.success() => {
                let path = String::from_utf8_lossy(&o.stdout).trim().to_string();
                (!path.is_empty() && !path.contains('\n')).then_some(path)
            }
            _ => None,
        };
        let header = format!(
            "        Prep {} ({}) [{:.0} s]",
            p.env,
            p.script,
            started.elapsed().as_secs_f64()
        );
        run.report(&header, p.script, result);
        if value.is_none() {
            run.fail(format!("{} printed no path", p.script));
        }
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p.env, value);
        self.built.notify_all();
    }

    /// The prep's value once built (`None`: it failed); at once when the
    /// environment already names it.
    fn wait(&self, p: &Prep) -> Option<String> {
        if let Some(v) = std::env::var_os(p.env).filter(|v| !v.is_empty()) {
            return Some(v.to_string_lossy().into_owned());
        }
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(v) = done.get(p.env) {
                return v.clone();
            }
            done = self.built.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// `cargo test --workspace --no-run` of `selection`, its diagnostics shown
/// as usual (`idle`: at idle priority).
fn build(cargo: &str, selection: &[&str], idle_priority: bool) -> Result<Vec<TestBinary>, String> {
    let mut command = if idle_priority {
        idle(cargo)
    } else {
        Command::new(cargo)
    };
    let mut child = command
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(selection)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {cargo}: {e}"))?;
    let mut json = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("reading cargo's output: {e}"))?;
            json.push_str(&line);
            json.push('\n');
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo test --no-run failed ({status})"));
    }
    let bins = test_binaries(&json);
    if bins.is_empty() {
        return Err("cargo built no test binary".to_string());
    }
    Ok(bins)
}

/// What the lanes share: the failures so far, and the terminal, so that
/// each binary's output is printed in one piece.
#[derive(Default)]
struct Run {
    failed: Mutex<Vec<String>>,
    out: Mutex<()>,
}

impl Run {
    fn fail(&self, what: String) {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(what);
    }

    /// Runs one binary where cargo would (its package's directory), once
    /// the preps it needs are built.
    fn binary(&self, b: &TestBinary, needed: &[&'static Prep], preps: &Preps, pass: &[String]) {
        let mut env = Vec::new();
        for p in needed {
            match preps.wait(p) {
                Some(v) => env.push((p.env, v)),
                None => {
                    self.fail(format!("{} (not run: {} failed)", b.label(), p.script));
                    return;
                }
            }
        }
        let started = Instant::now();
        let result = Command::new(&b.executable)
            .args(pass)
            .envs(env)
            .current_dir(&b.package_dir)
            .env("CARGO_MANIFEST_DIR", &b.package_dir)
            .env("CARGO_PKG_NAME", &b.package)
            .output();
        let header = format!(
            "     Running {} ({}) [{:.0} s]",
            b.label(),
            b.executable.display(),
            started.elapsed().as_secs_f64()
        );
        self.report(&header, &b.label(), result);
    }

    /// `cargo test --workspace --doc`, at idle priority: rustdoc compiles
    /// each one, minutes of CPU nothing waits for.
    fn doc_tests(&self, cargo: &str) {
        let started = Instant::now();
        let result = idle(cargo).args(["test", "--workspace", "--doc"]).output();
        let header = format!(
            "   Doc-tests of the workspace [{:.0} s]",
            started.elapsed().as_secs_f64()
        );
        self.report(&header, "doc tests", result);
    }

    /// `make lint`'s two checks.
    fn lint(&self, cargo: &str) {
        let checks: [&[&str]; 2] = [
            &["fmt", "--all", "--", "--check"],
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ];
        for args in checks {
            let started = Instant::now();
            let result = idle(cargo).args(args).output();
            let what = format!("cargo {}", args.join(" "));
            let header = format!(
                "        Lint {what} [{:.0} s]",
                started.elapsed().as_secs_f64()
            );
            self.report(&header, &what, result);
        }
    }

    /// Prints `header` and the whole output; records `what` if it failed.
    fn report(&self, header: &str, what: &str, result: std::io::Result<Output>) {
        let _guard = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{header}");
        match result {
            Ok(o) => {
                let _ = stdout.write_all(&o.stdout);
                let _ = stdout.write_all(&o.stderr);
                if !o.status.success() {
                    self.fail(format!("{what} ({})", o.status));
                }
            }
            Err(e) => {
                let _ = writeln!(stdout, "could not run it: {e}");
                self.fail(format!("{what} (not run: {e})"));
            }
        }
        let _ = stdout.flush();
    }
}
