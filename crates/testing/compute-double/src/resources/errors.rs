//! The double's HTTP error answers, shaped as Compute's.

use serde_json::{Value, json};

/// An HTTP error answer: status, Compute's reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) reason: String,
    pub(crate) message: String,
    /// AIP-193 details (`google.rpc.ErrorInfo`, …), which newer answers carry beside the legacy `errors`.
    pub(crate) details: Vec<Value>,
}

impl ApiError {
    pub(crate) fn new(status: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            reason: reason.to_owned(),
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// Compute's answer to a project over its rate quota: 403, the legacy reason `rateLimitExceeded`, and
    /// an `ErrorInfo` whose reason is `RATE_LIMIT_EXCEEDED`.
    pub(crate) fn rate_limited() -> ApiError {
        ApiError {
            details: vec![json!({
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "RATE_LIMIT_EXCEEDED",
                "domain": "googleapis.com",
                "metadata": {
                    "service": "compute.googleapis.com",
                    "quota_metric": "compute.googleapis.com/default",
                    "quota_limit": "defaultPerMinutePerProject",
                },
            })],
            ..ApiError::new(
                403,
                "rateLimitExceeded",
                "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service \
                 'compute.googleapis.com'.",
            )
        }
    }

    pub(crate) fn not_found(what: &str) -> ApiError {
        ApiError::new(404, "notFound", format!("The resource '{what}' was not found"))
    }

    /// Compute's error body (with the AIP-193 `status` too, which the Rust client reads).
    pub(crate) fn body(&self) -> Value {
        let status = match self.status {
            400 => "INVALID_ARGUMENT",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            409 => "ALREADY_EXISTS",
            429 => "RESOURCE_EXHAUSTED",
            503 => "UNAVAILABLE",
            _ => "INTERNAL",
        };
        let mut body = json!({"error": {
            "code": self.status,
            "message": self.message,
            "status": status,
            "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
        }});
        if !self.details.is_empty() {
            body["error"]["details"] = Value::Array(self.details.clone());
        }
        body
    }
}
