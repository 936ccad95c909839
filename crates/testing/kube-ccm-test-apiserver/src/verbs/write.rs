//! create, update, and merge, JSON and strategic-merge patches.

use serde_json::{Value, json};

use super::{
    check_type, commit, not_found, now_seconds, object_reply, parse_object, spec_changed, strip_volatile,
};
use crate::apply::Scope;
use crate::apply::{self, Writer};
use crate::defaults;
use crate::patch::{self, PatchType};
use crate::request::{ApiRequest, Target};
use crate::resources::id_of;
use crate::state::State;
use crate::status::ApiError;
use crate::store::{Obj, Store};
use crate::validation::{self, FieldValidation, Write};
use crate::wire::Reply;

/// `fieldValidation` of the request (`options`: the verb's options kind, for the error).
pub(super) fn field_validation(request: &ApiRequest<'_>, options: &str) -> Result<FieldValidation, ApiError> {
    FieldValidation::parse(request.query.get("fieldValidation"), options)
}

pub(super) fn create(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let resource = request.target.resource();
    let mut object = parse_object(resource, &request.body)?;
    let mode = field_validation(request, "CreateOptions")?;
    let warnings = validation::decode_body(resource, &mut object, mode)?;
    let mut store = state.store.lock();
    let mut reply = create_locked(state, &mut store, request, object, None)?;
    reply.warnings = warnings;
    Ok(reply)
}

/// The alphabet of generated name suffixes (no vowels, so no words).
const NAME_SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `generateName` cut to 58 characters, then five random characters.
fn generated_name(prefix: &str) -> String {
    let mut name: String = prefix.chars().take(58).collect();
    for _ in 0..5 {
        let index = rand::random_range(0..NAME_SUFFIX_ALPHABET.len());
        name.push(char::from(NAME_SUFFIX_ALPHABET[index]));
    }
    name
}

/// Creates `object`. `managed`: field ownership already computed (by an apply); recorded as an Update otherwise.
pub(super) fn create_locked(
    state: &State,
    store: &mut Store,
    request: &ApiRequest<'_>,
    mut object: Value,
    managed: Option<Value>,
) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    if resource.namespaced && target.namespace.is_none() {
        return Err(ApiError::method_not_allowed("POST", resource.plural));
    }
    object["apiVersion"] = json!(resource.api_version());
    object["kind"] = json!(resource.kind);
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    let body_namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(str::to_owned);
    match (&target.namespace, body_namespace) {
        (Some(path_ns), Some(body_ns)) if !body_ns.is_empty() && *path_ns != body_ns => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        (Some(path_ns), _) => object["metadata"]["namespace"] = json!(path_ns),
        (None, _) => {
            if let Some(metadata) = object["metadata"].as_object_mut() {
                metadata.remove("namespace");
            }
        }
    }
    let name = match object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        Some(name) => name.to_owned(),
        None => object
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(generated_name)
            .unwrap_or_default(),
    };
    let metadata = object["metadata"].as_object_mut().expect("made an object above");
    metadata.insert("name".to_owned(), json!(name));
    metadata.insert("uid".to_owned(), json!(uuid::Uuid::new_v4().to_string()));
    metadata.insert("creationTimestamp".to_owned(), json!(now_seconds(state)));
    for server_field in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
    ] {
        metadata.remove(server_field);
    }
    if object.get("spec").is_some() {
        object["metadata"]["generation"] = json!(1);
    }
    // Like the real strategies: services, pods and deployments start without status; nodes keep theirs.
    if matches!(
        (resource.group, resource.plural),
        ("", "services") | ("", "pods") | ("apps", "deployments")
    ) {
        object["status"] = if resource.plural == "services" {
            json!({"loadBalancer": {}})
        } else {
            json!({})
        };
    }
    defaults::apply(resource, &mut object, None, &mut store.allocations);
    validation::validate(resource, &object, Write::Create)?;
    defaults::drop_disabled_fields(resource, &mut object, store.features);
    if let Some(namespace) = &target.namespace
        && store
            .get(id_of("", "namespaces"), &(String::new(), namespace.clone()))
            .is_none()
    {
        return Err(ApiError::not_found("namespaces", namespace));
    }
    let target = Target {
        name: Some(name.clone()),
        ..target.clone()
    };
    if store.get(target.id, &target.key()).is_some() {
        return Err(ApiError::already_exists(&resource.qualified(), &name));
    }
    match managed {
        Some(managed) => object["metadata"]["managedFields"] = managed,
        None => {
            let time = now_seconds(state);
            let manager = request.manager();
            apply::record_update(
                resource,
                None,
                &mut object,
                &Writer {
                    manager: &manager,
                    scope: Scope::Main,
                    time: &time,
                },
            );
        }
    }
    if request.dry_run() {
        return Ok(Reply::json(201, &object));
    }
    let (stored, _) = commit(state, store, &target, object, "create", request.user_agent);
    Ok(object_reply(201, &stored))
}

/// Builds the object an update or patch writes, from the stored one and the proposed content.
pub(super) fn prepare_update(
    store: &mut Store,
    target: &Target,
    current: &Value,
    proposed: Value,
) -> Result<Value, ApiError> {
    let resource = target.resource();
    let name = target.name.as_deref().unwrap_or_default();
    check_type(resource, &proposed)?;
    let proposed_name = proposed
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or(name);
    if proposed_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({proposed_name}) does not match the name on the URL ({name})"
        )));
    }
    let mut new = match target.scope() {
        // A status write changes `.status` and metadata (the real registries reset only the spec: upstream's
        // service controller adds and removes its finalizer through `services/status`); the spec is the
        // stored object's.
        Scope::Status => {
            let mut new = current.clone();
            set_or_remove(&mut new, "status", proposed.get("status"));
            if let Some(metadata) = proposed.get("metadata").filter(|m| m.is_object()) {
                new["metadata"] = metadata.clone();
            }
            new
        }
        // A main-resource write cannot change `.status` of a type with a status subresource.
        Scope::Main => {
            let mut new = proposed;
            if !new.get("metadata").is_some_and(Value::is_object) {
                new["metadata"] = json!({});
            }
            if resource.status {
                set_or_remove(&mut new, "status", current.get("status"));
            }
            new
        }
    };
    new["apiVersion"] = json!(resource.api_version());
    new["kind"] = json!(resource.kind);
    let metadata = new["metadata"].as_object_mut().expect("made an object above");
    metadata.insert("name".to_owned(), json!(name));
    if let Some(namespace) = &target.namespace {
        metadata.insert("namespace".to_owned(), json!(namespace));
    }
    for server_field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match current.pointer(&format!("/metadata/{server_field}")) {
            Some(value) => metadata.insert(server_field.to_owned(), value.clone()),
            None => metadata.remove(server_field),
        };
    }
    if new.get("spec").is_some() && spec_changed(current, &new) {
        let generation = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        new["metadata"]["generation"] = json!(generation + 1);
    }
    defaults::apply(resource, &mut new, Some(current), &mut store.allocations);
    let write = match target.scope() {
        Scope::Status => Write::Status(current),
        Scope::Main => Write::Update(current),
    };
    validation::validate(resource, &new, write)?;
    defaults::drop_disabled_fields(resource, &mut new, store.features);
    Ok(new)
}

pub(super) fn set_or_remove(object: &mut Value, field: &str, value: Option<&Value>) {
    match value {
        Some(value) => object[field] = value.clone(),
        None => {
            if let Some(map) = object.as_object_mut() {
                map.remove(field);
            }
        }
    }
}

/// The common tail of update and patch: no-op detection, field ownership, commit.
pub(super) fn finish_update(
    state: &State,
    store: &mut Store,
    request: &ApiRequest<'_>,
    current: &Obj,
    mut new: Value,
    managed: Option<Value>,
) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let unchanged_fields = managed
        .as_ref()
        .is_none_or(|m| Some(m) == current.object.pointer("/metadata/managedFields"));
    if strip_volatile(&new) == strip_volatile(&current.object) && unchanged_fields {
        // The real server does not write, bump the resourceVersion, or notify watchers for a no-op.
        return Ok(Reply::bytes(200, current.json.clone()));
    }
    match managed {
        Some(managed) => new["metadata"]["managedFields"] = managed,
        None => {
            let time = now_seconds(state);
            let manager = request.manager();
            apply::record_update(
                resource,
                Some(&current.object),
                &mut new,
                &Writer {
                    manager: &manager,
                    scope: target.scope(),
                    time: &time,
                },
            );
        }
    }
    if request.dry_run() {
        return Ok(Reply::json(200, &new));
    }
    let (stored, _) = commit(state, store, target, new, request.verb, request.user_agent);
    Ok(object_reply(200, &stored))
}

/// A stale `metadata.resourceVersion` in the proposed object is a conflict.
pub(super) fn check_precondition(target: &Target, current: &Obj, proposed: &Value) -> Result<(), ApiError> {
    match proposed
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
    {
        Some(rv) if !rv.is_empty() && rv != current.rv.to_string() => Err(ApiError::stale(
            &target.resource().qualified(),
            target.name.as_deref().unwrap_or_default(),
        )),
        _ => Ok(()),
    }
}

pub(super) fn update(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let mut proposed = parse_object(resource, &request.body)?;
    let mode = field_validation(request, "UpdateOptions")?;
    let warnings = validation::decode_body(resource, &mut proposed, mode)?;
    let mut store = state.store.lock();
    let current = store
        .get(target.id, &target.key())
        .ok_or_else(|| not_found(target))?;
    check_precondition(target, &current, &proposed)?;
    let new = prepare_update(&mut store, target, &current.object, proposed)?;
    let mut reply = finish_update(state, &mut store, request, &current, new, None)?;
    reply.warnings = warnings;
    Ok(reply)
}

/// A merge, JSON or strategic-merge patch (`kind`; server-side apply is `ssa.rs`).
pub(super) fn patch(state: &State, request: &ApiRequest<'_>, kind: PatchType) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let mut store = state.store.lock();
    let current = store
        .get(target.id, &target.key())
        .ok_or_else(|| not_found(target))?;
    let name = target.name.as_deref().unwrap_or_default();
    let mode = field_validation(request, "PatchOptions")?;
    let mut patched = patch::apply(kind, resource, &current.object, &request.body)
        .map_err(|message| ApiError::invalid(&resource.qualified(), resource.kind, name, message))?;
    let warnings = validation::decode_patched(resource, &mut patched, mode)?;
    check_precondition(target, &current, &patched)?;
    let new = prepare_update(&mut store, target, &current.object, patched)?;
    let mut reply = finish_update(state, &mut store, request, &current, new, None)?;
    reply.warnings = warnings;
    Ok(reply)
}
