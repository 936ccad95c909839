//! Connections fenced on a call's deadline: no byte leaves or arrives once the lock may have passed on.
//!
//! Dropping a call's future at its deadline is not enough to keep its request from reaching the cloud
//! later. A process frozen (SIGSTOP, a long GC-like pause, an overloaded node) between building a request
//! and writing it wakes past the deadline and writes it before any timer fires; a request queued in the
//! kernel when the network was cut is retransmitted when it heals, after an ordinary close too. A
//! [`FencedStream`] checks the clock on every read and write, fails them all from the deadline on (waking
//! its task at that moment). Open the TCP stream underneath with `SO_LINGER` 0 (tokio's
//! `TcpStream::set_zero_linger`) and own it in the call's future: the framework drops that future at the
//! deadline, the stream is reset rather than closed, and the kernel discards what it had not sent.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::CallContext;

/// A connection that fails every read and write once its call's deadline passed or the call was
/// cancelled. Make one with [`CallContext::fence`], for a connection opened for that call alone.
pub struct FencedStream<S> {
    stream: S,
    cx: CallContext,
    expiry: Pin<Box<Sleep>>,
}

impl<S> FencedStream<S> {
    pub(crate) fn new(stream: S, cx: CallContext) -> FencedStream<S> {
        let expiry = Box::pin(tokio::time::sleep_until(cx.deadline()));
        FencedStream { stream, cx, expiry }
    }

    /// An error once the call is over; until then, a wake-up registered for its deadline.
    fn check(&mut self, task: &mut Context<'_>) -> io::Result<()> {
        if self.cx.cancellation().is_cancelled() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "cloud call cancelled: connection reset",
            ));
        }
        if self.cx.is_over() || !self.cx.rearm(self.expiry.as_mut(), task) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "cloud call past its deadline (the lock may have passed on): connection reset",
            ));
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FencedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        task: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(task)?;
        Pin::new(&mut self.stream).poll_read(task, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FencedStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, task: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.check(task)?;
        Pin::new(&mut self.stream).poll_write(task, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, task: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(task)?;
        Pin::new(&mut self.stream).poll_flush(task)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, task: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(task)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        task: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(task)?;
        Pin::new(&mut self.stream).poll_write_vectored(task, bufs)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fenced_stream_carries_bytes_while_its_lock_is_renewed() {
        use crate::context::tests::TestLock;
        let lock = TestLock::valid_for(Duration::from_secs(2));
        let cx = CallContext::with_timeout(Duration::from_secs(60)).with_lock(lock.clone());
        let (near, mut far) = tokio::io::duplex(64);
        let mut fenced = cx.fence(near);
        // The peer answers after 3 s, past the lock's first validity; a renewal at 1 s covers it.
        let answer = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            lock.renew(Some(Duration::from_secs(5)));
            tokio::time::sleep(Duration::from_secs(2)).await;
            far.write_all(b"ok").await.unwrap();
            far
        };
        let mut seen = [0; 2];
        let (read, mut far) = tokio::join!(fenced.read_exact(&mut seen), answer);
        read.unwrap();
        assert_eq!(&seen, b"ok");
        // Not renewed again: the stream fails when the renewed validity ends, 6 s in.
        let waited = fenced.read(&mut seen).await.unwrap_err();
        assert_eq!(waited.kind(), io::ErrorKind::TimedOut);
        assert!(cx.is_over());
        drop(fenced);
        let mut rest = Vec::new();
        far.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_stream_refuses_every_byte_from_the_deadline_on() {
        let cx = CallContext::with_timeout(Duration::from_secs(5));
        let (near, mut far) = tokio::io::duplex(64);
        let mut fenced = cx.fence(near);
        fenced.write_all(b"before").await.unwrap();
        let mut seen = [0; 6];
        far.read_exact(&mut seen).await.unwrap();
        assert_eq!(&seen, b"before");

        // A reader waiting when the deadline passes is woken with the error.
        let mut buf = [0; 1];
        let waited = fenced.read(&mut buf).await.unwrap_err();
        assert_eq!(waited.kind(), io::ErrorKind::TimedOut);
        assert!(Instant::now() >= cx.deadline());
        let late = fenced.write_all(b"after").await.unwrap_err();
        assert_eq!(late.kind(), io::ErrorKind::TimedOut, "{late}");
        drop(fenced);
        let mut rest = Vec::new();
        far.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "nothing written past the deadline: {rest:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_call_fences_its_stream() {
        let cancel = tokio_util::sync::CancellationToken::new();
        let cx = CallContext::new(Instant::now() + Duration::from_secs(60), cancel.clone(), "me/c");
        let (near, _far) = tokio::io::duplex(64);
        let mut fenced = cx.fence(near);
        cancel.cancel();
        let error = fenced.write_all(b"x").await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionAborted);
    }
}
