//! moto, a real AWS API emulator, as a process on 127.0.0.1 for tests and the demo: `moto_server` from
//! the Python environment `cargo xtask test` (or `demo --cloud aws`, on first use) sets up under the
//! target directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A moto server on a free port; killed on drop.
#[derive(Debug)]
pub struct Moto {
    child: Child,
    url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pip requirement moto is installed with, pinned (`cargo xtask test` installs the same).
pub const MOTO_REQUIREMENT: &str = include_str!("../moto-requirement.txt").trim_ascii();

impl Moto {
    /// `moto_server` in `<target dir>/venv`, found from the running executable (`<target>/<profile>/…`,
    /// or `<target>/<profile>/deps/…` for a test), or in [`Moto::venv`].
    pub fn installed() -> Option<PathBuf> {
        let exe = std::env::current_exe().ok()?;
        exe.ancestors()
            .map(|dir| dir.join("venv"))
            .chain(Moto::venv())
            .map(|venv| venv.join("bin/moto_server"))
            .find(|path| path.is_file())
    }

    /// Where moto is installed when it is not yet: `<target dir>/venv` when this executable runs from a
    /// cargo target directory (marked by cargo's `CACHEDIR.TAG`), else
    /// `$XDG_CACHE_HOME/cloud-controller-manager/venv` (`~/.cache/…`).
    pub fn venv() -> Option<PathBuf> {
        let exe = std::env::current_exe().ok()?;
        if let Some(target) = exe.ancestors().find(|dir| dir.join("CACHEDIR.TAG").is_file()) {
            return Some(target.join("venv"));
        }
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
        Some(cache.join("cloud-controller-manager/venv"))
    }

    /// Starts `server` (its virtual environment's Python, with `moto_server.py`: moto's check of a SigV4
    /// signature hashes the body as sent, so that requests signed by the AWS SDK for Rust pass it when
    /// IAM is enforced) on a free port and waits (at most 30 s) until it listens.
    pub fn start(server: &Path) -> std::io::Result<Moto> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        // moto_server's own Python, with moto's SigV4 check mended (`moto_server.py`).
        let child = Command::new(server.with_file_name("python"))
            .arg("-c")
            .arg(include_str!("moto_server.py"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut moto = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = moto.child.try_wait()? {
                return Err(std::io::Error::other(format!("moto_server exited: {status}")));
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!(
                    "moto_server did not listen on {port} within 30 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(moto)
    }

    /// For tests: the installed server started, or `None` after saying loudly that the test is skipped.
    pub fn for_test() -> Option<Moto> {
        let server = Moto::installed_for_test()?;
        Some(Moto::start(&server).expect("moto_server starts"))
    }

    /// For tests: the installed server, or `None` after saying loudly that the test is skipped (a test
    /// never installs moto; with `CI` set a missing moto fails the test).
    pub fn installed_for_test() -> Option<PathBuf> {
        let server = Moto::installed();
        if server.is_none() {
            crate::skip_unless_ci(
                "a test against moto",
                "moto is not installed under the target directory's venv/ (cargo xtask test installs it)",
            );
        }
        server
    }

    /// Its endpoint, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }
}
