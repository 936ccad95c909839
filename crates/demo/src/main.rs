//! `ccm-demo`: the framework's manager with this repository's providers, and `demo`.

use std::process::ExitCode;

use controller_manager::{RegistrationError, Registry};

fn register(registry: &mut Registry) -> Result<(), RegistrationError> {
    registry.register_provider(provider_fake::PROVIDER_NAME, provider_fake::factory)?;
    registry.register_provider(provider_aws::PROVIDER_NAME, provider_aws::factory)?;
    for controller in provider_aws::controllers() {
        registry.register_controller(controller)?;
    }
    registry.register_provider(provider_gce::PROVIDER_NAME, provider_gce::factory)?;
    registry.register_provider_flags(provider_gce::PROVIDER_NAME, provider_gce::flags::FLAGS)?;
    for controller in provider_gce::controllers() {
        registry.register_controller(controller)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut registry = Registry::new();
    if let Err(error) = register(&mut registry) {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("error: {error}");
        }
        return ExitCode::FAILURE;
    }
    ccm_demo::main(registry)
}
