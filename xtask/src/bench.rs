//! `cargo xtask bench <name> [--output FILE] [-- ARGS]`: builds the benchmark and the binaries it drives in
//! release mode, then runs `ccm-bench <name>`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

use crate::shell::{cargo, exec, repo_root};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Which benchmark.
    #[arg(value_parser = ["apiserver", "leader"])]
    name: String,
    /// Write the JSON result here.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// More arguments for the benchmark (see `ccm-bench <name> --help`).
    #[arg(last = true)]
    rest: Vec<String>,
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo_root().join("target"), PathBuf::from)
}

pub(crate) fn run(args: &Args) -> Result<()> {
    // The benchmark and every binary it drives, optimised.
    let packages = ["bench", "test-apiserver", "cloud-controller-manager"];
    exec(
        cargo()
            .args(["build", "--release", "--locked"])
            .args(packages.iter().flat_map(|p| ["-p", p])),
    )?;
    let mut command = Command::new(target_dir().join("release/ccm-bench"));
    command.current_dir(repo_root()).arg(&args.name);
    if let Some(output) = &args.output {
        // Relative to where the user ran cargo, not to the repository root.
        let output = std::env::current_dir()?.join(output);
        command.arg("--output").arg(output);
    }
    exec(command.args(&args.rest))
}
