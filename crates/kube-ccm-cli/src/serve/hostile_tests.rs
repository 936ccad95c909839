//! Hostile clients on the webhook port (unauthenticated, as upstream's) and the serving port: slow and
//! large bodies, readers that stop reading, a flood of made-up tokens; and a rotated client CA.

use std::collections::BTreeMap;
use std::path::Path;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::tests::{BOUND, client, connect, get, pair, serving, start_delegating, start_serving, write_pair};
use super::*;

/// The process's peak resident memory, in MiB.
fn peak_mib() -> f64 {
    harness::proc_status_mib(std::process::id(), "VmHWM:").unwrap_or(0.0)
}

/// Webhooks that allow every review, served on a loopback port with `limits`.
async fn start_allowing(dir: &Path, limits: Limits) -> SocketAddr {
    use kube_ccm_runtime::webhooks::{WebhookContext, WebhookDefinition};
    let allow = WebhookDefinition::new("allow", "/allow", |_, request| async move {
        Ok(kube::core::admission::AdmissionResponse::from(&request))
    });
    let context = WebhookContext {
        provider: Arc::new(kube_ccm_fake::FakeProvider::new(
            kube_ccm_fake::FakeCloudConfig::default(),
        )),
        caches: Arc::new(kube_ccm_provider::NoCaches),
    };
    let webhooks = Webhooks::select(&[allow], &["*".to_owned()], context, Arc::new(Metrics::new())).unwrap();
    let mut port = serving(dir);
    port.flags = "webhook-";
    start_webhooks(port, limits, Arc::new(webhooks), CancellationToken::new())
        .await
        .unwrap()
}

/// A TLS connection to `address` that speaks raw HTTP/1.1.
async fn raw(
    address: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// Posts `length` bytes of `body` (repeated) to `/allow`, `chunk` bytes every `pause`; the status the
/// server answered with, or `None` when it closed the connection without one.
async fn post(
    address: SocketAddr,
    connector: tokio_rustls::TlsConnector,
    body: Bytes,
    length: usize,
    chunk: usize,
    pause: Duration,
) -> Option<u16> {
    let stream = raw(address, &connector).await;
    let (mut reader, mut writer) = tokio::io::split(stream);
    let sending = tokio::spawn(async move {
        let head = format!(
            "POST /allow HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
        );
        writer.write_all(head.as_bytes()).await?;
        let mut sent = 0;
        while sent < length {
            let take = chunk.min(length - sent);
            writer.write_all(&body[..take]).await?;
            sent += take;
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        writer.flush().await
    });
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    let status = tokio::time::timeout(BOUND * 3, async {
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break None,
                Ok(n) => answer.extend_from_slice(&buffer[..n]),
            }
            let text = String::from_utf8_lossy(&answer);
            if let Some(line) = text.lines().next().filter(|_| text.contains("\r\n")) {
                break line.split(' ').nth(1).and_then(|code| code.parse().ok());
            }
        }
    })
    .await
    .expect("the server answers or closes within its request deadline");
    sending.abort();
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_large_admission_reviews_take_bounded_memory_and_leave_the_probes_answering() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, der) = pair();
    write_pair(dir.path(), &cert, &key);
    let mut limits = Limits::for_open_files(raise_open_files_limit());
    limits.request = Duration::from_secs(10);
    let probes = start_serving(serving(dir.path()), limits).await;
    let hook = start_allowing(dir.path(), limits).await;
    let connector = client(&der, None);
    let before = peak_mib();

    // One body, shared by every sender: the client side holds 7 MiB, not 7 MiB a connection.
    let body = Bytes::from(vec![b' '; MAX_REVIEW]);
    let mut senders = Vec::new();
    // 960 that trickle (with the 24 below, just under the port's 1,024 connections): a kibibyte every
    // 100 ms of a 7 MiB body, cut off at the request deadline.
    for _ in 0..960 {
        senders.push((
            "slow",
            tokio::spawn(post(
                hook,
                connector.clone(),
                body.clone(),
                MAX_REVIEW,
                1024,
                Duration::from_millis(100),
            )),
        ));
    }
    // 24 that send the largest review read, at once: the budget takes about nine of them.
    for _ in 0..24 {
        senders.push((
            "large",
            tokio::spawn(post(
                hook,
                connector.clone(),
                body.clone(),
                MAX_REVIEW,
                64 * 1024,
                Duration::ZERO,
            )),
        ));
    }
    // Meanwhile the probes answer, each within a second, on fresh connections.
    let mut probes_answered = 0;
    while senders.iter().any(|(_, sender)| !sender.is_finished()) {
        let (mut sender, _connection) = connect(probes, &connector).await;
        let status = tokio::time::timeout(Duration::from_secs(2), get(&mut sender, "/healthz"))
            .await
            .expect("a probe answered within two seconds");
        assert_eq!(status, 200);
        probes_answered += 1;
    }
    let mut statuses: BTreeMap<(&str, Option<u16>), usize> = BTreeMap::new();
    for (kind, sender) in senders {
        *statuses.entry((kind, sender.await.unwrap())).or_default() += 1;
    }
    let count = |kind: &str, status: Option<u16>| statuses.get(&(kind, status)).copied().unwrap_or(0);
    // Every trickle was cut off at the deadline (408) or, while the large ones held the budget, refused
    // (429); every large review read (400: it is no JSON) or refused past the budget.
    assert_eq!(
        count("slow", Some(408)) + count("slow", Some(429)),
        960,
        "{statuses:?}"
    );
    assert!(count("slow", Some(408)) > 0, "{statuses:?}");
    assert_eq!(
        count("large", Some(400)) + count("large", Some(429)),
        24,
        "{statuses:?}"
    );
    assert!(
        count("large", Some(429)) > 0,
        "the budget never engaged: {statuses:?}"
    );
    assert!(
        count("large", Some(400)) > 0,
        "no review was read whole: {statuses:?}"
    );
    assert!(probes_answered > 0);
    // 24 reviews of 7 MiB are 168 MiB (twice that, held as a whole body and its copy, before the
    // budget); the budget holds 64 MiB of them at once.
    let grown = peak_mib() - before;
    #[allow(clippy::print_stderr)]
    {
        eprintln!("the peak grew by {grown:.0} MiB; {statuses:?}; {probes_answered} probes answered");
    }
    assert!(grown < 192.0, "the peak grew by {grown:.0} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, der) = pair();
    write_pair(dir.path(), &cert, &key);
    let mut limits = Limits::for_open_files(raise_open_files_limit());
    limits.write_stall = Duration::from_millis(500);
    limits.header_read = Duration::from_secs(60);
    let address = start_serving(serving(dir.path()), limits).await;
    let mut stream = raw(address, &client(&der, None)).await;
    // Many requests pipelined, no answer ever read: the answers fill the socket's buffers, then stall.
    let request = b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n".repeat(200_000);
    let written = tokio::time::timeout(BOUND, async {
        let _ = stream.write_all(&request).await;
        // Once the server gave up on us, it reads nothing more: the writes end, or fail.
    })
    .await;
    assert!(
        written.is_ok(),
        "the server still holds the connection after {BOUND:?}"
    );
    // The server closed it: what is left to read ends.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(BOUND, stream.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the connection is still open");
}

/// A CA: its certificate in PEM, and the issuer of client certificates.
fn authority(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let certificate = params.self_signed(&key).unwrap();
    (certificate.pem(), rcgen::Issuer::new(params, key))
}

/// A client that trusts `root` and presents a certificate `ca` signed.
fn client_with_certificate(
    root: &CertificateDer<'static>,
    ca: &(String, rcgen::Issuer<'static, rcgen::KeyPair>),
) -> tokio_rustls::TlsConnector {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "scraper");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let certificate = params.signed_by(&key, &ca.1).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).unwrap();
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![certificate.der().clone()],
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Whether a request over a connection made with `connector` is answered (a refused client certificate
/// ends the connection at or right after the handshake).
async fn answered(address: SocketAddr, connector: &tokio_rustls::TlsConnector) -> bool {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let Ok(Ok(tls)) = tokio::time::timeout(
        BOUND,
        connector.connect(ServerName::try_from("localhost").unwrap(), tcp),
    )
    .await
    else {
        return false;
    };
    let Ok((mut sender, connection)) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await
    else {
        return false;
    };
    tokio::spawn(connection);
    let request = http::Request::get("/healthz")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    tokio::time::timeout(BOUND, sender.send_request(request))
        .await
        .expect("bounded")
        .is_ok()
}

#[tokio::test]
async fn a_rotated_client_ca_verifies_clients_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, der) = pair();
    write_pair(dir.path(), &cert, &key);
    let (first, second) = (authority("first-ca"), authority("second-ca"));
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, &first.0).unwrap();
    let mut port = serving(dir.path());
    port.reload_check = Duration::ZERO;
    port.client_ca = Some(ClientCa {
        source: format!("--client-ca-file: {}", ca_file.display()),
        pem: first.0.clone().into_bytes(),
        file: Some(ca_file.clone()),
    });
    let address = start_serving(port, Limits::for_open_files(1024)).await;
    let (by_first, by_second) = (
        client_with_certificate(&der, &first),
        client_with_certificate(&der, &second),
    );
    assert!(answered(address, &by_first).await);
    assert!(
        !answered(address, &by_second).await,
        "a certificate of another CA"
    );

    std::fs::write(&ca_file, &second.0).unwrap();
    assert!(answered(address, &by_second).await, "the rotated CA is not used");
    assert!(!answered(address, &by_first).await, "the old CA is still trusted");

    // A file that is no CA leaves the second in force.
    std::fs::write(&ca_file, "not a certificate").unwrap();
    assert!(answered(address, &by_second).await);
    assert!(!answered(address, &by_first).await);
}

/// `GET path` with a bearer token on a kept-alive connection: the status.
async fn get_as(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    token: &str,
) -> u16 {
    let request = http::Request::get(path)
        .header("host", "localhost")
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    // The connection takes the next request once it has finished with the last answer.
    sender.ready().await.unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap();
    status
}

/// Over HTTPS, as a scraper and an attacker see the port: a flood of made-up bearer tokens while a real
/// scraper's token keeps expiring from the cache; every scrape is served, the flood gets 401 or 429, and the
/// TokenReviews asked stay within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_made_up_tokens_leaves_a_real_scrape_served_and_the_reviews_bounded() {
    let api = kube_ccm_test_apiserver::TestApiServer::start().await.unwrap();
    let real = api.mint_token(kube_ccm_test_apiserver::UserInfo {
        name: "prometheus".to_owned(),
        groups: vec!["monitoring".to_owned()],
    });
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, der) = pair();
    write_pair(dir.path(), &cert, &key);
    let delegation = auth::Delegation::new(
        auth::DelegationSettings {
            always_allow_paths: vec!["/healthz".into()],
            // Short, so the real token is reviewed again during the flood.
            token_ttl: Duration::from_millis(300),
            allowed_ttl: Duration::from_millis(300),
            denied_ttl: Duration::from_millis(300),
        },
        Some(api.client()),
        Some(api.client()),
    );
    let address = start_delegating(
        serving(dir.path()),
        Limits::for_open_files(raise_open_files_limit()),
        delegation,
    )
    .await;
    let connector = client(&der, None);
    let reviews = || {
        api.requests()
            .iter()
            .filter(|r| r.resource.as_deref() == Some("tokenreviews.authentication.k8s.io"))
            .count()
    };
    let (mut scraper, _connection) = connect(address, &connector).await;
    assert_eq!(get_as(&mut scraper, "/metrics", &real).await, 200);
    let before = reviews();
    let started = tokio::time::Instant::now();
    let mut flood = Vec::new();
    for worker in 0..32 {
        let connector = connector.clone();
        flood.push(tokio::spawn(async move {
            let (mut sender, _connection) = connect(address, &connector).await;
            let mut statuses = BTreeMap::new();
            for n in 0..100 {
                let status = get_as(&mut sender, "/metrics", &format!("made-up-{worker}-{n}")).await;
                *statuses.entry(status).or_insert(0) += 1;
            }
            statuses
        }));
    }
    let mut scrapes = 0;
    while flood.iter().any(|worker| !worker.is_finished()) {
        assert_eq!(
            get_as(&mut scraper, "/metrics", &real).await,
            200,
            "the real scrape was refused during the flood"
        );
        scrapes += 1;
    }
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for worker in flood {
        for (status, count) in worker.await.unwrap() {
            *statuses.entry(status).or_default() += count;
        }
    }
    assert_eq!(
        statuses
            .keys()
            .copied()
            .filter(|s| ![401, 429].contains(s))
            .count(),
        0,
        "{statuses:?}"
    );
    assert!(
        statuses.get(&429).is_some_and(|n| *n > 0),
        "the bound never engaged: {statuses:?}"
    );
    let elapsed = started.elapsed().as_secs_f64();
    let asked = reviews() - before;
    // The made-up tokens' reviews within the bound (a burst, then the rate), and the real token's own
    // every time its answer expired.
    let bound = f64::from(auth::UNKNOWN_REVIEWS_PER_SECOND) * (elapsed + 1.0) + elapsed / 0.3 + 2.0;
    assert!(
        asked as f64 <= bound,
        "{asked} TokenReviews in {elapsed:.1} s (bound {bound:.0}); {scrapes} scrapes served; {statuses:?}"
    );
}
