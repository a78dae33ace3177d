//! Prints `manifests/install.yaml`, or with `--helm-chart DIR` writes the
//! Helm chart there (`make manifests` does both).

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => match csiops_operator::install::manifest() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "csiops-manifests: cannot render the install manifest: {}",
                    csiops_runtime::chain(&e)
                );
                ExitCode::FAILURE
            }
        },
        [flag, dir] if flag == "--helm-chart" => match write_chart(Path::new(dir)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!(
                    "csiops-manifests: cannot write the Helm chart to {dir}: {}",
                    csiops_runtime::chain(e.as_ref())
                );
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: csiops-manifests [--helm-chart DIR]");
            ExitCode::from(2)
        }
    }
}

fn write_chart(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    for f in csiops_operator::helm::chart()? {
        let path = dir.join(f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, f.content)?;
    }
    Ok(())
}
