//! `cloud-node-controller`: initialises nodes from the cloud and keeps them current.
//!
//! A node carrying the uninitialized taint gets, from one (batched) metadata look-up: its addresses (one
//! status write, honouring `alpha.kubernetes.io/provided-node-ip`), then in one more write its provider ID
//! (if empty), the instance-type, zone and region labels in pairs, the provider's additional labels
//! (filtered as upstream), and the removal of the taint, last. That write is conditional on the node's
//! resourceVersion, so a taint added meanwhile is never lost. Two writes per node, no more.
//!
//! Initialised nodes get their label pairs reconciled (the beta label wins, as upstream), and every
//! `--node-status-update-frequency` their addresses are refreshed.
//!
//! Upstream also emits a `Synced` Event per initialised node; here only failures get Events (10k
//! identical Normal events add nothing to what the removed taint already records).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloud_provider::names::{
    ANNOTATION_PROVIDED_NODE_IP, LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_PAIRS, LABEL_REGION,
    LABEL_REGION_BETA, LABEL_ZONE, LABEL_ZONE_BETA, TAINT_UNINITIALIZED,
};
use cloud_provider::{CloudError, InstanceMetadata};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use serde_json::json;

use super::node_addresses::{addresses_differ, desired_addresses};
use super::{ControllerContext, age_seconds, has_taint, pause, reference, taints};
use crate::batch::Batcher;
use crate::cached_node::CachedNode;

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
    #[error(transparent)]
    ProvidedIp(#[from] super::node_addresses::ProvidedIpNotFound),
    #[error("writing the node failed: {0}")]
    Write(#[source] kube::Error),
}

struct NodeContext {
    controller: ControllerContext,
    api: Api<Node>,
    metadata: MetadataBatcher,
    /// UIDs of nodes this process initialised whose untainted version the cache has not shown yet: our own
    /// first write triggers a reconcile that may still see the taint, and must not write again.
    initialized: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl NodeContext {
    fn initialized(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.initialized
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A batcher that asks the cloud for many nodes' metadata in one call and records its latency.
fn metadata_batcher(controller: &ControllerContext) -> MetadataBatcher {
    let provider = controller.provider.clone();
    let metrics = controller.metrics.clone();
    Batcher::spawn(500, 8, move |nodes: Vec<Arc<Node>>| {
        let provider = provider.clone();
        let metrics = metrics.clone();
        async move {
            let Some(instances) = provider.instances_v2() else {
                return nodes.iter().map(|_| Err(CloudError::NotImplemented)).collect();
            };
            let started = Instant::now();
            let answers = instances.instance_metadata_batch(&nodes).await;
            let ok = answers.iter().all(|a| !matches!(a, Err(CloudError::Provider(_))));
            metrics.cloud_call("instance_metadata_batch", ok, started.elapsed().as_secs_f64());
            answers
        }
    })
}

pub(super) async fn run(controller: ControllerContext) {
    let informer = controller.informers.nodes();
    tokio::select! {
        () = controller.stop.cancelled() => return,
        () = informer.ready() => {}
    }
    let context = Arc::new(NodeContext {
        api: Api::all(controller.client.clone()),
        metadata: metadata_batcher(&controller),
        controller: controller.clone(),
        initialized: std::sync::Mutex::default(),
    });
    let refresh = tokio::spawn(refresh_addresses(context.clone()));
    controller.started.send_replace(true);
    let stop = controller.stop.clone();
    Controller::for_shared_stream(informer.subscribe(), informer.store())
        .with_config(Config::default().concurrency(controller.settings.concurrent_node_syncs))
        .reconcile_all_on(futures::stream::once(async {}))
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, context)
        .for_each(|_| async {})
        .await;
    refresh.abort();
}

fn error_policy(_node: Arc<CachedNode>, error: &NodeError, _context: Arc<NodeContext>) -> Action {
    match error {
        NodeError::Cloud(CloudError::Retry { after, .. }) => Action::requeue(*after),
        NodeError::NoProviderId(_) | NodeError::ProvidedIp(_) => Action::requeue(Duration::from_secs(30)),
        _ => Action::requeue(Duration::from_secs(5)),
    }
}

async fn reconcile(cached: Arc<CachedNode>, context: Arc<NodeContext>) -> Result<Action, NodeError> {
    let started = Instant::now();
    let node = Arc::new(cached.to_node());
    let uid = node.metadata.uid.clone().unwrap_or_default();
    let result = if has_taint(&node, TAINT_UNINITIALIZED) {
        if context.initialized().contains(&uid) {
            return Ok(Action::await_change());
        }
        initialize(&node, &context).await
    } else {
        context.initialized().remove(&uid);
        reconcile_labels(&node, &context).await
    };
    let metrics = &context.controller.metrics;
    metrics.reconciled(
        context.controller.controller.as_str(),
        result.is_ok(),
        started.elapsed().as_secs_f64(),
    );
    if let Err(error) = &result {
        tracing::warn!(node = node.metadata.name.as_deref().unwrap_or_default(), %error, "cannot sync node");
    }
    result
}

fn labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

/// Upstream's rule for additional labels: nothing under kubernetes.io or k8s.io.
fn reserved(key: &str) -> bool {
    let domain = key.split_once('/').map_or("", |(prefix, _)| prefix);
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|reserved| domain == *reserved || domain.ends_with(&format!(".{reserved}")))
}

/// The labels initialisation sets (in pairs), without overwriting what the node already has for additional ones.
fn initial_labels(node: &Node, metadata: &InstanceMetadata) -> BTreeMap<String, String> {
    let existing = labels(node);
    let mut set = BTreeMap::new();
    for (value, keys) in [
        (
            &metadata.instance_type,
            [LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE],
        ),
        (&metadata.zone, [LABEL_ZONE_BETA, LABEL_ZONE]),
        (&metadata.region, [LABEL_REGION_BETA, LABEL_REGION]),
    ] {
        if !value.is_empty() {
            for key in keys {
                if existing.get(key) != Some(value) {
                    set.insert(key.to_owned(), value.clone());
                }
            }
        }
    }
    for (key, value) in &metadata.additional_labels {
        if !reserved(key) && !existing.contains_key(key) {
            set.insert(key.clone(), value.clone());
        }
    }
    set
}

async fn initialize(node: &Arc<Node>, context: &NodeContext) -> Result<Action, NodeError> {
    let controller = &context.controller;
    let name = node.metadata.name.clone().unwrap_or_default();
    let metadata = match context
        .metadata
        .call(node.clone())
        .await
        .ok_or(NodeError::NoAnswer)?
    {
        Ok(metadata) => metadata,
        Err(error) => return Err(NodeError::Cloud(error)),
    };
    let current_provider_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .filter(|p| !p.is_empty());
    if metadata.provider_id.is_empty() && current_provider_id.is_none() {
        let note = format!(
            "Cloud provider {} does not set a provider ID for node {name}; the node stays tainted {TAINT_UNINITIALIZED}",
            controller.provider.provider_name()
        );
        controller
            .event(
                &reference(node.as_ref()),
                true,
                "ProviderIDMissing",
                "InitializeNode",
                note,
            )
            .await;
        return Err(NodeError::NoProviderId(name));
    }

    // Addresses first (the status subresource); its result's resourceVersion conditions the second write.
    let (current_addresses, provided_ip) = addresses_and_provided_ip(node);
    let desired = match desired_addresses(&current_addresses, &metadata.node_addresses, provided_ip) {
        Ok(desired) => desired,
        Err(error) => {
            controller
                .event(
                    &reference(node.as_ref()),
                    true,
                    "ProvidedNodeIPNotFound",
                    "InitializeNode",
                    error.to_string(),
                )
                .await;
            return Err(error.into());
        }
    };
    let mut resource_version = node.metadata.resource_version.clone();
    if let Some(desired) = desired.filter(|d| addresses_differ(&current_addresses, d)) {
        let patch = json!({"status": {"addresses": desired}});
        let written = context
            .api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(NodeError::Write)?;
        resource_version = written.metadata.resource_version;
    }

    // Then everything else, with the taint removed last, in one conditional write.
    let remaining: Vec<_> = taints(node)
        .into_iter()
        .filter(|t| t.key != TAINT_UNINITIALIZED)
        .collect();
    let mut spec = json!({"taints": remaining});
    if current_provider_id.is_none() {
        spec["providerID"] = json!(metadata.provider_id);
    }
    let patch = json!({
        "metadata": {"resourceVersion": resource_version, "labels": initial_labels(node, &metadata)},
        "spec": spec,
    });
    context
        .api
        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(NodeError::Write)?;
    context
        .initialized()
        .insert(node.metadata.uid.clone().unwrap_or_default());
    if let Some(age) = age_seconds(node.as_ref()) {
        controller.metrics.taint_removal_delay.observe(age);
        controller.metrics.initial_node_sync_delay.observe(age);
    }
    tracing::debug!(node = %name, "node initialized");
    Ok(Action::await_change())
}

/// Keeps label pairs in step on initialised nodes: a GA label missing or different is set from its beta twin.
async fn reconcile_labels(node: &Arc<Node>, context: &NodeContext) -> Result<Action, NodeError> {
    let existing = labels(node);
    let mut set = BTreeMap::new();
    for (beta, ga) in LABEL_PAIRS {
        if let Some(primary) = existing.get(beta)
            && existing.get(ga) != Some(primary)
        {
            set.insert(ga.to_owned(), primary.clone());
        }
    }
    if !set.is_empty() {
        let name = node.metadata.name.clone().unwrap_or_default();
        let patch = json!({"metadata": {"labels": set}});
        context
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(NodeError::Write)?;
    }
    Ok(Action::await_change())
}

/// Every `--node-status-update-frequency`, refreshes the addresses of initialised nodes.
async fn refresh_addresses(context: Arc<NodeContext>) {
    let controller = &context.controller;
    let period = controller.settings.node_status_update_frequency;
    let workers = match controller.settings.concurrent_node_status_updates {
        0 => controller.settings.concurrent_node_syncs,
        n => n,
    };
    while pause(&controller.stop, period).await {
        let nodes: Vec<Arc<CachedNode>> = controller
            .informers
            .nodes()
            .store()
            .state()
            .into_iter()
            .filter(|n| !n.has_taint(TAINT_UNINITIALIZED))
            .collect();
        futures::stream::iter(nodes)
            .for_each_concurrent(usize::from(workers.max(1)), |cached| {
                let context = context.clone();
                async move {
                    let node = Arc::new(cached.to_node());
                    if let Err(error) = refresh_one(&node, &context).await {
                        tracing::warn!(node = node.metadata.name.as_deref().unwrap_or_default(), %error, "cannot refresh node addresses");
                    }
                }
            })
            .await;
    }
}

async fn refresh_one(node: &Arc<Node>, context: &NodeContext) -> Result<(), NodeError> {
    let metadata = match context
        .metadata
        .call(node.clone())
        .await
        .ok_or(NodeError::NoAnswer)?
    {
        Ok(metadata) => metadata,
        // A node whose instance is gone is the lifecycle controller's business.
        Err(CloudError::InstanceNotFound | CloudError::NotImplemented) => return Ok(()),
        Err(error) => return Err(NodeError::Cloud(error)),
    };
    let (current, provided_ip) = addresses_and_provided_ip(node);
    if let Some(desired) = desired_addresses(&current, &metadata.node_addresses, provided_ip)?
        .filter(|d| addresses_differ(&current, d))
    {
        let name = node.metadata.name.clone().unwrap_or_default();
        let patch = json!({"status": {"addresses": desired}});
        context
            .api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(NodeError::Write)?;
    }
    Ok(())
}

/// The node's current addresses, and the IP its kubelet was told to use (`alpha.kubernetes.io/provided-node-ip`).
fn addresses_and_provided_ip(node: &Node) -> (Vec<NodeAddress>, Option<&str>) {
    let current = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default();
    let provided_ip = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PROVIDED_NODE_IP))
        .map(String::as_str);
    (current, provided_ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: serde_json::Value) -> Node {
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
        let set = initial_labels(&node(json!({"kept": "mine"})), &metadata);
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

    #[test]
    fn reserved_domains() {
        assert!(reserved("kubernetes.io/hostname"));
        assert!(reserved("node.kubernetes.io/x"));
        assert!(reserved("k8s.io/x"));
        assert!(!reserved("example.com/kubernetes.io"));
        assert!(!reserved("plain"));
        assert!(!reserved("mykubernetes.io/x"));
    }
}
