//! The SDK's HTTP client: a connection per request, fenced on the cloud call it is part of, sent when the
//! process's cloud budget gives the call its turn ([`CallContext::acquire`]).
//!
//! The SDK's own client pools connections and drives them in tasks of its own, so the framework's guard
//! (which drops a call's future at its deadline) cannot reach them: a request handed to a pooled
//! connection just before a freeze or a partition can still leave after the lock has passed to another
//! process. Here every request opens its own connection, with `SO_LINGER` 0, wrapped in
//! [`CallContext::fence`] for the call the request is part of ([`CallContext::current`]): every read and
//! write fails from its deadline on, and the connection is driven inside the request's own future, so
//! when the guard drops that future the socket is reset and the kernel discards what it had not sent.
//!
//! **Cost:** a TCP (and TLS) handshake per request, no connection reuse. The provider batches its reads
//! (one `DescribeInstances` answers up to 200 nodes; 16 initialise 1,000), so that is little next to
//! never acting without the lock. A request outside any cloud call (none of the controllers' are) gets a
//! connection of its own too, unfenced, bounded by the SDK's timeouts.

use std::sync::Arc;
use std::time::Duration;

use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::body::SdkBody;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use kube_ccm_provider::CallContext;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Connecting gives up after this long when the SDK names no connect timeout.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The fenced HTTP client (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct FencedHttpClient {
    /// TLS for `https://` endpoints: the system's CA certificates, or why there are none.
    tls: Result<Arc<rustls::ClientConfig>, String>,
}

impl FencedHttpClient {
    /// A client trusting the system's CA certificates (as the SDK's own rustls client does).
    pub(crate) fn new() -> FencedHttpClient {
        FencedHttpClient { tls: tls_config() }
    }
}

/// TLS trusting the system's CA certificates.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(format!(
            "no CA certificate in the system's store to check AWS endpoints with{}",
            found
                .errors
                .first()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        ));
    }
    trusting(roots)
}

/// TLS (ring, HTTP/1.1) trusting `roots`.
fn trusting(roots: rustls::RootCertStore) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

impl HttpClient for FencedHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(FencedConnector {
            tls: self.tls.clone(),
            connect_timeout: settings.connect_timeout().unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        })
    }
}

#[derive(Debug, Clone)]
struct FencedConnector {
    tls: Result<Arc<rustls::ClientConfig>, String>,
    connect_timeout: Duration,
}

impl HttpConnector for FencedConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        // Read here, in the task of the call that sends the request (the SDK calls its connector there).
        let call = CallContext::current();
        let connector = self.clone();
        HttpConnectorFuture::new(async move { connector.send(request, call).await })
    }
}

impl FencedConnector {
    async fn send(
        &self,
        request: HttpRequest,
        call: Option<CallContext>,
    ) -> Result<HttpResponse, ConnectorError> {
        let request = request
            .try_into_http1x()
            .map_err(|e| ConnectorError::user(e.into()))?;
        let uri = request.uri();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(ConnectorError::user(format!("{uri}: not an http(s) URL").into())),
        };
        let Some(host) = uri.host().map(|h| h.trim_matches(['[', ']']).to_owned()) else {
            return Err(ConnectorError::user(format!("{uri}: no host").into()));
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let request = origin_form(request)?;
        if let Some(call) = &call {
            // Each request the SDK sends (each attempt of a retried one) takes a turn of the process's
            // budget: what the account's rate limit counts.
            call.acquire()
                .await
                .map_err(|e| ConnectorError::timeout(Box::new(e)))?;
        }
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect((host.as_str(), port)))
            .await
            .map_err(|_| {
                ConnectorError::timeout(
                    format!("connecting to {host}:{port} took over {:?}", self.connect_timeout).into(),
                )
            })?
            .map_err(|e| ConnectorError::io(e.into()))?;
        stream
            .set_nodelay(true)
            .and_then(|()| stream.set_zero_linger())
            .map_err(|e| ConnectorError::io(e.into()))?;
        match call {
            Some(call) => self.secure(https, &host, call.fence(stream), request).await,
            None => self.secure(https, &host, stream, request).await,
        }
    }

    /// TLS over `stream` for `https`, then the exchange.
    async fn secure<S>(
        &self,
        https: bool,
        host: &str,
        stream: S,
        request: http::Request<SdkBody>,
    ) -> Result<HttpResponse, ConnectorError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if !https {
            return exchange(stream, request).await;
        }
        let tls = self
            .tls
            .clone()
            .map_err(|why| ConnectorError::other(why.into(), None))?;
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| ConnectorError::user(format!("{host}: {e}").into()))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, stream)
            .await
            .map_err(|e| ConnectorError::io(e.into()))?;
        exchange(stream, request).await
    }
}

/// `request` as sent on a connection of its own: the target in origin form (the path), and the `Host`
/// header the URI's authority, exactly as SigV4 signed it (hyper's connection-level client adds none).
fn origin_form(request: http::Request<SdkBody>) -> Result<http::Request<SdkBody>, ConnectorError> {
    let (mut parts, body) = request.into_parts();
    if let Some(authority) = parts.uri.authority() {
        let host =
            http::HeaderValue::from_str(authority.as_str()).map_err(|e| ConnectorError::user(e.into()))?;
        parts.headers.entry(http::header::HOST).or_insert(host);
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = path
        .parse()
        .map_err(|e: http::uri::InvalidUri| ConnectorError::user(e.into()))?;
    Ok(http::Request::from_parts(parts, body))
}

/// One request and its whole answer over `stream`, the connection driven here (not by a spawned task), so
/// that nothing of it outlives this future.
async fn exchange<S>(stream: S, request: http::Request<SdkBody>) -> Result<HttpResponse, ConnectorError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = |e: hyper::Error| {
        if e.is_timeout() {
            ConnectorError::timeout(e.into())
        } else {
            ConnectorError::io(e.into())
        }
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io)?;
    let answer = async move {
        let response = sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        // `sender` is dropped here: the connection then ends.
        Ok::<_, hyper::Error>(http::Response::from_parts(parts, SdkBody::from(body)))
    };
    let (answer, _closed) = tokio::join!(answer, connection);
    HttpResponse::try_from(answer.map_err(io)?).map_err(|e| ConnectorError::other(e.into(), None))
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;
    use std::net::TcpListener;
    use std::sync::mpsc;

    use kube_ccm_provider::CloudError;

    use super::*;

    /// What a peer could read, and how the reading ended (`None`: the sender closed the connection in
    /// order).
    type Received = (usize, Option<std::io::ErrorKind>);

    /// A peer that accepts one connection and reads nothing until told to; its port, the word to go, and
    /// what it then received.
    fn silent_peer() -> (u16, mpsc::Sender<()>, std::thread::JoinHandle<Received>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (go, wait) = mpsc::channel::<()>();
        let peer = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            wait.recv().unwrap();
            let mut received = 0;
            let mut buffer = vec![0; 1 << 16];
            loop {
                match stream.read(&mut buffer) {
                    Ok(0) => return (received, None),
                    Ok(n) => received += n,
                    Err(e) => return (received, Some(e.kind())),
                }
            }
        });
        (port, go, peer)
    }

    fn request(port: u16, body: Vec<u8>) -> HttpRequest {
        let request = http::Request::post(format!("http://127.0.0.1:{port}/"))
            .header(http::header::CONTENT_LENGTH, body.len())
            .body(SdkBody::from(body))
            .unwrap();
        HttpRequest::try_from(request).unwrap()
    }

    #[test]
    fn requests_go_out_in_origin_form_with_the_signed_host() {
        let check = |uri: &str, host: Option<&str>, expected: (&str, &str)| {
            let mut request = http::Request::get(uri);
            if let Some(host) = host {
                request = request.header(http::header::HOST, host);
            }
            let sent = origin_form(request.body(SdkBody::empty()).unwrap()).unwrap();
            assert_eq!(
                (
                    sent.uri().to_string().as_str(),
                    sent.headers()[http::header::HOST].to_str().unwrap()
                ),
                expected,
                "{uri}"
            );
        };
        check("http://127.0.0.1:4566/", None, ("/", "127.0.0.1:4566"));
        check(
            "https://ec2.us-east-1.amazonaws.com",
            None,
            ("/", "ec2.us-east-1.amazonaws.com"),
        );
        check("https://elb.example/a/b?x=1", None, ("/a/b?x=1", "elb.example"));
        check(
            "http://127.0.0.1:4566/",
            Some("signed.example"),
            ("/", "signed.example"),
        );
    }

    /// An HTTPS server with a certificate for `localhost` only, answering each request with its `Host`.
    async fn https_server(cert: &rcgen::CertifiedKey<rcgen::KeyPair>) -> u16 {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert.cert.der().clone()], key)
                .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service =
                        hyper::service::service_fn(|request: http::Request<hyper::body::Incoming>| {
                            let host = request.headers()[http::header::HOST].as_bytes().to_vec();
                            async move {
                                Ok::<_, std::convert::Infallible>(http::Response::new(
                                    http_body_util::Full::new(bytes::Bytes::from(host)),
                                ))
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn https_endpoints_are_checked_against_the_trusted_roots() {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let port = https_server(&cert).await;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.cert.der().clone()).unwrap();
        let connector = FencedConnector {
            tls: trusting(roots),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        };
        let get = |uri: String| {
            HttpRequest::try_from(http::Request::get(uri).body(SdkBody::empty()).unwrap()).unwrap()
        };
        let cx = CallContext::with_timeout(Duration::from_secs(10));
        let response = cx
            .guard(async {
                connector
                    .call(get(format!("https://localhost:{port}/")))
                    .await
                    .map_err(|e| CloudError::provider(format!("{e:?}")))
            })
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(
            response.body().bytes(),
            Some(format!("localhost:{port}").as_bytes())
        );
        // The certificate names `localhost`, not 127.0.0.1: refused.
        let refused = connector.call(get(format!("https://127.0.0.1:{port}/"))).await;
        assert!(refused.is_err(), "{refused:?}");
        // With the system's roots only, the self-signed certificate is not trusted.
        let system = FencedConnector {
            tls: tls_config(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        };
        if system.tls.is_ok() {
            let refused = system.call(get(format!("https://localhost:{port}/"))).await;
            assert!(refused.is_err(), "{refused:?}");
        }
    }

    #[tokio::test]
    async fn a_request_still_queued_at_its_deadline_is_reset_not_delivered() {
        let (port, go, peer) = silent_peer();
        let connector = FencedConnector {
            tls: tls_config(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        };
        // More than the kernel buffers between two loopback sockets: the tail waits in the send queue.
        let length = 64 << 20;
        let cx = CallContext::with_timeout(Duration::from_millis(300));
        let outcome = cx
            .guard(async {
                connector
                    .call(request(port, vec![b'x'; length]))
                    .await
                    .map_err(|e| CloudError::provider(e.to_string()))
            })
            .await;
        assert!(matches!(outcome, Err(CloudError::Timeout)), "{outcome:?}");
        // The peer reads now, as a partition heals: only what had reached it, then the reset.
        go.send(()).unwrap();
        let (received, ended) = peer.join().unwrap();
        assert!(
            received < length,
            "all {received} bytes were delivered after the deadline"
        );
        assert_eq!(ended, Some(std::io::ErrorKind::ConnectionReset));
    }
}
