//! `cargo xtask fuzz [--seconds N]`: libFuzzer on the leader-migration configuration decoder.

use anyhow::Result;

use crate::shell::{exec, has, repo_root};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How long to fuzz.
    #[arg(long, default_value_t = 60)]
    seconds: u32,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    if !has("cargo", &["fuzz", "--version"]) {
        exec(std::process::Command::new("cargo").args(["install", "--locked", "cargo-fuzz"]))?;
    }
    exec(
        std::process::Command::new("cargo")
            .current_dir(repo_root().join("crates/leadermigration"))
            .args([
                "+nightly",
                "fuzz",
                "run",
                "decode",
                "--",
                &format!("-max_total_time={}", args.seconds),
            ]),
    )
}
