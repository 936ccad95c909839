//! The per-request pipeline and the accept loop.
//!
//! Every request to `/api`, `/apis`, `/version`, `/healthz`, `/openapi` goes through: faults (a
//! partitioned client hangs here) → authentication → routing → authorisation → the handler → the request
//! log. `/_admin/*` bypasses all of it, so it is served only when asked for ([`crate::Config::admin`]) and
//! only to loopback callers.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::net::TcpListener;

use crate::auth::{Attributes, Review, authorize};
use crate::observe::{RequestRecord, format_us};
use crate::request::{ApiRequest, parse_target, verb};
use crate::selectors::FieldSelector;
use crate::state::State;
use crate::status::ApiError;
use crate::wire::{Body, Query, Reply};
use crate::{admin, discovery, verbs};
use bytes::Bytes;
use serde_json::Value;

/// Accepts connections until the task is aborted. Accept errors (out of descriptors) are retried after a
/// pause, not in a busy loop.
pub(crate) async fn serve(state: Arc<State>, listener: TcpListener, tls: Option<tokio_rustls::TlsAcceptor>) {
    let mut pause = std::time::Duration::ZERO;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                pause = std::time::Duration::ZERO;
                accepted
            }
            Err(_) => {
                pause = (pause * 2).clamp(
                    std::time::Duration::from_millis(5),
                    std::time::Duration::from_secs(1),
                );
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve_connection(state, stream, peer).await;
                    }
                }
                None => serve_connection(state, stream, peer).await,
            }
        });
    }
}

async fn serve_connection<Io>(state: Arc<State>, io: Io, peer: std::net::SocketAddr)
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| entry(state.clone(), request, peer));
    let connection = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    // A client that goes away mid-request is normal here (timeouts, killed processes).
    let _ = connection.await;
}

async fn entry(
    state: Arc<State>,
    request: Request<Incoming>,
    peer: std::net::SocketAddr,
) -> Result<Response<Body>, Infallible> {
    if request.uri().path().starts_with("/_admin/") {
        let reply = if !state.settings.admin {
            admin::error(404, "the admin API is off (start the server with --admin)")
        } else if !peer.ip().is_loopback() {
            admin::error(
                403,
                &format!("the admin API answers loopback callers only, not {}", peer.ip()),
            )
        } else {
            admin::handle(&state, request).await
        };
        return Ok(reply.into_response());
    }
    let started = Instant::now();
    let user_agent = request
        .headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();

    // Recorded as 499 if the client goes away before the answer: the request's future is dropped then,
    // before anything of it was applied (a write is applied whole, with no pause, once its body is read).
    let mut pending = Pending {
        state: state.clone(),
        started,
        answered: false,
        record: RequestRecord {
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
            query: request.uri().query().unwrap_or_default().to_owned(),
            user_agent: user_agent.clone(),
            ..RequestRecord::default()
        },
    };

    let verdict = state.faults.lock().verdict(&user_agent, rand::random::<f64>);
    if verdict.hang {
        // A partition: the client's request never reaches the server (nor its record); it hangs until the
        // client drops it.
        pending.answered = true;
        std::future::pending::<()>().await;
    }
    if !verdict.delay.is_zero() {
        tokio::time::sleep(verdict.delay).await;
    }

    let reply = match verdict.error {
        Some((429, retry_after)) => Reply::error(&ApiError::too_many_requests(retry_after)),
        Some((503, retry_after)) => Reply::error(&ApiError::service_unavailable(retry_after)),
        Some((_, _)) => Reply::error(&ApiError::internal("injected fault")),
        None => match handle(&state, request, &user_agent, &mut pending.record).await {
            Ok(reply) => reply,
            Err(error) => Reply::error(&error),
        },
    };
    pending.record.resource_version = reply.resource_version;
    pending.answer(reply.status);
    Ok(reply.into_response())
}

/// A request being served, recorded with its answer's status, or as 499 (its client closed it) if dropped
/// before its answer.
struct Pending {
    state: Arc<State>,
    started: Instant,
    record: RequestRecord,
    answered: bool,
}

impl Pending {
    fn answer(&mut self, status: u16) {
        self.answered = true;
        let mut record = std::mem::take(&mut self.record);
        let now = self.state.clock.now_us();
        record.time_us = now;
        record.time = format_us(now, 6);
        record.status = status;
        record.latency_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.state.logs.lock().record_request(record);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.answered {
            self.answer(499);
        }
    }
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
    let user = state
        .auth
        .lock()
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
    // `Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`: a single object's answer is
    // reduced to its metadata, as the real server's `transformResponseObject` does.
    let metadata_only = request
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| {
            accept
                .split(';')
                .any(|parameter| parameter.trim() == "as=PartialObjectMetadata")
        });
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
            let store = state.store.lock();
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

    // Reviews: created and answered, never stored.
    let review = match segments.as_slice() {
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] => {
            Some((Review::Token, "authentication.k8s.io", "tokenreviews"))
        }
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] => Some((
            Review::SubjectAccess,
            "authorization.k8s.io",
            "subjectaccessreviews",
        )),
        ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"] => Some((
            Review::SelfSubjectAccess,
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
        )),
        _ => None,
    };
    if let Some((kind, group, plural)) = review {
        if method != Method::POST {
            return Err(ApiError::method_not_allowed(method.as_str(), &path));
        }
        if content_type.starts_with("application/vnd.kubernetes.protobuf") {
            return Err(ApiError::unsupported_media_type(&content_type));
        }
        record.verb = Some("create".to_owned());
        record.resource = Some(format!("{plural}.{group}"));
        if let Some(user) = &user {
            let store = state.store.lock();
            authorize(
                &store,
                user,
                &Attributes::Resource {
                    verb: "create",
                    group,
                    resource: plural,
                    subresource: None,
                    namespace: None,
                    name: None,
                },
            )
            .map_err(ApiError::forbidden)?;
        }
        let body = read_body(request).await;
        let body: Value = serde_json::from_slice(&body)
            .map_err(|error| ApiError::bad_request(format!("the body is not JSON: {error}")))?;
        let answer = {
            let auth = state.auth.lock();
            let store = state.store.lock();
            crate::auth::review(&auth, &store, kind, &body, user.as_ref()).map_err(ApiError::bad_request)?
        };
        return Ok(Reply::json(201, &answer));
    }

    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::path_not_found(&path)),
    };
    let target = parse_target(group, version, rest).ok_or_else(|| ApiError::path_not_found(&path))?;
    let verb =
        verb(&method, &target, &query).ok_or_else(|| ApiError::method_not_allowed(method.as_str(), &path))?;
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
        let store = state.store.lock();
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

    let body = read_body(request).await;
    let reply = verbs::handle(
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
    .await?;
    if metadata_only
        && matches!(verb, "get" | "create" | "update" | "patch")
        && (200..300).contains(&reply.status)
    {
        return Ok(reply.metadata_only().await);
    }
    Ok(reply)
}

/// The request's body; a body that breaks off reads as empty (and then fails to decode).
async fn read_body(request: Request<Incoming>) -> Bytes {
    request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default()
}
