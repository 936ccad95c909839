//! Server-side apply and `managedFields`.
//!
//! Every write records which manager owns which fields, in the real `FieldsV1` encoding (`f:` fields,
//! `k:` items of keyed lists, `v:` items of sets, `.` for an item itself). An *Update* (create, PUT, other
//! patches) takes the fields it changes from whoever owned them. An *Apply* conflicts when it sets a field
//! another manager owns to a different value (unless `force`), merges like a strategic-merge patch, and
//! removes fields this manager applied before, no longer applies, and nobody else owns.
//!
//! Simplifications, documented in the crate docs: list semantics come from the merge rules in
//! [`crate::resources`] (no OpenAPI schema), keyed lists use a single key, and empty parent maps left by a
//! removal are kept.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::patch::merge_value;
use crate::resources::{ListKind, ResourceType};

/// One path element in FieldsV1 encoding: `f:name`, `k:{"key":value}`, `v:value` or `.`.
type Path = Vec<String>;

/// Which part of an object a write touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The main resource: everything but `.status` when the type has a status subresource.
    Main,
    /// The `/status` subresource: only `.status`.
    Status,
}

impl Scope {
    fn subresource(self) -> Option<&'static str> {
        match self {
            Scope::Main => None,
            Scope::Status => Some("status"),
        }
    }
}

/// Who writes, and how.
#[derive(Debug, Clone)]
pub(crate) struct Writer<'a> {
    pub(crate) manager: &'a str,
    pub(crate) scope: Scope,
    pub(crate) time: &'a str,
}

/// Fields that identify or are owned by the server, never by a manager.
fn ignored(path: &str) -> bool {
    matches!(
        path,
        "apiVersion"
            | "kind"
            | "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "metadata.resourceVersion"
            | "metadata.generation"
            | "metadata.creationTimestamp"
            | "metadata.managedFields"
            | "metadata.deletionTimestamp"
            | "metadata.deletionGracePeriodSeconds"
            | "metadata.selfLink"
            | "metadata.generateName"
    )
}

/// The leaf values of `object` in `scope`, by path.
fn flatten<'v>(resource: &ResourceType, object: &'v Value, scope: Scope) -> BTreeMap<Path, &'v Value> {
    let mut out = BTreeMap::new();
    let Some(map) = object.as_object() else { return out };
    for (key, value) in map {
        let in_scope = match scope {
            Scope::Main => !(resource.status && key == "status"),
            Scope::Status => key == "status",
        };
        if in_scope && !ignored(key) {
            walk(resource, key, value, &mut vec![format!("f:{key}")], &mut out);
        }
    }
    out
}

fn walk<'v>(
    resource: &ResourceType,
    rule_path: &str,
    value: &'v Value,
    path: &mut Path,
    out: &mut BTreeMap<Path, &'v Value>,
) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, child) in map {
                let child_rule = format!("{rule_path}.{key}");
                if ignored(&child_rule) {
                    continue;
                }
                path.push(format!("f:{key}"));
                walk(resource, &child_rule, child, path, out);
                path.pop();
            }
        }
        Value::Array(items) => match resource.list_kind(rule_path) {
            Some(ListKind::Map(key)) => {
                for item in items {
                    let Some(id) = item.get(key) else { continue };
                    path.push(format!("k:{}", json!({ key: id })));
                    path.push(".".to_owned());
                    out.insert(path.clone(), item);
                    path.pop();
                    walk(resource, &format!("{rule_path}[]"), item, path, out);
                    path.pop();
                }
            }
            Some(ListKind::Set) => {
                for item in items {
                    path.push(format!("v:{item}"));
                    out.insert(path.clone(), item);
                    path.pop();
                }
            }
            None => {
                out.insert(path.clone(), value);
            }
        },
        leaf => {
            out.insert(path.clone(), leaf);
        }
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: Option<String>,
    fields: BTreeSet<Path>,
}

impl Entry {
    fn scope(&self) -> Scope {
        if self.subresource.as_deref() == Some("status") {
            Scope::Status
        } else {
            Scope::Main
        }
    }

    fn is(&self, manager: &str, operation: &str, scope: Scope) -> bool {
        self.manager == manager && self.operation == operation && self.scope() == scope
    }
}

fn read_entries(object: &Value) -> Vec<Entry> {
    let Some(entries) = object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| {
            let mut fields = BTreeSet::new();
            decode_fields(entry.get("fieldsV1")?, &mut Vec::new(), &mut fields);
            Some(Entry {
                manager: entry.get("manager")?.as_str()?.to_owned(),
                operation: entry.get("operation")?.as_str()?.to_owned(),
                api_version: entry
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                time: entry
                    .get("time")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                subresource: entry
                    .get("subresource")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                fields,
            })
        })
        .collect()
}

fn decode_fields(tree: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    let Some(map) = tree.as_object() else { return };
    if map.is_empty() && !path.is_empty() {
        out.insert(path.clone());
        return;
    }
    for (key, child) in map {
        path.push(key.clone());
        decode_fields(child, path, out);
        path.pop();
    }
}

fn encode_fields(fields: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut node = &mut root;
        for element in path {
            node = node
                .entry(element.clone())
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("objects only");
        }
    }
    Value::Object(root)
}

fn write_entries(object: &mut Value, entries: &[Entry]) {
    let encoded: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut entry = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": encode_fields(&e.fields),
            });
            if let Some(subresource) = &e.subresource {
                entry["subresource"] = json!(subresource);
            }
            entry
        })
        .collect();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if encoded.is_empty() {
            metadata.remove("managedFields");
        } else {
            metadata.insert("managedFields".to_owned(), Value::Array(encoded));
        }
    }
}

fn api_version(object: &Value) -> String {
    object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Records an Update by `writer`: it takes every field whose value it changed.
pub(crate) fn record_update(
    resource: &ResourceType,
    old: Option<&Value>,
    new: &mut Value,
    writer: &Writer<'_>,
) {
    let mut entries = old.map(read_entries).unwrap_or_default();
    let before = old
        .map(|o| flatten(resource, o, writer.scope))
        .unwrap_or_default();
    let after = flatten(resource, new, writer.scope);
    let changed: BTreeSet<Path> = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(*v))
        .map(|(p, _)| p.clone())
        .collect();
    let removed: BTreeSet<Path> = before
        .keys()
        .filter(|p| !after.contains_key(*p))
        .cloned()
        .collect();
    for entry in entries.iter_mut().filter(|e| e.scope() == writer.scope) {
        entry
            .fields
            .retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.is(writer.manager, "Update", writer.scope))
        {
            Some(entry) => {
                entry.fields.extend(changed);
                entry.time = writer.time.to_owned();
                entry.api_version = api_version(new);
            }
            None => entries.push(Entry {
                manager: writer.manager.to_owned(),
                operation: "Update".to_owned(),
                api_version: api_version(new),
                time: writer.time.to_owned(),
                subresource: writer.scope.subresource().map(str::to_owned),
                fields: changed,
            }),
        }
    }
    write_entries(new, &entries);
}

/// Fields another manager owns with a different value than the one applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conflicts(pub(crate) Vec<(String, String)>);

impl Conflicts {
    /// The message the real server gives, and its `causes`.
    pub(crate) fn message(&self) -> (String, Value) {
        let count = self.0.len();
        let noun = if count == 1 { "conflict" } else { "conflicts" };
        let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (manager, field) in &self.0 {
            by_manager.entry(manager).or_default().push(field);
        }
        let mut message = format!("Apply failed with {count} {noun}:");
        for (manager, fields) in &by_manager {
            if fields.len() == 1 {
                message.push_str(&format!(" conflict with {manager:?}: {}", fields[0]));
            } else {
                message.push_str(&format!(" conflicts with {manager:?}:"));
                for field in fields {
                    message.push_str(&format!("\n- {field}"));
                }
            }
        }
        let causes = self
            .0
            .iter()
            .map(|(manager, field)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {manager:?}"), "field": field}))
            .collect();
        (message, Value::Array(causes))
    }
}

/// `.spec.ports[port=80].name`, as conflict messages print a path.
fn display(path: &Path) -> String {
    let mut out = String::new();
    for element in path {
        if let Some(field) = element.strip_prefix("f:") {
            out.push('.');
            out.push_str(field);
        } else if let Some(key) = element.strip_prefix("k:") {
            let key: Value = serde_json::from_str(key).unwrap_or(Value::Null);
            let inner: Vec<String> = key
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            out.push_str(&format!("[{}]", inner.join(",")));
        } else if let Some(value) = element.strip_prefix("v:") {
            out.push_str(&format!("[={value}]"));
        }
    }
    out
}

/// Server-side apply of `applied` by `writer` over `current` (None: the object does not exist yet).
pub(crate) fn server_side_apply(
    resource: &ResourceType,
    current: Option<&Value>,
    applied: &Value,
    writer: &Writer<'_>,
    force: bool,
) -> Result<Value, Conflicts> {
    let empty = Value::Object(Map::new());
    let current_value = current.unwrap_or(&empty);
    let mut entries = read_entries(current_value);
    let applied_fields = flatten(resource, applied, writer.scope);
    let current_fields = flatten(resource, current_value, writer.scope);

    let mut conflicts = Vec::new();
    for entry in entries
        .iter_mut()
        .filter(|e| e.scope() == writer.scope && !e.is(writer.manager, "Apply", writer.scope))
    {
        let conflicting: Vec<Path> = entry
            .fields
            .iter()
            .filter(|p| p.last().is_some_and(|last| last != "."))
            .filter(|p| {
                applied_fields
                    .get(*p)
                    .is_some_and(|v| current_fields.get(*p) != Some(v))
            })
            .cloned()
            .collect();
        if force {
            entry.fields.retain(|p| !conflicting.contains(p));
        } else {
            conflicts.extend(conflicting.iter().map(|p| (entry.manager.clone(), display(p))));
        }
    }
    if !conflicts.is_empty() {
        return Err(Conflicts(conflicts));
    }

    let mut result = current.cloned().unwrap_or_else(
        || json!({"apiVersion": applied.get("apiVersion"), "kind": applied.get("kind"), "metadata": {}}),
    );
    merge_value(resource, "", &mut result, applied);

    // Fields this manager applied before, no longer applies, and nobody else owns, go.
    let previous: BTreeSet<Path> = entries
        .iter()
        .find(|e| e.is(writer.manager, "Apply", writer.scope))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: BTreeSet<&Path> = entries
        .iter()
        .filter(|e| e.scope() == writer.scope && !e.is(writer.manager, "Apply", writer.scope))
        .flat_map(|e| e.fields.iter())
        .collect();
    for path in previous
        .iter()
        .filter(|p| !applied_fields.contains_key(*p) && !others.contains(p))
    {
        remove_path(&mut result, path);
    }

    let present = flatten(resource, &result, writer.scope);
    let applied_paths: BTreeSet<Path> = applied_fields.into_keys().collect();
    entries.retain(|e| !e.is(writer.manager, "Apply", writer.scope));
    for entry in entries.iter_mut().filter(|e| e.scope() == writer.scope) {
        entry.fields.retain(|p| present.contains_key(p));
    }
    entries.push(Entry {
        manager: writer.manager.to_owned(),
        operation: "Apply".to_owned(),
        api_version: api_version(applied),
        time: writer.time.to_owned(),
        subresource: writer.scope.subresource().map(str::to_owned),
        fields: applied_paths,
    });
    write_entries(&mut result, &entries);
    Ok(result)
}

/// Removes the field or list item a path names.
fn remove_path(object: &mut Value, path: &Path) {
    let path: Vec<&String> = path.iter().filter(|e| *e != ".").collect();
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = object;
    for element in parents {
        let next = match lookup(node, element) {
            Some(next) => next,
            None => return,
        };
        node = next;
    }
    if let Some(field) = last.strip_prefix("f:") {
        if let Some(map) = node.as_object_mut() {
            map.remove(field);
        }
    } else if let Some(items) = node.as_array_mut() {
        if let Some(key) = last.strip_prefix("k:") {
            let key: Value = serde_json::from_str(key).unwrap_or(Value::Null);
            items.retain(|item| {
                !key.as_object()
                    .into_iter()
                    .flatten()
                    .all(|(k, v)| item.get(k) == Some(v))
            });
        } else if let Some(value) = last.strip_prefix("v:") {
            let value: Value = serde_json::from_str(value).unwrap_or(Value::Null);
            items.retain(|item| *item != value);
        }
    }
}

fn lookup<'v>(node: &'v mut Value, element: &str) -> Option<&'v mut Value> {
    if let Some(field) = element.strip_prefix("f:") {
        return node.get_mut(field);
    }
    let key: Value = serde_json::from_str(element.strip_prefix("k:")?).ok()?;
    node.as_array_mut()?.iter_mut().find(|item| {
        key.as_object()
            .into_iter()
            .flatten()
            .all(|(k, v)| item.get(k) == Some(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{RESOURCES, find};

    fn services() -> &'static ResourceType {
        &RESOURCES[find("", "v1", "services").unwrap()]
    }

    fn writer(manager: &str) -> Writer<'_> {
        Writer {
            manager,
            scope: Scope::Main,
            time: "2026-01-01T00:00:00Z",
        }
    }

    fn svc(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "default"}, "spec": spec})
    }

    fn managers(object: &Value) -> Vec<(String, String)> {
        read_entries(object)
            .into_iter()
            .map(|e| (e.manager, e.operation))
            .collect()
    }

    #[test]
    fn apply_creates_and_records_fields_v1() {
        let applied = svc(json!({"type": "ClusterIP", "ports": [{"port": 80, "name": "http"}]}));
        let result = server_side_apply(services(), None, &applied, &writer("a"), false).unwrap();
        assert_eq!(result["spec"], applied["spec"]);
        let fields = &result["metadata"]["managedFields"][0]["fieldsV1"];
        assert_eq!(fields["f:spec"]["f:type"], json!({}));
        assert_eq!(
            fields["f:spec"]["f:ports"]["k:{\"port\":80}"]["f:name"],
            json!({})
        );
        assert_eq!(fields["f:spec"]["f:ports"]["k:{\"port\":80}"]["."], json!({}));
    }

    #[test]
    fn a_different_value_on_a_field_owned_by_another_manager_conflicts_unless_forced() {
        let first = server_side_apply(
            services(),
            None,
            &svc(json!({"type": "ClusterIP"})),
            &writer("a"),
            false,
        )
        .unwrap();
        let conflicts = server_side_apply(
            services(),
            Some(&first),
            &svc(json!({"type": "NodePort"})),
            &writer("b"),
            false,
        )
        .unwrap_err();
        assert_eq!(conflicts, Conflicts(vec![("a".into(), ".spec.type".into())]));
        assert_eq!(
            conflicts.message().0,
            "Apply failed with 1 conflict: conflict with \"a\": .spec.type"
        );
        // The same value is shared ownership, not a conflict.
        let shared = server_side_apply(
            services(),
            Some(&first),
            &svc(json!({"type": "ClusterIP"})),
            &writer("b"),
            false,
        )
        .unwrap();
        assert_eq!(
            managers(&shared),
            [
                ("a".to_owned(), "Apply".to_owned()),
                ("b".to_owned(), "Apply".to_owned())
            ]
        );
        let forced = server_side_apply(
            services(),
            Some(&first),
            &svc(json!({"type": "NodePort"})),
            &writer("b"),
            true,
        )
        .unwrap();
        assert_eq!(forced["spec"]["type"], "NodePort");
        assert_eq!(
            managers(&forced),
            [("b".to_owned(), "Apply".to_owned())],
            "a lost its only field"
        );
    }

    #[test]
    fn fields_no_longer_applied_are_removed_unless_someone_else_owns_them() {
        let first = server_side_apply(
            services(),
            None,
            &svc(json!({"type": "ClusterIP", "sessionAffinity": "None"})),
            &writer("a"),
            false,
        )
        .unwrap();
        let second = server_side_apply(
            services(),
            Some(&first),
            &svc(json!({"type": "ClusterIP"})),
            &writer("a"),
            false,
        )
        .unwrap();
        assert_eq!(second["spec"], json!({"type": "ClusterIP"}));

        let mut updated = first.clone();
        updated["spec"]["sessionAffinity"] = json!("ClientIP");
        record_update(services(), Some(&first), &mut updated, &writer("kubectl-edit"));
        let third = server_side_apply(
            services(),
            Some(&updated),
            &svc(json!({"type": "ClusterIP"})),
            &writer("a"),
            false,
        )
        .unwrap();
        assert_eq!(
            third["spec"]["sessionAffinity"], "ClientIP",
            "owned by the Update manager now"
        );
    }

    #[test]
    fn updates_take_the_fields_they_change() {
        let first = server_side_apply(
            services(),
            None,
            &svc(json!({"type": "ClusterIP"})),
            &writer("a"),
            false,
        )
        .unwrap();
        let mut updated = first.clone();
        updated["spec"]["type"] = json!("NodePort");
        record_update(services(), Some(&first), &mut updated, &writer("b"));
        assert_eq!(managers(&updated), [("b".to_owned(), "Update".to_owned())]);
        // Re-applying the old value now conflicts with the updater.
        let conflicts = server_side_apply(
            services(),
            Some(&updated),
            &svc(json!({"type": "ClusterIP"})),
            &writer("a"),
            false,
        )
        .unwrap_err();
        assert_eq!(conflicts.0, [("b".to_owned(), ".spec.type".to_owned())]);
    }
}
