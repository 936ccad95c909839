//! `cloud-controller-manager`: the manager and its operator tools, as a library a provider's own binary
//! calls with its registry:
//!
//! ```no_run
//! use cloud_provider::ProviderRegistry;
//!
//! fn main() -> std::process::ExitCode {
//!     let mut registry = ProviderRegistry::new();
//!     registry.register("fake", provider_fake::factory).expect("one provider of that name");
//!     cloud_controller_manager::main(registry)
//! }
//! ```
//!
//! This crate is the only one that knows clap, figment, environment variables and files.

#![allow(clippy::print_stderr)]

use std::process::ExitCode;

use clap::{Command, FromArgMatches, Subcommand};
use cloud_provider::ProviderRegistry;

#[cfg(feature = "demo")]
mod demo;
mod duration;
pub mod harness;
mod identity;
mod leader_migration;
mod lenient;
mod run;
mod serve;
mod settings;
mod telemetry;

/// The whole command line.
fn command() -> Command {
    let root = Command::new("cloud-controller-manager")
        .version(env!("CARGO_PKG_VERSION"))
        .about("A cloud-controller-manager with Kubernetes Leader Migration built in.\n\nWithout a subcommand it runs the manager: --cloud-provider is required.")
        .args_conflicts_with_subcommands(true)
        // Every flag's help under its name, as upstream prints it; column layout breaks on long names.
        .next_line_help(true)
        .max_term_width(120);
    let leader_migration = leader_migration::Command::augment_subcommands(
        Command::new("leader-migration")
            .about("Inspect, validate and generate leader-migration configuration")
            .subcommand_required(true),
    );
    let root = settings::add_flags(root).subcommand(leader_migration);
    #[cfg(feature = "demo")]
    // After `augment_args`, which would set the about text from `Args`' doc comment.
    let root = root.subcommand(
        <demo::Args as clap::Args>::augment_args(Command::new("demo")).about(
            "Run a leader migration on this machine: a test API server, a fake cloud, and replicas of this binary rolled from kube-controller-manager to cloud-controller-manager",
        ),
    );
    root
}

/// Parses the command line and runs it; the exit code is the process's.
///
/// Exit codes: 0 done; 1 failure at run time (including lost leadership, as upstream); 2 invalid
/// command line or settings.
pub fn main(registry: ProviderRegistry) -> ExitCode {
    let matches = match command().try_get_matches() {
        Ok(matches) => matches,
        Err(error) => error.exit(),
    };
    match matches.subcommand() {
        Some(("leader-migration", sub)) => match leader_migration::Command::from_arg_matches(sub) {
            Ok(command) => report(command.run()),
            Err(error) => error.exit(),
        },
        #[cfg(feature = "demo")]
        Some(("demo", sub)) => match <demo::Args as FromArgMatches>::from_arg_matches(sub) {
            Ok(args) => report(demo::run(&args)),
            Err(error) => error.exit(),
        },
        _ => run_manager(&matches, &registry),
    }
}

fn report(result: anyhow::Result<ExitCode>) -> ExitCode {
    result.unwrap_or_else(|error| {
        eprintln!("error: {error:#}");
        ExitCode::FAILURE
    })
}

fn run_manager(matches: &clap::ArgMatches, registry: &ProviderRegistry) -> ExitCode {
    let startup = match settings::layered(matches)
        .map_err(|e| vec![e.to_string()])
        .and_then(run::validate)
        .and_then(|startup| match registry.check(&startup.settings.cloud_provider) {
            Ok(()) => Ok(startup),
            Err(error) => Err(vec![error.to_string()]),
        }) {
        Ok(startup) => startup,
        Err(problems) => {
            for problem in problems.iter().flat_map(|p| p.lines()) {
                eprintln!("error: {problem}");
            }
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let telemetry = {
        let _inside = runtime.enter();
        telemetry::init(startup.settings.v, startup.settings.logging_format == "json")
    };
    let code = report(runtime.block_on(run::run(startup, registry)));
    telemetry.shutdown();
    code
}

#[cfg(test)]
mod tests {
    #[test]
    fn repeated_flags_on_the_real_command_take_the_last_value() {
        super::settings::tests::hermetic(|| {
            let matches = super::command().try_get_matches_from([
                "ccm",
                "--enable-leader-migration",
                "--enable-leader-migration=false",
            ]);
            let settings = super::settings::layered(&matches.unwrap()).unwrap();
            assert!(!settings.enable_leader_migration);
        });
    }
}
