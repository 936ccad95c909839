//! `cargo xtask dist` and `cargo xtask image`, checked with real tools: `sha256sum`, `tar`, the CycloneDX
//! schema (`cyclonedx-python-lib`), `skopeo`, `umoci`, `chroot`, `kubectl kustomize`, and `docker` where
//! a daemon runs. They package the debug binaries the workspace's test build already made
//! (`--profile dev --no-build`), so the tests cost seconds, not a release build.

#![allow(clippy::print_stderr)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use common::{BIN, available, build_image, repo, run, skipped, target_dir, text, xtask};

/// Checks `document` against the CycloneDX 1.5 JSON schema with the reference Python library, when the
/// test environment (`cargo xtask test` sets it up under the target dir) has it.
fn validate_cyclonedx(document: &Path) {
    let python = target_dir().join("venv/bin/python");
    if !python.is_file() {
        skipped(
            "CycloneDX schema validation",
            &format!("{} is missing (cargo xtask test installs it)", python.display()),
        );
        return;
    }
    let script = "import sys\nfrom cyclonedx.validation.json import JsonStrictValidator\nfrom cyclonedx.schema import SchemaVersion\nerrors = JsonStrictValidator(SchemaVersion.V1_5).validate_str(open(sys.argv[1]).read())\nprint(errors)\nsys.exit(1 if errors else 0)\n";
    let output = Command::new(&python)
        .args(["-c", script])
        .arg(document)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{} is not valid CycloneDX 1.5: {}{}",
        document.display(),
        text(&output),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `name version → checksum` from the repository's Cargo.lock.
fn lock_checksum(name: &str) -> (String, String) {
    let lock = std::fs::read_to_string(repo().join("Cargo.lock")).unwrap();
    let block = lock
        .split("[[package]]")
        .find(|b| b.contains(&format!("name = \"{name}\"\n")))
        .unwrap();
    let field = |key: &str| {
        block
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} = \"")))
            .unwrap()
            .trim_end_matches('"')
            .to_owned()
    };
    (field("version"), field("checksum"))
}

fn check_sbom(path: &Path) -> Value {
    validate_cyclonedx(path);
    let sbom: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let components = sbom["components"].as_array().unwrap();
    let find = |name: &str| components.iter().find(|c| c["name"] == name);
    // What the binary links, with the lock file's versions and checksums…
    for name in ["kube-client", "tokio", "rustls"] {
        let (version, checksum) = lock_checksum(name);
        let component = find(name).unwrap_or_else(|| panic!("{name} is missing from {}", path.display()));
        assert_eq!(component["version"], version.as_str(), "{name}");
        assert_eq!(component["hashes"][0]["content"], checksum.as_str(), "{name}");
        assert_eq!(component["purl"], format!("pkg:cargo/{name}@{version}").as_str());
    }
    // …and nothing only the tests use.
    for dev_only in ["proptest", "roxmltree"] {
        assert!(
            find(dev_only).is_none(),
            "{dev_only} is not linked into the binary"
        );
    }
    assert_eq!(sbom["metadata"]["component"]["name"], BIN);
    // Every dependency edge names a component.
    let refs: Vec<&Value> = components.iter().map(|c| &c["bom-ref"]).collect();
    for edge in sbom["dependencies"].as_array().unwrap() {
        for to in edge["dependsOn"].as_array().unwrap() {
            assert!(refs.contains(&to), "{to} is not a component");
        }
    }
    sbom
}

#[test]
fn dist_writes_verified_tarballs_and_a_bill_of_materials_reproducibly() {
    let out = tempfile::tempdir().unwrap();
    let first = out.path().join("one");
    let second = out.path().join("two");
    xtask(&["dist", "--out", first.to_str().unwrap()]);
    xtask(&["dist", "--out", second.to_str().unwrap()]);
    let sums = std::fs::read_to_string(first.join("SHA256SUMS")).unwrap();
    assert_eq!(
        sums,
        std::fs::read_to_string(second.join("SHA256SUMS")).unwrap(),
        "the same binary gives the same bytes"
    );
    run("sha256sum", &["--check", "--strict", "SHA256SUMS"], &first);

    let tarball = sums
        .lines()
        .find_map(|l| l.split_whitespace().nth(1).filter(|f| f.ends_with(".tar.gz")))
        .unwrap()
        .to_owned();
    let stem = tarball.trim_end_matches(".tar.gz");
    assert!(stem.starts_with(&format!("{BIN}-0.1.0-")), "{stem}");
    let listing = text(&run(
        "tar",
        &["--list", "--verbose", "--gzip", "--file", &tarball],
        &first,
    ));
    let entries: Vec<_> = listing
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .collect();
    let names: Vec<_> = entries.iter().map(|e| e[5]).collect();
    assert_eq!(
        names,
        [
            format!("{stem}/"),
            format!("{stem}/LICENSE"),
            format!("{stem}/README.md"),
            format!("{stem}/RELEASE-NOTES.md"),
            format!("{stem}/{BIN}"),
            format!("{stem}/sbom.cdx.json")
        ]
    );
    assert!(entries.iter().all(|e| e[1] == "0/0"), "owned by root:\n{listing}");
    assert_eq!(entries[4][0], "-rwxr-xr-x");

    run("tar", &["--extract", "--gzip", "--file", &tarball], &first);
    let version = run(&format!("./{stem}/{BIN}"), &["--version"], &first);
    assert_eq!(text(&version).trim(), "Kubernetes v0.1.0");
    let license = std::fs::read_to_string(first.join(stem).join("LICENSE")).unwrap();
    assert!(license.contains("Apache License") && license.contains("Version 2.0"));
    check_sbom(&first.join(format!("{stem}.cdx.json")));
    // The release notes: CHANGELOG.md's section of the version, else its [Unreleased] one, said so.
    let notes = std::fs::read_to_string(first.join(format!("{BIN}-0.1.0.release-notes.md"))).unwrap();
    assert!(
        notes.starts_with(&format!("# {BIN} 0.1.0 (unreleased: from `## [Unreleased]` of ")),
        "{notes}"
    );
    let changelog = std::fs::read_to_string(repo().join("CHANGELOG.md")).unwrap();
    let unreleased = changelog
        .split("## [Unreleased]")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    assert!(notes.ends_with(&format!("{}\n", unreleased.trim())), "{notes}");
    assert_eq!(
        std::fs::read(first.join(stem).join("RELEASE-NOTES.md")).unwrap(),
        notes.as_bytes()
    );
    assert_eq!(
        std::fs::read(first.join(stem).join("sbom.cdx.json")).unwrap(),
        std::fs::read(first.join(format!("{stem}.cdx.json"))).unwrap()
    );
}

#[test]
fn a_bad_binary_name_is_one_error_naming_the_flag_and_writes_nothing() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "image",
            "--no-build",
            "--bin",
            "aws-cloud-controller-manager",
            "--out",
        ])
        .arg(out.path())
        .current_dir(repo())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "--bin aws-cloud-controller-manager: no such shipped binary (known: cloud-controller-manager"
        ),
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

#[test]
fn the_image_is_reproducible_inspectable_and_runs_as_non_root() {
    let out = tempfile::tempdir().unwrap();
    let build = |dir: &str| build_image(out.path(), dir);
    let image = build("one");
    let again = build("two");
    let digest = image["digest"].as_str().unwrap().to_owned();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{digest}");
    assert_eq!(
        again["digest"],
        digest.as_str(),
        "the same binary gives the same digest"
    );
    let archive = PathBuf::from(image["archive"].as_str().unwrap());
    assert_eq!(
        std::fs::read(&archive).unwrap(),
        std::fs::read(again["archive"].as_str().unwrap()).unwrap()
    );
    let layout = PathBuf::from(image["layout"].as_str().unwrap());
    eprintln!(
        "image {BIN}: {} bytes compressed, {} unpacked (debug build)",
        image["compressed_bytes"], image["uncompressed_bytes"]
    );

    // The layout's own files, read directly: the index points at the manifest, which points at the
    // config; the user, entrypoint and labels are there.
    let blob = |digest: &str| -> Value {
        let bytes = std::fs::read(
            layout
                .join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:")),
        )
        .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    };
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"][0]["digest"], digest.as_str());
    let manifest = blob(&digest);
    let config = blob(manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Entrypoint"][0],
        format!("/usr/local/bin/{BIN}").as_str()
    );
    for label in ["title", "version", "licenses", "created", "description"] {
        let key = format!("org.opencontainers.image.{label}");
        assert!(
            config["config"]["Labels"][&key]
                .as_str()
                .is_some_and(|v| !v.is_empty()),
            "{key}"
        );
    }

    if available(
        "skopeo",
        &["--version"],
        "skopeo inspect of the layout and the archive",
    ) {
        let oci = text(&run(
            "skopeo",
            &["inspect", &format!("oci:{}:0.1.0", layout.display())],
            out.path(),
        ));
        let oci: Value = serde_json::from_str(&oci).unwrap();
        assert_eq!(oci["Digest"], digest.as_str());
        assert_eq!(oci["Labels"]["org.opencontainers.image.title"], BIN);
        let archived = text(&run(
            "skopeo",
            &["inspect", &format!("docker-archive:{}", archive.display())],
            out.path(),
        ));
        let archived: Value = serde_json::from_str(&archived).unwrap();
        assert_eq!(archived["Layers"].as_array().map(Vec::len), Some(2));
    }

    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| text(&o).trim() == "0");
    if !root {
        skipped("unpacking the image and running it under chroot", "it needs root");
    } else if available("umoci", &["--version"], "umoci unpack and chroot") {
        let bundle = out.path().join("bundle");
        run(
            "umoci",
            &[
                "unpack",
                "--image",
                &format!("{}:0.1.0", layout.display()),
                bundle.to_str().unwrap(),
            ],
            out.path(),
        );
        let rootfs = bundle.join("rootfs");
        let chroot = |args: &[&str]| {
            Command::new("chroot")
                .args(["--userspec=65532:65532"])
                .arg(&rootfs)
                .arg(format!("/usr/local/bin/{BIN}"))
                .args(args)
                .output()
                .unwrap()
        };
        let version = chroot(&["--version"]);
        assert!(
            version.status.success(),
            "{}",
            String::from_utf8_lossy(&version.stderr)
        );
        assert_eq!(text(&version).trim(), "Kubernetes v0.1.0");
        let examples = format!("/usr/share/doc/{BIN}/examples/leader-migration");
        let valid = chroot(&["leader-migration", "validate", &format!("{examples}/n.yaml")]);
        assert!(
            valid.status.success(),
            "{}",
            String::from_utf8_lossy(&valid.stderr)
        );
        assert!(text(&valid).contains("n.yaml: valid"), "{}", text(&valid));
        let broken = chroot(&["leader-migration", "validate", &format!("{examples}/broken.yaml")]);
        assert_eq!(broken.status.code(), Some(1));
        // The CA bundle the SDKs' TLS reads, the users, and the bill of materials with the Debian packages.
        assert!(
            std::fs::read_to_string(rootfs.join("etc/ssl/certs/ca-certificates.crt"))
                .unwrap()
                .contains("BEGIN CERTIFICATE")
        );
        assert!(
            std::fs::read_to_string(rootfs.join("etc/passwd"))
                .unwrap()
                .contains("nonroot:x:65532:65532")
        );
        let sbom = check_sbom(&rootfs.join(format!("usr/share/doc/{BIN}/sbom.cdx.json")));
        let purls: Vec<&str> = sbom["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["purl"].as_str())
            .collect();
        for package in ["libc6", "ca-certificates"] {
            assert!(
                purls
                    .iter()
                    .any(|p| p.starts_with(&format!("pkg:deb/debian/{package}@"))),
                "{package}: {purls:?}"
            );
            assert!(
                rootfs
                    .join(format!("usr/share/doc/{package}/copyright"))
                    .is_file(),
                "{package}'s copyright"
            );
        }
    }

    // deploy/ pointed at the image by digest, with the snippet `cargo xtask image` prints.
    let snippet = format!("images:\n  - name: {BIN}\n    newName: {BIN}\n    digest: {digest}\n");
    let overlay = out.path().join("overlay");
    std::fs::create_dir(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        // kustomize takes only relative paths: climb from the overlay to `/`, then down to deploy/.
        format!(
            "resources:\n  - {}{}\n{snippet}",
            "../".repeat(overlay.components().count() - 1),
            repo()
                .join("deploy/overlays/fake")
                .display()
                .to_string()
                .trim_start_matches('/')
        ),
    )
    .unwrap();
    let rendered = text(&run(
        "kubectl",
        &["kustomize", "--load-restrictor", "LoadRestrictionsNone", "."],
        &overlay,
    ));
    assert!(rendered.contains(&format!("image: {BIN}@{digest}")), "{rendered}");
    let text_output = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "image",
            "--profile",
            "dev",
            "--no-build",
            "--bin",
            BIN,
            "--target-dir",
        ])
        .arg(target_dir())
        .arg("--out")
        .arg(out.path().join("three"))
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(text(&text_output).contains(&snippet), "{}", text(&text_output));
}

/// The only test that needs a Docker engine (this machine kind has none: `cargo xtask test` leaves it out
/// and says so at the end of the run, see `xtask/src/test.rs`).
#[test]
fn the_image_loads_and_runs_under_docker() {
    let docker = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output();
    if !docker.is_ok_and(|o| o.status.success()) {
        skipped("docker load and docker run", "no Docker engine answers here");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let image = build_image(out.path(), "docker");
    let archive = PathBuf::from(image["archive"].as_str().unwrap());
    let loaded = text(&run(
        "docker",
        &["load", "--input", archive.to_str().unwrap()],
        out.path(),
    ));
    assert!(loaded.contains(&format!("{BIN}:0.1.0")), "{loaded}");
    let ran = run(
        "docker",
        &[
            "run",
            "--rm",
            "--network",
            "none",
            &format!("{BIN}:0.1.0"),
            "--version",
        ],
        out.path(),
    );
    assert_eq!(text(&ran).trim(), "Kubernetes v0.1.0");
    let user = run(
        "docker",
        &[
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            format!("/usr/local/bin/{BIN}").as_str(),
            &format!("{BIN}:0.1.0"),
            "leader-migration",
            "default",
        ],
        out.path(),
    );
    assert!(
        text(&user).contains("LeaderMigrationConfiguration"),
        "{}",
        text(&user)
    );
    let inspected = text(&run(
        "docker",
        &[
            "image",
            "inspect",
            "--format",
            "{{.Config.User}}",
            &format!("{BIN}:0.1.0"),
        ],
        out.path(),
    ));
    assert_eq!(inspected.trim(), "65532:65532");
}
