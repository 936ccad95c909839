//! `cargo xtask image`: an OCI image per shipped binary, assembled without a container engine.
//!
//! - **Base layer**: the shared libraries the binary loads (`ldd`), taken from this machine's Debian
//!   packages with each package's copyright file; the CA bundle (`ca-certificates`) for the cloud SDKs'
//!   TLS; `/etc/passwd` and `/etc/group` with the non-root user 65532; `/tmp`.
//! - **Application layer**: the binary at `/usr/local/bin/<name>`, and under `/usr/share/doc/<name>/` its
//!   README, LICENSE, bill of materials (crates and Debian packages) and the leader-migration examples.
//! - **Output** under `target/image/`: `<name>/` (an OCI image layout: `oci-layout`, `index.json`,
//!   `blobs/sha256/…`), `<name>.tar` (the same layout plus docker's `manifest.json`, for `docker load`),
//!   `<name>.cdx.json` (the bill of materials the image carries, which `cargo xtask publish` attests) and
//!   `images.json` (what `--output json` prints, with the files named relative to it; `publish` reads it).
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
use super::sbom::{DebianPackage, cyclonedx, tree};
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
    compressed: usize,
    uncompressed: usize,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let binaries = args.build.binaries()?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.build.target_dir().join("image"));
    let epoch = source_date_epoch(&super::project_root(&binaries))?;
    // A description of images this run may replace must not outlive them.
    let _ = std::fs::remove_file(out.join(IMAGES));
    let mut built = Vec::new();
    for (binary, path) in &binaries {
        built.push(build(
            binary,
            path,
            &out,
            &args.repository,
            epoch,
            args.keep_debug,
        )?);
    }
    let images: Vec<Value> = built
        .iter()
        .map(|b| {
            json!({
                "name": b.name, "tag": b.tag, "digest": b.digest,
                "layout": b.layout, "archive": b.archive, "sbom": b.sbom,
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
            for (key, path) in [("layout", &b.layout), ("archive", &b.archive), ("sbom", &b.sbom)] {
                image[key] = json!(path.file_name().map(|n| n.to_string_lossy()));
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

fn build(
    binary: &Shipped,
    path: &Path,
    out: &Path,
    repository: &str,
    epoch: u64,
    keep_debug: bool,
) -> Result<Built> {
    let (base, debian) = base_layer(path)?;
    let executable = if keep_debug {
        std::fs::read(path)?
    } else {
        stripped(path, out)?
    };
    let sbom = serde_json::to_vec_pretty(&cyclonedx(binary, &tree(binary)?, &debian, epoch))?;
    let app = app_layer(binary, executable, &sbom)?;
    let name = format!("{repository}{}", binary.bin);
    let tag = binary.version.clone();
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
    let config = serde_json::to_vec(&json!({
        "architecture": architecture()?,
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
    }))?;
    let config_descriptor = descriptor("application/vnd.oci.image.config.v1+json", &config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_descriptor,
        "layers": layers,
        "annotations": labels,
    }))?;
    let digest = format!("sha256:{}", sha256(&manifest));
    let mut manifest_descriptor = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    manifest_descriptor["annotations"] = json!({
        "org.opencontainers.image.ref.name": tag,
        "io.containerd.image.name": format!("{name}:{tag}"),
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_descriptor],
    }))?;
    let compressed = config.len() + blobs.values().map(Vec::len).sum::<usize>();
    let docker = serde_json::to_vec(&json!([{
        "Config": format!("blobs/sha256/{}", sha256(&config)),
        "RepoTags": [format!("{name}:{tag}")],
        "Layers": layers.iter().map(|l| format!("blobs/{}", l["digest"].as_str().unwrap_or_default().replace(':', "/"))).collect::<Vec<_>>(),
    }]))?;
    blobs.insert(sha256(&config), config);
    blobs.insert(sha256(&manifest), manifest);

    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        ("index.json".into(), index),
    ];
    files.extend(
        blobs
            .into_iter()
            .map(|(hex, bytes)| (format!("blobs/sha256/{hex}"), bytes)),
    );

    // The layout directory and the archive are written beside their final names and renamed into place.
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let layout = out.join(&binary.bin);
    let staging = out.join(format!(".{}.partial", binary.bin));
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
    let archive_path = out.join(format!("{}.tar", binary.bin));
    super::write_atomic(&archive_path, &archive.to_bytes(epoch)?)?;
    let sbom_path = out.join(format!("{}.cdx.json", binary.bin));
    super::write_atomic(&sbom_path, &sbom)?;
    Ok(Built {
        name,
        tag,
        digest,
        layout,
        archive: archive_path,
        sbom: sbom_path,
        compressed,
        uncompressed,
    })
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

fn architecture() -> Result<&'static str> {
    Ok(match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no OCI architecture name for {other}"),
    })
}

/// Shared libraries, CA certificates, users; and the Debian packages they came from.
fn base_layer(binary: &Path) -> Result<(Tar, Vec<DebianPackage>)> {
    let mut tar = Tar::default();
    let mut packages: BTreeMap<String, DebianPackage> = BTreeMap::new();
    let mut take = |tar: &mut Tar, path: &str, package: Option<&str>| -> Result<()> {
        let bytes = std::fs::read(path).with_context(|| format!("cannot read {path}"))?;
        let mode = if path.contains(".so") { 0o755 } else { 0o644 };
        tar.file(path.trim_start_matches('/'), bytes, Meta::root(mode))?;
        let package = match package {
            Some(p) => p.to_owned(),
            None => owner(path)?,
        };
        if let std::collections::btree_map::Entry::Vacant(entry) = packages.entry(package) {
            let found = debian_package(entry.key())?;
            let copyright = format!("/usr/share/doc/{}/copyright", found.name);
            if let Ok(text) = std::fs::read(&copyright) {
                tar.file(copyright.trim_start_matches('/'), text, Meta::root(0o644))?;
            }
            entry.insert(found);
        }
        Ok(())
    };
    for library in libraries(binary)? {
        take(&mut tar, &library, None)?;
    }
    if !Path::new("/").join(CA_BUNDLE).is_file() {
        bail!("/{CA_BUNDLE} is missing: install Debian's ca-certificates package");
    }
    // The bundle is generated by update-ca-certificates, so dpkg does not list it as the package's.
    take(&mut tar, &format!("/{CA_BUNDLE}"), Some("ca-certificates"))?;
    let passwd = format!(
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{USER}:{USER}:nonroot:/home/nonroot:/sbin/nologin\n"
    );
    let group = format!("root:x:0:\nnonroot:x:{USER}:\n");
    tar.file("etc/passwd", passwd.into_bytes(), Meta::root(0o644))?;
    tar.file("etc/group", group.into_bytes(), Meta::root(0o644))?;
    tar.dir(
        "home/nonroot",
        Meta {
            mode: 0o750,
            uid: USER,
        },
    )?;
    tar.dir("tmp", Meta::root(0o1777))?;
    Ok((tar, packages.into_values().collect()))
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

/// The shared libraries `binary` loads, as `ldd` resolves them (the dynamic loader included).
fn libraries(binary: &Path) -> Result<Vec<String>> {
    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .context("cannot run ldd (Debian's libc-bin)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        if text.contains("not a dynamic executable")
            || String::from_utf8_lossy(&output.stderr).contains("not a dynamic")
        {
            return Ok(Vec::new());
        }
        bail!(
            "ldd {} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let mut libraries = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next().filter(|p| p.starts_with('/')),
        };
        match path {
            Some("not") => bail!("ldd {}: {}", binary.display(), line.trim()),
            Some(path) if path.starts_with('/') => libraries.push(path.to_owned()),
            _ => {}
        }
    }
    libraries.sort();
    libraries.dedup();
    Ok(libraries)
}

/// The Debian package that installed `path` (`dpkg -S`, trying the path with symlinks resolved too).
fn owner(path: &str) -> Result<String> {
    let canonical = std::fs::canonicalize(path)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    for candidate in [path, canonical.as_str()] {
        let output = Command::new("dpkg")
            .args(["-S", candidate])
            .output()
            .context("cannot run dpkg -S")?;
        if output.status.success() {
            let text = String::from_utf8_lossy(&output.stdout);
            if let Some((package, _)) = text.lines().next().and_then(|l| l.split_once(": ")) {
                return Ok(package.to_owned());
            }
        }
    }
    bail!("no Debian package owns {path}: images are assembled from this machine's Debian packages")
}

fn debian_package(package: &str) -> Result<DebianPackage> {
    let output = Command::new("dpkg-query")
        .args(["-W", "-f", "${Package} ${Version} ${Architecture}", package])
        .output()
        .context("cannot run dpkg-query")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let fields: Vec<_> = text.split_whitespace().collect();
    match fields[..] {
        [name, version, architecture] if output.status.success() => Ok(DebianPackage {
            name: name.to_owned(),
            version: version.to_owned(),
            architecture: architecture.to_owned(),
        }),
        _ => bail!("dpkg-query found no package {package}"),
    }
}
