//! A Debian root of another architecture, holding only the packages an image's base layer needs: fetched
//! with `apt-get download` through a private apt state (this machine's dpkg configuration is never
//! changed) and unpacked with `dpkg-deb -x`, no root needed.
//!
//! The package indexes are kept under `<scratch>/apt-<arch>` and fetched once a day at most; the
//! packages are the versions this machine's apt sources serve, recorded for the bill of materials.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};

use super::super::sbom::DebianPackage;
use super::platform::Platform;

/// How old the package indexes may be before they are fetched again.
const FRESH: Duration = Duration::from_secs(24 * 3600);

pub(crate) struct ForeignRoot {
    platform: Platform,
    apt: PathBuf,
    root: PathBuf,
    installed: BTreeMap<String, DebianPackage>,
}

impl ForeignRoot {
    /// An empty root for `platform` under `scratch`, with fresh package indexes.
    pub(crate) fn open(scratch: &Path, platform: Platform) -> Result<ForeignRoot> {
        let apt = scratch.join(format!("apt-{}", platform.arch));
        let root = scratch.join(format!("root-{}", platform.arch));
        if root.exists() {
            std::fs::remove_dir_all(&root).with_context(|| format!("cannot clear {}", root.display()))?;
        }
        for dir in ["lists/partial", "cache/archives/partial", "apt.conf.d"] {
            std::fs::create_dir_all(apt.join(dir))?;
        }
        // An empty apt.conf.d: no hooks of the machine's run (see `apt_get`).
        let parts = apt.join("apt.conf.d");
        std::fs::write(
            apt.join("apt.conf"),
            format!("Dir::Etc::Parts \"{}\";\n", parts.display()),
        )?;
        std::fs::create_dir_all(&root)?;
        let foreign = ForeignRoot {
            platform,
            apt,
            root,
            installed: BTreeMap::new(),
        };
        let stamp = foreign.apt.join("updated");
        let fresh = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| SystemTime::now().duration_since(t).is_ok_and(|age| age < FRESH));
        if !fresh {
            foreign.apt_get(&["update"], &foreign.apt)?;
            std::fs::write(&stamp, b"")?;
        }
        Ok(foreign)
    }

    /// `apt-get ARGS` with the private state, for this machine's architecture and the platform's, and
    /// without the machine's `apt.conf.d` (its hooks, such as packagekit's, are not ours to run): only
    /// its package sources.
    fn apt_get(&self, args: &[&str], dir: &Path) -> Result<()> {
        let state = |name: &str| self.apt.join(name).display().to_string();
        let output = Command::new("apt-get")
            .env("APT_CONFIG", self.apt.join("apt.conf"))
            .arg("-q")
            .arg(format!("-oAPT::Architectures::={}", Platform::host()?.arch))
            .arg(format!("-oAPT::Architectures::={}", self.platform.arch))
            .arg(format!("-oDir::State::Lists={}", state("lists")))
            .arg(format!("-oDir::Cache={}", state("cache")))
            .arg("-oDebug::NoLocking=1")
            .args(args)
            .current_dir(dir)
            .output()
            .context("cannot run apt-get (the base layer of another architecture is fetched with it)")?;
        if !output.status.success() {
            bail!(
                "apt-get {} for {}: {}",
                args.join(" "),
                self.platform.arch,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }

    /// Fetches and unpacks `package` of the platform's architecture, once; what it is.
    pub(crate) fn install(&mut self, package: &str) -> Result<DebianPackage> {
        if let Some(found) = self.installed.get(package) {
            return Ok(found.clone());
        }
        // A fresh directory per package: what apt-get download writes there is the version it chose.
        let debs = self.apt.join("debs").join(package);
        if debs.exists() {
            std::fs::remove_dir_all(&debs)?;
        }
        std::fs::create_dir_all(&debs)?;
        let qualified = format!("{package}:{}", self.platform.arch);
        self.apt_get(&["download", &qualified], &debs)?;
        let suffix = format!("_{}.deb", self.platform.arch);
        let found: Vec<PathBuf> = std::fs::read_dir(&debs)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(&suffix))
            .collect();
        let [deb] = &found[..] else {
            bail!(
                "apt-get download {qualified} wrote {} files ending in {suffix}, not one",
                found.len()
            );
        };
        let deb = deb.clone();
        let field = |name: &str| -> Result<String> {
            let output = Command::new("dpkg-deb").arg("-f").arg(&deb).arg(name).output()?;
            Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
        };
        let described = DebianPackage {
            name: field("Package")?,
            version: field("Version")?,
            architecture: field("Architecture")?,
        };
        let status = Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(&self.root)
            .status()
            .context("cannot run dpkg-deb")?;
        if !status.success() {
            bail!("dpkg-deb -x {} failed ({status})", deb.display());
        }
        self.installed.insert(package.to_owned(), described.clone());
        Ok(described)
    }

    /// Where the unpacked packages put the library `soname`, as an absolute path in the image.
    pub(crate) fn library(&self, soname: &str) -> Result<String> {
        let triplet = self.platform.triplet;
        for dir in [format!("/lib/{triplet}"), format!("/usr/lib/{triplet}")] {
            let path = format!("{dir}/{soname}");
            if self.resolve(&path).is_ok() {
                return Ok(path);
            }
        }
        bail!(
            "{soname} is in none of the {} packages unpacked ({})",
            self.platform.arch,
            self.installed.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    }

    /// Where `path` of the root is on this machine, symbolic links followed inside the root.
    pub(crate) fn file(&self, path: &str) -> Result<PathBuf> {
        self.resolve(path)
    }

    /// The bytes of `path` in the root, symbolic links followed inside the root.
    pub(crate) fn read(&self, path: &str) -> Result<Vec<u8>> {
        let file = self.resolve(path)?;
        std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))
    }

    /// `path` in the root with every symbolic link followed inside the root, component by component (an
    /// absolute target, or `..`, never leaves the root for this machine's files).
    fn resolve(&self, path: &str) -> Result<PathBuf> {
        let mut resolved: Vec<String> = Vec::new();
        let mut pending: Vec<String> = components(path).rev().collect();
        let mut links = 0;
        while let Some(component) = pending.pop() {
            match component.as_str() {
                "." => continue,
                ".." => {
                    resolved.pop();
                    continue;
                }
                _ => {}
            }
            let candidate = self.root.join(resolved.join("/")).join(&component);
            let metadata = std::fs::symlink_metadata(&candidate)
                .with_context(|| format!("{path}: not in the {} root", self.platform.arch))?;
            if !metadata.file_type().is_symlink() {
                resolved.push(component);
                continue;
            }
            links += 1;
            if links > 40 {
                bail!(
                    "{path}: too many symbolic links in the {} root",
                    self.platform.arch
                );
            }
            let target = std::fs::read_link(&candidate)?.to_string_lossy().into_owned();
            if target.starts_with('/') {
                resolved.clear();
            }
            pending.extend(components(&target).rev());
        }
        Ok(self.root.join(resolved.join("/")))
    }
}

/// The non-empty components of a path.
fn components(path: &str) -> impl DoubleEndedIterator<Item = String> + '_ {
    path.split('/').filter(|c| !c.is_empty()).map(str::to_owned)
}
