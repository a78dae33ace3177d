//! Prints `manifests/install.yaml` (`make manifests` writes it).

fn main() -> std::process::ExitCode {
    match csiops_operator::install::manifest() {
        Ok(yaml) => {
            print!("{yaml}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "csiops-manifests: cannot render the install manifest: {}",
                csiops_runtime::chain(&e)
            );
            std::process::ExitCode::FAILURE
        }
    }
}
