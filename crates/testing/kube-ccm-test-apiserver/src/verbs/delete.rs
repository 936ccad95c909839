//! delete and deletecollection (finalizers, preconditions, propagation).

use serde_json::{Value, json};

use super::{commit, not_found, object_reply};
use super::{now_seconds, object_key, record_lease};
use crate::request::selectors;
use crate::request::{ApiRequest, Target};
use crate::resources::RESOURCES;
use crate::state::State;
use crate::status::{self, ApiError};
use crate::store::Key;
use crate::wire::Reply;
use bytes::Bytes;

pub(super) fn delete(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let name = target.name.as_deref().unwrap_or_default();
    let options: Value = if request.body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&request.body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let mut store = state.store.lock();
    let current = store
        .get(target.id, &target.key())
        .ok_or_else(|| not_found(target))?;
    let uid = current
        .object
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if let Some(expected) = options.pointer("/preconditions/uid").and_then(Value::as_str)
        && expected != uid
    {
        return Err(ApiError::conflict(
            &resource.qualified(),
            name,
            &format!("Precondition failed: UID in precondition: {expected}, UID in object meta: {uid}"),
        ));
    }
    if let Some(expected) = options
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && expected != current.rv.to_string()
    {
        return Err(ApiError::conflict(
            &resource.qualified(),
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {expected}, ResourceVersion in object meta: {}",
                current.rv
            ),
        ));
    }
    let has_finalizers = current
        .object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    if has_finalizers {
        if current.object.pointer("/metadata/deletionTimestamp").is_some() || request.dry_run() {
            return Ok(Reply::bytes(202, current.json.clone()));
        }
        let mut marked = current.object.clone();
        marked["metadata"]["deletionTimestamp"] = json!(now_seconds(state));
        marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        let (stored, _) = commit(state, &mut store, target, marked, "update", request.user_agent);
        return Ok(object_reply(202, &stored));
    }
    if request.dry_run() {
        return Ok(Reply::json(
            200,
            &status::success(&resource.qualified(), name, &uid),
        ));
    }
    let removed = store.remove(target.id, &target.key()).expect("present above");
    record_lease(state, target.id, &removed, "delete", request.user_agent);
    if resource.plural == "namespaces" && resource.group.is_empty() {
        // Simplification: a namespace and its content go at once (no namespace controller, no Terminating phase).
        for id in (0..RESOURCES.len()).filter(|&id| RESOURCES[id].namespaced) {
            for object in store.list(id, Some(name)) {
                store.remove(id, &object_key(&object.object));
            }
        }
    }
    let mut reply = Reply::json(200, &status::success(&resource.qualified(), name, &uid));
    reply.resource_version = Some(removed.rv);
    Ok(reply)
}

pub(super) fn delete_collection(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let (labels, fields) = selectors(resource, request.query)?;
    let names: Vec<Key> = state
        .store
        .lock()
        .list(target.id, target.namespace.as_deref())
        .into_iter()
        .filter(|o| labels.matches(&o.object) && fields.matches(&o.object))
        .map(|o| object_key(&o.object))
        .collect();
    for (namespace, name) in names {
        let one = ApiRequest {
            target: Target {
                name: Some(name),
                namespace: (!namespace.is_empty()).then_some(namespace),
                ..target.clone()
            },
            verb: "delete",
            query: request.query,
            body: Bytes::new(),
            content_type: request.content_type,
            user_agent: request.user_agent,
        };
        match delete(state, &one) {
            Ok(_) => {}
            Err(error) if error.code == 404 => {}
            Err(error) => return Err(error),
        }
    }
    Ok(Reply::json(
        200,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
    ))
}
