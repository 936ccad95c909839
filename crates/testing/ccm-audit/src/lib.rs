//! Checking "no controller ever runs twice" from the API server's records, not from the processes.
//!
//! Inputs are the server's Lease write history and request log (the test API server's admin API gives both
//! as JSON lines). A process's *tenure* of a lock runs from the write by which it acquired the Lease to the
//! next write by which anyone else acquired it, or its own release. An **overlap** is:
//! - a write by a controller outside its process's tenure of the lock that governs that controller in its
//!   component (main or migration, derived from the components' configurations, not from the process);
//! - a write by a controller its component does not own at all (the configuration gives it to another);
//! - two processes holding tenures of one Lease name at once: impossible for one Lease, but it is what
//!   happens when managers disagree on `--leader-elect-resource-namespace` (two Leases of one name are two
//!   locks, both held, and the controllers run twice);
//! - a takeover sooner than the previous record's lease duration after that holder's last write, without a
//!   release in between (the protocol forbids it; it is the way two tenures would really overlap). A
//!   client-go elector (kube-controller-manager, an upstream CCM: [`is_client_go`]) sees renewTime in
//!   whole seconds and counts from the first write of the record it last saw change, up to a second
//!   before the last renewal: its takeovers are judged by that rule, ours by the stricter one;
//! - a write nobody can be held to: its `User-Agent` names no governed process and controller, and the
//!   judge did not declare its writer ([`Governance::other_client`]: its own workload, the API server).
//!
//! Writes are ordered by resourceVersion (assigned by the server under one lock), falling back to time.
//! Requests are attributed to processes by [`UserAgent`]. A write answered 504 may have been applied after
//! its answer ([`Applied::Maybe`]): it is judged by the whole window in which it could have been
//! (`writes.rs`).
//!
//! The records come from the test API server's admin API, or from a real kube-apiserver's audit log
//! ([`kube::parse`]), so a run on a real server is judged from that server's own record.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

pub use kube_ccm_leadermigration::user_agent::{LEADER_ELECTION, UserAgent, is_client_go};
use kube_ccm_leadermigration::{ControllerCatalog, Filter, FilterResult, MigrationConfig};

pub mod kube;
mod writes;

#[cfg(test)]
use writes::object_path;
use writes::resource;
pub use writes::{POSSIBLE_APPLY_GRACE_US, audit};

/// One Lease write from the server's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseWrite {
    /// Server time, microseconds since the epoch.
    pub time_us: i64,
    /// resourceVersion the write produced.
    pub resource_version: u64,
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// `create`, `update`, `patch` or `delete`.
    pub operation: String,
    /// Holder after the write; `None` when cleared.
    #[serde(default)]
    pub holder_identity: Option<String>,
    /// `leaseDurationSeconds` after the write.
    #[serde(default)]
    pub lease_duration_seconds: Option<i64>,
    /// `renewTime` after the write, microseconds since the epoch.
    #[serde(default)]
    pub renew_time_us: Option<i64>,
    /// Writer's `User-Agent`.
    #[serde(default)]
    pub user_agent: String,
}

/// One request from the server's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestEntry {
    /// Server time, microseconds since the epoch.
    pub time_us: i64,
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// `User-Agent`.
    #[serde(default)]
    pub user_agent: String,
    /// Kubernetes verb.
    #[serde(default)]
    pub verb: Option<String>,
    /// HTTP status.
    pub status: u16,
    /// resourceVersion a successful write produced (or, for a write that changed nothing, the
    /// object's unchanged one).
    #[serde(default)]
    pub resource_version: Option<u64>,
    /// Server time the request was received, microseconds since the epoch, when known.
    #[serde(default)]
    pub received_us: Option<i64>,
}

/// The verb of a cloud change in the audit's records: judged by time (it has no resourceVersion).
pub const CLOUD_VERB: &str = "cloud";

/// Whether the server applied a write, as far as its answer tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Answered 2xx.
    Yes,
    /// Answered 504: kube-apiserver answers so when the request's deadline passes or its client goes away,
    /// and leaves the storage call running, so the write may still be applied after the answer.
    Maybe,
    /// Refused, or not a write.
    No,
}

impl RequestEntry {
    fn is_write(&self) -> bool {
        matches!(
            self.verb.as_deref(),
            Some("create" | "update" | "patch" | "delete" | "deletecollection" | CLOUD_VERB)
        ) || (self.verb.is_none() && matches!(self.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE"))
    }

    /// Whether the server applied this write.
    pub fn applied(&self) -> Applied {
        match self.status {
            _ if !self.is_write() => Applied::No,
            200..=299 => Applied::Yes,
            504 => Applied::Maybe,
            _ => Applied::No,
        }
    }

    fn is_successful_write(&self) -> bool {
        self.applied() == Applied::Yes
    }
}

/// Which Lease governs each controller in each component, and which other writers the judge expects.
#[derive(Debug, Clone, Default)]
pub struct Governance {
    components: HashMap<String, ComponentRules>,
    others: Vec<OtherClient>,
}

/// A writer that is not a controller, known to the judge by construction (its own workload, the API
/// server's own loopback client): its writes are counted, not judged.
#[derive(Debug, Clone)]
struct OtherClient {
    name: String,
    user_agent_prefix: String,
    /// The resources (plural names) it may write; empty: any.
    resources: Vec<String>,
}

#[derive(Debug, Clone)]
struct ComponentRules {
    main_lease: String,
    filter: Option<Filter>,
}

/// Where a controller's writes must fall.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    Lease(String),
    Forbidden { owner: String },
}

impl Governance {
    /// Adds a component: its main Lease and, when it runs leader migration, its configuration.
    pub fn component(
        mut self,
        component: &str,
        main_lease: &str,
        migration: Option<&MigrationConfig>,
        catalog: &ControllerCatalog,
    ) -> Self {
        let filter = migration.map(|config| Filter::for_config(config, component, catalog));
        self.components.insert(
            component.to_owned(),
            ComponentRules {
                main_lease: main_lease.to_owned(),
                filter,
            },
        );
        self
    }

    /// Declares the writes whose `User-Agent` starts with `user_agent_prefix` as `name`'s: counted, not
    /// judged. Only a writer the judge knows by construction belongs here; any other write that names no
    /// governed controller is an [`Overlap::UnattributableWrite`].
    pub fn other_client(self, name: &str, user_agent_prefix: &str) -> Self {
        self.other_client_writing(name, user_agent_prefix, &[])
    }

    /// As [`Governance::other_client`], for a writer expected to write only these resources (plural
    /// names, e.g. `events`); a write of any other resource is unattributable.
    pub fn other_client_writing(mut self, name: &str, user_agent_prefix: &str, resources: &[&str]) -> Self {
        self.others.push(OtherClient {
            name: name.to_owned(),
            user_agent_prefix: user_agent_prefix.to_owned(),
            resources: resources.iter().map(|&r| r.to_owned()).collect(),
        });
        self
    }

    /// The declared writer this write is from, if any.
    fn other(&self, request: &RequestEntry) -> Option<&str> {
        self.others
            .iter()
            .find(|other| {
                request.user_agent.starts_with(&other.user_agent_prefix)
                    && (other.resources.is_empty()
                        || resource(&request.path).is_some_and(|r| other.resources.iter().any(|o| o == r)))
            })
            .map(|other| other.name.as_str())
    }

    fn rule(&self, component: &str, controller: &str) -> Option<Rule> {
        let rules = self.components.get(component)?;
        Some(
            match rules
                .filter
                .as_ref()
                .map_or(FilterResult::NonMigrated, |f| f.classify(controller))
            {
                FilterResult::NonMigrated => Rule::Lease(rules.main_lease.clone()),
                FilterResult::Migrated { lease } => Rule::Lease(lease),
                FilterResult::Unowned { owner } => Rule::Forbidden { owner },
            },
        )
    }
}

/// A process's continuous hold on one Lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tenure {
    /// Lease name.
    pub lease: String,
    /// Holder.
    pub identity: String,
    /// Acquisition: time and resourceVersion.
    pub start_us: i64,
    /// resourceVersion of the acquiring write.
    pub start_rv: u64,
    /// End (next acquisition by another, or own release); `None` while still held.
    pub end_us: Option<i64>,
    /// resourceVersion of the ending write.
    pub end_rv: Option<u64>,
}

impl Tenure {
    fn contains(&self, rv: Option<u64>, time_us: i64) -> bool {
        match rv {
            Some(rv) => self.start_rv < rv && self.end_rv.is_none_or(|end| rv < end),
            None => self.start_us <= time_us && self.end_us.is_none_or(|end| time_us < end),
        }
    }

    /// Whether the tenure holds for all of `[from_us, to_us]`, by time.
    fn covers(&self, from_us: i64, to_us: i64) -> bool {
        self.start_us <= from_us && self.end_us.is_none_or(|end| to_us < end)
    }

    fn overlaps(&self, other: &Tenure) -> bool {
        let ends_before = |a: &Tenure, b: &Tenure| a.end_rv.is_some_and(|end| end <= b.start_rv);
        !ends_before(self, other) && !ends_before(other, self)
    }
}

/// A change of holder.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Handoff {
    /// Lease name.
    pub lease: String,
    /// Previous holder.
    pub from: String,
    /// New holder.
    pub to: String,
    /// From the previous holder's last write (its release, or its last renewal) to the acquisition.
    pub gap_ms: f64,
    /// Whether the previous holder released the Lease (a graceful hand-off).
    pub released: bool,
    /// Server time of the acquisition, microseconds since the epoch.
    pub at_us: i64,
}

/// A violation of "no controller runs twice".
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Overlap {
    /// A controller wrote while its process did not hold the governing Lease.
    WriteOutsideTenure {
        /// Component of the writer.
        component: String,
        /// Identity of the writer.
        identity: String,
        /// Controller.
        controller: String,
        /// Governing Lease.
        lease: String,
        /// The request.
        method: String,
        /// The request.
        path: String,
        /// Server time.
        time_us: i64,
        /// What the server answered (a 504 may still have been applied).
        status: u16,
        /// When the server received it, where known: with `time_us`, whether it arrived late or was
        /// held long.
        #[serde(skip_serializing_if = "Option::is_none")]
        received_us: Option<i64>,
    },
    /// A controller wrote in a component that does not own it.
    UnownedWrite {
        /// Component of the writer.
        component: String,
        /// Identity of the writer.
        identity: String,
        /// Controller.
        controller: String,
        /// The component that owns it.
        owner: String,
        /// The request.
        path: String,
        /// Server time.
        time_us: i64,
    },
    /// Two holders' tenures of one Lease intersect.
    ConcurrentTenures {
        /// Lease name.
        lease: String,
        /// One holder.
        first: String,
        /// The other.
        second: String,
    },
    /// A write nobody can be held to: its `User-Agent` names no governed component's process and
    /// controller, and no writer the judge declared.
    UnattributableWrite {
        /// Its `User-Agent`.
        user_agent: String,
        /// The request.
        method: String,
        /// The request.
        path: String,
        /// Server time.
        time_us: i64,
        /// Why it cannot be attributed.
        reason: String,
    },
    /// A holder was replaced before its record could have expired.
    PrematureTakeover {
        /// Lease name.
        lease: String,
        /// Previous holder.
        from: String,
        /// New holder.
        to: String,
        /// Time since the write the new holder could count the lease duration from: the previous
        /// holder's last write, or for a client-go elector the first write of the record it last saw
        /// change (renewTime in whole seconds).
        gap_ms: i64,
        /// That holder's lease duration.
        lease_duration_ms: i64,
    },
}

/// The verdict on a set of logs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    /// Every tenure, per Lease in order.
    pub tenures: Vec<Tenure>,
    /// Every change of holder.
    pub handoffs: Vec<Handoff>,
    /// Every overlap found.
    pub overlaps: Vec<Overlap>,
    /// Controller writes checked (Kubernetes and cloud).
    pub writes_checked: usize,
    /// The writes checked, by their writer's identity.
    pub judged_by_writer: BTreeMap<String, Judged>,
    /// Of the writes checked, those answered 504, which the server may have applied after answering:
    /// each judged by the whole window in which it could have been applied.
    pub possibly_applied_writes: usize,
    /// Writes of the writers the judge declared ([`Governance::other_client`]), by name: not judged.
    pub other_writes: BTreeMap<String, usize>,
}

/// The writes of one writer that the audit checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Judged {
    /// Kubernetes writes.
    pub kubernetes: usize,
    /// Cloud changes.
    pub cloud: usize,
}

/// Builds tenures and hand-offs from the Lease history.
pub fn tenures(leases: &[LeaseWrite]) -> (Vec<Tenure>, Vec<Handoff>, Vec<Overlap>) {
    let mut by_lease: BTreeMap<(String, String), Vec<&LeaseWrite>> = BTreeMap::new();
    for write in leases {
        by_lease
            .entry((write.namespace.clone(), write.name.clone()))
            .or_default()
            .push(write);
    }
    let (mut tenures, mut handoffs, mut overlaps) = (Vec::new(), Vec::new(), Vec::new());
    for ((_, lease), mut writes) in by_lease {
        writes.sort_by_key(|w| (w.resource_version, w.time_us));
        let mut open: Option<Tenure> = None;
        // The last write of the previous holder, for hand-off gaps and takeover checks.
        let mut last: Option<(&LeaseWrite, bool)> = None;
        // The first write of the holder's record as a client-go follower last saw it change.
        let mut observed: Option<&LeaseWrite> = None;
        for write in writes {
            let holder = write
                .holder_identity
                .clone()
                .filter(|h| !h.is_empty())
                .filter(|_| write.operation != "delete");
            let current = open.as_ref().map(|t| t.identity.clone());
            match (current, holder) {
                (Some(current), Some(holder)) if current == holder => {
                    if !observed.is_some_and(|o| same_record_in_whole_seconds(o, write)) {
                        observed = Some(write);
                    }
                    last = Some((write, false));
                }
                (current, Some(holder)) => {
                    if let Some(mut ending) = open.take() {
                        ending.end_us = Some(write.time_us);
                        ending.end_rv = Some(write.resource_version);
                        tenures.push(ending);
                    }
                    if let Some((previous, released)) = last {
                        let from = previous.holder_identity.clone().filter(|h| !h.is_empty());
                        let from =
                            from.or_else(|| UserAgent::parse(&previous.user_agent).map(|ua| ua.identity));
                        if let Some(from) = from.filter(|f| *f != holder) {
                            let gap_us = write.time_us - previous.time_us;
                            handoffs.push(Handoff {
                                lease: lease.clone(),
                                from: from.clone(),
                                to: holder.clone(),
                                gap_ms: gap_us as f64 / 1000.0,
                                released,
                                at_us: write.time_us,
                            });
                            let duration_ms =
                                previous.lease_duration_seconds.unwrap_or(0).saturating_mul(1000);
                            // A client-go elector counts the lease duration from when it saw the
                            // record change, and it compares renewTime in whole seconds.
                            let since = match observed {
                                Some(observed) if is_client_go(&write.user_agent) => observed,
                                _ => previous,
                            };
                            let allowed_us = write.time_us - since.time_us;
                            // Electors time the lease on the monotonic clock; the audit log stamps
                            // with the wall clock, which NTP may slew by up to 0.05% (1 ms in 2 s):
                            // 0.1% of the duration is allowed for it.
                            let duration_us = duration_ms.saturating_mul(1000);
                            let premature = allowed_us < duration_us - duration_us / 1000;
                            if current.is_some() && !released && premature {
                                overlaps.push(Overlap::PrematureTakeover {
                                    lease: lease.clone(),
                                    from,
                                    to: holder.clone(),
                                    gap_ms: allowed_us / 1000,
                                    lease_duration_ms: duration_ms,
                                });
                            }
                        }
                    }
                    observed = Some(write);
                    open = Some(Tenure {
                        lease: lease.clone(),
                        identity: holder,
                        start_us: write.time_us,
                        start_rv: write.resource_version,
                        end_us: None,
                        end_rv: None,
                    });
                    last = Some((write, false));
                }
                (Some(_), None) => {
                    if let Some(mut ending) = open.take() {
                        ending.end_us = Some(write.time_us);
                        ending.end_rv = Some(write.resource_version);
                        tenures.push(ending);
                    }
                    last = Some((write, true));
                }
                (None, None) => {}
            }
        }
        tenures.extend(open);
    }
    // Two holders of one Lease name at once: Leases of that name in two namespaces.
    for (index, tenure) in tenures.iter().enumerate() {
        for other in &tenures[index + 1..] {
            if tenure.lease == other.lease && tenure.identity != other.identity && tenure.overlaps(other) {
                overlaps.push(Overlap::ConcurrentTenures {
                    lease: tenure.lease.clone(),
                    first: tenure.identity.clone(),
                    second: other.identity.clone(),
                });
            }
        }
    }
    (tenures, handoffs, overlaps)
}

/// Whether a client-go follower would see no change between two writes of a Lease: the same holder and
/// duration, and renewTime in the same whole second (client-go's leader-election record keeps it at
/// second precision, and a follower restarts its count of the lease duration only when the record
/// changes). Without renewTime, every write is a change.
fn same_record_in_whole_seconds(first: &LeaseWrite, then: &LeaseWrite) -> bool {
    let second = |write: &LeaseWrite| write.renew_time_us.map(|us| us.div_euclid(1_000_000));
    first.holder_identity == then.holder_identity
        && first.lease_duration_seconds == then.lease_duration_seconds
        && second(first).is_some()
        && second(first) == second(then)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The catalog of a binary that runs upstream's four cloud controllers, as the framework's built-in
    /// registry does.
    fn test_catalog() -> ControllerCatalog {
        let runnable = |name, migrated_by_default| kube_ccm_leadermigration::RunnableController {
            name,
            aliases: &[],
            disabled_by_default: false,
            migrated_by_default,
        };
        ControllerCatalog::kubernetes()
            .with_runnable(runnable("cloud-node-controller", false))
            .and_then(|c| c.with_runnable(runnable("cloud-node-lifecycle-controller", true)))
            .and_then(|c| c.with_runnable(runnable("service-lb-controller", true)))
            .and_then(|c| c.with_runnable(runnable("node-route-controller", true)))
            .expect("the built-in controllers fit the catalog")
    }

    const KCM: &str = "kube-controller-manager";
    const CCM: &str = "cloud-controller-manager";
    const MIGRATION: &str = "cloud-provider-extraction-migration";

    fn ua(component: &str, identity: &str, controller: &str) -> String {
        UserAgent {
            component: component.into(),
            version: "0.1.0".into(),
            identity: identity.into(),
            controller: controller.into(),
        }
        .render()
    }

    fn lease(rv: u64, name: &str, holder: Option<&str>, writer: (&str, &str)) -> LeaseWrite {
        LeaseWrite {
            time_us: rv as i64 * 1_000_000,
            resource_version: rv,
            namespace: "kube-system".into(),
            name: name.into(),
            operation: "update".into(),
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            renew_time_us: None,
            user_agent: ua(writer.0, writer.1, LEADER_ELECTION),
        }
    }

    fn write(rv: u64, component: &str, identity: &str, controller: &str) -> RequestEntry {
        RequestEntry {
            time_us: rv as i64 * 1_000_000,
            method: "PATCH".into(),
            path: "/api/v1/nodes/n1".into(),
            user_agent: ua(component, identity, controller),
            verb: Some("patch".into()),
            status: 200,
            resource_version: Some(rv),
            received_us: None,
        }
    }

    fn governance() -> Governance {
        let catalog = test_catalog();
        let n = MigrationConfig::load(
            "n",
            include_bytes!("../../../../examples/leader-migration/n.yaml"),
            &catalog,
        )
        .unwrap()
        .config;
        let n1 = MigrationConfig::load(
            "n+1",
            include_bytes!("../../../../examples/leader-migration/n-plus-1.yaml"),
            &catalog,
        )
        .unwrap()
        .config;
        Governance::default()
            .component(KCM, KCM, Some(&n), &catalog)
            .component(CCM, CCM, Some(&n1), &catalog)
    }

    fn kinds(report: &AuditReport) -> Vec<&'static str> {
        report
            .overlaps
            .iter()
            .map(|o| match o {
                Overlap::WriteOutsideTenure { .. } => "outside",
                Overlap::UnownedWrite { .. } => "unowned",
                Overlap::ConcurrentTenures { .. } => "concurrent",
                Overlap::PrematureTakeover { .. } => "premature",
                Overlap::UnattributableWrite { .. } => "unattributable",
            })
            .collect()
    }

    /// A clean migration: kcm-a holds both locks, releases, ccm-b takes the migration lock.
    fn clean_history() -> (Vec<LeaseWrite>, Vec<RequestEntry>) {
        let leases = vec![
            lease(1, KCM, Some("kcm-a"), (KCM, "kcm-a")),
            lease(2, MIGRATION, Some("kcm-a"), (KCM, "kcm-a")),
            lease(3, CCM, Some("ccm-b"), (CCM, "ccm-b")),
            lease(6, MIGRATION, None, (KCM, "kcm-a")),
            lease(7, MIGRATION, Some("ccm-b"), (CCM, "ccm-b")),
        ];
        let requests = vec![
            write(4, KCM, "kcm-a", "service-lb-controller"),
            write(5, CCM, "ccm-b", "cloud-node-controller"),
            write(8, CCM, "ccm-b", "service-lb-controller"),
        ];
        (leases, requests)
    }

    #[test]
    fn a_write_that_changed_nothing_is_judged_by_its_time() {
        let (leases, mut requests) = clean_history();
        // ccm-b's service controller patches the node again at time 9 with no change: the server answers
        // with the version write 5 made, before ccm-b's migration tenure began (7).
        let mut no_op = write(9, CCM, "ccm-b", "service-lb-controller");
        no_op.resource_version = Some(5);
        no_op.path = "/api/v1/nodes/n1/status".into();
        requests.push(no_op.clone());
        assert_eq!(
            kinds(&audit(&leases, &requests, &governance())),
            Vec::<&str>::new()
        );
        // The same answer at time 6, outside its tenure by time too, is caught.
        let last = requests.len() - 1;
        requests[last].time_us = 6_500_000;
        assert_eq!(kinds(&audit(&leases, &requests, &governance())), ["outside"]);
    }

    #[test]
    fn a_write_answered_with_a_version_older_than_its_arrival_changed_nothing() {
        let (leases, mut requests) = clean_history();
        // kcm-a's patch of web-5 at time 5 is answered 504 (its client went away), yet committed: it
        // made version 6, which no successful answer names.
        let path = "/api/v1/namespaces/default/services/web-5/status";
        requests.push(RequestEntry {
            path: path.into(),
            status: 504,
            resource_version: None,
            received_us: Some(4_500_000),
            ..write(5, KCM, "kcm-a", "service-lb-controller")
        });
        // ccm-b's same patch, received at 9.4 s after write 8 completed, changes nothing: answered 6.
        let no_op = RequestEntry {
            path: path.into(),
            time_us: 9_500_000,
            resource_version: Some(6),
            ..write(9, CCM, "ccm-b", "service-lb-controller")
        };
        requests.push(RequestEntry {
            received_us: Some(9_400_000),
            ..no_op.clone()
        });
        assert_eq!(
            kinds(&audit(&leases, &requests, &governance())),
            Vec::<&str>::new()
        );
        // Without its arrival time it looks like a write of version 6, before ccm-b's tenure (7).
        let last = requests.len() - 1;
        requests[last] = no_op;
        assert_eq!(kinds(&audit(&leases, &requests, &governance())), ["outside"]);
    }

    #[test]
    fn object_paths_drop_the_subresource() {
        for (path, object) in [
            ("/api/v1/nodes/n1/status", "/api/v1/nodes/n1"),
            ("/api/v1/nodes/n1", "/api/v1/nodes/n1"),
            (
                "/api/v1/namespaces/default/services/web/status",
                "/api/v1/namespaces/default/services/web",
            ),
            (
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l",
            ),
            ("/api/v1/namespaces/default", "/api/v1/namespaces/default"),
            (
                "/api/v1/namespaces/default/finalize",
                "/api/v1/namespaces/default/finalize",
            ),
            ("cloud:ensure/web", "cloud:ensure/web"),
        ] {
            assert_eq!(object_path(path), object, "{path}");
        }
    }

    #[test]
    fn a_clean_migration_has_no_overlap() {
        let (leases, requests) = clean_history();
        let report = audit(&leases, &requests, &governance());
        assert_eq!(kinds(&report), Vec::<&str>::new());
        assert_eq!(report.writes_checked, 3);
        let handoffs: Vec<(&str, &str, &str, bool)> = report
            .handoffs
            .iter()
            .map(|h| (h.lease.as_str(), h.from.as_str(), h.to.as_str(), h.released))
            .collect();
        assert_eq!(handoffs, [(MIGRATION, "kcm-a", "ccm-b", true)]);
        assert_eq!(report.handoffs[0].gap_ms, 1000.0);
    }

    #[test]
    fn a_write_after_the_lock_moved_on_is_an_overlap() {
        let (leases, mut requests) = clean_history();
        // kcm-a's service controller writes after its release.
        requests.push(write(9, KCM, "kcm-a", "service-lb-controller"));
        let report = audit(&leases, &requests, &governance());
        assert_eq!(kinds(&report), ["outside"]);
        assert!(
            matches!(&report.overlaps[0], Overlap::WriteOutsideTenure { lease, identity, .. } if lease == MIGRATION && identity == "kcm-a")
        );
    }

    #[test]
    fn cloud_changes_are_judged_by_time_against_the_same_tenures() {
        let (leases, mut requests) = clean_history();
        let cloud = |seconds: f64, component: &str, identity: &str| RequestEntry {
            time_us: (seconds * 1_000_000.0) as i64,
            method: "POST".into(),
            path: "cloud:ensure_load_balancer/a".into(),
            user_agent: ua(component, identity, "service-lb-controller"),
            verb: Some(CLOUD_VERB.into()),
            status: 200,
            resource_version: None,
            received_us: None,
        };
        // kcm-a held the migration lease from 2 s to its release at 6 s; ccm-b holds it from 7 s.
        requests.push(cloud(5.5, KCM, "kcm-a"));
        requests.push(cloud(7.5, CCM, "ccm-b"));
        let report = audit(&leases, &requests, &governance());
        assert_eq!(kinds(&report), Vec::<&str>::new());
        assert_eq!(report.writes_checked, 5);
        // A change applied after kcm-a let go, even before ccm-b took over, is an overlap.
        requests.push(cloud(6.5, KCM, "kcm-a"));
        let report = audit(&leases, &requests, &governance());
        assert_eq!(kinds(&report), ["outside"]);
    }

    #[test]
    fn a_write_before_acquiring_is_an_overlap() {
        let (leases, mut requests) = clean_history();
        requests.push(write(5, CCM, "ccm-b", "node-route-controller"));
        assert_eq!(kinds(&audit(&leases, &requests, &governance())), ["outside"]);
    }

    #[test]
    fn the_main_lock_governs_non_migrated_controllers() {
        let (leases, mut requests) = clean_history();
        // ccm-c never held the main lease of the cloud-controller-manager.
        requests.push(write(8, CCM, "ccm-c", "cloud-node-controller"));
        assert_eq!(kinds(&audit(&leases, &requests, &governance())), ["outside"]);
    }

    #[test]
    fn a_write_by_a_component_that_does_not_own_the_controller_is_an_overlap() {
        let (leases, _) = clean_history();
        // Under the N+1 configuration, kube-controller-manager owns none of the migrated controllers.
        let catalog = test_catalog();
        let n1 = MigrationConfig::load(
            "n+1",
            include_bytes!("../../../../examples/leader-migration/n-plus-1.yaml"),
            &catalog,
        )
        .unwrap()
        .config;
        let governance = Governance::default()
            .component(KCM, KCM, Some(&n1), &catalog)
            .component(CCM, CCM, Some(&n1), &catalog);
        let requests = [write(5, KCM, "kcm-a", "node-route-controller")];
        assert_eq!(kinds(&audit(&leases, &requests, &governance)), ["unowned"]);
    }

    #[test]
    fn failed_writes_are_not_judged_and_declared_clients_are_counted() {
        let (leases, mut requests) = clean_history();
        let mut refused = write(9, KCM, "kcm-a", "service-lb-controller");
        refused.status = 409;
        requests.push(refused);
        requests.push(RequestEntry {
            user_agent: "kubectl/v1.33 (linux/amd64) kubernetes/abc".into(),
            ..write(9, KCM, "x", "y")
        });
        let governance = governance().other_client("the operator", "kubectl/");
        let report = audit(&leases, &requests, &governance);
        assert_eq!(kinds(&report), Vec::<&str>::new());
        assert_eq!(report.writes_checked, 3);
        assert_eq!(
            report.other_writes,
            BTreeMap::from([("the operator".to_owned(), 1)])
        );
    }

    #[test]
    fn a_write_nobody_can_be_held_to_is_named() {
        let (leases, mut requests) = clean_history();
        // A client the judge does not expect, a manager's User-Agent cut short, a component nobody
        // governs, and a declared client writing what it was not declared to.
        for user_agent in [
            "curl/8.0".to_owned(),
            "cloud-controller-manager/v1 (linux/amd64) ccm-b".to_owned(),
            ua("rogue-controller-manager", "r-1", "service-lb-controller"),
            "kubectl/v1.33 (linux/amd64) kubernetes/abc".to_owned(),
        ] {
            requests.push(RequestEntry {
                user_agent,
                ..write(9, CCM, "x", "y")
            });
        }
        // A client-go elector's Lease write is the lock protocol, judged by the tenures.
        requests.push(RequestEntry {
            path: "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l".into(),
            user_agent: "kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/abc/leader-election".into(),
            ..write(9, CCM, "x", "y")
        });
        let governance = governance().other_client_writing("the operator", "kubectl/", &["events"]);
        let report = audit(&leases, &requests, &governance);
        let named: Vec<&str> = report
            .overlaps
            .iter()
            .filter_map(|o| match o {
                Overlap::UnattributableWrite { user_agent, .. } => Some(user_agent.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(named.len(), 4, "{:?}", report.overlaps);
        assert_eq!(named[0], "curl/8.0");
        assert_eq!(report.writes_checked, 3);
        // Declared for events, it may write them.
        requests.truncate(3);
        requests.push(RequestEntry {
            path: "/api/v1/namespaces/default/events".into(),
            user_agent: "kubectl/v1.33 (linux/amd64) kubernetes/abc".into(),
            ..write(9, CCM, "x", "y")
        });
        assert_eq!(kinds(&audit(&leases, &requests, &governance)), Vec::<&str>::new());
    }

    #[test]
    fn a_write_answered_504_is_held_only_if_its_whole_window_is() {
        let (leases, mut requests) = clean_history();
        // ccm-b holds the migration lease from 7 s; its 504 at 9 s arrived at 8 s: held throughout.
        let answered_504 = |received_s: f64, answered_s: f64, identity: &str, component: &str| RequestEntry {
            time_us: (answered_s * 1e6) as i64,
            received_us: Some((received_s * 1e6) as i64),
            status: 504,
            resource_version: None,
            path: "/api/v1/namespaces/default/services/web/status".into(),
            ..write(9, component, identity, "service-lb-controller")
        };
        requests.push(answered_504(8.0, 9.0, "ccm-b", CCM));
        let report = audit(&leases, &requests, &governance());
        assert_eq!(kinds(&report), Vec::<&str>::new());
        assert_eq!(report.possibly_applied_writes, 1);
        // kcm-a's, answered 504 at 5.8 s, could have been applied up to 6.3 s: after its release at 6 s.
        requests.push(answered_504(4.5, 5.8, "kcm-a", KCM));
        assert_eq!(kinds(&audit(&leases, &requests, &governance())), ["outside"]);
        // Unless a later answer shows the object unchanged since before it arrived: a write received at
        // 8.5 s answered with version 4, the newest before 4.5 s.
        requests.push(RequestEntry {
            path: "/api/v1/namespaces/default/services/web".into(),
            resource_version: Some(4),
            received_us: Some(8_500_000),
            ..write(9, CCM, "ccm-b", "service-lb-controller")
        });
        assert_eq!(
            kinds(&audit(&leases, &requests, &governance())),
            Vec::<&str>::new()
        );
        // A refusal is not judged at all.
        let (leases, mut requests) = clean_history();
        requests.push(RequestEntry {
            status: 503,
            ..answered_504(4.5, 5.8, "kcm-a", KCM)
        });
        assert_eq!(audit(&leases, &requests, &governance()).writes_checked, 3);
    }

    #[test]
    fn each_writers_judged_writes_are_counted_by_kind() {
        let (leases, mut requests) = clean_history();
        requests.push(RequestEntry {
            verb: Some(CLOUD_VERB.into()),
            path: "cloud:ensure_load_balancer/a".into(),
            resource_version: None,
            ..write(8, CCM, "ccm-b", "service-lb-controller")
        });
        let report = audit(&leases, &requests, &governance());
        assert_eq!(
            report.judged_by_writer,
            BTreeMap::from([
                (
                    "ccm-b".to_owned(),
                    Judged {
                        kubernetes: 2,
                        cloud: 1
                    }
                ),
                (
                    "kcm-a".to_owned(),
                    Judged {
                        kubernetes: 1,
                        cloud: 0
                    }
                ),
            ])
        );
    }

    #[test]
    fn hostile_records_do_not_panic_the_judge() {
        // A path whose leading slashes shift a multi-byte segment, and a lease duration that overflows
        // milliseconds.
        assert_eq!(object_path("//api/v1/a/\u{e9}/c"), "//api/v1/a/\u{e9}");
        let mut leases = clean_history().0;
        leases[0].lease_duration_seconds = Some(i64::MAX);
        leases.push(lease(9, KCM, Some("kcm-z"), (KCM, "kcm-z")));
        assert_eq!(kinds(&audit(&leases, &[], &governance())), ["premature"]);
    }

    /// A Lease write whose renewTime is `renew_ms` after the epoch, by a client-go elector when
    /// `client_go`.
    fn renewal(rv: u64, at_ms: i64, renew_ms: i64, holder: &str, client_go: bool) -> LeaseWrite {
        LeaseWrite {
            time_us: at_ms * 1000,
            renew_time_us: Some(renew_ms * 1000),
            lease_duration_seconds: Some(2),
            user_agent: if client_go {
                "cloud-controller-manager/v1.37.2 (linux/amd64) kubernetes/$Format/leader-election".into()
            } else {
                ua(CCM, holder, LEADER_ELECTION)
            },
            ..lease(rv, CCM, Some(holder), (CCM, holder))
        }
    }

    #[test]
    fn a_client_go_taker_counts_from_the_record_it_saw_change_in_whole_seconds() {
        // "rust" renews at 10.1 s, 10.5 s and 10.9 s (one record in whole seconds, first seen at 10.1 s).
        let history = |taker_at_ms: i64, client_go: bool| {
            vec![
                renewal(1, 10_100, 10_100, "rust", false),
                renewal(2, 10_500, 10_500, "rust", false),
                renewal(3, 10_900, 10_900, "rust", false),
                renewal(4, taker_at_ms, taker_at_ms, "go", client_go),
            ]
        };
        // A client-go elector may take over 2 s after 10.1 s: 1.3 s after the last renewal.
        let report = audit(&history(12_200, true), &[], &governance());
        assert_eq!(kinds(&report), Vec::<&str>::new(), "{:?}", report.overlaps);
        assert_eq!(report.handoffs[0].gap_ms, 1_300.0);
        // Not before that.
        let report = audit(&history(12_000, true), &[], &governance());
        assert_eq!(kinds(&report), ["premature"]);
        // Our elector counts from the last renewal.
        let report = audit(&history(12_200, false), &[], &governance());
        assert_eq!(kinds(&report), ["premature"]);
        assert_eq!(
            kinds(&audit(&history(12_950, false), &[], &governance())),
            Vec::<&str>::new()
        );
        // A renewal into the next second is a change a client-go follower sees.
        let mut leases = history(12_200, true);
        leases[2] = renewal(3, 11_050, 11_050, "rust", false);
        assert_eq!(kinds(&audit(&leases, &[], &governance())), ["premature"]);
        // Without renewTime every write is a change.
        let mut leases = history(12_200, true);
        for write in &mut leases {
            write.renew_time_us = None;
        }
        assert_eq!(kinds(&audit(&leases, &[], &governance())), ["premature"]);
    }

    #[test]
    fn a_takeover_before_expiry_is_an_overlap() {
        let mut leases = clean_history().0;
        // ccm-b takes the main lease of kcm-a 2 s after kcm-a's last renewal (the lease lasts 15 s).
        leases.push(lease(9, KCM, Some("kcm-a"), (KCM, "kcm-a")));
        leases.push(lease(11, KCM, Some("kcm-z"), (KCM, "kcm-z")));
        let report = audit(&leases, &[], &governance());
        assert_eq!(kinds(&report), ["premature"]);
        // After the full duration it is a normal crash fail-over.
        let mut leases = clean_history().0;
        leases.push(lease(9, KCM, Some("kcm-a"), (KCM, "kcm-a")));
        leases.push(lease(24, KCM, Some("kcm-z"), (KCM, "kcm-z")));
        let report = audit(&leases, &[], &governance());
        assert_eq!(kinds(&report), Vec::<&str>::new());
        assert_eq!(report.handoffs.last().unwrap().gap_ms, 15_000.0);
        // The wall clock the log is stamped with may run 0.05% off the electors' monotonic clock: within
        // 0.1% of the duration (15 ms) it is not premature; past it, it is.
        for (early_us, premature) in [(15_000, false), (15_001, true)] {
            let mut leases = clean_history().0;
            leases.push(lease(9, KCM, Some("kcm-a"), (KCM, "kcm-a")));
            let mut takeover = lease(24, KCM, Some("kcm-z"), (KCM, "kcm-z"));
            takeover.time_us -= early_us;
            leases.push(takeover);
            let found = kinds(&audit(&leases, &[], &governance()));
            assert_eq!(
                found == ["premature"],
                premature,
                "{early_us} µs early: {found:?}"
            );
        }
    }

    #[test]
    fn one_lease_name_held_in_two_namespaces_is_caught() {
        let tenure_a = Tenure {
            lease: "l".into(),
            identity: "a".into(),
            start_us: 0,
            start_rv: 1,
            end_us: Some(10),
            end_rv: Some(10),
        };
        let tenure_b = Tenure {
            lease: "l".into(),
            identity: "b".into(),
            start_us: 5,
            start_rv: 5,
            end_us: None,
            end_rv: None,
        };
        assert!(tenure_a.overlaps(&tenure_b));
        let tenure_c = Tenure {
            start_rv: 10,
            ..tenure_b.clone()
        };
        assert!(!tenure_a.overlaps(&tenure_c));
        // Managers configured with different lease namespaces each hold "their" lock.
        let mut forged = vec![lease(1, "l", Some("a"), (KCM, "a"))];
        forged.push(LeaseWrite {
            namespace: "other".into(),
            ..lease(2, "l", Some("b"), (KCM, "b"))
        });
        let report = audit(&forged, &[], &governance());
        assert_eq!(kinds(&report), ["concurrent"]);
    }
}
