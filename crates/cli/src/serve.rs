//! `/healthz`, `/livez`, `/readyz` (with `/<check>` and `?verbose`) and `/metrics` over HTTPS.
//!
//! TLS from `--tls-cert-file`/`--tls-private-key-file`, or an in-memory self-signed certificate. Delegated
//! authentication and authorization are not implemented yet: bind to a private address.
//!
//! Nobody who can reach the port can make the process unable to renew its Lease ([`Limits`]): a TLS
//! handshake and a request's headers each have a deadline (a kept-alive connection waiting for its next
//! request too), the connections open at once are capped below the process's descriptor limit, and at the
//! cap the oldest connection not serving a request is closed to make room, so idle connections held open
//! by someone cannot lock out a probe or a scrape. Accept errors (out of descriptors) are retried with
//! back-off, as Go's `net/http`, never in a busy loop.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use controller_manager::{Health, Metrics, Verdict};
use http_body_util::Full;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_util::sync::CancellationToken;

/// Where and how to serve.
pub(crate) struct Serving {
    pub(crate) address: SocketAddr,
    pub(crate) cert_file: Option<String>,
    pub(crate) key_file: Option<String>,
    pub(crate) tls13_only: bool,
}

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

fn tls_config(serving: &Serving) -> Result<rustls::ServerConfig> {
    let (chain, key) = match (&serving.cert_file, &serving.key_file) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(Path::new(cert))
                .with_context(|| format!("--tls-cert-file: cannot read {cert}"))?
                .collect::<Result<_, _>>()
                .with_context(|| format!("--tls-cert-file: {cert} is not PEM certificates"))?;
            let key = PrivateKeyDer::from_pem_file(Path::new(key)).with_context(|| {
                format!("--tls-private-key-file: cannot read a PEM private key from {key}")
            })?;
            (chain, key)
        }
        _ => {
            let host = crate::identity::hostname();
            let names = vec!["localhost".to_owned(), host];
            let certified = rcgen::generate_simple_self_signed(names)
                .context("cannot generate a self-signed certificate")?;
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
            (vec![certified.cert.der().clone()], key)
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if serving.tls13_only {
        &[&rustls::version::TLS13]
    } else {
        rustls::DEFAULT_VERSIONS
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("--tls-cert-file/--tls-private-key-file: the key does not match the certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The open connections, oldest first.
struct Connections {
    limit: usize,
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    next: AtomicU64,
}

struct Connection {
    close: CancellationToken,
    /// Serving a request (not evicted to make room).
    busy: AtomicBool,
}

/// A connection's place in the table, given up when its task ends.
struct Admitted {
    id: u64,
    connection: Arc<Connection>,
    table: Arc<Connections>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.table.lock().remove(&self.id);
    }
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Connection>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a new connection; at the cap, the oldest connection not serving a request is closed
    /// for it. `None` when every connection is serving one.
    fn admit(table: &Arc<Connections>) -> Option<Admitted> {
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
fn accept_backoff(previous: Duration) -> Duration {
    (previous * 2).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// Binds and serves until `shutdown`.
pub(crate) async fn start(
    serving: Serving,
    limits: Limits,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<SocketAddr> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(&serving)?));
    let listener = tokio::net::TcpListener::bind(serving.address)
        .await
        .with_context(|| {
            format!(
                "--bind-address/--secure-port: cannot listen on {}",
                serving.address
            )
        })?;
    let address = listener.local_addr()?;
    let table = Arc::new(Connections {
        limit: limits.max_connections.max(1),
        open: Mutex::default(),
        next: AtomicU64::new(0),
    });
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
            let (acceptor, health, metrics) = (acceptor.clone(), health.clone(), metrics.clone());
            tokio::spawn(async move {
                let close = admitted.connection.close.clone();
                tokio::select! {
                    () = close.cancelled() => {}
                    () = serve_connection(stream, acceptor, limits, &admitted.connection, health, metrics) => {}
                }
                drop(admitted);
            });
        }
    });
    Ok(address)
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    limits: Limits,
    connection: &Arc<Connection>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) {
    let Ok(Ok(stream)) = tokio::time::timeout(limits.handshake, acceptor.accept(stream)).await else {
        return;
    };
    let busy = connection.clone();
    let service = hyper::service::service_fn(move |request| {
        let (health, metrics, busy) = (health.clone(), metrics.clone(), busy.clone());
        async move {
            busy.busy.store(true, Ordering::Relaxed);
            let response = handle(request, health, metrics).await;
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
    let mut response = http::Response::new(Full::new(Bytes::from(body)));
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
    let mut text = String::new();
    for (name, result) in &verdict.checks {
        match result {
            Ok(()) => text.push_str(&format!("[+]{name} ok\n")),
            Err(why) => text.push_str(&format!("[-]{name} failed: {why}\n")),
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

async fn handle(
    request: http::Request<hyper::body::Incoming>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if request.method() != http::Method::GET && request.method() != http::Method::HEAD {
        return Ok(respond(405, TEXT, "method not allowed\n".to_owned()));
    }
    let query = request.uri().query().unwrap_or_default();
    let verbose = query
        .split('&')
        .any(|p| p == "verbose" || p.starts_with("verbose="));
    // `?exclude=<check>` (repeatable), as upstream's healthz.
    let excluded: Vec<&str> = query
        .split('&')
        .filter_map(|p| p.strip_prefix("exclude="))
        .collect();
    let path = request.uri().path().trim_end_matches('/');
    let mut segments = path.trim_start_matches('/').splitn(2, '/');
    let (endpoint, only) = (segments.next().unwrap_or_default(), segments.next());
    let response = match endpoint {
        "healthz" | "livez" => {
            let (status, body) = checks(endpoint, &health.health().excluding(&excluded), only, verbose);
            respond(status, TEXT, body)
        }
        "readyz" => {
            let (status, body) = checks(endpoint, &health.readiness().excluding(&excluded), only, verbose);
            respond(status, TEXT, body)
        }
        "metrics" if only.is_none() => respond(
            200,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        _ => respond(404, TEXT, "404 page not found\n".to_owned()),
    };
    Ok(response)
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use rustls::pki_types::ServerName;
    use tokio::io::AsyncReadExt;

    use super::*;

    const BOUND: Duration = Duration::from_secs(10);

    /// A server on a loopback port with `limits` and a certificate for `localhost`, and a client config
    /// that trusts it.
    async fn serve(limits: Limits) -> (SocketAddr, tokio_rustls::TlsConnector, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let serving = Serving {
            address: ([127, 0, 0, 1], 0).into(),
            cert_file: Some(cert_file.display().to_string()),
            key_file: Some(key_file.display().to_string()),
            tls13_only: false,
        };
        let address = start(
            serving,
            limits,
            Arc::new(Health::default()),
            Arc::new(Metrics::new()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let client =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        (address, tokio_rustls::TlsConnector::from(Arc::new(client)), dir)
    }

    /// An HTTPS connection: its request sender and the connection's own future (done when it closes).
    async fn connect(
        address: SocketAddr,
        connector: &tokio_rustls::TlsConnector,
    ) -> (
        hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        tokio::task::JoinHandle<Result<(), hyper::Error>>,
    ) {
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
        (sender, tokio::spawn(connection))
    }

    async fn get(sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>, path: &str) -> u16 {
        let request = http::Request::get(path)
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        response.into_body().collect().await.unwrap();
        status
    }

    /// Reads until the server closes the connection (bounded).
    async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
        let mut buffer = [0u8; 64];
        loop {
            match tokio::time::timeout(BOUND, stream.read(&mut buffer)).await {
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    }

    fn limits(handshake_ms: u64, header_read_ms: u64, max_connections: usize) -> Limits {
        Limits {
            handshake: Duration::from_millis(handshake_ms),
            header_read: Duration::from_millis(header_read_ms),
            max_connections,
        }
    }

    #[tokio::test]
    async fn a_connection_that_never_completes_its_handshake_is_closed() {
        let (address, _, _dir) = serve(limits(200, 60_000, 16)).await;
        let mut idle = tokio::net::TcpStream::connect(address).await.unwrap();
        let opened = std::time::Instant::now();
        assert!(closed_by_server(&mut idle).await, "still open after {BOUND:?}");
        assert!(
            opened.elapsed() >= Duration::from_millis(150),
            "closed before the deadline"
        );
    }

    #[tokio::test]
    async fn a_kept_alive_connection_without_a_next_request_is_closed() {
        let (address, connector, _dir) = serve(limits(60_000, 200, 16)).await;
        let (mut sender, connection) = connect(address, &connector).await;
        assert_eq!(get(&mut sender, "/healthz").await, 200);
        let closed = tokio::time::timeout(BOUND, connection).await;
        assert!(
            closed.is_ok(),
            "the idle connection is still open after {BOUND:?}"
        );
    }

    #[tokio::test]
    async fn at_the_cap_the_oldest_idle_connection_makes_room_for_a_probe() {
        let (address, connector, _dir) = serve(limits(60_000, 60_000, 3)).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(tokio::net::TcpStream::connect(address).await.unwrap());
        }
        // A kept-alive client that has been served stays until it is the oldest idle one.
        let (mut sender, _connection) = connect(address, &connector).await;
        assert_eq!(get(&mut sender, "/livez").await, 200);
        assert!(closed_by_server(&mut held[0]).await, "the oldest was not closed");
        for _ in 0..2 {
            let (mut probe, _connection) = connect(address, &connector).await;
            assert_eq!(get(&mut probe, "/readyz").await, 200);
        }
        assert!(closed_by_server(&mut held[1]).await);
        assert!(closed_by_server(&mut held[2]).await);
    }

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

    #[test]
    fn check_texts_follow_upstream() {
        let verdict = Verdict {
            ok: false,
            checks: vec![
                ("leader-election".into(), Ok(())),
                ("cloud-node-controller".into(), Err("stopped".into())),
            ],
            notes: Vec::new(),
        };
        let (status, body) = checks("healthz", &verdict, None, false);
        assert_eq!(status, 500);
        assert_eq!(
            body,
            "[+]leader-election ok\n[-]cloud-node-controller failed: stopped\nhealthz check failed\n"
        );
        assert_eq!(
            checks("healthz", &verdict, Some("leader-election"), false),
            (200, "ok".to_owned())
        );
        assert_eq!(checks("healthz", &verdict, Some("nope"), false).0, 404);
        assert_eq!(
            checks(
                "healthz",
                &verdict.clone().excluding(&["cloud-node-controller"]),
                None,
                true
            ),
            (200, "[+]leader-election ok\nhealthz check passed\n".to_owned())
        );
        let healthy = Verdict {
            ok: true,
            checks: vec![("a".into(), Ok(()))],
            notes: vec![(
                "skipped-node-route-controller".into(),
                "--cluster-cidr is not set".into(),
            )],
        };
        assert_eq!(checks("readyz", &healthy, None, false), (200, "ok".to_owned()));
        assert_eq!(
            checks("readyz", &healthy, None, true),
            (
                200,
                "[+]a ok\n[+]skipped-node-route-controller ok: --cluster-cidr is not set\nreadyz check passed\n".to_owned()
            )
        );
    }
}
