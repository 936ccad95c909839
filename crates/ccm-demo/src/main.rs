//! `ccm-demo`: the framework's manager with this repository's providers, and `demo`.

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
    ccm_demo::main(registry)
}
