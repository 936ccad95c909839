//! `cargo xtask image --arch amd64 --arch arm64`: an OCI image index with an image per architecture, each
//! on its architecture's Debian base layer. This machine cannot build the Rust binary for arm64, so the
//! arm64 image carries a stand-in: a small C program built with Debian's cross compiler, run with
//! `qemu-aarch64-static` in the unpacked arm64 image, whose loader and C library must come from the base
//! layer (the same program fails without them).

#![allow(clippy::print_stderr)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use common::{BIN, available, run, text, xtask};

/// Like the Rust binary, it needs libc, libm and libgcc_s (the last two from different packages).
const STAND_IN: &str = r#"#include <math.h>
#include <stdio.h>
#include <sys/utsname.h>
int main(int argc, char **argv) {
    struct utsname u;
    if (uname(&u) != 0) return 1;
    printf("stand-in running on %s (%g)\n", u.machine, sqrt((double)argc * 4.0));
    return 0;
}
"#;

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The blob `digest` of the layout, as JSON.
fn blob(layout: &Path, digest: &str) -> Value {
    json(
        &layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:")),
    )
}

/// Unpacks the layers of `manifest` into `root`, in order.
fn unpack(layout: &Path, manifest: &Value, root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let digest = layer["digest"].as_str().unwrap().trim_start_matches("sha256:");
        let path = layout.join("blobs/sha256").join(digest);
        run(
            "tar",
            &["-xzf", path.to_str().unwrap(), "-C", root.to_str().unwrap()],
            root,
        );
    }
}

#[test]
fn an_index_holds_an_image_per_architecture_and_the_arm64_one_runs_under_qemu() {
    if !available("aarch64-linux-gnu-gcc", &["--version"], "the arm64 stand-in")
        || !available("qemu-aarch64-static", &["--version"], "running the arm64 image")
    {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("stand-in.c"), STAND_IN).unwrap();
    run(
        "aarch64-linux-gnu-gcc",
        &[
            "-O2",
            "-o",
            "stand-in",
            "stand-in.c",
            "-Wl,--no-as-needed",
            "-lm",
            "-lgcc_s",
        ],
        dir,
    );
    let stand_in = dir.join("stand-in");
    let arch_binary = format!("arm64={}", stand_in.display());
    let out = dir.join("images");
    let both = xtask(&[
        "image",
        "--output",
        "json",
        "--arch",
        "amd64",
        "--arch",
        "arm64",
        "--arch-binary",
        &arch_binary,
        "--out",
        out.to_str().unwrap(),
    ]);
    let image: Value = serde_json::from_slice(&both.stdout).unwrap();
    let image = &image["images"][0];
    let layout = PathBuf::from(image["layout"].as_str().unwrap());
    assert_eq!(image["platforms"], serde_json::json!(["amd64", "arm64"]));

    let manifests = check_index(&layout, image);
    // This machine's image in the index is the one a single-architecture build makes.
    let single: Value = serde_json::from_slice(
        &xtask(&[
            "image",
            "--output",
            "json",
            "--out",
            dir.join("single").to_str().unwrap(),
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(manifests[0]["digest"], single["images"][0]["digest"]);

    // skopeo picks the arm64 image out of the index.
    let oci = format!("oci:{}:{}", layout.display(), image["tag"].as_str().unwrap());
    let inspected: Value = serde_json::from_str(&text(&run(
        "skopeo",
        &["inspect", "--override-arch", "arm64", &oci],
        dir,
    )))
    .unwrap();
    assert_eq!(inspected["Architecture"], "arm64");
    let arm64_layers: Vec<Value> = blob(&layout, manifests[1]["digest"].as_str().unwrap())["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].clone())
        .collect();
    assert_eq!(
        inspected["Layers"],
        Value::Array(arm64_layers),
        "the arm64 entry's layers"
    );
    run_arm64(&layout, &manifests[1], dir);
    check_sboms(image);
}

/// The layout names one index, which holds an image per platform, each config saying the same platform;
/// the index's entries.
fn check_index(layout: &Path, image: &Value) -> Vec<Value> {
    // The layout names one index; it holds an image per platform, each config saying the same platform.
    let top = json(&layout.join("index.json"));
    assert_eq!(top["manifests"].as_array().unwrap().len(), 1);
    assert_eq!(
        top["manifests"][0]["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    assert_eq!(top["manifests"][0]["digest"], image["digest"]);
    let index = blob(layout, image["digest"].as_str().unwrap());
    let manifests = index["manifests"].as_array().unwrap();
    let platforms: Vec<(String, Option<String>)> = manifests
        .iter()
        .map(|m| {
            let platform = &m["platform"];
            assert_eq!(platform["os"], "linux");
            let config = blob(
                layout,
                blob(layout, m["digest"].as_str().unwrap())["config"]["digest"]
                    .as_str()
                    .unwrap(),
            );
            assert_eq!(
                config["architecture"], platform["architecture"],
                "the config says its platform"
            );
            assert_eq!(config["variant"], platform["variant"]);
            (
                platform["architecture"].as_str().unwrap().to_owned(),
                platform["variant"].as_str().map(str::to_owned),
            )
        })
        .collect();
    assert_eq!(
        platforms,
        [
            ("amd64".to_owned(), None),
            ("arm64".to_owned(), Some("v8".to_owned()))
        ]
    );

    manifests.clone()
}

/// Unpacked, the arm64 image runs its binary under qemu with nothing but its own root.
fn run_arm64(layout: &Path, entry: &Value, dir: &Path) {
    let arm64 = blob(layout, entry["digest"].as_str().unwrap());
    let root = dir.join("rootfs");
    unpack(layout, &arm64, &root);
    for package in ["libc6", "libgcc-s1"] {
        let copyright = root.join("usr/share/doc").join(package).join("copyright");
        assert!(copyright.is_file(), "{} is missing", copyright.display());
    }
    let binary = root.join("usr/local/bin").join(BIN);
    let ran = run(
        "qemu-aarch64-static",
        &["-L", root.to_str().unwrap(), binary.to_str().unwrap()],
        dir,
    );
    assert_eq!(text(&ran).trim(), "stand-in running on aarch64 (2)");
    // …and not without it (the negative control: the loader and C library are the base layer's; qemu
    // would take this machine's, so there must be none here).
    assert!(
        !Path::new("/lib/ld-linux-aarch64.so.1").exists(),
        "this machine has an arm64 loader of its own, so the negative control proves nothing"
    );
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let bare = Command::new("qemu-aarch64-static")
        .args(["-L", empty.to_str().unwrap(), binary.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !bare.status.success(),
        "the stand-in ran without the image's root"
    );
}

/// The arm64 bill of materials names arm64's C library; this machine's names its own.
fn check_sboms(image: &Value) {
    // (package, architecture) of each Debian package but the architecture-independent ones.
    let debian = |path: &str| -> Vec<(String, String)> {
        json(Path::new(path))["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| {
                c["purl"]
                    .as_str()?
                    .strip_prefix("pkg:deb/debian/")
                    .map(str::to_owned)
            })
            .filter_map(|p| {
                let (name, rest) = p.split_once('@')?;
                let arch = rest.split("?arch=").nth(1)?;
                (arch != "all").then(|| (name.to_owned(), arch.to_owned()))
            })
            .collect()
    };
    let arm64 = debian(image["other_sboms"]["arm64"].as_str().unwrap());
    let expected: Vec<(String, String)> = ["libc6", "libgcc-s1"]
        .iter()
        .map(|n| ((*n).to_owned(), "arm64".to_owned()))
        .collect();
    assert_eq!(arm64, expected, "the stand-in's libraries, of arm64");
    let host = debian(image["sbom"].as_str().unwrap());
    assert!(
        host.iter().all(|(_, arch)| arch == "amd64") && host.iter().any(|(n, _)| n == "libc6"),
        "{host:?}"
    );
}

#[test]
fn another_architecture_needs_its_binary_one_error_naming_the_flag() {
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("out");
    let attempt = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args([
                "image",
                "--profile",
                "dev",
                "--no-build",
                "--bin",
                BIN,
                "--out",
                out.to_str().unwrap(),
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} passed");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    assert!(attempt(&["--arch", "arm64"]).contains("--arch-binary arm64=PATH"));
    assert!(attempt(&["--arch", "riscv64"]).contains("--arch riscv64"));
    assert!(attempt(&["--arch", "arm64", "--arch-binary", "arm64=/nonexistent"]).contains("no such file"));
    assert!(attempt(&["--arch-binary", "arm64=/bin/true"]).contains("not among the --arch given"));
    let wrong = attempt(&["--arch", "arm64", "--arch-binary", "arm64=/bin/true"]);
    assert!(
        wrong.contains("for Advanced Micro Devices X86-64, not arm64"),
        "{wrong}"
    );
    assert!(!out.exists(), "nothing written");
}
