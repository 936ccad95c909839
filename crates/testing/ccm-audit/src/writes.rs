//! Judging each write of the request log against the tenures: who wrote it, under which Lease, and whether
//! that Lease was held for every moment the server may have applied it.

use std::collections::{HashMap, HashSet};

use super::{
    Applied, AuditReport, Governance, LEADER_ELECTION, Overlap, RequestEntry, Rule, Tenure, UserAgent,
    is_client_go, tenures,
};
use crate::{CLOUD_VERB, LeaseWrite};

/// How long after its 504 a write may still be applied, in microseconds. kube-apiserver answers 504 when
/// the request's deadline passes or its client goes away, and a storage call already sent to etcd is then
/// applied within etcd's commit latency (milliseconds on loopback); no new one starts after the answer. The
/// judge takes half a second as that bound: a write answered 504 is held only if its writer held the lock
/// from its arrival to half a second after its answer.
pub const POSSIBLE_APPLY_GRACE_US: i64 = 500_000;

/// Checks every controller write of the request log against the tenures of the Lease history.
///
/// A write that changed nothing is answered with the object's unchanged resourceVersion, which orders it
/// with the write that made that version, not when it happened: such a write (its resourceVersion no newer
/// than one an earlier write of the same object produced) is judged by its time instead.
///
/// A write answered 504 may have been applied at any time from its arrival to
/// [`POSSIBLE_APPLY_GRACE_US`] after its answer: it is held only if one tenure covers all of that, unless
/// a later answer shows the object unchanged by it.
///
/// Every write is attributed: to a governed component's process and controller by its `User-Agent`, or to
/// a writer the governance declares; a Lease write of a client-go elector is the lock protocol itself,
/// judged by [`tenures`]. Any other write is an [`Overlap::UnattributableWrite`].
pub fn audit(leases: &[LeaseWrite], requests: &[RequestEntry], governance: &Governance) -> AuditReport {
    let (tenures, handoffs, mut overlaps) = tenures(leases);
    let versions = Versions::new(requests);
    let no_ops = versions.no_ops(requests);
    let mut report = AuditReport::default();
    for (index, request) in requests.iter().enumerate() {
        let applied = request.applied();
        if applied == Applied::No
            || (applied == Applied::Maybe && versions.shown_unapplied(request, requests))
        {
            continue;
        }
        let unattributable = |reason: String| Overlap::UnattributableWrite {
            user_agent: request.user_agent.clone(),
            method: request.method.clone(),
            path: request.path.clone(),
            time_us: request.time_us,
            reason,
        };
        // A Lease created (`…/leases`) or written (`…/leases/<name>`).
        let lease_write = resource(&request.path) == Some("leases");
        let Some(agent) = UserAgent::parse(&request.user_agent) else {
            if lease_write && is_client_go(&request.user_agent) {
                continue;
            }
            match governance.other(request) {
                Some(name) => *report.other_writes.entry(name.to_owned()).or_default() += 1,
                None => overlaps.push(unattributable(
                    "its User-Agent names no process and controller, and no writer the judge expects"
                        .to_owned(),
                )),
            }
            continue;
        };
        if agent.controller == LEADER_ELECTION && lease_write {
            continue;
        }
        let Some(rule) = governance.rule(&agent.component, &agent.controller) else {
            match governance.other(request) {
                Some(name) => *report.other_writes.entry(name.to_owned()).or_default() += 1,
                None => overlaps.push(unattributable(format!(
                    "component {} is not one the judge governs",
                    agent.component
                ))),
            }
            continue;
        };
        report.writes_checked += 1;
        if applied == Applied::Maybe {
            report.possibly_applied_writes += 1;
        }
        let judged = report.judged_by_writer.entry(agent.identity.clone()).or_default();
        if request.verb.as_deref() == Some(CLOUD_VERB) {
            judged.cloud += 1;
        } else {
            judged.kubernetes += 1;
        }
        let held = |tenure: &Tenure| match applied {
            // Without its arrival the window has no known start: never covered.
            Applied::Maybe => request.received_us.is_some_and(|received| {
                tenure.covers(received, request.time_us.saturating_add(POSSIBLE_APPLY_GRACE_US))
            }),
            _ => {
                let resource_version = (!no_ops.contains(&index))
                    .then_some(request.resource_version)
                    .flatten();
                tenure.contains(resource_version, request.time_us)
            }
        };
        match rule {
            Rule::Forbidden { owner } => overlaps.push(Overlap::UnownedWrite {
                component: agent.component,
                identity: agent.identity,
                controller: agent.controller,
                owner,
                path: request.path.clone(),
                time_us: request.time_us,
            }),
            Rule::Lease(lease) => {
                if !tenures
                    .iter()
                    .any(|t| t.lease == lease && t.identity == agent.identity && held(t))
                {
                    overlaps.push(Overlap::WriteOutsideTenure {
                        component: agent.component,
                        identity: agent.identity,
                        controller: agent.controller,
                        lease,
                        method: request.method.clone(),
                        path: request.path.clone(),
                        time_us: request.time_us,
                        status: request.status,
                        received_us: request.received_us,
                    });
                }
            }
        }
    }
    AuditReport {
        tenures,
        handoffs,
        overlaps,
        ..report
    }
}

/// The resourceVersions the successful writes produced, in the order they were answered.
struct Versions {
    /// `(time, newest resourceVersion produced by the writes answered up to then)`.
    completed: Vec<(i64, u64)>,
    /// Indexes of the successful writes with a resourceVersion, by time.
    order: Vec<usize>,
}

impl Versions {
    fn new(requests: &[RequestEntry]) -> Versions {
        let mut order: Vec<usize> = (0..requests.len())
            .filter(|&i| requests[i].is_successful_write() && requests[i].resource_version.is_some())
            .collect();
        order.sort_by_key(|&i| requests[i].time_us);
        let mut completed: Vec<(i64, u64)> = Vec::with_capacity(order.len());
        for &index in &order {
            let rv = requests[index].resource_version.unwrap_or(0);
            let newest = completed.last().map_or(rv, |&(_, newest)| newest.max(rv));
            completed.push((requests[index].time_us, newest));
        }
        Versions { completed, order }
    }

    /// The newest resourceVersion any write had produced before `time_us`.
    fn newest_before(&self, time_us: i64) -> Option<u64> {
        let count = self
            .completed
            .partition_point(|&(completed_us, _)| completed_us < time_us);
        count.checked_sub(1).map(|last| self.completed[last].1)
    }

    /// The indexes of successful writes that changed nothing: their resourceVersion is no newer than one
    /// an earlier write (by time) of the same object produced, or no newer than one any write had
    /// produced before this request was received (resourceVersions only grow, so a write that commits
    /// after that produces a newer one). The second rule finds the no-op answered with a version that a
    /// write with a failed answer produced (a write cut off by its client may still commit, recorded as a
    /// 504).
    fn no_ops(&self, requests: &[RequestEntry]) -> HashSet<usize> {
        let mut newest: HashMap<&str, u64> = HashMap::new();
        let mut no_ops = HashSet::new();
        for &index in &self.order {
            let request = &requests[index];
            let rv = request.resource_version.unwrap_or(0);
            let seen = newest.entry(object_path(&request.path)).or_insert(0);
            let stale = request
                .received_us
                .and_then(|received| self.newest_before(received))
                .is_some_and(|before| rv <= before);
            if rv <= *seen || stale {
                no_ops.insert(index);
            } else {
                *seen = rv;
            }
        }
        no_ops
    }

    /// Whether a later answer shows that a write answered 504 changed nothing: a write of the same object
    /// received after the 504's window closed was answered with a resourceVersion no newer than the
    /// newest produced before the 504's request arrived (the object had not changed since).
    fn shown_unapplied(&self, request: &RequestEntry, requests: &[RequestEntry]) -> bool {
        let Some(before) = request
            .received_us
            .and_then(|received| self.newest_before(received))
        else {
            return false;
        };
        let closed = request.time_us.saturating_add(POSSIBLE_APPLY_GRACE_US);
        let object = object_path(&request.path);
        requests.iter().any(|later| {
            later.is_successful_write()
                && later.received_us.unwrap_or(later.time_us) > closed
                && object_path(&later.path) == object
                && later.resource_version.is_some_and(|rv| rv <= before)
        })
    }
}

/// The path's segments after `/`, and how many bytes the leading slashes took.
fn segments(path: &str) -> (Vec<&str>, usize) {
    let trimmed = path.trim_start_matches('/');
    (trimmed.split('/').collect(), path.len() - trimmed.len())
}

/// How many segments `api/v1` or `apis/GROUP/VERSION` take.
fn group_version_len(segments: &[&str]) -> Option<usize> {
    match segments.first() {
        Some(&"api") => Some(2),
        Some(&"apis") => Some(3),
        _ => None,
    }
}

/// The path of the object a request is about, without its subresource
/// (`/api/v1/namespaces/default/services/web/status` → `…/services/web`).
pub(super) fn object_path(path: &str) -> &str {
    let (segments, slashes) = segments(path);
    // `api/v1` or `apis/GROUP/VERSION`, then `[namespaces/NS/]RESOURCE/NAME[/SUBRESOURCE]`.
    let Some(prefix) = group_version_len(&segments) else {
        return path;
    };
    let rest = segments.len().saturating_sub(prefix);
    let namespaced = segments.get(prefix) == Some(&"namespaces") && rest > 2;
    let object_len = prefix + if namespaced { 4 } else { 2 };
    if segments.len() > object_len {
        // Each kept segment and the `/` after it; the last `/` is where the object's path ends.
        let kept: usize = segments[..object_len].iter().map(|s| s.len() + 1).sum();
        &path[..slashes + kept - 1]
    } else {
        path
    }
}

/// The resource (plural name) a request is about: `/api/v1/namespaces/default/events` → `events`.
pub(super) fn resource(path: &str) -> Option<&str> {
    let (segments, _) = segments(path);
    let prefix = group_version_len(&segments)?;
    let rest = segments.len().saturating_sub(prefix);
    let namespaced = segments.get(prefix) == Some(&"namespaces") && rest > 2;
    segments.get(prefix + if namespaced { 2 } else { 0 }).copied()
}
