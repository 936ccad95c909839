//! `cargo xtask publish` against a real OCI registry (crane's, on loopback), with the real `cosign` and
//! `skopeo`: the pushed image keeps its digest, its signature and its bill of materials' attestation
//! verify with the public key, and each check fails where it must (another key, an unsigned copy, another
//! predicate type). cosign and crane are built from their Go modules by `cargo xtask kube` (`tools/cosign`).

#![allow(clippy::print_stderr)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use common::{available, build_image, repo, skipped, target_dir, text};

const PASSWORD: &str = "correct horse battery staple";

/// A tool `cargo xtask kube` built, from `<target>/kube/kube.json`.
fn kube_tool(name: &str) -> Option<PathBuf> {
    let manifest = target_dir().join("kube/kube.json");
    let found = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|json| json["binaries"][name]["path"].as_str().map(PathBuf::from))
        .filter(|path| path.is_file());
    if found.is_none() {
        skipped(
            &format!("signing the release images with {name}"),
            &format!("{} names no {name} (run `cargo xtask kube`)", manifest.display()),
        );
    }
    found
}

/// crane's in-memory registry on a loopback port, stopped on drop.
struct Registry {
    child: Child,
    address: String,
}

impl Registry {
    fn start(crane: &Path) -> Registry {
        let child = Command::new(crane)
            .args(["registry", "serve", "--address", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("crane starts");
        // Owned before anything can panic, so that it is stopped.
        let mut registry = Registry {
            child,
            address: String::new(),
        };
        let stderr = registry.child.stderr.take().unwrap();
        let (sender, port) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(port) = line.split("serving on port ").nth(1) {
                    let _ = sender.send(port.trim().to_owned());
                }
            }
        });
        let port = port
            .recv_timeout(Duration::from_secs(30))
            .expect("crane's registry says its port");
        registry.address = format!("127.0.0.1:{port}");
        registry
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `program ARGS` in `dir` with cosign's password and a scratch home; the output, whatever the status.
fn attempt(program: &Path, args: &[&str], dir: &Path) -> Output {
    attempt_with(program, args, dir, PASSWORD)
}

fn attempt_with(program: &Path, args: &[&str], dir: &Path, password: &str) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("COSIGN_PASSWORD", password)
        .output()
        .unwrap()
}

fn succeeds(program: &Path, args: &[&str], dir: &Path) -> Output {
    let output = attempt(program, args, dir);
    assert!(
        output.status.success(),
        "{} {args:?} failed:\n{}{}",
        program.display(),
        text(&output),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `program ARGS` fails, saying `reason` on stderr.
fn fails(program: &Path, args: &[&str], dir: &Path, why: &str, reason: &str) {
    let output = attempt(program, args, dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains(reason),
        "{} {args:?} should fail saying {reason:?}, since {why}: {}\n{stderr}",
        program.display(),
        output.status
    );
}

#[test]
fn published_images_verify_with_the_key_and_only_with_it() {
    let (Some(cosign), Some(crane)) = (kube_tool("cosign"), kube_tool("crane")) else {
        return;
    };
    if !available("skopeo", &["--version"], "pushing the release images") {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let image = build_image(dir, "images");
    let digest = image["digest"].as_str().unwrap().to_owned();
    let sbom: Value =
        serde_json::from_slice(&std::fs::read(image["sbom"].as_str().unwrap()).unwrap()).unwrap();
    for prefix in ["signer", "stranger"] {
        succeeds(
            &cosign,
            &["generate-key-pair", "--output-key-prefix", prefix],
            dir,
        );
    }
    let registry = Registry::start(&crane);
    let prefix = format!("{}/ccm", registry.address);
    let images = dir.join("images");
    let publish = |prefix: &str| {
        [
            "publish",
            "--images",
            images.to_str().unwrap(),
            "--registry",
            prefix,
            "--key",
            "signer.key",
            "--no-tlog",
            "--insecure-registry",
            "--cosign",
            cosign.to_str().unwrap(),
            "--output",
            "json",
        ]
        .map(str::to_owned)
    };
    let xtask = Path::new(env!("CARGO_BIN_EXE_xtask"));
    // A wrong password stops it before anything is pushed.
    let early = format!("{}/early", registry.address);
    let args = publish(&early);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = attempt_with(xtask, &args, dir, "wrong");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("--key signer.key"),
        "{stderr}"
    );
    let catalog = succeeds(&crane, &["catalog", &registry.address], dir);
    assert!(!text(&catalog).contains("early"), "pushed: {}", text(&catalog));

    let args = publish(&prefix);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let published = succeeds(xtask, &args, dir);
    let published: Value = serde_json::from_slice(&published.stdout).unwrap();
    let pinned = format!("{prefix}/cloud-controller-manager@{digest}");
    assert_eq!(published["images"][0]["reference"], pinned.as_str());

    // The registry holds the image as built, by tag and digest.
    let tag = format!(
        "{prefix}/cloud-controller-manager:{}",
        image["tag"].as_str().unwrap()
    );
    let inspected = succeeds(
        Path::new("skopeo"),
        &["inspect", "--tls-verify=false", &format!("docker://{tag}")],
        dir,
    );
    let inspected: Value = serde_json::from_slice(&inspected.stdout).unwrap();
    assert_eq!(inspected["Digest"], digest.as_str());

    verify(&cosign, &pinned, &tag, &digest, &sbom, dir);
    negative_controls(&cosign, &crane, &tag, &pinned, dir);
}

/// The signature verifies with the public key; the attestation is the image's bill of materials.
fn verify(cosign: &Path, pinned: &str, tag: &str, digest: &str, sbom: &Value, dir: &Path) {
    // The signature verifies with the public key, for the digest and through the tag.
    let offline = "--insecure-ignore-tlog=true";
    for reference in [pinned, tag] {
        let verified = succeeds(
            cosign,
            &["verify", "--key", "signer.pub", offline, reference],
            dir,
        );
        let claims: Value = serde_json::from_slice(&verified.stdout).unwrap();
        // cosign v3's `verify` also accepts an attestation's bundle: the signature's own claim must be there.
        let signature = claims
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["critical"]["type"] == "https://sigstore.dev/cosign/sign/v1")
            .unwrap_or_else(|| panic!("no signature among the claims: {claims}"));
        assert_eq!(signature["critical"]["image"]["docker-manifest-digest"], digest);
    }
    // The attestation is the image's bill of materials, about this digest.
    let attested = succeeds(
        cosign,
        &[
            "verify-attestation",
            "--key",
            "signer.pub",
            "--type",
            "cyclonedx",
            offline,
            pinned,
        ],
        dir,
    );
    let statement = statement(&text(&attested), dir);
    assert_eq!(statement["predicateType"], "https://cyclonedx.org/bom");
    assert_eq!(
        statement["subject"][0]["digest"]["sha256"],
        digest.trim_start_matches("sha256:")
    );
    assert_eq!(
        &statement["predicate"], sbom,
        "the attested bill of materials is the image's"
    );
}

/// Another key, an unsigned copy, another predicate type: each fails.
fn negative_controls(cosign: &Path, crane: &Path, tag: &str, pinned: &str, dir: &Path) {
    let offline = "--insecure-ignore-tlog=true";
    fails(
        cosign,
        &["verify", "--key", "stranger.pub", offline, pinned],
        dir,
        "the image was signed with another key",
        "failed to verify signature",
    );
    // Another image (one more label: another digest) in the same repository, never signed.
    let unsigned = format!("{}-unsigned", tag);
    succeeds(
        crane,
        &["mutate", tag, "--label", "signed=no", "--tag", &unsigned],
        dir,
    );
    fails(
        cosign,
        &["verify", "--key", "signer.pub", offline, &unsigned],
        dir,
        "that image is unsigned",
        "no signatures found",
    );
    fails(
        cosign,
        &[
            "verify-attestation",
            "--key",
            "signer.pub",
            "--type",
            "spdxjson",
            offline,
            pinned,
        ],
        dir,
        "no SPDX document was attested",
        "none of the attestations matched the predicate type",
    );
}

/// The in-toto statement of `cosign verify-attestation`'s first line (a DSSE envelope).
fn statement(output: &str, dir: &Path) -> Value {
    let envelope: Value = serde_json::from_str(output.lines().next().expect("an attestation")).unwrap();
    let payload = dir.join("payload.b64");
    std::fs::write(&payload, envelope["payload"].as_str().expect("a DSSE payload")).unwrap();
    let decoded = succeeds(Path::new("base64"), &["--decode", payload.to_str().unwrap()], dir);
    serde_json::from_slice(&decoded.stdout).expect("the payload is an in-toto statement")
}

#[test]
fn publish_refuses_what_cannot_work_before_pushing_anything() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("cosign.key"), "not a key").unwrap();
    let publish = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .arg("publish")
            .args(args)
            .current_dir(repo())
            .output()
            .unwrap();
        assert!(!output.status.success(), "publish {args:?} passed");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let key = dir.join("cosign.key");
    let key = key.to_str().unwrap();
    let images = dir.to_str().unwrap();
    let error = publish(&[
        "--images",
        images,
        "--registry",
        "https://registry.example.com",
        "--key",
        key,
    ]);
    assert!(
        error.contains("--registry \"https://registry.example.com\""),
        "{error}"
    );
    let error = publish(&[
        "--images",
        images,
        "--registry",
        "registry.example.com/ccm",
        "--key",
        "/nonexistent",
    ]);
    assert!(error.contains("--key /nonexistent"), "{error}");
    let error = publish(&[
        "--images",
        images,
        "--registry",
        "registry.example.com/ccm",
        "--key",
        key,
    ]);
    assert!(
        error.contains("images.json") && error.contains("cargo xtask image"),
        "{error}"
    );
    assert_eq!(
        error.lines().filter(|l| l.starts_with("xtask: error")).count(),
        1,
        "one error: {error}"
    );
}
