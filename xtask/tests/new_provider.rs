//! `cargo xtask new-provider`: the scaffold builds, is formatted, and its test passes against the test
//! API server. It is created outside the repository (its own workspace, with this checkout's crates by
//! path and this `Cargo.lock`, so it builds offline), and built in this test's target directory.

use std::path::{Path, PathBuf};
use std::process::Command;

fn target_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(3)
        .unwrap()
        .to_path_buf()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn xtask(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap()
}

#[test]
fn the_scaffold_builds_and_its_test_passes() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("provider-acme");
    let created = xtask(&["new-provider", "acme", "--path", dir.to_str().unwrap()]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    assert!(String::from_utf8_lossy(&created.stdout).contains("binary: acme-cloud-controller-manager"));

    let cargo = |args: &[&str]| {
        let output = Command::new(env!("CARGO"))
            .args(args)
            .arg("--manifest-path")
            .arg(dir.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", target_dir().join("scaffold"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "cargo {args:?} in the scaffold failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    cargo(&["fmt", "--check"]);
    let tested = cargo(&["test", "--offline", "--test", "manager"]);
    assert!(
        tested.contains("test a_node_is_initialised_from_its_instance ... ok"),
        "{tested}"
    );

    // The same name again is refused, and nothing is changed.
    let again = xtask(&["new-provider", "acme", "--path", dir.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
}

#[test]
fn a_bad_name_is_refused_before_anything_is_written() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("x");
    let refused = xtask(&["new-provider", "Acme_Cloud", "--path", dir.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("NAME \"Acme_Cloud\": use lower-case letters"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!dir.exists());
    assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
}
