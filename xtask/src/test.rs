//! `cargo xtask test [-p PACKAGE]`: the one command that runs every test on a fresh machine.
//!
//! Set-up: checks for `kubectl` (the test API server is checked against it), installs what else the
//! tests use (`tools`: promtool, skopeo, umoci, a Python environment, cargo-nextest; without them those
//! tests say they were skipped) and builds the real kube-apiserver, kube-controller-manager and etcd
//! (`cargo xtask kube`; a machine without Go skips their tests, loudly). Then, for a full run:
//! `cargo fmt --check`, `cargo clippy -D warnings`, the tests (with cargo-nextest: a process per test and
//! time limits, so a hang cannot stall the run), and a 60 s chaos run (`cargo xtask chaos`).

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
    crate::tools::install();
    if crate::kube::go_available() {
        crate::kube::build()?;
    } else {
        eprintln!(
            "SKIPPED: go is not on PATH, so the real kube-apiserver and etcd cannot be built: every test on the \
             real API server will be SKIPPED (install Go 1.26 or later with the module proxy to run them)"
        );
    }
    Ok(())
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
        // nextest does not run doctests (xtask has no library, so none).
        let documented: Vec<String> = if full {
            selection.clone()
        } else {
            args.packages
                .iter()
                .filter(|p| *p != "xtask")
                .flat_map(|p| ["-p".to_owned(), p.clone()])
                .collect()
        };
        if !documented.is_empty() {
            exec(cargo().args(["test", "--doc", "--locked"]).args(&documented))?;
        }
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
        // The same with upstream's Go cloud-controller-manager beside ours, on the real kube-apiserver.
        if crate::kube::go_available() {
            crate::chaos::run(&crate::chaos::Args::ci_with_go_peers())?;
        } else {
            println!("SKIPPED: chaos with Go peers on the real kube-apiserver: go is not on PATH");
        }
    }
    Ok(())
}
