//! Errors of reading and validating a configuration.

use std::fmt;

/// A validation error on one field, printed exactly as upstream's `field.Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Field path, e.g. `controllerLeaders[1].component`.
    pub path: String,
    /// What is wrong.
    pub kind: FieldErrorKind,
}

/// The kinds of [`FieldError`], as upstream's `field.ErrorType`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`.
    Required {
        /// Extra explanation, may be empty.
        detail: String,
    },
    /// `Invalid value`.
    Invalid {
        /// The value as written.
        value: String,
        /// Why it is invalid.
        detail: String,
    },
    /// `Duplicate value`.
    Duplicate {
        /// The repeated value.
        value: String,
        /// Where the first one is, may be empty.
        detail: String,
    },
    /// `Unsupported value`.
    NotSupported {
        /// The value as written.
        value: String,
        /// Why, may be empty.
        detail: String,
    },
}

impl FieldError {
    pub(crate) fn required(path: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Required {
                detail: detail.into(),
            },
        }
    }

    pub(crate) fn invalid(path: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Invalid {
                value: value.to_owned(),
                detail: detail.into(),
            },
        }
    }

    pub(crate) fn duplicate(path: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::Duplicate {
                value: value.to_owned(),
                detail: detail.into(),
            },
        }
    }

    pub(crate) fn not_supported(path: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            kind: FieldErrorKind::NotSupported {
                value: value.to_owned(),
                detail: detail.into(),
            },
        }
    }

    /// The message without the path, e.g. `Required value: leaderName must be set …`.
    pub fn message(&self) -> String {
        fn with_detail(head: String, detail: &str) -> String {
            if detail.is_empty() {
                head
            } else {
                format!("{head}: {detail}")
            }
        }
        match &self.kind {
            FieldErrorKind::Required { detail } => with_detail("Required value".to_owned(), detail),
            FieldErrorKind::Invalid { value, detail } => {
                with_detail(format!("Invalid value: {value:?}"), detail)
            }
            FieldErrorKind::Duplicate { value, detail } => {
                with_detail(format!("Duplicate value: {value:?}"), detail)
            }
            FieldErrorKind::NotSupported { value, detail } => {
                with_detail(format!("Unsupported value: {value:?}"), detail)
            }
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message())
    }
}

/// Whether a problem stops the configuration from being used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The configuration is rejected.
    Error,
    /// Allowed, but probably not what was meant.
    Warning,
}

/// One problem in a configuration file, located as precisely as the input allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Error or warning.
    pub severity: Severity,
    /// 1-based line in the file.
    pub line: Option<usize>,
    /// Field path, e.g. `controllerLeaders[0].component`.
    pub field: Option<String>,
    /// What is wrong, without the path.
    pub message: String,
    /// What to do about it.
    pub hints: Vec<String>,
}

impl Problem {
    pub(crate) fn error(line: Option<usize>, field: Option<String>, message: impl Into<String>) -> Self {
        Problem {
            severity: Severity::Error,
            line,
            field,
            message: message.into(),
            hints: Vec::new(),
        }
    }

    pub(crate) fn from_field_error(line: Option<usize>, error: &FieldError) -> Self {
        Problem::error(line, Some(error.path.clone()), error.message())
    }

    pub(crate) fn warning(mut self) -> Self {
        self.severity = Severity::Warning;
        self
    }

    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hints.push(hint.into());
        self
    }

    /// Renders the problem for a file: `FILE:LINE: field: message` and one `  hint:` line per hint.
    pub fn render(&self, source_name: &str) -> String {
        let mut out = String::from(source_name);
        if let Some(line) = self.line {
            out.push_str(&format!(":{line}"));
        }
        out.push_str(": ");
        if self.severity == Severity::Warning {
            out.push_str("warning: ");
        }
        if let Some(field) = &self.field {
            out.push_str(field);
            out.push_str(": ");
        }
        out.push_str(&self.message);
        for hint in &self.hints {
            out.push_str("\n  hint: ");
            out.push_str(&hint.replace('\n', "\n        "));
        }
        out
    }
}

/// A configuration file that cannot be used, with every problem found in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file (or other source) the bytes came from.
    pub source_name: String,
    /// The problems, in file order; at least one has [`Severity::Error`].
    pub problems: Vec<Problem>,
}

impl ConfigError {
    pub(crate) fn new(source_name: &str, problems: Vec<Problem>) -> Self {
        ConfigError {
            source_name: source_name.to_owned(),
            problems,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, problem) in self.problems.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            f.write_str(&problem.render(&self.source_name))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(error: FieldError, expected: &str) {
        assert_eq!(error.to_string(), expected);
    }

    #[test]
    fn field_errors_print_like_upstream() {
        check(
            FieldError::required(
                "leaderName",
                "leaderName must be set for LeaderMigrationConfiguration",
            ),
            "leaderName: Required value: leaderName must be set for LeaderMigrationConfiguration",
        );
        check(
            FieldError::required("controllerLeaders[0].component", ""),
            "controllerLeaders[0].component: Required value",
        );
        check(
            FieldError::invalid(
                "resourceLock",
                "x",
                "resource Lock must be one of 'leases' or 'endpoints'",
            ),
            "resourceLock: Invalid value: \"x\": resource Lock must be one of 'leases' or 'endpoints'",
        );
        check(
            FieldError::duplicate("controllerLeaders[1].name", "route", ""),
            "controllerLeaders[1].name: Duplicate value: \"route\"",
        );
    }

    #[test]
    fn problems_render_file_line_field_message_and_hints() {
        let problem = Problem::error(
            Some(7),
            Some("controllerLeaders[0].component".into()),
            "Required value",
        )
        .hint("write component: \"*\"");
        assert_eq!(
            problem.render("lm.yaml"),
            "lm.yaml:7: controllerLeaders[0].component: Required value\n  hint: write component: \"*\""
        );
        assert_eq!(
            Problem::error(None, None, "empty file").render("lm.yaml"),
            "lm.yaml: empty file"
        );
        assert_eq!(
            Problem::error(Some(2), None, "odd").warning().render("f"),
            "f:2: warning: odd"
        );
    }
}
