//! What the server lets a test see: a request log, a history of Lease writes, and counters.
//!
//! Times are server times from one monotonic clock (`time_us`: microseconds since the Unix epoch, derived
//! from the start time plus a monotonic elapsed time), so records of both logs can be ordered against each
//! other. `resource_version` orders writes exactly: it is assigned under the store's lock.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The server's clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    wall_start_us: i64,
    start: Instant,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock {
            wall_start_us: jiff::Timestamp::now().as_microsecond(),
            start: Instant::now(),
        }
    }

    /// Microseconds since the Unix epoch, never going backwards.
    pub(crate) fn now_us(&self) -> i64 {
        self.wall_start_us + i64::try_from(self.start.elapsed().as_micros()).unwrap_or(i64::MAX)
    }

    /// RFC 3339 with seconds, as `metav1.Time`.
    pub(crate) fn seconds(&self) -> String {
        format_us(self.now_us(), 0)
    }
}

/// RFC 3339 text for microseconds since the epoch, with `precision` fractional digits.
pub(crate) fn format_us(us: i64, precision: usize) -> String {
    let timestamp = jiff::Timestamp::from_microsecond(us).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{timestamp:.precision$}")
}

/// One API request, logged when its response (for a watch: its response head) is sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Order in the log.
    pub seq: u64,
    /// Server time the response was produced, RFC 3339 with microseconds.
    pub time: String,
    /// The same, as microseconds since the Unix epoch.
    pub time_us: i64,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// `User-Agent` header.
    pub user_agent: String,
    /// Authenticated user, in RBAC mode.
    pub user: Option<String>,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`).
    pub verb: Option<String>,
    /// Resource, qualified by group (`leases.coordination.k8s.io`).
    pub resource: Option<String>,
    /// Subresource (`status`).
    pub subresource: Option<String>,
    /// Namespace of the request.
    pub namespace: Option<String>,
    /// Object name.
    pub name: Option<String>,
    /// HTTP status.
    pub status: u16,
    /// Time to the response (head), in milliseconds.
    pub latency_ms: f64,
    /// resourceVersion of the object a successful write produced.
    pub resource_version: Option<u64>,
}

impl RequestRecord {
    /// Whether the request changed (or tried to change) state.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_deref(),
            Some("create" | "update" | "patch" | "delete" | "deletecollection")
        )
    }
}

/// One committed write to a Lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Order in the history.
    pub seq: u64,
    /// Server time of the write, RFC 3339 with microseconds.
    pub time: String,
    /// The same, as microseconds since the Unix epoch.
    pub time_us: i64,
    /// resourceVersion the write produced.
    pub resource_version: u64,
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// `create`, `update`, `patch` or `delete`.
    pub operation: String,
    /// `spec.holderIdentity` after the write (None when cleared).
    pub holder_identity: Option<String>,
    /// `spec.leaseTransitions` after the write.
    pub lease_transitions: Option<i64>,
    /// `spec.leaseDurationSeconds` after the write.
    pub lease_duration_seconds: Option<i64>,
    /// `spec.acquireTime` after the write.
    pub acquire_time: Option<String>,
    /// `spec.renewTime` after the write.
    pub renew_time: Option<String>,
    /// `User-Agent` of the writer.
    pub user_agent: String,
}

/// The logs, in memory: the last [`Logs::limit`] records of each, and how many older ones were dropped (a
/// reader that asks for dropped records is told so, never handed a log with a silent gap).
#[derive(Debug)]
pub(crate) struct Logs {
    pub(crate) requests: VecDeque<RequestRecord>,
    pub(crate) leases: VecDeque<LeaseRecord>,
    /// `"<verb> <resource>"` → count.
    pub(crate) counters: BTreeMap<String, u64>,
    limit: usize,
    request_seq: u64,
    lease_seq: u64,
    pub(crate) dropped_requests: u64,
    pub(crate) dropped_leases: u64,
}

/// Records of a log after a sequence number, or how many of them are gone.
pub(crate) enum Since<'a, T> {
    Kept(Vec<&'a T>),
    /// Records after the asked sequence number were dropped: the first kept one's number.
    Dropped {
        first_kept: u64,
    },
}

fn since<T>(log: &VecDeque<T>, after: u64, dropped: u64, seq: impl Fn(&T) -> u64) -> Since<'_, T> {
    // Sequence numbers start at 1; the first kept record is number `dropped + 1`.
    if after < dropped {
        return Since::Dropped {
            first_kept: dropped + 1,
        };
    }
    Since::Kept(log.iter().filter(|r| seq(r) > after).collect())
}

impl Logs {
    pub(crate) fn new(limit: usize) -> Logs {
        Logs {
            requests: VecDeque::new(),
            leases: VecDeque::new(),
            counters: BTreeMap::new(),
            limit: limit.max(1),
            request_seq: 0,
            lease_seq: 0,
            dropped_requests: 0,
            dropped_leases: 0,
        }
    }

    /// Requests after sequence number `after`.
    pub(crate) fn requests_since(&self, after: u64) -> Since<'_, RequestRecord> {
        since(&self.requests, after, self.dropped_requests, |r| r.seq)
    }

    /// Lease writes after sequence number `after`.
    pub(crate) fn leases_since(&self, after: u64) -> Since<'_, LeaseRecord> {
        since(&self.leases, after, self.dropped_leases, |r| r.seq)
    }

    pub(crate) fn record_request(&mut self, mut record: RequestRecord) {
        self.request_seq += 1;
        record.seq = self.request_seq;
        if self.requests.len() >= self.limit {
            self.requests.pop_front();
            self.dropped_requests += 1;
        }
        if let (Some(verb), Some(resource)) = (&record.verb, &record.resource) {
            let resource = match &record.subresource {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.clone(),
            };
            *self.counters.entry(format!("{verb} {resource}")).or_default() += 1;
        }
        self.requests.push_back(record);
    }

    pub(crate) fn record_lease(&mut self, mut record: LeaseRecord) {
        self.lease_seq += 1;
        record.seq = self.lease_seq;
        if self.leases.len() >= self.limit {
            self.leases.pop_front();
            self.dropped_leases += 1;
        }
        self.leases.push_back(record);
    }
}
