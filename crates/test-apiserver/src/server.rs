//! HTTP plumbing: shared state, the per-request pipeline, and replies.
//!
//! Every request to `/api`, `/apis`, `/version`, `/healthz`, `/openapi` goes through: faults (a
//! partitioned client hangs here) → authentication → routing → authorisation → the handler → the request
//! log. `/_admin/*` bypasses all of it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use tokio::net::TcpListener;

use crate::api::{self, ApiRequest};
use crate::auth::{Attributes, Auth, authorize};
use crate::faults::Faults;
use crate::observe::{Clock, Logs, RequestRecord, format_us};
use crate::selectors::FieldSelector;
use crate::status::ApiError;
use crate::store::Store;
use crate::{admin, discovery};

pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// Asks open watches to end: all of them, or those of clients whose `User-Agent` contains a pattern.
#[derive(Debug, Clone, Default)]
pub(crate) struct CloseWatches {
    pub(crate) generation: u64,
    pub(crate) user_agent: Option<String>,
}

/// Tunables.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) bookmark_interval: Duration,
}

/// Everything the server shares between requests.
pub(crate) struct State {
    pub(crate) store: Mutex<Store>,
    pub(crate) logs: Mutex<Logs>,
    pub(crate) faults: Mutex<Faults>,
    pub(crate) auth: Mutex<Auth>,
    pub(crate) clock: Clock,
    pub(crate) address: SocketAddr,
    pub(crate) close_watches: tokio::sync::watch::Sender<CloseWatches>,
    pub(crate) settings: Settings,
}

/// Locks a mutex, ignoring poisoning: a panicking handler must not take the server down with it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A response before it becomes HTTP.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Body,
    pub(crate) resource_version: Option<u64>,
    pub(crate) retry_after: Option<u64>,
}

impl Reply {
    pub(crate) fn json(status: u16, value: &Value) -> Reply {
        Reply::bytes(
            status,
            Bytes::from(serde_json::to_vec(value).expect("JSON values serialise")),
        )
    }

    pub(crate) fn bytes(status: u16, bytes: Bytes) -> Reply {
        Reply {
            status,
            body: full(bytes),
            resource_version: None,
            retry_after: None,
        }
    }

    pub(crate) fn error(error: &ApiError) -> Reply {
        let mut reply = Reply::json(error.code, &error.to_status());
        reply.retry_after = error.retry_after_seconds;
        reply
    }

    fn into_response(self) -> Response<Body> {
        let mut response = Response::new(self.body);
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

pub(crate) fn full(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed()
}

/// Query parameters, percent-decoded.
#[derive(Debug, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(raw: &str) -> Query {
        Query(
            raw.split('&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    (percent_decode(key), percent_decode(value))
                })
                .collect(),
        )
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub(crate) fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("1" | "true" | "True"))
    }
}

pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' if index + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[index + 1..index + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        index += 3;
                    }
                    None => {
                        out.push(b'%');
                        index += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                index += 1;
            }
            byte => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Accepts connections until the task is aborted.
pub(crate) async fn serve(state: Arc<State>, listener: TcpListener, tls: Option<tokio_rustls::TlsAcceptor>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve_connection(state, stream).await;
                    }
                }
                None => serve_connection(state, stream).await,
            }
        });
    }
}

async fn serve_connection<Io>(state: Arc<State>, io: Io)
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| entry(state.clone(), request));
    let connection = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    // A client that goes away mid-request is normal here (timeouts, killed processes).
    let _ = connection.await;
}

async fn entry(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if request.uri().path().starts_with("/_admin/") {
        return Ok(admin::handle(&state, request).await.into_response());
    }
    let started = Instant::now();
    let user_agent = request
        .headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();

    let verdict = lock(&state.faults).verdict(&user_agent, rand::random::<f64>);
    if verdict.hang {
        // A partition: the client's request never reaches the server; it hangs until the client drops it.
        std::future::pending::<()>().await;
    }
    if !verdict.delay.is_zero() {
        tokio::time::sleep(verdict.delay).await;
    }

    let mut record = RequestRecord {
        seq: 0,
        time: String::new(),
        time_us: 0,
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
        query: request.uri().query().unwrap_or_default().to_owned(),
        user_agent: user_agent.clone(),
        user: None,
        verb: None,
        resource: None,
        subresource: None,
        namespace: None,
        name: None,
        status: 0,
        latency_ms: 0.0,
        resource_version: None,
    };
    let reply = match verdict.error {
        Some((429, retry_after)) => Reply::error(&ApiError::too_many_requests(retry_after)),
        Some((503, retry_after)) => Reply::error(&ApiError::service_unavailable(retry_after)),
        Some((_, _)) => Reply::error(&ApiError::internal("injected fault")),
        None => match handle(&state, request, &user_agent, &mut record).await {
            Ok(reply) => reply,
            Err(error) => Reply::error(&error),
        },
    };
    let now = state.clock.now_us();
    record.time_us = now;
    record.time = format_us(now, 6);
    record.status = reply.status;
    record.latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    record.resource_version = reply.resource_version;
    lock(&state.logs).record_request(record);
    Ok(reply.into_response())
}

async fn handle(
    state: &Arc<State>,
    request: Request<Incoming>,
    user_agent: &str,
    record: &mut RequestRecord,
) -> Result<Reply, ApiError> {
    let authorization = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let user = lock(&state.auth)
        .authenticate(authorization.as_deref())
        .map_err(|()| ApiError::unauthorized())?;
    record.user = user.as_ref().map(|u| u.name.clone());
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = Query::parse(request.uri().query().unwrap_or_default());
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let segments: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();

    // Non-resource paths: discovery, version, health, OpenAPI.
    let non_resource = match segments.as_slice() {
        ["version"] => Some(discovery::version()),
        ["healthz" | "livez" | "readyz", ..] => Some(Value::String("ok".to_owned())),
        ["api"] => Some(discovery::core_versions(&state.address.to_string())),
        ["api", version] => {
            Some(discovery::resource_list("", version).ok_or_else(|| ApiError::path_not_found(&path))?)
        }
        ["apis"] => Some(discovery::group_list()),
        ["apis", group] => Some(discovery::group(group).ok_or_else(|| ApiError::path_not_found(&path))?),
        ["apis", group, version] => {
            Some(discovery::resource_list(group, version).ok_or_else(|| ApiError::path_not_found(&path))?)
        }
        ["openapi", "v3"] => Some(discovery::openapi_index()),
        ["openapi", "v3", "api", version] => {
            Some(discovery::openapi_document("", version).ok_or_else(|| ApiError::path_not_found(&path))?)
        }
        ["openapi", "v3", "apis", group, version] => {
            Some(discovery::openapi_document(group, version).ok_or_else(|| ApiError::path_not_found(&path))?)
        }
        ["openapi", ..] => return Err(ApiError::path_not_found(&path)),
        _ => None,
    };
    if let Some(document) = non_resource {
        if method != Method::GET && method != Method::HEAD {
            return Err(ApiError::method_not_allowed(method.as_str(), &path));
        }
        if let Some(user) = &user {
            let store = lock(&state.store);
            authorize(
                &store,
                user,
                &Attributes::NonResource {
                    verb: "get",
                    path: &path,
                },
            )
            .map_err(ApiError::forbidden)?;
        }
        return Ok(match document {
            Value::String(text) => Reply::bytes(200, Bytes::from(text)),
            document => Reply::json(200, &document),
        });
    }

    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::path_not_found(&path)),
    };
    let target = api::parse_target(group, version, rest).ok_or_else(|| ApiError::path_not_found(&path))?;
    let verb = api::verb(&method, &target, &query)
        .ok_or_else(|| ApiError::method_not_allowed(method.as_str(), &path))?;
    let resource = target.resource();
    record.verb = Some(verb.to_owned());
    record.resource = Some(resource.qualified());
    record.subresource = target.subresource.clone();
    record.namespace = target.namespace.clone();
    record.name = target.name.clone();

    if let Some(user) = &user {
        // List and watch pinned to one name by a field selector are authorised for that name.
        let pinned = if matches!(verb, "list" | "watch") {
            FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), resource).ok()
        } else {
            None
        };
        let pinned = pinned.as_ref().and_then(FieldSelector::pinned_name);
        let store = lock(&state.store);
        authorize(
            &store,
            user,
            &Attributes::Resource {
                verb,
                group: resource.group,
                resource: resource.plural,
                subresource: target.subresource.as_deref(),
                namespace: target.namespace.as_deref(),
                name: target.name.as_deref().or(pinned),
            },
        )
        .map_err(ApiError::forbidden)?;
    }

    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    api::handle(
        state,
        ApiRequest {
            target,
            verb,
            query: &query,
            body,
            content_type: &content_type,
            user_agent,
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing_decodes_percent_escapes() {
        let query = Query::parse("labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=1&empty=");
        assert_eq!(query.get("labelSelector"), Some("app=web,tier in (a)"));
        assert!(query.flag("watch"));
        assert_eq!(query.get("empty"), Some(""));
        assert_eq!(percent_decode("system%3A%3Aleader"), "system::leader");
        assert_eq!(percent_decode("bad%zz%"), "bad%zz%");
    }
}
