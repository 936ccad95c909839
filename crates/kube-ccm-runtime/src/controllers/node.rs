//! `cloud-node-controller`: initialises nodes from the cloud and keeps them current.
//!
//! A node carrying the uninitialized taint gets, from one (batched) metadata look-up: its addresses (one
//! status write, honouring `alpha.kubernetes.io/provided-node-ip`), then in one more write its provider ID
//! (if empty), the instance-type, zone and region labels in pairs, the provider's additional labels
//! (filtered as upstream), and the removal of the taint, last. That write is conditional on the node's
//! resourceVersion, so a taint added meanwhile is never lost. Two writes per node, no more.
//!
//! Initialised nodes get their label pairs reconciled (the beta label wins, as upstream), and every
//! `--node-status-update-frequency` their addresses are refreshed. A node tainted again is initialised
//! again, as upstream. Failures are retried as client-go's default controller rate limiter does (per node
//! 5 ms doubling to 1000 s, at most 10 a second with a burst of 100), with up to 10% jitter.
//!
//! Deliberate differences from upstream: no `Synced` Event per initialised node (10k identical Normal
//! events add nothing to what the removed taint already records), but Warning Events for the failures a
//! person must act on (`ProviderIDMissing`, `ProvidedNodeIPNotFound`); and the first address refresh comes
//! one period after the controller starts, not at once (a new leader would otherwise ask the cloud about
//! every node the moment it takes over).

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::api::{Api, Patch};
use kube::runtime::events::EventType;
use kube_ccm_provider::names::{ANNOTATION_PROVIDED_NODE_IP, LABEL_PAIRS, TAINT_UNINITIALIZED};
use kube_ccm_provider::{CloudError, InstanceMetadata, Priority, RequestRate};
use serde_json::json;

use super::age_seconds;
use super::backoff::Backoff;
use super::node_addresses::{Moment, NodeIpError, addresses_differ, desired_addresses};
use super::periodic::{self, Schedule};
use crate::batch::Batcher;
use crate::cached_node::CachedNode;
use crate::context::{ControllerContext, event_reference};
use crate::instances::instances_of;
use crate::runner::{self, Action};
use crate::written::{self, Written};

type MetadataBatcher = Batcher<Arc<Node>, Result<InstanceMetadata, CloudError>>;

/// Why a node could not be synced (all are retried).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeError {
    #[error("cloud provider error: {0}")]
    Cloud(#[source] CloudError),
    #[error("the cloud provider did not answer")]
    NoAnswer,
    #[error("cloud provider does not set node provider ID for node {0}")]
    NoProviderId(String),
    #[error("provided node ip for node {node:?} is not valid: {error}")]
    ProvidedIp { node: String, error: NodeIpError },
    #[error("writing the node failed: {0}")]
    Write(#[source] kube::Error),
}

struct NodeContext {
    controller: ControllerContext,
    api: Api<Written<Node>>,
    metadata: MetadataBatcher,
    /// Nodes this process initialised, by UID, with the resourceVersion of its untainting write: the cache
    /// may still show an older, tainted version, which must not be initialised again; a tainted version
    /// newer than that write was tainted again, and is. Entries go when the node is seen untainted or is
    /// deleted.
    initialized: Mutex<HashMap<String, u64>>,
    backoff: Backoff,
}

impl NodeContext {
    fn initialized(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        self.initialized.lock()
    }

    /// Whether `node` is the stale, tainted version of a node this process has just initialised.
    fn is_stale(&self, node: &CachedNode) -> bool {
        let written = self.initialized().get(node.uid()).copied();
        match (
            written,
            node.resource_version().and_then(|v| v.parse::<u64>().ok()),
        ) {
            (Some(written), Some(seen)) => seen < written,
            _ => false,
        }
    }
}

/// The budget priority of a look-up for `node`: initialising before the periodic refreshes.
fn priority_of(node: &Node) -> Priority {
    let uninitialised = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED));
    if uninitialised {
        Priority::Initialise
    } else {
        Priority::Refresh
    }
}

/// A batcher that asks the cloud for many nodes' metadata in one call and records its latency. A batch
/// waits for the cloud budget's turn before it is gathered, so under a tight budget batches grow rather
/// than queue.
fn metadata_batcher(controller: &ControllerContext) -> MetadataBatcher {
    let budget = controller.metrics.cloud.budget();
    let controller = controller.clone();
    // The gate waits as initialisation does, whatever the first node queued: a node to initialise may be
    // queued behind a refresh, and must not wait at the refresh's priority. The batch then takes its turn
    // at its own priority.
    let gate = move |_: &Arc<Node>| {
        let budget = budget.clone();
        async move {
            if let Some(budget) = budget {
                budget.ready(Priority::Initialise).await;
            }
        }
    };
    Batcher::spawn(500, 8, gate, move |nodes: Vec<Arc<Node>>| {
        let priority = nodes
            .iter()
            .map(|n| priority_of(n))
            .min()
            .unwrap_or(Priority::Refresh);
        let controller = controller.clone();
        async move { ask_metadata(&controller, nodes, priority).await }
    })
}

/// One `instance_metadata_batch` call about `nodes` at `priority`, under the call context's deadline and
/// observed as its request: one answer per node (each the error, when the framework abandoned the call).
async fn ask_metadata(
    controller: &ControllerContext,
    nodes: Vec<Arc<Node>>,
    priority: Priority,
) -> Vec<Result<InstanceMetadata, CloudError>> {
    let Some(instances) = instances_of(controller.provider.as_ref()) else {
        return nodes.iter().map(|_| Err(CloudError::NotImplemented)).collect();
    };
    let cx = controller.call_context_at(priority);
    let started = Instant::now();
    let answers = cx
        .guard(async { Ok(instances.instance_metadata_batch(&cx, &nodes).await) })
        .await
        .unwrap_or_else(|error| nodes.iter().map(|_| Err(error.clone())).collect());
    cx.observe(
        "instance_metadata_batch",
        started.elapsed(),
        crate::metrics::batch_outcome(&answers),
    );
    answers
}

pub(super) async fn run(controller: ControllerContext) {
    let informer = controller.nodes();
    tokio::select! {
        () = controller.stop.cancelled() => return,
        () = informer.ready() => {}
    }
    let context = Arc::new(NodeContext {
        api: Api::all(controller.client.clone()),
        metadata: metadata_batcher(&controller),
        controller: controller.clone(),
        initialized: Mutex::default(),
        backoff: Backoff::controller_default(),
    });
    let refresh = tokio::spawn(refresh_addresses(context.clone()));
    let report = tokio::spawn(report_uninitialized(controller.clone()));
    let forget = tokio::spawn(forget_deleted(context.clone()));
    controller.set_started();
    controller
        .runner(runner::by_key(informer.store()))
        .concurrency(controller.settings.concurrent_node_syncs)
        .watch(informer, |_| true)
        .run(&controller.stop, reconcile, error_policy, context)
        .await;
    refresh.abort();
    forget.abort();
    report.abort();
    // Only the running controller reports; alerts take the maximum over the replicas.
    controller.metrics.uninitialized_nodes.set(0);
    controller.metrics.oldest_uninitialized_node_age.set(0.0);
}

/// How often the uninitialised nodes are counted for the metrics (a walk of the node cache).
const UNINITIALIZED_REPORT_PERIOD: Duration = Duration::from_secs(10);

/// Keeps `node_controller_uninitialized_nodes` and `…_oldest_uninitialized_node_age_seconds` current, for
/// the alert on nodes stuck uninitialised.
async fn report_uninitialized(controller: ControllerContext) {
    let mut ticks = tokio::time::interval(UNINITIALIZED_REPORT_PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let store = controller.nodes().store();
    loop {
        ticks.tick().await;
        let (mut count, mut oldest) = (0_i64, 0.0_f64);
        for node in store.state().iter().filter(|n| n.has_taint(TAINT_UNINITIALIZED)) {
            count += 1;
            oldest = oldest.max(super::age_seconds(node.as_ref()).unwrap_or(0.0));
        }
        controller.metrics.uninitialized_nodes.set(count);
        controller.metrics.oldest_uninitialized_node_age.set(oldest);
    }
}

fn error_policy(node: Arc<CachedNode>, error: &NodeError, context: Arc<NodeContext>) -> Action {
    let after = match error {
        NodeError::Cloud(error) if error.retry_after().is_some() => error.retry_after().unwrap_or_default(),
        _ => context.backoff.failed(node.uid()),
    };
    Action::requeue(after)
}

/// Forgets what was kept about nodes that are gone.
async fn forget_deleted(context: Arc<NodeContext>) {
    let mut deletions = std::pin::pin!(context.controller.nodes().deletions());
    while let Some(node) = deletions.next().await {
        context.initialized().remove(node.uid());
        context.backoff.forget(node.uid());
    }
}

async fn reconcile(node: Arc<CachedNode>, context: Arc<NodeContext>) -> Result<Action, NodeError> {
    let span = context.controller.reconcile_span(node.name());
    tracing::Instrument::instrument(sync_node(node, context), span).await
}

async fn sync_node(node: Arc<CachedNode>, context: Arc<NodeContext>) -> Result<Action, NodeError> {
    let started = Instant::now();
    let result = if node.has_taint(TAINT_UNINITIALIZED) {
        if context.is_stale(&node) {
            return Ok(Action::await_change());
        }
        initialize(&node, &context).await
    } else {
        context.initialized().remove(node.uid());
        reconcile_labels(&node, &context).await
    };
    context
        .controller
        .record_reconcile(result.is_ok(), started.elapsed());
    match &result {
        Ok(_) => context.backoff.forget(node.uid()),
        Err(error) => tracing::warn!(node = node.name(), %error, "error syncing node; requeuing"),
    }
    result
}

/// The status write of a node's addresses: the list replaced, as upstream's (`$patch: replace`: the list's
/// merge key, the type, is not unique, a node may have several InternalIPs).
fn addresses_patch(addresses: &[NodeAddress]) -> Patch<serde_json::Value> {
    let mut list = vec![json!({"$patch": "replace"})];
    list.extend(addresses.iter().map(|address| json!(address)));
    Patch::Strategic(json!({"status": {"addresses": list}}))
}

/// The cloud's metadata for `node`: the only place the node controller builds a full `Node`.
async fn instance_metadata(node: &CachedNode, context: &NodeContext) -> Result<InstanceMetadata, NodeError> {
    context
        .metadata
        .call(Arc::new(node.to_node()))
        .await
        .ok_or(NodeError::NoAnswer)?
        .map_err(NodeError::Cloud)
}

async fn initialize(node: &CachedNode, context: &NodeContext) -> Result<Action, NodeError> {
    let controller = &context.controller;
    let name = node.name();
    let metadata = instance_metadata(node, context).await?;
    if metadata.provider_id.is_empty() && node.provider_id().is_none() {
        let note = format!(
            "Cloud provider {} does not set a provider ID for node {name}; the node stays tainted {TAINT_UNINITIALIZED}",
            controller.provider.provider_name()
        );
        controller
            .event(
                &event_reference(node),
                EventType::Warning,
                "ProviderIDMissing",
                "InitializeNode",
                note,
            )
            .await;
        return Err(NodeError::NoProviderId(name.to_owned()));
    }

    // Addresses first (the status subresource); its result's resourceVersion conditions the second write.
    let current_addresses = node.addresses();
    let provided_ip = node.annotation(ANNOTATION_PROVIDED_NODE_IP);
    let desired = match desired_addresses(
        &current_addresses,
        &metadata.node_addresses,
        provided_ip,
        Moment::Initialization,
    ) {
        Ok(desired) => desired,
        Err(error) => {
            controller
                .event(
                    &event_reference(node),
                    EventType::Warning,
                    "ProvidedNodeIPNotFound",
                    "InitializeNode",
                    error.to_string(),
                )
                .await;
            return Err(NodeError::ProvidedIp {
                node: name.to_owned(),
                error,
            });
        }
    };
    let mut resource_version = node.resource_version().map(str::to_owned);
    if let Some(desired) = desired.filter(|d| addresses_differ(&current_addresses, d)) {
        let written = written::patch_status(
            &context.api,
            name,
            &written::patch_params(),
            &addresses_patch(&desired),
        )
        .await
        .map_err(NodeError::Write)?;
        resource_version = written.metadata.resource_version;
    }

    // Then everything else, with the taint removed last, in one conditional write.
    let remaining: Vec<_> = node
        .taints()
        .iter()
        .filter(|t| t.key != TAINT_UNINITIALIZED)
        .collect();
    let mut spec = json!({"taints": remaining});
    if node.provider_id().is_none() {
        spec["providerID"] = json!(metadata.provider_id);
    }
    let patch = json!({
        "metadata": {"resourceVersion": resource_version, "labels": metadata.initial_labels(|key| node.label(key))},
        "spec": spec,
    });
    let written = context
        .api
        .patch(name, &written::patch_params(), &Patch::Strategic(patch))
        .await
        .map_err(NodeError::Write)?;
    if let Some(version) = written
        .metadata
        .resource_version
        .and_then(|v| v.parse::<u64>().ok())
    {
        context.initialized().insert(node.uid().to_owned(), version);
    }
    if let Some(age) = age_seconds(node) {
        controller.metrics.taint_removal_delay.observe(age);
        controller.metrics.initial_node_sync_delay.observe(age);
    }
    tracing::debug!(node = %name, "node initialized");
    Ok(Action::await_change())
}

/// Keeps label pairs in step on initialised nodes: a GA label missing or different is set from its beta twin.
async fn reconcile_labels(node: &CachedNode, context: &NodeContext) -> Result<Action, NodeError> {
    let mut set = BTreeMap::new();
    for (beta, ga) in LABEL_PAIRS {
        if let Some(primary) = node.label(beta)
            && node.label(ga) != Some(primary)
        {
            set.insert(ga.to_owned(), primary.to_owned());
        }
    }
    if !set.is_empty() {
        let patch = json!({"metadata": {"labels": set}});
        context
            .api
            .patch(node.name(), &written::patch_params(), &Patch::Merge(patch))
            .await
            .map_err(NodeError::Write)?;
    }
    Ok(Action::await_change())
}

/// The most nodes a refresh asks the cloud about in one call: a provider that batches natively makes one
/// request of it (or a few, at its API's limit per request), and no more than this many whole `Node`s are
/// built at once.
const REFRESH_BATCH: usize = 1_000;

/// Nodes per refresh call under a cloud budget of `rate` and calls of at most `timeout`: [`REFRESH_BATCH`],
/// or fewer when a provider making one request per node (the default batch forms) could not get through
/// the batch within half the timeout on the budget alone.
fn refresh_batch_size(rate: RequestRate, timeout: Duration) -> usize {
    if rate.per_second <= 0.0 {
        return REFRESH_BATCH;
    }
    let affordable = (rate.per_second * timeout.as_secs_f64() / 2.0).floor();
    // Clamped to 1..=REFRESH_BATCH before the cast.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let nodes = affordable.clamp(1.0, REFRESH_BATCH as f64) as usize;
    nodes
}

/// Every `--node-status-update-frequency`, refreshes the addresses of initialised nodes: one metadata
/// call per batch ([`refresh_batch_size`]), one batch after another, then a status write for each node
/// whose addresses differ, `--concurrent-node-status-updates` at a time.
async fn refresh_addresses(context: Arc<NodeContext>) {
    let controller = &context.controller;
    let settings = controller.settings();
    let workers = match settings.concurrent_node_status_updates {
        0 => settings.concurrent_node_syncs,
        n => n,
    };
    let batch = refresh_batch_size(
        settings.request_rate(controller.provider.default_request_rate()),
        settings.cloud_call_timeout,
    );
    let schedule = Schedule {
        period: settings.node_status_update_frequency,
        from_start: false,
        first_round_at_once: false,
        on_change: None,
        min_gap: Duration::ZERO,
    };
    periodic::run(controller.stop(), schedule, || {
        let nodes: Vec<Arc<CachedNode>> = controller
            .nodes()
            .store()
            .state()
            .into_iter()
            .filter(|n| !n.has_taint(TAINT_UNINITIALIZED))
            .collect();
        let context = context.clone();
        async move {
            for chunk in nodes.chunks(batch) {
                if context.controller.stop().is_cancelled() {
                    break;
                }
                refresh_batch(chunk, &context, usize::from(workers.max(1))).await;
            }
        }
    })
    .await;
}

/// Refreshes the addresses of `batch` from one metadata call.
async fn refresh_batch(batch: &[Arc<CachedNode>], context: &NodeContext, workers: usize) {
    let answers = {
        let _working = context.controller.working();
        let nodes: Vec<Arc<Node>> = batch.iter().map(|n| Arc::new(n.to_node())).collect();
        ask_metadata(&context.controller, nodes, Priority::Refresh).await
    };
    // A call that failed as a whole (every answer the same kind of error) is said once, not per node.
    let failed_call = answers.iter().all(|answer| {
        matches!(answer, Err(error) if !matches!(error, CloudError::InstanceNotFound | CloudError::NotImplemented))
    });
    if failed_call {
        if let Some(Err(error)) = answers.first()
            && !matches!(error, CloudError::Cancelled)
        {
            tracing::warn!(nodes = batch.len(), %error, "cannot refresh node addresses");
        }
        return;
    }
    futures::stream::iter(batch.iter().zip(answers))
        .for_each_concurrent(workers, |(node, answer)| async move {
            let _working = context.controller.working();
            match refresh_one(node, answer, context).await {
                Ok(()) | Err(NodeError::Cloud(CloudError::Cancelled)) => {}
                Err(error) => tracing::warn!(node = node.name(), %error, "cannot refresh node addresses"),
            }
        })
        .await;
}

async fn refresh_one(
    node: &CachedNode,
    metadata: Result<InstanceMetadata, CloudError>,
    context: &NodeContext,
) -> Result<(), NodeError> {
    let metadata = match metadata {
        Ok(metadata) => metadata,
        // A node whose instance is gone is the lifecycle controller's business.
        Err(CloudError::InstanceNotFound | CloudError::NotImplemented) => return Ok(()),
        Err(error) => return Err(NodeError::Cloud(error)),
    };
    let current = node.addresses();
    let provided_ip = node.annotation(ANNOTATION_PROVIDED_NODE_IP);
    let desired = desired_addresses(&current, &metadata.node_addresses, provided_ip, Moment::Refresh)
        .map_err(|error| NodeError::ProvidedIp {
            node: node.name().to_owned(),
            error,
        })?;
    if let Some(desired) = desired.filter(|d| addresses_differ(&current, d)) {
        written::patch_status(
            &context.api,
            node.name(),
            &written::patch_params(),
            &addresses_patch(&desired),
        )
        .await
        .map_err(NodeError::Write)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_batch_fits_half_a_call_timeout_of_the_budget() {
        let rate = |per_second| RequestRate { per_second, burst: 1 };
        let minute = Duration::from_secs(60);
        assert_eq!(refresh_batch_size(rate(0.0), minute), REFRESH_BATCH, "no budget");
        assert_eq!(refresh_batch_size(rate(100.0), minute), REFRESH_BATCH);
        assert_eq!(refresh_batch_size(rate(10.0), minute), 300);
        assert_eq!(refresh_batch_size(rate(0.01), minute), 1);
    }
    use kube_ccm_provider::names::{
        LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_ZONE, LABEL_ZONE_BETA,
    };

    fn node(labels: serde_json::Value) -> CachedNode {
        serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels}})).unwrap()
    }

    #[test]
    fn initial_labels_come_in_pairs_and_skip_reserved_and_existing_ones() {
        let metadata = InstanceMetadata {
            instance_type: "m5.large".into(),
            zone: "z1".into(),
            region: String::new(),
            additional_labels: [
                ("team".to_owned(), "cloud".to_owned()),
                (
                    "node.kubernetes.io/exclude-from-external-load-balancers".to_owned(),
                    "true".to_owned(),
                ),
                ("sub.k8s.io/x".to_owned(), "y".to_owned()),
                ("kept".to_owned(), "cloud".to_owned()),
            ]
            .into(),
            ..InstanceMetadata::default()
        };
        let node = node(json!({"kept": "mine"}));
        let set = metadata.initial_labels(|key| node.label(key));
        let keys: Vec<&str> = set.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                LABEL_INSTANCE_TYPE_BETA,
                LABEL_ZONE_BETA,
                LABEL_INSTANCE_TYPE,
                "team",
                LABEL_ZONE
            ],
        );
    }
}
