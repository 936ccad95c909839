//! The `cloud-controller-manager` binary with this repository's providers.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut registry = kube_ccm::Registry::new();
    if let Err(error) = kube_ccm::register_bundled(&mut registry) {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("error: {error}");
        }
        return ExitCode::FAILURE;
    }
    kube_ccm::main(registry)
}
