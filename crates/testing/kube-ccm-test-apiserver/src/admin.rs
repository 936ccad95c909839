//! The admin API under `/_admin/`, outside `/api` and `/apis`: see and break the server.
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `GET /_admin/requests?since=SEQ` | | request log, JSON lines |
//! | `GET /_admin/leases?since=SEQ` | | Lease write history, JSON lines |
//! | `GET /_admin/counters` | | `{"<verb> <resource>": count}` |
//! | `GET /_admin/faults` | | active faults |
//! | `POST /_admin/faults` | `FaultSpec` | `{"id": N}` (a partition also ends the client's open watches) |
//! | `DELETE /_admin/faults[/ID]` | | removes one fault or all |
//! | `POST /_admin/watches/close` | `{"user_agent": PATTERN?}` | ends open watches now |
//! | `POST /_admin/compact` | | forgets watch history: older resourceVersions get 410 |
//! | `PUT /_admin/rbac` | `{"enabled": bool}` | RBAC mode on or off |
//! | `POST /_admin/tokens` | `UserInfo` | `{"token": …}` |
//! | `POST /_admin/serviceaccounts/NS/NAME/token` | | `{"token": …}` for that service account |

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::auth::UserInfo;
use crate::faults::{FaultAction, FaultSpec};
use crate::observe::Since;
use crate::state::State;
use crate::wire::{Query, Reply};

fn json_lines<T: Serialize>(records: impl Iterator<Item = T>) -> Reply {
    let mut body = Vec::new();
    for record in records {
        serde_json::to_writer(&mut body, &record).expect("records serialise");
        body.push(b'\n');
    }
    Reply::bytes(200, Bytes::from(body))
}

/// The records asked for, or 410 when some of them were dropped: a reader (an audit) must not get a log
/// with a silent gap.
fn kept_or_gone<T: Serialize>(what: &str, records: Since<'_, T>) -> Reply {
    match records {
        Since::Kept(records) => json_lines(records.into_iter()),
        Since::Dropped { first_kept } => error(
            410,
            &format!(
                "the oldest {what} were dropped (the log keeps the most recent ones; the first kept is number {first_kept}); start the server with a larger --log-limit"
            ),
        ),
    }
}

/// An error as a `v1` Status (so Kubernetes clients read its message), with the message under `error` too.
pub(crate) fn error(code: u16, message: &str) -> Reply {
    Reply::json(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "message": message, "error": message}),
    )
}

async fn body<T: DeserializeOwned>(request: Request<Incoming>) -> Result<T, Reply> {
    let bytes = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let bytes = if bytes.is_empty() {
        Bytes::from_static(b"{}")
    } else {
        bytes
    };
    serde_json::from_slice(&bytes).map_err(|e| error(400, &format!("invalid body: {e}")))
}

pub(crate) async fn handle(state: &Arc<State>, request: Request<Incoming>) -> Reply {
    let path = request
        .uri()
        .path()
        .trim_start_matches("/_admin/")
        .trim_end_matches('/')
        .to_owned();
    let query = Query::parse(request.uri().query().unwrap_or_default());
    let since = query
        .get("since")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    let segments: Vec<&str> = path.split('/').collect();
    match (request.method().clone(), segments.as_slice()) {
        (Method::GET, ["healthz"]) => Reply::bytes(200, Bytes::from_static(b"ok")),
        (Method::GET, ["requests"]) => {
            let logs = state.logs.lock();
            kept_or_gone("requests", logs.requests_since(since))
        }
        (Method::GET, ["leases"]) => {
            let logs = state.logs.lock();
            kept_or_gone("lease writes", logs.leases_since(since))
        }
        (Method::GET, ["counters"]) => {
            let logs = state.logs.lock();
            let mut counters = json!(logs.counters);
            counters["dropped requests"] = json!(logs.dropped_requests);
            counters["dropped lease writes"] = json!(logs.dropped_leases);
            Reply::json(200, &counters)
        }
        (Method::GET, ["faults"]) => {
            let faults: Vec<Value> = state
                .faults
                .lock()
                .list()
                .into_iter()
                .map(|(id, spec)| json!({"id": id, "spec": spec}))
                .collect();
            Reply::json(200, &Value::Array(faults))
        }
        (Method::POST, ["faults"]) => match body::<FaultSpec>(request).await {
            Ok(spec) => {
                let partition = (spec.action == FaultAction::Partition).then(|| spec.user_agent.clone());
                let id = state.faults.lock().add(spec);
                if let Some(pattern) = partition {
                    state.end_watches(pattern);
                }
                Reply::json(200, &json!({"id": id}))
            }
            Err(reply) => reply,
        },
        (Method::DELETE, ["faults"]) => {
            state.faults.lock().clear();
            Reply::json(200, &json!({}))
        }
        (Method::DELETE, ["faults", id]) => match id.parse::<u64>() {
            Ok(id) if state.faults.lock().remove(id) => Reply::json(200, &json!({})),
            _ => error(404, "no such fault"),
        },
        (Method::POST, ["watches", "close"]) => match body::<CloseRequest>(request).await {
            Ok(close) => {
                state.end_watches(close.user_agent);
                Reply::json(200, &json!({}))
            }
            Err(reply) => reply,
        },
        (Method::POST, ["compact"]) => {
            state.store.lock().compact();
            Reply::json(200, &json!({}))
        }
        (Method::PUT, ["rbac"]) => match body::<RbacRequest>(request).await {
            Ok(rbac) => {
                state.auth.lock().rbac = rbac.enabled;
                Reply::json(200, &json!({"enabled": rbac.enabled}))
            }
            Err(reply) => reply,
        },
        (Method::POST, ["tokens"]) => match body::<UserInfo>(request).await {
            Ok(user) => Reply::json(200, &json!({"token": state.auth.lock().mint(user)})),
            Err(reply) => reply,
        },
        (Method::POST, ["serviceaccounts", namespace, name, "token"]) => {
            let token = state.auth.lock().mint(UserInfo::service_account(namespace, name));
            Reply::json(200, &json!({"token": token}))
        }
        _ => error(
            404,
            &format!("no admin endpoint {} /_admin/{path}", request.method()),
        ),
    }
}

#[derive(serde::Deserialize)]
struct CloseRequest {
    #[serde(default)]
    user_agent: Option<String>,
}

#[derive(serde::Deserialize)]
struct RbacRequest {
    enabled: bool,
}
