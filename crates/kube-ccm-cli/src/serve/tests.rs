//! The server over real TLS connections: suites, certificate rotation, deadlines and the connection cap.

use std::path::Path;

use http_body_util::BodyExt;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::AsyncReadExt;

use super::*;

pub(super) const BOUND: Duration = Duration::from_secs(10);

/// A certificate for `localhost` and its key, in PEM, and the certificate in DER.
pub(super) fn pair() -> (String, String, CertificateDer<'static>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem(), cert.der().clone())
}

/// Serving from files in `dir` (`tls.crt`, `tls.key`) on a loopback port.
pub(super) fn serving(dir: &Path) -> Serving {
    Serving {
        address: ([127, 0, 0, 1], 0).into(),
        flags: "",
        cert_file: Some(dir.join("tls.crt").display().to_string()),
        key_file: Some(dir.join("tls.key").display().to_string()),
        tls13_only: false,
        client_ca: None,
        front_proxy: None,
        cipher_suites: None,
        kx_groups: None,
        reload_check: RELOAD_CHECK,
    }
}

pub(super) fn write_pair(dir: &Path, cert: &str, key: &str) {
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
    std::fs::write(dir.join("tls.key"), key).unwrap();
}

pub(super) async fn start_serving(serving: Serving, limits: Limits) -> SocketAddr {
    let delegation = auth::Delegation::new(
        auth::DelegationSettings {
            always_allow_paths: vec!["/healthz".into(), "/livez".into(), "/readyz".into()],
            token_ttl: Duration::from_secs(10),
            allowed_ttl: Duration::from_secs(10),
            denied_ttl: Duration::from_secs(10),
        },
        None,
        None,
    );
    start_delegating(serving, limits, delegation).await
}

/// As [`start_serving`], asking `delegation` who a caller is and what it may do.
pub(super) async fn start_delegating(
    serving: Serving,
    limits: Limits,
    delegation: Arc<auth::Delegation>,
) -> SocketAddr {
    start(
        serving,
        limits,
        delegation,
        Arc::new(Health::default()),
        Arc::new(Metrics::new()),
        Debug {
            profiling: true,
            configz: "{}".into(),
            set_verbosity: Arc::new(|_| Ok(())),
        },
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

/// A client that trusts `root`; with `tls12_suite`, one that speaks TLS 1.2 with that suite only.
pub(super) fn client(
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
pub(super) async fn handshakes(address: SocketAddr, connector: &tokio_rustls::TlsConnector) -> bool {
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
pub(super) async fn connect(
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

pub(super) async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
) -> u16 {
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
        request: Duration::from_secs(30),
        write_stall: Duration::from_secs(10),
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
            "[+]a ok\n[+]skipped-node-route-controller ok: --cluster-cidr is not set\nreadyz check passed\n"
                .to_owned()
        )
    );
}
