//! The patch types: JSON merge patch, JSON patch, and strategic merge patch.
//!
//! Strategic merge follows the real server for the list rules in [`crate::resources`]: lists of maps
//! merge by their key, sets of scalars are unioned, every other list is replaced. The directives
//! `$patch` (`replace`, `delete`, `merge`), `$deleteFromPrimitiveList/<field>`, `$retainKeys` and
//! `$setElementOrder/<field>` are understood.

use serde_json::{Map, Value};

use crate::resources::{ListKind, ResourceType};

/// A patch type, from the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub(crate) fn from_content_type(content_type: &str) -> Option<PatchType> {
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// Applies a merge, JSON or strategic patch to a copy of `current`.
pub(crate) fn apply(
    kind: PatchType,
    resource: &ResourceType,
    current: &Value,
    body: &[u8],
) -> Result<Value, String> {
    let mut target = current.clone();
    match kind {
        PatchType::Merge => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| format!("invalid JSON merge patch: {e}"))?;
            json_patch::merge(&mut target, &patch);
        }
        PatchType::Json => {
            let patch: json_patch::Patch =
                serde_json::from_slice(body).map_err(|e| format!("invalid JSON patch: {e}"))?;
            json_patch::patch(&mut target, &patch).map_err(|e| {
                format!("the server rejected our request due to an error in our request: {e}")
            })?;
        }
        PatchType::Strategic => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| format!("invalid strategic merge patch: {e}"))?;
            if !patch.is_object() {
                return Err("a strategic merge patch must be a JSON object".to_owned());
            }
            merge_value(resource, "", &mut target, &patch);
        }
        PatchType::Apply => unreachable!("server-side apply is handled by crate::apply"),
    }
    Ok(target)
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Merges `patch` into `target` at `path` (`[]` marks list items), with strategic-merge semantics.
pub(crate) fn merge_value(resource: &ResourceType, path: &str, target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if patch_map.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip_directives(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target_map = target.as_object_mut().expect("made an object above");
    let mut retain: Option<Vec<String>> = None;
    for (key, value) in patch_map {
        if key == "$patch" {
            continue;
        }
        if key == "$retainKeys" {
            retain = value.as_array().map(|keys| {
                keys.iter()
                    .filter_map(|k| k.as_str().map(str::to_owned))
                    .collect()
            });
            continue;
        }
        if key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Some(remove)) = (target_map.get_mut(field), value.as_array()) {
                items.retain(|item| !remove.contains(item));
            }
            continue;
        }
        match value {
            Value::Null => {
                target_map.remove(key);
            }
            Value::Object(inner) if inner.get("$patch").and_then(Value::as_str) == Some("delete") => {
                target_map.remove(key);
            }
            Value::Object(_) => {
                let entry = target_map.entry(key.clone()).or_insert(Value::Null);
                merge_value(resource, &child_path(path, key), entry, value);
            }
            Value::Array(items) => {
                let list_path = child_path(path, key);
                let existing = target_map.remove(key);
                target_map.insert(key.clone(), merge_list(resource, &list_path, existing, items));
            }
            scalar => {
                target_map.insert(key.clone(), scalar.clone());
            }
        }
    }
    if let Some(retain) = retain {
        target_map.retain(|key, _| retain.contains(key));
    }
}

fn merge_list(resource: &ResourceType, path: &str, existing: Option<Value>, patch: &[Value]) -> Value {
    let existing = match existing {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    let replace_all = patch
        .iter()
        .any(|item| item.get("$patch").and_then(Value::as_str) == Some("replace"));
    match resource.list_kind(path) {
        _ if replace_all => Value::Array(
            patch
                .iter()
                .filter(|item| item.get("$patch").is_none())
                .map(strip_directives)
                .collect(),
        ),
        None => Value::Array(patch.iter().map(strip_directives).collect()),
        Some(ListKind::Set) => {
            let mut merged = existing;
            for item in patch {
                if !merged.contains(item) {
                    merged.push(item.clone());
                }
            }
            Value::Array(merged)
        }
        Some(ListKind::Map(key)) => {
            let mut merged = existing;
            let item_path = format!("{path}[]");
            for item in patch {
                let Some(id) = item.get(key) else {
                    // An item without its merge key cannot be matched; the real server rejects it, we append it.
                    merged.push(strip_directives(item));
                    continue;
                };
                let position = merged.iter().position(|m| m.get(key) == Some(id));
                match (item.get("$patch").and_then(Value::as_str), position) {
                    (Some("delete"), Some(index)) => {
                        merged.remove(index);
                    }
                    (Some("delete"), None) => {}
                    (_, Some(index)) => merge_value(resource, &item_path, &mut merged[index], item),
                    (_, None) => merged.push(strip_directives(item)),
                }
            }
            Value::Array(merged)
        }
    }
}

/// A copy of `value` without strategic-merge directive keys.
fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::{RESOURCES, find};

    fn nodes() -> &'static ResourceType {
        &RESOURCES[find("", "v1", "nodes").unwrap()]
    }

    #[track_caller]
    fn check(current: Value, patch: Value, expected: Value) {
        let patched = apply(
            PatchType::Strategic,
            nodes(),
            &current,
            patch.to_string().as_bytes(),
        )
        .unwrap();
        assert_eq!(patched, expected);
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        check(
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            json!({"metadata": {"labels": {"b": null, "c": "3"}}}),
            json!({"metadata": {"labels": {"a": "1", "c": "3"}}}),
        );
    }

    #[test]
    fn conditions_merge_by_type() {
        check(
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "NetworkUnavailable", "status": "True"}]}}),
            json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]}}),
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]}}),
        );
    }

    #[test]
    fn taints_are_replaced_as_on_the_real_server() {
        check(
            json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]}}),
            json!({"spec": {"taints": [{"key": "c", "effect": "NoSchedule"}]}}),
            json!({"spec": {"taints": [{"key": "c", "effect": "NoSchedule"}]}}),
        );
    }

    #[test]
    fn finalizers_are_a_set_and_can_be_deleted_from() {
        check(
            json!({"metadata": {"finalizers": ["a"]}}),
            json!({"metadata": {"finalizers": ["b", "a"]}}),
            json!({"metadata": {"finalizers": ["a", "b"]}}),
        );
        check(
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
            json!({"metadata": {"finalizers": ["b"]}}),
        );
    }

    #[test]
    fn patch_directives() {
        check(
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "h"}]}}),
            json!({"status": {"addresses": [{"type": "Hostname", "$patch": "delete"}]}}),
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}),
        );
        check(
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}),
            json!({"status": {"addresses": [{"$patch": "replace"}, {"type": "ExternalIP", "address": "1.2.3.4"}]}}),
            json!({"status": {"addresses": [{"type": "ExternalIP", "address": "1.2.3.4"}]}}),
        );
        check(
            json!({"spec": {"a": 1, "b": 2}}),
            json!({"spec": {"$patch": "replace", "c": 3}}),
            json!({"spec": {"c": 3}}),
        );
        check(
            json!({"spec": {"a": 1, "b": 2}}),
            json!({"spec": {"$retainKeys": ["a"], "a": 5}}),
            json!({"spec": {"a": 5}}),
        );
    }

    #[test]
    fn merge_and_json_patch() {
        let merged = apply(
            PatchType::Merge,
            nodes(),
            &json!({"a": [1, 2], "b": {"c": 1}}),
            br#"{"a":[3],"b":{"c":null}}"#,
        )
        .unwrap();
        assert_eq!(merged, json!({"a": [3], "b": {}}));
        let patched = apply(
            PatchType::Json,
            nodes(),
            &json!({"a": 1}),
            br#"[{"op":"test","path":"/a","value":1},{"op":"add","path":"/b","value":2}]"#,
        )
        .unwrap();
        assert_eq!(patched, json!({"a": 1, "b": 2}));
        assert!(
            apply(
                PatchType::Json,
                nodes(),
                &json!({"a": 1}),
                br#"[{"op":"test","path":"/a","value":2}]"#
            )
            .is_err()
        );
    }
}
