//! The resource verbs: get, list, watch, create, update, patch (four types), delete, deletecollection.

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http::Method;
use serde_json::{Value, json};

use crate::apply::{self, Scope, Writer};
use crate::defaults;
use crate::observe::{LeaseRecord, format_us};
use crate::patch::{self, PatchType};
use crate::resources::{RESOURCES, ResourceId, ResourceType, find, id_of};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::server::{Query, Reply, State, lock, percent_decode};
use crate::status::{self, ApiError};
use crate::store::{Key, Obj, Store};
use crate::watch;

/// The object or collection a request is about.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) id: ResourceId,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

impl Target {
    pub(crate) fn resource(&self) -> &'static ResourceType {
        &RESOURCES[self.id]
    }

    fn key(&self) -> Key {
        (
            self.namespace.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }

    fn scope(&self) -> Scope {
        if self.subresource.as_deref() == Some("status") {
            Scope::Status
        } else {
            Scope::Main
        }
    }
}

/// Parses the path after `/api/v1` or `/apis/<group>/<version>`.
pub(crate) fn parse_target(group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let decoded: Vec<String> = rest.iter().map(|s| percent_decode(s)).collect();
    let rest: Vec<&str> = decoded.iter().map(String::as_str).collect();
    let namespaced_form = rest.len() >= 3
        && rest[0] == "namespaces"
        && find(group, version, rest[2]).is_some_and(|id| RESOURCES[id].namespaced);
    let (namespace, rest) = if namespaced_form {
        (Some(rest[1].to_owned()), &rest[2..])
    } else {
        (None, &rest[..])
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, subresource] => (*plural, Some(*name), Some(*subresource)),
        _ => return None,
    };
    let id = find(group, version, plural)?;
    let resource = &RESOURCES[id];
    if resource.namespaced && namespace.is_none() && name.is_some() {
        return None;
    }
    if !resource.namespaced && namespace.is_some() {
        return None;
    }
    if subresource.is_some_and(|s| s != "status" || !resource.status) {
        return None;
    }
    Some(Target {
        id,
        namespace,
        name: name.map(str::to_owned),
        subresource: subresource.map(str::to_owned),
    })
}

/// The Kubernetes verb of a request.
pub(crate) fn verb(method: &Method, target: &Target, query: &Query) -> Option<&'static str> {
    let named = target.name.is_some();
    Some(match (method.as_str(), named) {
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) if query.flag("watch") => "watch",
        ("GET" | "HEAD", false) => "list",
        ("POST", false) if target.subresource.is_none() => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) if target.subresource.is_none() => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    })
}

/// One API request, parsed.
pub(crate) struct ApiRequest<'a> {
    pub(crate) target: Target,
    pub(crate) verb: &'static str,
    pub(crate) query: &'a Query,
    pub(crate) body: Bytes,
    pub(crate) content_type: &'a str,
    pub(crate) user_agent: &'a str,
}

impl ApiRequest<'_> {
    fn manager(&self) -> String {
        match self.query.get("fieldManager") {
            Some(manager) if !manager.is_empty() => manager.to_owned(),
            _ => self
                .user_agent
                .split('/')
                .next()
                .filter(|s| !s.is_empty())
                .unwrap_or("unknown")
                .to_owned(),
        }
    }

    fn dry_run(&self) -> bool {
        self.query.get("dryRun") == Some("All")
    }
}

pub(crate) async fn handle(state: &Arc<State>, request: ApiRequest<'_>) -> Result<Reply, ApiError> {
    match request.verb {
        "get" => get(state, &request),
        "list" => list(state, &request),
        "watch" => watch::start(state, &request.target, request.query, request.user_agent),
        "create" => create(state, &request),
        "update" => update(state, &request),
        "patch" => patch(state, &request),
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

fn get(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let store = lock(&state.store);
    let object = store
        .get(target.id, &target.key())
        .ok_or_else(|| not_found(target))?;
    Ok(Reply::bytes(200, object.json.clone()))
}

fn not_found(target: &Target) -> ApiError {
    ApiError::not_found(
        &target.resource().qualified(),
        target.name.as_deref().unwrap_or_default(),
    )
}

/// Parses `labelSelector` and `fieldSelector`.
pub(crate) fn selectors(
    resource: &ResourceType,
    query: &Query,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), resource)
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

fn list(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let (labels, fields) = selectors(resource, request.query)?;
    let limit = request
        .query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|&l| l > 0);
    let start_after: Option<Key> = match request.query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            Some(decode_continue(token).ok_or_else(|| ApiError::bad_request("invalid continue token"))?)
        }
        None => None,
    };
    let store = lock(&state.store);
    let resource_version = store.resource_version();
    // The store never lags, so "not older than" is always the latest state; newer versions do not exist yet,
    // and exact reads of past versions are not kept.
    if let Some(requested) = request
        .query
        .get("resourceVersion")
        .filter(|rv| !rv.is_empty() && *rv != "0")
    {
        let requested: u64 = requested
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {requested:?}")))?;
        if requested > resource_version {
            return Err(ApiError::too_large_resource_version(requested, resource_version));
        }
        if request.query.get("resourceVersionMatch") == Some("Exact") && requested != resource_version {
            return Err(ApiError::gone(format!(
                "resourceVersion {requested} is too old: exact reads of past versions are not kept"
            )));
        }
    }
    let mut matching = store
        .list(target.id, target.namespace.as_deref())
        .into_iter()
        .filter(|o| labels.matches(&o.object) && fields.matches(&o.object))
        .filter(|o| {
            start_after
                .as_ref()
                .is_none_or(|after| object_key(&o.object) > *after)
        });
    let mut items: Vec<Obj> = Vec::new();
    let mut remaining = 0usize;
    for object in matching.by_ref() {
        if limit.is_some_and(|l| items.len() >= l) {
            remaining = 1;
            break;
        }
        items.push(object);
    }
    remaining += matching.count();
    drop(store);

    let mut metadata = json!({"resourceVersion": resource_version.to_string()});
    if remaining > 0
        && let Some(last) = items.last()
    {
        metadata["continue"] = json!(encode_continue(&object_key(&last.object)));
        metadata["remainingItemCount"] = json!(remaining);
    }
    let mut body = Vec::with_capacity(64 + items.iter().map(|o| o.json.len() + 1).sum::<usize>());
    body.extend_from_slice(
        format!(
            r#"{{"kind":"{}List","apiVersion":"{}","metadata":{},"items":["#,
            resource.kind,
            resource.api_version(),
            metadata
        )
        .as_bytes(),
    );
    for (index, object) in items.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&object.json);
    }
    body.extend_from_slice(b"]}");
    Ok(Reply::bytes(200, Bytes::from(body)))
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

fn encode_continue(key: &Key) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(key).expect("strings serialise"))
}

fn decode_continue(token: &str) -> Option<Key> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
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

/// Names the real server accepts, per type.
fn name_error(resource: &ResourceType, name: &str) -> Option<String> {
    let dns_label = |max: usize, first_letter: bool| {
        name.len() <= max
            && !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-')
            && (!first_letter || name.as_bytes()[0].is_ascii_lowercase())
    };
    let valid = match (resource.group, resource.plural) {
        ("rbac.authorization.k8s.io", _) => {
            !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
        }
        ("", "namespaces") => dns_label(63, false),
        ("", "services") => dns_label(63, true),
        _ => {
            name.len() <= 253
                && name.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                })
        }
    };
    (!valid).then(|| {
        format!(
            "metadata.name: Invalid value: {name:?}: must be a valid name for {}",
            resource.plural
        )
    })
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
    lock(&state.logs).record_lease(LeaseRecord {
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

fn create(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let object = parse_object(request.target.resource(), &request.body)?;
    let mut store = lock(&state.store);
    create_locked(state, &mut store, request, object, None)
}

/// Creates `object`. `managed`: field ownership already computed (by an apply); recorded as an Update otherwise.
fn create_locked(
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
        None => match object
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            Some(prefix) => format!("{prefix}{}", &uuid::Uuid::new_v4().simple().to_string()[..5]),
            None => {
                return Err(ApiError::invalid(
                    &resource.qualified(),
                    resource.kind,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        },
    };
    if let Some(message) = name_error(resource, &name) {
        return Err(ApiError::invalid(
            &resource.qualified(),
            resource.kind,
            &name,
            message,
        ));
    }
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
    defaults::apply(resource, &mut object, None, &mut store.allocations);
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
fn prepare_update(
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
        // A status write changes only `.status`; everything else is the stored object's.
        Scope::Status => {
            let mut new = current.clone();
            set_or_remove(&mut new, "status", proposed.get("status"));
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
    if current.pointer("/metadata/deletionTimestamp").is_some() {
        let before: Vec<&Value> = current
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .collect();
        let added = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|f| !before.contains(&f));
        if added {
            return Err(ApiError::invalid(
                &resource.qualified(),
                resource.kind,
                name,
                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
            ));
        }
    }
    if new.get("spec").is_some() && spec_changed(current, &new) {
        let generation = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        new["metadata"]["generation"] = json!(generation + 1);
    }
    defaults::apply(resource, &mut new, Some(current), &mut store.allocations);
    Ok(new)
}

fn set_or_remove(object: &mut Value, field: &str, value: Option<&Value>) {
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
fn finish_update(
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
fn check_precondition(target: &Target, current: &Obj, proposed: &Value) -> Result<(), ApiError> {
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

fn update(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let proposed = parse_object(target.resource(), &request.body)?;
    let mut store = lock(&state.store);
    let current = store
        .get(target.id, &target.key())
        .ok_or_else(|| not_found(target))?;
    check_precondition(target, &current, &proposed)?;
    let new = prepare_update(&mut store, target, &current.object, proposed)?;
    finish_update(state, &mut store, request, &current, new, None)
}

fn patch(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let kind = PatchType::from_content_type(request.content_type)
        .ok_or_else(|| ApiError::unsupported_media_type(request.content_type))?;
    if kind == PatchType::Apply {
        return server_side_apply(state, request);
    }
    let mut store = lock(&state.store);
    let current = store
        .get(target.id, &target.key())
        .ok_or_else(|| not_found(target))?;
    let name = target.name.as_deref().unwrap_or_default();
    let patched = patch::apply(kind, resource, &current.object, &request.body)
        .map_err(|message| ApiError::invalid(&resource.qualified(), resource.kind, name, message))?;
    check_precondition(target, &current, &patched)?;
    let new = prepare_update(&mut store, target, &current.object, patched)?;
    finish_update(state, &mut store, request, &current, new, None)
}

fn server_side_apply(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let name = target.name.as_deref().unwrap_or_default();
    let Some(manager) = request.query.get("fieldManager").filter(|m| !m.is_empty()) else {
        return Err(ApiError::invalid(
            "patchoptions.meta.k8s.io",
            "PatchOptions.meta.k8s.io",
            "",
            "fieldManager: Required value: is required for apply patch",
        ));
    };
    let text = std::str::from_utf8(&request.body)
        .map_err(|_| ApiError::bad_request("the apply body is not UTF-8"))?;
    let applied: Value = serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !applied.is_object() || applied.get("apiVersion").is_none() || applied.get("kind").is_none() {
        return Err(ApiError::bad_request(
            "an apply patch must be an object with apiVersion and kind",
        ));
    }
    check_type(resource, &applied)?;
    let applied_name = applied
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if applied_name != name {
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
    let mut store = lock(&state.store);
    let Some(current) = store.get(target.id, &target.key()) else {
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

fn conflict_error(target: &Target, conflicts: &apply::Conflicts) -> ApiError {
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

fn delete(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let name = target.name.as_deref().unwrap_or_default();
    let options: Value = if request.body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&request.body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
    };
    let mut store = lock(&state.store);
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

fn delete_collection(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let (labels, fields) = selectors(resource, request.query)?;
    let names: Vec<Key> = lock(&state.store)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// (plural, namespace, name, subresource)
    type Parsed<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a str>);

    #[track_caller]
    fn check(group: &str, version: &str, path: &str, expected: Option<Parsed<'_>>) {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let target = parse_target(group, version, &segments);
        let actual = target.as_ref().map(|t| {
            (
                t.resource().plural,
                t.namespace.as_deref(),
                t.name.as_deref(),
                t.subresource.as_deref(),
            )
        });
        assert_eq!(actual, expected, "{path}");
    }

    #[test]
    fn paths_resolve_to_targets() {
        check("", "v1", "nodes", Some(("nodes", None, None, None)));
        check(
            "",
            "v1",
            "nodes/n1/status",
            Some(("nodes", None, Some("n1"), Some("status"))),
        );
        check("", "v1", "services", Some(("services", None, None, None)));
        check(
            "",
            "v1",
            "namespaces/default/services/s/status",
            Some(("services", Some("default"), Some("s"), Some("status"))),
        );
        check(
            "",
            "v1",
            "namespaces/kube-system",
            Some(("namespaces", None, Some("kube-system"), None)),
        );
        check(
            "",
            "v1",
            "namespaces/kube-system/status",
            Some(("namespaces", None, Some("kube-system"), Some("status"))),
        );
        check(
            "coordination.k8s.io",
            "v1",
            "namespaces/kube-system/leases/l",
            Some(("leases", Some("kube-system"), Some("l"), None)),
        );
        check(
            "rbac.authorization.k8s.io",
            "v1",
            "namespaces/kube-system/roles/system%3A%3Aleader",
            Some(("roles", Some("kube-system"), Some("system::leader"), None)),
        );
        check(
            "coordination.k8s.io",
            "v1",
            "namespaces/kube-system/leases/l/status",
            None,
        );
        check("", "v1", "services/s", None);
        check("", "v1", "widgets", None);
    }

    #[test]
    fn continue_tokens_round_trip() {
        let key = ("ns".to_owned(), "name".to_owned());
        assert_eq!(decode_continue(&encode_continue(&key)), Some(key));
        assert_eq!(decode_continue("!!"), None);
    }
}
