//! The resource verbs: get, list, watch, create, update, patch (four types), delete, deletecollection.
//!
//! `read.rs` (get, list), `write.rs` (create, update, merge/JSON/strategic patch), `ssa.rs` (server-side
//! apply), `delete.rs` (delete, deletecollection); here the dispatch and what every write shares (decoding,
//! checks, the commit).

mod delete;
mod read;
mod ssa;
mod write;

use std::sync::Arc;

use serde_json::Value;

use self::delete::{delete, delete_collection};
use self::read::{get, list};
use self::ssa::server_side_apply;
use self::write::{create, patch, update};
use crate::observe::{LeaseRecord, format_us};
use crate::patch::PatchType;
use crate::request::{ApiRequest, Target};
use crate::resources::{ResourceId, ResourceType, id_of};
use crate::state::State;
use crate::status::ApiError;
use crate::store::{Key, Obj, Store};
use crate::watch;
use crate::wire::Reply;

pub(crate) async fn handle(state: &Arc<State>, request: ApiRequest<'_>) -> Result<Reply, ApiError> {
    match request.verb {
        "get" => get(state, &request),
        "list" => list(state, &request),
        "watch" => watch::start(state, &request.target, request.query, request.user_agent),
        // kubectl's typed commands (`kubectl create clusterrolebinding`, …) send protobuf, which a real
        // server decodes and this one does not: say so, rather than that JSON did not parse.
        "create" | "update"
            if request
                .content_type
                .starts_with("application/vnd.kubernetes.protobuf") =>
        {
            Err(ApiError::unsupported_media_type(request.content_type))
        }
        "create" => create(state, &request),
        "update" => update(state, &request),
        "patch" => match PatchType::from_content_type(request.content_type) {
            Some(PatchType::Apply) => server_side_apply(state, &request),
            Some(kind) => patch(state, &request, kind),
            None => Err(ApiError::unsupported_media_type(request.content_type)),
        },
        "delete" => delete(state, &request),
        "deletecollection" => delete_collection(state, &request),
        other => unreachable!("verb {other} is not routed"),
    }
}

fn object_reply(status: u16, object: &Obj) -> Reply {
    let mut reply = Reply::bytes(status, object.json.clone());
    reply.resource_version = Some(object.rv);
    reply
}

fn not_found(target: &Target) -> ApiError {
    ApiError::not_found(
        &target.resource().qualified(),
        target.name.as_deref().unwrap_or_default(),
    )
}

fn parse_object(resource: &ResourceType, body: &[u8]) -> Result<Value, ApiError> {
    let object: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })?;
    if !object.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    check_type(resource, &object)?;
    Ok(object)
}

fn check_type(resource: &ResourceType, object: &Value) -> Result<(), ApiError> {
    let api_version = resource.api_version();
    if let Some(given) = object.get("apiVersion").and_then(Value::as_str)
        && given != api_version
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({given}) does not match the expected API version ({api_version})"
        )));
    }
    if let Some(kind) = object.get("kind").and_then(Value::as_str)
        && kind != resource.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            resource.kind
        )));
    }
    Ok(())
}

fn now_seconds(state: &State) -> String {
    state.clock.seconds()
}

/// Whether the type's objects count `generation` (those with a spec).
fn spec_changed(old: &Value, new: &Value) -> bool {
    let content = |object: &Value| -> Vec<(String, Value)> {
        object
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "status" | "kind" | "apiVersion"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    content(old) != content(new)
}

fn strip_volatile(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(metadata) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("resourceVersion");
        metadata.remove("managedFields");
    }
    copy
}

/// Writes `new` (or, when it is being deleted and has no finalizers left, removes it), recording Lease writes.
fn commit(
    state: &State,
    store: &mut Store,
    target: &Target,
    new: Value,
    operation: &str,
    user_agent: &str,
) -> (Obj, bool) {
    let key = object_key(&new);
    let finished = new.pointer("/metadata/deletionTimestamp").is_some()
        && new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
    let stored = if finished {
        store.put(target.id, key.clone(), new);
        store.remove(target.id, &key).expect("just stored")
    } else {
        store.put(target.id, key, new)
    };
    record_lease(
        state,
        target.id,
        &stored,
        if finished { "delete" } else { operation },
        user_agent,
    );
    (stored, finished)
}

fn record_lease(state: &State, id: ResourceId, stored: &Obj, operation: &str, user_agent: &str) {
    if id != id_of("coordination.k8s.io", "leases") {
        return;
    }
    let spec = stored.object.get("spec").cloned().unwrap_or(Value::Null);
    let text = |field: &str| spec.get(field).and_then(Value::as_str).map(str::to_owned);
    let number = |field: &str| spec.get(field).and_then(Value::as_i64);
    let now = state.clock.now_us();
    let (namespace, name) = object_key(&stored.object);
    state.logs.lock().record_lease(LeaseRecord {
        seq: 0,
        time: format_us(now, 6),
        time_us: now,
        resource_version: stored.rv,
        namespace,
        name,
        operation: operation.to_owned(),
        holder_identity: text("holderIdentity").filter(|h| !h.is_empty()),
        lease_transitions: number("leaseTransitions"),
        lease_duration_seconds: number("leaseDurationSeconds"),
        acquire_time: text("acquireTime"),
        renew_time: text("renewTime"),
        user_agent: user_agent.to_owned(),
    });
}

fn object_key(object: &Value) -> Key {
    let text = |pointer: &str| {
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    (text("/metadata/namespace"), text("/metadata/name"))
}
