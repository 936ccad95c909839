//! The other supported Kubernetes releases the tests can run against: `cargo xtask kube --kubernetes
//! RELEASE` builds that release's kube-apiserver and kube-controller-manager (upstream's own main
//! packages, `tool`s of a module of ours per release, such as `tools/kube-1.35`) and writes
//! `<target>/kube/kube-<release>.json`: the pinned manifest with those two binaries swapped. etcd, the Go
//! peers, kwok, helm and cosign stay the pinned ones: what is under test is the manager against that API
//! server (and that release's kube-controller-manager as the migration's N side).
//!
//! The support policy these serve is `docs/support-policy.md`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{KUBERNETES, Module, cache_key, compile, download, version, version_flags};
use crate::shell::target_dir;

/// The supported releases besides [`KUBERNETES`], oldest first, each with its module.
pub(crate) const RELEASES: [(&str, &str); 1] = [("v1.35.4", "tools/kube-1.35")];

fn module(release: &str, dir: &'static str) -> Module {
    Module {
        dir,
        binaries: &[
            ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
            (
                "kube-controller-manager",
                "k8s.io/kubernetes/cmd/kube-controller-manager",
            ),
        ],
        ldflags: format!("-s -w {}", version_flags(release)),
    }
}

/// Builds (or finds built) `release`'s components beside the pinned ones; the manifest's path and the
/// manifest. The pinned release gives the pinned manifest.
pub(crate) fn build(release: &str) -> Result<(PathBuf, Value)> {
    let pinned = super::build()?;
    if release == KUBERNETES {
        return Ok((target_dir().join("kube/kube.json"), pinned));
    }
    let Some(&(_, dir)) = RELEASES.iter().find(|(r, _)| *r == release) else {
        let others: Vec<&str> = RELEASES.iter().map(|(r, _)| *r).collect();
        bail!(
            "--kubernetes {release}: not a release this repository pins; supported: {KUBERNETES} (the \
             default) and {}",
            others.join(", ")
        );
    };
    super::requires(dir, "k8s.io/kubernetes", release)?;
    let module = module(release, dir);
    let key = cache_key(std::slice::from_ref(&module))?;
    let cache = target_dir().join("kube").join(format!("{release}-{key}"));
    let bin = cache.join("bin");
    if !bin.join("kube-apiserver").is_file() || !bin.join("kube-controller-manager").is_file() {
        let staging = cache.join("bin.partial");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)?;
        download(&module)?;
        compile(&module, &staging)?;
        let _ = std::fs::remove_dir_all(&bin);
        std::fs::rename(&staging, &bin)
            .with_context(|| format!("moving the binaries into {}", bin.display()))?;
    }
    let mut manifest = pinned;
    manifest["kubernetes"] = json!(release);
    for (name, _) in module.binaries {
        let path = bin.join(name);
        let version = version(&path)?;
        manifest["binaries"][*name] = json!({"path": path, "version": version});
    }
    let path = target_dir().join(format!("kube/kube-{release}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&manifest)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "kube: {release}'s kube-apiserver and kube-controller-manager: {}",
        path.display()
    );
    Ok((path, manifest))
}
