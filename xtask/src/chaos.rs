//! `cargo xtask chaos [--seconds N] [--seed S] [--output FILE]`: builds the manager, the test API server and
//! the benchmark driver (debug builds: the run judges safety and convergence, not speed), then runs
//! `ccm-bench chaos` (six managers mid-migration under kills, pauses, API-server and cloud faults; see
//! `crates/bench/src/chaos.rs`). The full `cargo xtask test` runs it for 60 s with a fixed seed.

use std::process::Command;

use anyhow::Result;

use crate::shell::{cargo, exec, target_dir};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How long the faults go on.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Seed of the fault schedule (random when absent; the report gives it).
    #[arg(long)]
    seed: Option<u64>,
    /// Write the JSON report here too.
    #[arg(long, value_name = "FILE")]
    output: Option<std::path::PathBuf>,
}

impl Args {
    /// What the full test run uses.
    pub(crate) fn ci() -> Args {
        Args {
            seconds: 60,
            seed: Some(1),
            output: Some(target_dir().join("chaos.json")),
        }
    }
}

pub(crate) fn run(args: &Args) -> Result<()> {
    exec(cargo().args([
        "build",
        "--locked",
        "-p",
        "cloud-controller-manager",
        "-p",
        "test-apiserver",
        "-p",
        "bench",
    ]))?;
    let debug = target_dir().join("debug");
    let mut command = Command::new(debug.join("ccm-bench"));
    command
        .env("BENCH_MANAGER_BINARY", debug.join("cloud-controller-manager"))
        .args(["chaos", "--seconds", &args.seconds.to_string()]);
    if let Some(seed) = args.seed {
        command.args(["--seed", &seed.to_string()]);
    }
    if let Some(output) = &args.output {
        command.arg("--output").arg(output);
    }
    exec(&mut command)
}
