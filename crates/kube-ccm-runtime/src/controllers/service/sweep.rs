//! The orphan sweep (decision 0035): load balancers the cloud holds for this cluster that no service
//! claims any more are deleted, after a grace period.
//!
//! The finalizer keeps a load balancer from outliving its service while a manager runs. The sweep is for
//! what the finalizer cannot cover: a service deleted while no manager ran with its finalizer removed by
//! hand, a manager killed between a create and the status write that would have named the load balancer,
//! a delete cut short half-way (a target group or security group left), another manager's leftovers.
//!
//! - **What is listed**: [`LoadBalancer::list_load_balancers`], only what is provably this cluster's
//!   (tagged or named for it). A provider without it has no sweep.
//! - **Claimed**: a load balancer is claimed while any service in the cache, of any type, maps to its name
//!   ([`LoadBalancer::load_balancer_name`]), or this process ensured it for a service it is still cleaning
//!   up after. A leftover part the cloud knows no load balancer name for is claimed while the service the
//!   cloud recorded for it exists, and always when it recorded none.
//! - **Grace**: deleted only when unclaimed on every sweep for at least [`OrphanSweep::grace`]; a sweep
//!   that finds it claimed (or does not list it) forgets it. The memory lives for one tenure.
//! - **A live read**: before deleting, the service the cloud recorded for it (a tag) is read from the API
//!   server; if it exists and maps to the name, the load balancer is kept (the cache was behind).
//! - At most [`MAX_PER_SWEEP`] deletions a sweep, each fenced by the controller's lock, as every write.
//! - **Dry run** ([`OrphanSweep::dry_run`]): the Warning Event `OrphanedLoadBalancer` once per load
//!   balancer, no deletion. Otherwise `DeletedOrphanedLoadBalancer` (Normal) or
//!   `DeleteOrphanedLoadBalancerFailed` (Warning), on the service the cloud recorded, by namespace and name
//!   (gone, or re-created with another UID).
//! - Metrics: `service_controller_orphaned_load_balancers` (unclaimed, not deleted yet) and
//!   `service_controller_orphaned_load_balancers_deleted_total`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::api::Api;
use kube::runtime::events::EventType;
use kube_ccm_provider::{CloudError, ClusterLoadBalancer, LoadBalancer, Priority};
use tokio::time::Instant;

use super::ServiceContext;
use crate::controllers::periodic::pause;

/// The most load balancers one sweep deletes; the rest wait for the next sweep.
pub const MAX_PER_SWEEP: usize = 50;

/// How the orphan sweep runs (`--load-balancer-orphan-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanSweep {
    /// How often the cloud is asked for the cluster's load balancers
    /// (`--load-balancer-orphan-sweep-period`; zero: never).
    pub period: Duration,
    /// How long a load balancer must have been found unclaimed, on every sweep, before it is deleted
    /// (`--load-balancer-orphan-grace`).
    pub grace: Duration,
    /// Report orphans, delete none (`--load-balancer-orphan-dry-run`).
    pub dry_run: bool,
}

impl Default for OrphanSweep {
    fn default() -> Self {
        OrphanSweep {
            period: Duration::from_secs(300),
            grace: Duration::from_secs(600),
            dry_run: false,
        }
    }
}

/// What one sweep found.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Found {
    /// Unclaimed for at least the grace period, the longest first, at most [`MAX_PER_SWEEP`].
    pub(super) due: Vec<ClusterLoadBalancer>,
    /// Unclaimed, and not in `due`.
    pub(super) waiting: usize,
}

/// What the cluster's services claim: the names their load balancers have, and the services
/// (`namespace/name`), for leftover parts without a name.
#[derive(Debug, Default)]
pub(super) struct Claims {
    pub(super) names: HashSet<String>,
    pub(super) services: HashSet<String>,
}

impl Claims {
    fn claim(&self, lb: &ClusterLoadBalancer) -> bool {
        if lb.name.is_empty() {
            lb.service.as_ref().is_none_or(|s| self.services.contains(s))
        } else {
            self.names.contains(&lb.name)
        }
    }
}

/// The load balancers found unclaimed, by [`ClusterLoadBalancer::key`]: since when, and whether a dry run
/// reported it.
#[derive(Debug, Default)]
pub(super) struct Unclaimed {
    since: HashMap<String, (Instant, bool)>,
}

impl Unclaimed {
    /// One sweep at `now`: `listed` by the cloud, `claims` what the cluster's services claim.
    pub(super) fn sweep(
        &mut self,
        listed: Vec<ClusterLoadBalancer>,
        claims: &Claims,
        now: Instant,
        grace: Duration,
    ) -> Found {
        let unclaimed: Vec<(String, ClusterLoadBalancer)> = listed
            .into_iter()
            .filter(|lb| !claims.claim(lb))
            .map(|lb| (lb.key(), lb))
            .collect();
        let keys: HashSet<&str> = unclaimed.iter().map(|(key, _)| key.as_str()).collect();
        self.since.retain(|key, _| keys.contains(key.as_str()));
        let mut due = Vec::new();
        let mut waiting = 0;
        for (key, lb) in unclaimed {
            let since = self.since.entry(key).or_insert((now, false)).0;
            if now.duration_since(since) >= grace {
                due.push((since, lb));
            } else {
                waiting += 1;
            }
        }
        due.sort_by(|(a, x), (b, y)| a.cmp(b).then_with(|| x.key().cmp(&y.key())));
        waiting += due.len().saturating_sub(MAX_PER_SWEEP);
        due.truncate(MAX_PER_SWEEP);
        Found {
            due: due.into_iter().map(|(_, lb)| lb).collect(),
            waiting,
        }
    }

    /// Whether `key` is yet to be reported by a dry run (and it is, from now on).
    pub(super) fn report(&mut self, key: &str) -> bool {
        self.since
            .get_mut(key)
            .is_some_and(|(_, reported)| !std::mem::replace(reported, true))
    }

    /// `key` was deleted, or found claimed after all.
    pub(super) fn forget(&mut self, key: &str) {
        self.since.remove(key);
    }
}

/// Sweeps every [`OrphanSweep::period`], the first time once the caches are synced.
pub(super) async fn sweep_orphans(context: Arc<ServiceContext>) {
    let controller = &context.controller;
    let settings = controller.settings().load_balancer_sweep.clone();
    let Some(load_balancers) = controller.provider().load_balancer() else {
        return;
    };
    if settings.period.is_zero() {
        return;
    }
    let mut unclaimed = Unclaimed::default();
    loop {
        match sweep_once(&context, load_balancers, &mut unclaimed, &settings).await {
            Ok(()) => {}
            Err(CloudError::NotImplemented) => {
                tracing::info!("the cloud provider lists no load balancers: no orphan sweep");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot list the cluster's load balancers; sweeping orphans next period")
            }
        }
        if !pause(controller.stop(), settings.period).await {
            return;
        }
    }
}

async fn sweep_once(
    context: &ServiceContext,
    load_balancers: &dyn LoadBalancer,
    unclaimed: &mut Unclaimed,
    settings: &OrphanSweep,
) -> Result<(), CloudError> {
    let controller = &context.controller;
    let cluster = &controller.settings().cluster_name;
    // Each call is a unit of work of its own for the health check: a sweep of many deletions may take
    // longer than one unit may.
    let cx = controller.call_context_at(Priority::Refresh);
    let listed = {
        let _working = controller.working();
        cx.call(
            "list_load_balancers",
            load_balancers.list_load_balancers(&cx, cluster),
        )
        .await?
    };
    let found = unclaimed.sweep(
        listed,
        &claims(context, load_balancers, cluster),
        Instant::now(),
        settings.grace,
    );
    let mut left = found.waiting;
    for orphan in found.due {
        let kept = if settings.dry_run {
            report(context, unclaimed, &orphan).await;
            true
        } else {
            !delete(context, load_balancers, unclaimed, &orphan).await
        };
        left += usize::from(kept);
    }
    controller
        .metrics
        .orphaned_load_balancers
        .set(i64::try_from(left).unwrap_or(i64::MAX));
    Ok(())
}

/// The dry run's report of `orphan`, once per load balancer.
async fn report(context: &ServiceContext, unclaimed: &mut Unclaimed, orphan: &ClusterLoadBalancer) {
    if !unclaimed.report(&orphan.key()) {
        return;
    }
    tracing::warn!(load_balancer = %orphan.name, service = ?orphan.service, parts = ?orphan.parts, "a load balancer outlived its service (dry run: kept)");
    let note = format!(
        "Load balancer {} outlived its service; --load-balancer-orphan-dry-run keeps it",
        orphan.name
    );
    event(context, orphan, EventType::Warning, "OrphanedLoadBalancer", note).await;
}

/// Deletes `orphan` unless the live read finds it claimed; whether it is gone (a claimed one is kept and
/// its grace starts again).
async fn delete(
    context: &ServiceContext,
    load_balancers: &dyn LoadBalancer,
    unclaimed: &mut Unclaimed,
    orphan: &ClusterLoadBalancer,
) -> bool {
    let controller = &context.controller;
    let cluster = &controller.settings().cluster_name;
    let claimed = {
        let _working = controller.working();
        still_claimed(context, load_balancers, cluster, orphan).await
    };
    if claimed {
        unclaimed.forget(&orphan.key());
        return false;
    }
    let cx = controller.call_context();
    let deleted = {
        let _working = controller.working();
        cx.call(
            "delete_load_balancer",
            load_balancers.delete_load_balancer(&cx, cluster, orphan),
        )
        .await
    };
    match deleted {
        Ok(()) => {
            unclaimed.forget(&orphan.key());
            controller.metrics.orphaned_load_balancers_deleted.inc();
            tracing::info!(load_balancer = %orphan.name, service = ?orphan.service, parts = ?orphan.parts, "deleted a load balancer that outlived its service");
            let note = format!("Deleted load balancer {}: its service is gone", orphan.name);
            event(
                context,
                orphan,
                EventType::Normal,
                "DeletedOrphanedLoadBalancer",
                note,
            )
            .await;
            true
        }
        Err(error) => {
            tracing::warn!(load_balancer = %orphan.name, %error, "cannot delete a load balancer that outlived its service; trying again next sweep");
            let note = format!("Error deleting load balancer {}: {error}", orphan.name);
            event(
                context,
                orphan,
                EventType::Warning,
                "DeleteOrphanedLoadBalancerFailed",
                note,
            )
            .await;
            false
        }
    }
}

/// An Event about `orphan` on the service the cloud recorded for it, if it recorded one.
async fn event(
    context: &ServiceContext,
    orphan: &ClusterLoadBalancer,
    kind: EventType,
    reason: &str,
    note: String,
) {
    if let Some(reference) = orphan.service.as_deref().and_then(service_reference) {
        context
            .controller
            .event(&reference, kind, reason, "DeleteLoadBalancer", note)
            .await;
    }
}

/// What the cluster's services claim: every cached service, of any type, and those this process ensured
/// a load balancer for (a service deleted without our finalizer, still being cleaned up).
fn claims(context: &ServiceContext, load_balancers: &dyn LoadBalancer, cluster: &str) -> Claims {
    let mut claims = Claims::default();
    let cached = context.controller.services().store().state();
    let ensured: Vec<Arc<Service>> = context.ensured().values().cloned().collect();
    let services = cached.iter().map(|s| Arc::new(s.object())).chain(ensured);
    for service in services {
        claims
            .names
            .insert(load_balancers.load_balancer_name(cluster, &service));
        claims.services.insert(super::key(&service));
    }
    claims
}

/// Whether the service the cloud recorded for `orphan` exists on the API server and claims it; an
/// unanswered read counts as claimed (and the grace starts again).
async fn still_claimed(
    context: &ServiceContext,
    load_balancers: &dyn LoadBalancer,
    cluster: &str,
    orphan: &ClusterLoadBalancer,
) -> bool {
    let Some((namespace, name)) = orphan.service.as_deref().and_then(|k| k.split_once('/')) else {
        return orphan.name.is_empty();
    };
    let api: Api<Service> = Api::namespaced(context.controller.client().clone(), namespace);
    match api.get_opt(name).await {
        Ok(None) => false,
        Ok(Some(service)) => {
            orphan.name.is_empty() || load_balancers.load_balancer_name(cluster, &service) == orphan.name
        }
        Err(error) => {
            tracing::warn!(load_balancer = %orphan.name, %error, "cannot read the service of a load balancer that seems orphaned; keeping it this sweep");
            true
        }
    }
}

/// A reference to the (gone) service `namespace/name`, for Events.
fn service_reference(key: &str) -> Option<ObjectReference> {
    let (namespace, name) = key.split_once('/')?;
    Some(ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Service".to_owned()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        ..ObjectReference::default()
    })
}

#[cfg(test)]
mod tests;
