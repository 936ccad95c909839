//! The verdict of a chaos run: what was judged, what failed, and why, from the servers' own records and
//! what the plane started.
//!
//! A run passes only when nothing failed **and** it judged work of every kind it claims: Kubernetes writes of
//! every side's controllers, cloud writes of ours (judged by the audit, not counted from the cloud's log),
//! hand-offs, and at least the floor of fault events (not counting "none" or the cloud's recovery). Each
//! failure is named in `failures`.

use std::collections::BTreeMap;

use ccm_audit::{AuditReport, Judged, Overlap, RequestEntry};
use harness::Side;
use serde::Serialize;

use super::faults::NOT_FAULTS;
use super::orphans::{self, Orphan};
use super::plane::{Peer, Plane, expected_exit};
use super::state::State;
use crate::stats::round;

/// What happened and the verdict.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) seed: u64,
    pub(super) seconds: u64,
    /// `test-apiserver`, or `kube-apiserver (Kubernetes v…)`.
    pub(super) apiserver: String,
    /// The managers: `rust`, or `go` with the Go peer's version.
    pub(super) peers: String,
    pub(super) processes: usize,
    pub(super) partition: &'static str,
    /// Faults injected, by kind.
    pub(super) events: BTreeMap<&'static str, u32>,
    /// Of those, the faults ("none" and the cloud's recovery are not).
    pub(super) fault_events: u32,
    /// The floor `fault_events` must reach.
    pub(super) min_fault_events: u32,
    /// Controller writes to the API server that the audit judged against lock tenures.
    pub(super) kubernetes_writes_judged: usize,
    /// Cloud changes that the audit judged against lock tenures.
    pub(super) cloud_writes_judged: usize,
    /// The writes judged by side: `ours-kcm` and `ours-ccm` (ours as kube-controller-manager at N and as
    /// cloud-controller-manager at N+1), `go-ccm` (upstream's), `unknown` (an identity the run did not
    /// start).
    pub(super) judged_by_side: BTreeMap<&'static str, Judged>,
    /// Of the judged writes, those answered 504 (possibly applied after the answer), judged by their
    /// whole window.
    pub(super) possibly_applied_writes: usize,
    /// Writes of the run's own clients (the workload) and the API server's own: counted, not judged.
    pub(super) other_writes: BTreeMap<String, usize>,
    /// Overlaps by this framework's replicas or by an identity the run did not start, tenures of a Lease
    /// that intersect, writes nobody can be held to: none may be.
    pub(super) overlaps: Vec<Overlap>,
    /// With `--peers go`: writes of upstream's Go cloud-controller-manager outside its own tenure,
    /// counted and not judged (upstream's writes are not fenced on its lock: a replica whose renewals
    /// fall behind, e.g. behind its own client's rate limiter, goes on writing until it notices), the
    /// first few shown.
    pub(super) upstream_writes_outside_tenure: usize,
    pub(super) upstream_examples: Vec<Overlap>,
    pub(super) handoffs: usize,
    pub(super) worst_handoff_gap_ms: f64,
    pub(super) nodes: usize,
    pub(super) nodes_uninitialized: Vec<String>,
    pub(super) retired_nodes_left: Vec<String>,
    /// Nodes deleted though their instances exist (made by the run and never retired), by ours or by a
    /// process nobody can name: none may be.
    pub(super) nodes_wrongly_deleted: Vec<String>,
    /// With `--peers go`: such nodes deleted by upstream's Go cloud-controller-manager (which deletes on
    /// the first "gone"), counted, not judged.
    pub(super) upstream_wrong_deletions: Vec<String>,
    /// Nodes whose kubelet the run stalled (NotReady, instance running).
    pub(super) nodes_stalled: usize,
    /// Cloud objects left behind at the end: load balancers orphaned (not excused) and duplicated.
    pub(super) cloud_objects_leaked: usize,
    pub(super) load_balancer_services: usize,
    /// Services the workload deleted (each a load balancer's create/delete cycle), and of them those it
    /// deleted with the cleanup finalizer removed first (left for the orphan sweep).
    pub(super) services_deleted: u32,
    pub(super) services_deleted_without_finalizer: u32,
    /// Load balancers whose service is gone, at the end, each with the cloud write that created it and
    /// whether (and why) it is excused (see `orphans.rs`); any not excused fails the run.
    pub(super) orphaned_load_balancers: Vec<Orphan>,
    /// `(service, load balancer)`: a second load balancer of one service, a leak.
    pub(super) duplicated_load_balancers: Vec<(String, String)>,
    /// Services being deleted whose load balancer is still there at the end.
    pub(super) undeleted_load_balancers: Vec<String>,
    pub(super) missing_load_balancers: Vec<String>,
    /// Processes that did not exit within ten lease durations of SIGTERM.
    pub(super) stuck_processes: Vec<String>,
    /// How every replica ended, by how it was stopped (`sigterm`, `sigkill`, `on_its_own`: a lost lease
    /// ends the process, as upstream's, and kubelet's part is played by restarting it in its slot; for
    /// upstream's Go CCM, `… (upstream)`) and exit status. After SIGTERM only `exit 0` or `exit 1` (or, for
    /// upstream's, which catches no signal, `signal 15`), after SIGKILL only `signal 9`, on its own only
    /// `exit 1`: a panic or a signal nobody sent fails the run.
    pub(super) exits: BTreeMap<&'static str, BTreeMap<String, u32>>,
    /// From the end of the faults to a converged cluster (`None`: it did not converge in time).
    pub(super) converged_after_s: Option<f64>,
    /// Why the run failed, one line each; empty when it passed.
    pub(super) failures: Vec<String>,
    pub(super) pass: bool,
}

/// What the run saw, for the verdict.
pub(super) struct Seen<'a> {
    pub(super) report: &'a AuditReport,
    pub(super) requests: &'a [RequestEntry],
    pub(super) plane: &'a Plane,
    pub(super) state: State,
    pub(super) events: BTreeMap<&'static str, u32>,
    pub(super) min_events: u32,
    pub(super) converged_after_s: Option<f64>,
    /// `rust` or `go`.
    pub(super) peers: &'a str,
}

/// A side's name in the report.
fn side_name(side: Option<(Peer, Side)>) -> &'static str {
    match side {
        Some((Peer::Go, _)) => "go-ccm",
        Some((Peer::Rust, Side::Kcm)) => "ours-kcm",
        Some((Peer::Rust, Side::Ccm)) => "ours-ccm",
        None => "unknown",
    }
}

/// Judges what the run saw; `describe` fills the run's description fields.
pub(super) fn judge(seen: Seen<'_>, describe: impl FnOnce(&mut Report)) -> Report {
    let Seen {
        report,
        requests,
        plane,
        state,
        events,
        min_events,
        converged_after_s,
        peers,
    } = seen;
    let mut failures = Vec::new();
    let peer_of = |identity: &str| plane.peer_of(identity).map(|(peer, _)| peer);
    let orphaned = orphans::explain(&state.orphaned, requests, &report.overlaps, &peer_of);
    // Upstream's unfenced writes are its own; a write of ours or of a stranger outside its tenure, an
    // unowned or unattributable write, or two tenures at once fail the run.
    let (upstream, overlaps): (Vec<Overlap>, Vec<Overlap>) =
        report.overlaps.iter().cloned().partition(|overlap| {
            matches!(overlap, Overlap::WriteOutsideTenure { identity, .. }
                if peer_of(identity) == Some(Peer::Go))
        });
    if !overlaps.is_empty() {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for overlap in &overlaps {
            *kinds.entry(overlap_kind(overlap)).or_default() += 1;
        }
        failures.push(format!("overlaps: {kinds:?}"));
    }
    let mut judged_by_side: BTreeMap<&'static str, Judged> = BTreeMap::new();
    for (identity, judged) in &report.judged_by_writer {
        let side = judged_by_side
            .entry(side_name(plane.peer_of(identity)))
            .or_default();
        side.kubernetes += judged.kubernetes;
        side.cloud += judged.cloud;
    }
    let required: &[&str] = if peers == "go" {
        &["go-ccm", "ours-ccm"]
    } else {
        &["ours-kcm", "ours-ccm"]
    };
    for side in required {
        if judged_by_side.get(side).is_none_or(|j| j.kubernetes == 0) {
            failures.push(format!("no Kubernetes write of {side} judged"));
        }
    }
    let ours_cloud: usize = ["ours-kcm", "ours-ccm"]
        .iter()
        .filter_map(|side| judged_by_side.get(side))
        .map(|j| j.cloud)
        .sum();
    if ours_cloud == 0 {
        failures.push("no cloud write of ours judged".to_owned());
    }
    if let Some(unknown) = judged_by_side.get("unknown") {
        failures.push(format!(
            "writes by identities the run did not start: {} Kubernetes, {} cloud",
            unknown.kubernetes, unknown.cloud
        ));
    }
    if report.handoffs.is_empty() {
        failures.push("no hand-off".to_owned());
    }
    let fault_events: u32 = events
        .iter()
        .filter(|(kind, _)| !NOT_FAULTS.contains(kind))
        .map(|(_, count)| count)
        .sum();
    if fault_events < min_events {
        failures.push(format!("{fault_events} fault events, fewer than {min_events}"));
    }
    if converged_after_s.is_none() && !state.converged_but_for_orphans() {
        failures.push(format!(
            "did not converge: {} nodes uninitialised, {} retired nodes left, {} load balancers missing, {} \
             undeleted, {} duplicated",
            state.uninitialized.len(),
            state.retired_left.len(),
            state.missing.len(),
            state.undeleted.len(),
            state.duplicated.len()
        ));
    }
    let not_excused: Vec<&str> = orphaned
        .iter()
        .filter(|o| o.excused.is_none())
        .map(|o| o.load_balancer.as_str())
        .collect();
    if !not_excused.is_empty() {
        failures.push(format!(
            "{} orphaned load balancers (see orphaned_load_balancers), e.g. {:?}",
            not_excused.len(),
            &not_excused[..not_excused.len().min(3)]
        ));
    }
    if !state.duplicated.is_empty() {
        failures.push(format!(
            "{} duplicated load balancers (see duplicated_load_balancers), e.g. {:?}",
            state.duplicated.len(),
            &state.duplicated[..state.duplicated.len().min(3)]
        ));
    }
    let (upstream_wrong_deletions, wrongly_deleted): (Vec<String>, Vec<String>) = state
        .wrongly_deleted
        .iter()
        .cloned()
        .partition(|node| deleted_by(requests, node).is_some_and(|who| peer_of(&who) == Some(Peer::Go)));
    if !wrongly_deleted.is_empty() {
        failures.push(format!(
            "{} nodes deleted though their instances exist (see nodes_wrongly_deleted), e.g. {:?}",
            wrongly_deleted.len(),
            &wrongly_deleted[..wrongly_deleted.len().min(3)]
        ));
    }
    let cloud_objects_leaked = not_excused.len() + state.duplicated.len();
    if !plane.stuck.is_empty() {
        failures.push(format!("stuck on SIGTERM: {:?}", plane.stuck));
    }
    for (how, statuses) in &plane.exits {
        for status in statuses.keys().filter(|status| !expected_exit(how, status)) {
            failures.push(format!("a replica ended with {status} ({how})"));
        }
    }
    let mut result = Report {
        seed: 0,
        seconds: 0,
        apiserver: String::new(),
        peers: String::new(),
        processes: 0,
        partition: "",
        fault_events,
        min_fault_events: min_events,
        events,
        kubernetes_writes_judged: judged_by_side.values().map(|j| j.kubernetes).sum(),
        cloud_writes_judged: judged_by_side.values().map(|j| j.cloud).sum(),
        judged_by_side,
        possibly_applied_writes: report.possibly_applied_writes,
        other_writes: report.other_writes.clone(),
        overlaps,
        upstream_writes_outside_tenure: upstream.len(),
        upstream_examples: upstream.into_iter().take(5).collect(),
        handoffs: report.handoffs.len(),
        worst_handoff_gap_ms: round(report.handoffs.iter().map(|h| h.gap_ms).fold(0.0, f64::max)),
        nodes: state.nodes,
        nodes_uninitialized: state.uninitialized,
        retired_nodes_left: state.retired_left,
        nodes_wrongly_deleted: wrongly_deleted,
        upstream_wrong_deletions,
        nodes_stalled: 0,
        services_deleted: 0,
        services_deleted_without_finalizer: 0,
        cloud_objects_leaked,
        load_balancer_services: state.wanted.len(),
        orphaned_load_balancers: orphaned,
        duplicated_load_balancers: state.duplicated,
        undeleted_load_balancers: state.undeleted,
        missing_load_balancers: state.missing,
        stuck_processes: plane.stuck.clone(),
        exits: plane.exits.clone(),
        converged_after_s,
        pass: failures.is_empty(),
        failures,
    };
    describe(&mut result);
    result
}

/// The identity (process) whose request deleted `node`, from the API server's records.
fn deleted_by(requests: &[RequestEntry], node: &str) -> Option<String> {
    let path = format!("/api/v1/nodes/{node}");
    requests
        .iter()
        .filter(|r| {
            (r.method == "DELETE" || r.verb.as_deref() == Some("delete"))
                && r.path == path
                && r.applied() != ccm_audit::Applied::No
        })
        .find_map(|r| ccm_audit::UserAgent::parse(&r.user_agent).map(|ua| ua.identity))
}

/// An overlap's kind, as the JSON names it.
fn overlap_kind(overlap: &Overlap) -> &'static str {
    match overlap {
        Overlap::WriteOutsideTenure { .. } => "write_outside_tenure",
        Overlap::UnownedWrite { .. } => "unowned_write",
        Overlap::ConcurrentTenures { .. } => "concurrent_tenures",
        Overlap::PrematureTakeover { .. } => "premature_takeover",
        Overlap::UnattributableWrite { .. } => "unattributable_write",
    }
}
