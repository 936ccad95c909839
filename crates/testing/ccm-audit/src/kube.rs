//! kube-apiserver's own record as the audit's input: its audit log (`audit.k8s.io/v1` `Event`s, one JSON
//! object per line, as `--audit-log-path` writes them) read into the [`RequestEntry`]s and [`LeaseWrite`]s
//! the overlap check takes, so a run on a real API server is judged from that server's record.
//!
//! What the policy must record (the one [`AUDIT_POLICY`] names): every request at `Metadata` level or
//! more, and writes at `RequestResponse`, since only the response carries the resourceVersion a write
//! produced (the exact order of writes) and, for a Lease, its holder afterwards. Times are the server's:
//! `stageTimestamp` of the `ResponseComplete` stage (of `ResponseStarted` for a watch, as the test API
//! server logs a watch when its response head is sent), in microseconds.

use serde::Deserialize;

use super::{LeaseWrite, RequestEntry};

/// An audit policy that records what [`parse`] needs: every request's metadata, and the request and
/// response of every write (without `managedFields`).
pub const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
omitManagedFields: true
rules:
- level: RequestResponse
  verbs: [create, update, patch, delete, deletecollection]
- level: Metadata
";

/// An audit event, the fields the audit reads (`k8s.io/apiserver/pkg/apis/audit/v1.Event`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// `RequestReceived`, `ResponseStarted`, `ResponseComplete` or `Panic`.
    pub stage: String,
    /// The request's URI (path and query).
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, …).
    pub verb: String,
    /// Who made it.
    #[serde(default)]
    pub user: AuditUser,
    /// Its `User-Agent`.
    #[serde(default)]
    pub user_agent: String,
    /// The object it was about.
    #[serde(default)]
    pub object_ref: Option<AuditObjectRef>,
    /// The answer.
    #[serde(default)]
    pub response_status: Option<AuditStatus>,
    /// The object answered (at `RequestResponse` level).
    #[serde(default)]
    pub response_object: Option<serde_json::Value>,
    /// When the server received it (RFC 3339, microseconds).
    pub request_received_timestamp: String,
    /// When this stage was reached.
    pub stage_timestamp: String,
}

/// The user of an [`AuditEvent`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuditUser {
    /// User name.
    #[serde(default)]
    pub username: String,
    /// Groups.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// The object of an [`AuditEvent`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditObjectRef {
    /// Plural resource, e.g. `leases`.
    #[serde(default)]
    pub resource: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Name.
    #[serde(default)]
    pub name: Option<String>,
    /// API group (empty for the core group).
    #[serde(default)]
    pub api_group: String,
    /// Subresource, e.g. `status`.
    #[serde(default)]
    pub subresource: Option<String>,
}

/// The response status of an [`AuditEvent`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuditStatus {
    /// HTTP status code.
    #[serde(default)]
    pub code: u16,
}

/// Why an audit log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AuditLogError {
    /// A line is not an audit event.
    #[error("audit log line {line}: {source}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A timestamp is not RFC 3339.
    #[error("audit log line {line}: {field} {value:?} is not an RFC 3339 time")]
    Time {
        /// 1-based line number.
        line: usize,
        /// Which timestamp.
        field: &'static str,
        /// The text.
        value: String,
    },
    /// A successful Lease write was recorded without its response: the policy's level is too low.
    #[error(
        "audit log line {line}: the {verb} of Lease {name} was recorded without its response object; \
         the audit policy must record writes at RequestResponse level"
    )]
    NoResponse {
        /// 1-based line number.
        line: usize,
        /// The verb.
        verb: String,
        /// `namespace/name`.
        name: String,
    },
}

/// What a kube-apiserver audit log says, as the audit's inputs.
#[derive(Debug, Clone, Default)]
pub struct AuditRecords {
    /// Every request, in the order of the log.
    pub requests: Vec<RequestEntry>,
    /// Every successful Lease write.
    pub leases: Vec<LeaseWrite>,
}

/// One completed request of the log, with its event (for callers that want more of it).
#[derive(Debug, Clone)]
pub struct AuditedRequest {
    /// The entry the overlap check takes.
    pub entry: RequestEntry,
    /// The event it was read from.
    pub event: AuditEvent,
    /// When the server received it, microseconds since the epoch.
    pub received_us: i64,
    /// Its line in the log (from 1).
    pub line: usize,
}

impl AuditEvent {
    /// The HTTP method the verb was sent with.
    pub fn method(&self) -> &'static str {
        match self.verb.as_str() {
            "create" => "POST",
            "update" => "PUT",
            "patch" => "PATCH",
            "delete" | "deletecollection" => "DELETE",
            _ => "GET",
        }
    }

    /// Whether this is the event that records the request once: `ResponseComplete` (or `Panic`), and
    /// for a watch `ResponseStarted`.
    pub fn is_record(&self) -> bool {
        match self.stage.as_str() {
            "ResponseStarted" => self.verb == "watch",
            "ResponseComplete" => self.verb != "watch",
            "Panic" => true,
            _ => false,
        }
    }

    fn status(&self) -> u16 {
        match (self.stage.as_str(), &self.response_status) {
            ("Panic", _) => 500,
            (_, Some(status)) if status.code != 0 => status.code,
            _ => 200,
        }
    }

    fn response_resource_version(&self) -> Option<u64> {
        self.response_object
            .as_ref()?
            .pointer("/metadata/resourceVersion")?
            .as_str()?
            .parse()
            .ok()
    }
}

fn micros(line: usize, field: &'static str, value: &str) -> Result<i64, AuditLogError> {
    value
        .parse::<jiff::Timestamp>()
        .map(jiff::Timestamp::as_microsecond)
        .map_err(|_| AuditLogError::Time {
            line,
            field,
            value: value.to_owned(),
        })
}

/// Reads the completed requests of an audit log, in its order. Events of other stages are skipped, and so
/// is a last line cut short (the server may be writing it).
pub fn requests(text: &str) -> Result<Vec<AuditedRequest>, AuditLogError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut requests = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let event: AuditEvent = match serde_json::from_str(line) {
            Ok(event) => event,
            Err(_) if index + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(source) => {
                return Err(AuditLogError::Line {
                    line: index + 1,
                    source,
                });
            }
        };
        if !event.is_record() {
            continue;
        }
        let time_us = micros(index + 1, "stageTimestamp", &event.stage_timestamp)?;
        let received_us = micros(
            index + 1,
            "requestReceivedTimestamp",
            &event.request_received_timestamp,
        )?;
        let path = event
            .request_uri
            .split_once('?')
            .map_or(event.request_uri.as_str(), |(path, _)| path)
            .to_owned();
        let entry = RequestEntry {
            time_us,
            method: event.method().to_owned(),
            path,
            user_agent: event.user_agent.clone(),
            verb: Some(event.verb.clone()),
            status: event.status(),
            resource_version: event.response_resource_version(),
            received_us: Some(received_us),
        };
        requests.push(AuditedRequest {
            entry,
            event,
            received_us,
            line: index + 1,
        });
    }
    Ok(requests)
}

impl AuditedRequest {
    /// The Lease this request changed, `(namespace, name)`: a successful create, update, patch or delete
    /// of a `coordination.k8s.io` Lease.
    pub fn written_lease(&self) -> Option<(&str, &str)> {
        let event = &self.event;
        let object = event.object_ref.as_ref()?;
        let write = matches!(event.verb.as_str(), "create" | "update" | "patch" | "delete");
        (object.resource == "leases"
            && object.api_group == "coordination.k8s.io"
            && write
            && (200..300).contains(&self.entry.status))
        .then(|| {
            (
                object.namespace.as_deref().unwrap_or_default(),
                object.name.as_deref().unwrap_or_default(),
            )
        })
    }

    /// The Lease after the write, when the response carried one (not for a delete).
    pub fn lease_after(&self) -> Option<&serde_json::Value> {
        self.event
            .response_object
            .as_ref()
            .filter(|o| o["kind"] == "Lease" && self.event.verb != "delete")
    }
}

/// Reads an audit log into the audit's inputs: every completed request, and every successful write of a
/// `coordination.k8s.io` Lease with its holder afterwards.
///
/// A Lease deleted is recorded with the resourceVersion of the newest write before it (the server answers
/// a delete with a `Status`, which has none), so it orders after every earlier write.
pub fn parse(text: &str) -> Result<AuditRecords, AuditLogError> {
    let requests = requests(text)?;
    let mut leases = Vec::new();
    let mut newest_rv = 0;
    for request in &requests {
        let rv = request.entry.resource_version;
        newest_rv = newest_rv.max(rv.unwrap_or(0));
        let Some((namespace, name)) = request.written_lease() else {
            continue;
        };
        let event = &request.event;
        let lease = request.lease_after();
        let resource_version = match (rv, lease) {
            (Some(rv), Some(_)) => rv,
            (_, None) if event.verb == "delete" => newest_rv,
            _ => {
                return Err(AuditLogError::NoResponse {
                    line: request.line,
                    verb: event.verb.clone(),
                    name: format!("{namespace}/{name}"),
                });
            }
        };
        let spec = lease.map(|o| &o["spec"]);
        leases.push(LeaseWrite {
            time_us: request.entry.time_us,
            resource_version,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            operation: event.verb.clone(),
            holder_identity: spec.and_then(|s| s["holderIdentity"].as_str()).map(str::to_owned),
            lease_duration_seconds: spec.and_then(|s| s["leaseDurationSeconds"].as_i64()),
            renew_time_us: spec
                .and_then(|s| s["renewTime"].as_str())
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map(jiff::Timestamp::as_microsecond),
            user_agent: event.user_agent.clone(),
        });
    }
    Ok(AuditRecords {
        requests: requests.into_iter().map(|r| r.entry).collect(),
        leases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(
        stage: &str,
        verb: &str,
        uri: &str,
        resource: &str,
        group: &str,
        code: u16,
        response: &str,
    ) -> String {
        let response = if response.is_empty() {
            String::new()
        } else {
            format!(r#","responseObject":{response}"#)
        };
        format!(
            r#"{{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","auditID":"a","stage":"{stage}","requestURI":"{uri}","verb":"{verb}","user":{{"username":"u","groups":["g"]}},"userAgent":"ua/1","objectRef":{{"resource":"{resource}","namespace":"kube-system","name":"l","apiGroup":"{group}","apiVersion":"v1"}},"responseStatus":{{"metadata":{{}},"code":{code}}}{response},"requestReceivedTimestamp":"2026-11-25T12:00:00.000100Z","stageTimestamp":"2026-11-25T12:00:00.000250Z"}}"#
        )
    }

    fn lease(holder: &str, rv: u64) -> String {
        format!(
            r#"{{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{{"name":"l","resourceVersion":"{rv}"}},"spec":{{"holderIdentity":"{holder}","leaseDurationSeconds":15}}}}"#
        )
    }

    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l";

    #[test]
    fn requests_are_read_once_with_the_server_times() {
        let text = [
            event(
                "ResponseComplete",
                "get",
                &format!("{LEASES}?timeout=5s"),
                "leases",
                "coordination.k8s.io",
                200,
                "",
            ),
            event(
                "ResponseStarted",
                "watch",
                "/api/v1/nodes?watch=1",
                "nodes",
                "",
                200,
                "",
            ),
            event(
                "ResponseComplete",
                "watch",
                "/api/v1/nodes?watch=1",
                "nodes",
                "",
                200,
                "",
            ),
            event(
                "ResponseStarted",
                "get",
                LEASES,
                "leases",
                "coordination.k8s.io",
                200,
                "",
            ),
            event(
                "ResponseComplete",
                "update",
                LEASES,
                "leases",
                "coordination.k8s.io",
                409,
                "",
            ),
        ]
        .join("\n");
        let records = parse(&text).unwrap();
        let seen: Vec<_> = records
            .requests
            .iter()
            .map(|r| (r.method.as_str(), r.path.as_str(), r.verb.as_deref(), r.status))
            .collect();
        assert_eq!(
            seen,
            [
                ("GET", LEASES, Some("get"), 200),
                ("GET", "/api/v1/nodes", Some("watch"), 200),
                ("PUT", LEASES, Some("update"), 409),
            ]
        );
        assert_eq!(records.requests[0].time_us, 1_795_608_000_000_250);
        assert!(records.leases.is_empty(), "a refused update changes no holder");
    }

    #[test]
    fn lease_writes_carry_the_holder_and_resource_version_after_the_write() {
        let text = [
            event(
                "ResponseComplete",
                "create",
                LEASES,
                "leases",
                "coordination.k8s.io",
                201,
                &lease("a", 7),
            ),
            event(
                "ResponseComplete",
                "update",
                LEASES,
                "leases",
                "coordination.k8s.io",
                200,
                &lease("", 9),
            ),
            event(
                "ResponseComplete",
                "update",
                LEASES,
                "leases",
                "other.example",
                200,
                &lease("x", 10),
            ),
            event(
                "ResponseComplete",
                "delete",
                LEASES,
                "leases",
                "coordination.k8s.io",
                200,
                r#"{"kind":"Status"}"#,
            ),
        ]
        .join("\n")
            + "\n";
        let records = parse(&text).unwrap();
        let seen: Vec<_> = records
            .leases
            .iter()
            .map(|l| {
                (
                    l.operation.as_str(),
                    l.resource_version,
                    l.holder_identity.as_deref(),
                    l.lease_duration_seconds,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("create", 7, Some("a"), Some(15)),
                ("update", 9, Some(""), Some(15)),
                ("delete", 10, None, None),
            ]
        );
        assert_eq!(records.requests[0].resource_version, Some(7));
    }

    #[test]
    fn a_lease_write_without_its_response_is_an_error_naming_the_policy() {
        let text = event(
            "ResponseComplete",
            "update",
            LEASES,
            "leases",
            "coordination.k8s.io",
            200,
            "",
        );
        let error = parse(&text).unwrap_err().to_string();
        assert!(
            error.contains("line 1") && error.contains("RequestResponse"),
            "{error}"
        );
    }

    #[test]
    fn a_cut_last_line_is_skipped_and_a_bad_line_elsewhere_is_named() {
        let whole = event(
            "ResponseComplete",
            "get",
            LEASES,
            "leases",
            "coordination.k8s.io",
            200,
            "",
        );
        let cut = format!("{whole}\n{}", &whole[..40]);
        assert_eq!(parse(&cut).unwrap().requests.len(), 1);
        let bad = format!("{}\n{whole}\n", &whole[..40]);
        assert!(
            parse(&bad)
                .unwrap_err()
                .to_string()
                .starts_with("audit log line 1:")
        );
    }
}
