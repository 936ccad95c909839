//! Helpers shared by the integration tests.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The binary under test.
pub(crate) fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
}

/// The repository root, for shipped examples.
pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// Runs the binary with `args` from the repository root.
pub(crate) fn run(args: &[&str]) -> Output {
    binary()
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("run cloud-controller-manager")
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
