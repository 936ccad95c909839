//! Upstream's `CloudAllocator` (`--cidr-allocator-type=CloudAllocator`): each node's pod CIDRs are the
//! ranges the cloud assigned its instance, as the provider's [`PodCidrs`] answers (GCE: the alias IP
//! range, as the GCP cloud-controller-manager's `cloudCIDRAllocator` sets it).
//!
//! Per node, as upstream:
//! - The node needs a provider ID (`node … doesn't have providerID`, retried; the cloud-node controller
//!   sets it).
//! - The provider's pod CIDRs for the cluster's [`ClusterStack`] (from `--service-cluster-ip-range`). An
//!   instance that is gone, or has no range at all, gets the Event `CIDRNotAvailable` and is retried; one
//!   lacking a family the stack needs is retried without an Event. An answer that is not one CIDR per
//!   family of the stack, in its order, is refused as no range.
//! - `spec.podCIDR`/`spec.podCIDRs` are patched when they differ (a node whose CIDRs are set already and
//!   differ is logged as being reassigned and patched anyway, as upstream; the API server refuses that
//!   write, and the node gets `CIDRAssignmentFailed`).
//! - `NetworkUnavailable` is set `False`, reason `RouteCreated` (pods routed by the cloud's ranges need no
//!   route), when it is not already.
//!
//! Work is queued for a node with no pod CIDR, or whose `NetworkUnavailable` is not `False`, or that
//! carries the `node.kubernetes.io/network-unavailable` taint, as upstream's update handler does.
//! Failures are retried per node from 250 ms doubling to 5 minutes. The states between the controller's
//! own two writes (pod CIDRs, then the condition) are recognised by their resource versions and not
//! worked on again, so a node costs one look-up.
//!
//! Differs from upstream on purpose: upstream also queues every node when its informer starts; here the
//! same filter applies then too, so a new leader does not ask the cloud about every node allocated
//! already.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch};
use kube_ccm_provider::{Cidr, CloudError, CloudProvider, ClusterStack, PodCidrsError};
use serde_json::json;

use super::{NODE_IPAM_CONTROLLER, WORKERS, status_change};
use crate::cached_node::CachedNode;
use crate::context::ControllerContext;
use crate::controllers::Backoff;
use crate::runner::{self, Action};
use crate::written::Written;

/// The taint a node carries while its network is not ready.
pub(crate) const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// Whether `node` has work for the allocator: no pod CIDR, or a network not marked available.
pub(crate) fn needs_allocation(node: &CachedNode) -> bool {
    if node.deleting() {
        return false;
    }
    node.pod_cidrs().next().is_none()
        || node.condition("NetworkUnavailable").map(|(status, _)| status) != Some("False")
        || node.has_taint(TAINT_NETWORK_UNAVAILABLE)
}

/// Why a node was not allocated (all are retried).
#[derive(Debug, thiserror::Error)]
enum IpamError {
    #[error("node {0} doesn't have providerID")]
    NoProviderId(String),
    #[error("failed to get instance from provider: {0}")]
    Cloud(#[source] CloudError),
    #[error("failed to get instance from provider: instance {0} not found")]
    NoInstance(String),
    #[error("failed to allocate cidr: Node {node} {why}")]
    Ranges { node: String, why: String, quiet: bool },
    #[error("failed to update the node's pod CIDRs: {0}")]
    Spec(#[source] kube::Error),
    #[error("failed to set the NetworkUnavailable condition: {0}")]
    Condition(#[source] kube::Error),
}

struct Ipam {
    controller: ControllerContext,
    provider: Arc<dyn CloudProvider>,
    api: Api<Written<Node>>,
    backoff: Backoff,
    stack: ClusterStack,
    /// Per node (uid), the resource versions its last successful allocation wrote.
    written: parking_lot::Mutex<HashMap<String, Vec<String>>>,
}

pub(super) async fn run(controller: ControllerContext) {
    let provider = controller.provider().clone();
    if provider.pod_cidrs().is_none() {
        // The registry skips the controller then (`requires_when`); a library caller may not have.
        tracing::error!(
            controller = NODE_IPAM_CONTROLLER,
            "the cloud provider offers no pod CIDRs; the controller does nothing"
        );
        return;
    }
    let stack = match ClusterStack::of_service_ranges(
        controller.settings().flags.text("service-cluster-ip-range"),
    ) {
        Ok(stack) => stack,
        Err(error) => {
            tracing::error!(controller = NODE_IPAM_CONTROLLER, %error, "--service-cluster-ip-range; the controller does nothing");
            return;
        }
    };
    tracing::info!(controller = NODE_IPAM_CONTROLLER, %stack, "allocating pod CIDRs from the cloud's ranges");
    let informer = controller.nodes();
    tokio::select! {
        () = controller.stop().cancelled() => return,
        () = informer.ready() => {}
    }
    let context = Arc::new(Ipam {
        stack,
        written: parking_lot::Mutex::default(),
        api: Api::all(controller.client().clone()),
        backoff: Backoff::per_key(Duration::from_millis(250), Duration::from_secs(300)),
        provider,
        controller: controller.clone(),
    });
    let forget = tokio::spawn(forget_deleted(context.clone()));
    controller.set_started();
    controller
        .runner(runner::by_key(informer.store()))
        .concurrency(WORKERS)
        .watch(informer, needs_allocation)
        .run(controller.stop(), reconcile, error_policy, context)
        .await;
    forget.abort();
}

async fn reconcile(node: Arc<CachedNode>, context: Arc<Ipam>) -> Result<Action, IpamError> {
    let uid = node.uid();
    if !needs_allocation(&node) {
        context.backoff.forget(uid);
        context.written.lock().remove(uid);
        return Ok(Action::await_change());
    }
    // A state between this controller's own writes (the pod CIDRs set, the condition not yet seen): the
    // rest is on its way, and the provider need not be asked again.
    if let Some(version) = node.resource_version()
        && context
            .written
            .lock()
            .get(uid)
            .is_some_and(|ours| ours.iter().any(|v| v == version))
    {
        return Ok(Action::await_change());
    }
    let controller = &context.controller;
    let started = Instant::now();
    let outcome = allocate(&context, &node).await;
    controller.record_reconcile(outcome.is_ok(), started.elapsed());
    let mut written = context.written.lock();
    match outcome {
        Ok(versions) => {
            context.backoff.forget(uid);
            written.insert(uid.to_owned(), versions);
            Ok(Action::await_change())
        }
        Err(error) => {
            written.remove(uid);
            Err(error)
        }
    }
}

/// Allocates `node`; the resource versions of the node its writes made, in order.
async fn allocate(context: &Ipam, node: &CachedNode) -> Result<Vec<String>, IpamError> {
    let mut written = Vec::new();
    let controller = &context.controller;
    let name = node.name();
    let provider_id = node
        .provider_id()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| IpamError::NoProviderId(name.to_owned()))?;
    let cidrs = match pod_cidrs(context, name, provider_id).await {
        Ok(cidrs) => cidrs,
        Err(error) => {
            // As upstream, a node whose instance lacks a family the stack needs gets no Event.
            let quiet = matches!(
                &error,
                IpamError::Cloud(CloudError::Cancelled) | IpamError::Ranges { quiet: true, .. }
            );
            if !quiet {
                status_change(controller, node, "CIDRNotAvailable").await;
            }
            return Err(error);
        }
    };
    let current: Vec<&str> = node.pod_cidrs().collect();
    if !same_cidrs(&current, &cidrs) {
        let texts: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        if !current.is_empty() {
            tracing::error!(node = name, ?current, proposed = ?texts, "PodCIDR being reassigned");
        }
        let patch = json!({"spec": {"podCIDR": texts[0], "podCIDRs": texts}});
        match context
            .api
            .patch(name, &crate::written::patch_params(), &Patch::Merge(patch))
            .await
        {
            Ok(patched) => written.extend(patched.metadata.resource_version),
            Err(error) => {
                status_change(controller, node, "CIDRAssignmentFailed").await;
                return Err(IpamError::Spec(error));
            }
        }
        tracing::info!(node = name, cidrs = ?texts, "set the node's pod CIDRs");
    }
    let version = set_network_available(&context.api, node)
        .await
        .map_err(IpamError::Condition)?;
    written.extend(version);
    Ok(written)
}

/// The provider's pod CIDRs for the node's instance: one per family of the stack, in its order (any
/// other answer is refused as no range, before anything is written).
async fn pod_cidrs(context: &Ipam, node: &str, provider_id: &str) -> Result<Vec<Cidr>, IpamError> {
    let Some(cloud) = context.provider.pod_cidrs() else {
        return Err(IpamError::Cloud(CloudError::NotImplemented));
    };
    let cx = context.controller.call_context();
    let ranges = |why: String, quiet: bool| IpamError::Ranges {
        node: node.to_owned(),
        why,
        quiet,
    };
    match cloud.pod_cidrs(&cx, provider_id, context.stack).await {
        Ok(cidrs) => checked(context.stack, node, cidrs),
        Err(PodCidrsError::InstanceNotFound(_)) => Err(IpamError::NoInstance(provider_id.to_owned())),
        Err(PodCidrsError::NoRanges(why)) => Err(ranges(why, false)),
        Err(error @ PodCidrsError::MissingFamily(_)) => Err(ranges(error.to_string(), true)),
        Err(PodCidrsError::Cloud(error)) => Err(IpamError::Cloud(error)),
        Err(other) => Err(ranges(other.to_string(), false)),
    }
}

/// The provider's answer when it is one CIDR per family of the stack, in its order; otherwise no range.
fn checked(stack: ClusterStack, node: &str, cidrs: Vec<Cidr>) -> Result<Vec<Cidr>, IpamError> {
    if stack.fits(&cidrs) {
        return Ok(cidrs);
    }
    let texts: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
    Err(IpamError::Ranges {
        node: node.to_owned(),
        why: format!("has ranges {texts:?} that are not the {stack} families of the cluster stack"),
        quiet: false,
    })
}

/// Whether the node's CIDRs are `proposed`, as networks (`10.4.1.7/24` is `10.4.1.0/24`).
fn same_cidrs(current: &[&str], proposed: &[Cidr]) -> bool {
    current.len() == proposed.len()
        && current
            .iter()
            .zip(proposed)
            .all(|(a, b)| match a.parse::<Cidr>() {
                Ok(a) => a.contains(b) && b.contains(&a),
                Err(_) => false,
            })
        && !current.is_empty()
}

/// Sets `NetworkUnavailable` to `False`/`RouteCreated` unless it is already; a new condition (or one
/// whose status changes) gets a transition time, an unchanged status keeps its own.
/// The node's resource version after the write, if one was made.
async fn set_network_available(
    api: &Api<Written<Node>>,
    node: &CachedNode,
) -> Result<Option<String>, kube::Error> {
    const MESSAGE: &str = "NodeController create implicit route";
    let current = node.condition("NetworkUnavailable");
    if current == Some(("False", Some("RouteCreated"))) {
        return Ok(None);
    }
    let mut condition: BTreeMap<&str, String> = [
        ("type", "NetworkUnavailable".to_owned()),
        ("status", "False".to_owned()),
        ("reason", "RouteCreated".to_owned()),
        ("message", MESSAGE.to_owned()),
    ]
    .into();
    if current.map(|(status, _)| status) != Some("False") {
        let now = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        condition.insert("lastTransitionTime", now);
    }
    let patch = json!({"status": {"conditions": [condition]}});
    crate::written::patch_status(
        api,
        node.name(),
        &crate::written::patch_params(),
        &Patch::Strategic(patch),
    )
    .await
    .map(|patched| patched.metadata.resource_version)
}

fn error_policy(node: Arc<CachedNode>, error: &IpamError, context: Arc<Ipam>) -> Action {
    let after = match error {
        IpamError::Cloud(CloudError::Retry { after, .. } | CloudError::Throttled { after, .. }) => *after,
        _ => context.backoff.failed(node.uid()),
    };
    tracing::warn!(node = node.name(), %error, retry_in = ?after, "node-ipam: cannot allocate");
    Action::requeue(after)
}

async fn forget_deleted(context: Arc<Ipam>) {
    let mut deletions = std::pin::pin!(context.controller.nodes().deletions());
    while let Some(node) = deletions.next().await {
        context.backoff.forget(node.uid());
        context.written.lock().remove(node.uid());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_for_nodes_without_a_pod_cidr_or_an_available_network() {
        let node = |spec: serde_json::Value, conditions: serde_json::Value| -> CachedNode {
            serde_json::from_value(json!({
                "metadata": {"name": "n"}, "spec": spec, "status": {"conditions": conditions}
            }))
            .unwrap()
        };
        let available = json!([{"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]);
        let allocated = json!({"podCIDR": "10.4.1.0/24", "podCIDRs": ["10.4.1.0/24"]});
        assert!(!needs_allocation(&node(allocated.clone(), available.clone())));
        assert!(needs_allocation(&node(json!({}), available.clone())));
        assert!(needs_allocation(&node(allocated.clone(), json!([]))));
        assert!(needs_allocation(&node(
            allocated.clone(),
            json!([{"type": "NetworkUnavailable", "status": "True"}])
        )));
        let mut tainted = allocated;
        tainted["taints"] = json!([{"key": TAINT_NETWORK_UNAVAILABLE, "effect": "NoSchedule"}]);
        assert!(needs_allocation(&node(tainted, available)));
    }

    #[test]
    fn an_answer_is_taken_only_as_one_cidr_per_family_of_the_stack_in_its_order() {
        let cidr = |text: &str| text.parse::<Cidr>().unwrap();
        let (v4, v6) = (cidr("10.4.1.0/24"), cidr("fd00:1::/112"));
        let dual = ClusterStack::Ipv4Ipv6;
        assert_eq!(checked(dual, "n", vec![v4, v6]).unwrap(), [v4, v6]);
        for wrong in [vec![], vec![v6, v4], vec![v4], vec![v4, v4, v6]] {
            let error = checked(dual, "n", wrong.clone()).unwrap_err();
            assert!(
                matches!(&error, IpamError::Ranges { quiet: false, .. }),
                "{wrong:?}: {error}"
            );
            assert!(
                error
                    .to_string()
                    .starts_with("failed to allocate cidr: Node n has ranges")
            );
        }
    }

    #[test]
    fn cidrs_compare_as_networks() {
        let cidr = |text: &str| text.parse::<Cidr>().unwrap();
        assert!(same_cidrs(&["10.4.1.0/24"], &[cidr("10.4.1.0/24")]));
        assert!(same_cidrs(&["10.4.1.7/24"], &[cidr("10.4.1.0/24")]));
        assert!(!same_cidrs(&[], &[cidr("10.4.1.0/24")]));
        assert!(!same_cidrs(&["10.4.1.0/24"], &[cidr("10.4.2.0/24")]));
        assert!(!same_cidrs(
            &["10.4.1.0/24"],
            &[cidr("10.4.1.0/24"), cidr("fd00::/112")]
        ));
        assert!(!same_cidrs(&["garbage"], &[cidr("10.4.1.0/24")]));
    }
}
