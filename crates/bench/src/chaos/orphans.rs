//! Load balancers left in the cloud after their service is gone, each with the cloud write that made it.
//!
//! The run waits for such a load balancer to go until its deadline (ours deletes one it ensured for a
//! service deleted without its finalizer; nothing else deletes a load balancer whose service is gone).
//! One still there then is judged by who created it: the `ensure_load_balancer` after its last deletion.
//! It is excused, as upstream's unfenced write (a replica that lost its Lease, e.g. while stopped, acting
//! on what it had queued), only when both hold: upstream's Go CCM created it outside its own tenure, and no
//! write of ours touched the service or its load balancer after the service was gone from the API server
//! (its last write). Anything else fails the run: a controller of ours, or one that held the lock, left it.

use ccm_audit::{Applied, CLOUD_VERB, Overlap, RequestEntry, UserAgent};
use serde::Serialize;

use super::plane::Peer;

/// A load balancer whose service is gone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Orphan {
    /// `namespace/name` of the service it was for.
    pub service: String,
    /// Its name in the cloud.
    pub load_balancer: String,
    /// The cloud write that created it (after its last deletion, if any); absent if the cloud's log has none.
    pub created_by: Option<CloudWrite>,
    /// When the service was gone from the API server: its last successful write (microseconds).
    pub service_gone_us: Option<i64>,
    /// Writes of ours that touched the service or its load balancer since then.
    pub ours_after_deletion: Vec<CloudWrite>,
    /// Why it does not fail the run; `None`: it does.
    pub excused: Option<String>,
}

/// One write, as the audit judged it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct CloudWrite {
    /// The cloud call, or the Kubernetes request (`PATCH /api/v1/…`).
    pub call: String,
    pub identity: String,
    pub controller: String,
    /// `go` (upstream's Go CCM), `rust` (ours) or `unknown` (no replica the run started).
    pub peer: &'static str,
    pub time_us: i64,
    /// The audit found its writer without its lock at the time.
    pub outside_tenure: bool,
}

/// Explains each `(service, load balancer)` from the writes in `requests` (the cloud's in its order) and
/// the audit's `overlaps`; `peer_of` says whose a process identity is, by construction.
pub(super) fn explain(
    orphans: &[(String, String)],
    requests: &[RequestEntry],
    overlaps: &[Overlap],
    peer_of: &dyn Fn(&str) -> Option<Peer>,
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
                .map(|r| judged(r, overlaps, peer_of));
            let service_path = service_path(service);
            let about_service =
                |r: &RequestEntry| r.path == service_path || r.path.starts_with(&format!("{service_path}/"));
            let service_gone_us = requests
                .iter()
                .filter(|r| about_service(r) && r.applied() == Applied::Yes)
                .map(|r| r.time_us)
                .max();
            let ours_after_deletion: Vec<CloudWrite> = requests
                .iter()
                .filter(|r| r.applied() != Applied::No)
                .filter(|r| service_gone_us.is_none_or(|gone| r.time_us > gone))
                .filter(|r| writes.iter().any(|w| std::ptr::eq(*w, *r)) || about_service(r))
                .map(|r| judged(r, overlaps, peer_of))
                .filter(|write| write.peer == "rust")
                .collect();
            let excused = created_by
                .as_ref()
                .filter(|write| write.peer == "go" && write.outside_tenure && ours_after_deletion.is_empty())
                .map(|write| {
                    format!(
                        "created by upstream's Go CCM {} outside its tenure (an unfenced write), and no \
                         write of ours touched the service or its load balancer after the service was gone",
                        write.identity
                    )
                });
            Orphan {
                service: service.clone(),
                load_balancer: load_balancer.clone(),
                created_by,
                service_gone_us,
                ours_after_deletion,
                excused,
            }
        })
        .collect()
}

/// The API path of `namespace/name`'s Service.
fn service_path(service: &str) -> String {
    let (namespace, name) = service.split_once('/').unwrap_or(("default", service));
    format!("/api/v1/namespaces/{namespace}/services/{name}")
}

/// `(call, object)` of a cloud write's path, `cloud:<call>/<object>`.
fn object(path: &str) -> Option<(&str, &str)> {
    path.strip_prefix("cloud:")?.split_once('/')
}

fn judged(
    request: &RequestEntry,
    overlaps: &[Overlap],
    peer_of: &dyn Fn(&str) -> Option<Peer>,
) -> CloudWrite {
    let agent = UserAgent::parse(&request.user_agent);
    let identity = agent.as_ref().map(|a| a.identity.clone()).unwrap_or_default();
    CloudWrite {
        call: object(&request.path).map_or_else(
            || format!("{} {}", request.method, request.path),
            |(call, _)| call.to_owned(),
        ),
        controller: agent.map(|a| a.controller).unwrap_or_default(),
        peer: match peer_of(&identity) {
            Some(Peer::Go) => "go",
            Some(Peer::Rust) => "rust",
            None => "unknown",
        },
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
            status: request.status,
            received_us: request.received_us,
        }
    }

    fn peer_of(identity: &str) -> Option<Peer> {
        match identity {
            OURS => Some(Peer::Rust),
            GO => Some(Peer::Go),
            _ => None,
        }
    }

    fn explained(requests: &[RequestEntry], overlaps: &[Overlap]) -> Orphan {
        let orphans = [("default/web".to_owned(), "a1".to_owned())];
        explain(&orphans, requests, overlaps, &peer_of).remove(0)
    }

    /// A Kubernetes write of the service by `identity` at `time_us`.
    fn service_write(identity: &str, time_us: i64) -> RequestEntry {
        RequestEntry {
            method: "PATCH".to_owned(),
            path: "/api/v1/namespaces/default/services/web".to_owned(),
            verb: Some("patch".to_owned()),
            ..write("ensure_load_balancer", identity, time_us)
        }
    }

    #[test]
    fn an_orphan_recreated_by_upstream_outside_its_tenure_is_upstreams() {
        let stale = write("ensure_load_balancer", GO, 4);
        let requests = [
            write("ensure_load_balancer", OURS, 1),
            write("delete_load_balancer", OURS, 2),
            // Ours removes the finalizer: the service is gone.
            service_write(OURS, 3),
            stale.clone(),
            write("update_load_balancer", GO, 5),
        ];
        let orphan = explained(&requests, &[outside(&stale, GO)]);
        let created = orphan.created_by.clone().expect("a creator");
        assert_eq!((created.identity.as_str(), created.time_us), (GO, 4));
        assert_eq!(orphan.service_gone_us, Some(3));
        assert!(orphan.excused.is_some(), "{orphan:?}");
    }

    #[test]
    fn a_write_of_ours_after_the_service_was_gone_is_not_excused() {
        let stale = write("ensure_load_balancer", GO, 4);
        let mut requests = vec![
            write("ensure_load_balancer", OURS, 1),
            write("delete_load_balancer", OURS, 2),
            service_write(OURS, 3),
            stale.clone(),
        ];
        // Ours updates the load balancer of a service that is gone.
        requests.push(write("update_load_balancer", OURS, 6));
        let orphan = explained(&requests, &[outside(&stale, GO)]);
        assert_eq!(orphan.created_by.as_ref().map(|w| w.peer), Some("go"));
        assert_eq!(orphan.ours_after_deletion.len(), 1);
        assert_eq!(orphan.excused, None);
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
        assert_eq!(orphan.excused, None);
    }

    #[test]
    fn ours_outside_its_tenure_upstream_inside_its_own_and_strangers_are_not_excused() {
        let ours = write("ensure_load_balancer", OURS, 1);
        assert_eq!(
            explained(std::slice::from_ref(&ours), &[outside(&ours, OURS)]).excused,
            None
        );
        let go = write("ensure_load_balancer", GO, 1);
        assert_eq!(explained(std::slice::from_ref(&go), &[]).excused, None);
        // An identity no replica of the run had.
        let stranger = write("ensure_load_balancer", "vm_other", 1);
        let orphan = explained(std::slice::from_ref(&stranger), &[outside(&stranger, "vm_other")]);
        assert_eq!(orphan.created_by.as_ref().map(|w| w.peer), Some("unknown"));
        assert_eq!(orphan.excused, None);
        assert_eq!(explained(&[], &[]).created_by, None);
    }
}
