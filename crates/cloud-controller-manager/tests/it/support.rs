//! Helpers shared by the integration tests of the binaries (`cloud-controller-manager`'s here, `ccm-demo`'s
//! through `#[path]`); each test crate's root says which binary is under test (`binary()`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Runs `scenario` with the real components `cargo xtask kube` built, on a multi-threaded runtime; skips
/// (loudly, where Go is absent) as [`control_plane::KubeBinaries::for_test`] says.
pub(crate) fn with_kube_binaries<F: std::future::Future<Output = ()>>(
    test: &str,
    scenario: impl FnOnce(control_plane::KubeBinaries) -> F,
) {
    let Some(binaries) = control_plane::KubeBinaries::for_test(test) else {
        return;
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(scenario(binaries));
}

pub(crate) use crate::binary;

/// The repository root, for shipped examples.
pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// Runs the binary with `args` from the repository root.
pub(crate) fn run(args: &[&str]) -> Output {
    binary()
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("run cloud-controller-manager")
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `curl` over HTTPS to `localhost` at `address`, trusting `ca` (or, without one, any certificate):
/// (status, body); `None` when no HTTP answer came (a refused handshake).
pub(crate) fn curl(
    address: SocketAddr,
    ca: Option<&Path>,
    path: &str,
    extra: &[&str],
) -> Option<(u16, String)> {
    curl_answer(address, ca, path, extra).ok()
}

/// As [`curl`], with why no HTTP answer came: curl's exit code and what it printed.
pub(crate) fn curl_answer(
    address: SocketAddr,
    ca: Option<&Path>,
    path: &str,
    extra: &[&str],
) -> Result<(u16, String), (Option<i32>, String)> {
    let output = std::process::Command::new("curl")
        .args([
            "--silent",
            "--show-error",
            "--max-time",
            "20",
            "--write-out",
            "\n%{http_code}",
        ])
        .args(match ca {
            Some(ca) => vec!["--cacert".to_owned(), ca.display().to_string()],
            // A self-signed certificate made in memory.
            None => vec!["--insecure".to_owned()],
        })
        .arg("--resolve")
        .arg(format!("localhost:{}:127.0.0.1", address.port()))
        .args(extra)
        .arg(format!("https://localhost:{}{path}", address.port()))
        .output()
        .expect("curl runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        return Err((output.status.code(), stderr));
    }
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text
        .rsplit_once('\n')
        .ok_or_else(|| (output.status.code(), stderr.clone()))?;
    let code = code.trim().parse().map_err(|_| (output.status.code(), stderr))?;
    Ok((code, body.to_owned()))
}

/// A port nothing listens on now, for a manager to bind.
///
/// Not the kernel's pick (`:0`): that port is free again the moment it is released, so two tests running at
/// once (nextest runs each in its own process) can be handed the same one before either manager binds it.
/// Each process takes ports from its own block below the ephemeral range, by its process id.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    const BLOCK: u16 = 10;
    let block = u16::try_from(std::process::id() % 2_000).unwrap_or(0);
    let base = 10_000 + block * BLOCK;
    for _ in 0..BLOCK {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % BLOCK;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {base}..{}", base + BLOCK);
}

/// A tenure rectangle of an SVG report: lease, holder, component, start and end (µs since the chart's
/// start; `None`: still held).
pub(crate) type SvgTenure = (String, String, String, i64, Option<i64>);

/// The tenure rectangles of an SVG report (`demo --report`, `status --report`).
pub(crate) fn svg_tenures(svg: &roxmltree::Document<'_>) -> Vec<SvgTenure> {
    svg.descendants()
        .filter(|n| n.attribute("class") == Some("tenure"))
        .map(|n| {
            let attribute = |name: &str| {
                n.attribute(name)
                    .unwrap_or_else(|| panic!("{name} missing"))
                    .to_owned()
            };
            (
                attribute("data-lease"),
                attribute("data-holder"),
                attribute("data-component"),
                attribute("data-start-us").parse().unwrap(),
                attribute("data-end-us").parse().ok(),
            )
        })
        .collect()
}
