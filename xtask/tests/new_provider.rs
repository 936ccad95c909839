//! `cargo xtask new-provider`: the scaffold builds, is formatted, and its test passes against the test
//! API server. It is created outside the repository (its own workspace with this `Cargo.lock`, so it
//! builds offline) and built as a vendor's crate would be: against the framework's crates as `cargo
//! package` makes them for crates.io (patched in), from outside this repository (none of its cargo
//! configuration applies, so no Kubernetes API version but the one the scaffold picks), in this test's
//! target directory.

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

    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), from_packages(&manifest)).unwrap();

    let cargo = |args: &[&str]| {
        let output = Command::new(env!("CARGO"))
            .args(args)
            .arg("--manifest-path")
            .arg(dir.join("Cargo.toml"))
            .current_dir(scratch.path())
            .env_remove("K8S_OPENAPI_ENABLED_VERSION")
            .env("CARGO_TARGET_DIR", target_dir().join("scaffold"))
            // A vendor's own profile would keep full debug info; here it would triple this target
            // directory on a shared disk, and test nothing.
            .env("CARGO_PROFILE_DEV_DEBUG", "false")
            .env("CARGO_PROFILE_TEST_DEBUG", "false")
            .env("CARGO_INCREMENTAL", "0")
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

/// The scaffold's manifest with each crate of its `[patch.crates-io]` (this checkout's, by path) replaced
/// by that crate as `cargo package` makes it, unpacked.
fn from_packages(manifest: &str) -> String {
    let (head, patch) = manifest
        .split_once("[patch.crates-io]\n")
        .expect("the scaffold patches crates.io with the framework's crates");
    let names: Vec<&str> = patch
        .lines()
        .filter_map(|line| line.split_once(" = ").map(|(name, _)| name))
        .collect();
    assert!(names.contains(&"kube-ccm") && names.len() >= 4, "{patch}");
    let version = head
        .lines()
        .find_map(|l| l.strip_prefix("kube-ccm = { version = \""))
        .and_then(|rest| rest.split('"').next())
        .expect("kube-ccm by version");
    let scaffold = target_dir().join("scaffold");
    let mut package = Command::new(env!("CARGO"));
    package
        .args([
            "package",
            "--no-verify",
            "--allow-dirty",
            "--offline",
            "--target-dir",
        ])
        .arg(&scaffold)
        .current_dir(repo());
    // Every crate of the family, so that each one's lock file resolves (the bundled providers are
    // dev-dependencies of some), and `cargo package` is seen to succeed for all of them.
    let workspace = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let family: Vec<&str> = workspace
        .lines()
        .filter_map(|l| {
            // A renamed key (`cloud-provider = { package = "kube-ccm-provider", … }`) or the name itself.
            match l.split_once("package = \"kube-ccm") {
                Some((_, rest)) => Some(rest.split('"').next().unwrap_or_default()),
                None => l
                    .strip_prefix("kube-ccm-")?
                    .split_once(" = ")
                    .map(|(suffix, _)| suffix),
            }
        })
        .map(|suffix| suffix.strip_prefix('-').unwrap_or(suffix))
        .collect();
    assert!(family.len() >= 8 && family.contains(&"conformance"), "{family:?}");
    package.args(["-p", "kube-ccm"]);
    for suffix in &family {
        package.arg("-p").arg(format!("kube-ccm-{suffix}"));
    }
    let packaged = package.output().unwrap();
    assert!(
        packaged.status.success(),
        "cargo package failed:\n{}",
        String::from_utf8_lossy(&packaged.stderr)
    );
    let unpacked = scaffold.join("unpacked");
    if unpacked.exists() {
        std::fs::remove_dir_all(&unpacked).unwrap();
    }
    std::fs::create_dir_all(&unpacked).unwrap();
    let mut out = format!("{head}[patch.crates-io]\n");
    for name in names {
        let crate_file = scaffold.join(format!("package/{name}-{version}.crate"));
        let extracted = Command::new("tar")
            .arg("-xzf")
            .arg(&crate_file)
            .arg("-C")
            .arg(&unpacked)
            .status()
            .unwrap();
        assert!(extracted.success(), "tar -xzf {}", crate_file.display());
        let dir = unpacked.join(format!("{name}-{version}"));
        assert!(dir.join("Cargo.toml").is_file(), "{}", dir.display());
        out.push_str(&format!("{name} = {{ path = \"{}\" }}\n", dir.display()));
    }
    out
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
