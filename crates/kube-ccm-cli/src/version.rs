//! What this binary says it is: `--version` as upstream's components print it (`Kubernetes v0.1.0`, which
//! tools that read a Kubernetes component's version parse), `--version=raw` with every field, and the
//! labels of `kubernetes_build_info`; the version is the binary's ([`kube_ccm_runtime::Binary`]: a
//! provider's binary gives its own).
//!
//! The commit and build date are those a release build passes in (`RELEASE_GIT_COMMIT`, `RELEASE_BUILD_DATE` at
//! compile time); a plain build leaves them empty, as a plain `go build` of upstream does.

use kube_ccm_runtime::{Binary, BuildInfo};

/// This build.
pub(crate) fn build_info(binary: &Binary) -> BuildInfo {
    let version = binary.version();
    let mut parts = version.split('.');
    let major = parts.next().unwrap_or_default().to_owned();
    let minor = parts.next().unwrap_or_default().to_owned();
    BuildInfo {
        major,
        minor,
        git_version: format!("v{version}"),
        git_commit: option_env!("RELEASE_GIT_COMMIT").unwrap_or_default().to_owned(),
        git_tree_state: option_env!("RELEASE_GIT_TREE_STATE")
            .unwrap_or_default()
            .to_owned(),
        build_date: option_env!("RELEASE_BUILD_DATE").unwrap_or_default().to_owned(),
        go_version: env!("BUILD_RUSTC_VERSION").to_owned(),
        compiler: "rustc".to_owned(),
        platform: format!("{}/{}", go_os(), go_arch()),
    }
}

/// What `--version[=VALUE]` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// `--version` or `--version=true`: print `Kubernetes vX.Y.Z` and exit.
    Print,
    /// `--version=raw`: print every field and exit.
    Raw,
    /// `--version=false`: run.
    Run,
}

/// `--version`'s value, as component-base's flag reads it (a Go boolean, or `raw`). Upstream's third form,
/// `--version=vX.Y.Z` (report another version and run), is refused: this manager does not pretend to be
/// another release.
pub(crate) fn request(value: &str) -> Result<Request, String> {
    match value {
        "raw" => Ok(Request::Raw),
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(Request::Print),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(Request::Run),
        other => Err(format!(
            "--version: {other:?} is not true, false or raw (reporting another version is not supported)"
        )),
    }
}

/// `--version`'s line.
pub(crate) fn line(binary: &Binary) -> String {
    format!("Kubernetes {}", build_info(binary).git_version)
}

/// `--version=raw`: every field, in the shape of Go's `%#v` of upstream's `version.Info`.
pub(crate) fn raw(binary: &Binary) -> String {
    let info = build_info(binary);
    format!(
        "version.Info{{Major:{:?}, Minor:{:?}, GitVersion:{:?}, GitCommit:{:?}, GitTreeState:{:?}, BuildDate:{:?}, GoVersion:{:?}, Compiler:{:?}, Platform:{:?}}}",
        info.major,
        info.minor,
        info.git_version,
        info.git_commit,
        info.git_tree_state,
        info.build_date,
        info.go_version,
        info.compiler,
        info.platform
    )
}

/// Go's name for this operating system.
fn go_os() -> &'static str {
    std::env::consts::OS
}

/// Go's name for this architecture (`amd64`, `arm64`, …).
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_is_what_kubernetes_tools_parse() {
        let ours = Binary::default();
        assert_eq!(line(&ours), format!("Kubernetes v{}", env!("CARGO_PKG_VERSION")));
        assert!(
            raw(&ours).starts_with("version.Info{Major:\"0\", Minor:\"1\", GitVersion:\"v0.1.0\""),
            "{}",
            raw(&ours)
        );
        assert!(
            build_info(&ours).go_version.starts_with("rustc "),
            "{:?}",
            build_info(&ours)
        );
        let mut registry = kube_ccm_runtime::Registry::new();
        registry
            .set_binary("acme-cloud-controller-manager", "v2.7.1")
            .unwrap();
        assert_eq!(line(registry.binary()), "Kubernetes v2.7.1");
        assert!(
            raw(registry.binary())
                .starts_with("version.Info{Major:\"2\", Minor:\"7\", GitVersion:\"v2.7.1\"")
        );
        for (value, expected) in [
            ("", Err(())),
            ("true", Ok(Request::Print)),
            ("raw", Ok(Request::Raw)),
            ("false", Ok(Request::Run)),
            ("v1.2.3", Err(())),
        ] {
            assert_eq!(request(value).map_err(|_| ()), expected, "{value:?}");
        }
    }
}
