//! The semver check of the published crates: `cargo-semver-checks` (pinned, from crates.io) against the
//! last release, the newest `v*` tag. Before the first release there is no published API to break, so the
//! step says so and compares nothing; from the first tag on it runs in every full `cargo xtask test`.

use std::process::Command;

use anyhow::Result;

use crate::shell::{cargo, exec, has, repo_root};

/// The cargo-semver-checks release installed when none is (`cargo install --locked`).
const SEMVER_CHECKS: &str = "0.51.0";

/// The newest tag `v<version>` of this checkout, by version.
fn last_release() -> Option<String> {
    let output = Command::new("git")
        .args(["tag", "--list", "v[0-9]*", "--sort=-v:refname"])
        .current_dir(repo_root())
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .map(str::to_owned)
}

pub(crate) fn check() -> Result<()> {
    let Some(tag) = last_release() else {
        eprintln!(
            "semver: no release is tagged (v*) yet, so there is no published API to compare with; \
             cargo-semver-checks runs from the first release on"
        );
        return Ok(());
    };
    if !has("cargo", &["semver-checks", "--version"]) {
        eprintln!("installing cargo-semver-checks {SEMVER_CHECKS} from crates.io (a few minutes, once)…");
        exec(cargo().args([
            "install",
            "--locked",
            "--version",
            SEMVER_CHECKS,
            "cargo-semver-checks",
        ]))?;
    }
    // `--workspace` checks the published crates only (it skips `publish = false` ones).
    exec(cargo().args(["semver-checks", "--workspace", "--baseline-rev", &tag]))
}
