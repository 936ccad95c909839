//! What `dist` and `image` ship, and the facts both stamp on it: version, revision, build time.
//!
//! A shipped binary is any binary target of a workspace package whose name ends in
//! `cloud-controller-manager`: the all-in-one binary, and each provider's own (`cargo xtask new-provider`
//! scaffolds one), so a new provider ships without editing this file. `--manifest-path` points the same
//! tooling at another Cargo project (a vendor's, outside this repository): its binaries, its lock file,
//! its README, LICENSE and commit.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::shell::{cargo, repo_root};

pub(crate) mod archive;
pub(crate) mod dist;
pub(crate) mod image;
pub(crate) mod notes;
pub(crate) mod publish;
pub(crate) mod sbom;

/// A binary this repository ships.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shipped {
    /// Cargo package name.
    pub(crate) package: String,
    /// Binary name (also the image's name).
    pub(crate) bin: String,
    /// The package's description (the image's `org.opencontainers.image.description`).
    pub(crate) description: String,
    /// The package's licence expression.
    pub(crate) license: String,
    /// The package's version.
    pub(crate) version: String,
    /// The package's directory (its README.md is shipped when it has one).
    pub(crate) dir: PathBuf,
    /// The root of the package's workspace (its Cargo.lock, README.md, LICENSE and git checkout).
    pub(crate) root: PathBuf,
    /// The project's `Cargo.toml` when it is not this repository (`--manifest-path`).
    pub(crate) manifest: Option<PathBuf>,
}

/// `cargo`, pointed at `manifest`'s project when one is given.
pub(crate) fn cargo_in(manifest: Option<&Path>, args: &[&str]) -> Command {
    let mut command = cargo();
    command.args(args);
    if let Some(manifest) = manifest {
        command.arg("--manifest-path").arg(manifest);
    }
    command
}

/// Every shipped binary of this repository, or of the project of `manifest`, from `cargo metadata`,
/// sorted by name.
pub(crate) fn shipped(manifest: Option<&Path>) -> Result<Vec<Shipped>> {
    let output = cargo_in(
        manifest,
        &["metadata", "--format-version", "1", "--no-deps", "--offline"],
    )
    .output()
    .context("cannot run cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: Value = serde_json::from_slice(&output.stdout).context("cargo metadata's output")?;
    let root = PathBuf::from(
        metadata["workspace_root"]
            .as_str()
            .context("cargo metadata names no workspace_root")?,
    );
    let mut found = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        for target in package["targets"].as_array().into_iter().flatten() {
            let is_bin = target["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"));
            let name = target["name"].as_str().unwrap_or_default();
            if is_bin && name.ends_with("cloud-controller-manager") {
                let text = |key: &str| package[key].as_str().unwrap_or_default().to_owned();
                found.push(Shipped {
                    package: text("name"),
                    bin: name.to_owned(),
                    description: text("description"),
                    license: text("license"),
                    version: text("version"),
                    dir: Path::new(&text("manifest_path"))
                        .parent()
                        .map(Path::to_path_buf)
                        .unwrap_or_default(),
                    root: root.clone(),
                    manifest: manifest.map(Path::to_path_buf),
                });
            }
        }
    }
    found.sort_by(|a, b| a.bin.cmp(&b.bin));
    Ok(found)
}

/// The binaries named by `wanted` (all when empty); an unknown name is an error listing the known ones.
pub(crate) fn select(all: Vec<Shipped>, wanted: &[String]) -> Result<Vec<Shipped>> {
    if wanted.is_empty() {
        return Ok(all);
    }
    let mut chosen = Vec::new();
    for name in wanted {
        let Some(found) = all.iter().find(|s| &s.bin == name || s.package == *name) else {
            let known: Vec<_> = all.iter().map(|s| s.bin.as_str()).collect();
            bail!(
                "--bin {name}: no such shipped binary (known: {})",
                known.join(", ")
            );
        };
        if !chosen.contains(found) {
            chosen.push(found.clone());
        }
    }
    Ok(chosen)
}

/// How the binaries are built: the profile, and whether to build them or take them as they are.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BuildArgs {
    /// Cargo profile to build with (`dist`: fat LTO, what ships; `dev` for a quick look).
    #[arg(long, default_value = "dist")]
    pub(crate) profile: String,
    /// Use the binaries already built under the target directory for this profile instead of building.
    #[arg(long)]
    pub(crate) no_build: bool,
    /// Only these binaries (or packages); repeatable. Default: every shipped binary.
    #[arg(long = "bin", value_name = "NAME")]
    pub(crate) bins: Vec<String>,
    /// Cargo's target directory (default: CARGO_TARGET_DIR, else target/).
    #[arg(long, value_name = "DIR")]
    pub(crate) target_dir: Option<PathBuf>,
    /// Ship the binaries of another Cargo project (a provider built on kube-ccm outside this repository)
    /// instead of this repository's: its `Cargo.toml`.
    #[arg(long, value_name = "PATH")]
    pub(crate) manifest_path: Option<PathBuf>,
}

impl BuildArgs {
    pub(crate) fn target_dir(&self) -> PathBuf {
        self.target_dir.clone().unwrap_or_else(crate::shell::target_dir)
    }

    /// Builds (unless `--no-build`) and returns each binary with its path.
    pub(crate) fn binaries(&self) -> Result<Vec<(Shipped, PathBuf)>> {
        if let Some(manifest) = &self.manifest_path
            && !manifest.is_file()
        {
            bail!("--manifest-path {}: no such file", manifest.display());
        }
        let chosen = select(shipped(self.manifest_path.as_deref())?, &self.bins)?;
        if chosen.is_empty() {
            bail!("this workspace has no binary named *cloud-controller-manager");
        }
        let target_dir = self.target_dir();
        if !self.no_build {
            let mut build = cargo_in(
                self.manifest_path.as_deref(),
                &["build", "--locked", "--profile", &self.profile],
            );
            build.arg("--target-dir").arg(&target_dir);
            for s in &chosen {
                build.args(["--package", &s.package, "--bin", &s.bin]);
            }
            crate::shell::exec(&mut build)?;
        }
        let dir = target_dir.join(match self.profile.as_str() {
            "dev" | "test" => "debug",
            "bench" => "release",
            other => other,
        });
        chosen
            .into_iter()
            .map(|s| {
                let path = dir.join(&s.bin);
                if !path.is_file() {
                    bail!("{} is not built (run without --no-build)", path.display());
                }
                Ok((s, path))
            })
            .collect()
    }
}

/// The Rust target triple of this machine's binaries (`rustc -vV`'s host).
pub(crate) fn host_triple() -> Result<String> {
    let output = Command::new("rustc")
        .arg("-vV")
        .output()
        .context("cannot run rustc -vV")?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .context("rustc -vV printed no host")
}

/// The first of `names` that is a file in the package's directory or its workspace's root.
fn beside(binary: &Shipped, name: &str) -> Result<Vec<u8>> {
    let candidates = [binary.dir.join(name), binary.root.join(name)];
    let path = candidates.iter().find(|p| p.is_file()).with_context(|| {
        format!(
            "{} has no {name}, nor has {}: one is shipped beside the binary",
            binary.dir.display(),
            binary.root.display()
        )
    })?;
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The release notes of `binary` from its package's `CHANGELOG.md`, else its workspace's
/// ([`notes::release_notes`]); `None` when neither has one (a vendor may keep none).
pub(crate) fn release_notes(binary: &Shipped) -> Result<Option<String>> {
    let candidates = [binary.dir.join("CHANGELOG.md"), binary.root.join("CHANGELOG.md")];
    let Some(path) = candidates.iter().find(|p| p.is_file()) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    notes::release_notes(&text, &path.display().to_string(), &binary.bin, &binary.version).map(Some)
}

/// The README shipped beside `binary`: its package's own, else its workspace's.
pub(crate) fn readme(binary: &Shipped) -> Result<Vec<u8>> {
    beside(binary, "README.md")
}

/// The licence text shipped beside `binary`: its package's, else its workspace's.
pub(crate) fn license_text(binary: &Shipped) -> Result<Vec<u8>> {
    beside(binary, "LICENSE")
}

/// The root of the project being shipped: this repository's, or that of `--manifest-path`.
pub(crate) fn project_root(binaries: &[(Shipped, PathBuf)]) -> PathBuf {
    binaries
        .first()
        .map_or_else(repo_root, |(shipped, _)| shipped.root.clone())
}

/// The commit being shipped (`git rev-parse HEAD` in `root`), with `-dirty` when the work tree has
/// changes; None outside a git checkout.
pub(crate) fn revision(root: &Path) -> Option<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "HEAD"])?;
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{head}-dirty") } else { head })
}

/// The build time stamped on archives and images: `SOURCE_DATE_EPOCH` when set (the reproducible-builds
/// convention), else the last commit's time in `root`, else 0. Never the clock, so rebuilding gives the
/// same bytes.
pub(crate) fn source_date_epoch(root: &Path) -> Result<u64> {
    if let Ok(value) = std::env::var("SOURCE_DATE_EPOCH") {
        return value
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={value:?} is not a number of seconds"));
    }
    let output = Command::new("git")
        .args(["log", "-1", "--format=%ct"])
        .current_dir(root)
        .output();
    Ok(output
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0))
}

/// `seconds` since the epoch as RFC 3339 UTC (`2026-11-23T10:00:00Z`).
pub(crate) fn rfc3339(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let rem = seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Writes `contents` to `path` through a temporary file in the same directory, so a reader never sees a
/// half-written file.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path.parent().context("a file path has a parent")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let temporary = dir.join(format!(
        ".{}.partial",
        path.file_name()
            .context("a file path has a name")?
            .to_string_lossy()
    ));
    std::fs::write(&temporary, contents).with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_392_000 + 3_723), "2026-11-23T01:02:03Z");
    }

    #[test]
    fn select_names_binaries_or_packages_and_refuses_unknown_ones() {
        let s = |package: &str, bin: &str| Shipped {
            package: package.into(),
            bin: bin.into(),
            description: String::new(),
            license: String::new(),
            version: "0.1.0".into(),
            dir: PathBuf::new(),
            root: PathBuf::new(),
            manifest: None,
        };
        let all = vec![
            s("cloud-controller-manager", "cloud-controller-manager"),
            s("provider-example", "example-cloud-controller-manager"),
        ];
        assert_eq!(select(all.clone(), &[]).unwrap(), all);
        assert_eq!(
            select(all.clone(), &["provider-example".into()]).unwrap(),
            vec![all[1].clone()]
        );
        let error = select(all, &["aws-cloud-controller-manager".into()])
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "--bin aws-cloud-controller-manager: no such shipped binary (known: cloud-controller-manager, example-cloud-controller-manager)"
        );
    }
}
