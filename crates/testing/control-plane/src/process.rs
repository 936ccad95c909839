//! The real control plane's processes: spawned to die with their starter, killed on drop, waited on
//! until they answer.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::pki::{Authority, CertifiedKey};

/// How long start-up may take before it is an error.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(90);

/// Why the control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A file of the control plane could not be written.
    #[error("cannot prepare {path}: {source}")]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A certificate could not be made.
    #[error("cannot make the control plane's certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    /// A process could not be started.
    #[error("cannot start {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A process exited or did not become ready in time.
    #[error("{what} did not become ready: {reason}\n--- the end of its log ({log}) ---\n{tail}")]
    NotReady {
        /// `etcd` or `kube-apiserver`.
        what: &'static str,
        /// Exited, or timed out.
        reason: String,
        /// Its log.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
}

/// A running process; killed on drop.
pub(crate) struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    pub(crate) fn spawn(
        name: &'static str,
        binary: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Process, StartError> {
        let file = std::fs::File::create(&log).map_err(|source| StartError::Io {
            path: log.clone(),
            source,
        })?;
        let stderr = file.try_clone().map_err(|source| StartError::Io {
            path: log.clone(),
            source,
        })?;
        let mut command = if setpriv_available() {
            let mut command = Command::new("setpriv");
            command.args(["--pdeathsig", "KILL", "--"]).arg(binary);
            command
        } else {
            Command::new(binary)
        };
        let child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .map_err(|source| StartError::Spawn {
                binary: binary.to_owned(),
                source,
            })?;
        Ok(Process { name, child, log })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub(crate) fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub(crate) fn not_ready(&self, reason: String) -> StartError {
        StartError::NotReady {
            what: self.name,
            reason,
            log: self.log.clone(),
            tail: self.tail(8),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn setpriv_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "true"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

pub(crate) fn free_port() -> Result<u16, StartError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| StartError::Io {
            path: PathBuf::from("127.0.0.1:0"),
            source,
        })
}

pub(crate) fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Polls etcd's `/health` (plain HTTP) until it says `"health":"true"`.
pub(crate) async fn wait_for_etcd(
    etcd: &mut Process,
    port: u16,
    deadline: Instant,
) -> Result<(), StartError> {
    loop {
        if let Some(status) = etcd.exited() {
            return Err(etcd.not_ready(format!("exited with {status}")));
        }
        let healthy = tokio::task::spawn_blocking(move || {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            stream
                .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .ok()?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer).ok()?;
            Some(answer.contains("\"health\":\"true\""))
        })
        .await
        .ok()
        .flatten()
        .unwrap_or(false);
        if healthy {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(etcd.not_ready(format!("/health not ok within {START_TIMEOUT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls kube-apiserver's `/readyz` as the administrator until it answers `ok`.
pub(crate) async fn wait_for_readyz(
    apiserver: &mut Process,
    url: &str,
    ca: &Authority,
    admin: &CertifiedKey,
    deadline: Instant,
) -> Result<(), StartError> {
    let mut config = kube::Config::new(url.parse().expect("a URI"));
    config.root_cert = Some(vec![ca.der()]);
    let engine = base64::engine::general_purpose::STANDARD;
    config.auth_info.client_certificate_data = Some(engine.encode(&admin.cert_pem));
    config.auth_info.client_key_data = Some(engine.encode(&admin.key_pem).into());
    config.read_timeout = Some(Duration::from_secs(5));
    let client = kube::Client::try_from(config).expect("a client for the server's URL");
    let mut last;
    loop {
        if let Some(status) = apiserver.exited() {
            return Err(apiserver.not_ready(format!("exited with {status}")));
        }
        let request = http::Request::get("/readyz").body(Vec::new()).expect("a request");
        match client.request_text(request).await {
            Ok(text) if text.trim() == "ok" => return Ok(()),
            Ok(text) => last = text,
            Err(error) => last = error.to_string(),
        }
        if Instant::now() > deadline {
            return Err(apiserver.not_ready(format!(
                "/readyz not ok within {START_TIMEOUT:?}; last answer: {last}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
