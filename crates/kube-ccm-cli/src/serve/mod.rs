//! `/healthz`, `/livez`, `/readyz` (with `/<check>` and `?verbose`), `/metrics`, `/configz` and, with
//! `--profiling`, `/debug/pprof/` and `/debug/flags/v` (`debug.rs`) over HTTPS.
//!
//! TLS from `--tls-cert-file`/`--tls-private-key-file`, or an in-memory self-signed certificate; client
//! certificates verified against `--client-ca-file` when one is given. Who may read what is decided by the
//! API server ([`auth`]: TokenReview, SubjectAccessReview), as upstream's secure serving.
//!
//! Nobody who can reach the port can make the process unable to renew its Lease ([`Limits`]): a TLS
//! handshake and a request's headers each have a deadline (a kept-alive connection waiting for its next
//! request too), the connections open at once are capped below the process's descriptor limit, and at the
//! cap the oldest connection not serving a request is closed to make room, so idle connections held open
//! by someone cannot lock out a probe or a scrape. Accept errors (out of descriptors) are retried with
//! back-off, as Go's `net/http`, never in a busy loop.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use kube_ccm_runtime::webhooks::Webhooks;
use kube_ccm_runtime::{Health, Metrics, Verdict};
use rustls::SupportedCipherSuite;
use tokio_util::sync::CancellationToken;

pub(crate) mod auth;
mod connections;
mod debug;
mod pprof;
mod tls;

use self::auth::{Decision, Delegation};
use self::connections::{Connection, Connections, WriteDeadline, accept_backoff};
pub(crate) use self::connections::{Limits, raise_open_files_limit};
pub(crate) use self::debug::{Debug, SetVerbosity};
pub(crate) use self::tls::{
    ClientCa, FrontProxy, RELOAD_CHECK, cipher_suites, ensure_self_signed_pair, kx_groups,
};
use self::tls::{Peer, ReloadingTls, Verifiers};

/// Where and how to serve.
pub(crate) struct Serving {
    pub(crate) address: SocketAddr,
    /// The prefix of its flags' names in messages: `""` (`--tls-cert-file`…) or `"webhook-"`.
    pub(crate) flags: &'static str,
    pub(crate) cert_file: Option<String>,
    pub(crate) key_file: Option<String>,
    pub(crate) tls13_only: bool,
    /// Client certificates it signed authenticate their callers.
    pub(crate) client_ca: Option<ClientCa>,
    /// A front proxy whose certificate this CA signed names its caller in request headers.
    pub(crate) front_proxy: Option<FrontProxy>,
    /// The TLS 1.2 suites to offer (`None`: the defaults).
    pub(crate) cipher_suites: Option<Vec<SupportedCipherSuite>>,
    /// The key exchange groups to offer (`None`: the defaults).
    pub(crate) kx_groups: Option<Vec<&'static dyn rustls::crypto::SupportedKxGroup>>,
    /// How often the certificate files are looked at, at most.
    pub(crate) reload_check: Duration,
}

/// Binds and serves until `shutdown`.
pub(crate) async fn start(
    serving: Serving,
    limits: Limits,
    delegation: Arc<Delegation>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    debug: Debug,
    shutdown: CancellationToken,
) -> Result<SocketAddr> {
    let tls = Arc::new(ReloadingTls::new(&serving)?);
    let endpoints = Endpoints {
        limits,
        delegation,
        health,
        metrics,
        debug,
    };
    listen(
        &serving,
        tls,
        limits,
        shutdown,
        move |verifiers, peer_certificates| {
            let endpoints = endpoints.clone();
            let peer = Arc::new(verifiers.peer(peer_certificates));
            move |request| {
                let (endpoints, peer) = (endpoints.clone(), peer.clone());
                async move { handle(request, &endpoints, &peer).await }
            }
        },
    )
    .await
}

/// Serves the enabled `webhooks` on the webhook port until `shutdown` (upstream's webhook server: TLS, no
/// authentication of its own; the API server is its caller).
pub(crate) async fn start_webhooks(
    serving: Serving,
    limits: Limits,
    webhooks: Arc<Webhooks>,
    shutdown: CancellationToken,
) -> Result<SocketAddr> {
    let tls = Arc::new(ReloadingTls::new(&serving)?);
    let budget = Arc::new(Budget::new());
    listen(&serving, tls, limits, shutdown, move |_, _| {
        let (webhooks, budget) = (webhooks.clone(), budget.clone());
        move |request| {
            let (webhooks, budget) = (webhooks.clone(), budget.clone());
            async move {
                let answer =
                    tokio::time::timeout(limits.request, answer_webhook(request, &webhooks, &budget));
                Ok(answer.await.unwrap_or_else(|_| too_slow(limits.request)))
            }
        }
    })
    .await
}

/// The largest admission review read: an update's review carries the object twice (new and old), each
/// up to kube-apiserver's 3 MiB request limit, with 1 MiB for the envelope (controller-runtime's bound).
/// Upstream's webhook server reads without limit.
const MAX_REVIEW: usize = 7 * 1024 * 1024;

/// The bytes of admission reviews held at once, across connections (received, decoded or answered), and
/// the reviews decoded and answered at once: 1,024 connections sending large or slow bodies cannot take
/// more memory than this (a decoded review takes a few times its bytes). A review past the budget is
/// answered 429, as kube-apiserver's own overload is.
const REVIEW_BUDGET: usize = 64 * 1024 * 1024;
const REVIEWS_AT_ONCE: usize = 2;

/// What the webhook server may hold at once.
struct Budget {
    bytes: Arc<tokio::sync::Semaphore>,
    reviews: tokio::sync::Semaphore,
}

impl Budget {
    fn new() -> Budget {
        Budget {
            bytes: Arc::new(tokio::sync::Semaphore::new(REVIEW_BUDGET)),
            reviews: tokio::sync::Semaphore::new(REVIEWS_AT_ONCE),
        }
    }
}

/// Why a review's body was not read whole.
#[derive(Debug, PartialEq, Eq)]
enum Unread {
    TooLarge,
    OverBudget,
    Broken,
}

/// Reads a body of at most `max` bytes, taking each part's bytes from `budget` as it arrives (so a slow
/// sender holds only what it sent); the permit holds them until dropped.
async fn read_body<B>(
    mut body: B,
    max: usize,
    budget: &Arc<tokio::sync::Semaphore>,
) -> Result<(Vec<u8>, Option<tokio::sync::OwnedSemaphorePermit>), Unread>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let mut bytes = Vec::new();
    let mut held: Option<tokio::sync::OwnedSemaphorePermit> = None;
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let Ok(data) = frame.map_err(|_| Unread::Broken)?.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > max {
            return Err(Unread::TooLarge);
        }
        let count = u32::try_from(data.len()).map_err(|_| Unread::TooLarge)?;
        let permit = budget
            .clone()
            .try_acquire_many_owned(count)
            .map_err(|_| Unread::OverBudget)?;
        match &mut held {
            Some(held) => held.merge(permit),
            None => held = Some(permit),
        }
        bytes.extend_from_slice(&data);
    }
    Ok((bytes, held))
}

/// The answer to a request not done within `limit`; the connection is closed with it.
fn too_slow(limit: Duration) -> http::Response<Full<Bytes>> {
    let mut response = respond(
        408,
        "text/plain; charset=utf-8",
        format!("the request was not done within {limit:?}\n"),
    );
    response
        .headers_mut()
        .insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    response
}

async fn answer_webhook(
    request: http::Request<hyper::body::Incoming>,
    webhooks: &Webhooks,
    budget: &Budget,
) -> http::Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let (request, body) = request.into_parts();
    if request.method != http::Method::POST {
        return respond(405, TEXT, "method not allowed\n".to_owned());
    }
    let declared = request
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_REVIEW as u64) {
        return respond(413, TEXT, format!("the body is over {MAX_REVIEW} bytes\n"));
    }
    let (body, _held) = match read_body(body, MAX_REVIEW, &budget.bytes).await {
        Ok(read) => read,
        Err(Unread::TooLarge) => return respond(413, TEXT, format!("the body is over {MAX_REVIEW} bytes\n")),
        Err(Unread::OverBudget) => return busy(),
        Err(Unread::Broken) => return respond(400, TEXT, "the body could not be read\n".to_owned()),
    };
    let Ok(_answering) = budget.reviews.acquire().await else {
        return busy();
    };
    let content_type = request
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    match webhooks.answer(request.uri.path(), content_type, &body).await {
        Some((status, content_type, body)) => respond_bytes(status, content_type, Bytes::from(body)),
        None => respond(404, TEXT, "404 page not found\n".to_owned()),
    }
}

/// 429 with `Retry-After`, for a request the server has no room for now.
fn busy() -> http::Response<Full<Bytes>> {
    let mut response = status(
        429,
        "TooManyRequests",
        "too many requests at once, try again later",
    );
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    response
}

/// Binds `serving`'s address and serves each TLS connection with the handler `connection` makes from its
/// peer's certificates, until `shutdown`.
async fn listen<C, H, F>(
    serving: &Serving,
    tls: Arc<ReloadingTls>,
    limits: Limits,
    shutdown: CancellationToken,
    connection: C,
) -> Result<SocketAddr>
where
    C: Fn(&Verifiers, Option<&[rustls::pki_types::CertificateDer<'static>]>) -> H + Send + Sync + 'static,
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<http::Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind(serving.address)
        .await
        .with_context(|| {
            format!(
                "--{flags}bind-address/--{flags}secure-port: cannot listen on {}",
                serving.address,
                flags = serving.flags
            )
        })?;
    let address = listener.local_addr()?;
    let table = Connections::new(limits.max_connections);
    let connection = Arc::new(connection);
    tokio::spawn(async move {
        let mut backoff = Duration::ZERO;
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => {
                    backoff = Duration::ZERO;
                    stream
                }
                Err(error) => {
                    backoff = accept_backoff(backoff);
                    tracing::warn!(%error, retry_in = ?backoff, "cannot accept a connection");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => continue,
                    }
                }
            };
            // Every connection is serving a request: this one is refused (closed at once).
            let Some(admitted) = Connections::admit(&table) else {
                continue;
            };
            // The configuration in force now (a changed client CA is read here).
            let (config, verifiers) = tls.current();
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            let connection = connection.clone();
            tokio::spawn(async move {
                let close = admitted.connection.close.clone();
                tokio::select! {
                    () = close.cancelled() => {}
                    () = serve_connection(stream, acceptor, &verifiers, limits, &admitted.connection, &*connection) => {}
                }
                drop(admitted);
            });
        }
    });
    Ok(address)
}

/// What a connection serves.
#[derive(Clone)]
struct Endpoints {
    limits: Limits,
    delegation: Arc<Delegation>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    debug: Debug,
}

/// The longest request body read (`PUT /debug/flags/v`).
const MAX_BODY: usize = 1024;

async fn serve_connection<C, H, F>(
    stream: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    verifiers: &Verifiers,
    limits: Limits,
    connection: &Arc<Connection>,
    handler: &C,
) where
    C: Fn(&Verifiers, Option<&[rustls::pki_types::CertificateDer<'static>]>) -> H,
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<http::Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    let Ok(Ok(stream)) = tokio::time::timeout(limits.handshake, acceptor.accept(stream)).await else {
        return;
    };
    let handle = Arc::new(handler(verifiers, stream.get_ref().1.peer_certificates()));
    let stream = WriteDeadline::new(stream, limits.write_stall);
    let busy = connection.clone();
    let service = hyper::service::service_fn(move |request| {
        let (handle, busy) = (handle.clone(), busy.clone());
        async move {
            busy.busy.store(true, Ordering::Relaxed);
            let response = handle(request).await;
            busy.busy.store(false, Ordering::Relaxed);
            response
        }
    });
    // The read timeout needs a timer; without one hyper drops every connection.
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .max_buf_size(connections::MAX_BUFFER)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

fn respond(status: u16, content_type: &'static str, body: String) -> http::Response<Full<Bytes>> {
    respond_bytes(status, content_type, Bytes::from(body))
}

fn respond_bytes(status: u16, content_type: &'static str, body: Bytes) -> http::Response<Full<Bytes>> {
    let mut response = http::Response::new(Full::new(body));
    *response.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

/// Upstream's text for a check endpoint.
fn checks(endpoint: &str, verdict: &Verdict, only: Option<&str>, verbose: bool) -> (u16, String) {
    if let Some(name) = only {
        return match verdict.checks.iter().find(|(n, _)| n == name) {
            Some((_, Ok(()))) => (200, "ok".to_owned()),
            Some((_, Err(why))) => (500, format!("internal server error: {why}\n")),
            None => (404, format!("{endpoint} check {name:?} not found\n")),
        };
    }
    // As upstream: the list (served to anyone, on an always-allowed path) withholds why a check failed; the
    // log has it, and so does the check's own path.
    let mut text = String::new();
    for (name, result) in &verdict.checks {
        match result {
            Ok(()) => text.push_str(&format!("[+]{name} ok\n")),
            Err(why) => {
                tracing::info!(check = %name, reason = %why, "{endpoint} check failed");
                text.push_str(&format!("[-]{name} failed: reason withheld\n"));
            }
        }
    }
    for (name, note) in &verdict.notes {
        text.push_str(&format!("[+]{name} ok: {note}\n"));
    }
    if verdict.ok {
        if verbose {
            (200, format!("{text}{endpoint} check passed\n"))
        } else {
            (200, "ok".to_owned())
        }
    } else {
        (500, format!("{text}{endpoint} check failed\n"))
    }
}

/// A `v1` Status, as upstream's filters answer a refused request.
fn status(code: u16, reason: &str, message: &str) -> http::Response<Full<Bytes>> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "details": {}, "code": code,
    });
    respond(code, "application/json", body.to_string())
}

async fn handle(
    request: http::Request<hyper::body::Incoming>,
    endpoints: &Endpoints,
    peer: &Peer,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let (request, body) = request.into_parts();
    let method = request.method.clone();
    let verb = match method {
        http::Method::GET | http::Method::HEAD => "get",
        // Only `/debug/flags/v` takes a PUT.
        http::Method::PUT if request.uri.path() == "/debug/flags/v" => "put",
        _ => return Ok(respond(405, TEXT, "method not allowed\n".to_owned())),
    };
    let authorization = request
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    // As upstream's authenticators, in order: a front proxy's headers, a client certificate, then a token.
    let established = peer
        .front_proxy
        .as_ref()
        .and_then(|proxy| proxy.user(&request.headers))
        .or_else(|| peer.certificate_user.clone());
    match endpoints
        .delegation
        .decide(request.uri.path(), verb, authorization, established.as_ref())
        .await
    {
        Decision::Allow => {}
        Decision::Unauthenticated => return Ok(status(401, "Unauthorized", "Unauthorized")),
        Decision::TooMany => return Ok(busy()),
        Decision::Forbidden(message) => return Ok(status(403, "Forbidden", &message)),
        Decision::Failed(message) => {
            tracing::warn!(%message, "refusing a request that cannot be authorized");
            return Ok(status(
                500,
                "InternalError",
                &format!("Internal Server Error: {message}"),
            ));
        }
    }
    let (health, metrics) = (&endpoints.health, &endpoints.metrics);
    let query = request.uri.query().unwrap_or_default();
    let verbose = query
        .split('&')
        .any(|p| p == "verbose" || p.starts_with("verbose="));
    // `?exclude=<check>` (repeatable), as upstream's healthz.
    let excluded: Vec<&str> = query
        .split('&')
        .filter_map(|p| p.strip_prefix("exclude="))
        .collect();
    let path = request.uri.path().trim_end_matches('/');
    let mut segments = path.trim_start_matches('/').splitn(2, '/');
    let (endpoint, only) = (segments.next().unwrap_or_default(), segments.next());
    let accept = request
        .headers
        .get(hyper::header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let debug_path = path.trim_start_matches('/').to_owned();
    let body = if method == http::Method::PUT {
        let read = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, MAX_BODY));
        match tokio::time::timeout(endpoints.limits.request, read).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(_)) => return Ok(respond(413, TEXT, format!("the body is over {MAX_BODY} bytes\n"))),
            Err(_) => return Ok(too_slow(endpoints.limits.request)),
        }
    } else {
        Bytes::new()
    };
    if let Some((status, content_type, bytes)) =
        endpoints.debug.answer(&method, &debug_path, query, &body).await
    {
        return Ok(respond_bytes(status, content_type, Bytes::from(bytes)));
    }
    let response = match endpoint {
        "healthz" | "livez" => {
            let (status, body) = checks(endpoint, &health.health().excluding(&excluded), only, verbose);
            respond(status, TEXT, body)
        }
        "readyz" => {
            let (status, body) = checks(endpoint, &health.readiness().excluding(&excluded), only, verbose);
            respond(status, TEXT, body)
        }
        "metrics" if only.is_none() => {
            let (content_type, body) = metrics.exposition(accept);
            respond(200, content_type, body)
        }
        _ => respond(404, TEXT, "404 page not found\n".to_owned()),
    };
    Ok(response)
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
