//! `cargo xtask fuzz [--seconds N] [--target NAME]… [--smoke]`: libFuzzer on every parser of outside
//! input (`fuzz/`, a member of the workspace): the leader-migration configuration, kube-apiserver's audit
//! log, the cloud-configs (fake, AWS, GCE and their INI reader), Go durations, `--cluster-cidr`,
//! `--controllers`, `--feature-gates`, the TLS flags, the node-IP annotation, Service annotations and
//! AdmissionReviews.
//!
//! By default each target is fuzzed for `--seconds` with coverage guidance (cargo-fuzz, the nightly
//! toolchain), starting from its committed seeds (`fuzz/seeds/<target>/`); what it finds goes to
//! `fuzz/corpus/` (not committed). `--smoke`, which `cargo xtask test` runs: the targets built as the
//! workspace builds them (stable, no instrumentation) and each run for a few seconds from its seeds and
//! random mutations, so none can rot or panic on what it was given.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::shell::{cargo, exec, has, repo_root, target_dir};

/// Every fuzz target (a binary of `fuzz/`, with seeds in `fuzz/seeds/<target>/`).
pub(crate) const TARGETS: [&str; 13] = [
    "decode",
    "audit_log",
    "cloud_config",
    "go_duration",
    "flag_values",
    "feature_gates",
    "tls_flags",
    "node_ip",
    "gcfg",
    "aws_config",
    "gce_config",
    "service_annotations",
    "admission_review",
];

/// The cargo-fuzz release installed when none is.
const CARGO_FUZZ: &str = "0.13.2";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How long to fuzz each target.
    #[arg(long, default_value_t = 60)]
    seconds: u32,
    /// Only these targets (default: all of them).
    #[arg(long = "target", value_name = "NAME")]
    targets: Vec<String>,
    /// Run each target briefly as the workspace builds it (no instrumentation, stable toolchain).
    #[arg(long)]
    smoke: bool,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    if let Some(unknown) = args.targets.iter().find(|t| !TARGETS.contains(&t.as_str())) {
        bail!(
            "--target {unknown}: no such fuzz target (known: {})",
            TARGETS.join(", ")
        );
    }
    let chosen: Vec<&str> = TARGETS
        .iter()
        .copied()
        .filter(|name| args.targets.is_empty() || args.targets.iter().any(|t| t == name))
        .collect();
    if args.smoke {
        return smoke(&chosen, args.seconds);
    }
    if !has("cargo", &["+nightly", "--version"]) {
        bail!(
            "the nightly toolchain is needed (rustup toolchain install nightly): libFuzzer's coverage builds with -Z flags"
        );
    }
    if !has("cargo", &["fuzz", "--version"]) {
        exec(Command::new("cargo").args(["install", "--locked", "--version", CARGO_FUZZ, "cargo-fuzz"]))?;
    }
    for target in chosen {
        let corpus = repo_root().join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus).with_context(|| format!("create {}", corpus.display()))?;
        exec(
            Command::new("cargo")
                .current_dir(repo_root())
                .args(["+nightly", "fuzz", "run", "--fuzz-dir", "fuzz", target])
                .arg(&corpus)
                .arg(seeds(target))
                .arg("--")
                .arg(format!("-max_total_time={}", args.seconds)),
        )?;
    }
    Ok(())
}

fn seeds(target: &str) -> std::path::PathBuf {
    repo_root().join("fuzz/seeds").join(target)
}

/// Builds the targets with the workspace and runs each for `seconds` from its seeds; a panic, a crash or
/// a missing seed fails.
pub(crate) fn smoke(targets: &[&str], seconds: u32) -> Result<()> {
    // With the workspace's features as its tests unify them (`--workspace --tests`): after the tests, only
    // the targets themselves compile. `-p ccm-fuzz` alone unifies features differently, and compiled the
    // AWS and Google SDKs a second time (minutes, and gigabytes, of a cold CI run).
    exec(cargo().args(["build", "--locked", "--workspace", "--bins", "--tests"]))?;
    let scratch = target_dir().join("fuzz-smoke");
    for target in targets {
        let seeds = seeds(target);
        let count = std::fs::read_dir(&seeds)
            .with_context(|| format!("the seeds of {target}: {}", seeds.display()))?
            .count();
        if count == 0 {
            bail!("fuzz target {target} has no seeds in {}", seeds.display());
        }
        // New inputs go to a scratch corpus, listed first; the seeds are only read.
        let corpus = scratch.join(target);
        let _ = std::fs::remove_dir_all(&corpus);
        std::fs::create_dir_all(&corpus).with_context(|| format!("create {}", corpus.display()))?;
        let binary = target_dir().join("debug").join(target);
        run_target(&binary, &corpus, &seeds, seconds).with_context(|| {
            format!(
                "fuzz target {target} failed (its input is in {})",
                corpus.display()
            )
        })?;
    }
    println!(
        "fuzz targets: {} ran {seconds} s each from their seeds, no panic",
        targets.len()
    );
    Ok(())
}

fn run_target(binary: &Path, corpus: &Path, seeds: &Path, seconds: u32) -> Result<()> {
    let output = Command::new(binary)
        .current_dir(corpus)
        .arg(format!("-max_total_time={seconds}"))
        .arg("-rss_limit_mb=2048")
        .arg("-print_final_stats=1")
        .arg(corpus)
        .arg(seeds)
        .output()
        .with_context(|| format!("start {}", binary.display()))?;
    if !output.status.success() {
        bail!(
            "{} ended with {}:\n{}",
            binary.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
