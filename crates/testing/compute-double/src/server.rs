//! HTTP: routes `/compute/v1/projects/{project}/…` to the state.

use parking_lot::Mutex;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::resources::{ApiError, Collection, ListQuery, MEMBERS, State, fingerprint};

pub(crate) async fn serve(listener: TcpListener, state: Arc<Mutex<State>>, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "compute double: accept failed");
                    continue;
                }
            },
        };
        let state = state.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| handle(state.clone(), request));
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::select! {
                () = stop.cancelled() => {}
                _ = connection => {}
            }
        });
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let arrived_us = crate::now_us();
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let query: Vec<(String, String)> =
        form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let latency = {
        let mut state = state.lock();
        state.log.push(format!("{} {path}", parts.method));
        state.latency
    };
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some(key) = path.strip_prefix("/computeMetadata/v1/") {
        return Ok(metadata(&state, &parts.headers, key));
    }
    let answer = {
        let mut state = state.lock();
        match state.fault(&parts.method, &path) {
            Some(error) => Err(error),
            None => route(&mut state, &parts.method, &path, &query, &body),
        }
    };
    let (status, body) = match answer {
        Ok(value) => (StatusCode::OK, value),
        Err(error) => (
            StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            error.body(),
        ),
    };
    if parts.method != Method::GET {
        let user_agent = parts
            .headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        state.lock().writes.push(crate::Write {
            time_us: arrived_us,
            method: parts.method.to_string(),
            path: path.clone(),
            user_agent,
            status: status.as_u16(),
        });
    }
    let response = Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json; charset=UTF-8")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&body).unwrap_or_default(),
        )))
        .expect("a response");
    Ok(response)
}

/// The metadata server's answer for `key`: its value as text; 403 without `Metadata-Flavor: Google`
/// (as the real server refuses), 404 for a value not set.
fn metadata(state: &Mutex<State>, headers: &http::HeaderMap, key: &str) -> Response<Full<Bytes>> {
    let value = state.lock().metadata.get(key).cloned();
    let (status, text) = if headers.get("metadata-flavor").is_none_or(|v| v != "Google") {
        (
            StatusCode::FORBIDDEN,
            "Missing Metadata-Flavor:Google header.".to_owned(),
        )
    } else {
        match value {
            Some(value) => (StatusCode::OK, value),
            None => (StatusCode::NOT_FOUND, "Not Found".to_owned()),
        }
    };
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/text")
        .header("metadata-flavor", "Google")
        .body(Full::new(Bytes::from(text)))
        .expect("a response")
}

fn route(
    state: &mut State,
    method: &Method,
    path: &str,
    query: &[(String, String)],
    body: &[u8],
) -> Result<Value, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let not_found = || {
        ApiError::new(
            404,
            "notFound",
            format!("The requested URL {path} was not found."),
        )
    };
    let ["compute", "v1", "projects", project, rest @ ..] = segments.as_slice() else {
        return Err(not_found());
    };
    let list_query = || {
        let get = |key: &str| query.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        ListQuery {
            filter: get("filter"),
            max_results: get("maxResults"),
            page_token: get("pageToken"),
        }
    };
    let parse_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::new(400, "parseError", format!("Invalid JSON payload received. {e}")))
    };
    // `global/…`, `zones/Z/…`, `regions/R/…`, `aggregated/…`.
    let (scope, rest): (String, &[&str]) = match rest {
        ["aggregated", collection] if method == Method::GET => {
            let collection = Collection::from_path(collection).ok_or_else(not_found)?;
            return state.aggregated(collection, project, &list_query());
        }
        ["global", rest @ ..] => ("global".to_owned(), rest),
        [kind @ ("zones" | "regions"), place, rest @ ..] => (format!("{kind}/{place}"), rest),
        _ => return Err(not_found()),
    };
    if state.unreachable(project, &scope) {
        return Err(ApiError::new(
            503,
            "backendError",
            format!("{scope} of project {project} cannot be reached"),
        ));
    }
    match rest {
        ["operations", name] if method == Method::GET => state.poll(project, &scope, name),
        // The double has no managed instance groups; gcloud lists them to tell an unmanaged group from
        // a managed one. (An empty list, so no model type is needed.)
        ["instanceGroupManagers"] if method == Method::GET && scope.starts_with("zones/") => {
            let link = format!(
                "{}/projects/{project}/{scope}/instanceGroupManagers",
                "https://www.googleapis.com/compute/v1"
            );
            Ok(
                serde_json::json!({"kind": "compute#instanceGroupManagerList", "id": link, "selfLink": link, "items": []}),
            )
        }
        ["operations", name, "wait"] if method == Method::POST => state.poll(project, &scope, name),
        [collection, more @ ..] => {
            let collection = Collection::from_path(collection).ok_or_else(not_found)?;
            let scope_kind = scope.split('/').next().unwrap_or_default();
            if collection.scope_kind() != scope_kind {
                return Err(not_found());
            }
            match (method, more) {
                (&Method::GET, []) => state.list(collection, project, &scope, &list_query()),
                (&Method::POST, []) if !collection.seeded_only() => {
                    state.insert(collection, project, &scope, parse_body()?, path)
                }
                (&Method::GET, [name]) => state.get(collection, project, &scope, name).ok_or_else(|| {
                    ApiError::not_found(&format!(
                        "projects/{project}/{scope}/{}/{name}",
                        collection.path()
                    ))
                }),
                (&Method::DELETE, [name]) if !collection.seeded_only() => {
                    state.delete(collection, project, &scope, name, path)
                }
                (&Method::PATCH | &Method::PUT, [name])
                    if matches!(
                        collection,
                        Collection::Firewalls
                            | Collection::HttpHealthChecks
                            | Collection::HealthChecks
                            | Collection::BackendServices
                    ) =>
                {
                    let body = parse_body()?;
                    let replace = method == Method::PUT;
                    let key = (collection, project.to_string(), scope.clone(), name.to_string());
                    let seed = state.next_seed();
                    state.update(key, if replace { "update" } else { "patch" }, path, |existing| {
                        if collection == Collection::BackendServices {
                            // As Compute: a write must carry the fingerprint it read; it gets a new one.
                            if body["fingerprint"] != existing["fingerprint"] {
                                return Err(ApiError::new(412, "conditionNotMet", "Invalid fingerprint."));
                            }
                            merge(existing, body, replace)?;
                            existing["fingerprint"] = fingerprint(seed).into();
                            return Ok(());
                        }
                        merge(existing, body, replace)
                    })
                }
                (&Method::POST, [name, action @ ("addInstances" | "removeInstances")])
                    if collection == Collection::InstanceGroups =>
                {
                    let body = parse_body()?;
                    let add = *action == "addInstances";
                    let key = (collection, project.to_string(), scope.clone(), name.to_string());
                    state.update(key, action, path, |group| {
                        change_group_instances(group, &body, add)
                    })
                }
                (&Method::POST, [name, "listInstances"]) if collection == Collection::InstanceGroups => {
                    let members = state.members(project, &scope, name).ok_or_else(|| {
                        ApiError::not_found(&format!("projects/{project}/{scope}/instanceGroups/{name}"))
                    })?;
                    let items: Vec<Value> = members
                        .iter()
                        .map(|m| serde_json::json!({"instance": m, "status": "RUNNING"}))
                        .collect();
                    let list: google_cloud_compute_v1::model::InstanceGroupsListInstances =
                        serde_json::from_value(serde_json::json!({
                            "kind": "compute#instanceGroupsListInstances",
                            "id": format!("projects/{project}/{scope}/instanceGroups/{name}"),
                            "items": items,
                        }))
                        .expect("a model-shaped list");
                    Ok(serde_json::to_value(list).expect("it serialises"))
                }
                (&Method::POST, [name, action @ ("addInstance" | "removeInstance")])
                    if collection == Collection::TargetPools =>
                {
                    let body = parse_body()?;
                    let add = *action == "addInstance";
                    let key = (collection, project.to_string(), scope.clone(), name.to_string());
                    state.update(key, action, path, |pool| change_pool_instances(pool, &body, add))
                }
                _ => Err(not_found()),
            }
        }
        [] => Err(not_found()),
    }
}

/// `patch` (the body's fields replace the resource's) or `update` (the body replaces the resource); the
/// name and the server's fields stay.
fn merge(existing: &mut Value, body: Value, replace: bool) -> Result<(), ApiError> {
    let Value::Object(fields) = body else {
        return Err(ApiError::new(400, "parseError", "Invalid JSON payload received."));
    };
    if fields.get("name").is_some_and(|n| *n != existing["name"]) {
        return Err(ApiError::new(
            400,
            "invalid",
            "Invalid value for field 'resource.name': the name cannot change.",
        ));
    }
    let object = existing.as_object_mut().expect("resources are objects");
    if replace {
        let kept = ["kind", "id", "name", "selfLink", "creationTimestamp"];
        object.retain(|k, _| kept.contains(&k.as_str()));
    }
    for (key, value) in fields {
        if !["kind", "id", "selfLink", "creationTimestamp"].contains(&key.as_str()) {
            object.insert(key, value);
        }
    }
    Ok(())
}

/// `addInstances`/`removeInstances` of an unmanaged instance group: `{"instances": [{"instance": URL},
/// …]}`, compared by `projects/…` path. Adding a member is refused as Compute does
/// (`memberAlreadyExists`); removing one that is not a member changes nothing.
fn change_group_instances(group: &mut Value, body: &Value, add: bool) -> Result<(), ApiError> {
    fn key(url: &str) -> &str {
        url.find("projects/").map_or(url, |i| &url[i..])
    }
    let requested: Vec<String> = body["instances"]
        .as_array()
        .ok_or_else(|| ApiError::new(400, "required", "Required field 'instances' not specified"))?
        .iter()
        .filter_map(|i| i["instance"].as_str().map(str::to_owned))
        .collect();
    let mut members: Vec<String> = group[MEMBERS]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    for url in requested {
        let present = members.iter().position(|m| key(m) == key(&url));
        match (add, present) {
            (true, None) => members.push(format!("https://www.googleapis.com/compute/v1/{}", key(&url))),
            (true, Some(_)) => {
                return Err(ApiError::new(
                    400,
                    "memberAlreadyExists",
                    format!(
                        "The resource '{}' is already a member of the instance group",
                        key(&url)
                    ),
                ));
            }
            (false, Some(at)) => {
                members.remove(at);
            }
            (false, None) => {}
        }
    }
    group["size"] = members.len().into();
    group[MEMBERS] = members.into();
    Ok(())
}

/// `addInstance`/`removeInstance`: `{"instances": [{"instance": URL}, …]}`. Instances are compared by
/// their `projects/…` path, so full URLs and partial ones name the same instance.
fn change_pool_instances(pool: &mut Value, body: &Value, add: bool) -> Result<(), ApiError> {
    fn key(url: &str) -> &str {
        url.find("projects/").map_or(url, |i| &url[i..])
    }
    let requested: Vec<String> = body["instances"]
        .as_array()
        .ok_or_else(|| ApiError::new(400, "required", "Required field 'instances' not specified"))?
        .iter()
        .filter_map(|i| i["instance"].as_str().map(str::to_owned))
        .collect();
    let mut instances: Vec<String> = pool["instances"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    for url in requested {
        let present = instances.iter().position(|i| key(i) == key(&url));
        match (add, present) {
            (true, None) => instances.push(url),
            (false, Some(at)) => {
                instances.remove(at);
            }
            (true, Some(_)) => {
                return Err(ApiError::new(
                    400,
                    "invalid",
                    format!(
                        "The resource '{}' is already a member of the target pool",
                        key(&url)
                    ),
                ));
            }
            (false, None) => {}
        }
    }
    pool["instances"] = instances.into();
    Ok(())
}
