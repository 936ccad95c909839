//! `example-cloud-controller-manager`: the framework's manager with the example cloud and its controller.

use std::process::ExitCode;

// ANCHOR: main
fn main() -> ExitCode {
    let mut registry = kube_ccm::runtime::Registry::new(); // the framework's controllers
    // This binary's name and version: in --help, --version, every User-Agent and kubernetes_build_info.
    let named = registry.set_binary(env!("CARGO_BIN_NAME"), env!("CARGO_PKG_VERSION"));
    if let Err(error) = named.and_then(|()| provider_example::register(&mut registry)) {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("error: {error}");
        }
        return ExitCode::FAILURE;
    }
    kube_ccm::main(registry) // flags, leader election and migration, serving, signals
}
// ANCHOR_END: main
