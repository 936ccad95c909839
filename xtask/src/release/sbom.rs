//! A CycloneDX 1.5 (JSON) software bill of materials for one binary: every crate linked into it, from
//! `cargo tree` over `Cargo.lock` (normal dependencies, this platform, the package's default features),
//! with versions, licences, package URLs and the lock file's SHA-256 checksums; and, for an image, the
//! Debian packages its root filesystem was assembled from.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::archive::sha256;
use super::{Shipped, cargo_in, rfc3339};

/// One crate of the dependency tree.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Crate {
    pub(crate) name: String,
    pub(crate) version: String,
    /// None for a crate of this workspace (a path dependency).
    pub(crate) checksum: Option<String>,
    pub(crate) license: String,
    local: bool,
}

impl Crate {
    fn bom_ref(&self) -> String {
        format!("pkg:cargo/{}@{}", self.name, self.version)
    }
}

/// A Debian package an image's root filesystem takes files from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DebianPackage {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) architecture: String,
}

/// The crates linked into `package`'s binaries and who depends on whom.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    pub(crate) crates: BTreeMap<String, Crate>,
    edges: BTreeMap<String, BTreeSet<String>>,
    root: String,
}

/// Reads the tree of `binary`'s package with `cargo tree` (offline, locked) and the checksums from its
/// workspace's `Cargo.lock`.
pub(crate) fn tree(binary: &Shipped) -> Result<Tree> {
    let package = binary.package.as_str();
    let args = [
        "tree",
        "--locked",
        "--offline",
        "--edges",
        "normal",
        "--prefix",
        "depth",
        "--format",
        "{p}|{l}",
        "--package",
        package,
    ];
    let output = cargo_in(binary.manifest.as_deref(), &args)
        .output()
        .context("cannot run cargo tree")?;
    if !output.status.success() {
        bail!(
            "cargo tree -p {package} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let lock_path = binary.root.join("Cargo.lock");
    let lock = std::fs::read_to_string(&lock_path)
        .with_context(|| format!("cannot read {}", lock_path.display()))?;
    parse_tree(&String::from_utf8_lossy(&output.stdout), &checksums(&lock))
}

/// `name version → checksum` for every registry package of a `Cargo.lock`.
pub(crate) fn checksums(lock: &str) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                l.strip_prefix(key)
                    .and_then(|r| r.trim_start().strip_prefix('='))
                    .map(|v| v.trim().trim_matches('"').to_owned())
            })
        };
        if let (Some(name), Some(version), Some(sum)) = (field("name"), field("version"), field("checksum")) {
            out.insert((name, version), sum);
        }
    }
    out
}

fn parse_tree(text: &str, checksums: &BTreeMap<(String, String), String>) -> Result<Tree> {
    let mut tree = Tree::default();
    let mut stack: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let digits = line.chars().take_while(char::is_ascii_digit).count();
        let depth: usize = line[..digits]
            .parse()
            .with_context(|| format!("cargo tree line {line:?}"))?;
        let rest = line[digits..].trim_end_matches(" (*)");
        let (package, license) = rest
            .split_once('|')
            .with_context(|| format!("cargo tree line {line:?}"))?;
        let mut words = package.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next().and_then(|v| v.strip_prefix('v')))
        else {
            bail!("cargo tree line {line:?} has no name and version");
        };
        let local = package.contains(" (/");
        let krate = Crate {
            name: name.to_owned(),
            version: version.to_owned(),
            checksum: checksums.get(&(name.to_owned(), version.to_owned())).cloned(),
            license: license.trim().replace('/', " OR "),
            local,
        };
        if !local && krate.checksum.is_none() {
            bail!("{name} {version} has no checksum in Cargo.lock");
        }
        let id = krate.bom_ref();
        stack.truncate(depth);
        match stack.last() {
            Some(parent) => {
                tree.edges.entry(parent.clone()).or_default().insert(id.clone());
            }
            None if depth == 0 => tree.root = id.clone(),
            None => bail!("cargo tree line {line:?} has no parent"),
        }
        tree.edges.entry(id.clone()).or_default();
        tree.crates.insert(id.clone(), krate);
        stack.push(id);
    }
    if tree.root.is_empty() {
        bail!("cargo tree printed nothing");
    }
    Ok(tree)
}

/// The CycloneDX document for `binary`, built from `tree` and (for an image) `debian` packages.
pub(crate) fn cyclonedx(binary: &Shipped, tree: &Tree, debian: &[DebianPackage], epoch: u64) -> Value {
    let mut components: Vec<Value> = Vec::new();
    for (id, krate) in &tree.crates {
        if *id == tree.root {
            continue;
        }
        let mut component = json!({
            "type": "library",
            "bom-ref": id,
            "name": krate.name,
            "version": krate.version,
            "purl": id,
        });
        if !krate.license.is_empty() {
            component["licenses"] = json!([{ "expression": krate.license }]);
        }
        if let Some(sum) = &krate.checksum {
            component["hashes"] = json!([{ "alg": "SHA-256", "content": sum }]);
            component["externalReferences"] = json!([{
                "type": "distribution",
                "url": format!("https://crates.io/api/v1/crates/{}/{}/download", krate.name, krate.version),
            }]);
        }
        components.push(component);
    }
    for package in debian {
        let purl = format!(
            "pkg:deb/debian/{}@{}?arch={}",
            package.name,
            package.version.replace(':', "%3A").replace('+', "%2B"),
            package.architecture
        );
        components.push(json!({
            "type": "library",
            "bom-ref": purl,
            "name": package.name,
            "version": package.version,
            "purl": purl,
        }));
    }
    let dependencies: Vec<Value> = tree
        .edges
        .iter()
        .map(|(from, to)| json!({ "ref": from, "dependsOn": to }))
        .collect();
    let mut document = json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "timestamp": rfc3339(epoch),
            "tools": { "components": [{ "type": "application", "name": "cargo xtask", "version": env!("CARGO_PKG_VERSION") }] },
            "component": {
                "type": "application",
                "bom-ref": tree.root,
                "name": binary.bin,
                "version": binary.version,
                "description": binary.description,
                "licenses": [{ "expression": binary.license }],
                "purl": tree.root,
            },
        },
        "components": components,
        "dependencies": dependencies,
    });
    // The serial number is derived from the content, so the same inputs give the same document.
    let digest = sha256(document.to_string().as_bytes());
    document["serialNumber"] = json!(format!(
        "urn:uuid:{}-{}-5{}-8{}-{}",
        &digest[..8],
        &digest[8..12],
        &digest[13..16],
        &digest[17..20],
        &digest[20..32]
    ));
    document
}

#[cfg(test)]
mod tests {
    use super::*;

    const TREE: &str = "\
0cloud-controller-manager v0.1.0 (/repo/crates/kube-ccm-cli)|Apache-2.0
1anyhow v1.0.100|MIT OR Apache-2.0
1tokio v1.48.0|MIT
2bytes v1.10.1|MIT
1tokio-util v0.7.16|MIT
2tokio v1.48.0|MIT (*)
2old v0.1.0|MIT/Apache-2.0
";

    fn sums() -> BTreeMap<(String, String), String> {
        checksums(
            "version = 4\n\n[[package]]\nname = \"anyhow\"\nversion = \"1.0.100\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\nchecksum = \"aa\"\n\n[[package]]\nname = \"local\"\nversion = \"0.1.0\"\n\n[[package]]\nname = \"tokio\"\nversion = \"1.48.0\"\nchecksum = \"bb\"\n\n[[package]]\nname = \"bytes\"\nversion = \"1.10.1\"\nchecksum = \"cc\"\n\n[[package]]\nname = \"tokio-util\"\nversion = \"0.7.16\"\nchecksum = \"dd\"\n\n[[package]]\nname = \"old\"\nversion = \"0.1.0\"\nchecksum = \"ee\"\n",
        )
    }

    #[test]
    fn the_tree_gives_components_edges_and_lock_checksums() {
        let tree = parse_tree(TREE, &sums()).unwrap();
        assert_eq!(tree.root, "pkg:cargo/cloud-controller-manager@0.1.0");
        assert_eq!(tree.crates.len(), 6);
        assert_eq!(
            tree.crates["pkg:cargo/tokio@1.48.0"].checksum.as_deref(),
            Some("bb")
        );
        assert_eq!(tree.crates["pkg:cargo/old@0.1.0"].license, "MIT OR Apache-2.0");
        let util: Vec<_> = tree.edges["pkg:cargo/tokio-util@0.7.16"]
            .iter()
            .cloned()
            .collect();
        assert_eq!(util, ["pkg:cargo/old@0.1.0", "pkg:cargo/tokio@1.48.0"]);
        let shipped = Shipped {
            package: "cloud-controller-manager".into(),
            bin: "cloud-controller-manager".into(),
            description: "d".into(),
            license: "Apache-2.0".into(),
            version: "0.1.0".into(),
            dir: std::path::PathBuf::new(),
            root: std::path::PathBuf::new(),
            manifest: None,
        };
        let deb = [DebianPackage {
            name: "libc6".into(),
            version: "2.36-9+deb12u14".into(),
            architecture: "amd64".into(),
        }];
        let a = cyclonedx(&shipped, &tree, &deb, 0);
        assert_eq!(a, cyclonedx(&shipped, &tree, &deb, 0));
        assert_eq!(a["components"].as_array().unwrap().len(), 6);
        assert_eq!(
            a["components"][5]["purl"],
            "pkg:deb/debian/libc6@2.36-9%2Bdeb12u14?arch=amd64"
        );
        assert!(a["serialNumber"].as_str().unwrap().starts_with("urn:uuid:"));
    }

    #[test]
    fn a_registry_crate_missing_from_the_lock_is_an_error() {
        let error = parse_tree("0a v0.1.0 (/x)|MIT\n1ghost v9.9.9|MIT\n", &sums()).unwrap_err();
        assert_eq!(error.to_string(), "ghost 9.9.9 has no checksum in Cargo.lock");
    }
}
