//! What a caller can hold of the server: handshake and header deadlines, and the connections open at once
//! (below the descriptor limit; at the cap the oldest idle one makes room).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// What a caller can hold of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// From accepting a connection to the end of its TLS handshake.
    pub(crate) handshake: Duration,
    /// For a request's headers, from when the connection is ready for one (a kept-alive connection is
    /// closed after this long without a next request).
    pub(crate) header_read: Duration,
    /// Connections open at once.
    pub(crate) max_connections: usize,
}

impl Limits {
    /// The defaults, with the connection cap at most a quarter of `open_files` (the descriptor limit), so
    /// that the API client always has descriptors left.
    pub(crate) fn for_open_files(open_files: u64) -> Limits {
        let quarter = usize::try_from(open_files / 4).unwrap_or(usize::MAX);
        Limits {
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(10),
            max_connections: quarter.clamp(1, 1024),
        }
    }
}

/// Raises the soft limit on open files to the hard limit, as Go's runtime does at start (so upstream's
/// managers run with it too); returns the soft limit in force.
pub(crate) fn raise_open_files_limit() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let Some(current) = limit.current else {
        return u64::MAX;
    };
    if limit.maximum.is_none_or(|maximum| maximum > current) {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum.unwrap_or(u64::MAX);
        }
    }
    current
}

/// The open connections, oldest first.
pub(super) struct Connections {
    limit: usize,
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    next: AtomicU64,
}

pub(super) struct Connection {
    pub(super) close: CancellationToken,
    /// Serving a request (not evicted to make room).
    pub(super) busy: AtomicBool,
}

/// A connection's place in the table, given up when its task ends.
pub(super) struct Admitted {
    id: u64,
    pub(super) connection: Arc<Connection>,
    table: Arc<Connections>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.table.lock().remove(&self.id);
    }
}

impl Connections {
    /// An empty table of at most `limit` connections (at least one).
    pub(super) fn new(limit: usize) -> Arc<Connections> {
        Arc::new(Connections {
            limit: limit.max(1),
            open: Mutex::default(),
            next: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Connection>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a new connection; at the cap, the oldest connection not serving a request is closed
    /// for it. `None` when every connection is serving one.
    pub(super) fn admit(table: &Arc<Connections>) -> Option<Admitted> {
        let mut open = table.lock();
        if open.len() >= table.limit {
            let oldest_idle = open
                .iter()
                .find(|(_, c)| !c.busy.load(Ordering::Relaxed))
                .map(|(id, _)| *id)?;
            if let Some(evicted) = open.remove(&oldest_idle) {
                evicted.close.cancel();
            }
        }
        let id = table.next.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection {
            close: CancellationToken::new(),
            busy: AtomicBool::new(false),
        });
        open.insert(id, connection.clone());
        Some(Admitted {
            id,
            connection,
            table: table.clone(),
        })
    }
}

/// Go's `net/http` back-off between failed accepts: 5 ms, doubling, at most 1 s.
pub(super) fn accept_backoff(previous: Duration) -> Duration {
    (previous * 2).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_backoff_is_gos() {
        let mut delay = Duration::ZERO;
        let mut seen = Vec::new();
        for _ in 0..10 {
            delay = accept_backoff(delay);
            seen.push(delay.as_millis());
        }
        assert_eq!(seen, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
    }

    #[test]
    fn the_connection_cap_leaves_descriptors_to_the_client() {
        assert_eq!(Limits::for_open_files(1 << 20).max_connections, 1024);
        assert_eq!(Limits::for_open_files(1024).max_connections, 256);
        assert_eq!(Limits::for_open_files(2).max_connections, 1);
        assert!(raise_open_files_limit() >= 64);
    }
}
