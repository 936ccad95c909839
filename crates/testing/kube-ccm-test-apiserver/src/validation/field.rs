//! Field errors as apimachinery's `field.Error` renders them, and the 422 `Invalid` Status they make.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::status::ApiError;

/// A field path: `a.b`, `a[0]`, `a[key]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Path(String);

impl Path {
    pub(crate) fn root(name: &str) -> Path {
        Path(name.to_owned())
    }

    pub(crate) fn child(&self, name: &str) -> Path {
        if self.0.is_empty() {
            Path(name.to_owned())
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }

    pub(crate) fn index(&self, index: usize) -> Path {
        Path(format!("{}[{index}]", self.0))
    }

    pub(crate) fn key(&self, key: &str) -> Path {
        Path(format!("{}[{key}]", self.0))
    }

    fn render(&self) -> &str {
        if self.0.is_empty() { "[]" } else { &self.0 }
    }
}

/// A value as `field.Error` shows it: strings Go-quoted, numbers and bools plain, the rest as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shown(String);

impl Shown {
    pub(crate) fn text(text: &str) -> Shown {
        Shown(go_quote(text))
    }

    pub(crate) fn number(number: i64) -> Shown {
        Shown(number.to_string())
    }

    /// A JSON value: a string is Go-quoted, anything else written as JSON.
    pub(crate) fn json(value: &Value) -> Shown {
        match value {
            Value::String(text) => Shown::text(text),
            other => Shown(other.to_string()),
        }
    }

    /// A list or map, rendered as `json.Marshal` does (1.34+).
    pub(crate) fn marshalled(value: &Value) -> Shown {
        Shown(value.to_string())
    }

    /// An internal Go struct, rendered as `json.Marshal` does it (1.34+): Go field names, in their order.
    pub(crate) fn fields(fields: &[(&str, &Value)]) -> Shown {
        let inner: Vec<String> = fields
            .iter()
            .map(|(name, value)| format!("{}:{value}", Value::from(*name)))
            .collect();
        Shown(format!("{{{}}}", inner.join(",")))
    }
}

/// What went wrong with a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    Invalid {
        value: Shown,
        detail: String,
    },
    Required(String),
    Forbidden(String),
    NotSupported {
        value: Shown,
        supported: &'static [&'static str],
    },
    Duplicate {
        value: Shown,
        detail: String,
    },
    TooLong(usize),
}

/// One field error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub(crate) path: Path,
    pub(crate) problem: Problem,
}

impl FieldError {
    fn reason(&self) -> &'static str {
        match self.problem {
            Problem::Invalid { .. } => "FieldValueInvalid",
            Problem::Required(_) => "FieldValueRequired",
            Problem::Forbidden(_) => "FieldValueForbidden",
            Problem::NotSupported { .. } => "FieldValueNotSupported",
            Problem::Duplicate { .. } => "FieldValueDuplicate",
            Problem::TooLong(_) => "FieldValueTooLong",
        }
    }

    /// The message without the field, as a `cause.message`.
    fn body(&self) -> String {
        let with_detail = |head: String, detail: &str| {
            if detail.is_empty() {
                head
            } else {
                format!("{head}: {detail}")
            }
        };
        match &self.problem {
            Problem::Invalid { value, detail } => with_detail(format!("Invalid value: {}", value.0), detail),
            Problem::Required(detail) => with_detail("Required value".to_owned(), detail),
            Problem::Forbidden(detail) => with_detail("Forbidden".to_owned(), detail),
            Problem::NotSupported { value, supported } => {
                let list: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
                format!(
                    "Unsupported value: {}: supported values: {}",
                    value.0,
                    list.join(", ")
                )
            }
            Problem::Duplicate { value, detail } => {
                with_detail(format!("Duplicate value: {}", value.0), detail)
            }
            Problem::TooLong(max) => {
                format!(
                    "Too long: may not be more than {max} {}",
                    if *max == 1 { "byte" } else { "bytes" }
                )
            }
        }
    }

    /// `field: body`.
    pub(crate) fn render(&self) -> String {
        format!("{}: {}", self.path.render(), self.body())
    }
}

/// The errors of one validation, in the order found.
#[derive(Debug, Default)]
pub(crate) struct Errors(pub(crate) Vec<FieldError>);

impl Errors {
    pub(crate) fn push(&mut self, path: Path, problem: Problem) {
        self.0.push(FieldError { path, problem });
    }

    pub(crate) fn invalid(&mut self, path: Path, value: Shown, detail: impl Into<String>) {
        self.push(
            path,
            Problem::Invalid {
                value,
                detail: detail.into(),
            },
        );
    }

    /// One `Invalid` error per message.
    pub(crate) fn invalid_each(&mut self, path: &Path, value: &str, messages: Vec<String>) {
        for message in messages {
            self.invalid(path.clone(), Shown::text(value), message);
        }
    }

    pub(crate) fn required(&mut self, path: Path, detail: impl Into<String>) {
        self.push(path, Problem::Required(detail.into()));
    }

    pub(crate) fn forbidden(&mut self, path: Path, detail: impl Into<String>) {
        self.push(path, Problem::Forbidden(detail.into()));
    }

    pub(crate) fn not_supported(&mut self, path: Path, value: &str, supported: &'static [&'static str]) {
        self.push(
            path,
            Problem::NotSupported {
                value: Shown::text(value),
                supported,
            },
        );
    }

    pub(crate) fn duplicate(&mut self, path: Path, value: Shown, detail: impl Into<String>) {
        self.push(
            path,
            Problem::Duplicate {
                value,
                detail: detail.into(),
            },
        );
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The 422 `Invalid` error for an object of `kind` (in `group`) called `name`, or `Ok` when there are none.
    pub(crate) fn into_result(self, kind: &str, group: &str, name: &str) -> Result<(), ApiError> {
        if self.0.is_empty() {
            return Ok(());
        }
        Err(invalid(kind, group, name, &self.0))
    }
}

/// apimachinery's `NewInvalid`: the message aggregates the errors (one: as is; several: bracketed, duplicates
/// dropped), and each becomes a cause.
pub(crate) fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> ApiError {
    let group_kind = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    let mut rendered: Vec<String> = Vec::new();
    for error in errors {
        let text = error.render();
        if !rendered.contains(&text) {
            rendered.push(text);
        }
    }
    let aggregate = match rendered.as_slice() {
        [] => String::new(),
        [one] => format!(": {one}"),
        many => format!(": [{}]", many.join(", ")),
    };
    let causes: Vec<Value> = errors
        .iter()
        .map(|e| {
            let mut cause = json!({"reason": e.reason(), "message": e.body()});
            let field = e.path.render();
            if !field.is_empty() {
                cause["field"] = json!(field);
            }
            cause
        })
        .collect();
    let mut details = json!({"causes": causes});
    if !kind.is_empty() {
        details["kind"] = json!(kind);
    }
    if !name.is_empty() {
        details["name"] = json!(name);
    }
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    ApiError::unprocessable(
        format!("{group_kind} {} is invalid{aggregate}", go_quote(name)),
        details,
    )
}

/// Go's `%q`.
pub(crate) fn go_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_error_is_shown_bare_and_several_in_brackets_without_repeats() {
        let mut errors = Errors::default();
        errors.invalid(
            Path::root("spec").child("leaseDurationSeconds"),
            Shown::number(0),
            "must be greater than 0",
        );
        let error = invalid("Lease", "coordination.k8s.io", "x", &errors.0);
        assert_eq!(
            error.message,
            "Lease.coordination.k8s.io \"x\" is invalid: spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"
        );
        assert_eq!(
            error.details,
            Some(
                json!({"name": "x", "group": "coordination.k8s.io", "kind": "Lease", "causes": [
                    {"reason": "FieldValueInvalid", "message": "Invalid value: 0: must be greater than 0", "field": "spec.leaseDurationSeconds"}
                ]})
            )
        );
        let mut errors = Errors::default();
        let taints = Path::root("metadata").child("taints");
        errors.not_supported(
            taints.index(0).child("effect"),
            "Sometimes",
            &["NoSchedule", "PreferNoSchedule", "NoExecute"],
        );
        errors.required(taints.index(1).child("effect"), "");
        errors.required(taints.index(1).child("effect"), "");
        errors.push(Path::root(""), Problem::TooLong(1_048_576));
        let error = invalid("Node", "", "n1", &errors.0);
        assert_eq!(
            error.message,
            "Node \"n1\" is invalid: [metadata.taints[0].effect: Unsupported value: \"Sometimes\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\", metadata.taints[1].effect: Required value, []: Too long: may not be more than 1048576 bytes]"
        );
        assert_eq!(error.details.unwrap()["causes"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn go_quoting() {
        assert_eq!(go_quote("a\"b\\c\nd\u{1}é"), "\"a\\\"b\\\\c\\nd\\x01é\"");
    }
}
