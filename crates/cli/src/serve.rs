//! `/healthz`, `/livez`, `/readyz` (with `/<check>` and `?verbose`) and `/metrics` over HTTPS.
//!
//! TLS from `--tls-cert-file`/`--tls-private-key-file`, or an in-memory self-signed certificate. Delegated
//! authentication and authorization are not implemented yet: bind to a private address.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

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

/// Binds and serves until `shutdown`.
pub(crate) async fn start(
    serving: Serving,
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
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else { continue };
            let (acceptor, health, metrics) = (acceptor.clone(), health.clone(), metrics.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |request| {
                    handle(request, health.clone(), metrics.clone())
                });
                // The read timeout needs a timer; without one hyper drops every connection.
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(std::time::Duration::from_secs(5))
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(address)
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
    use super::*;

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
