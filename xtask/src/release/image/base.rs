//! An image's base layer: the shared libraries its binary loads, the CA bundle, users 65532 and root, and
//! `/tmp`, from Debian packages with their copyright files.
//!
//! - **This machine's architecture**: the libraries `ldd` resolves, read from this machine's files, each
//!   with the package `dpkg -S` names.
//! - **Another architecture** (`--arch arm64`): the binary's needs read from its ELF header (`readelf`:
//!   its `NEEDED` libraries and its loader), each library's package named by this machine's dpkg (Debian
//!   names a library's package the same on every architecture), that package of the other architecture
//!   fetched and unpacked by [`ForeignRoot`], and the files read from there.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::super::archive::{Meta, Tar};
use super::super::sbom::DebianPackage;
use super::foreign::ForeignRoot;
use super::{CA_BUNDLE, USER};

/// An OCI platform this tool builds for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Platform {
    /// OCI and Debian architecture name.
    pub(crate) arch: &'static str,
    /// OCI variant, where the platform has one.
    pub(crate) variant: Option<&'static str>,
    /// Debian's multiarch triplet, where its libraries live.
    pub(crate) triplet: &'static str,
}

pub(crate) const PLATFORMS: [Platform; 2] = [
    Platform {
        arch: "amd64",
        variant: None,
        triplet: "x86_64-linux-gnu",
    },
    Platform {
        arch: "arm64",
        variant: Some("v8"),
        triplet: "aarch64-linux-gnu",
    },
];

impl Platform {
    /// `amd64` or `arm64`, else an error naming the flag.
    pub(crate) fn named(arch: &str) -> Result<Platform> {
        PLATFORMS
            .into_iter()
            .find(|p| p.arch == arch)
            .with_context(|| format!("--arch {arch}: not one of amd64, arm64"))
    }

    /// This machine's.
    pub(crate) fn host() -> Result<Platform> {
        match std::env::consts::ARCH {
            "x86_64" => Platform::named("amd64"),
            "aarch64" => Platform::named("arm64"),
            other => bail!("no OCI architecture name for {other}"),
        }
    }
}

impl Platform {
    /// `readelf`'s name for the platform's machine.
    fn machine(self) -> &'static str {
        match self.arch {
            "arm64" => "AArch64",
            _ => "Advanced Micro Devices X86-64",
        }
    }

    /// `path` is an executable for this platform (`readelf -h`), else an error saying what it is.
    pub(crate) fn check_executable(self, path: &Path) -> Result<()> {
        let output = Command::new("readelf")
            .args(["--file-header"])
            .arg(path)
            .output()
            .context("cannot run readelf (Debian's binutils)")?;
        let text = String::from_utf8_lossy(&output.stdout);
        let machine = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("Machine:"))
            .map(str::trim)
            .filter(|_| output.status.success());
        match machine {
            Some(machine) if machine == self.machine() => Ok(()),
            Some(machine) => bail!(
                "{}: an executable for {machine}, not {}",
                path.display(),
                self.arch
            ),
            None => bail!("{}: not an ELF executable", path.display()),
        }
    }
}

/// Where the layer's files come from.
enum Source<'a> {
    Host,
    Foreign(&'a mut ForeignRoot),
}

impl Source<'_> {
    fn read(&self, path: &str) -> Result<Vec<u8>> {
        match self {
            Source::Host => std::fs::read(path).with_context(|| format!("cannot read {path}")),
            Source::Foreign(root) => root.read(path),
        }
    }

    /// A package's copyright file. Another architecture's package may point its documents at a package
    /// not unpacked (`libgcc-s1` → `gcc-12-base`): then the same package's here, the same text.
    fn copyright(&self, package: &str) -> Option<Vec<u8>> {
        let path = format!("/usr/share/doc/{package}/copyright");
        match self {
            Source::Foreign(root) => root.read(&path).ok().or_else(|| std::fs::read(&path).ok()),
            Source::Host => std::fs::read(&path).ok(),
        }
    }

    fn package(&mut self, name: &str) -> Result<DebianPackage> {
        match self {
            Source::Host => debian_package(name),
            Source::Foreign(root) => root.install(name),
        }
    }
}

/// The base layer for `binary` on `platform` (this machine's, else fetched into `scratch`), and the
/// Debian packages it came from.
pub(crate) fn base_layer(
    binary: &Path,
    platform: Platform,
    scratch: &Path,
) -> Result<(Tar, Vec<DebianPackage>)> {
    if platform == Platform::host()? {
        let files: Result<Vec<(String, String)>> = libraries(binary)?
            .into_iter()
            .map(|path| owner(&path).map(|package| (path, package)))
            .collect();
        return assemble(&mut Source::Host, &files?);
    }
    let mut root = ForeignRoot::open(scratch, platform)?;
    let mut files: Vec<(String, String)> = Vec::new();
    let (mut pending, loader) = needed(binary)?;
    // The libraries' own needs too, as `ldd` follows them on this machine.
    let loader_name = loader
        .as_deref()
        .and_then(|l| l.rsplit('/').next())
        .map(str::to_owned);
    while let Some(soname) = pending.pop() {
        // The loader (which the C library names) is added below, where the binary asks for it.
        if Some(&soname) == loader_name.as_ref()
            || files
                .iter()
                .any(|(path, _)| path.ends_with(&format!("/{soname}")))
        {
            continue;
        }
        let package = soname_package(&soname)?;
        root.install(&package)?;
        let path = root.library(&soname)?;
        pending.extend(needed(&root.file(&path)?)?.0);
        files.push((path, package));
    }
    if let Some(loader) = loader {
        // The dynamic loader is always libc6's.
        root.install("libc6")?;
        files.push((loader, "libc6".to_owned()));
    }
    assemble(&mut Source::Foreign(&mut root), &files)
}

/// The layer of `files` (path, package), the CA bundle and the users.
fn assemble(source: &mut Source<'_>, files: &[(String, String)]) -> Result<(Tar, Vec<DebianPackage>)> {
    let mut tar = Tar::default();
    let mut packages: BTreeMap<String, DebianPackage> = BTreeMap::new();
    let mut copyrights = Vec::new();
    for (path, package) in files {
        let mode = if path.contains(".so") { 0o755 } else { 0o644 };
        tar.file(path.trim_start_matches('/'), source.read(path)?, Meta::root(mode))?;
        if !packages.contains_key(package) {
            let found = source.package(package)?;
            copyrights.push(found.name.clone());
            packages.insert(package.clone(), found);
        }
    }
    for name in copyrights {
        if let Some(text) = source.copyright(&name) {
            let path = format!("usr/share/doc/{name}/copyright");
            tar.file(&path, text, Meta::root(0o644))?;
        }
    }
    if !Path::new("/").join(CA_BUNDLE).is_file() {
        bail!("/{CA_BUNDLE} is missing: install Debian's ca-certificates package");
    }
    // The bundle is generated by update-ca-certificates, so dpkg does not list it as the package's. It is
    // the same on every architecture: this machine's.
    let bundle = format!("/{CA_BUNDLE}");
    tar.file(CA_BUNDLE, std::fs::read(&bundle)?, Meta::root(0o644))?;
    packages
        .entry("ca-certificates".to_owned())
        .or_insert(debian_package("ca-certificates")?);
    if let Ok(text) = std::fs::read("/usr/share/doc/ca-certificates/copyright") {
        tar.file("usr/share/doc/ca-certificates/copyright", text, Meta::root(0o644))?;
    }
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

/// A binary's `NEEDED` libraries and its loader (`readelf`, which reads any architecture's ELF).
fn needed(binary: &Path) -> Result<(Vec<String>, Option<String>)> {
    let output = Command::new("readelf")
        .args(["--wide", "--dynamic", "--program-headers"])
        .arg(binary)
        .output()
        .context("cannot run readelf (Debian's binutils)")?;
    if !output.status.success() {
        bail!(
            "readelf {}: {}",
            binary.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut needed = Vec::new();
    let mut loader = None;
    for line in text.lines() {
        if line.contains("(NEEDED)")
            && let Some(name) = line.split("Shared library: [").nth(1)
        {
            needed.push(name.trim_end_matches(']').to_owned());
        }
        if let Some(path) = line.split("[Requesting program interpreter: ").nth(1) {
            loader = Some(path.trim_end_matches(']').to_owned());
        }
    }
    Ok((needed, loader))
}

/// The package that ships the library `soname` in this machine's own library directories (so, by
/// Debian's naming, on every architecture): never a cross toolchain's copy (`libgcc-s1-arm64-cross`
/// ships one under `/usr/aarch64-linux-gnu`), a 32-bit variant's, or a diversion.
fn soname_package(soname: &str) -> Result<String> {
    let triplet = Platform::host()?.triplet;
    let native = [
        format!("/lib/{triplet}/{soname}"),
        format!("/usr/lib/{triplet}/{soname}"),
    ];
    let output = Command::new("dpkg")
        .args(["-S", &format!("*/{soname}")])
        .output()
        .context("cannot run dpkg -S")?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .filter(|l| !l.starts_with("diversion by"))
        .filter_map(|l| l.split_once(": "))
        .filter(|(_, path)| native.iter().any(|n| n == path))
        .map(|(packages, _)| packages.split(", ").next().unwrap_or(packages))
        .map(|package| package.split(':').next().unwrap_or(package).to_owned())
        .next()
        .with_context(|| {
            format!(
                "no Debian package of this machine ships {soname}: the base layer of another \
                 architecture is assembled from the packages of the same names"
            )
        })
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

pub(super) fn debian_package(package: &str) -> Result<DebianPackage> {
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
