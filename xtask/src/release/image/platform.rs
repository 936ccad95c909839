//! The platforms an image is built for, and the check that an executable is one of theirs.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

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
