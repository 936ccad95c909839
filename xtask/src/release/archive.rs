//! Byte-for-byte reproducible archives: a ustar writer with fixed owners and times and sorted entries,
//! gzip without a timestamp, and SHA-256 digests.
//!
//! Hand-written rather than taken from a crate because reproducibility is the whole point: every field
//! of every header is decided here.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Result, bail};
use flate2::{Compression, GzBuilder};
use sha2::{Digest, Sha256};

/// One entry of a [`Tar`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Directory,
    File(Vec<u8>),
}

/// A tar archive assembled in memory: entries are written sorted by path, parents first, so the same
/// entries always give the same bytes whatever order they were added in.
#[derive(Debug, Default)]
pub(crate) struct Tar {
    entries: BTreeMap<String, (Body, Meta)>,
}

/// Mode and owner of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) mode: u32,
    pub(crate) uid: u32,
}

impl Meta {
    /// Root-owned, `mode`.
    pub(crate) const fn root(mode: u32) -> Meta {
        Meta { mode, uid: 0 }
    }
}

impl Tar {
    /// Adds a file at `path` (relative, `/`-separated), creating its parent directories (0755, root).
    pub(crate) fn file(&mut self, path: &str, contents: Vec<u8>, meta: Meta) -> Result<()> {
        self.parents(path)?;
        self.insert(path, Body::File(contents), meta)
    }

    /// Adds a directory (and its parents).
    pub(crate) fn dir(&mut self, path: &str, meta: Meta) -> Result<()> {
        self.parents(path)?;
        self.entries.insert(path.to_owned(), (Body::Directory, meta));
        Ok(())
    }

    fn parents(&mut self, path: &str) -> Result<()> {
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c.is_empty() || c == "..") {
            bail!("archive path {path:?} is not a plain relative path");
        }
        let mut parent = String::new();
        for component in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, p)| p)
        {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(component);
            self.entries
                .entry(parent.clone())
                .or_insert((Body::Directory, Meta::root(0o755)));
        }
        Ok(())
    }

    fn insert(&mut self, path: &str, body: Body, meta: Meta) -> Result<()> {
        if let Some((Body::Directory, _)) = self.entries.get(path) {
            bail!("archive path {path:?} is already a directory");
        }
        self.entries.insert(path.to_owned(), (body, meta));
        Ok(())
    }

    /// The archive's bytes; every entry gets modification time `mtime` (seconds since the epoch).
    pub(crate) fn to_bytes(&self, mtime: u64) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for (path, (body, meta)) in &self.entries {
            let (name, kind, data): (String, u8, &[u8]) = match body {
                Body::Directory => (format!("{path}/"), b'5', &[]),
                Body::File(data) => (path.clone(), b'0', data),
            };
            out.extend_from_slice(&header(&name, kind, data.len() as u64, *meta, mtime)?);
            out.extend_from_slice(data);
            out.resize(out.len().next_multiple_of(512), 0);
        }
        out.resize(out.len() + 1024, 0);
        Ok(out)
    }
}

/// A ustar header. Names longer than 100 bytes are split into the prefix field at a `/`.
fn header(path: &str, kind: u8, size: u64, meta: Meta, mtime: u64) -> Result<[u8; 512]> {
    let mut h = [0u8; 512];
    let (prefix, name) = if path.len() <= 100 {
        ("", path)
    } else {
        let split = path[..path.len().min(156)]
            .trim_end_matches('/')
            .rfind('/')
            .filter(|&i| path.len() - i - 1 <= 100)
            .ok_or_else(|| anyhow::anyhow!("archive path {path:?} is too long for ustar"))?;
        (&path[..split], &path[split + 1..])
    };
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], u64::from(meta.mode));
    octal(&mut h[108..116], u64::from(meta.uid));
    octal(&mut h[116..124], u64::from(meta.uid));
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], mtime);
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    octal(&mut h[329..337], 0);
    octal(&mut h[337..345], 0);
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let field = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(field.as_bytes());
    Ok(h)
}

/// Zero-padded octal, NUL-terminated, filling `field`.
fn octal(field: &mut [u8], value: u64) {
    let digits = format!("{value:0width$o}", width = field.len() - 1);
    field[..digits.len()].copy_from_slice(digits.as_bytes());
    field[field.len() - 1] = 0;
}

/// gzip at the best compression, with no name and no timestamp in the header.
pub(crate) fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::with_capacity(data.len() / 3), Compression::best());
    encoder.write_all(data)?;
    Ok(encoder.finish()?)
}

/// The lowercase hex SHA-256 of `data`.
pub(crate) fn sha256(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_sorted_with_parents_and_the_bytes_do_not_depend_on_insertion_order() {
        let mut a = Tar::default();
        a.file("usr/local/bin/x", b"#!".to_vec(), Meta::root(0o755))
            .unwrap();
        a.file("etc/passwd", b"root".to_vec(), Meta::root(0o644)).unwrap();
        let mut b = Tar::default();
        b.file("etc/passwd", b"root".to_vec(), Meta::root(0o644)).unwrap();
        b.file("usr/local/bin/x", b"#!".to_vec(), Meta::root(0o755))
            .unwrap();
        let bytes = a.to_bytes(1_700_000_000).unwrap();
        assert_eq!(bytes, b.to_bytes(1_700_000_000).unwrap());
        assert_eq!(bytes.len() % 512, 0);
        let names: Vec<_> = a.entries.keys().cloned().collect();
        assert_eq!(
            names,
            [
                "etc",
                "etc/passwd",
                "usr",
                "usr/local",
                "usr/local/bin",
                "usr/local/bin/x"
            ]
        );
        assert_eq!(sha256(&gzip(&bytes).unwrap()), sha256(&gzip(&bytes).unwrap()));
    }

    #[test]
    fn bad_paths_and_files_over_directories_are_refused() {
        let mut tar = Tar::default();
        for bad in ["/etc/passwd", "a/../b", "a//b", ""] {
            assert!(tar.file(bad, vec![], Meta::root(0o644)).is_err(), "{bad}");
        }
        tar.dir("tmp", Meta::root(0o1777)).unwrap();
        assert!(tar.file("tmp", vec![], Meta::root(0o644)).is_err());
    }

    #[test]
    fn long_names_use_the_prefix_field() {
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        let h = header(&long, b'0', 0, Meta::root(0o644), 0).unwrap();
        assert_eq!(&h[..90], "f".repeat(90).as_bytes());
        assert_eq!(&h[345..465], "d".repeat(120).as_bytes());
        assert!(header(&"x".repeat(101), b'0', 0, Meta::root(0o644), 0).is_err());
    }
}
