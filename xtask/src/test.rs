//! `cargo xtask test [-p PACKAGE]`: the one command that runs every test on a fresh machine.
//!
//! Set-up: checks for `kubectl` (the test API server is checked against it) and installs Prometheus's
//! `promtool` from Debian's `prometheus` package where it is missing and `apt-get` may run (the shipped
//! alerts and dashboard are checked with it; without it those tests say they were skipped). Then, for a full run:
//! `cargo fmt --check`, `cargo clippy -D warnings`, the tests (with cargo-nextest when installed), and a 60 s
//! chaos run (`cargo xtask chaos`).

use anyhow::{Result, bail};

use crate::shell::{cargo, exec, has};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Test only this package (set-up still runs; formatting and lints do not).
    #[arg(short = 'p', long = "package", value_name = "PACKAGE")]
    packages: Vec<String>,
    /// Extra arguments for the test runner, after `--` (e.g. a test name filter).
    #[arg(last = true)]
    runner_args: Vec<String>,
}

pub(crate) fn run_setup() -> Result<()> {
    if !has("kubectl", &["version", "--client"]) {
        bail!(
            "kubectl is not on PATH: the test API server's tests run the real kubectl against it. Install kubectl (any version ≥ 1.28) and run again"
        );
    }
    if !has("promtool", &["--version"]) {
        install_promtool();
    }
    Ok(())
}

/// `apt-get install prometheus` (for `promtool`), as root or with password-less sudo; a failure is reported,
/// not fatal: the tests that need `promtool` then say they were skipped.
fn install_promtool() {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let sudo: &[&str] = if root { &[] } else { &["sudo", "-n"] };
    if !has("apt-get", &["--version"]) || (!root && !has("sudo", &["-n", "true"])) {
        eprintln!(
            "promtool is missing and cannot be installed here (needs apt-get as root): the monitoring tests will be SKIPPED. Install Debian's `prometheus` package to run them"
        );
        return;
    }
    eprintln!("installing promtool (Debian package prometheus) for the monitoring tests…");
    let install = |args: &[&str]| {
        let mut command = std::process::Command::new(sudo.first().copied().unwrap_or(args[0]));
        command
            .args(sudo.iter().skip(1))
            .args(if sudo.is_empty() { &args[1..] } else { args })
            .env("DEBIAN_FRONTEND", "noninteractive");
        exec(&mut command)
    };
    let installed = install(&[
        "apt-get",
        "install",
        "-y",
        "--no-install-recommends",
        "prometheus",
    ])
    .or_else(|_| {
        install(&["apt-get", "update"])?;
        install(&[
            "apt-get",
            "install",
            "-y",
            "--no-install-recommends",
            "prometheus",
        ])
    });
    if let Err(error) = installed {
        eprintln!("cannot install promtool ({error:#}): the monitoring tests will be SKIPPED");
    }
}

pub(crate) fn run(args: &Args) -> Result<()> {
    run_setup()?;
    let full = args.packages.is_empty();
    if full {
        exec(cargo().args(["fmt", "--all", "--", "--check"]))?;
        exec(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    let selection: Vec<String> = if full {
        vec!["--workspace".into()]
    } else {
        args.packages
            .iter()
            .flat_map(|p| ["-p".to_owned(), p.clone()])
            .collect()
    };
    if has("cargo-nextest", &["nextest", "--version"]) {
        let profile = if std::env::var_os("CI").is_some() {
            "ci"
        } else {
            "default"
        };
        exec(
            cargo()
                .args(["nextest", "run", "--locked", "--profile", profile])
                .args(&selection)
                .args(&args.runner_args),
        )?;
        // nextest does not run doctests.
        exec(cargo().args(["test", "--doc", "--locked"]).args(&selection))?;
    } else {
        exec(
            cargo()
                .args(["test", "--locked"])
                .args(&selection)
                .arg("--")
                .args(&args.runner_args),
        )?;
    }
    if full {
        // The safety claim under faults, judged from the servers' own logs (a fixed seed: a failure replays).
        crate::chaos::run(&crate::chaos::Args::ci())?;
    }
    Ok(())
}
