//! `make test`'s runner: builds every test binary of the workspace (`cargo
//! test --no-run`), runs them in two lanes (see `csiops_e2e::testrun`) with
//! the doc tests beside them, and fails if anything failed, naming what.
//!
//! Each binary's output is kept whole and printed when it ends, under the
//! line cargo would print ("Running …"), so a CI log reads as cargo's does.
//! `csiops-test-run [NAME...] [-- ARG...]`: with names, only the binaries
//! whose target or package is named run (and no doc tests); arguments
//! after `--` go to every test binary (e.g. `--include-ignored`).
//!
//! Environment: `CARGO` (default `cargo`); `CSIOPS_TEST_JOBS`, how many
//! shared-lane binaries run at once (default 1: two cores are shared with
//! the control planes the tests start).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Output, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::Instant;

use csiops_e2e::testrun::{lane, test_binaries, Lane, TestBinary};

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

    let bins = match build(&cargo) {
        Ok(bins) => bins
            .into_iter()
            .filter(|b| names.is_empty() || names.iter().any(|n| *n == b.target || *n == b.package))
            .collect::<Vec<_>>(),
        Err(e) => {
            eprintln!("csiops-test-run: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (real, shared): (Vec<_>, Vec<_>) = bins.into_iter().partition(|b| {
        let source = std::fs::read_to_string(&b.src_path).unwrap_or_default();
        lane(&b.kind, &source) == Lane::RealNode
    });
    eprintln!(
        "csiops-test-run: {} test binaries: {} in the real-node lane, {} shared ({} at a time)",
        real.len() + shared.len(),
        real.len(),
        shared.len(),
        jobs
    );

    let started = Instant::now();
    let run = Run::default();
    let shared = Mutex::new(shared.into_iter());
    thread::scope(|scope| {
        let mut workers = vec![scope.spawn(|| {
            for b in &real {
                run.binary(b, &pass);
            }
        })];
        for _ in 0..jobs {
            workers.push(scope.spawn(|| loop {
                let next = shared.lock().unwrap_or_else(|e| e.into_inner()).next();
                match next {
                    Some(b) => run.binary(&b, &pass),
                    None => break,
                }
            }));
        }
        // Doc tests beside the lanes: rustdoc compiles each one, which
        // takes minutes of CPU while the lanes mostly wait.
        if names.is_empty() {
            workers.push(scope.spawn(|| run.doc_tests(&cargo)));
        }
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

/// `cargo test --workspace --no-run`, its diagnostics shown as usual.
fn build(cargo: &str) -> Result<Vec<TestBinary>, String> {
    let mut child = Command::new(cargo)
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
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

    /// Runs one binary where cargo would (its package's directory).
    fn binary(&self, b: &TestBinary, pass: &[String]) {
        let started = Instant::now();
        let result = Command::new(&b.executable)
            .args(pass)
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

    /// `cargo test --workspace --doc`.
    fn doc_tests(&self, cargo: &str) {
        let started = Instant::now();
        let result = Command::new(cargo)
            .args(["test", "--workspace", "--doc"])
            .output();
        let header = format!(
            "   Doc-tests of the workspace [{:.0} s]",
            started.elapsed().as_secs_f64()
        );
        self.report(&header, "doc tests", result);
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
