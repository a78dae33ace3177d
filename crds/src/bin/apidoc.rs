//! Prints the API reference on stdout (`make api-docs` writes it into `docs/`).

fn main() {
    print!("{}", csiops_crds::apidoc::api_reference());
}
