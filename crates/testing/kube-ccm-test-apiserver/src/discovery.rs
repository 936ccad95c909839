//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`.
//!
//! Legacy (non-aggregated) discovery: kubectl asks for the aggregated form first and falls back to this
//! when the response is plain `application/json`.

use serde_json::{Value, json};

use crate::resources::{RESOURCES, groups};

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];

pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-test-apiserver",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_document(group: &str) -> Option<Value> {
    let versions: Vec<Value> = groups()
        .into_iter()
        .filter(|(g, _)| *g == group)
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first()?.clone();
    Some(json!({"name": group, "versions": versions, "preferredVersion": preferred}))
}

pub(crate) fn group(group: &str) -> Option<Value> {
    group_document(group).map(|mut document| {
        document["kind"] = json!("APIGroup");
        document["apiVersion"] = json!("v1");
        document
    })
}

pub(crate) fn group_list() -> Value {
    let mut names: Vec<&str> = groups()
        .into_iter()
        .map(|(g, _)| g)
        .filter(|g| !g.is_empty())
        .collect();
    names.dedup();
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": names.into_iter().filter_map(group_document).collect::<Vec<_>>(),
    })
}

pub(crate) fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for resource in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut entry = json!({
            "name": resource.plural,
            "singularName": resource.singular,
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": VERBS,
        });
        if !resource.short_names.is_empty() {
            entry["shortNames"] = json!(resource.short_names);
        }
        resources.push(entry);
        if resource.status {
            resources.push(json!({
                "name": format!("{}/status", resource.plural),
                "singularName": "",
                "namespaced": resource.namespaced,
                "kind": resource.kind,
                "verbs": STATUS_VERBS,
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

/// `/openapi/v3`: the index of per-group-version documents.
pub(crate) fn openapi_index() -> Value {
    let mut paths = serde_json::Map::new();
    for (group, version) in groups() {
        let key = if group.is_empty() {
            format!("api/{version}")
        } else {
            format!("apis/{group}/{version}")
        };
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash=0")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`: paths only, no schemas.
///
/// Enough for kubectl to see that the server validates fields itself (`fieldValidation` on each PATCH), so
/// it does not need schemas for client-side validation. This server does not validate against schemas.
pub(crate) fn openapi_document(group: &str, version: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for resource in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let item = if resource.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", resource.plural)
        } else {
            format!("{prefix}/{}/{{name}}", resource.plural)
        };
        let gvk = json!({"group": group, "version": version, "kind": resource.kind});
        let parameters = json!([
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            {"name": "force", "in": "query", "schema": {"type": "boolean"}},
        ]);
        let operation = |verb: &str| {
            json!({
                "operationId": format!("{verb}{}", resource.kind),
                "x-kubernetes-action": verb,
                "x-kubernetes-group-version-kind": gvk,
                "parameters": parameters,
                "responses": {"200": {"description": "OK"}},
            })
        };
        paths.insert(item, json!({"get": operation("get"), "put": operation("put"), "patch": operation("patch"), "delete": operation("delete")}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-test-apiserver"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
