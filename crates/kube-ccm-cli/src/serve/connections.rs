//! What a caller can hold of the server: handshake, header, request and write deadlines, the bytes a
//! connection may buffer, and the connections open at once (below the descriptor limit; at the cap the
//! oldest idle one makes room).

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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
    /// From a request's headers to its answer: reading its body and handling it. A caller sending a body
    /// slower than this allows is cut off.
    pub(crate) request: Duration,
    /// How long the server waits for a caller to take the next bytes of an answer: a reader slower than
    /// that is cut off.
    pub(crate) write_stall: Duration,
}

/// The most a connection buffers of a request's head (and of its body between reads): 64 KiB, for
/// headers with a bearer token or a client's certificate chain to spare. Upstream allows 1 MiB of headers;
/// at the cap of 1,024 connections this bounds their buffers at 64 MiB.
pub(crate) const MAX_BUFFER: usize = 64 * 1024;

impl Limits {
    /// The defaults, with the connection cap at most a quarter of `open_files` (the descriptor limit), so
    /// that the API client always has descriptors left.
    pub(crate) fn for_open_files(open_files: u64) -> Limits {
        let quarter = usize::try_from(open_files / 4).unwrap_or(usize::MAX);
        Limits {
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(10),
            max_connections: quarter.clamp(1, 1024),
            // kube-apiserver gives an admission webhook at most 30 s (`timeoutSeconds`).
            request: Duration::from_secs(30),
            write_stall: Duration::from_secs(10),
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
        self.table.open.lock().remove(&self.id);
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

    /// A place for a new connection; at the cap, the oldest connection not serving a request is closed
    /// for it. `None` when every connection is serving one.
    pub(super) fn admit(table: &Arc<Connections>) -> Option<Admitted> {
        let mut open = table.open.lock();
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

/// A stream whose writes fail once the peer has taken none of the waiting bytes for `stall`: a reader
/// that stops reading cannot hold the connection (and the answer's buffers) for ever.
pub(super) struct WriteDeadline<S> {
    inner: S,
    stall: Duration,
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub(super) fn new(inner: S, stall: Duration) -> WriteDeadline<S> {
        WriteDeadline {
            inner,
            stall,
            waiting: None,
        }
    }

    /// `poll`'s result, turned into an error once the writes have been pending for `stall`.
    fn deadline<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if poll.is_ready() {
            self.waiting = None;
            return poll;
        }
        let stall = self.stall;
        let waiting = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match waiting.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the peer took no bytes of the answer in time",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.deadline(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.deadline(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.deadline(cx, poll)
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

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_takes_nothing_is_cut_off_after_the_stall() {
        use tokio::io::AsyncWriteExt;
        // A pipe of 16 bytes nobody reads from: the writes fill it, then wait.
        let (near, _far) = tokio::io::duplex(16);
        let mut stream = WriteDeadline::new(near, Duration::from_secs(10));
        let started = tokio::time::Instant::now();
        let error = stream.write_all(&[0; 64]).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        // A reader that takes the bytes is never cut off.
        let (near, mut far) = tokio::io::duplex(16);
        let mut stream = WriteDeadline::new(near, Duration::from_secs(10));
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut far, &mut all)
                .await
                .map(|_| all.len())
        });
        stream.write_all(&[0; 64]).await.unwrap();
        stream.shutdown().await.unwrap();
        drop(stream);
        assert_eq!(reader.await.unwrap().unwrap(), 64);
    }

    #[test]
    fn the_connection_cap_leaves_descriptors_to_the_client() {
        assert_eq!(Limits::for_open_files(1 << 20).max_connections, 1024);
        assert_eq!(Limits::for_open_files(1024).max_connections, 256);
        assert_eq!(Limits::for_open_files(2).max_connections, 1);
        assert!(raise_open_files_limit() >= 64);
    }
}
