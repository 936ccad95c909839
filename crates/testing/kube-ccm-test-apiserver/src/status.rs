//! API errors as `Status` objects, with the reasons and codes of the real server, so clients map them right.

use serde_json::{Value, json};

/// An API error: an HTTP status and the `Status` body the real server sends for it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
    pub(crate) retry_after_seconds: Option<u64>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after_seconds: None,
        }
    }

    /// A 422 `Invalid` error with its `details` (see `validation`).
    pub(crate) fn unprocessable(message: String, details: Value) -> Self {
        let mut error = ApiError::new(422, "Invalid", message);
        error.details = Some(details);
        error
    }

    /// An error the real server sends without a reason (a failed typed conversion in server-side apply).
    pub(crate) fn untyped(code: u16, message: String) -> Self {
        ApiError::new(code, "", message)
    }

    fn with_details(mut self, qualified: &str, name: &str) -> Self {
        let (kind, group) = qualified.split_once('.').unwrap_or((qualified, ""));
        self.details = Some(json!({"name": name, "group": group, "kind": kind}));
        self
    }

    pub(crate) fn not_found(qualified: &str, name: &str) -> Self {
        ApiError::new(404, "NotFound", format!("{qualified} {name:?} not found"))
            .with_details(qualified, name)
    }

    pub(crate) fn already_exists(qualified: &str, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{qualified} {name:?} already exists"),
        )
        .with_details(qualified, name)
    }

    pub(crate) fn conflict(qualified: &str, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} {name:?}: {why}"),
        )
        .with_details(qualified, name)
    }

    pub(crate) fn stale(qualified: &str, name: &str) -> Self {
        ApiError::conflict(
            qualified,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub(crate) fn invalid(qualified: &str, kind: &str, name: &str, message: impl Into<String>) -> Self {
        ApiError::new(
            422,
            "Invalid",
            format!("{kind} {name:?} is invalid: {}", message.into()),
        )
        .with_details(qualified, name)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub(crate) fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    pub(crate) fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method} {path})"),
        )
    }

    pub(crate) fn path_not_found(path: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    pub(crate) fn gone(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    pub(crate) fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut error = ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        error.details = Some(
            json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
        );
        error.retry_after_seconds = Some(1);
        error
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(403, "Forbidden", message)
    }

    pub(crate) fn unauthorized() -> Self {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub(crate) fn too_many_requests(retry_after_seconds: u64) -> Self {
        let mut error = ApiError::new(
            429,
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        );
        error.retry_after_seconds = Some(retry_after_seconds);
        error.details = Some(json!({"retryAfterSeconds": retry_after_seconds}));
        error
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    pub(crate) fn service_unavailable(retry_after_seconds: u64) -> Self {
        let mut error = ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
        error.retry_after_seconds = Some(retry_after_seconds);
        error
    }

    /// The `Status` body.
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// A `Status` for a successful deletion.
pub(crate) fn success(qualified: &str, name: &str, uid: &str) -> Value {
    let (kind, group) = qualified.split_once('.').unwrap_or((qualified, ""));
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": group, "kind": kind, "uid": uid},
    })
}
