//! What the tests need installed beside the Rust toolchain, set up by `cargo xtask test`:
//!
//! - Debian packages, where missing and `apt-get` may run (as root or with password-less sudo):
//!   `prometheus` (for `promtool`: the shipped alerts and dashboard), `skopeo` and `umoci` (the release
//!   images are inspected and unpacked with them), and for the arm64 entry of a multi-architecture image,
//!   Debian's cross compiler with arm64's C library (`gcc-aarch64-linux-gnu`, `libc6-dev-arm64-cross`: a
//!   small arm64 stand-in program) and `qemu-user-static` (it runs that program in the image's arm64 root).
//! - A Python virtual environment under `<target dir>/venv` with pinned packages from PyPI:
//!   `cyclonedx-python-lib` (the bills of materials are validated against the CycloneDX schema with it)
//!   and `moto[server]` (the AWS provider's tests run against its emulated EC2).
//!
//! - `cargo-nextest` (pinned, from crates.io) when no `cargo nextest` answers: the test runner gives each
//!   test its own process and time limits (`.config/nextest.toml`).
//!
//! - `prlimit` (util-linux) and `curl`, where missing: tests set the manager's descriptor limit and talk
//!   TLS to it with them.
//!
//! Outside CI a failure is reported, not fatal: the tests that need the tool then say loudly that they were
//! skipped. With `CI` set it stops the run: nothing may skip there but what the machine kind truly lacks.

use std::process::Command;

use crate::shell::{cargo, exec, has, target_dir};

/// The cargo-nextest release installed when none is (`cargo install --locked`).
const NEXTEST: &str = "0.9.151";

/// Debian packages: (the program that must answer, its arguments, the package, what needs it).
const DEBIAN: &[(&str, &[&str], &str, &str)] = &[
    ("promtool", &["--version"], "prometheus", "the monitoring tests"),
    ("skopeo", &["--version"], "skopeo", "the release image tests"),
    ("umoci", &["--version"], "umoci", "the release image tests"),
    (
        "prlimit",
        &["--version"],
        "util-linux",
        "the connection-flood test",
    ),
    ("curl", &["--version"], "curl", "the serving tests"),
    (
        "aarch64-linux-gnu-gcc",
        &["--version"],
        "gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
        "the multi-architecture image test",
    ),
    (
        "qemu-aarch64-static",
        &["--version"],
        "qemu-user-static",
        "the multi-architecture image test",
    ),
];

/// Python packages for `<target dir>/venv`, pinned.
const PYTHON: &[&str] = &[
    "cyclonedx-python-lib[json-validation]==11.12.0",
    // The demo installs the same on first use (`demo --cloud aws`).
    include_str!("../../crates/testing/harness/moto-requirement.txt").trim_ascii(),
];

/// Installs what is missing; with `CI` set, a tool that cannot be installed is an error.
pub(crate) fn install() -> anyhow::Result<()> {
    let ci = std::env::var_os("CI").is_some();
    let mut failed = Vec::new();
    let missing: Vec<_> = DEBIAN
        .iter()
        .filter(|(tool, args, ..)| !has(tool, args))
        .collect();
    if !missing.is_empty() {
        let packages: Vec<&str> = missing.iter().map(|(_, _, package, _)| *package).collect();
        if let Err(why) = apt_get(&packages) {
            for (tool, _, package, needs) in missing {
                eprintln!(
                    "{tool} is missing and cannot be installed ({why}): {needs} will be SKIPPED. Install Debian's `{package}` package to run them"
                );
                failed.push(*tool);
            }
        }
    }
    if !has("cargo", &["nextest", "--version"]) {
        eprintln!("installing cargo-nextest {NEXTEST} from crates.io (a few minutes, once)…");
        if let Err(why) = exec(cargo().args(["install", "--locked", "--version", NEXTEST, "cargo-nextest"])) {
            eprintln!(
                "cannot install cargo-nextest ({why:#}): the tests run with `cargo test`, without per-test time limits"
            );
            failed.push("cargo-nextest");
        }
    }
    if let Err(why) = venv() {
        eprintln!(
            "cannot set up the Python environment ({why}): the bill-of-materials schema checks and the AWS provider's tests against moto will be SKIPPED"
        );
        failed.push("the Python environment (moto, cyclonedx)");
    }
    if ci && !failed.is_empty() {
        anyhow::bail!(
            "with CI set, every test tool must be installed; these could not be: {}",
            failed.join(", ")
        );
    }
    Ok(())
}

fn apt_get(packages: &[&str]) -> Result<(), String> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !has("apt-get", &["--version"]) || (!root && !has("sudo", &["-n", "true"])) {
        return Err("needs apt-get as root".into());
    }
    eprintln!(
        "installing Debian packages for the tests: {}…",
        packages.join(" ")
    );
    let run = |args: &[&str]| {
        let mut command = if root {
            Command::new(args[0])
        } else {
            let mut sudo = Command::new("sudo");
            sudo.args(["-n", args[0]]);
            sudo
        };
        command.args(&args[1..]).env("DEBIAN_FRONTEND", "noninteractive");
        exec(&mut command)
    };
    // A tool may need more than one package (a cross compiler and its C library).
    let install: Vec<&str> = ["apt-get", "install", "-y", "--no-install-recommends"]
        .into_iter()
        .chain(packages.iter().flat_map(|p| p.split_whitespace()))
        .collect();
    run(&install)
        .or_else(|_| {
            run(&["apt-get", "update"])?;
            run(&install)
        })
        .map_err(|error| format!("{error:#}"))
}

/// The Python environment alone (moto, for `cargo xtask bench aws`).
pub(crate) fn python() -> Result<(), String> {
    venv()
}

/// `<target dir>/venv` with [`PYTHON`] installed; a marker file records what was installed, so a second
/// run costs nothing.
fn venv() -> Result<(), String> {
    let venv = target_dir().join("venv");
    let marker = venv.join("installed.txt");
    let wanted = PYTHON.join("\n");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == wanted) {
        return Ok(());
    }
    eprintln!(
        "installing Python packages for the tests into {}: {}…",
        venv.display(),
        PYTHON.join(" ")
    );
    let python = if has("python3", &["--version"]) {
        "python3"
    } else {
        "python"
    };
    exec(Command::new(python).args(["-m", "venv"]).arg(&venv)).map_err(|e| format!("{e:#}"))?;
    exec(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(PYTHON),
    )
    .map_err(|e| format!("{e:#}"))?;
    std::fs::write(&marker, wanted).map_err(|e| e.to_string())
}
