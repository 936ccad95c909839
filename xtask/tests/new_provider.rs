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
    let packaged = from_packages(&manifest, &scratch.path().join("packages"));
    assert!(
        !packaged.contains(repo().to_str().unwrap()),
        "the scaffold names nothing in this repository:\n{packaged}"
    );
    std::fs::write(dir.join("Cargo.toml"), packaged).unwrap();

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
    // The conformance kit, from the packages too: every check of the capabilities the scaffold has runs
    // and passes, and its negative controls fail.
    let conformance = cargo(&["test", "--offline", "--test", "conformance"]);
    for check in [
        "instances_follow_the_instance_through_its_life",
        "an_outage_is_an_error_never_gone",
        "nodes_are_initialised_from_the_cloud",
        "a_node_is_deleted_only_when_its_instance_is_gone",
        "no_cloud_write_lands_after_the_lock_is_lost",
        "negative_control_gone_on_error",
    ] {
        assert!(
            conformance.contains(&format!("test {check} ... ok")),
            "{check}:\n{conformance}"
        );
    }

    // Its image, made by this repository's image tooling from the vendor's project.
    let out = scratch.path().join("image");
    let image = xtask(&[
        "image",
        "--manifest-path",
        dir.join("Cargo.toml").to_str().unwrap(),
        "--profile",
        "dev",
        "--no-build",
        "--target-dir",
        target_dir().join("scaffold").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--output",
        "json",
    ]);
    assert!(
        image.status.success(),
        "{}",
        String::from_utf8_lossy(&image.stderr)
    );
    let built: serde_json::Value = serde_json::from_slice(&image.stdout).unwrap();
    let images = built["images"].as_array().unwrap();
    assert_eq!(images.len(), 1, "{built}");
    assert_eq!(images[0]["name"], "acme-cloud-controller-manager", "{built}");
    assert_eq!(images[0]["tag"], "0.1.0", "the vendor's version: {built}");
    let layout = std::path::PathBuf::from(images[0]["layout"].as_str().unwrap());
    assert!(layout.join("index.json").is_file(), "{}", layout.display());

    // The same name again is refused, and nothing is changed.
    let again = xtask(&["new-provider", "acme", "--path", dir.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
}

/// The scaffold's manifest with each crate of its `[patch.crates-io]` (this checkout's, by path) replaced
/// by that crate as `cargo package` makes it, unpacked into `unpacked` (outside this repository).
fn from_packages(manifest: &str, unpacked: &Path) -> String {
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
    std::fs::create_dir_all(unpacked).unwrap();
    let mut out = format!("{head}[patch.crates-io]\n");
    for name in names {
        let crate_file = scaffold.join(format!("package/{name}-{version}.crate"));
        let extracted = Command::new("tar")
            .arg("-xzf")
            .arg(&crate_file)
            .arg("-C")
            .arg(unpacked)
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
