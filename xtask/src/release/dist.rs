//! `cargo xtask dist`: a tarball per shipped binary (the binary, README.md, LICENSE, its bill of materials
//! and its release notes from `CHANGELOG.md`), the bills of materials and release notes beside them, and
//! `SHA256SUMS`, under `target/dist/`.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::archive::{Meta, Tar, gzip, sha256};
use super::sbom::{cyclonedx, tree};
use super::{BuildArgs, host_triple, license_text, readme, release_notes, source_date_epoch, write_atomic};

/// Arguments of `cargo xtask dist`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    build: BuildArgs,
    /// Where to write (default: dist/ under the target directory). Its previous contents are replaced.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let binaries = args.build.binaries()?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.build.target_dir().join("dist"));
    let triple = host_triple()?;
    let epoch = source_date_epoch(&super::project_root(&binaries))?;
    // Everything is written to a sibling directory first and swapped in at the end: an interrupted run
    // leaves the previous distribution as it was.
    let staging = out.with_extension("partial");
    if staging.exists() {
        std::fs::remove_dir_all(&staging).with_context(|| format!("cannot remove {}", staging.display()))?;
    }
    let mut sums = String::new();
    for (binary, path) in &binaries {
        let stem = format!("{}-{}-{triple}", binary.bin, binary.version);
        let sbom = serde_json::to_vec_pretty(&cyclonedx(binary, &tree(binary)?, &[], epoch))?;
        let mut tar = Tar::default();
        let executable = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        tar.file(&format!("{stem}/{}", binary.bin), executable, Meta::root(0o755))?;
        tar.file(&format!("{stem}/README.md"), readme(binary)?, Meta::root(0o644))?;
        tar.file(
            &format!("{stem}/LICENSE"),
            license_text(binary)?,
            Meta::root(0o644),
        )?;
        tar.file(&format!("{stem}/sbom.cdx.json"), sbom.clone(), Meta::root(0o644))?;
        let notes = release_notes(binary)?.map(String::into_bytes);
        match &notes {
            Some(notes) => tar.file(
                &format!("{stem}/RELEASE-NOTES.md"),
                notes.clone(),
                Meta::root(0o644),
            )?,
            None => println!("no CHANGELOG.md for {}: no release notes", binary.package),
        }
        let tarball = gzip(&tar.to_bytes(epoch)?)?;
        let notes_name = format!("{}-{}.release-notes.md", binary.bin, binary.version);
        let beside = [
            Some((format!("{stem}.tar.gz"), &tarball)),
            Some((format!("{stem}.cdx.json"), &sbom)),
            notes.as_ref().map(|n| (notes_name, n)),
        ];
        for (name, bytes) in beside.into_iter().flatten() {
            write_atomic(&staging.join(&name), bytes)?;
            sums.push_str(&format!("{}  {name}\n", sha256(bytes)));
            println!("{:>10}  {}", human(bytes.len()), out.join(&name).display());
        }
    }
    write_atomic(&staging.join("SHA256SUMS"), sums.as_bytes())?;
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("cannot replace {}", out.display()))?;
    }
    std::fs::rename(&staging, &out).with_context(|| format!("cannot write {}", out.display()))?;
    println!("{:>10}  {}", "", out.join("SHA256SUMS").display());
    Ok(())
}

/// Bytes in MB with one decimal.
pub(crate) fn human(bytes: usize) -> String {
    format!("{:.1} MB", bytes as f64 / 1_000_000.0)
}
