//! `cargo xtask bench <name> [ARGS]`: builds the benchmark and the binaries it drives (the manager as it ships,
//! profile `dist`), then
//! runs `ccm-bench <name> ARGS` (e.g. `--output FILE`; `ccm-bench <name> --help` lists them).

use std::process::Command;

use anyhow::Result;

use crate::shell::{cargo, exec, target_dir};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Which benchmark.
    #[arg(value_parser = ["apiserver", "leader", "nodes", "aws", "versus", "kwok", "takeover"])]
    name: String,
    /// The benchmark's arguments, e.g. `--output FILE` (see `ccm-bench <name> --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    rest: Vec<String>,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let given = |flag: &str, value: &str| {
        args.rest.windows(2).any(|w| w[0] == flag && w[1] == value)
            || args.rest.iter().any(|a| *a == format!("{flag}={value}"))
    };
    if args.name == "aws" || (args.name == "versus" && given("--cloud", "aws")) {
        // moto, in `<target dir>/venv`, where the benchmark finds it.
        crate::tools::python()
            .map_err(|why| anyhow::anyhow!("cannot install moto for the aws benchmark: {why}"))?;
    }
    let on_kube = args.name == "versus" || args.name == "kwok" || given("--apiserver", "kube");
    if on_kube {
        // kube-apiserver and etcd from their Go modules (cached), never beside a cargo build.
        crate::kube::build()?;
    }
    // The manager as it ships (profile `dist`: fat LTO), and the benchmark and the API server optimised.
    exec(cargo().args([
        "build",
        "--profile",
        "dist",
        "--locked",
        "-p",
        "cloud-controller-manager",
    ]))?;
    exec(cargo().args([
        "build",
        "--release",
        "--locked",
        "-p",
        "bench",
        "-p",
        "kube-ccm-test-apiserver",
    ]))?;
    // Run where the user ran cargo, so that relative paths in the arguments mean what they expect.
    exec(
        Command::new(target_dir().join("release/ccm-bench"))
            .env(
                "BENCH_MANAGER_BINARY",
                target_dir().join("dist/cloud-controller-manager"),
            )
            .arg(&args.name)
            .args(&args.rest),
    )
}
