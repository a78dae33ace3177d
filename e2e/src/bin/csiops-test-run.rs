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

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
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
    let failed = Arc::new(Mutex::new(Vec::<String>::new()));
    let out = Arc::new(Mutex::new(()));
    // Doc tests beside the lanes: rustdoc compiles each one, which takes
    // minutes of CPU while the lanes mostly wait.
    let doc = names.is_empty().then(|| {
        let (failed, out, cargo) = (failed.clone(), out.clone(), cargo.clone());
        thread::spawn(move || doc_tests(&cargo, &failed, &out))
    });
    let shared = Arc::new(Mutex::new(shared.into_iter()));
    let mut workers = Vec::new();
    {
        let (failed, out, pass) = (failed.clone(), out.clone(), pass.clone());
        workers.push(thread::spawn(move || {
            for b in real {
                run_one(&b, &pass, &failed, &out);
            }
        }));
    }
    for _ in 0..jobs {
        let (failed, out, pass, queue) =
            (failed.clone(), out.clone(), pass.clone(), shared.clone());
        workers.push(thread::spawn(move || loop {
            let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
            match next {
                Some(b) => run_one(&b, &pass, &failed, &out),
                None => break,
            }
        }));
    }
    for w in workers {
        if w.join().is_err() {
            failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push("a runner thread panicked".to_string());
        }
    }

    if doc.is_some_and(|d| d.join().is_err()) {
        failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push("the doc-test thread panicked".to_string());
    }

    let failed = failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
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

/// `cargo test --workspace --doc`, its output printed whole when it ends.
fn doc_tests(cargo: &str, failed: &Mutex<Vec<String>>, out: &Mutex<()>) {
    let started = Instant::now();
    let result = Command::new(cargo)
        .args(["test", "--workspace", "--doc"])
        .output();
    let _guard = out.lock().unwrap_or_else(|e| e.into_inner());
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(
        stdout,
        "   Doc-tests of the workspace [{:.0} s]",
        started.elapsed().as_secs_f64()
    );
    let ok = match result {
        Ok(o) => {
            let _ = stdout.write_all(&o.stdout);
            let _ = stdout.write_all(&o.stderr);
            o.status.success()
        }
        Err(e) => {
            let _ = writeln!(stdout, "could not run them: {e}");
            false
        }
    };
    let _ = stdout.flush();
    if !ok {
        failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push("doc tests".to_string());
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

/// Runs one binary where cargo would (its package's directory), keeps its
/// output, prints it whole when it ends.
fn run_one(b: &TestBinary, pass: &[String], failed: &Mutex<Vec<String>>, out: &Mutex<()>) {
    let started = Instant::now();
    let result = Command::new(&b.executable)
        .args(pass)
        .current_dir(&b.package_dir)
        .env("CARGO_MANIFEST_DIR", &b.package_dir)
        .env("CARGO_PKG_NAME", &b.package)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            // stderr on its own thread: a full pipe would stall the child.
            let mut err_pipe = child.stderr.take();
            let err = thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(e) = err_pipe.as_mut() {
                    let _ = e.read_to_end(&mut buf);
                }
                buf
            });
            let mut stdout = Vec::new();
            if let Some(o) = child.stdout.as_mut() {
                o.read_to_end(&mut stdout)?;
            }
            let status = child.wait()?;
            let stderr = err.join().unwrap_or_default();
            Ok((status, stdout, stderr))
        });
    let secs = started.elapsed().as_secs_f64();
    let _guard = out.lock().unwrap_or_else(|e| e.into_inner());
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(
        stdout,
        "     Running {} ({}) [{secs:.0} s]",
        b.label(),
        display(&b.executable)
    );
    match result {
        Ok((status, o, e)) => {
            let _ = stdout.write_all(&o);
            let _ = stdout.write_all(&e);
            if !status.success() {
                failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!("{} ({status})", b.label()));
            }
        }
        Err(e) => {
            let _ = writeln!(stdout, "could not run it: {e}");
            failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("{} (not run: {e})", b.label()));
        }
    }
    let _ = stdout.flush();
}

fn display(p: &Path) -> String {
    p.display().to_string()
}
