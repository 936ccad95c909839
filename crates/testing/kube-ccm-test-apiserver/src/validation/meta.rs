//! `metadata`: names per kind, labels, annotations, finalizers (apimachinery's `ValidateObjectMeta`, and the
//! core group's additions).

use std::collections::BTreeMap;

use serde_json::Value;

use super::field::{Errors, Path, Shown};
use super::names::{
    dns1035_label, dns1123_label, dns1123_subdomain, label_value, path_segment, qualified_name,
};

/// The largest total size of an object's annotations (keys and values), in bytes.
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

/// Finalizer names that need no domain prefix.
const STANDARD_FINALIZERS: [&str; 3] = ["kubernetes", "orphan", "foregroundDeletion"];

/// Which rule a kind's names follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRule {
    /// DNS-1123 subdomain: most kinds.
    Subdomain,
    /// DNS-1123 label: namespaces.
    Label,
    /// DNS-1035 label: services.
    Dns1035,
    /// Only usable as a path segment: RBAC objects, core/v1 Events.
    PathSegment,
}

impl NameRule {
    fn check(self, name: &str) -> Vec<String> {
        match self {
            NameRule::Subdomain => dns1123_subdomain(name),
            NameRule::Label => dns1123_label(name),
            NameRule::Dns1035 => dns1035_label(name),
            NameRule::PathSegment => path_segment(name),
        }
    }
}

fn text<'a>(object: &'a Value, pointer: &str) -> Option<&'a str> {
    object.pointer(pointer).and_then(Value::as_str)
}

fn string_map(object: &Value, pointer: &str) -> BTreeMap<String, String> {
    object
        .pointer(pointer)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

fn finalizers(object: &Value) -> Vec<&str> {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// Labels at `path`: keys as qualified names, values as label values.
pub(crate) fn labels(map: &BTreeMap<String, String>, path: &Path, errors: &mut Errors) {
    for (key, value) in map {
        errors.invalid_each(path, key, qualified_name(key));
        errors.invalid_each(path, value, label_value(value));
    }
}

/// An object's metadata. `core`: the core group's extra finalizer rule applies.
pub(crate) fn object_meta(object: &Value, rule: NameRule, core: bool, errors: &mut Errors) {
    let metadata = Path::root("metadata");
    let name = text(object, "/metadata/name").unwrap_or_default();
    let generate_name = text(object, "/metadata/generateName").unwrap_or_default();
    if name.is_empty() {
        if generate_name.is_empty() {
            errors.required(metadata.child("name"), "name or generateName is required");
        }
    } else {
        errors.invalid_each(&metadata.child("name"), name, rule.check(name));
    }
    if !generate_name.is_empty() {
        // Checked as a prefix: a trailing '-' stands for what the server appends.
        let prefix = match generate_name.strip_suffix('-') {
            Some(_) if generate_name.len() > 1 => {
                format!(
                    "{}a",
                    &generate_name[..generate_name.len() - 2.min(generate_name.len())]
                )
            }
            _ => generate_name.to_owned(),
        };
        let messages = match rule {
            NameRule::PathSegment => path_segment(generate_name)
                .into_iter()
                .filter(|m| !m.starts_with("may not be '"))
                .collect(),
            _ => rule.check(&prefix),
        };
        errors.invalid_each(&metadata.child("generateName"), generate_name, messages);
    }
    if let Some(generation) = object.pointer("/metadata/generation").and_then(Value::as_i64)
        && generation < 0
    {
        errors.invalid(
            metadata.child("generation"),
            Shown::number(generation),
            "must be greater than or equal to 0",
        );
    }
    labels(
        &string_map(object, "/metadata/labels"),
        &metadata.child("labels"),
        errors,
    );
    let annotations = string_map(object, "/metadata/annotations");
    let annotations_path = metadata.child("annotations");
    let mut total = 0;
    for (key, value) in &annotations {
        total += key.len() + value.len();
        errors.invalid_each(&annotations_path, key, qualified_name(&key.to_lowercase()));
    }
    if total > ANNOTATIONS_MAX_BYTES {
        errors.push(
            annotations_path,
            super::field::Problem::TooLong(ANNOTATIONS_MAX_BYTES),
        );
    }
    let finalizers_path = metadata.child("finalizers");
    let list = finalizers(object);
    for finalizer in &list {
        errors.invalid_each(&finalizers_path, finalizer, qualified_name(finalizer));
    }
    if list.contains(&"orphan") && list.contains(&"foregroundDeletion") {
        errors.invalid(
            finalizers_path.clone(),
            Shown::marshalled(&serde_json::json!(list)),
            "finalizer orphan and foregroundDeletion cannot be both set",
        );
    }
    if core {
        for (index, finalizer) in list.iter().enumerate() {
            if !finalizer.contains('/') && !STANDARD_FINALIZERS.contains(finalizer) {
                errors.invalid(
                    finalizers_path.index(index),
                    Shown::text(finalizer),
                    "name is neither a standard finalizer name nor is it fully qualified",
                );
            }
        }
    }
}

/// What an update may not do to metadata: add finalizers to an object being deleted.
pub(crate) fn object_meta_update(new: &Value, old: &Value, errors: &mut Errors) {
    if old.pointer("/metadata/deletionTimestamp").is_none() {
        return;
    }
    let before = finalizers(old);
    let mut added: Vec<&str> = finalizers(new)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if added.is_empty() {
        return;
    }
    added.sort_unstable();
    let list: Vec<String> = added.iter().map(|f| super::field::go_quote(f)).collect();
    errors.forbidden(
        Path::root("metadata").child("finalizers"),
        format!(
            "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
            list.join(", ")
        ),
    );
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rendered(object: Value, rule: NameRule, core: bool) -> Vec<String> {
        let mut errors = Errors::default();
        object_meta(&object, rule, core, &mut errors);
        errors
            .0
            .iter()
            .map(super::super::field::FieldError::render)
            .collect()
    }

    #[test]
    fn names_labels_annotations_and_finalizers() {
        assert!(
            rendered(
                json!({"metadata": {"name": "n1", "labels": {"a/b": "c"}}}),
                NameRule::Subdomain,
                true
            )
            .is_empty()
        );
        assert_eq!(
            rendered(json!({"metadata": {}}), NameRule::Subdomain, true),
            ["metadata.name: Required value: name or generateName is required"]
        );
        let long = "v".repeat(100);
        assert_eq!(
            rendered(
                json!({"metadata": {"name": "n", "labels": {"k": long}}}),
                NameRule::Subdomain,
                true
            ),
            [format!(
                "metadata.labels: Invalid value: \"{long}\": must be no more than 63 characters"
            )]
        );
        let big = "x".repeat(300 * 1024);
        assert_eq!(
            rendered(
                json!({"metadata": {"name": "n", "annotations": {"k": big}}}),
                NameRule::Subdomain,
                true
            ),
            ["metadata.annotations: Too long: may not be more than 262144 bytes"]
        );
        assert_eq!(
            rendered(
                json!({"metadata": {"name": "n", "finalizers": ["mine"]}}),
                NameRule::Subdomain,
                true
            ),
            [
                "metadata.finalizers[0]: Invalid value: \"mine\": name is neither a standard finalizer name nor is it fully qualified"
            ]
        );
        assert!(
            rendered(
                json!({"metadata": {"name": "n", "finalizers": ["mine"]}}),
                NameRule::Subdomain,
                false
            )
            .is_empty()
        );
        assert!(
            rendered(
                json!({"metadata": {"generateName": "web-"}}),
                NameRule::Dns1035,
                true
            )
            .is_empty()
        );
        assert_eq!(
            rendered(json!({"metadata": {"name": "a/b"}}), NameRule::PathSegment, false),
            ["metadata.name: Invalid value: \"a/b\": may not contain '/'"]
        );
    }

    #[test]
    fn no_new_finalizers_while_deleting() {
        let old = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["a/b"]}});
        let new = json!({"metadata": {"finalizers": ["a/b", "z/y", "c/d"]}});
        let mut errors = Errors::default();
        object_meta_update(&new, &old, &mut errors);
        assert_eq!(
            errors.0[0].render(),
            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"c/d\", \"z/y\"}"
        );
    }
}
