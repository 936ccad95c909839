//! `cargo xtask test [-p PACKAGE]`: the one command that runs every test on a fresh machine.
//!
//! Set-up: checks for `kubectl` (the test API server is checked against it), installs what else the
//! tests use (`tools`: promtool, skopeo, umoci, prlimit, curl, a Python environment, cargo-nextest;
//! without them those tests say they were skipped, and with `CI` set the run fails instead) and builds the
//! real kube-apiserver, kube-controller-manager and etcd (`cargo xtask kube`; a machine without Go skips
//! their tests, loudly, but not under CI). What the machine kind truly lacks (a Docker engine) is left out
//! by name, so nextest counts it as skipped, and named again at the end of the run. Then, for a full run:
//! `cargo fmt --check`, `cargo clippy -D warnings`, `cargo doc` with warnings refused, the semver check
//! against the last release (`semver.rs`), the tests (with cargo-nextest: a process per test and
//! time limits, so a hang cannot stall the run), and a 60 s chaos run (`cargo xtask chaos`).

use anyhow::{Result, bail};

use crate::shell::{cargo, exec, has};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Test only this package (set-up still runs; formatting and lints do not).
    #[arg(short = 'p', long = "package", value_name = "PACKAGE")]
    packages: Vec<String>,
    /// Also run the core tests on the real kube-apiserver and kube-controller-manager of every other
    /// supported Kubernetes release (`docs/support-policy.md`), after the rest.
    #[arg(long)]
    all_versions: bool,
    /// Run only the core tests, on the real kube-apiserver and kube-controller-manager of this supported
    /// release (e.g. `v1.35.4`, the oldest).
    #[arg(long, value_name = "RELEASE", conflicts_with_all = ["all_versions", "packages"])]
    kubernetes: Option<String>,
    /// Extra arguments for the test runner, after `--` (e.g. a test name filter).
    #[arg(last = true)]
    runner_args: Vec<String>,
}

/// The core tests (docs/support-policy.md): every test of the binary, the runtime and the Lease elector
/// on the real kube-apiserver (Leader Migration, nodes, services, routes, RBAC, the chart), with the
/// real kube-controller-manager as the migration's N side and kwok's kubelets.
const CORE: &str = "(package(cloud-controller-manager) | package(kube-ccm-runtime) | \
    package(kube-ccm-leadermigration)) & (test(/kube_apiserver/) | test(/^kcm_peer::/) | \
    test(/^upstream_rbac::/) | test(/^chart_install::/) | test(/^kwok::/))";

/// The core tests on `release`'s kube-apiserver and kube-controller-manager, with `runner_args`.
fn core_tests_on(release: &str, runner_args: &[String]) -> Result<()> {
    if !has("cargo-nextest", &["nextest", "--version"]) {
        bail!(
            "--kubernetes and --all-versions run the core tests with cargo-nextest, which is not installed"
        );
    }
    let (manifest, _) = crate::kube::releases::build(release)?;
    println!("core tests on Kubernetes {release} ({})", manifest.display());
    exec(
        cargo()
            .args(["nextest", "run", "--locked", "--profile", profile()])
            .args(["--workspace", "-E", CORE])
            .args(runner_args)
            .env("KUBE_TOOLS_MANIFEST", &manifest),
    )
}

fn profile() -> &'static str {
    if std::env::var_os("CI").is_some() {
        "ci"
    } else {
        "default"
    }
}

pub(crate) fn run_setup() -> Result<()> {
    if !has("kubectl", &["version", "--client"]) {
        bail!(
            "kubectl is not on PATH: the test API server's tests run the real kubectl against it. Install kubectl (any version ≥ 1.28) and run again"
        );
    }
    crate::tools::install()?;
    if crate::kube::go_available() {
        crate::kube::build()?;
    } else if std::env::var_os("CI").is_some() {
        bail!("go is not on PATH: with CI set the real kube-apiserver, etcd and the Go peers are required");
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
    if let Some(release) = &args.kubernetes {
        return core_tests_on(release, &args.runner_args);
    }
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
        // The published crates' docs as docs.rs builds them, broken links and all, refused.
        exec(
            cargo()
                .args(["doc", "--workspace", "--no-deps", "--locked"])
                .env("RUSTDOCFLAGS", "-D warnings"),
        )?;
        crate::semver::check()?;
    }
    let selection: Vec<String> = if full {
        vec!["--workspace".into()]
    } else {
        args.packages
            .iter()
            .flat_map(|p| ["-p".to_owned(), p.clone()])
            .collect()
    };
    // What this machine kind truly lacks is left out by name, and said at the end; nothing else skips.
    let lacking = lacking();
    let mut runner_args = args.runner_args.clone();
    if !lacking.is_empty() {
        // Filters after `--`, as libtest takes them (nextest too): `--skip` leaves a test out.
        if !runner_args.iter().any(|a| a == "--") {
            runner_args.push("--".to_owned());
        }
        for (test, _) in &lacking {
            runner_args.extend(["--skip".to_owned(), (*test).to_owned()]);
        }
    }
    if has("cargo-nextest", &["nextest", "--version"]) {
        exec(
            cargo()
                .args(["nextest", "run", "--locked", "--profile", profile()])
                .args(&selection)
                .args(&runner_args),
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
                .args(runner_args.iter().filter(|a| *a != "--")),
        )?;
    }
    if full {
        judges()?;
    }
    if args.all_versions {
        for (release, _) in crate::kube::releases::RELEASES {
            core_tests_on(release, &[])?;
        }
    }
    for (test, why) in &lacking {
        println!("SKIPPED (this machine has no {why}): {test}");
    }
    Ok(())
}

/// The fuzz targets' seeds, the chaos runs and the judges' negative controls (a full run's last part).
fn judges() -> Result<()> {
    // Every fuzz target, briefly, from its committed seeds: none can rot or panic on them.
    crate::fuzz::smoke(&crate::fuzz::TARGETS, 3)?;
    // The safety claim under faults, judged from the servers' own logs (a fixed seed: a failure replays).
    crate::chaos::run(&crate::chaos::Args::ci())?;
    // The same with upstream's Go cloud-controller-manager beside ours, on the real kube-apiserver.
    if crate::kube::go_available() {
        crate::chaos::run(&crate::chaos::Args::ci_with_go_peers())?;
    } else {
        println!("SKIPPED: chaos with Go peers on the real kube-apiserver: go is not on PATH");
    }
    // A judge that has never been seen to fail is not a judge.
    let backends: &[&str] = if crate::kube::go_available() {
        &["test", "kube"]
    } else {
        &["test"]
    };
    crate::chaos::negative_controls(backends)?;
    Ok(())
}

/// The tests that need what this machine lacks (only a Docker engine may be lacking), with what it is.
fn lacking() -> Vec<(&'static str, &'static str)> {
    let engine = std::process::Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if engine {
        Vec::new()
    } else {
        vec![("the_image_loads_and_runs_under_docker", "Docker engine")]
    }
}
