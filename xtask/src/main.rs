//! `cargo xtask <command>`: every repository chore, in Rust, with few dependencies.
//!
//! One module per command. Each prints the commands it runs, so a failure can be reproduced by hand.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod chaos;
mod fuzz;
mod shell;
mod test;

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Repository chores")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Set up what the tests need, then run formatting and lint checks and every test.
    Test(test::Args),
    /// Run a benchmark in release mode: apiserver, leader, nodes.
    Bench(bench::Args),
    /// Six managers mid-migration under faults; fails on any overlap, a cluster that does not converge, or
    /// a process stuck on SIGTERM.
    Chaos(chaos::Args),
    /// Fuzz the leader-migration configuration decoder (needs the nightly toolchain; installs cargo-fuzz).
    Fuzz(fuzz::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Test(args) => test::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Chaos(args) => chaos::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
