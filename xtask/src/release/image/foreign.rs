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
use super::base::Platform;

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
        for dir in ["lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(apt.join(dir))?;
        }
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

    /// `apt-get ARGS` with the private state, for this machine's architecture and the platform's.
    fn apt_get(&self, args: &[&str], dir: &Path) -> Result<()> {
        let state = |name: &str| self.apt.join(name).display().to_string();
        let output = Command::new("apt-get")
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
        let debs = self.apt.join("debs");
        std::fs::create_dir_all(&debs)?;
        let qualified = format!("{package}:{}", self.platform.arch);
        self.apt_get(&["download", &qualified], &debs)?;
        let prefix = format!("{package}_");
        let suffix = format!("_{}.deb", self.platform.arch);
        let mut found: Vec<PathBuf> = std::fs::read_dir(&debs)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                name.starts_with(&prefix) && name.ends_with(&suffix)
            })
            .collect();
        // The newest download of it, should older ones be kept from another day.
        found.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
        let deb = found
            .pop()
            .with_context(|| format!("apt-get download {qualified} wrote no {prefix}*{suffix}"))?;
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

    /// The bytes of `path` in the root, symbolic links followed inside the root.
    pub(crate) fn read(&self, path: &str) -> Result<Vec<u8>> {
        let file = self.resolve(path)?;
        std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))
    }

    /// `path` in the root with every symbolic link followed inside the root (an absolute link target
    /// names the root's file, never this machine's).
    fn resolve(&self, path: &str) -> Result<PathBuf> {
        let mut current = PathBuf::from(path.trim_start_matches('/'));
        for _ in 0..40 {
            let on_disk = self.root.join(&current);
            let metadata = std::fs::symlink_metadata(&on_disk)
                .with_context(|| format!("{path}: not in the {} root", self.platform.arch))?;
            if !metadata.file_type().is_symlink() {
                return Ok(on_disk);
            }
            let target = std::fs::read_link(&on_disk)?;
            current = match target.strip_prefix("/") {
                Ok(absolute) => absolute.to_path_buf(),
                Err(_) => current.parent().unwrap_or(Path::new("")).join(target),
            };
        }
        bail!(
            "{path}: too many symbolic links in the {} root",
            self.platform.arch
        )
    }
}
