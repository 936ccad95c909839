//! `cargo xtask kube`: the real Kubernetes components the tests run against, built from their Go modules.
//!
//! `tools/kube` (kube-apiserver and kube-controller-manager from `k8s.io/kubernetes`), `tools/etcd`
//! (etcd from `go.etcd.io/etcd/server/v3`) and `tools/aws` (upstream's AWS cloud-controller-manager from
//! `k8s.io/cloud-provider-aws`, unmodified: a `tool` of that module), `tools/kwok` (kwok, simulated
//! kubelets' status and Leases, from `sigs.k8s.io/kwok`, also a `tool`), `tools/helm` (helm, for the
//! chart's tests, from `helm.sh/helm/v3`, a `tool` too) and `tools/cosign` (cosign and crane, whose
//! registry the release images are pushed to, signed and verified in, from `github.com/sigstore/cosign/v3`
//! and `github.com/google/go-containerregistry`) are small Go modules of ours; their
//! `go.mod`/`go.sum` pin the release. The binaries are built with the machine's Go (`GOTOOLCHAIN=local`)
//! through the module proxy into `<target>/kube/<key>/bin/`, where the key is a hash of everything that
//! decides them (the modules' files, the Go version, the build flags): a second run costs nothing, a
//! changed pin builds again. Go's build cache lives beside them (`<target>/kube/go-build`), so a cold
//! target directory is a cold build.
//! The result is printed as JSON and written to `<target>/kube/kube.json`, where the tests find it.
//!
//! Test tooling only: nothing built here ships, and no binary or upstream source is committed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::shell::{repo_root, target_dir};

pub(crate) mod releases;

/// The Kubernetes release `tools/kube/go.mod` pins (kept equal by [`check_pins`]).
const KUBERNETES: &str = "v1.37.2";
/// The etcd release `tools/etcd/go.mod` pins.
const ETCD: &str = "v3.7.3";
/// The `k8s.io/cloud-provider-aws` release `tools/aws/go.mod` pins: the newest of the pinned Kubernetes
/// minor on the module proxy.
const CLOUD_PROVIDER_AWS: &str = "v1.37.1";
/// The `sigs.k8s.io/kwok` release `tools/kwok/go.mod` pins.
const KWOK: &str = "v0.8.0";
/// The `helm.sh/helm/v3` release `tools/helm/go.mod` pins.
const HELM: &str = "v3.22.0";
/// The `github.com/sigstore/cosign/v3` release `tools/cosign/go.mod` pins.
const COSIGN: &str = "v3.1.3";
/// The `github.com/google/go-containerregistry` release `tools/cosign/go.mod` pins (crane).
const CRANE: &str = "v0.22.1";
/// kwok's stages, from its module: its binary has none built in (only `kwokctl` injects them), so the
/// tests pass these with `--config`. Node status on first sight, then heartbeats beside a node Lease.
const KWOK_STAGES: [&str; 2] = [
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
];

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print where the binaries would be and whether they are built, without building.
    #[arg(long)]
    check: bool,
    /// Another supported Kubernetes release for kube-apiserver and kube-controller-manager (the rest stays
    /// pinned); writes `<target>/kube/kube-<release>.json`, for the tests' `KUBE_TOOLS_MANIFEST`.
    #[arg(long, value_name = "RELEASE", conflicts_with = "check")]
    kubernetes: Option<String>,
}

/// One Go module of ours and the binaries it builds: each a name and the package built under it (a
/// directory of the module, or a `tool` package of a module it requires).
pub(crate) struct Module {
    dir: &'static str,
    binaries: &'static [(&'static str, &'static str)],
    ldflags: String,
}

/// The `-X` flags that give a build of `k8s.io/component-base` the version `release` (a plain
/// `go build` says v0.0.0-master; upstream's release builds set these).
fn version_flags(release: &str) -> String {
    let mut parts = release.trim_start_matches('v').split('.');
    let major = parts.next().unwrap_or_default();
    let minor = parts.next().unwrap_or_default();
    format!(
        "-X k8s.io/component-base/version.gitVersion={release} \
         -X k8s.io/component-base/version.gitMajor={major} \
         -X k8s.io/component-base/version.gitMinor={minor} \
         -X k8s.io/component-base/version.gitTreeState=clean"
    )
}

fn modules() -> [Module; 6] {
    [
        Module {
            dir: "tools/kube",
            // go-cloud-controller-manager: upstream's CCM (k8s.io/cloud-provider's app package, in the same
            // module, at the same release) with a provider acting on this repository's fake cloud: the Go peer
            // of the interoperability tests and benchmarks.
            binaries: &[
                ("kube-apiserver", "./cmd/kube-apiserver"),
                ("kube-controller-manager", "./cmd/kube-controller-manager"),
                ("go-cloud-controller-manager", "./cmd/go-cloud-controller-manager"),
            ],
            ldflags: format!("-s -w {}", version_flags(KUBERNETES)),
        },
        Module {
            dir: "tools/etcd",
            binaries: &[("etcd", "./cmd/etcd")],
            ldflags: "-s -w".to_owned(),
        },
        Module {
            // cloud-provider-aws's own main package, as its release images build it: the AWS benchmark's
            // upstream contender (`ccm-bench versus --cloud aws`) and its test.
            dir: "tools/aws",
            binaries: &[(
                "aws-cloud-controller-manager",
                "k8s.io/cloud-provider-aws/cmd/aws-cloud-controller-manager",
            )],
            ldflags: format!("-s -w {}", version_flags(CLOUD_PROVIDER_AWS)),
        },
        Module {
            // kwok's own main package: its version is a constant of the module, so no `-X` flags.
            dir: "tools/kwok",
            binaries: &[("kwok", "sigs.k8s.io/kwok/cmd/kwok")],
            ldflags: "-s -w".to_owned(),
        },
        Module {
            // helm's own main package, with the flags of helm's Makefile: its version, and the Kubernetes
            // release `helm template` and `helm lint` assume (v1.20 without them) set to the pinned one.
            dir: "tools/helm",
            binaries: &[("helm", "helm.sh/helm/v3/cmd/helm")],
            ldflags: helm_flags(),
        },
        Module {
            // cosign and crane's own main packages, with the version flags of their Makefile and
            // goreleaser configuration (both `-X`, each harmless to the other).
            dir: "tools/cosign",
            binaries: &[
                ("cosign", "github.com/sigstore/cosign/v3/cmd/cosign"),
                ("crane", "github.com/google/go-containerregistry/cmd/crane"),
            ],
            ldflags: format!(
                "-s -w -X sigs.k8s.io/release-utils/version.gitVersion={COSIGN} \
                 -X sigs.k8s.io/release-utils/version.gitTreeState=clean \
                 -X github.com/google/go-containerregistry/cmd/crane/cmd.Version={CRANE}"
            ),
        },
    ]
}

/// The `-X` flags of helm's Makefile: [`HELM`], and [`KUBERNETES`] as the cluster version it assumes
/// without one (helm's Makefile takes it from its client-go; this pins the release the tests run).
fn helm_flags() -> String {
    let mut parts = KUBERNETES.trim_start_matches('v').split('.');
    let major = parts.next().unwrap_or_default();
    let minor = parts.next().unwrap_or_default();
    format!(
        "-s -w -X helm.sh/helm/v3/internal/version.version={HELM} \
         -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
         -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor={major} \
         -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={minor} \
         -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor={major} \
         -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={minor}"
    )
}

pub(crate) fn run(args: &Args) -> Result<()> {
    let manifest = if let Some(release) = &args.kubernetes {
        releases::build(release)?.1
    } else if args.check {
        let (key, dir) = cache_dir()?;
        json!({"key": key, "dir": dir, "built": dir.join("bin/kube.json").is_file()})
    } else {
        build()?
    };
    #[allow(clippy::print_stdout)]
    {
        println!("{}", serde_json::to_string_pretty(&manifest)?);
    }
    Ok(())
}

/// Builds (or finds built) the binaries; returns the manifest also written to `<target>/kube/kube.json`.
pub(crate) fn build() -> Result<serde_json::Value> {
    check_pins()?;
    let (key, dir) = cache_dir()?;
    let bin = dir.join("bin");
    let manifest_path = bin.join("kube.json");
    let manifest = if let Ok(text) = std::fs::read_to_string(&manifest_path) {
        eprintln!("kube: the binaries for {key} are built ({})", bin.display());
        serde_json::from_str(&text).context("reading the cached kube.json")?
    } else {
        let started = Instant::now();
        let staging = dir.join("bin.partial");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)?;
        for module in modules() {
            download(&module)?;
            compile(&module, &staging)?;
        }
        kwok_stages(&staging.join("kwok-stages.yaml"))?;
        let mut binaries = serde_json::Map::new();
        for module in modules() {
            for (name, _) in module.binaries {
                let path = bin.join(name);
                let version = version(&staging.join(name))?;
                binaries.insert((*name).to_owned(), json!({"path": path, "version": version}));
            }
        }
        let manifest = json!({
            "kubernetes": KUBERNETES,
            "etcd": ETCD,
            "cloud_provider_aws": CLOUD_PROVIDER_AWS,
            "kwok": KWOK,
            "helm": HELM,
            "cosign": COSIGN,
            "crane": CRANE,
            "kwok_stages": bin.join("kwok-stages.yaml"),
            "go": go_version()?,
            "key": key,
            "binaries": binaries,
            "build_seconds": started.elapsed().as_secs_f64().round(),
        });
        std::fs::write(
            staging.join("kube.json"),
            serde_json::to_string_pretty(&manifest)?,
        )?;
        let _ = std::fs::remove_dir_all(&bin);
        std::fs::rename(&staging, &bin)
            .with_context(|| format!("moving the binaries into {}", bin.display()))?;
        forget_other_keys(&key);
        eprintln!(
            "kube: built in {:.0} s; Go's build cache {} holds {} MB",
            started.elapsed().as_secs_f64(),
            go_cache().display(),
            size(&go_cache()) / 1_000_000
        );
        manifest
    };
    // Where the tests look: `<target>/kube/kube.json`.
    let current = target_dir().join("kube/kube.json");
    std::fs::write(&current, serde_json::to_string_pretty(&manifest)?)
        .with_context(|| format!("writing {}", current.display()))?;
    Ok(manifest)
}

/// Whether Go is here at all (a machine without it skips the real API server's tests, loudly).
pub(crate) fn go_available() -> bool {
    Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `<target>/kube/<key>`: the key is a hash of the modules' files, the Go version and the build flags.
fn cache_dir() -> Result<(String, PathBuf)> {
    let key = cache_key(&modules())?;
    Ok((key.clone(), target_dir().join("kube").join(key)))
}

/// A hash of `modules`' files, the Go version and the build flags.
fn cache_key(modules: &[Module]) -> Result<String> {
    let mut hash = Sha256::new();
    hash.update(go_version()?);
    for module in modules {
        hash.update(module.dir);
        hash.update(&module.ldflags);
        for file in module_files(&repo_root().join(module.dir))? {
            let bytes = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            hash.update(
                file.strip_prefix(repo_root())
                    .unwrap_or(&file)
                    .to_string_lossy()
                    .as_bytes(),
            );
            hash.update(bytes);
        }
    }
    let digest = hash.finalize();
    Ok(digest[..8].iter().map(|b| format!("{b:02x}")).collect())
}

/// Every file of a module directory, sorted.
fn module_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The pins of the go.mod files agree with [`KUBERNETES`] and [`ETCD`], which name them in the output.
fn check_pins() -> Result<()> {
    for (dir, module, version) in [
        ("tools/kube", "k8s.io/kubernetes", KUBERNETES),
        ("tools/etcd", "go.etcd.io/etcd/server/v3", ETCD),
        ("tools/aws", "k8s.io/cloud-provider-aws", CLOUD_PROVIDER_AWS),
        ("tools/kwok", "sigs.k8s.io/kwok", KWOK),
        ("tools/helm", "helm.sh/helm/v3", HELM),
        ("tools/cosign", "github.com/sigstore/cosign/v3", COSIGN),
        ("tools/cosign", "github.com/google/go-containerregistry", CRANE),
    ] {
        requires(dir, module, version)?;
    }
    Ok(())
}

/// `<dir>/go.mod` requires `module` at `version` (directly, or `// indirect` as a `tool`'s module is).
pub(crate) fn requires(dir: &str, module: &str, version: &str) -> Result<()> {
    let path = repo_root().join(dir).join("go.mod");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let wanted = format!("{module} {version}");
    let pinned = |line: &str| {
        let line = line.trim().trim_start_matches("require ");
        line == wanted || line == format!("{wanted} // indirect")
    };
    if !text.lines().any(pinned) {
        bail!(
            "{}: does not require {wanted}, which xtask/src/kube/ names",
            path.display()
        );
    }
    Ok(())
}

fn go() -> Command {
    let mut command = Command::new("go");
    command
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .env("GOCACHE", go_cache())
        // The committed go.sum must be complete: a build never edits the module files.
        .env("GOFLAGS", "-mod=readonly -trimpath -buildvcs=false");
    command
}

fn go_cache() -> PathBuf {
    target_dir().join("kube/go-build")
}

fn go_version() -> Result<String> {
    let output = Command::new("go")
        .arg("version")
        .env("GOTOOLCHAIN", "local")
        .output()
        .context(
            "go is not on PATH: the real kube-apiserver, etcd and kube-controller-manager are built from \
             their Go modules (Go 1.26 or later, with the module proxy)",
        )?;
    if !output.status.success() {
        bail!(
            "`go version` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// `go mod download`, so that a module the proxy cannot serve is named before any compiling.
fn download(module: &Module) -> Result<()> {
    let dir = repo_root().join(module.dir);
    eprintln!(
        "kube: downloading the modules of {} (GOPROXY={})…",
        module.dir,
        goproxy()
    );
    let output = go()
        .args(["mod", "download"])
        .current_dir(&dir)
        .output()
        .context("cannot run go")?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let problems: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        let more = match problems.len() {
            0 | 1 => String::new(),
            n => format!(" ({} more line(s) from go)", n - 1),
        };
        bail!(
            "{}: `go mod download` failed (GOPROXY={}): {}{more}",
            module.dir,
            goproxy(),
            problems.first().unwrap_or(&"(no message)")
        );
    }
    Ok(())
}

fn goproxy() -> String {
    Command::new("go")
        .args(["env", "GOPROXY"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// `go build` of a module's binaries into `out`, with a line of progress per hundred packages.
fn compile(module: &Module, out: &Path) -> Result<()> {
    let dir = repo_root().join(module.dir);
    let started = Instant::now();
    eprintln!(
        "kube: building {} from {} (cold: many minutes on two cores; cached afterwards)…",
        names(module),
        module.dir
    );
    let mut child = go()
        .args(["build", "-v", "-ldflags", &module.ldflags, "-o"])
        .arg(format!("{}/", out.display()))
        .args(module.binaries.iter().map(|(_, package)| *package))
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run go")?;
    let stderr = child.stderr.take().expect("piped");
    let mut problems = Vec::new();
    let mut packages = 0_usize;
    for line in BufReader::new(stderr).lines() {
        let line = line?;
        // `-v` names each package as it is built; anything else is a diagnostic.
        if !line.contains(' ') && !line.starts_with('#') {
            packages += 1;
            if packages.is_multiple_of(250) {
                eprintln!(
                    "kube:   {packages} packages of {} built ({:.0} s)",
                    module.dir,
                    started.elapsed().as_secs_f64()
                );
            }
        } else {
            problems.push(line);
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "{}: `go build` failed ({status}):\n{}",
            module.dir,
            problems.join("\n")
        );
    }
    eprintln!(
        "kube: {} built ({packages} packages compiled, {:.0} s)",
        names(module),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes [`KWOK_STAGES`], read from the pinned kwok module's source (downloaded by [`download`]), into
/// one multi-document file at `out`.
fn kwok_stages(out: &Path) -> Result<()> {
    let output = go()
        .args(["list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"])
        .current_dir(repo_root().join("tools/kwok"))
        .output()
        .context("cannot run go")?;
    if !output.status.success() {
        bail!(
            "tools/kwok: `go list -m sigs.k8s.io/kwok` failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let source = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let mut documents = Vec::new();
    for stage in KWOK_STAGES {
        let path = source.join(stage);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading kwok's stage {}", path.display()))?;
        documents.push(format!(
            "# {stage} of sigs.k8s.io/kwok@{KWOK}\n{}",
            text.trim_end()
        ));
    }
    std::fs::write(out, documents.join("\n---\n") + "\n")
        .with_context(|| format!("writing {}", out.display()))
}

/// The binaries' names, for progress lines.
fn names(module: &Module) -> String {
    module
        .binaries
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first line of `<binary> --version`, or of the `version` command of those without the flag.
fn version(binary: &Path) -> Result<String> {
    let name = binary.file_name().unwrap_or_default().to_string_lossy();
    let args: &[&str] = match name.as_ref() {
        "helm" => &["version", "--template", "{{.Version}}"],
        "cosign" => &["version", "--json"],
        "crane" => &["version"],
        _ => &["--version"],
    };
    // helm reads its plugins and repositories from its homes: never the developer's.
    let home = std::env::temp_dir().join("ccm-xtask-helm-home");
    let output = Command::new(binary)
        .args(args)
        .env("HELM_CACHE_HOME", &home)
        .env("HELM_CONFIG_HOME", &home)
        .env("HELM_DATA_HOME", &home)
        .output()
        .with_context(|| format!("running {} {}", binary.display(), args.join(" ")))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if name == "cosign" {
        let json: serde_json::Value = serde_json::from_str(&text).context("cosign version --json")?;
        return Ok(json["gitVersion"].as_str().unwrap_or_default().to_owned());
    }
    Ok(text.lines().next().unwrap_or_default().trim().to_owned())
}

/// Removes the binaries of other keys (older pins): only one build is kept beside Go's cache.
fn forget_other_keys(key: &str) {
    let Ok(entries) = std::fs::read_dir(target_dir().join("kube")) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.len() == key.len() && name != key && name.chars().all(|c| c.is_ascii_hexdigit()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Bytes under `path`.
fn size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    };
    entries
        .filter_map(Result::ok)
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                size(&path)
            } else {
                e.metadata().map_or(0, |m| m.len())
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::{check_pins, releases::RELEASES, requires};

    #[test]
    fn the_go_modules_pin_what_xtask_names() {
        check_pins().unwrap();
        for (release, dir) in RELEASES {
            requires(dir, "k8s.io/kubernetes", release).unwrap();
        }
        let error = requires("tools/kube", "k8s.io/kubernetes", "v1.37.99").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("tools/kube/go.mod: does not require k8s.io/kubernetes v1.37.99"),
            "{error}"
        );
    }
}
