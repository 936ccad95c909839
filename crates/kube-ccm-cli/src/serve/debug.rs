//! Debugging a running process without restarting it (a restart would hand its Leases over), behind the
//! same authentication and authorisation as `/metrics`, as upstream's managers serve them:
//!
//! - `/configz`: the effective configuration, as JSON under `cloudcontrollermanager.config.k8s.io`
//!   (here: every setting by its flag's name).
//! - With `--profiling` (default on): `/debug/pprof/` (an index), `/debug/pprof/profile?seconds=N` (a CPU
//!   profile of N seconds, 30 by default, at most 300, in the pprof format `go tool pprof` reads; one at
//!   a time, as Go's), and `PUT /debug/flags/v` (the log verbosity, as `-v`, from the body). There is no
//!   heap profile: glibc's allocator, which the manager runs on (see `MALLOC_ARENA_MAX` in `app.rs`), keeps
//!   no allocation samples, and a profiling allocator would cost every allocation.

use std::sync::Arc;
use std::time::Duration;

use super::pprof;

/// Sets the log verbosity (`-v`); why not, when it cannot.
pub(crate) type SetVerbosity = Arc<dyn Fn(u8) -> Result<(), String> + Send + Sync>;

/// What the debugging endpoints serve.
#[derive(Clone)]
pub(crate) struct Debug {
    /// `--profiling`: `/debug/pprof/` and `/debug/flags/v` are served.
    pub(crate) profiling: bool,
    /// `/configz`'s body.
    pub(crate) configz: Arc<str>,
    /// `/debug/flags/v`.
    pub(crate) set_verbosity: SetVerbosity,
}

/// An answer: status, content type, body.
pub(crate) type Answer = (u16, &'static str, Vec<u8>);

const TEXT: &str = "text/plain; charset=utf-8";

impl Debug {
    /// The answer for `path` (without its leading `/`), or `None` when it is not a debugging endpoint
    /// (or profiling is off).
    pub(crate) async fn answer(
        &self,
        method: &http::Method,
        path: &str,
        query: &str,
        body: &[u8],
    ) -> Option<Answer> {
        if path == "configz" {
            return Some(match *method {
                http::Method::GET | http::Method::HEAD => {
                    (200, "application/json", self.configz.as_bytes().to_vec())
                }
                _ => not_allowed(),
            });
        }
        if !self.profiling {
            return None;
        }
        match path {
            "debug/pprof" => Some((200, TEXT, INDEX.as_bytes().to_vec())),
            "debug/pprof/profile" => Some(profile(query).await),
            "debug/flags/v" => Some(if *method == http::Method::PUT {
                self.verbosity(body)
            } else {
                not_allowed()
            }),
            _ => None,
        }
    }

    fn verbosity(&self, body: &[u8]) -> Answer {
        let text = String::from_utf8_lossy(body);
        let Ok(level) = text.trim().parse::<u8>() else {
            return (
                400,
                TEXT,
                format!(
                    "error: invalid verbosity {:?}: a number from 0 to 255\n",
                    text.trim()
                )
                .into_bytes(),
            );
        };
        match (self.set_verbosity)(level) {
            Ok(()) => {
                tracing::info!(v = level, "log verbosity changed through /debug/flags/v");
                (
                    200,
                    TEXT,
                    format!("successfully set klog.logging.verbosity to {level}\n").into_bytes(),
                )
            }
            Err(why) => (500, TEXT, format!("error: {why}\n").into_bytes()),
        }
    }
}

const INDEX: &str = "/debug/pprof/\n\nprofile: CPU profile (?seconds=N, default 30, at most 300), for go tool pprof\n\n\
no heap profile: the manager runs on glibc's allocator, which keeps no allocation samples\n";

fn not_allowed() -> Answer {
    (405, TEXT, b"method not allowed\n".to_vec())
}

/// `?seconds=N` (30 when absent, as Go's handler).
fn seconds(query: &str) -> Result<u64, String> {
    match query.split('&').find_map(|p| p.strip_prefix("seconds=")) {
        None => Ok(30),
        Some(text) => match text.parse::<u64>() {
            Ok(n) if (1..=pprof::MAX_SECONDS).contains(&n) => Ok(n),
            _ => Err(format!(
                "seconds: {text:?} is not a whole number of seconds from 1 to {}",
                pprof::MAX_SECONDS
            )),
        },
    }
}

async fn profile(query: &str) -> Answer {
    let seconds = match seconds(query) {
        Ok(seconds) => seconds,
        Err(why) => return (400, TEXT, format!("{why}\n").into_bytes()),
    };
    let taken = tokio::task::spawn_blocking(move || pprof::cpu_profile(Duration::from_secs(seconds))).await;
    match taken {
        Ok(Ok(bytes)) => (200, "application/octet-stream", bytes),
        Ok(Err(error)) => (500, TEXT, format!("{error}\n").into_bytes()),
        Err(error) => (500, TEXT, format!("cpu profiling failed: {error}\n").into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn debug(profiling: bool) -> Debug {
        Debug {
            profiling,
            configz: r#"{"cloudcontrollermanager.config.k8s.io":{}}"#.into(),
            set_verbosity: Arc::new(|level| if level < 100 { Ok(()) } else { Err("no".into()) }),
        }
    }

    #[test]
    fn seconds_default_to_30_and_are_bounded() {
        assert_eq!(seconds(""), Ok(30));
        assert_eq!(seconds("seconds=5"), Ok(5));
        assert!(seconds("seconds=0").is_err());
        assert!(seconds("seconds=301").is_err());
        assert!(seconds("seconds=x").is_err());
    }

    #[tokio::test]
    async fn the_verbosity_is_set_by_put_only_and_profiling_off_serves_none_of_it() {
        let on = debug(true);
        let answer = |method, body: &'static [u8]| {
            let on = on.clone();
            async move { on.answer(&method, "debug/flags/v", "", body).await.unwrap() }
        };
        let (status, _, body) = answer(http::Method::PUT, b"4\n").await;
        assert_eq!(
            (status, body.as_slice()),
            (200, &b"successfully set klog.logging.verbosity to 4\n"[..])
        );
        assert_eq!(answer(http::Method::PUT, b"four").await.0, 400);
        assert_eq!(answer(http::Method::PUT, b"200").await.0, 500);
        assert_eq!(answer(http::Method::GET, b"").await.0, 405);
        let off = debug(false);
        for path in ["debug/flags/v", "debug/pprof", "debug/pprof/profile"] {
            assert!(
                off.answer(&http::Method::GET, path, "", b"").await.is_none(),
                "{path}"
            );
        }
        let (status, kind, _) = off.answer(&http::Method::GET, "configz", "", b"").await.unwrap();
        assert_eq!(
            (status, kind),
            (200, "application/json"),
            "/configz does not need --profiling"
        );
    }
}
