//! `cargo xtask image`: an OCI image per shipped binary, assembled without a container engine.
//!
//! - **Base layer** (`base.rs`): the shared libraries the binary loads, from Debian packages with each
//!   package's copyright file (this machine's, or another architecture's fetched by `foreign.rs`); the CA
//!   bundle (`ca-certificates`) for the cloud SDKs' TLS; `/etc/passwd` and `/etc/group` with the non-root
//!   user 65532; `/tmp`.
//! - **Application layer**: the binary at `/usr/local/bin/<name>`, and under `/usr/share/doc/<name>/` its
//!   README, LICENSE, bill of materials (crates and Debian packages) and the leader-migration examples.
//! - **Output** under `target/image/`: `<name>/` (an OCI image layout: `oci-layout`, `index.json`,
//!   `blobs/sha256/…`), `<name>.tar` (the same layout plus docker's `manifest.json`, for `docker load`),
//!   `<name>.cdx.json` (the bill of materials the image carries, which `cargo xtask publish` attests) and
//!   `images.json` (what `--output json` prints, with the files named relative to it; `publish` reads it).
//!
//! - **Several architectures** (`--arch amd64 --arch arm64`): an image per architecture under one OCI
//!   image index, each with that architecture's base layer. This machine builds only its own binary; another
//!   architecture's comes from `--arch-binary ARCH=PATH` (a vendor's CI cross-builds it). `docker load`
//!   of the archive loads this machine's image; each other architecture's bill of materials is
//!   `<name>-<arch>.cdx.json`.
//!
//! Reproducible: entries sorted, owners fixed, every time is `SOURCE_DATE_EPOCH` (else the last commit's),
//! gzip without timestamps, JSON with sorted keys. The same binary gives the same digest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::archive::{Meta, Tar, gzip, sha256};
use super::dist::human;
use super::sbom::{cyclonedx, tree};
use base::base_layer;
use platform::Platform;

mod base;
mod foreign;
mod platform;
use super::{BuildArgs, Shipped, license_text, readme, revision, rfc3339, source_date_epoch};
use crate::shell::repo_root;

/// The description of what was built, beside the images.
pub(crate) const IMAGES: &str = "images.json";
/// The user the image runs as (distroless's `nonroot`).
const USER: u32 = 65532;
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// Arguments of `cargo xtask image`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    build: BuildArgs,
    /// Where to write (default: image/ under the target directory).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Image repository prefix, e.g. `registry.example.com/ccm/` (default: none, as deploy/ expects).
    #[arg(long, default_value = "")]
    repository: String,
    /// `text` (a summary and a kustomize `images:` snippet) or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    output: String,
    /// Keep the binary's debug information (line tables) in the image. By default it is removed with
    /// `objcopy --strip-debug` (symbols stay, so backtraces keep function names), which makes the image a
    /// fraction of the size. The `dist` tarballs keep it.
    #[arg(long)]
    keep_debug: bool,
    /// An architecture to build for (`amd64`, `arm64`); repeatable. Default: this machine's. With more than
    /// one, the image is an OCI image index.
    #[arg(long = "arch", value_name = "ARCH")]
    arches: Vec<String>,
    /// The executable for another architecture than this machine's, `ARCH=PATH` (built by that
    /// architecture's toolchain, stripped as it should ship); repeatable. Needs a single `--bin`.
    #[arg(long = "arch-binary", value_name = "ARCH=PATH")]
    arch_binaries: Vec<String>,
}

/// The platforms to build (this machine's first) and the executables of the others, from the flags.
fn platforms(args: &Args, binaries: usize) -> Result<(Vec<Platform>, BTreeMap<&'static str, PathBuf>)> {
    let host = Platform::host()?;
    let mut platforms = vec![host];
    for arch in &args.arches {
        let platform = Platform::named(arch)?;
        if !platforms.contains(&platform) {
            platforms.push(platform);
        }
    }
    let mut foreign = BTreeMap::new();
    for entry in &args.arch_binaries {
        let (arch, path) = entry
            .split_once('=')
            .with_context(|| format!("--arch-binary {entry}: expected ARCH=PATH"))?;
        let platform = Platform::named(arch).with_context(|| format!("--arch-binary {entry}"))?;
        if platform == host {
            bail!("--arch-binary {entry}: {arch} is this machine's; its binary is built here");
        }
        if !platforms.contains(&platform) {
            bail!("--arch-binary {entry}: {arch} is not among the --arch given");
        }
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("--arch-binary {entry}: no such file");
        }
        platform
            .check_executable(&path)
            .with_context(|| format!("--arch-binary {entry}"))?;
        foreign.insert(platform.arch, path);
    }
    if let Some(missing) = platforms[1..].iter().find(|p| !foreign.contains_key(p.arch)) {
        bail!(
            "--arch {}: this machine builds only {host}'s binary; give it with --arch-binary {}=PATH",
            missing.arch,
            missing.arch,
            host = host.arch
        );
    }
    if !foreign.is_empty() && binaries != 1 {
        bail!("--arch-binary: it is one binary's; choose it with --bin ({binaries} are selected)");
    }
    Ok((platforms, foreign))
}

/// What every image of one run shares.
struct Plan {
    /// This machine's first.
    platforms: Vec<Platform>,
    /// The other platforms' executables.
    foreign: BTreeMap<&'static str, PathBuf>,
    /// Other architectures' Debian packages, kept between runs.
    scratch: PathBuf,
    out: PathBuf,
    repository: String,
    epoch: u64,
    keep_debug: bool,
}

/// What was built, as `--output json` prints it.
#[derive(Debug)]
struct Built {
    name: String,
    tag: String,
    digest: String,
    layout: PathBuf,
    archive: PathBuf,
    sbom: PathBuf,
    other_sboms: BTreeMap<&'static str, PathBuf>,
    platforms: Vec<&'static str>,
    compressed: usize,
    uncompressed: usize,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let binaries = args.build.binaries()?;
    let (platforms, foreign) = platforms(args, binaries.len())?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.build.target_dir().join("image"));
    let epoch = source_date_epoch(&super::project_root(&binaries))?;
    // A description of images this run may replace must not outlive them.
    let _ = std::fs::remove_file(out.join(IMAGES));
    let plan = Plan {
        platforms,
        foreign,
        scratch: args.build.target_dir().join("debian"),
        out: out.clone(),
        repository: args.repository.clone(),
        epoch,
        keep_debug: args.keep_debug,
    };
    let mut built = Vec::new();
    for (binary, path) in &binaries {
        built.push(build(binary, path, &plan)?);
    }
    let images: Vec<Value> = built
        .iter()
        .map(|b| {
            json!({
                "name": b.name, "tag": b.tag, "digest": b.digest, "platforms": b.platforms,
                "layout": b.layout, "archive": b.archive, "sbom": b.sbom, "other_sboms": b.other_sboms,
                "compressed_bytes": b.compressed, "uncompressed_bytes": b.uncompressed,
            })
        })
        .collect();
    // For `publish`: the same, with the files named relative to it.
    let relative: Vec<Value> = built
        .iter()
        .zip(&images)
        .map(|(b, image)| {
            let mut image = image.clone();
            let name = |path: &PathBuf| json!(path.file_name().map(|n| n.to_string_lossy()));
            for (key, path) in [("layout", &b.layout), ("archive", &b.archive), ("sbom", &b.sbom)] {
                image[key] = name(path);
            }
            for (arch, path) in &b.other_sboms {
                image["other_sboms"][*arch] = name(path);
            }
            image
        })
        .collect();
    let file = serde_json::to_string_pretty(&json!({ "images": relative }))?;
    super::write_atomic(&out.join(IMAGES), file.as_bytes())?;
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&json!({ "images": images }))?);
        return Ok(());
    }
    for b in &built {
        println!(
            "{}:{}  {}  {} compressed ({} unpacked)\n  layout:  {}\n  archive: {} (docker load -i …)",
            b.name,
            b.tag,
            b.digest,
            human(b.compressed),
            human(b.uncompressed),
            b.layout.display(),
            b.archive.display()
        );
    }
    println!("\n# kustomization.yaml: run deploy/ on these images, by digest\nimages:");
    for b in &built {
        let bin = b.name.rsplit('/').next().unwrap_or(&b.name);
        println!(
            "  - name: {bin}\n    newName: {}\n    digest: {}",
            b.name, b.digest
        );
    }
    Ok(())
}

/// One platform's image: its manifest and blobs, what the docker archive needs, its bill of materials.
struct PlatformImage {
    platform: Platform,
    manifest: Vec<u8>,
    config: Vec<u8>,
    layers: Vec<Value>,
    blobs: BTreeMap<String, Vec<u8>>,
    sbom: Vec<u8>,
    uncompressed: usize,
}

/// The image of `binary` (the executable at `path`) for `platform`.
fn platform_image(binary: &Shipped, path: &Path, platform: Platform, plan: &Plan) -> Result<PlatformImage> {
    let (out, epoch) = (plan.out.as_path(), plan.epoch);
    let (base, debian) = base_layer(path, platform, &plan.scratch)?;
    // Another architecture's binary comes built (and stripped) by its own toolchain.
    let executable = if plan.keep_debug || platform != Platform::host()? {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
    } else {
        stripped(path, out)?
    };
    let sbom = serde_json::to_vec_pretty(&cyclonedx(binary, &tree(binary)?, &debian, epoch))?;
    let app = app_layer(binary, executable, &sbom)?;
    let mut blobs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    let mut uncompressed = 0;
    for layer in [base, app] {
        let tar = layer.to_bytes(epoch)?;
        uncompressed += tar.len();
        diff_ids.push(format!("sha256:{}", sha256(&tar)));
        let gz = gzip(&tar)?;
        layers.push(descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &gz));
        blobs.insert(sha256(&gz), gz);
    }
    let labels = labels(binary, epoch);
    let mut config = json!({
        "architecture": platform.arch,
        "os": "linux",
        "created": rfc3339(epoch),
        "config": {
            "User": format!("{USER}:{USER}"),
            "Entrypoint": [format!("/usr/local/bin/{}", binary.bin)],
            "Env": [
                "PATH=/usr/local/bin:/usr/bin:/bin",
                format!("SSL_CERT_FILE=/{CA_BUNDLE}"),
            ],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
        "history": [
            { "created": rfc3339(epoch), "created_by": "cargo xtask image: base (shared libraries, CA certificates, users)" },
            { "created": rfc3339(epoch), "created_by": format!("cargo xtask image: {}", binary.bin) },
        ],
    });
    if let Some(variant) = platform.variant {
        config["variant"] = json!(variant);
    }
    let config = serde_json::to_vec(&config)?;
    let config_descriptor = descriptor("application/vnd.oci.image.config.v1+json", &config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_descriptor,
        "layers": layers,
        "annotations": labels,
    }))?;
    blobs.insert(sha256(&config), config.clone());
    blobs.insert(sha256(&manifest), manifest.clone());
    Ok(PlatformImage {
        platform,
        manifest,
        config,
        layers,
        blobs,
        sbom,
        uncompressed,
    })
}

/// The image of `binary` for each platform of the plan (the first is this machine's; `path` is its
/// executable): one platform gives an image, several an image index with one image each.
fn build(binary: &Shipped, path: &Path, plan: &Plan) -> Result<Built> {
    let (out, epoch) = (plan.out.as_path(), plan.epoch);
    let mut images = Vec::new();
    for platform in &plan.platforms {
        let executable = plan.foreign.get(platform.arch).map_or(path, PathBuf::as_path);
        images.push(platform_image(binary, executable, *platform, plan)?);
    }
    let host = &images[0];
    let name = format!("{}{}", plan.repository, binary.bin);
    let tag = binary.version.clone();
    let mut blobs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for image in &images {
        blobs.extend(image.blobs.clone());
    }
    let (top, media_type) = if images.len() == 1 {
        (
            host.manifest.clone(),
            "application/vnd.oci.image.manifest.v1+json",
        )
    } else {
        let manifests: Vec<Value> = images
            .iter()
            .map(|image| {
                let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &image.manifest);
                entry["platform"] = json!({"architecture": image.platform.arch, "os": "linux"});
                if let Some(variant) = image.platform.variant {
                    entry["platform"]["variant"] = json!(variant);
                }
                entry
            })
            .collect();
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
            "annotations": labels(binary, epoch),
        }))?;
        blobs.insert(sha256(&index), index.clone());
        (index, "application/vnd.oci.image.index.v1+json")
    };
    let digest = format!("sha256:{}", sha256(&top));
    let mut top_descriptor = descriptor(media_type, &top);
    top_descriptor["annotations"] = json!({
        "org.opencontainers.image.ref.name": tag,
        "io.containerd.image.name": format!("{name}:{tag}"),
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [top_descriptor],
    }))?;
    // This machine's image, as pulled: config and layers.
    let compressed =
        host.config.len() + host.layers.iter().filter_map(|l| l["size"].as_u64()).sum::<u64>() as usize;
    // docker load takes one image: this machine's.
    let docker = serde_json::to_vec(&json!([{
        "Config": format!("blobs/sha256/{}", sha256(&host.config)),
        "RepoTags": [format!("{name}:{tag}")],
        "Layers": host.layers.iter().map(|l| format!("blobs/{}", l["digest"].as_str().unwrap_or_default().replace(':', "/"))).collect::<Vec<_>>(),
    }]))?;
    let layout = write_layout(out, &binary.bin, index, &blobs, docker, epoch)?;
    let sbom_path = out.join(format!("{}.cdx.json", binary.bin));
    super::write_atomic(&sbom_path, &host.sbom)?;
    let mut sboms = BTreeMap::new();
    for image in &images[1..] {
        let path = out.join(format!("{}-{}.cdx.json", binary.bin, image.platform.arch));
        super::write_atomic(&path, &image.sbom)?;
        sboms.insert(image.platform.arch, path);
    }
    Ok(Built {
        name,
        tag,
        digest,
        layout: layout.0,
        archive: layout.1,
        sbom: sbom_path,
        other_sboms: sboms,
        platforms: images.iter().map(|i| i.platform.arch).collect(),
        compressed,
        uncompressed: host.uncompressed,
    })
}

/// Writes the OCI layout `<out>/<bin>/` (beside, then renamed into place) and the docker archive
/// `<out>/<bin>.tar`; their paths.
fn write_layout(
    out: &Path,
    bin: &str,
    index: Vec<u8>,
    blobs: &BTreeMap<String, Vec<u8>>,
    docker: Vec<u8>,
    epoch: u64,
) -> Result<(PathBuf, PathBuf)> {
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        ("index.json".into(), index),
    ];
    files.extend(
        blobs
            .iter()
            .map(|(hex, bytes)| (format!("blobs/sha256/{hex}"), bytes.clone())),
    );
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let layout = out.join(bin);
    let staging = out.join(format!(".{bin}.partial"));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    let mut archive = Tar::default();
    for (file, bytes) in &files {
        let target = staging.join(file);
        std::fs::create_dir_all(target.parent().context("a blob has a directory")?)?;
        std::fs::write(&target, bytes).with_context(|| format!("cannot write {}", target.display()))?;
        archive.file(file, bytes.clone(), Meta::root(0o644))?;
    }
    archive.file("manifest.json", docker, Meta::root(0o644))?;
    if layout.exists() {
        std::fs::remove_dir_all(&layout).with_context(|| format!("cannot replace {}", layout.display()))?;
    }
    std::fs::rename(&staging, &layout).with_context(|| format!("cannot write {}", layout.display()))?;
    let archive_path = out.join(format!("{bin}.tar"));
    super::write_atomic(&archive_path, &archive.to_bytes(epoch)?)?;
    Ok((layout, archive_path))
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Value {
    json!({ "mediaType": media_type, "digest": format!("sha256:{}", sha256(bytes)), "size": bytes.len() })
}

/// The standard `org.opencontainers.image.*` annotations, as config labels and manifest annotations.
fn labels(binary: &Shipped, epoch: u64) -> BTreeMap<&'static str, String> {
    let mut labels = BTreeMap::from([
        ("org.opencontainers.image.title", binary.bin.clone()),
        ("org.opencontainers.image.description", binary.description.clone()),
        ("org.opencontainers.image.version", binary.version.clone()),
        ("org.opencontainers.image.licenses", binary.license.clone()),
        ("org.opencontainers.image.created", rfc3339(epoch)),
    ]);
    if let Some(revision) = revision(&binary.root) {
        labels.insert("org.opencontainers.image.revision", revision);
    }
    labels
}

/// The binary, its documents and bill of materials, and the leader-migration examples.
fn app_layer(binary: &Shipped, executable: Vec<u8>, sbom: &[u8]) -> Result<Tar> {
    let mut tar = Tar::default();
    tar.file(
        &format!("usr/local/bin/{}", binary.bin),
        executable,
        Meta::root(0o755),
    )?;
    let doc = format!("usr/share/doc/{}", binary.bin);
    tar.file(&format!("{doc}/README.md"), readme(binary)?, Meta::root(0o644))?;
    tar.file(
        &format!("{doc}/LICENSE"),
        license_text(binary)?,
        Meta::root(0o644),
    )?;
    tar.file(&format!("{doc}/sbom.cdx.json"), sbom.to_vec(), Meta::root(0o644))?;
    let examples = repo_root().join("examples/leader-migration");
    for entry in
        std::fs::read_dir(&examples).with_context(|| format!("cannot read {}", examples.display()))?
    {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") {
            let bytes = std::fs::read(entry.path())?;
            tar.file(
                &format!("{doc}/examples/leader-migration/{name}"),
                bytes,
                Meta::root(0o644),
            )?;
        }
    }
    Ok(tar)
}

/// The binary without its debug sections (`objcopy --strip-debug`, deterministic for the same input).
fn stripped(path: &Path, out: &Path) -> Result<Vec<u8>> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let temporary = out.join(".stripped.partial");
    let status = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(path)
        .arg(&temporary)
        .status()
        .context("cannot run objcopy (Debian's binutils); or pass --keep-debug")?;
    if !status.success() {
        bail!("objcopy --strip-debug {} failed ({status})", path.display());
    }
    let bytes = std::fs::read(&temporary)?;
    std::fs::remove_file(&temporary)?;
    Ok(bytes)
}
