//! Starting the project's binaries for a benchmark.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

/// A binary built next to this one (`cargo xtask bench` builds them together).
pub(crate) fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .context("the benchmark binary has a directory")?
        .join(name);
    if !path.exists() {
        bail!(
            "{} is missing: run the benchmark through `cargo xtask bench`, which builds it",
            path.display()
        );
    }
    Ok(path)
}

/// The `cloud-controller-manager` under test: `BENCH_MANAGER_BINARY` (`cargo xtask bench` sets it to the
/// `dist` build, what ships), else the one next to this binary.
pub(crate) fn manager_binary() -> Result<PathBuf> {
    match std::env::var_os("BENCH_MANAGER_BINARY") {
        Some(path) => {
            let path = PathBuf::from(path);
            if !path.is_file() {
                bail!("BENCH_MANAGER_BINARY: {} is not a file", path.display());
            }
            Ok(path)
        }
        None => sibling("cloud-controller-manager"),
    }
}

/// A running test API server process; killed on drop.
pub(crate) struct ApiServer {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) kubeconfig: PathBuf,
    _directory: TempDir,
}

impl ApiServer {
    pub(crate) fn start(extra: &[&str]) -> Result<ApiServer> {
        ApiServer::start_on("127.0.0.1:0", extra)
    }

    /// As [`ApiServer::start`], listening on `listen` (`0.0.0.0:0` to be reachable from other network
    /// namespaces).
    pub(crate) fn start_on(listen: &str, extra: &[&str]) -> Result<ApiServer> {
        let directory = TempDir::new()?;
        let kubeconfig = directory.0.join("kubeconfig");
        let mut child = Command::new(sibling("test-apiserver")?)
            .args(["--admin", "--listen", listen, "--kubeconfig-out"])
            .arg(&kubeconfig)
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .context("start test-apiserver")?;
        let mut first = String::new();
        BufReader::new(child.stdout.take().context("piped stdout")?).read_line(&mut first)?;
        let url = first
            .trim()
            .strip_prefix("listening on ")
            .context("test-apiserver's first line")?
            .to_owned();
        Ok(ApiServer {
            child,
            url,
            kubeconfig,
            _directory: directory,
        })
    }

    /// A client as the administrator.
    pub(crate) async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await?;
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static("ccm-bench/0 (workload)"),
        ));
        Ok(kube::Client::try_from(config)?)
    }

    /// Resident memory of the server process, in MiB.
    pub(crate) fn rss_mib(&self) -> Option<f64> {
        rss_mib(self.child.id())
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident memory of a process, in MiB, from /proc.
pub(crate) fn rss_mib(pid: u32) -> Option<f64> {
    harness::proc_status_mib(pid, "VmRSS:")
}

/// Of a process's resident memory, what is its own (heap, stacks: `RssAnon`) and what maps files
/// (its code and read-only data, shared with the page cache: `RssFile`), in MiB, from /proc.
pub(crate) fn rss_split_mib(pid: u32) -> Option<(f64, f64)> {
    Some((
        harness::proc_status_mib(pid, "RssAnon:")?,
        harness::proc_status_mib(pid, "RssFile:")?,
    ))
}

/// Peak resident memory of a process, in MiB, from /proc.
pub(crate) fn peak_rss_mib(pid: u32) -> Option<f64> {
    harness::proc_status_mib(pid, "VmHWM:")
}

/// CPU time a process has used so far (user and system), in seconds, from /proc (ticks of 1/100 s,
/// Linux's USER_HZ).
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's `(name)`: state is field 3, utime 14 and stime 15.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index - 3)?.parse::<f64>().ok();
    Some((ticks(14)? + ticks(15)?) / 100.0)
}

/// A temporary directory removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new() -> Result<TempDir> {
        let path = std::env::temp_dir().join(format!("ccm-bench-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }

    /// Keeps the directory (for a failed run's logs) and returns its path.
    pub(crate) fn keep(self) -> PathBuf {
        let path = self.0.clone();
        std::mem::forget(self);
        path
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
