//! Load balancers left in the cloud after their service is gone, each with the cloud write that made it.
//!
//! The run waits for such a load balancer to go until its deadline (ours deletes one it ensured for a
//! service deleted without its finalizer; nothing else deletes a load balancer whose service is gone).
//! One still there then is judged by who created it: the `ensure_load_balancer` after its last deletion.
//! Made by upstream's Go CCM outside its own tenure, it is upstream's unfenced write (a replica that lost
//! its Lease, e.g. while stopped, acting on what it had queued) and is reported, not judged; made by
//! anyone inside a tenure, or by ours at all, it fails the run: a controller that held the lock missed the
//! service's deletion.

use std::collections::BTreeSet;

use leadermigration::audit::{CLOUD_VERB, Overlap, RequestEntry, UserAgent};
use serde::Serialize;

/// A load balancer whose service is gone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Orphan {
    /// `namespace/name` of the service it was for.
    pub service: String,
    /// Its name in the cloud.
    pub load_balancer: String,
    /// The cloud write that created it (after its last deletion, if any); absent if the cloud's log has none.
    pub created_by: Option<CloudWrite>,
}

/// One cloud write, as the audit judged it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct CloudWrite {
    pub call: String,
    pub identity: String,
    pub controller: String,
    /// `go` (upstream's Go CCM) or `rust` (ours).
    pub peer: &'static str,
    pub time_us: i64,
    /// The audit found its writer without its lock at the time.
    pub outside_tenure: bool,
}

impl Orphan {
    /// Created by upstream's Go CCM while it did not hold its lock.
    pub(super) fn upstream_unfenced(&self) -> bool {
        self.created_by
            .as_ref()
            .is_some_and(|write| write.peer == "go" && write.outside_tenure)
    }
}

/// Explains each `(service, load balancer)` from the cloud writes in `requests` (in the cloud's order) and
/// the audit's `overlaps`; `ours` holds our replicas' identities.
pub(super) fn explain(
    orphans: &[(String, String)],
    requests: &[RequestEntry],
    overlaps: &[Overlap],
    ours: &BTreeSet<String>,
) -> Vec<Orphan> {
    orphans
        .iter()
        .map(|(service, load_balancer)| {
            let writes: Vec<&RequestEntry> = requests
                .iter()
                .filter(|r| {
                    r.verb.as_deref() == Some(CLOUD_VERB)
                        && object(&r.path).is_some_and(|(_, name)| name == load_balancer)
                })
                .collect();
            let since_deletion = writes
                .iter()
                .rposition(|r| object(&r.path).is_some_and(|(call, _)| call == "delete_load_balancer"))
                .map_or(0, |index| index + 1);
            let created_by = writes[since_deletion..]
                .iter()
                .find(|r| object(&r.path).is_some_and(|(call, _)| call == "ensure_load_balancer"))
                .map(|r| judged(r, overlaps, ours));
            Orphan {
                service: service.clone(),
                load_balancer: load_balancer.clone(),
                created_by,
            }
        })
        .collect()
}

/// `(call, object)` of a cloud write's path, `cloud:<call>/<object>`.
fn object(path: &str) -> Option<(&str, &str)> {
    path.strip_prefix("cloud:")?.split_once('/')
}

fn judged(request: &RequestEntry, overlaps: &[Overlap], ours: &BTreeSet<String>) -> CloudWrite {
    let agent = UserAgent::parse(&request.user_agent);
    let identity = agent.as_ref().map(|a| a.identity.clone()).unwrap_or_default();
    CloudWrite {
        call: object(&request.path)
            .map(|(call, _)| call.to_owned())
            .unwrap_or_default(),
        controller: agent.map(|a| a.controller).unwrap_or_default(),
        peer: if ours.contains(&identity) { "rust" } else { "go" },
        time_us: request.time_us,
        outside_tenure: overlaps.iter().any(|overlap| {
            matches!(overlap, Overlap::WriteOutsideTenure { path, time_us, .. }
                if *path == request.path && *time_us == request.time_us)
        }),
        identity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GO: &str = "vm_go";
    const OURS: &str = "vm_ours";

    fn write(call: &str, identity: &str, time_us: i64) -> RequestEntry {
        RequestEntry {
            time_us,
            method: "POST".to_owned(),
            path: format!("cloud:{call}/a1"),
            user_agent: UserAgent {
                component: "cloud-controller-manager".to_owned(),
                version: "v1".to_owned(),
                identity: identity.to_owned(),
                controller: "service-lb-controller".to_owned(),
            }
            .render(),
            verb: Some(CLOUD_VERB.to_owned()),
            status: 200,
            resource_version: None,
            received_us: None,
        }
    }

    fn outside(request: &RequestEntry, identity: &str) -> Overlap {
        Overlap::WriteOutsideTenure {
            component: "cloud-controller-manager".to_owned(),
            identity: identity.to_owned(),
            controller: "service-lb-controller".to_owned(),
            lease: "cloud-controller-manager".to_owned(),
            method: "POST".to_owned(),
            path: request.path.clone(),
            time_us: request.time_us,
        }
    }

    fn explained(requests: &[RequestEntry], overlaps: &[Overlap]) -> Orphan {
        let ours = BTreeSet::from([OURS.to_owned()]);
        let orphans = [("default/web".to_owned(), "a1".to_owned())];
        explain(&orphans, requests, overlaps, &ours).remove(0)
    }

    #[test]
    fn an_orphan_recreated_by_upstream_outside_its_tenure_is_upstreams() {
        let stale = write("ensure_load_balancer", GO, 4);
        let requests = [
            write("ensure_load_balancer", OURS, 1),
            write("delete_load_balancer", OURS, 2),
            stale.clone(),
            write("update_load_balancer", GO, 5),
        ];
        let orphan = explained(&requests, &[outside(&stale, GO)]);
        let created = orphan.created_by.clone().expect("a creator");
        assert_eq!((created.identity.as_str(), created.time_us), (GO, 4));
        assert!(orphan.upstream_unfenced());
    }

    #[test]
    fn an_orphan_created_inside_a_tenure_and_never_deleted_is_not_excused() {
        // Created by ours in its tenure; upstream's later unfenced update does not make it upstream's.
        let update = write("update_load_balancer", GO, 3);
        let requests = [
            write("ensure_load_balancer", OURS, 1),
            write("ensure_load_balancer", GO, 2),
            update.clone(),
        ];
        let orphan = explained(&requests, &[outside(&update, GO)]);
        assert_eq!(orphan.created_by.as_ref().map(|w| w.peer), Some("rust"));
        assert!(!orphan.upstream_unfenced());
    }

    #[test]
    fn ours_outside_its_tenure_and_upstream_inside_its_own_are_not_excused() {
        let ours = write("ensure_load_balancer", OURS, 1);
        assert!(!explained(std::slice::from_ref(&ours), &[outside(&ours, OURS)]).upstream_unfenced());
        let go = write("ensure_load_balancer", GO, 1);
        assert!(!explained(std::slice::from_ref(&go), &[]).upstream_unfenced());
        assert_eq!(explained(&[], &[]).created_by, None);
    }
}
