//! `cargo xtask fuzz [--seconds N] [--target NAME]…`: libFuzzer (cargo-fuzz, nightly toolchain) on every
//! parser of outside input: the leader-migration configuration decoder (`crates/leadermigration/fuzz`), the
//! fake provider's cloud-config, Go durations, and the `--cluster-cidr` and `--controllers` values (`fuzz/`).
//! Each target runs for `--seconds`. The same properties run as proptests in `cargo xtask test`.

use anyhow::{Result, bail};

use crate::shell::{exec, has, repo_root};

/// (directory, target) of every fuzz target.
const TARGETS: [(&str, &str); 4] = [
    ("crates/leadermigration/fuzz", "decode"),
    ("fuzz", "cloud_config"),
    ("fuzz", "go_duration"),
    ("fuzz", "flag_values"),
];

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How long to fuzz each target.
    #[arg(long, default_value_t = 60)]
    seconds: u32,
    /// Only these targets (default: all of them).
    #[arg(long = "target", value_name = "NAME")]
    targets: Vec<String>,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    if let Some(unknown) = args
        .targets
        .iter()
        .find(|t| !TARGETS.iter().any(|(_, name)| name == t))
    {
        let known: Vec<&str> = TARGETS.iter().map(|(_, name)| *name).collect();
        bail!(
            "--target {unknown}: no such fuzz target (known: {})",
            known.join(", ")
        );
    }
    if !has("cargo", &["+nightly", "--version"]) {
        bail!(
            "the nightly toolchain is needed (rustup toolchain install nightly): libFuzzer builds with -Z flags"
        );
    }
    if !has("cargo", &["fuzz", "--version"]) {
        exec(std::process::Command::new("cargo").args(["install", "--locked", "cargo-fuzz"]))?;
    }
    for (directory, target) in TARGETS
        .iter()
        .filter(|(_, name)| args.targets.is_empty() || args.targets.iter().any(|t| t == name))
    {
        exec(
            std::process::Command::new("cargo")
                .current_dir(repo_root().join(directory))
                .args([
                    "+nightly",
                    "fuzz",
                    "run",
                    target,
                    "--",
                    &format!("-max_total_time={}", args.seconds),
                ]),
        )?;
    }
    Ok(())
}
