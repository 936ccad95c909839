//! The fake cloud over HTTP: `POST /cloud` with a JSON [`CloudRequest`], answered with a [`CloudResponse`].

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kube_ccm_provider::CallContext;
use tokio::net::TcpStream;

use crate::cloud::FakeCloud;
use crate::protocol::{CloudRequest, CloudResponse};

/// A fake cloud served on a TCP port; it stops when dropped.
pub struct FakeCloudServer {
    cloud: FakeCloud,
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl FakeCloudServer {
    /// Serves `cloud` on `listen` (port 0 picks one).
    pub async fn start(cloud: FakeCloud, listen: SocketAddr) -> std::io::Result<FakeCloudServer> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let served = cloud.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let cloud = served.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| handle(cloud.clone(), request));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(FakeCloudServer { cloud, url, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cloud, for direct inspection and changes.
    pub fn cloud(&self) -> &FakeCloud {
        &self.cloud
    }
}

impl Drop for FakeCloudServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    cloud: FakeCloud,
    request: http::Request<Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let reply = |status: u16, body: Vec<u8>| {
        let mut response = http::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() =
            http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok(response)
    };
    if request.method() != http::Method::POST || request.uri().path() != "/cloud" {
        return reply(
            404,
            br#"{"answer":"error","message":"POST /cloud only","not_found":false}"#.to_vec(),
        );
    }
    let caller = request
        .headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let response = match serde_json::from_slice::<CloudRequest>(&body) {
        Ok(call) => cloud.handle_as(call, &caller).await,
        Err(error) => CloudResponse::Error {
            message: format!("bad request: {error}"),
            not_found: false,
            throttled: false,
        },
    };
    reply(200, serde_json::to_vec(&response).expect("responses serialise"))
}

/// A client of a [`FakeCloudServer`]. Every call has a connection of its own, reset (`SO_LINGER` 0) when the
/// call ends or is abandoned, so a request given up on is never delivered later.
#[derive(Clone)]
pub struct FakeCloudClient {
    url: String,
    /// `host:port`, from the URL.
    authority: String,
}

impl FakeCloudClient {
    /// A client of the cloud at `url` (`http://host:port`; see [`FakeCloudClient::check_url`]).
    pub fn new(url: &str) -> FakeCloudClient {
        let url = url.trim_end_matches('/').to_owned();
        let authority = url
            .parse::<http::Uri>()
            .ok()
            .and_then(|uri| {
                let host = uri.host()?.to_owned();
                Some(format!("{host}:{}", uri.port_u16().unwrap_or(80)))
            })
            .unwrap_or_else(|| url.trim_start_matches("http://").to_owned());
        FakeCloudClient { url, authority }
    }

    /// The cloud's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether `url` can be a fake cloud's address: `http://host[:port]`, nothing after.
    pub fn check_url(url: &str) -> Result<(), String> {
        let uri: http::Uri = url
            .trim_end_matches('/')
            .parse()
            .map_err(|error| format!("{url:?} is not a URL: {error}"))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none_or(str::is_empty) {
            return Err(format!("{url:?} is not an http://host:port URL"));
        }
        if uri
            .path_and_query()
            .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
        {
            return Err(format!("{url:?} must not have a path"));
        }
        Ok(())
    }

    /// Sends one anonymous call.
    pub async fn call(&self, request: &CloudRequest) -> CloudResponse {
        self.call_as(request, "").await
    }

    /// Sends one call on behalf of `caller` (its `User-Agent`).
    pub async fn call_as(&self, request: &CloudRequest, caller: &str) -> CloudResponse {
        self.send(request, caller, None).await
    }

    /// Sends one call of a controller's, on behalf of the context's caller, on a connection fenced on the
    /// context ([`CallContext::fence`]): not a byte of it is written once its deadline passed.
    pub async fn call_within(&self, request: &CloudRequest, cx: &CallContext) -> CloudResponse {
        self.send(request, cx.caller(), Some(cx)).await
    }

    async fn send(&self, request: &CloudRequest, caller: &str, fence: Option<&CallContext>) -> CloudResponse {
        let error = |message: String| CloudResponse::Error {
            message,
            not_found: false,
            throttled: false,
        };
        let body = serde_json::to_vec(request).expect("requests serialise");
        let mut builder = http::Request::post("/cloud")
            .header(http::header::HOST, self.authority.as_str())
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Ok(agent) = http::HeaderValue::from_str(caller)
            && !caller.is_empty()
        {
            builder = builder.header(http::header::USER_AGENT, agent);
        }
        let http_request = match builder.body(Full::new(Bytes::from(body))) {
            Ok(request) => request,
            Err(e) => {
                return error(format!(
                    "cannot make a request to the fake cloud at {}: {e}",
                    self.url
                ));
            }
        };
        let stream = match TcpStream::connect(&self.authority).await {
            Ok(stream) => stream,
            Err(e) => return error(format!("fake cloud at {} unreachable: {e}", self.url)),
        };
        if let Err(e) = stream.set_nodelay(true).and_then(|()| stream.set_zero_linger()) {
            return error(format!(
                "fake cloud at {}: cannot set up the connection: {e}",
                self.url
            ));
        }
        let answer = match fence {
            Some(cx) => exchange(TokioIo::new(cx.fence(stream)), http_request).await,
            None => exchange(TokioIo::new(stream), http_request).await,
        };
        match answer {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| error(format!("bad answer from the fake cloud: {e}"))),
            Err(e) => {
                // hyper's own message ("operation was canceled") hides why: name every cause.
                let mut message = format!("fake cloud at {}: {e}", self.url);
                let mut cause = std::error::Error::source(&e);
                while let Some(inner) = cause {
                    message.push_str(&format!(": {inner}"));
                    cause = inner.source();
                }
                error(message)
            }
        }
    }
}

/// One request and its answer on a new connection, which is driven here (not by a spawned task), so it ends
/// when this future is dropped.
async fn exchange<I>(io: I, request: http::Request<Full<Bytes>>) -> Result<Bytes, hyper::Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    let answer = async move {
        let response = sender.send_request(request).await?;
        response.into_body().collect().await.map(|body| body.to_bytes())
    };
    let (answer, _closed) = tokio::join!(answer, connection);
    answer
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::Knobs;
    use crate::protocol::AdminRequest;

    fn ensure(name: &str) -> CloudRequest {
        CloudRequest::EnsureLoadBalancer {
            name: name.into(),
            service: "default/web".into(),
            cluster: "k".into(),
            ports: vec![80],
            nodes: vec![],
            ipv6: false,
        }
    }

    async fn writes(client: &FakeCloudClient) -> Vec<crate::CloudWrite> {
        match client
            .call(&CloudRequest::Admin(AdminRequest::Writes { from: 0 }))
            .await
        {
            CloudResponse::Writes { writes } => writes,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn changes_are_logged_with_their_caller_and_an_abandoned_call_changes_nothing() {
        let server = FakeCloudServer::start(FakeCloud::default(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let client = FakeCloudClient::new(server.url());
        let answer = client
            .call_as(&ensure("a"), "ccm/v1 (host_1) service-lb-controller")
            .await;
        assert!(matches!(answer, CloudResponse::LoadBalancer { .. }), "{answer:?}");
        let logged = writes(&client).await;
        assert_eq!(logged.len(), 1);
        assert_eq!(
            (
                logged[0].call.as_str(),
                logged[0].object.as_str(),
                logged[0].caller.as_str()
            ),
            (
                "ensure_load_balancer",
                "a",
                "ccm/v1 (host_1) service-lb-controller"
            )
        );

        // A call given up while the cloud is still working on it: its connection closes, it is not applied.
        server
            .cloud()
            .handle(CloudRequest::Admin(AdminRequest::SetKnobs(Knobs {
                latency_ms: 400,
                ..Knobs::default()
            })))
            .await;
        let abandoned = tokio::time::timeout(Duration::from_millis(50), client.call(&ensure("b"))).await;
        assert!(abandoned.is_err(), "the call should still be in progress");
        // A later call with the same latency is applied after the abandoned one would have been.
        client.call(&ensure("c")).await;
        let objects: Vec<String> = writes(&client).await.into_iter().map(|w| w.object).collect();
        assert_eq!(objects, ["a", "c"]);
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_writes_nothing_to_the_cloud() {
        let server = FakeCloudServer::start(FakeCloud::default(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let client = FakeCloudClient::new(server.url());
        // Not through the guard: the connection's fence alone keeps the request from being sent.
        let late = CallContext::new(
            tokio::time::Instant::now(),
            tokio_util::sync::CancellationToken::new(),
            "ccm/v1 (host_1) service-lb-controller",
        );
        let answer = client.call_within(&ensure("late"), &late).await;
        let CloudResponse::Error { message, .. } = answer else {
            panic!("a late call was answered: {answer:?}");
        };
        assert!(message.contains("past its deadline"), "{message}");
        let on_time = CallContext::with_timeout(Duration::from_secs(30));
        let answer = client.call_within(&ensure("on-time"), &on_time).await;
        assert!(matches!(answer, CloudResponse::LoadBalancer { .. }), "{answer:?}");
        let objects: Vec<String> = writes(&client).await.into_iter().map(|w| w.object).collect();
        assert_eq!(objects, ["on-time"]);
    }
}
