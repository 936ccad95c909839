//! `/healthz`, `/livez`, `/readyz` (with `/<check>` and `?verbose`) and `/metrics` over HTTPS.
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
use controller_manager::{Health, Metrics, Verdict};
use http_body_util::Full;
use rustls::SupportedCipherSuite;
use tokio_util::sync::CancellationToken;

pub(crate) mod auth;
mod connections;
mod tls;

use self::auth::{Decision, Delegation};
use self::connections::{Connection, Connections, accept_backoff};
pub(crate) use self::connections::{Limits, raise_open_files_limit};
pub(crate) use self::tls::{ClientCa, FrontProxy, RELOAD_CHECK, cipher_suites};
use self::tls::{Peer, Verifiers, tls_config};

/// Where and how to serve.
pub(crate) struct Serving {
    pub(crate) address: SocketAddr,
    pub(crate) cert_file: Option<String>,
    pub(crate) key_file: Option<String>,
    pub(crate) tls13_only: bool,
    /// Client certificates it signed authenticate their callers.
    pub(crate) client_ca: Option<ClientCa>,
    /// A front proxy whose certificate this CA signed names its caller in request headers.
    pub(crate) front_proxy: Option<FrontProxy>,
    /// The TLS 1.2 suites to offer (`None`: the defaults).
    pub(crate) cipher_suites: Option<Vec<SupportedCipherSuite>>,
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
    shutdown: CancellationToken,
) -> Result<SocketAddr> {
    let (config, verifiers) = tls_config(&serving)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let verifiers = Arc::new(verifiers);
    let listener = tokio::net::TcpListener::bind(serving.address)
        .await
        .with_context(|| {
            format!(
                "--bind-address/--secure-port: cannot listen on {}",
                serving.address
            )
        })?;
    let address = listener.local_addr()?;
    let table = Connections::new(limits.max_connections);
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
            let endpoints = Endpoints {
                verifiers: verifiers.clone(),
                delegation: delegation.clone(),
                health: health.clone(),
                metrics: metrics.clone(),
            };
            tokio::spawn(async move {
                let close = admitted.connection.close.clone();
                tokio::select! {
                    () = close.cancelled() => {}
                    () = serve_connection(stream, acceptor, limits, &admitted.connection, endpoints) => {}
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
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    limits: Limits,
    connection: &Arc<Connection>,
    endpoints: Endpoints,
) {
    let Ok(Ok(stream)) = tokio::time::timeout(limits.handshake, acceptor.accept(stream)).await else {
        return;
    };
    let peer = Arc::new(endpoints.verifiers.peer(stream.get_ref().1.peer_certificates()));
    let busy = connection.clone();
    let service = hyper::service::service_fn(move |request| {
        let (endpoints, busy, peer) = (endpoints.clone(), busy.clone(), peer.clone());
        async move {
            busy.busy.store(true, Ordering::Relaxed);
            let response = handle(request, &endpoints, &peer).await;
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
    if request.method() != http::Method::GET && request.method() != http::Method::HEAD {
        return Ok(respond(405, TEXT, "method not allowed\n".to_owned()));
    }
    let authorization = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    // As upstream's authenticators, in order: a front proxy's headers, a client certificate, then a token.
    let established = peer
        .front_proxy
        .as_ref()
        .and_then(|proxy| proxy.user(request.headers()))
        .or_else(|| peer.certificate_user.clone());
    match endpoints
        .delegation
        .decide(request.uri().path(), authorization, established.as_ref())
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
        // As client_golang's handler: the text format Prometheus has always read, and OpenMetrics to a
        // scraper that asks for it.
        "metrics" if only.is_none() => {
            let accept = request
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default();
            if accept.contains("application/openmetrics-text") {
                respond(
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    metrics.encode(),
                )
            } else {
                respond(
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    metrics.encode_text(),
                )
            }
        }
        _ => respond(404, TEXT, "404 page not found\n".to_owned()),
    };
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use http_body_util::BodyExt;
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio::io::AsyncReadExt;

    use super::*;

    const BOUND: Duration = Duration::from_secs(10);

    /// A certificate for `localhost` and its key, in PEM, and the certificate in DER.
    fn pair() -> (String, String, CertificateDer<'static>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().clone())
    }

    /// Serving from files in `dir` (`tls.crt`, `tls.key`) on a loopback port.
    fn serving(dir: &Path) -> Serving {
        Serving {
            address: ([127, 0, 0, 1], 0).into(),
            cert_file: Some(dir.join("tls.crt").display().to_string()),
            key_file: Some(dir.join("tls.key").display().to_string()),
            tls13_only: false,
            client_ca: None,
            front_proxy: None,
            cipher_suites: None,
            reload_check: RELOAD_CHECK,
        }
    }

    fn write_pair(dir: &Path, cert: &str, key: &str) {
        std::fs::write(dir.join("tls.crt"), cert).unwrap();
        std::fs::write(dir.join("tls.key"), key).unwrap();
    }

    async fn start_serving(serving: Serving, limits: Limits) -> SocketAddr {
        start(
            serving,
            limits,
            auth::Delegation::new(
                auth::DelegationSettings {
                    always_allow_paths: vec!["/healthz".into(), "/livez".into(), "/readyz".into()],
                    token_ttl: Duration::from_secs(10),
                    allowed_ttl: Duration::from_secs(10),
                    denied_ttl: Duration::from_secs(10),
                },
                None,
                None,
            ),
            Arc::new(Health::default()),
            Arc::new(Metrics::new()),
            CancellationToken::new(),
        )
        .await
        .unwrap()
    }

    /// A client that trusts `root`; with `tls12_suite`, one that speaks TLS 1.2 with that suite only.
    fn client(
        root: &CertificateDer<'static>,
        tls12_suite: Option<SupportedCipherSuite>,
    ) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root.clone()).unwrap();
        let mut provider = rustls::crypto::ring::default_provider();
        let versions: &[&rustls::SupportedProtocolVersion] = match tls12_suite {
            Some(suite) => {
                provider.cipher_suites = vec![suite];
                &[&rustls::version::TLS12]
            }
            None => rustls::DEFAULT_VERSIONS,
        };
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(Arc::new(config))
    }

    /// Whether a TLS handshake with `connector` succeeds.
    async fn handshakes(address: SocketAddr, connector: &tokio_rustls::TlsConnector) -> bool {
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        tokio::time::timeout(BOUND, connector.connect(name, tcp))
            .await
            .expect("the handshake ends")
            .is_ok()
    }

    /// A server on a loopback port with `limits` and a certificate for `localhost`, and a client config
    /// that trusts it.
    async fn serve(limits: Limits) -> (SocketAddr, tokio_rustls::TlsConnector, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, der) = pair();
        write_pair(dir.path(), &cert, &key);
        let address = start_serving(serving(dir.path()), limits).await;
        (address, client(&der, None), dir)
    }

    #[tokio::test]
    async fn only_the_chosen_tls12_suites_are_offered() {
        use rustls::crypto::ring::cipher_suite as suite;
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, der) = pair();
        write_pair(dir.path(), &cert, &key);
        let mut chosen = serving(dir.path());
        chosen.cipher_suites = Some(vec![suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]);
        let address = start_serving(chosen, Limits::for_open_files(1024)).await;
        assert!(
            handshakes(
                address,
                &client(&der, Some(suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384))
            )
            .await
        );
        assert!(
            !handshakes(
                address,
                &client(&der, Some(suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256))
            )
            .await
        );
        assert!(
            handshakes(address, &client(&der, None)).await,
            "TLS 1.3 is not restricted"
        );

        let mut tls13 = serving(dir.path());
        tls13.cipher_suites = Some(Vec::new());
        let address = start_serving(tls13, Limits::for_open_files(1024)).await;
        assert!(
            !handshakes(
                address,
                &client(&der, Some(suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384))
            )
            .await
        );
        assert!(handshakes(address, &client(&der, None)).await);
    }

    #[tokio::test]
    async fn a_rotated_certificate_is_served_without_a_restart_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (first_cert, first_key, first) = pair();
        write_pair(dir.path(), &first_cert, &first_key);
        let mut rotating = serving(dir.path());
        rotating.reload_check = Duration::ZERO;
        let address = start_serving(rotating, Limits::for_open_files(1024)).await;
        assert!(handshakes(address, &client(&first, None)).await);

        let (second_cert, second_key, second) = pair();
        write_pair(dir.path(), &second_cert, &second_key);
        assert!(
            handshakes(address, &client(&second, None)).await,
            "the rotated certificate is not served"
        );
        assert!(!handshakes(address, &client(&first, None)).await);

        // A key that does not match, then one that is not a key: the second pair stays in service.
        let (_, other_key, _) = pair();
        std::fs::write(dir.path().join("tls.key"), &other_key).unwrap();
        assert!(handshakes(address, &client(&second, None)).await);
        std::fs::write(dir.path().join("tls.key"), "not a key").unwrap();
        assert!(handshakes(address, &client(&second, None)).await);

        let (third_cert, third_key, third) = pair();
        write_pair(dir.path(), &third_cert, &third_key);
        assert!(handshakes(address, &client(&third, None)).await);
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
            "[+]leader-election ok\n[-]cloud-node-controller failed: reason withheld\nhealthz check failed\n"
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
