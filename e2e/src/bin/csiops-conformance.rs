//! `make conformance`: Kubernetes' own storage e2e suite ("External
//! Storage") against the drivers csiops deploys (`e2e/conformance/`), on a
//! local control plane with two real nodes, run the way kubernetes-csi's
//! prow jobs run it: the parallel run, the parallel run of the non-alpha
//! feature-tagged tests (snapshots), then the serial one. Prints passed,
//! failed and skipped per driver definition and run, and keeps the JUnit
//! and JSON reports and the logs.
//!
//! ```text
//! csiops-conformance [--out DIR] [--procs N] [--drivers central,node-local,hostpath]
//!                    [--runs parallel,parallel-features,serial]
//!                    [--deploy-with FILE [--image ARCHIVE]…] [--focus REGEX]
//! csiops-conformance --summarize [--out DIR] [--drivers …] [--runs …]
//! ```
//! `--summarize` only reads the JSON reports an earlier run left in `--out`.
//! `--drivers` defaults to central and node-local; `hostpath` (upstream's
//! hostpathplugin, its image named by `CSIOPS_HOSTPATHPLUGIN_IMAGE`) runs
//! only when named. `--deploy-with FILE` deploys the one driver named by
//! `--drivers` with FILE instead of its CSIDriverDeployment (the same
//! `${…}` placeholders are filled in), to run the same suite against
//! another deployment of it, such as upstream's own manifests; each
//! `--image` is an OCI archive of an image FILE names, loaded into both
//! nodes. `--focus REGEX` narrows every run to the specs that also match
//! REGEX (to look into one test; the capability check then says `?`).
//! `--out` defaults to `$CSIOPS_CONFORMANCE_OUT` or `target/conformance`;
//! `--procs` (ginkgo processes of the parallel runs) to 4. Prints, per
//! driver, how many specs showed each declared capability read (a spec it
//! turned on ran, or one it turned off was skipped for it). Exits non-zero
//! if any spec failed, a definition key was not read (before the runs: not
//! in what e2e.test loaded; after all three runs: no spec showed it), or
//! the teardown left something behind. `CSIOPS_E2E_KEEP=1` keeps the
//! cluster dir (all logs).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use csiops_e2e::conformance::{
    definition, drivers, run, Bed, Deploy, DriverSetup, RunPlan, RunReport, Suite,
};

struct Args {
    /// Only read the reports of an earlier run in `out` and summarise them.
    summarize: bool,
    out: PathBuf,
    procs: usize,
    drivers: Vec<DriverSetup>,
    runs: Vec<String>,
    deploy: Deploy,
    /// Narrows every run to the specs that also match this regex.
    focus: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        summarize: false,
        out: std::env::var_os("CSIOPS_CONFORMANCE_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|| csiops_e2e::testkit::workspace_root().join("target/conformance")),
        procs: 4,
        drivers: drivers::ALL.to_vec(),
        runs: vec![
            "parallel".into(),
            "parallel-features".into(),
            "serial".into(),
        ],
        deploy: Deploy::Operator,
        focus: None,
    };
    let (mut deploy_with, mut images) = (None, Vec::new());
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--out" => args.out = PathBuf::from(value()?),
            "--procs" => args.procs = value()?.parse().map_err(|e| format!("--procs: {e}"))?,
            "--drivers" => {
                args.drivers = value()?
                    .split(',')
                    .map(|n| {
                        drivers::KNOWN
                            .into_iter()
                            .find(|d| d.name == n)
                            .ok_or_else(|| {
                                format!("no driver {n:?} (central, node-local, hostpath)")
                            })
                    })
                    .collect::<Result<_, _>>()?
            }
            "--runs" => args.runs = value()?.split(',').map(String::from).collect(),
            "--deploy-with" => deploy_with = Some(PathBuf::from(value()?)),
            "--image" => images.push(PathBuf::from(value()?)),
            "--focus" => args.focus = Some(value()?),
            "--summarize" => args.summarize = true,
            "-h" | "--help" => {
                return Err("usage: csiops-conformance [--out DIR] [--procs N] \
                     [--drivers central,node-local,hostpath] [--runs parallel,parallel-features,serial] \
                     [--deploy-with FILE [--image ARCHIVE]…] [--focus REGEX]"
                    .into())
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match deploy_with {
        Some(file) => args.deploy = Deploy::Manifest { file, images },
        None if !images.is_empty() => return Err("--image goes with --deploy-with".into()),
        None => {}
    }
    for r in &args.runs {
        if !["parallel", "parallel-features", "serial"].contains(&r.as_str()) {
            return Err(format!(
                "no run {r:?} (parallel, parallel-features, serial)"
            ));
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match conformance(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("conformance failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn conformance(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    if args.summarize {
        return summarize(args);
    }
    let started = Instant::now();
    std::fs::create_dir_all(&args.out)?;
    let suite = Suite::resolve()?;
    let known: std::collections::BTreeSet<String> =
        std::fs::read_to_string(suite.dir().join("capabilities.txt"))?
            .lines()
            .map(String::from)
            .collect();
    let mut ok = true;
    for d in &args.drivers {
        let problems = definition::check_file(&suite.e2e_test(), &known, &d.definition())?;
        for p in &problems {
            eprintln!("{}: {p}", d.definition().display());
        }
        ok &= problems.is_empty();
    }
    if !ok {
        return Ok(false);
    }

    eprintln!(
        "==> a control plane, two real nodes, the operator and {} driver(s)",
        args.drivers.len()
    );
    let bed = Bed::start(suite, &args.drivers, args.deploy.clone()).await?;
    eprintln!(
        "    ready in {:.0}s; KUBECONFIG={}",
        started.elapsed().as_secs_f64(),
        bed.cluster.kubeconfig_path().display()
    );
    let mut summary = String::new();
    let mut reports = Vec::new();
    for name in &args.runs {
        let plan = match name.as_str() {
            "parallel" => RunPlan::parallel(args.procs),
            "parallel-features" => RunPlan::parallel_features(args.procs),
            _ => RunPlan::serial(),
        };
        let plan = match &args.focus {
            Some(f) => plan.narrowed(f),
            None => plan,
        };
        eprintln!(
            "==> {name}: ginkgo --procs={} --focus={:?} --skip={:?}",
            plan.procs,
            plan.focus,
            plan.skip.as_deref().unwrap_or("")
        );
        let t = Instant::now();
        let report = bed.run(&plan, &args.out).await?;
        let text = report.summary(name, &args.drivers);
        eprintln!("    {:.0}s\n{text}", t.elapsed().as_secs_f64());
        summary.push_str(&text);
        ok &= report.suite_failures.is_empty()
            && args.drivers.iter().all(|d| report.counts(d).failed == 0);
        for d in &args.drivers {
            let reasons = report.skip_reasons(d);
            let path = args.out.join(format!("{name}.{}.skipped.txt", d.name));
            let body: String = reasons
                .iter()
                .map(|(r, n)| format!("{n:>4}  {r}\n"))
                .collect();
            std::fs::write(&path, body)?;
        }
        reports.push(report);
    }
    ok &= capability_lines(args, &reports, &mut summary)?;
    eprintln!("==> tearing down");
    let left = bed.stop().await?;
    for l in &left {
        eprintln!("LEFT BEHIND: {l}");
    }
    ok &= left.is_empty();
    std::fs::write(args.out.join("summary.txt"), &summary)?;
    println!("{summary}");
    println!(
        "reports: {} ({:.0} min in all)",
        args.out.display(),
        started.elapsed().as_secs_f64() / 60.0
    );
    Ok(ok)
}

/// Every declared capability must show in the specs that ran (or, for the
/// ones that turn specs off, in why specs were skipped): a key the suite did
/// not read would not. One line per driver into `summary`; false if, after
/// all three runs, a capability showed in no spec.
fn capability_lines(
    args: &Args,
    reports: &[RunReport],
    summary: &mut String,
) -> Result<bool, Box<dyn std::error::Error>> {
    let all_runs = ["parallel", "parallel-features", "serial"]
        .iter()
        .all(|r| args.runs.iter().any(|a| a == r));
    let mut ok = true;
    for d in &args.drivers {
        let caps = run::declared_capabilities(&std::fs::read_to_string(d.definition())?)?;
        let mut line = format!("{:<11} capabilities:", d.name);
        for (cap, n) in run::capability_counts(reports, d, &caps) {
            match n {
                Some(n) => line.push_str(&format!(" {cap}={n}")),
                None => line.push_str(&format!(" {cap}=?")),
            }
            if all_runs && n == Some(0) {
                ok = false;
                line.push_str("(NOT READ)");
            }
        }
        summary.push_str(&line);
        summary.push('\n');
    }
    Ok(ok)
}

/// `--summarize`: the summary of the reports an earlier run left in `--out`.
fn summarize(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let mut ok = true;
    let (mut summary, mut reports) = (String::new(), Vec::new());
    for name in &args.runs {
        let report = RunReport::read(&args.out.join(format!("{name}.json")))?;
        summary.push_str(&report.summary(name, &args.drivers));
        ok &= report.suite_failures.is_empty()
            && args.drivers.iter().all(|d| report.counts(d).failed == 0);
        reports.push(report);
    }
    ok &= capability_lines(args, &reports, &mut summary)?;
    println!("{summary}");
    Ok(ok)
}
