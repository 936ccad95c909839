//! The fake cloud over HTTP: `POST /cloud` with a JSON [`CloudRequest`], answered with a [`CloudResponse`].

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

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
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
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
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let response = match serde_json::from_slice::<CloudRequest>(&body) {
        Ok(call) => cloud.handle(call).await,
        Err(error) => CloudResponse::Error {
            message: format!("bad request: {error}"),
            not_found: false,
        },
    };
    reply(200, serde_json::to_vec(&response).expect("responses serialise"))
}

/// A client of a [`FakeCloudServer`].
#[derive(Clone)]
pub struct FakeCloudClient {
    url: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl FakeCloudClient {
    /// A client of the cloud at `url`.
    pub fn new(url: &str) -> FakeCloudClient {
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        FakeCloudClient {
            url: url.trim_end_matches('/').to_owned(),
            client,
        }
    }

    /// Sends one call.
    pub async fn call(&self, request: &CloudRequest) -> CloudResponse {
        let body = serde_json::to_vec(request).expect("requests serialise");
        let http_request = http::Request::post(format!("{}/cloud", self.url))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid request");
        let response = match self.client.request(http_request).await {
            Ok(response) => response,
            Err(error) => {
                return CloudResponse::Error {
                    message: format!("fake cloud at {} unreachable: {error}", self.url),
                    not_found: false,
                };
            }
        };
        match response.into_body().collect().await {
            Ok(bytes) => {
                serde_json::from_slice(&bytes.to_bytes()).unwrap_or_else(|error| CloudResponse::Error {
                    message: format!("bad answer from the fake cloud: {error}"),
                    not_found: false,
                })
            }
            Err(error) => CloudResponse::Error {
                message: format!("fake cloud answer cut short: {error}"),
                not_found: false,
            },
        }
    }
}
