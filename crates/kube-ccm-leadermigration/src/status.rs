//! Where a migration stands: conditions computed from what the cluster shows (its Leases, the manager
//! pods' command lines where they are visible, its nodes), with an explicit rule for `Completed`.
//!
//! One process uses one identity for its main Lease and its migration Leases, so a migration Lease's holder
//! is attributed to a component by matching it against the main Leases' holders.
//!
//! `Completed` is `True` only when every criterion is `True`: every migration lock is on the
//! cloud-controller-manager side (held by its leader, or no longer used because it runs without leader
//! migration), every visible kube-controller-manager runs with `--cloud-provider=external`, and every node
//! was initialised by the cloud provider. An empty set proves nothing: no nodes, or no visible
//! kube-controller-manager pod, make the criterion `Unknown`, never `True`.

use serde::Serialize;

use crate::{CLOUD_CONTROLLER_MANAGER, KUBE_CONTROLLER_MANAGER};

/// The taint a node carries until the cloud provider initialised it.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

mod observation;

pub use observation::{LeaseObservation, ManagerPod, NodeObservation, Observation, Visibility};

/// A condition's status, as Kubernetes writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Status {
    /// It holds.
    True,
    /// It does not.
    False,
    /// The cluster does not show enough to tell.
    Unknown,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        })
    }
}

/// One condition.
#[derive(Debug, Clone, Serialize)]
pub struct Condition {
    /// Its type, e.g. `Completed`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// True, False or Unknown.
    pub status: Status,
    /// Why, in one CamelCase word.
    pub reason: &'static str,
    /// Why, for a person.
    pub message: String,
    /// Since when it has been so, where the cluster tells (Unix seconds).
    pub since: Option<i64>,
}

/// The condition types, in the order [`assess`] gives them.
pub const CONDITIONS: [&str; 7] = [
    "KubeControllerManagerLeading",
    "CloudControllerManagerLeading",
    "MigrationLocksOnCloudSide",
    "KubeControllerManagerExternal",
    "NodesInitialized",
    "NoStaleHolders",
    "Completed",
];

/// Which component a live holder is, matched against the main Leases' holders.
pub fn component_of(observation: &Observation, holder: &str) -> Option<&'static str> {
    let now = observation.now;
    if observation.ccm_lease.live_holder(now) == Some(holder) {
        Some(CLOUD_CONTROLLER_MANAGER)
    } else if observation.kcm_lease.live_holder(now) == Some(holder) {
        Some(KUBE_CONTROLLER_MANAGER)
    } else {
        None
    }
}

/// The conditions, in [`CONDITIONS`] order.
pub fn assess(observation: &Observation) -> Vec<Condition> {
    let criteria = [
        locks_on_cloud_side(observation),
        kcm_external(observation),
        nodes_initialized(observation),
    ];
    let mut conditions = vec![
        leading(CONDITIONS[0], &observation.kcm_lease, observation.now),
        leading(CONDITIONS[1], &observation.ccm_lease, observation.now),
    ];
    conditions.extend(criteria.iter().cloned());
    conditions.push(no_stale_holders(observation));
    conditions.push(completed(&criteria));
    conditions
}

fn condition(kind: &'static str, status: Status, reason: &'static str, message: String) -> Condition {
    Condition {
        kind,
        status,
        reason,
        message,
        since: None,
    }
}

fn leading(kind: &'static str, lease: &LeaseObservation, now: i64) -> Condition {
    let name = &lease.name;
    if !lease.exists {
        return condition(
            kind,
            Status::False,
            "LeaseAbsent",
            format!("there is no Lease {name}"),
        );
    }
    if let Some(holder) = lease.live_holder(now) {
        return Condition {
            since: lease.acquired,
            ..condition(
                kind,
                Status::True,
                "Held",
                format!("Lease {name} is held by {holder}"),
            )
        };
    }
    match lease.stale_holder(now) {
        Some(holder) => Condition {
            since: lease.expires(),
            ..condition(
                kind,
                Status::False,
                "Stale",
                format!("Lease {name} names {holder}, which stopped renewing it"),
            )
        },
        None => Condition {
            since: lease.renewed,
            ..condition(
                kind,
                Status::False,
                "Released",
                format!("Lease {name} is held by no one"),
            )
        },
    }
}

/// Every migration lock is held by the cloud-controller-manager's leader, or unused because that leader
/// runs without leader migration (the migration is over and was switched off).
fn locks_on_cloud_side(observation: &Observation) -> Condition {
    let kind = CONDITIONS[2];
    let now = observation.now;
    if observation.migration_leases.is_empty() {
        return condition(
            kind,
            Status::Unknown,
            "NoMigrationLocks",
            "the configuration has no migration lock".to_owned(),
        );
    }
    let ccm_leading = observation.ccm_lease.live_holder(now).is_some();
    let migration_off = ccm_migration_off(observation);
    let holders = lock_holders(observation, ccm_leading && migration_off == Some(true));
    let names = |list: &[String]| list.join(", ");
    if !holders.on_kcm.is_empty() {
        return held_by_kcm(observation, &holders.on_kcm);
    }
    if !holders.unheld.is_empty() {
        let why = if ccm_leading && migration_off.is_none() {
            " (cloud-controller-manager leads, but its pods are not visible to tell whether it runs without leader migration)"
        } else {
            ": their controllers run nowhere"
        };
        let status = if ccm_leading && migration_off.is_none() {
            Status::Unknown
        } else {
            Status::False
        };
        return condition(
            kind,
            status,
            "NotHeld",
            format!("no one holds {}{why}", names(&holders.unheld)),
        );
    }
    if !holders.unattributed.is_empty() {
        return condition(
            kind,
            Status::Unknown,
            "HolderUnknown",
            format!(
                "held by a process that holds neither main Lease: {}",
                names(&holders.unattributed)
            ),
        );
    }
    let message = if migration_off == Some(true)
        && observation
            .migration_leases
            .iter()
            .all(|(l, _)| l.live_holder(now).is_none())
    {
        "cloud-controller-manager runs the migrated controllers under its main lock (leader migration is off)"
            .to_owned()
    } else {
        "every migration lock is held by the cloud-controller-manager's leader".to_owned()
    };
    Condition {
        since: holders.since,
        ..condition(kind, Status::True, "OnCloudSide", message)
    }
}

/// Whether every visible cloud-controller-manager pod runs without leader migration; `None` when no such
/// pod is visible, so an unheld lock cannot be put down to leader migration being off.
fn ccm_migration_off(observation: &Observation) -> Option<bool> {
    match &observation.pods {
        Visibility::Visible(pods) => {
            let ccms: Vec<&ManagerPod> = pods
                .iter()
                .filter(|p| p.component == CLOUD_CONTROLLER_MANAGER)
                .collect();
            (!ccms.is_empty()).then(|| ccms.iter().all(|p| !p.leader_migration))
        }
        Visibility::Hidden(_) => None,
    }
}

/// The migration locks sorted by who holds them, for [`locks_on_cloud_side`] to judge; each list is in
/// the configuration's order.
#[derive(Debug)]
struct LockHolders {
    /// Held by kube-controller-manager's leader, as `lease (held by holder)`.
    on_kcm: Vec<String>,
    /// Held by no one, where leader migration being off does not explain it: the Leases' names.
    unheld: Vec<String>,
    /// Held by a process that holds neither main Lease, as `lease (held by holder)`.
    unattributed: Vec<String>,
    /// The latest acquisition among the locks on the cloud side (an unused lock counts from when the
    /// cloud-controller-manager's leader took its main Lease), where the Leases tell.
    since: Option<i64>,
}

/// Sorts the migration locks by holder. `unheld_is_cloud_side`: the cloud-controller-manager's leader runs
/// without leader migration, so an unheld lock is on the cloud side rather than unheld.
fn lock_holders(observation: &Observation, unheld_is_cloud_side: bool) -> LockHolders {
    let now = observation.now;
    let mut holders = LockHolders {
        on_kcm: Vec::new(),
        unheld: Vec::new(),
        unattributed: Vec::new(),
        since: None,
    };
    for (lease, _) in &observation.migration_leases {
        match lease.live_holder(now) {
            Some(holder) => match component_of(observation, holder) {
                Some(CLOUD_CONTROLLER_MANAGER) => holders.since = holders.since.max(lease.acquired),
                Some(_) => holders.on_kcm.push(format!("{} (held by {holder})", lease.name)),
                None => holders
                    .unattributed
                    .push(format!("{} (held by {holder})", lease.name)),
            },
            None if unheld_is_cloud_side => holders.since = holders.since.max(observation.ccm_lease.acquired),
            None => holders.unheld.push(lease.name.clone()),
        }
    }
    holders
}

/// kube-controller-manager holds the locks in `on_kcm`: it runs their controllers, or, when the cluster
/// shows it has no cloud provider, runs them nowhere (and what to do about that).
fn held_by_kcm(observation: &Observation, on_kcm: &[String]) -> Condition {
    let kind = CONDITIONS[2];
    if let Some(evidence) = kcm_without_cloud_provider(observation) {
        return condition(
            kind,
            Status::False,
            "HeldByExternalKubeControllerManager",
            format!(
                "kube-controller-manager holds {} but has no cloud provider to run its controllers with \
                 ({evidence}): they run nowhere. Restart kube-controller-manager without \
                 --enable-leader-migration (it contends for the migration Lease whenever leader migration \
                 is on, whatever its configuration assigns, and never releases it); once the Lease \
                 expires, cloud-controller-manager's leader takes it",
                on_kcm.join(", ")
            ),
        );
    }
    condition(
        kind,
        Status::False,
        "HeldByKubeControllerManager",
        format!(
            "kube-controller-manager still runs the migrated controllers: {}",
            on_kcm.join(", ")
        ),
    )
}

/// Why kube-controller-manager cannot be running cloud controllers, if the cluster shows it: every visible
/// kube-controller-manager pod runs with `--cloud-provider=external` (or none), or, with no such pod
/// visible, the API server is v1.32 or later, so kube-controller-manager (at most one minor older, by the
/// version skew policy) is v1.31 or later, which has no in-tree cloud provider.
fn kcm_without_cloud_provider(observation: &Observation) -> Option<String> {
    let kcms: Vec<&ManagerPod> = match &observation.pods {
        Visibility::Visible(pods) => pods
            .iter()
            .filter(|p| p.component == KUBE_CONTROLLER_MANAGER)
            .collect(),
        Visibility::Hidden(_) => Vec::new(),
    };
    if !kcms.is_empty() {
        let in_tree = |p: &&ManagerPod| {
            p.cloud_provider
                .as_deref()
                .is_some_and(|c| !c.is_empty() && c != "external")
        };
        return (!kcms.iter().any(in_tree)).then(|| {
            "its pods run with --cloud-provider=external, which starts no cloud controller".to_owned()
        });
    }
    match observation.server_version {
        Some((1, minor)) if minor >= 32 => Some(format!(
            "the API server is v1.{minor}, so kube-controller-manager is v1.{} or later, which has no \
             in-tree cloud provider",
            minor - 1
        )),
        _ => None,
    }
}

/// Every visible kube-controller-manager runs without an in-tree cloud provider.
fn kcm_external(observation: &Observation) -> Condition {
    let kind = CONDITIONS[3];
    let pods = match &observation.pods {
        Visibility::Visible(pods) => pods,
        Visibility::Hidden(why) => {
            return condition(
                kind,
                Status::Unknown,
                "PodsNotVisible",
                format!("cannot list pods: {why}"),
            );
        }
    };
    let kcms: Vec<&ManagerPod> = pods
        .iter()
        .filter(|p| p.component == KUBE_CONTROLLER_MANAGER)
        .collect();
    if kcms.is_empty() {
        return condition(
            kind,
            Status::Unknown,
            "PodsNotVisible",
            "no kube-controller-manager pod is visible (static pods are mirrored into kube-system)"
                .to_owned(),
        );
    }
    let in_tree: Vec<String> = kcms
        .iter()
        .filter(|p| {
            p.cloud_provider
                .as_deref()
                .is_some_and(|c| !c.is_empty() && c != "external")
        })
        .map(|p| {
            format!(
                "{} (--cloud-provider={})",
                p.name,
                p.cloud_provider.as_deref().unwrap_or_default()
            )
        })
        .collect();
    if in_tree.is_empty() {
        condition(
            kind,
            Status::True,
            "External",
            format!(
                "{} kube-controller-manager pod(s) run without an in-tree cloud provider",
                kcms.len()
            ),
        )
    } else {
        condition(
            kind,
            Status::False,
            "InTreeCloudProvider",
            format!("still with an in-tree cloud provider: {}", in_tree.join(", ")),
        )
    }
}

fn nodes_initialized(observation: &Observation) -> Condition {
    let kind = CONDITIONS[4];
    let nodes = match &observation.nodes {
        Visibility::Visible(nodes) => nodes,
        Visibility::Hidden(why) => {
            return condition(
                kind,
                Status::Unknown,
                "NodesNotVisible",
                format!("cannot list nodes: {why}"),
            );
        }
    };
    if nodes.is_empty() {
        return condition(
            kind,
            Status::Unknown,
            "NoNodes",
            "the cluster has no nodes".to_owned(),
        );
    }
    let waiting: Vec<&str> = nodes
        .iter()
        .filter(|n| !n.initialized())
        .map(|n| n.name.as_str())
        .collect();
    if waiting.is_empty() {
        return condition(
            kind,
            Status::True,
            "AllInitialized",
            format!(
                "{} of {} nodes initialised by the cloud provider",
                nodes.len(),
                nodes.len()
            ),
        );
    }
    const SHOWN: usize = 5;
    let more = waiting.len().saturating_sub(SHOWN);
    let mut list = waiting[..waiting.len().min(SHOWN)].join(", ");
    if more > 0 {
        list.push_str(&format!(" and {more} more"));
    }
    condition(
        kind,
        Status::False,
        "Uninitialized",
        format!(
            "{} of {} nodes initialised; waiting (no providerID, or the {UNINITIALIZED_TAINT} taint): {list}",
            nodes.len() - waiting.len(),
            nodes.len()
        ),
    )
}

fn no_stale_holders(observation: &Observation) -> Condition {
    let kind = CONDITIONS[5];
    let now = observation.now;
    let leases = [&observation.kcm_lease, &observation.ccm_lease]
        .into_iter()
        .chain(observation.migration_leases.iter().map(|(l, _)| l));
    let mut stale = Vec::new();
    let mut since = None::<i64>;
    for lease in leases {
        if let Some(holder) = lease.stale_holder(now) {
            let expired = lease.expires().unwrap_or(now);
            since = Some(since.map_or(expired, |s| s.min(expired)));
            stale.push(format!(
                "{} (held by {holder}, expired {}s ago)",
                lease.name,
                now - expired
            ));
        }
    }
    if stale.is_empty() {
        condition(
            kind,
            Status::True,
            "Fresh",
            "every held Lease is being renewed".to_owned(),
        )
    } else {
        Condition {
            since,
            ..condition(
                kind,
                Status::False,
                "StaleHolders",
                format!(
                    "not renewed within their duration: {} (a crashed or partitioned process; another takes over)",
                    stale.join(", ")
                ),
            )
        }
    }
}

fn completed(criteria: &[Condition]) -> Condition {
    let kind = CONDITIONS[6];
    let unmet = |status: Status| -> Vec<String> {
        criteria
            .iter()
            .filter(|c| c.status == status)
            .map(|c| format!("{} is {} ({})", c.kind, c.status, c.reason))
            .collect()
    };
    let failed = unmet(Status::False);
    if !failed.is_empty() {
        return condition(kind, Status::False, "InProgress", failed.join("; "));
    }
    let unknown = unmet(Status::Unknown);
    if !unknown.is_empty() {
        return condition(kind, Status::Unknown, "Undetermined", unknown.join("; "));
    }
    Condition {
        // Known only when every criterion's is.
        since: criteria
            .iter()
            .map(|c| c.since)
            .collect::<Option<Vec<i64>>>()
            .and_then(|all| all.into_iter().max()),
        ..condition(
            kind,
            Status::True,
            "Completed",
            "the migrated controllers run in cloud-controller-manager, kube-controller-manager has no cloud provider, and every node is initialised".to_owned(),
        )
    }
}

#[cfg(test)]
mod tests;
