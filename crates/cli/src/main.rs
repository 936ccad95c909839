//! `cloud-controller-manager`: the manager and its operator tools.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod leader_migration;

/// A cloud-controller-manager with Kubernetes Leader Migration built in.
#[derive(Debug, Parser)]
#[command(name = "cloud-controller-manager", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect, validate and generate leader-migration configuration.
    #[command(subcommand)]
    LeaderMigration(leader_migration::Command),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let result = match cli.command {
        Command::LeaderMigration(command) => command.run(),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: {error:#}");
            }
            ExitCode::FAILURE
        }
    }
}
