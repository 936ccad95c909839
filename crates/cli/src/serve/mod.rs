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
use controller_manager::webhooks::Webhooks;
use controller_manager::{Health, Metrics, Verdict};
use http_body_util::Full;
use rustls::SupportedCipherSuite;
use tokio_util::sync::CancellationToken;

pub(crate) mod auth;
mod connections;
mod debug;
mod pprof;
mod tls;

use self::auth::{Decision, Delegation};
use self::connections::{Connection, Connections, accept_backoff};
pub(crate) use self::connections::{Limits, raise_open_files_limit};
pub(crate) use self::debug::{Debug, SetVerbosity};
pub(crate) use self::tls::{
    ClientCa, FrontProxy, RELOAD_CHECK, cipher_suites, ensure_self_signed_pair, kx_groups,
};
use self::tls::{Peer, Verifiers, tls_config};

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
    let (config, verifiers) = tls_config(&serving)?;
    let verifiers = Arc::new(verifiers);
    let endpoints = Endpoints {
        verifiers: verifiers.clone(),
        delegation,
        health,
        metrics,
        debug,
    };
    listen(&serving, config, limits, shutdown, move |peer_certificates| {
        let endpoints = endpoints.clone();
        let peer = Arc::new(endpoints.verifiers.peer(peer_certificates));
        move |request| {
            let (endpoints, peer) = (endpoints.clone(), peer.clone());
            async move { handle(request, &endpoints, &peer).await }
        }
    })
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
    let (config, _) = tls_config(&serving)?;
    listen(&serving, config, limits, shutdown, move |_| {
        let webhooks = webhooks.clone();
        move |request| {
            let webhooks = webhooks.clone();
            async move { Ok(answer_webhook(request, &webhooks).await) }
        }
    })
    .await
}

/// The largest admission review read: an update's review carries the object twice (new and old), each
/// up to the API server's 3 MiB request limit, with room for the envelope. Upstream reads without limit.
const MAX_REVIEW: usize = 16 * 1024 * 1024;

async fn answer_webhook(
    request: http::Request<hyper::body::Incoming>,
    webhooks: &Webhooks,
) -> http::Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    let (request, body) = request.into_parts();
    if request.method != http::Method::POST {
        return respond(405, TEXT, "method not allowed\n".to_owned());
    }
    let body = match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, MAX_REVIEW)).await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return respond(413, TEXT, format!("the body is over {MAX_REVIEW} bytes\n")),
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

/// Binds `serving`'s address and serves each TLS connection with the handler `connection` makes from its
/// peer's certificates, until `shutdown`.
async fn listen<C, H, F>(
    serving: &Serving,
    config: rustls::ServerConfig,
    limits: Limits,
    shutdown: CancellationToken,
    connection: C,
) -> Result<SocketAddr>
where
    C: Fn(Option<&[rustls::pki_types::CertificateDer<'static>]>) -> H + Send + Sync + 'static,
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<http::Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
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
            let acceptor = acceptor.clone();
            let connection = connection.clone();
            tokio::spawn(async move {
                let close = admitted.connection.close.clone();
                tokio::select! {
                    () = close.cancelled() => {}
                    () = serve_connection(stream, acceptor, limits, &admitted.connection, &*connection) => {}
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
    verifiers: Arc<Verifiers>,
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
    limits: Limits,
    connection: &Arc<Connection>,
    handler: &C,
) where
    C: Fn(Option<&[rustls::pki_types::CertificateDer<'static>]>) -> H,
    H: Fn(http::Request<hyper::body::Incoming>) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<http::Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    let Ok(Ok(stream)) = tokio::time::timeout(limits.handshake, acceptor.accept(stream)).await else {
        return;
    };
    let handle = Arc::new(handler(stream.get_ref().1.peer_certificates()));
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
        match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, MAX_BODY)).await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => return Ok(respond(413, TEXT, format!("the body is over {MAX_BODY} bytes\n"))),
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
mod tests;
