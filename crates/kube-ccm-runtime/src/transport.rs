//! The HTTP stack under every client: what kube's `ClientBuilder::try_from` builds (base URI,
//! authentication, extra headers, an `HTTP` span per request, hyper over rustls with connect and write
//! timeouts), built here for the one thing kube's cannot do: fence the connections of a client under a lock.
//!
//! A write handed to the kernel before its lock's `valid_until` may still sit in the socket's send queue
//! when that moment passes: during a network partition the queue does not drain. Abandoning the request
//! is not enough. hyper keeps the connection (and the queue) while it waits to write, and an ordinary close
//! goes on sending the queue after the close, after the process exits too, so the write would reach the
//! API server once the partition heals, long after another process took the lock. So a fenced client's
//! connection carries bytes only while the lock is valid: at `valid_until` its next read or write fails,
//! hyper drops it, and as it was opened with `SO_LINGER` 0 the kernel resets it and discards what it had
//! not sent.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::client::{Body, ConfigExt, DynBody};
use kube_ccm_leadermigration::elector::{LeaderState, Role};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::util::BoxService;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

/// The tracing target of the `HTTP` span each request gets (a debug span; traces let it through).
pub const HTTP_SPAN_TARGET: &str = "kube_ccm_runtime::http";

/// Idle connections kept per API server. kube's connector speaks HTTP/1.1 only, so a burst of concurrent
/// syncs opens a connection per request in flight (130–170 at the default concurrency). The cap was
/// client-go's (25, `idleConnsPerHost` in `transport/cache.go`, which with HTTP/2 rarely matters) until
/// `bench nodes --apiserver kube` counted ≈ 9,000 new TCP and TLS connections in a 10k-node burst: every
/// request past the 25th opened one and closed it. Now the pool keeps what the default concurrency
/// uses; the idle timeout (90 s) closes them after a burst.
const IDLE_CONNECTIONS_PER_HOST: usize = 160;

/// A client's stack below the framework's own layers.
pub(crate) type Transport = BoxService<http::Request<Body>, http::Response<Box<DynBody>>, BoxError>;

/// A lock's state, for fencing a client's writes and connections; with a stop signal, the controllers
/// under the lock are stopping once it fires, and their requests not yet sent never are. The fence counts
/// the writes of its clients that were sent and not yet answered, so that the lock is released only after
/// the last of them ([`Fence::settled`]).
#[derive(Clone, Debug)]
pub struct Fence {
    state: watch::Receiver<LeaderState>,
    stopping: Option<CancellationToken>,
    writes: Arc<WritesInFlight>,
    /// Fired by [`Fence::settled`]: from then on nothing acts under the lock, and every connection of
    /// the fence's clients is reset (so nothing still queued in one reaches the server after the release).
    released: CancellationToken,
}

/// The writes of a fence's clients that are on their way.
#[derive(Debug, Default)]
struct WritesInFlight {
    count: AtomicUsize,
    none: tokio::sync::Notify,
}

/// One write on its way; it is answered (or abandoned) when this is dropped.
#[derive(Debug)]
pub(crate) struct WriteInFlight(Arc<WritesInFlight>);

impl Drop for WriteInFlight {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.none.notify_waiters();
        }
    }
}

impl Fence {
    /// The fence of the lock whose elector publishes `state`.
    pub fn new(state: watch::Receiver<LeaderState>) -> Fence {
        Fence {
            state,
            stopping: None,
            writes: Arc::default(),
            released: CancellationToken::new(),
        }
    }

    /// With `stop`: once it fires, a request of this fence's clients that has not been sent is refused,
    /// and one waiting for the client's rate limiter stops waiting (so that a graceful stop ends within
    /// its grace and the lock can be released).
    pub fn stopping_with(mut self, stop: CancellationToken) -> Fence {
        self.stopping = Some(stop);
        self
    }

    /// Until when this process may act under the lock (`None`: it does not lead).
    pub fn valid_until(&self) -> Option<Instant> {
        if self.released.is_cancelled() {
            return None;
        }
        let state = self.state.borrow();
        (state.role == Role::Leading)
            .then_some(state.valid_until)
            .flatten()
    }

    pub(crate) fn lease(&self) -> String {
        self.state.borrow().lease.clone()
    }

    pub(crate) fn stop_signal(&self) -> Option<&CancellationToken> {
        self.stopping.as_ref()
    }

    /// Counts a write from now until the returned value is dropped. Taken before the write is checked
    /// against the stop signal, so that [`Fence::settled`], which looks after the signal fired, sees
    /// every write that got past that check.
    pub(crate) fn write_in_flight(&self) -> WriteInFlight {
        self.writes.count.fetch_add(1, Ordering::SeqCst);
        WriteInFlight(self.writes.clone())
    }

    /// The writes of this fence's clients that are on their way.
    pub fn writes_in_flight(&self) -> usize {
        self.writes.count.load(Ordering::SeqCst)
    }

    /// Waits until no write of this fence's clients is on its way, or until the lock is no longer valid
    /// (from then on their connections carry nothing: see the module's notes), then ends the fence: the
    /// lock counts as not held for its clients and calls, and their connections are reset, so that a write
    /// abandoned earlier (its caller gave up; its bytes may still sit in a socket's queue) is discarded.
    /// Called once the controllers under the lock stopped, before the lock is released: a write a
    /// background task sent just before the stop (an Event) must reach the API server while the lock is
    /// still held, not after another process took it.
    pub async fn settled(&self) {
        let mut state = self.state.clone();
        loop {
            let none = self.writes.none.notified();
            tokio::pin!(none);
            none.as_mut().enable();
            if self.writes_in_flight() == 0 {
                break;
            }
            let Some(until) = self.valid_until() else {
                break;
            };
            tokio::select! {
                () = none => {}
                () = tokio::time::sleep_until(until) => break,
                // A renewal moves the validity on.
                changed = state.changed() => if changed.is_err() { break },
            }
        }
        self.released.cancel();
    }
}

/// A cloud call made under this lock ends when the lock's validity does, as it stands at each check.
impl kube_ccm_provider::LockValidity for Fence {
    fn valid_until(&self) -> Option<Instant> {
        Fence::valid_until(self)
    }
}

/// Where a transport's bearer token comes from, read afresh for every request so that a renewed token
/// needs no new client.
pub(crate) trait TokenSource: Send + Sync {
    /// The token to send now.
    fn current(&self) -> Arc<str>;
}

/// The stack for `config`; with a fence, its connections carry bytes only while the fence's lock is valid.
/// With `token`, every request carries that service account's current token (and `config` none of its
/// own credentials).
pub(crate) fn transport(
    config: &kube::Config,
    fence: Option<Fence>,
    token: Option<Arc<dyn TokenSource>>,
) -> Result<Transport, kube::Error> {
    if let Some(proxy) = &config.proxy_url {
        return Err(kube::Error::ProxyProtocolUnsupported {
            proxy_url: Box::new(proxy.clone()),
        });
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let tls = config.rustls_https_connector_with_connector(TcpConnector { http, fence })?;
    let mut connector = hyper_timeout::TimeoutConnector::new(tls);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_CONNECTIONS_PER_HOST)
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .option_layer(token.map(|token| {
            tower::util::MapRequestLayer::new(move |mut request: http::Request<Body>| {
                if let Ok(value) = http::HeaderValue::from_str(&format!("Bearer {}", token.current())) {
                    request.headers_mut().insert(http::header::AUTHORIZATION, value);
                }
                request
            })
        }))
        .layer(config.extra_headers_layer()?)
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(http_span)
                .on_response(record_status)
                .on_body_chunk(())
                .on_eos(())
                .on_failure(()),
        )
        .map_err(BoxError::from)
        .service(hyper)
        .map_response(|response| {
            response
                .map(|body| Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>)
        });
    Ok(BoxService::new(service))
}

/// The span of one request, named and attributed as OpenTelemetry's HTTP client conventions ask.
fn http_span(request: &http::Request<Body>) -> tracing::Span {
    tracing::debug_span!(
        target: HTTP_SPAN_TARGET,
        "HTTP",
        http.method = %request.method(),
        http.url = %request.uri(),
        http.status_code = tracing::field::Empty,
        otel.name = request.extensions().get::<&'static str>().copied().unwrap_or("HTTP"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
    )
}

fn record_status<B>(response: &http::Response<B>, _latency: Duration, span: &tracing::Span) {
    let status = response.status();
    span.record("http.status_code", status.as_u16());
    if status.is_client_error() || status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
}

/// hyper's TCP connector; under a fence, its connections are [`FencedTcp`].
#[derive(Clone)]
struct TcpConnector {
    http: HttpConnector,
    fence: Option<Fence>,
}

impl Service<Uri> for TcpConnector {
    type Response = FencedTcp;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<FencedTcp, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(BoxError::from)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.http.call(uri);
        let fence = self.fence.clone();
        Box::pin(async move {
            let tcp = connecting.await?;
            let fence = match fence {
                Some(fence) => {
                    tcp.inner().set_zero_linger()?;
                    let mut fenced = FenceTimer {
                        released: Box::pin(fence.released.clone().cancelled_owned()),
                        fence,
                        armed: None,
                        expiry: Box::pin(tokio::time::sleep_until(Instant::now())),
                    };
                    fenced.check(None)?;
                    Some(fenced)
                }
                None => None,
            };
            Ok(FencedTcp { tcp, fence })
        })
    }
}

/// A TCP connection that, under a fence, fails every read and write from the moment its lock is no
/// longer valid (and wakes its reader or writer at that moment, so hyper drops it then).
struct FencedTcp {
    tcp: TokioIo<TcpStream>,
    fence: Option<FenceTimer>,
}

struct FenceTimer {
    fence: Fence,
    /// The `valid_until` `expiry` is set to.
    armed: Option<Instant>,
    expiry: Pin<Box<Sleep>>,
    /// Wakes the connection when the fence ends ([`Fence::settled`]).
    released: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl FenceTimer {
    /// An error once the lock is not valid; while it is, with `cx`, a wake-up when it stops being.
    fn check(&mut self, cx: Option<&mut Context<'_>>) -> io::Result<()> {
        let expired = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("lease {} no longer valid: connection reset", self.fence.lease()),
            )
        };
        let Some(until) = self.fence.valid_until().filter(|until| *until > Instant::now()) else {
            return Err(expired());
        };
        if self.armed != Some(until) {
            self.expiry.as_mut().reset(until);
            self.armed = Some(until);
        }
        let Some(cx) = cx else { return Ok(()) };
        if self.released.as_mut().poll(cx).is_ready() || self.expiry.as_mut().poll(cx).is_ready() {
            return Err(expired());
        }
        Ok(())
    }
}

impl FencedTcp {
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        self.fence.as_mut().map_or(Ok(()), |fence| fence.check(Some(cx)))
    }
}

impl hyper::rt::Read for FencedTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for FencedTcp {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }
}

impl Connection for FencedTcp {
    fn connected(&self) -> Connected {
        self.tcp.connected()
    }
}
