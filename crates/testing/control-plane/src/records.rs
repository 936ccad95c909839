//! kube-apiserver's audit log in the test API server's record forms, so a test reads either server's
//! record the same way.

use ccm_audit::kube::AuditedRequest;
use kube_ccm_test_apiserver::RequestRecord;

pub(crate) fn record(seq: u64, audited: AuditedRequest) -> RequestRecord {
    let event = audited.event;
    let object = event.object_ref.unwrap_or_default();
    let resource = (!object.resource.is_empty()).then(|| {
        if object.api_group.is_empty() {
            object.resource.clone()
        } else {
            format!("{}.{}", object.resource, object.api_group)
        }
    });
    let query = event
        .request_uri
        .split_once('?')
        .map(|(_, q)| q.to_owned())
        .unwrap_or_default();
    RequestRecord {
        seq,
        time: format_us(audited.entry.time_us),
        time_us: audited.entry.time_us,
        method: audited.entry.method,
        path: audited.entry.path,
        query,
        user_agent: audited.entry.user_agent,
        user: Some(event.user.username),
        verb: audited.entry.verb,
        resource,
        subresource: object.subresource,
        namespace: object.namespace,
        name: object.name,
        status: audited.entry.status,
        latency_ms: (audited.entry.time_us - audited.received_us) as f64 / 1000.0,
        resource_version: audited.entry.resource_version,
    }
}

/// RFC 3339 with microseconds, as the test API server's records.
pub(crate) fn format_us(us: i64) -> String {
    jiff::Timestamp::from_microsecond(us)
        .map(|t| format!("{t:.6}"))
        .unwrap_or_default()
}
