//! `service-lb-controller`: cloud load balancers for `type: LoadBalancer` services.
//!
//! - Services of type LoadBalancer without `spec.loadBalancerClass` want one.
//! - The `service.kubernetes.io/load-balancer-cleanup` finalizer is added *before* anything is created in
//!   the cloud, so a load balancer is never orphaned, whatever crashes between steps.
//! - Ensure → `status.loadBalancer.ingress`; a change of node set → update; deletion or a change of type
//!   → delete in the cloud, clear the status, then remove the finalizer (a JSON patch with a `test`, so
//!   nobody else's finalizer is touched). Cleanup on a change of type is not a deletion, which is why this
//!   does not use kube-runtime's `finalizer` helper (it only cleans up on deletion).
//! - `ImplementedElsewhere` counts as done; `Retry { after }` requeues after exactly that long.
//! - Node set: nodes not being deleted, without the exclude-from-external-load-balancers label (unless
//!   it parses as false), and not tainted for deletion by the cluster autoscaler. Readiness is not used
//!   (as upstream). When the set changes, every load balancer whose node set differs is updated.
//! - Events as upstream: EnsuringLoadBalancer, EnsuredLoadBalancer, UpdatedLoadBalancer,
//!   DeletingLoadBalancer, DeletedLoadBalancer, and warnings SyncLoadBalancerFailed,
//!   UpdateLoadBalancerFailed, UnAvailableLoadBalancer.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use cloud_provider::CloudError;
use cloud_provider::names::{
    FINALIZER_LOAD_BALANCER_CLEANUP, LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS,
    TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::Store;
use serde_json::json;
use tokio::sync::mpsc;

use super::{ControllerContext, pause, reference};
use crate::cached_node::CachedNode;
use crate::compact::Compact;

/// Why a service could not be synced (all are retried with backoff).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServiceError {
    #[error("cloud provider error: {0}")]
    Cloud(#[source] CloudError),
    #[error("writing the service failed: {0}")]
    Write(#[source] kube::Error),
}

/// What was last done for a service: hashes of the spec and of the node set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Synced {
    spec: u64,
    nodes: u64,
}

struct ServiceContext {
    controller: ControllerContext,
    nodes: Store<CachedNode>,
    /// The last node set given to the provider, while some sync still uses it.
    materialized: Mutex<(u64, Weak<[Arc<Node>]>)>,
    synced: Mutex<HashMap<String, Synced>>,
    failures: Mutex<HashMap<String, u32>>,
}

impl ServiceContext {
    /// The node set as the provider takes it: materialised once, shared by the syncs that use it at the
    /// same time (a pass over many services after a change of node set), and freed after them.
    fn materialize(&self, set: &NodeSet) -> Arc<[Arc<Node>]> {
        let mut memo = self
            .materialized
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if memo.0 == set.hash
            && let Some(nodes) = memo.1.upgrade()
        {
            return nodes;
        }
        let nodes: Arc<[Arc<Node>]> = set.nodes.iter().map(|n| Arc::new(n.to_node())).collect();
        *memo = (set.hash, Arc::downgrade(&nodes));
        nodes
    }

    fn synced(&self) -> MutexGuard<'_, HashMap<String, Synced>> {
        self.synced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn failures(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Upstream's `wantsLoadBalancer`.
fn wants_load_balancer(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .is_some_and(|s| s.type_.as_deref() == Some("LoadBalancer") && s.load_balancer_class.is_none())
}

fn has_finalizer(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP))
}

/// Upstream's `needsCleanup`.
fn needs_cleanup(service: &Service) -> bool {
    has_finalizer(service) && (service.metadata.deletion_timestamp.is_some() || !wants_load_balancer(service))
}

/// Go's `strconv.ParseBool`.
fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Upstream's stable node-set predicates.
fn in_load_balancer(node: &CachedNode) -> bool {
    if node.deleting() || node.has_taint(TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER) {
        return false;
    }
    // An unparsable value excludes the node, as upstream.
    node.label(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS)
        .is_none_or(|v| parse_bool(v) == Some(false))
}

/// The load balancers' node set.
struct NodeSet {
    /// Sorted by name.
    nodes: Vec<Arc<CachedNode>>,
    /// Of the names and provider IDs (what a load balancer depends on).
    hash: u64,
}

fn node_set(nodes: &Store<CachedNode>) -> NodeSet {
    let mut selected: Vec<Arc<CachedNode>> = nodes
        .state()
        .into_iter()
        .filter(|n| in_load_balancer(n))
        .collect();
    selected.sort_by(|a, b| a.name().cmp(b.name()));
    let mut hasher = DefaultHasher::new();
    for node in &selected {
        node.name().hash(&mut hasher);
        node.provider_id().hash(&mut hasher);
    }
    NodeSet {
        nodes: selected,
        hash: hasher.finish(),
    }
}

/// Identifies what of a service a load balancer depends on (upstream's `needsUpdate` fields).
fn spec_hash(service: &Service) -> u64 {
    let spec = service.spec.clone().unwrap_or_default();
    let relevant = json!({
        "uid": service.metadata.uid,
        "annotations": service.metadata.annotations,
        "type": spec.type_,
        "ports": spec.ports,
        "sourceRanges": spec.load_balancer_source_ranges,
        "sessionAffinity": spec.session_affinity,
        "sessionAffinityConfig": spec.session_affinity_config,
        "loadBalancerIP": spec.load_balancer_ip,
        "externalIPs": spec.external_ips,
        "externalTrafficPolicy": spec.external_traffic_policy,
        "healthCheckNodePort": spec.health_check_node_port,
        "ipFamilies": spec.ip_families.as_ref().map(Vec::len),
    });
    let mut hasher = DefaultHasher::new();
    relevant.to_string().hash(&mut hasher);
    hasher.finish()
}

fn ingress_of(service: &Service) -> Option<&LoadBalancerStatus> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .filter(|lb| lb.ingress.as_ref().is_some_and(|i| !i.is_empty()))
}

pub(super) async fn run(controller: ControllerContext) {
    let services = controller.informers.services();
    let nodes = controller.informers.nodes();
    tokio::select! {
        () = controller.stop.cancelled() => return,
        () = async { tokio::join!(services.ready(), nodes.ready()); } => {}
    }
    let context = Arc::new(ServiceContext {
        controller: controller.clone(),
        nodes: nodes.store(),
        materialized: Mutex::new((0, Weak::<[Arc<Node>; 0]>::new())),
        synced: Mutex::default(),
        failures: Mutex::default(),
    });
    let (trigger, triggers) = mpsc::channel::<()>(1);
    let watcher = tokio::spawn(watch_node_set(context.clone(), trigger));
    let triggers = futures::stream::unfold(triggers, |mut receiver| async move {
        receiver.recv().await.map(|()| ((), receiver))
    });
    controller.started.send_replace(true);
    let stop = controller.stop.clone();
    Controller::for_shared_stream(services.subscribe(), services.store())
        .with_config(Config::default().concurrency(controller.settings.concurrent_service_syncs))
        .reconcile_all_on(futures::stream::once(async {}).chain(triggers))
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, context)
        .for_each(|_| async {})
        .await;
    watcher.abort();
}

/// Triggers a pass over every service when the load balancers' node set changes (checked at most once a
/// second after node changes).
async fn watch_node_set(context: Arc<ServiceContext>, trigger: mpsc::Sender<()>) {
    let mut changes = std::pin::pin!(context.controller.informers.nodes().subscribe());
    let mut current = node_set(&context.nodes).hash;
    loop {
        if changes.next().await.is_none() {
            return;
        }
        if !pause(&context.controller.stop, Duration::from_secs(1)).await {
            return;
        }
        // Drain what arrived meanwhile; one pass covers it all.
        while let Some(Some(_)) = futures::FutureExt::now_or_never(changes.next()) {}
        let latest = node_set(&context.nodes).hash;
        if latest != current {
            current = latest;
            // A full channel already holds a pending pass.
            let _ = trigger.try_send(());
        }
    }
}

fn error_policy(
    service: Arc<Compact<Service>>,
    error: &ServiceError,
    context: Arc<ServiceContext>,
) -> Action {
    if let ServiceError::Cloud(CloudError::Retry { after, .. }) = error {
        return Action::requeue(*after);
    }
    // Upstream's per-service exponential back-off: 5 s doubling to 300 s.
    let mut failures = context.failures();
    let count = failures.entry(service.key()).or_insert(0);
    *count = (*count + 1).min(7);
    Action::requeue(Duration::from_secs(5 * 2u64.pow(*count - 1)).min(Duration::from_secs(300)))
}

async fn reconcile(
    cached: Arc<Compact<Service>>,
    context: Arc<ServiceContext>,
) -> Result<Action, ServiceError> {
    let started = Instant::now();
    let service = Arc::new(cached.object());
    let result = sync(service.clone(), &context).await;
    let name = context.controller.controller.as_str();
    context
        .controller
        .metrics
        .reconciled(name, result.is_ok(), started.elapsed().as_secs_f64());
    match &result {
        Ok(_) => {
            context.failures().remove(&key(&service));
        }
        Err(error) => tracing::warn!(service = %key(&service), %error, "cannot sync load balancer"),
    }
    result
}

async fn sync(service: Arc<Service>, context: &ServiceContext) -> Result<Action, ServiceError> {
    let controller = &context.controller;
    let Some(load_balancers) = controller.provider.load_balancer() else {
        return Ok(Action::await_change());
    };
    let service_key = key(&service);
    let cluster = controller.settings.cluster_name.clone();
    let api: Api<Service> = Api::namespaced(
        controller.client.clone(),
        service.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let name = service.metadata.name.clone().unwrap_or_default();

    if needs_cleanup(&service) {
        controller
            .event(
                &reference(service.as_ref()),
                false,
                "DeletingLoadBalancer",
                "DeleteLoadBalancer",
                "Deleting load balancer".to_owned(),
            )
            .await;
        match load_balancers
            .ensure_load_balancer_deleted(&cluster, &service)
            .await
        {
            Ok(()) | Err(CloudError::ImplementedElsewhere) => {}
            Err(error) => {
                let note = format!("Error deleting load balancer: {error}");
                controller
                    .event(
                        &reference(service.as_ref()),
                        true,
                        "SyncLoadBalancerFailed",
                        "DeleteLoadBalancer",
                        note,
                    )
                    .await;
                return Err(ServiceError::Cloud(error));
            }
        }
        controller.metrics.load_balancer_syncs.inc();
        controller
            .event(
                &reference(service.as_ref()),
                false,
                "DeletedLoadBalancer",
                "DeleteLoadBalancer",
                "Deleted load balancer".to_owned(),
            )
            .await;
        if ingress_of(&service).is_some() {
            let patch = json!({"status": {"loadBalancer": {"ingress": null}}});
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(ServiceError::Write(error)),
            }
        }
        remove_finalizer(&api, &service).await?;
        context.synced().remove(&service_key);
        return Ok(Action::await_change());
    }
    if !wants_load_balancer(&service) || service.metadata.deletion_timestamp.is_some() {
        context.synced().remove(&service_key);
        return Ok(Action::await_change());
    }

    // The finalizer goes on before anything exists in the cloud.
    let service = if has_finalizer(&service) {
        service
    } else {
        let mut finalizers = service.metadata.finalizers.clone().unwrap_or_default();
        finalizers.push(FINALIZER_LOAD_BALANCER_CLEANUP.to_owned());
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": service.metadata.resource_version}});
        Arc::new(
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map_err(ServiceError::Write)?,
        )
    };

    let set = node_set(&context.nodes);
    let current = Synced {
        spec: spec_hash(&service),
        nodes: set.hash,
    };
    let previous = context.synced().get(&service_key).copied();
    let has_ingress = ingress_of(&service).is_some();
    match previous {
        Some(previous) if previous == current && has_ingress => return Ok(Action::await_change()),
        Some(previous) if previous.spec == current.spec && has_ingress => {
            // Only the node set changed.
            let nodes = context.materialize(&set);
            return match load_balancers
                .update_load_balancer(&cluster, &service, &nodes)
                .await
            {
                Ok(()) | Err(CloudError::ImplementedElsewhere) => {
                    controller.metrics.load_balancer_syncs.inc();
                    context.synced().insert(service_key, current);
                    let note = "Updated load balancer with new hosts".to_owned();
                    controller
                        .event(
                            &reference(service.as_ref()),
                            false,
                            "UpdatedLoadBalancer",
                            "UpdateLoadBalancer",
                            note,
                        )
                        .await;
                    Ok(Action::await_change())
                }
                Err(CloudError::Retry { after, .. }) => Ok(Action::requeue(after)),
                Err(error) => {
                    let note = format!(
                        "Error updating load balancer with new hosts {}: {error}",
                        nodes.len()
                    );
                    controller
                        .event(
                            &reference(service.as_ref()),
                            true,
                            "UpdateLoadBalancerFailed",
                            "UpdateLoadBalancer",
                            note,
                        )
                        .await;
                    Err(ServiceError::Cloud(error))
                }
            };
        }
        _ => {}
    }

    controller
        .event(
            &reference(service.as_ref()),
            false,
            "EnsuringLoadBalancer",
            "EnsureLoadBalancer",
            "Ensuring load balancer".to_owned(),
        )
        .await;
    let nodes = context.materialize(&set);
    if nodes.is_empty() {
        let note = "There are no available nodes for LoadBalancer".to_owned();
        controller
            .event(
                &reference(service.as_ref()),
                true,
                "UnAvailableLoadBalancer",
                "EnsureLoadBalancer",
                note,
            )
            .await;
    }
    let status = match load_balancers
        .ensure_load_balancer(&cluster, &service, &nodes)
        .await
    {
        Ok(status) => status,
        Err(CloudError::ImplementedElsewhere) => {
            context.synced().insert(service_key, current);
            return Ok(Action::await_change());
        }
        Err(CloudError::Retry { after, message }) => {
            tracing::info!(service = %service_key, ?after, %message, "the cloud asks to retry later");
            return Ok(Action::requeue(after));
        }
        Err(error) => {
            let note = format!("Error syncing load balancer: failed to ensure load balancer: {error}");
            controller
                .event(
                    &reference(service.as_ref()),
                    true,
                    "SyncLoadBalancerFailed",
                    "EnsureLoadBalancer",
                    note,
                )
                .await;
            return Err(ServiceError::Cloud(error));
        }
    };
    controller.metrics.load_balancer_syncs.inc();
    if service.status.as_ref().and_then(|s| s.load_balancer.as_ref()) != Some(&status) {
        let patch = json!({"status": {"loadBalancer": status}});
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
            Err(error) => return Err(ServiceError::Write(error)),
        }
    }
    context.synced().insert(service_key, current);
    controller
        .event(
            &reference(service.as_ref()),
            false,
            "EnsuredLoadBalancer",
            "EnsureLoadBalancer",
            "Ensured load balancer".to_owned(),
        )
        .await;
    Ok(Action::await_change())
}

/// Removes our finalizer only: the patch fails if the list changed at that position.
async fn remove_finalizer(api: &Api<Service>, service: &Service) -> Result<(), ServiceError> {
    let finalizers = service.metadata.finalizers.clone().unwrap_or_default();
    let Some(index) = finalizers
        .iter()
        .position(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP)
    else {
        return Ok(());
    };
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER_LOAD_BALANCER_CLEANUP},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ]))
    .expect("a valid JSON patch");
    let name = service.metadata.name.clone().unwrap_or_default();
    match api
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(ServiceError::Write(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(value: serde_json::Value) -> CachedNode {
        serde_json::from_value(value).unwrap()
    }

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn node_set_predicates() {
        assert!(in_load_balancer(&node(json!({"metadata": {"name": "a"}}))));
        assert!(in_load_balancer(&node(
            json!({"metadata": {"name": "a", "labels": {LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: "false"}}})
        )));
        assert!(!in_load_balancer(&node(
            json!({"metadata": {"name": "a", "labels": {LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: "true"}}})
        )));
        assert!(
            !in_load_balancer(&node(
                json!({"metadata": {"name": "a", "labels": {LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: "yes"}}})
            )),
            "unparsable excludes"
        );
        assert!(!in_load_balancer(&node(
            json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"}})
        )));
        assert!(!in_load_balancer(&node(
            json!({"metadata": {"name": "a"}, "spec": {"taints": [{"key": TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER, "effect": "NoSchedule"}]}})
        )));
        let ready_or_not = node(
            json!({"metadata": {"name": "a"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        );
        assert!(in_load_balancer(&ready_or_not), "readiness is not a predicate");
    }

    #[test]
    fn wanting_and_cleaning_up() {
        let lb = service(json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer"}}));
        assert!(wants_load_balancer(&lb) && !needs_cleanup(&lb));
        let classed = service(
            json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer", "loadBalancerClass": "other"}}),
        );
        assert!(!wants_load_balancer(&classed));
        let changed_type = service(
            json!({"metadata": {"name": "s", "finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP]}, "spec": {"type": "ClusterIP"}}),
        );
        assert!(needs_cleanup(&changed_type));
        let deleting = service(
            json!({"metadata": {"name": "s", "finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP], "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"type": "LoadBalancer"}}),
        );
        assert!(needs_cleanup(&deleting));
    }

    #[test]
    fn spec_hash_ignores_status_and_unrelated_fields() {
        let a = service(
            json!({"metadata": {"name": "s", "uid": "u"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
        );
        let mut b = a.clone();
        b.status =
            Some(serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}})).unwrap());
        b.metadata.resource_version = Some("9".into());
        assert_eq!(spec_hash(&a), spec_hash(&b));
        let c = service(
            json!({"metadata": {"name": "s", "uid": "u"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 81}]}}),
        );
        assert_ne!(spec_hash(&a), spec_hash(&c));
    }
}
