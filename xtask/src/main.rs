//! `cargo xtask <command>`: every repository chore, in Rust, with few dependencies.
//!
//! One module per command. Each prints the commands it runs, so a failure can be reproduced by hand.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod chaos;
mod fuzz;
mod kube;
mod new_provider;
mod release;
mod semver;
mod shell;
mod test;
mod tools;

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
    /// Run a benchmark in release mode: apiserver, leader, nodes, aws.
    Bench(bench::Args),
    /// Six managers mid-migration under faults; fails on any overlap, a cluster that does not converge, or
    /// a process stuck on SIGTERM.
    Chaos(chaos::Args),
    /// Fuzz every parser of outside input (coverage-guided: nightly and cargo-fuzz; `--smoke`: briefly,
    /// as the workspace builds them).
    Fuzz(fuzz::Args),
    /// Build the shipped binaries (`dist` profile) into tarballs with README, LICENSE, a CycloneDX bill
    /// of materials and SHA256SUMS, under target/dist/.
    Dist(release::dist::Args),
    /// Build the real kube-apiserver, kube-controller-manager and etcd and the other Go tools the tests
    /// run (`tools/`), from their Go modules, cached under the target directory; prints JSON.
    Kube(kube::Args),
    /// Build an OCI image per shipped binary without a container engine (OCI layout and a `docker load`
    /// archive under target/image/), reproducibly; prints a kustomize `images:` snippet.
    Image(release::image::Args),
    /// Push the images `image` built to a registry (skopeo), sign them and attest their bills of
    /// materials (cosign), by digest; prints how to verify them.
    Publish(release::publish::Args),
    /// Scaffold a provider crate (crates/providers/NAME, or --path DIR) with its own binary and a test
    /// against the test API server.
    NewProvider(new_provider::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Test(args) => test::run(&args),
        Command::Fuzz(args) => fuzz::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Chaos(args) => chaos::run(&args),
        Command::Dist(args) => release::dist::run(&args),
        Command::Image(args) => release::image::run(&args),
        Command::Publish(args) => release::publish::run(&args),
        Command::Kube(args) => kube::run(&args),
        Command::NewProvider(args) => new_provider::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
