//! Where the real components are: `cargo xtask kube` builds them and writes `<target>/kube/kube.json`,
//! found here from the running executable (`<target>/<profile>/…`, or `…/deps/…` for a test) or from
//! `KUBE_TOOLS_MANIFEST`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The real components, as `cargo xtask kube` built them.
#[derive(Debug, Clone)]
pub struct KubeBinaries {
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `go-cloud-controller-manager`: upstream's cloud-controller-manager (`k8s.io/cloud-provider`'s app
    /// package, same release) with a `fake` provider acting on this repository's fake cloud over HTTP.
    pub go_cloud_controller_manager: PathBuf,
    /// `aws-cloud-controller-manager`: upstream's AWS cloud-controller-manager, `k8s.io/cloud-provider-aws`'s
    /// own main package at [`cloud_provider_aws_version`](Self::cloud_provider_aws_version).
    pub aws_cloud_controller_manager: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
    /// `kwok`: simulated kubelets (node status and node Leases) from `sigs.k8s.io/kwok`'s own main package.
    pub kwok: PathBuf,
    /// `helm`: `helm.sh/helm/v3`'s own main package, built assuming the pinned Kubernetes release.
    pub helm: PathBuf,
    /// kwok's node stages (initialise, then heartbeat beside a Lease) from its module, to pass with
    /// `--config`: the binary has none built in.
    pub kwok_stages: PathBuf,
    /// The Kubernetes release (`v1.37.2`).
    pub kubernetes_version: String,
    /// The etcd release.
    pub etcd_version: String,
    /// The `k8s.io/cloud-provider-aws` release.
    pub cloud_provider_aws_version: String,
    /// The `sigs.k8s.io/kwok` release.
    pub kwok_version: String,
    /// The `helm.sh/helm/v3` release.
    pub helm_version: String,
}

/// Why the real components are not available.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// No Go: they cannot be built on this machine.
    #[error("go is not on PATH, so the real kube-apiserver and etcd cannot be built here")]
    NoGo,
    /// Go is here but they were not built.
    #[error(
        "the real kube-apiserver is not built ({0} is missing): run `cargo xtask kube` (`cargo xtask test` does)"
    )]
    NotBuilt(PathBuf),
    /// The manifest is unreadable or names a missing binary.
    #[error("{path}: {reason}")]
    Broken {
        /// The manifest.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Deserialize)]
struct Manifest {
    kubernetes: String,
    etcd: String,
    cloud_provider_aws: String,
    kwok: String,
    helm: String,
    kwok_stages: PathBuf,
    binaries: std::collections::BTreeMap<String, Binary>,
}

#[derive(Deserialize)]
struct Binary {
    path: PathBuf,
}

impl KubeBinaries {
    /// The built components, or why there are none.
    pub fn find() -> Result<KubeBinaries, Unavailable> {
        let manifest = manifest_path();
        let Some(path) = manifest.filter(|p| p.is_file()) else {
            let go = std::process::Command::new("go")
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success());
            if !go {
                return Err(Unavailable::NoGo);
            }
            return Err(Unavailable::NotBuilt(
                manifest_path().unwrap_or_else(|| PathBuf::from("<target>/kube/kube.json")),
            ));
        };
        let broken = |reason: String| Unavailable::Broken {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| broken(e.to_string()))?;
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| broken(e.to_string()))?;
        let binary = |name: &str| -> Result<PathBuf, Unavailable> {
            let path = manifest
                .binaries
                .get(name)
                .map(|b| b.path.clone())
                .ok_or_else(|| broken(format!("names no {name}")))?;
            if path.is_file() {
                Ok(path)
            } else {
                Err(broken(format!(
                    "{} is missing: run `cargo xtask kube`",
                    path.display()
                )))
            }
        };
        if !manifest.kwok_stages.is_file() {
            return Err(broken(format!(
                "{} is missing: run `cargo xtask kube`",
                manifest.kwok_stages.display()
            )));
        }
        Ok(KubeBinaries {
            kube_apiserver: binary("kube-apiserver")?,
            kube_controller_manager: binary("kube-controller-manager")?,
            go_cloud_controller_manager: binary("go-cloud-controller-manager")?,
            aws_cloud_controller_manager: binary("aws-cloud-controller-manager")?,
            etcd: binary("etcd")?,
            kwok: binary("kwok")?,
            helm: binary("helm")?,
            kwok_stages: manifest.kwok_stages,
            kubernetes_version: manifest.kubernetes,
            etcd_version: manifest.etcd,
            cloud_provider_aws_version: manifest.cloud_provider_aws,
            kwok_version: manifest.kwok,
            helm_version: manifest.helm,
        })
    }

    /// For a test: the components, or `None` after saying loudly that `test` is skipped because this
    /// machine has no Go. Anything else missing (not built, a broken manifest) fails the test, and so
    /// does a missing Go under CI (`CI` set), where the real API server is required.
    pub fn for_test(test: &str) -> Option<KubeBinaries> {
        match KubeBinaries::find() {
            Ok(binaries) => Some(binaries),
            Err(Unavailable::NoGo) if std::env::var_os("CI").is_none() => {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!(
                        "SKIPPED: {test} on the real kube-apiserver: go is not on PATH, so kube-apiserver and etcd \
                         cannot be built here (install Go 1.26 or later and run `cargo xtask kube`)"
                    );
                }
                None
            }
            Err(why) => panic!("{test} on the real kube-apiserver: {why}"),
        }
    }
}

/// `KUBE_TOOLS_MANIFEST`, else `<target>/kube/kube.json` of the cargo target directory this executable
/// runs from (marked by cargo's `CACHEDIR.TAG`). Not a `CCM_…` name: the manager reads each of those as a
/// setting, and the managers the tests start inherit the environment.
fn manifest_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("KUBE_TOOLS_MANIFEST") {
        return Some(PathBuf::from(path));
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(|target| target.join("kube/kube.json"))
        .or_else(|| target_from_env().map(|t| t.join("kube/kube.json")))
}

fn target_from_env() -> Option<PathBuf> {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .filter(|p| Path::new(p).is_dir())
}
