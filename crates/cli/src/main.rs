//! The `cloud-controller-manager` binary with this repository's providers.

use std::process::ExitCode;

use controller_manager::Registry;

fn main() -> ExitCode {
    let mut registry = Registry::new();
    if let Err(error) = registry.register_provider(provider_fake::PROVIDER_NAME, provider_fake::factory) {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("error: {error}");
        }
        return ExitCode::FAILURE;
    }
    cloud_controller_manager::main(registry)
}
