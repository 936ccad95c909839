//! `service-lb-controller`: cloud load balancers for `type: LoadBalancer` services, as upstream's service
//! controller (its Events report as `service-controller`, as upstream's).
//!
//! - Services of type LoadBalancer of a class the provider serves want one ([`LoadBalancer::classes`]:
//!   by default, those without `spec.loadBalancerClass`, as upstream). Services of other classes are not
//!   touched, even deleting with the finalizer (another manager's: the finalizer's name is shared). The
//!   class goes on the service with the finalizer ([`ANNOTATION_LOAD_BALANCER_CLASS`]), for when a change
//!   of type erases it.
//! - The `service.kubernetes.io/load-balancer-cleanup` finalizer is added *before* anything is created in
//!   the cloud, so a load balancer is never orphaned, whatever crashes between steps.
//! - Ensure → `status.loadBalancer.ingress`; a change of node set → update the hosts; deletion or a change of
//!   type (upstream's `needsCleanup`: our finalizer, and deleting or no longer of type LoadBalancer; here
//!   also of a class served) → ask the cloud whether a load
//!   balancer exists, delete it if so, clear the status, then remove the finalizer. Cleanup on a change of
//!   type is not a deletion, which is why this does not use kube-runtime's `finalizer` helper.
//! - A service deleted without our finalizer, or re-created under its name with a new UID, has the load
//!   balancer this process ensured for it deleted (upstream's `processLoadBalancerDelete`).
//! - Load balancers of this cluster that no service claims are deleted by the orphan sweep ([`sweep`]).
//! - A hosts update that fails on a load balancer that is gone is done (nothing to update); otherwise the
//!   retry is a full ensure.
//! - Node set: upstream's stable predicates (not deleting, not excluded by label, not tainted for deletion
//!   by the cluster autoscaler; readiness is not one). Hosts are synced when a node is added or deleted, or
//!   its provider ID or exclude label changes; the autoscaler's taint alone takes effect at the next sync
//!   something else causes (upstream's connection draining).
//! - `ImplementedElsewhere` counts as done; `Retry { after }` requeues after exactly that long; other
//!   failures back off per service from 5 s doubling to 300 s (upstream's), with up to 10% jitter.
//! - `ingress[].ipMode` as the provider gives it, compared as the API server keeps it ([`ip_mode`]).
//! - Events as upstream: EnsuringLoadBalancer, EnsuredLoadBalancer, UpdatedLoadBalancer,
//!   DeletingLoadBalancer (only when a load balancer exists), DeletedLoadBalancer, and warnings
//!   SyncLoadBalancerFailed (`Error syncing load balancer: …`), UpdateLoadBalancerFailed,
//!   UnAvailableLoadBalancer, DeleteLoadBalancerFailed; and, where upstream has none,
//!   LoadBalancerIPModeUnsupported (a `Proxy` address on an API server that drops `ipMode`) and
//!   IPFamiliesNotServed (the provider's `check_ip_families` refuses the service's `spec.ipFamilies`; a
//!   Warning unless the policy is `PreferDualStack`; the load balancer is still ensured, serving what it can).

mod ip_mode;
mod node_set;
mod sweep;
mod sync;
mod versions;

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::api::Api;
use kube::runtime::events::EventType;
use kube_ccm_provider::names::ANNOTATION_LOAD_BALANCER_CLASS;
use kube_ccm_provider::{LoadBalancer, LoadBalancerClasses};
use tokio::sync::mpsc;

use self::node_set::{NodeSet, spec_hash, sync_trigger};
pub use self::sweep::{MAX_PER_SWEEP, OrphanSweep};
pub(crate) use self::sync::ServiceError;
use self::sync::{Target, clean_up, delete_orphan, ensure, update_hosts};
use super::backoff::Backoff;
use super::periodic::pause;
use crate::cached::Cached;
use crate::cached_node::CachedNode;
use crate::compact::Compact;
use crate::context::ControllerContext;
use crate::informers::Cache;

use crate::runner::{self, Action};

/// What was last done for a service: hashes of the spec and of the node set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Synced {
    spec: u64,
    nodes: u64,
}

/// A pass over the load balancers after the node set changed (for `nodesync_latency_seconds`).
struct NodeSync {
    started: Instant,
    pending: HashSet<String>,
}

/// A node set, as positions in the cache's list of nodes, and the versions of that list.
struct NodeSetMemo {
    versions: u64,
    selected: Vec<usize>,
    hash: u64,
}

pub(super) struct ServiceContext {
    controller: ControllerContext,
    nodes: Cache<CachedNode>,
    /// The last node set given to the provider, while some sync still uses it.
    materialized: Mutex<(u64, Weak<[Arc<Node>]>)>,
    /// The last node set computed, for the versions of the cache's nodes it was computed from: every
    /// sync needs the set, and computing it decodes, sorts and hashes every node (2,000 nodes × 1,000 new
    /// services spent half the controller's CPU there). It keeps positions, not nodes: holding nodes
    /// would keep their replaced versions alive.
    node_set: Mutex<Option<NodeSetMemo>>,
    synced: Mutex<HashMap<String, Synced>>,
    /// The service each load balancer was last ensured for, by `namespace/name`: what to delete when the
    /// service goes without our finalizer or comes back with another UID.
    ensured: Mutex<HashMap<String, Arc<Service>>>,
    /// The resource versions a service had before this process published its load balancer's status,
    /// by `namespace/name`, until a sync sees the service past them: a sync that finds one of them (the
    /// cache has not yet caught up with the status write) has nothing to do, where an address missing
    /// from any later version is repaired by a new ensure.
    unpublished: Mutex<HashMap<String, Vec<String>>>,
    /// Per service, the versions from before this process's clean-up removed its finalizer: a sync that
    /// meets one (the cache behind the clean-up's own writes) does nothing, as the finalizer of another
    /// manager that took the service since may stand where ours was.
    cleaned: Mutex<HashMap<String, Vec<String>>>,
    backoff: Backoff,
    node_sync: Mutex<Option<NodeSync>>,
    /// The provider's classes ([`LoadBalancer::classes`]), asked once.
    classes: LoadBalancerClasses,
    /// What the API server does with `ingress[].ipMode`.
    ip_modes: ip_mode::IpModes,
    /// Syncs that create, change or delete a load balancer, `--concurrent-service-syncs` at once; the
    /// runner runs up to `--concurrent-load-balancer-host-updates`, so a node-set pass goes wider.
    changes: tokio::sync::Semaphore,
}

impl ServiceContext {
    /// The node set as the provider takes it: materialised once, shared by the syncs that use it at the
    /// same time (a pass over many services after a change of node set), and freed after them.
    fn materialize(&self, set: &NodeSet) -> Arc<[Arc<Node>]> {
        let mut memo = self.materialized.lock();
        if memo.0 == set.hash
            && let Some(nodes) = memo.1.upgrade()
        {
            return nodes;
        }
        let nodes: Arc<[Arc<Node>]> = set.nodes.iter().map(|n| Arc::new(n.to_node())).collect();
        *memo = (set.hash, Arc::downgrade(&nodes));
        nodes
    }

    /// The load balancers' node set now, selected again only when the cache's nodes changed.
    fn node_set(&self) -> NodeSet {
        let nodes = self.nodes.state();
        let versions = node_set::versions(&nodes);
        let mut memo = self.node_set.lock();
        let memo = match memo.as_mut() {
            Some(memo) if memo.versions == versions => memo,
            _ => {
                let (selected, hash) = node_set::select(&nodes);
                memo.insert(NodeSetMemo {
                    versions,
                    selected,
                    hash,
                })
            }
        };
        NodeSet {
            nodes: memo.selected.iter().map(|&i| nodes[i].clone()).collect(),
            hash: memo.hash,
        }
    }

    /// Waits for a turn to create, change or delete a load balancer; `None` when the controller stops
    /// first, or after one cloud-call timeout: the sync is then requeued ([`NO_TURN`]), so that a sync
    /// never counts as working (toward the health check's "stuck") for long while only waiting.
    async fn change_turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let settings = self.controller.settings();
        tokio::select! {
            () = self.controller.stop().cancelled() => None,
            turn = tokio::time::timeout(settings.cloud_call_timeout, self.changes.acquire()) => turn.ok()?.ok(),
        }
    }

    fn synced(&self) -> MutexGuard<'_, HashMap<String, Synced>> {
        self.synced.lock()
    }

    fn ensured(&self) -> MutexGuard<'_, HashMap<String, Arc<Service>>> {
        self.ensured.lock()
    }

    /// A load balancer was ensured for `service`.
    fn remember(&self, key: &str, service: &Arc<Service>, synced: Synced) {
        self.synced().insert(key.to_owned(), synced);
        self.ensured().insert(key.to_owned(), service.clone());
    }

    /// The service's load balancer is gone: nothing is kept about it.
    fn forget(&self, key: &str) {
        self.synced().remove(key);
        self.ensured().remove(key);
        self.unpublished.lock().remove(key);
        self.backoff.forget(key);
        self.node_sync_done(key);
    }

    /// A node-set pass starts: the services whose load balancers have another node set than `hash`.
    fn node_sync_started(&self, hash: u64) {
        let pending: HashSet<String> = self
            .synced()
            .iter()
            .filter(|(_, synced)| synced.nodes != hash)
            .map(|(key, _)| key.clone())
            .collect();
        let mut node_sync = self.node_sync.lock();
        if pending.is_empty() {
            self.controller.metrics.nodesync_latency.observe(0.0);
            *node_sync = None;
        } else {
            *node_sync = Some(NodeSync {
                started: Instant::now(),
                pending,
            });
        }
    }

    /// `key`'s hosts were updated (or failed to be) in the current node-set pass.
    fn node_sync_done(&self, key: &str) {
        let mut node_sync = self.node_sync.lock();
        if let Some(pass) = node_sync.as_mut() {
            pass.pending.remove(key);
            if pass.pending.is_empty() {
                let elapsed = pass.started.elapsed().as_secs_f64();
                self.controller.metrics.nodesync_latency.observe(elapsed);
                *node_sync = None;
            }
        }
    }
}

/// How soon a sync that found no turn ([`ServiceContext::change_turn`]) runs again.
const NO_TURN: Duration = Duration::from_secs(1);

fn key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Upstream's `wantsLoadBalancer`, for the provider's classes.
fn wants_load_balancer(service: &Service, classes: &LoadBalancerClasses) -> bool {
    classes.serves(service)
}

fn has_finalizer(service: &Service) -> bool {
    kube_ccm_provider::service::has_load_balancer_finalizer(service)
}

/// Upstream's `needsCleanup`: our finalizer, and deleting or no longer of type LoadBalancer; and, where
/// upstream has none, of a class served. The API server erases the class when the type changes: a service
/// that left type LoadBalancer is of the class recorded with our finalizer
/// ([`ANNOTATION_LOAD_BALANCER_CLASS`]; none recorded: without a class, as upstream).
fn needs_cleanup(service: &Service, classes: &LoadBalancerClasses) -> bool {
    let is_load_balancer = service
        .spec
        .as_ref()
        .is_some_and(|s| s.type_.as_deref() == Some("LoadBalancer"));
    let class = if is_load_balancer {
        kube_ccm_provider::service::load_balancer_class(service)
    } else {
        kube_ccm_provider::service::annotation(service, ANNOTATION_LOAD_BALANCER_CLASS)
    };
    has_finalizer(service)
        && (service.metadata.deletion_timestamp.is_some() || !is_load_balancer)
        && classes.serves_class(class)
}

fn ingress_of(service: &Service) -> Option<&LoadBalancerStatus> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .filter(|lb| lb.ingress.as_ref().is_some_and(|i| !i.is_empty()))
}

pub(super) async fn run(controller: ControllerContext) {
    let services = controller.services();
    let nodes = controller.nodes();
    tokio::select! {
        () = controller.stop().cancelled() => return,
        () = async { tokio::join!(services.ready(), nodes.ready()); } => {}
    }
    let classes = controller
        .provider()
        .load_balancer()
        .map(LoadBalancer::classes)
        .unwrap_or_default();
    tracing::info!(%classes, "serving load balancers");
    let context = Arc::new(ServiceContext {
        controller: controller.clone(),
        nodes: nodes.store(),
        materialized: Mutex::new((0, Weak::<[Arc<Node>; 0]>::new())),
        node_set: Mutex::default(),
        synced: Mutex::default(),
        ensured: Mutex::default(),
        unpublished: Mutex::default(),
        cleaned: Mutex::default(),
        backoff: Backoff::per_key(Duration::from_secs(5), Duration::from_secs(300)),
        node_sync: Mutex::default(),
        classes,
        ip_modes: ip_mode::IpModes::default(),
        changes: tokio::sync::Semaphore::new(controller.settings().concurrent_service_syncs.max(1).into()),
    });
    let (trigger, triggers) = mpsc::channel::<()>(1);
    let watcher = tokio::spawn(watch_node_set(context.clone(), trigger));
    let orphans = tokio::spawn(delete_orphans(context.clone()));
    let sweep = tokio::spawn(sweep::sweep_orphans(context.clone()));
    // Every service at the start, each as it changes, and every one again on each node-set trigger.
    let (queue, store) = (controller.queue.clone(), services.store());
    let triggers = futures::stream::unfold(triggers, |mut receiver| async move {
        receiver.recv().await.map(|()| ((), receiver))
    })
    .map(move |()| {
        for service in store.state() {
            queue.add(&service.key());
        }
    });
    controller.set_started();
    controller
        .runner(runner::by_key(services.store()))
        .concurrency(
            (controller.settings().concurrent_service_syncs)
                .max(controller.settings().concurrent_load_balancer_host_updates),
        )
        .watch(services, |_| true)
        .feed(triggers)
        .run(controller.stop(), reconcile, error_policy, context)
        .await;
    watcher.abort();
    orphans.abort();
    sweep.abort();
}

/// Triggers a pass over every service when nodes are added or deleted, or a provider ID or exclude label
/// changes (upstream's node-sync triggers), checked at most once a second after node changes.
///
/// A deletion always triggers: a node added and deleted within one second leaves the names as they were,
/// yet a service synced meanwhile (its own change triggers that) may have put it in its load balancer.
/// A pass is cheap where nothing changed: each service compares its node set's hash first.
async fn watch_node_set(context: Arc<ServiceContext>, trigger: mpsc::Sender<()>) {
    let nodes = context.controller.nodes();
    let mut changes = std::pin::pin!(futures::stream::select(
        nodes.subscribe().map(|_| false),
        nodes.deletions().map(|_| true)
    ));
    let mut current = sync_trigger(&context.nodes);
    loop {
        let Some(mut deleted) = changes.next().await else {
            return;
        };
        // One pass a second at most, covering what arrives meanwhile. The feed is read all the while: a
        // reader that stops for the second falls behind it and is fed every cached node again.
        let settled = tokio::time::sleep(Duration::from_secs(1));
        let mut settled = std::pin::pin!(settled);
        loop {
            tokio::select! {
                () = context.controller.stop().cancelled() => return,
                () = &mut settled => break,
                change = changes.next() => match change {
                    Some(deletion) => deleted |= deletion,
                    None => return,
                },
            }
        }
        let latest = sync_trigger(&context.nodes);
        if latest != current || deleted {
            current = latest;
            context.node_sync_started(context.node_set().hash);
            // A full channel already holds a pending pass.
            let _ = trigger.try_send(());
        }
    }
}

/// Deletes the load balancers of services deleted without our finalizer, retrying with back-off.
async fn delete_orphans(context: Arc<ServiceContext>) {
    let controller = &context.controller;
    let mut deletions = std::pin::pin!(controller.services().deletions());
    while let Some(deleted) = deletions.next().await {
        let key = deleted.key();
        let ensured = context.ensured().get(&key).cloned();
        let Some(gone) =
            ensured.filter(|e| e.metadata.uid.as_deref().unwrap_or_default() == deleted.identity().uid())
        else {
            context.forget(&key);
            continue;
        };
        let context = context.clone();
        tokio::spawn(async move {
            let Some(load_balancers) = context.controller.provider().load_balancer() else {
                return;
            };
            loop {
                match delete_orphan(&context, load_balancers, &gone).await {
                    Ok(()) => {
                        context.forget(&key);
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(service = %key, %error, "cannot delete the load balancer of a deleted service; retrying");
                        let delay = error
                            .retry_after()
                            .unwrap_or_else(|| context.backoff.failed(&key));
                        if !pause(context.controller.stop(), delay).await {
                            return;
                        }
                    }
                }
            }
        });
    }
}

fn error_policy(
    service: Arc<Compact<Service>>,
    error: &ServiceError,
    context: Arc<ServiceContext>,
) -> Action {
    let key = service.key();
    let after = error
        .retry_after()
        .unwrap_or_else(|| context.backoff.failed(&key));
    Action::requeue(after)
}

async fn reconcile(
    cached: Arc<Compact<Service>>,
    context: Arc<ServiceContext>,
) -> Result<Action, ServiceError> {
    let span = context.controller.reconcile_span(&cached.key());
    tracing::Instrument::instrument(sync_service(cached, context), span).await
}

async fn sync_service(
    cached: Arc<Compact<Service>>,
    context: Arc<ServiceContext>,
) -> Result<Action, ServiceError> {
    let started = Instant::now();
    let service = Arc::new(cached.object());
    let result = sync(service.clone(), &context).await;
    context
        .controller
        .record_reconcile(result.is_ok(), started.elapsed());
    match &result {
        Ok(_) => context.backoff.forget(&key(&service)),
        Err(error) => {
            tracing::warn!(service = %key(&service), %error, "error syncing load balancer");
            if error.is_sync_failure() {
                let note = format!("Error syncing load balancer: {error}");
                context
                    .controller
                    .event(
                        &crate::context::event_reference(service.as_ref()),
                        EventType::Warning,
                        "SyncLoadBalancerFailed",
                        "SyncLoadBalancer",
                        note,
                    )
                    .await;
            }
        }
    }
    result
}

async fn sync(service: Arc<Service>, context: &ServiceContext) -> Result<Action, ServiceError> {
    let controller = &context.controller;
    let Some(load_balancers) = controller.provider().load_balancer() else {
        return Ok(Action::await_change());
    };
    let target = Target {
        context,
        load_balancers,
        api: Api::namespaced(
            controller.client().clone(),
            service.metadata.namespace.as_deref().unwrap_or("default"),
        ),
        name: service.metadata.name.clone().unwrap_or_default(),
        key: key(&service),
        cluster: &controller.settings().cluster_name,
    };
    // A service of this name with another UID had a load balancer: it goes first.
    let previous = context.ensured().get(&target.key).cloned();
    if let Some(previous) = previous.filter(|p| p.metadata.uid != service.metadata.uid) {
        let Some(_turn) = context.change_turn().await else {
            return Ok(Action::requeue(NO_TURN));
        };
        delete_orphan(context, load_balancers, &previous).await?;
        context.forget(&target.key);
    }
    if context.is_before_cleaned(&target.key, &service) {
        return Ok(Action::await_change());
    }
    if needs_cleanup(&service, &context.classes) {
        let Some(_turn) = context.change_turn().await else {
            return Ok(Action::requeue(NO_TURN));
        };
        return clean_up(&target, &service).await;
    }
    if !wants_load_balancer(&service, &context.classes) {
        // One this process ensured a load balancer for, that no longer wants it without our finalizer
        // (an object older than the finalizer): cleaned up as upstream does.
        if context.ensured().contains_key(&target.key) {
            let Some(_turn) = context.change_turn().await else {
                return Ok(Action::requeue(NO_TURN));
            };
            return clean_up(&target, &service).await;
        }
        return Ok(Action::await_change());
    }
    if service.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let set = context.node_set();
    let current = Synced {
        spec: spec_hash(&service),
        nodes: set.hash,
    };
    let previous = context.synced().get(&target.key).copied();
    // Published: the service shows its load balancer's address, or is a version the cache held before
    // this process wrote that address (the status write's watch event is still on its way).
    // (Asked first: the question forgets the versions once the cache is past them.)
    let before_published = context.is_before_published(&target.key, &service);
    let published = before_published || ingress_of(&service).is_some();
    match next_step(previous, current, published) {
        Step::Nothing => Ok(Action::await_change()),
        Step::UpdateHosts => update_hosts(&target, &service, &set, current).await,
        Step::Ensure => {
            let Some(_turn) = context.change_turn().await else {
                return Ok(Action::requeue(NO_TURN));
            };
            // The node set may have changed during the wait.
            let set = context.node_set();
            let current = Synced {
                nodes: set.hash,
                ..current
            };
            ensure(&target, service, &set, current).await
        }
    }
}

/// What a sync of a service that wants a load balancer does.
#[derive(Debug, PartialEq)]
enum Step {
    Nothing,
    /// Only the node set changed since the last ensure.
    UpdateHosts,
    Ensure,
}

/// The step after `previous` (what was last done), for the spec and node set `current`; `published`
/// as in [`sync`]. An address missing from the service is repaired by an ensure.
fn next_step(previous: Option<Synced>, current: Synced, published: bool) -> Step {
    match previous {
        Some(previous) if previous == current && published => Step::Nothing,
        Some(previous) if previous.spec == current.spec && published => Step::UpdateHosts,
        _ => Step::Ensure,
    }
}

#[cfg(test)]
mod tests;
