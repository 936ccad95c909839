//! Server-side apply (`application/apply-patch+yaml`).

use serde_json::Value;

use super::check_type;
use super::now_seconds;
use super::write::{create_locked, finish_update, prepare_update};
use crate::apply::{self, Writer};
use crate::request::{ApiRequest, Target};
use crate::state::State;
use crate::status::ApiError;
use crate::validation;
use crate::wire::Reply;

pub(super) fn server_side_apply(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let name = target.name.as_deref().unwrap_or_default();
    let Some(manager) = request.query.get("fieldManager").filter(|m| !m.is_empty()) else {
        return Err(validation::field_manager_required());
    };
    let text = std::str::from_utf8(&request.body)
        .map_err(|_| ApiError::bad_request("error decoding patch: the body is not UTF-8"))?;
    let applied: Value = serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    // The applied configuration must be of the endpoint's kind.
    let given = |field: &str| applied.get(field).and_then(Value::as_str).unwrap_or_default();
    if given("apiVersion") != resource.api_version() || given("kind") != resource.kind {
        let (group, version) = given("apiVersion")
            .rsplit_once('/')
            .unwrap_or(("", given("apiVersion")));
        return Err(ApiError::bad_request(format!(
            "invalid object type: {group}/{version}, Kind={}",
            given("kind")
        )));
    }
    check_type(resource, &applied)?;
    validation::decode_applied(resource, target, &applied)?;
    // The name is never owned by a field manager: an apply that omits it keeps the live object's, and
    // fails only when there is no live object to take it from.
    let applied_name = applied
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut store = state.store.lock();
    let current = store.get(target.id, &target.key());
    let name_matches = applied_name == name || (applied_name.is_empty() && current.is_some());
    if !name_matches {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({applied_name}) does not match the name on the URL ({name})"
        )));
    }
    let force = request.query.flag("force");
    let time = now_seconds(state);
    let writer = Writer {
        manager,
        scope: target.scope(),
        time: &time,
    };
    let Some(current) = current else {
        // Apply creates a missing object, like a POST but with the apply's field ownership.
        let object = apply::server_side_apply(resource, None, &applied, &writer, force)
            .map_err(|c| conflict_error(target, &c))?;
        let managed = object.pointer("/metadata/managedFields").cloned();
        return create_locked(state, &mut store, request, object, managed);
    };
    let result = apply::server_side_apply(resource, Some(&current.object), &applied, &writer, force)
        .map_err(|c| conflict_error(target, &c))?;
    let managed = result.pointer("/metadata/managedFields").cloned();
    let new = prepare_update(&mut store, target, &current.object, result)?;
    finish_update(state, &mut store, request, &current, new, managed)
}

pub(super) fn conflict_error(target: &Target, conflicts: &apply::Conflicts) -> ApiError {
    let (message, causes) = conflicts.message();
    let resource = target.resource();
    let mut error = ApiError::conflict(
        &resource.qualified(),
        target.name.as_deref().unwrap_or_default(),
        "",
    );
    error.message = message;
    if let Some(details) = error.details.as_mut() {
        details["causes"] = causes;
    }
    error
}
