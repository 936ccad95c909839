//! `cargo xtask publish`: the images `cargo xtask image` built, pushed to a registry with `skopeo`,
//! signed with `cosign` and given their bill of materials as a signed CycloneDX attestation, each by
//! digest, so an operator can check both before running them (`docs/operations.md`, Verifying a release).
//!
//! Checked before anything is pushed: the registry prefix; the key, unlocked with `COSIGN_PASSWORD`;
//! cosign's version; the images, each layout holding the digest and tag `images.json` records, and their
//! bills of materials. Then every image is pushed, and only then signed: a registry that refuses a push
//! leaves nothing signed. Between its push and its signature a tag names an unsigned image, which is why
//! operators verify by digest. Running it again is safe: the digests are the same, and cosign adds a
//! signature beside the first.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::image::IMAGES;
use crate::shell::target_dir;

/// Arguments of `cargo xtask publish`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Where `cargo xtask image` wrote (default: image/ under the target directory).
    #[arg(long, value_name = "DIR")]
    images: Option<PathBuf>,
    /// Repository prefix to push to, `REGISTRY[/PATH]` (e.g. `registry.example.com/ccm`): each image goes
    /// to `<prefix>/<binary>:<version>`.
    #[arg(long, value_name = "PREFIX")]
    registry: String,
    /// cosign's private key (`cosign generate-key-pair`), unlocked with `COSIGN_PASSWORD` (which must be
    /// set; empty for a key without a password).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Do not record the signatures in the public transparency log (Rekor), for a private registry or a
    /// release without network access; verifiers then pass `--insecure-ignore-tlog=true`.
    #[arg(long)]
    no_tlog: bool,
    /// The registry speaks plain HTTP, or TLS with a certificate not to verify (a local registry).
    #[arg(long)]
    insecure_registry: bool,
    /// The cosign to run (v2.6 or later).
    #[arg(long, value_name = "PATH", default_value = "cosign")]
    cosign: PathBuf,
    /// The skopeo to run.
    #[arg(long, value_name = "PATH", default_value = "skopeo")]
    skopeo: PathBuf,
    /// `text` (each reference and how to verify it) or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    output: String,
}

/// One image to publish, as `images.json` describes it.
#[derive(Debug)]
struct Image {
    binary: String,
    tag: String,
    digest: String,
    layout: PathBuf,
    sbom: PathBuf,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let dir = args.images.clone().unwrap_or_else(|| target_dir().join("image"));
    let prefix = repository_prefix(&args.registry)?;
    if !args.key.is_file() {
        bail!(
            "--key {}: no such file (make a key pair with `cosign generate-key-pair`)",
            args.key.display()
        );
    }
    let images = images(&dir)?;
    answers(&args.skopeo, &["--version"], "--skopeo")?;
    check_cosign(args)?;
    let mut published = Vec::new();
    for image in &images {
        let reference = format!("{prefix}/{}", image.binary);
        push(args, image, &reference)?;
        published.push((image, format!("{reference}@{}", image.digest)));
    }
    for (image, pinned) in &published {
        cosign(args, &["sign"], pinned, "signing")?;
        let predicate = image
            .sbom
            .to_str()
            .context("a bill of materials' path is UTF-8")?;
        let attest = ["attest", "--type", "cyclonedx", "--predicate", predicate];
        cosign(args, &attest, pinned, "attesting the bill of materials of")?;
    }
    report(args, &published)
}

/// `REGISTRY[/PATH]` without a scheme, tag or digest, lower case, as OCI references need.
fn repository_prefix(registry: &str) -> Result<&str> {
    let prefix = registry.trim_end_matches('/');
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:[]".contains(c);
    if prefix.is_empty()
        || prefix.contains("://")
        || prefix.contains('@')
        || prefix.split('/').any(str::is_empty)
        || prefix.split('/').skip(1).any(|part| part.contains(':'))
        || !prefix.chars().all(allowed)
    {
        bail!(
            "--registry {registry:?}: expected REGISTRY[/PATH] in lower case, without a scheme, tag or \
             digest (e.g. registry.example.com/ccm)"
        );
    }
    Ok(prefix)
}

/// The images `images.json` in `dir` lists, each with its layout and bill of materials present.
fn images(dir: &Path) -> Result<Vec<Image>> {
    let path = dir.join(IMAGES);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {} (run `cargo xtask image` first, or pass --images)",
            path.display()
        )
    })?;
    let description: Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let mut images = Vec::new();
    for (index, entry) in description["images"].as_array().into_iter().flatten().enumerate() {
        let field = |name: &str| {
            entry[name]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("{}: images[{index}].{name} is missing", path.display()))
        };
        let name = field("name")?;
        if entry["platforms"].as_array().is_some_and(|p| p.len() > 1) {
            bail!(
                "{}: images[{index}] ({name}) is a multi-architecture index, which publish does not \
                 sign yet: push it with `skopeo copy --all` and sign it with `cosign sign --recursive`",
                path.display()
            );
        }
        // Relative to `images.json`, so the directory can move between jobs.
        let image = Image {
            binary: name.rsplit('/').next().unwrap_or(&name).to_owned(),
            tag: field("tag")?,
            digest: field("digest")?,
            layout: dir.join(field("layout")?),
            sbom: dir.join(field("sbom")?),
        };
        if !image.sbom.is_file() {
            bail!(
                "{}: images[{index}] names {}, which does not exist",
                path.display(),
                image.sbom.display()
            );
        }
        if !holds(&image.layout, &image.tag, &image.digest) {
            bail!(
                "{}: images[{index}]'s layout {} does not hold {}:{} (run `cargo xtask image` again)",
                path.display(),
                image.layout.display(),
                image.tag,
                image.digest
            );
        }
        images.push(image);
    }
    if images.is_empty() {
        bail!("{}: lists no image", path.display());
    }
    Ok(images)
}

/// Whether the OCI layout's `index.json` names `digest` under the tag `tag`.
fn holds(layout: &Path, tag: &str, digest: &str) -> bool {
    let index = std::fs::read(layout.join("index.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
    index.is_some_and(|index| {
        index["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["digest"] == digest && m["annotations"]["org.opencontainers.image.ref.name"] == tag)
    })
}

/// cosign is v2.6 or later (`--use-signing-config` is from v2.6), and the key unlocks with
/// `COSIGN_PASSWORD`: a wrong password fails here, not between one image's signature and the next.
fn check_cosign(args: &Args) -> Result<()> {
    let output = Command::new(&args.cosign).args(["version", "--json"]).output();
    let version = output
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
        .and_then(|v| v["gitVersion"].as_str().map(str::to_owned))
        .with_context(|| {
            format!(
                "--cosign {}: cannot run `cosign version --json`",
                args.cosign.display()
            )
        })?;
    let (major, minor) = major_minor(&version)
        .with_context(|| format!("--cosign {}: says version {version:?}", args.cosign.display()))?;
    if (major, minor) < (2, 6) {
        bail!(
            "--cosign {}: {version}; v2.6 or later is needed",
            args.cosign.display()
        );
    }
    if std::env::var_os("COSIGN_PASSWORD").is_none() {
        bail!("COSIGN_PASSWORD is not set: set it to the key's password (empty for a key without one)");
    }
    let unlocked = Command::new(&args.cosign)
        .arg("public-key")
        .arg("--key")
        .arg(&args.key)
        .output()
        .with_context(|| format!("--cosign {}: cannot run it", args.cosign.display()))?;
    if !unlocked.status.success() {
        bail!(
            "--key {}: cosign cannot unlock it with COSIGN_PASSWORD: {}",
            args.key.display(),
            String::from_utf8_lossy(&unlocked.stderr).trim()
        );
    }
    Ok(())
}

/// `(major, minor)` of `v2.6.5`.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.trim_start_matches('v').split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Whether `program ARGS` runs, naming `flag` when not.
fn answers(program: &Path, args: &[&str], flag: &str) -> Result<()> {
    let output = Command::new(program).args(args).output();
    if !output.is_ok_and(|o| o.status.success()) {
        bail!(
            "{flag} {}: cannot run `{} {}`",
            program.display(),
            program.display(),
            args.join(" ")
        );
    }
    Ok(())
}

/// `skopeo copy` of the layout to `<reference>:<tag>`, keeping its digest (checked).
fn push(args: &Args, image: &Image, reference: &str) -> Result<()> {
    // Beside the layout, which is ours to write in.
    let digest_file = image
        .layout
        .with_file_name(format!(".{}.pushed-digest", image.binary));
    let mut command = Command::new(&args.skopeo);
    command
        .args(["copy", "--preserve-digests", "--digestfile"])
        .arg(&digest_file);
    if args.insecure_registry {
        command.arg("--dest-tls-verify=false");
    }
    command
        .arg(format!("oci:{}:{}", image.layout.display(), image.tag))
        .arg(format!("docker://{reference}:{}", image.tag));
    let pushed = succeed(&mut command, &format!("pushing {reference}:{}", image.tag))
        .map(|()| std::fs::read_to_string(&digest_file).unwrap_or_default());
    let _ = std::fs::remove_file(&digest_file);
    let pushed = pushed?;
    if pushed.trim() != image.digest {
        bail!(
            "{reference}:{}: the registry holds {}, not the image's {}",
            image.tag,
            pushed.trim(),
            image.digest
        );
    }
    Ok(())
}

/// `cosign VERB… --key KEY --yes [offline] [insecure] REFERENCE@DIGEST`.
fn cosign(args: &Args, verb: &[&str], pinned: &str, what: &str) -> Result<()> {
    let mut command = Command::new(&args.cosign);
    command.args(verb).arg("--key").arg(&args.key).arg("--yes");
    if args.no_tlog {
        // cosign v3 looks the log up in the public signing configuration unless told not to.
        command.args(["--tlog-upload=false", "--use-signing-config=false"]);
    }
    if args.insecure_registry {
        command.args(["--allow-insecure-registry", "--allow-http-registry"]);
    }
    command.arg(pinned);
    succeed(&mut command, &format!("{what} {pinned}"))
}

fn succeed(command: &mut Command, what: &str) -> Result<()> {
    let output = command
        .output()
        .with_context(|| format!("{what}: cannot start {:?}", command.get_program()))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

fn report(args: &Args, published: &[(&Image, String)]) -> Result<()> {
    if args.output == "json" {
        let images: Vec<Value> = published
            .iter()
            .map(|(image, pinned)| json!({"reference": pinned, "tag": image.tag, "digest": image.digest}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({ "images": images }))?);
        return Ok(());
    }
    let mut tlog = String::new();
    if args.no_tlog {
        tlog.push_str(" --insecure-ignore-tlog=true");
    }
    if args.insecure_registry {
        tlog.push_str(" --allow-insecure-registry --allow-http-registry");
    }
    for (image, pinned) in published {
        println!(
            "{pinned} ({}): pushed, signed, bill of materials attested",
            image.tag
        );
    }
    println!("\n# verify (cosign.pub: the public half of --key)");
    for (_, pinned) in published {
        println!("cosign verify --key cosign.pub{tlog} {pinned}");
        println!("cosign verify-attestation --key cosign.pub --type cyclonedx{tlog} {pinned}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::repository_prefix;

    #[test]
    fn a_registry_prefix_is_a_registry_and_a_path() {
        for good in [
            "registry.example.com/ccm",
            "127.0.0.1:5000/ccm/",
            "localhost:5000",
            "ghcr.io/vendor/cloud",
        ] {
            assert!(repository_prefix(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "https://registry.example.com/ccm",
            "registry.example.com/CCM",
            "registry.example.com/ccm:v1",
            "registry.example.com/ccm@sha256:00",
            "registry.example.com//ccm",
        ] {
            let error = repository_prefix(bad).unwrap_err().to_string();
            assert!(error.starts_with("--registry"), "{bad}: {error}");
        }
    }
}
