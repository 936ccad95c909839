//! `labelSelector` and `fieldSelector` query parameters.

use serde_json::Value;

use crate::resources::ResourceType;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for term in split_top_level(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(term)?);
        }
        Ok(LabelSelector(requirements))
    }

    /// Whether it selects everything.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        if self.is_empty() {
            return true;
        }
        let labels = object.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|requirement| match requirement {
            Requirement::Exists(key) => get(key).is_some(),
            Requirement::NotExists(key) => get(key).is_none(),
            Requirement::Equals(key, value) => get(key) == Some(value.as_str()),
            Requirement::NotEquals(key, value) => get(key) != Some(value.as_str()),
            Requirement::In(key, values) => get(key).is_some_and(|v| values.iter().any(|x| x == v)),
            Requirement::NotIn(key, values) => get(key).is_none_or(|v| !values.iter().any(|x| x == v)),
        })
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (index, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_requirement(term: &str) -> Result<Requirement, String> {
    let invalid = || format!("unable to parse requirement: {term:?}");
    if let Some(key) = term.strip_prefix('!') {
        let key = key.trim();
        return if valid_key(key) {
            Ok(Requirement::NotExists(key.to_owned()))
        } else {
            Err(invalid())
        };
    }
    for (operator, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((key, values)) = term.split_once(operator) {
            let key = key.trim();
            let values = values.trim();
            let inner = values
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(invalid)?;
            let values: Vec<String> = inner
                .split(',')
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .collect();
            if !valid_key(key) || values.is_empty() {
                return Err(invalid());
            }
            return Ok(if negated {
                Requirement::NotIn(key.to_owned(), values)
            } else {
                Requirement::In(key.to_owned(), values)
            });
        }
    }
    for (operator, negated) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = term.split_once(operator) {
            let (key, value) = (key.trim(), value.trim());
            if !valid_key(key) || value.contains(['(', ')', ' ']) {
                return Err(invalid());
            }
            return Ok(if negated {
                Requirement::NotEquals(key.to_owned(), value.to_owned())
            } else {
                Requirement::Equals(key.to_owned(), value.to_owned())
            });
        }
    }
    if valid_key(term) {
        Ok(Requirement::Exists(term.to_owned()))
    } else {
        Err(invalid())
    }
}

/// A parsed field selector: `path=value` and `path!=value` terms on supported fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(Vec<(String, String, bool)>);

/// Fields the real server supports in field selectors, beyond `metadata.name` and `metadata.namespace`.
fn extra_fields(resource: &ResourceType) -> &'static [&'static str] {
    match (resource.group, resource.plural) {
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "events") => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "reason",
            "reportingController",
            "type",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "status.phase",
            "status.podIP",
        ],
        ("", "secrets") => &["type"],
        _ => &[],
    }
}

impl FieldSelector {
    pub(crate) fn parse(text: &str, resource: &ResourceType) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, negated) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, v, false)
            } else {
                return Err(format!("invalid selector: '{term}'; can't understand '{term}'"));
            };
            let field = field.trim();
            if !matches!(field, "metadata.name" | "metadata.namespace")
                && !extra_fields(resource).contains(&field)
            {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_owned(), value.trim().to_owned(), negated));
        }
        Ok(FieldSelector(terms))
    }

    /// The name a `metadata.name=X` term pins the request to (RBAC authorises list and watch by it).
    pub(crate) fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(field, _, negated)| field == "metadata.name" && !negated)
            .map(|(_, value, _)| value.as_str())
    }

    /// Whether it selects everything.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, value, negated)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let actual = match object.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                // A missing field compares as the empty string (a missing namespace, `spec.unschedulable`).
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            let actual = if field == "spec.unschedulable" && actual.is_empty() {
                "false".to_owned()
            } else {
                actual
            };
            (actual == *value) != *negated
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::{RESOURCES, find};

    fn object(labels: Value) -> Value {
        json!({"metadata": {"name": "n1", "namespace": "default", "labels": labels}, "spec": {}})
    }

    #[track_caller]
    fn check(selector: &str, labels: Value, expected: bool) {
        let parsed = LabelSelector::parse(selector).unwrap_or_else(|e| panic!("{selector}: {e}"));
        assert_eq!(parsed.matches(&object(labels)), expected, "{selector}");
    }

    #[test]
    fn label_selector_operators() {
        let labels = json!({"app": "web", "tier": "front", "example.com/role": "lb"});
        check("app=web", labels.clone(), true);
        check("app==web", labels.clone(), true);
        check("app!=web", labels.clone(), false);
        check("app!=db", labels.clone(), true);
        check("missing!=x", labels.clone(), true);
        check("app in (db, web)", labels.clone(), true);
        check("app in (db)", labels.clone(), false);
        check("app notin (db)", labels.clone(), true);
        check("missing notin (db)", labels.clone(), true);
        check("tier", labels.clone(), true);
        check("!tier", labels.clone(), false);
        check("!missing", labels.clone(), true);
        check(
            "example.com/role=lb,app in (web,db),!missing",
            labels.clone(),
            true,
        );
        check("", labels, true);
    }

    #[test]
    fn label_selector_rejects_nonsense() {
        for bad in ["app in web", "app in ()", "=x", "a b", "app=(x)"] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn field_selector_on_supported_fields_only() {
        let leases = &RESOURCES[find("coordination.k8s.io", "v1", "leases").unwrap()];
        let selector = FieldSelector::parse("metadata.name=n1", leases).unwrap();
        assert!(selector.matches(&object(json!({}))));
        assert_eq!(selector.pinned_name(), Some("n1"));
        assert!(
            !FieldSelector::parse("metadata.name!=n1", leases)
                .unwrap()
                .matches(&object(json!({})))
        );
        assert_eq!(
            FieldSelector::parse("spec.holderIdentity=x", leases).unwrap_err(),
            "field label not supported: spec.holderIdentity"
        );
        let nodes = &RESOURCES[find("", "v1", "nodes").unwrap()];
        assert!(
            FieldSelector::parse("spec.unschedulable=false", nodes)
                .unwrap()
                .matches(&object(json!({})))
        );
    }
}
