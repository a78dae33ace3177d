//! Prints the CRD YAML on stdout (`make crds` writes it into `crds/`).

fn main() -> std::process::ExitCode {
    match csiops_crds::crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crdgen: cannot render the CRD: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
