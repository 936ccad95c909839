//! moto, a real AWS API emulator, as a process on 127.0.0.1 for tests and the demo: `moto_server` from
//! the Python environment `cargo xtask test` sets up under the target directory.

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

impl Moto {
    /// `moto_server` in `<target dir>/venv`, found from the running test executable
    /// (`<target>/<profile>/deps/…`).
    pub fn installed() -> Option<PathBuf> {
        let exe = std::env::current_exe().ok()?;
        exe.ancestors()
            .map(|dir| dir.join("venv/bin/moto_server"))
            .find(|path| path.is_file())
    }

    /// Starts `server` on a free port and waits (at most 30 s) until it listens.
    pub fn start(server: &Path) -> std::io::Result<Moto> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(server)
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
        let Some(server) = Moto::installed() else {
            #[allow(clippy::print_stderr)]
            {
                eprintln!(
                    "SKIPPED: moto is not installed under the target directory's venv/ (cargo xtask test installs it)"
                );
            }
            return None;
        };
        Some(Moto::start(&server).expect("moto_server starts"))
    }

    /// Its endpoint, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }
}
