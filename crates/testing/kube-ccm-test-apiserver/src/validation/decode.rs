//! Decoding a body as its kind, as the real server does before anything else: a value of the wrong type is
//! refused (a number that overflows an int32 field, a string where a number belongs), and a field the kind
//! does not have is refused, warned about, or dropped, as `fieldValidation` says.
//!
//! The kinds' schemas are `k8s-openapi`'s types: the body is deserialized into the kind's type, noting every
//! key the type skips (an unknown field) and the path of the first type error.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::resources::ResourceType;

/// A path inside an object: field names and list indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    Field(String),
    Index(usize),
}

/// `spec.ports[0].foo`.
pub(crate) fn render(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(name) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(name);
            }
            Step::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

/// A value the kind's type cannot hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TypeError {
    /// Go's `json: cannot unmarshal …` text.
    pub(crate) message: String,
}

/// What decoding found: unknown fields (in the order met), or the first type error.
pub(crate) struct Decoded {
    pub(crate) unknown: Vec<Vec<Step>>,
}

fn steps_of_ignored(path: &serde_ignored::Path<'_>, out: &mut Vec<Step>) {
    match path {
        serde_ignored::Path::Root => {}
        serde_ignored::Path::Seq { parent, index } => {
            steps_of_ignored(parent, out);
            out.push(Step::Index(*index));
        }
        serde_ignored::Path::Map { parent, key } => {
            steps_of_ignored(parent, out);
            out.push(Step::Field(key.clone()));
        }
        serde_ignored::Path::Some { parent }
        | serde_ignored::Path::NewtypeStruct { parent }
        | serde_ignored::Path::NewtypeVariant { parent } => steps_of_ignored(parent, out),
    }
}

/// Fields whose keys are free (maps): a type error inside one is reported at the map, as Go does.
const MAP_FIELDS: &[&str] = &[
    "labels",
    "annotations",
    "selector",
    "nodeSelector",
    "data",
    "binaryData",
    "stringData",
    "capacity",
    "allocatable",
    "matchLabels",
];

fn decode_as<T: DeserializeOwned>(resource: &ResourceType, object: &Value) -> Result<Decoded, TypeError> {
    let mut unknown = Vec::new();
    let mut note = |path: serde_ignored::Path<'_>| {
        let mut steps = Vec::new();
        steps_of_ignored(&path, &mut steps);
        unknown.push(steps);
    };
    // Tracking the path of every field costs more than decoding: only a body that fails is decoded again
    // to say where.
    let ignoring = serde_ignored::Deserializer::new(object, &mut note);
    if T::deserialize(ignoring).is_ok() {
        return Ok(Decoded { unknown });
    }
    match serde_path_to_error::deserialize::<_, T>(object) {
        Ok(_) => Ok(Decoded { unknown }),
        Err(error) => {
            let mut steps = Vec::new();
            for segment in error.path().iter() {
                match segment {
                    serde_path_to_error::Segment::Seq { index } => steps.push(Step::Index(*index)),
                    serde_path_to_error::Segment::Map { key } => steps.push(Step::Field(key.clone())),
                    serde_path_to_error::Segment::Enum { .. } | serde_path_to_error::Segment::Unknown => {}
                }
            }
            Err(type_error(resource, object, &steps, &error.inner().to_string()))
        }
    }
}

/// Go's `json: cannot unmarshal <what> into Go struct field <Struct>.<path> of type <type>`.
fn type_error(resource: &ResourceType, object: &Value, steps: &[Step], serde_message: &str) -> TypeError {
    let mut value = object;
    let mut fields: Vec<&str> = Vec::new();
    for step in steps {
        match step {
            Step::Field(name) => {
                // A key of a free map is not part of Go's path.
                if fields.last().is_some_and(|last| MAP_FIELDS.contains(last)) {
                    value = value.get(name).unwrap_or(&Value::Null);
                    continue;
                }
                fields.push(name);
                value = value.get(name).unwrap_or(&Value::Null);
            }
            Step::Index(index) => value = value.get(index).unwrap_or(&Value::Null),
        }
    }
    let what = match value {
        Value::Number(number) => format!("number {number}"),
        Value::String(_) => "string".to_owned(),
        Value::Bool(_) => "bool".to_owned(),
        Value::Array(_) => "array".to_owned(),
        Value::Object(_) => "object".to_owned(),
        Value::Null => "null".to_owned(),
    };
    let go_type = go_type(serde_message);
    let container = go_struct(resource, &fields[..fields.len().saturating_sub(1)]);
    TypeError {
        message: format!(
            "json: cannot unmarshal {what} into Go struct field {container}.{} of type {go_type}",
            fields.join(".")
        ),
    }
}

/// The Go type serde expected.
fn go_type(serde_message: &str) -> &'static str {
    let expected = serde_message.rsplit("expected ").next().unwrap_or_default();
    match expected.trim() {
        "i32" => "int32",
        "i64" => "int64",
        "u16" | "u32" | "u64" | "usize" => "int64",
        "f32" | "f64" => "float64",
        "bool" | "a boolean" => "bool",
        e if e.contains("string") => "string",
        e if e.contains("sequence") => "[]interface {}",
        e if e.contains("map") => "map[string]string",
        _ => "struct",
    }
}

/// The Go struct that holds a field, from the path of its parent (the struct names of the kinds this server
/// stores; others are named by kind).
fn go_struct(resource: &ResourceType, parent: &[&str]) -> String {
    let kind = resource.kind;
    match parent {
        [] => kind.to_owned(),
        ["metadata"] => "ObjectMeta".to_owned(),
        ["metadata", "ownerReferences"] => "OwnerReference".to_owned(),
        ["metadata", "managedFields"] => "ManagedFieldsEntry".to_owned(),
        ["spec"] => format!("{kind}Spec"),
        ["status"] => format!("{kind}Status"),
        ["spec", "ports"] => "ServicePort".to_owned(),
        ["spec", "taints"] => "Taint".to_owned(),
        ["status", "addresses"] => "NodeAddress".to_owned(),
        ["status", "conditions"] => format!("{kind}Condition"),
        ["status", "loadBalancer"] => "LoadBalancerStatus".to_owned(),
        ["status", "loadBalancer", "ingress"] => "LoadBalancerIngress".to_owned(),
        ["status", "loadBalancer", "ingress", "ports"] => "PortStatus".to_owned(),
        ["involvedObject" | "regarding" | "related"] => "ObjectReference".to_owned(),
        ["series"] => "EventSeries".to_owned(),
        ["source" | "deprecatedSource"] => "EventSource".to_owned(),
        ["rules"] => "PolicyRule".to_owned(),
        ["subjects"] => "Subject".to_owned(),
        ["roleRef"] => "RoleRef".to_owned(),
        [.., last] => {
            let mut chars = last.chars();
            chars
                .next()
                .map_or_else(|| kind.to_owned(), |c| c.to_uppercase().chain(chars).collect())
        }
    }
}

/// Decodes `object` as `resource`'s kind.
pub(crate) fn decode(resource: &ResourceType, object: &Value) -> Result<Decoded, TypeError> {
    use k8s_openapi::api::{apps, coordination, core, events, rbac};
    match (resource.group, resource.kind) {
        ("", "Namespace") => decode_as::<core::v1::Namespace>(resource, object),
        ("", "Node") => decode_as::<core::v1::Node>(resource, object),
        ("", "Service") => decode_as::<core::v1::Service>(resource, object),
        ("", "Pod") => decode_as::<core::v1::Pod>(resource, object),
        ("", "ConfigMap") => decode_as::<core::v1::ConfigMap>(resource, object),
        ("", "Secret") => decode_as::<core::v1::Secret>(resource, object),
        ("", "ServiceAccount") => decode_as::<core::v1::ServiceAccount>(resource, object),
        ("", "Event") => decode_as::<core::v1::Event>(resource, object),
        ("events.k8s.io", "Event") => decode_as::<events::v1::Event>(resource, object),
        ("coordination.k8s.io", "Lease") => decode_as::<coordination::v1::Lease>(resource, object),
        ("apps", "Deployment") => decode_as::<apps::v1::Deployment>(resource, object),
        (_, "Role") => decode_as::<rbac::v1::Role>(resource, object),
        (_, "ClusterRole") => decode_as::<rbac::v1::ClusterRole>(resource, object),
        (_, "RoleBinding") => decode_as::<rbac::v1::RoleBinding>(resource, object),
        (_, "ClusterRoleBinding") => decode_as::<rbac::v1::ClusterRoleBinding>(resource, object),
        _ => Ok(Decoded { unknown: Vec::new() }),
    }
}

/// Removes the field at `path` from `object`, as decoding into a typed object drops it.
pub(crate) fn remove(object: &mut Value, path: &[Step]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut value = object;
    for step in parents {
        let next = match step {
            Step::Field(name) => value.get_mut(name.as_str()),
            Step::Index(index) => value.get_mut(*index),
        };
        match next {
            Some(next) => value = next,
            None => return,
        }
    }
    if let (Step::Field(name), Some(map)) = (last, value.as_object_mut()) {
        map.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::{RESOURCES, find};

    fn resource(group: &str, plural: &str) -> &'static ResourceType {
        &RESOURCES[find(group, "v1", plural).unwrap()]
    }

    #[test]
    fn type_errors_read_as_gos() {
        let leases = resource("coordination.k8s.io", "leases");
        let error = decode(
            leases,
            &json!({"spec": {"leaseDurationSeconds": 3_000_000_000_i64}}),
        )
        .err()
        .unwrap();
        assert_eq!(
            error.message,
            "json: cannot unmarshal number 3000000000 into Go struct field LeaseSpec.spec.leaseDurationSeconds of type int32"
        );
        let services = resource("", "services");
        let error = decode(services, &json!({"spec": {"ports": [{"port": "eighty"}]}}))
            .err()
            .unwrap();
        assert_eq!(
            error.message,
            "json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32"
        );
        let nodes = resource("", "nodes");
        let error = decode(nodes, &json!({"metadata": {"labels": {"a": 1}}}))
            .err()
            .unwrap();
        assert_eq!(
            error.message,
            "json: cannot unmarshal number 1 into Go struct field ObjectMeta.metadata.labels of type string"
        );
    }

    #[test]
    fn unknown_fields_are_found_and_removed() {
        let services = resource("", "services");
        let mut object =
            json!({"metadata": {"name": "s", "colour": "red"}, "spec": {"ports": [{"port": 80, "foo": 1}]}});
        let decoded = decode(services, &object).unwrap();
        let paths: Vec<String> = decoded.unknown.iter().map(|p| render(p)).collect();
        assert_eq!(paths, ["metadata.colour", "spec.ports[0].foo"]);
        for path in &decoded.unknown {
            remove(&mut object, path);
        }
        assert_eq!(
            object,
            json!({"metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}})
        );
    }
}
