//! What the xtask tests that package the workspace's debug binary share.

// Each test binary uses its part.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub(crate) const BIN: &str = "cloud-controller-manager";

/// The target directory this test was built into (`<target>/debug/deps/release-…`).
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub(crate) fn xtask(args: &[&str]) -> Output {
    let binary = target_dir().join("debug").join(BIN);
    assert!(
        binary.is_file(),
        "{} is not built: run the workspace's tests (cargo xtask test), which build it",
        binary.display()
    );
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .args(["--profile", "dev", "--no-build", "--bin", BIN, "--target-dir"])
        .arg(target_dir())
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "xtask {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub(crate) fn run(program: &str, args: &[&str], dir: &Path) -> Output {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub(crate) fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Says loudly that `what` is skipped because `missing`, or, under CI (`CI` set), where `cargo xtask
/// test` installs every tool this machine kind can have, fails the test.
pub(crate) fn skipped(what: &str, missing: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what}: {missing}; with CI set a missing tool fails the test"
    );
    eprintln!("SKIPPED: {what}: {missing}");
}

pub(crate) fn available(program: &str, args: &[&str], what: &str) -> bool {
    let found = Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        skipped(
            what,
            &format!(
                "`{program}` is not available here (cargo xtask test installs it where apt-get may run)"
            ),
        );
    }
    found
}

/// `cargo xtask image` of the debug binary into `out/<dir>`: its JSON description.
pub(crate) fn build_image(out: &Path, dir: &str) -> Value {
    let output = xtask(&[
        "image",
        "--output",
        "json",
        "--out",
        out.join(dir).to_str().unwrap(),
    ]);
    let images: Value = serde_json::from_slice(&output.stdout).unwrap();
    images["images"][0].clone()
}
