//! `node-ipam-controller` with upstream's `CloudAllocator`: each node's pod CIDRs are its instance's alias
//! IP range, as the GCP cloud-controller-manager's `cloudCIDRAllocator` sets them.
//!
//! A provider's own controller, registered through the framework's controller registry
//! ([`definition`]): it runs only with `--cloud-provider=gce`, `--allocate-node-cidrs` and
//! `--cidr-allocator-type=CloudAllocator`, and only when named (`--controllers=*,node-ipam-controller`,
//! or its alias `nodeipam`).
//!
//! Per node, as upstream:
//! - The node needs a provider ID (`node … doesn't have providerID`, retried; the cloud-node controller
//!   sets it).
//! - Its instance's pod ranges ([`pod_cidrs`]): the first alias IP range of the interface `nic0` (else the
//!   first interface), then, when that interface has an IPv6 address, that address as a `/112`.
//!   An instance that is gone, or has no range, gets the Event `CIDRNotAvailable` and is retried.
//! - `spec.podCIDR`/`spec.podCIDRs` are patched when they differ (a node whose CIDRs are set already and
//!   differ is logged as being reassigned and patched anyway, as upstream; the API server refuses that
//!   write, and the node gets `CIDRAssignmentFailed`).
//! - `NetworkUnavailable` is set `False`, reason `RouteCreated` (pods routed by alias ranges need no
//!   route), when it is not already.
//!
//! Work is queued for a node with no pod CIDR, or whose `NetworkUnavailable` is not `False`, or that
//! carries the `node.kubernetes.io/network-unavailable` taint, as upstream's update handler does.
//! Failures are retried per node from 250 ms doubling to 5 minutes. Events report as `cidrAllocator`.
//!
//! Deliberate differences from upstream:
//! - Upstream also queues every node when its informer starts; here the same filter applies then too,
//!   so a new leader does not ask Compute about every node already allocated.
//! - Upstream stops retrying a node after 10 failures until the node changes; here the retries go on,
//!   at most every 5 minutes.
//! - When `--allocate-node-cidrs` is false or the allocator type is another, upstream's manager exits
//!   (`the AllocateNodeCIDRs is not enabled`); here the controller is skipped with that reason in the log
//!   and `/readyz?verbose`, and the other controllers run.
//! - GKE's multi-networking (`Network` objects, several interfaces' ranges) is not implemented: only the
//!   pod range above.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloud_provider::CloudError;
use controller_manager::{
    Backoff, CachedNode, Cidr, ControllerContext, ControllerDefinition, ControllerSettings, event_reference,
};
use futures::StreamExt;
use google_cloud_compute_v1::model::Instance;
use google_cloud_compute_v1::model::network_interface::Ipv6AccessType;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::EventType;
use serde_json::json;

use crate::{GceProvider, PROVIDER_NAME};

/// The controller's name, as upstream's.
pub const NODE_IPAM_CONTROLLER: &str = "node-ipam-controller";
/// `--cidr-allocator-type` for this allocator.
pub const CLOUD_ALLOCATOR: &str = "CloudAllocator";
/// The taint a node carries while its network is not ready.
pub const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";
/// Syncs at once (upstream's `cidrUpdateWorkers`).
const WORKERS: u16 = 30;
/// The prefix of the IPv6 pod range carved from the interface's address (upstream's).
const IPV6_POD_PREFIX: u8 = 112;

/// The controller, for a binary's registry: `node-ipam-controller` (alias `nodeipam`), gce only, off
/// unless named, and skipped unless the settings ask for the cloud allocator.
pub fn definition() -> ControllerDefinition {
    ControllerDefinition::new(NODE_IPAM_CONTROLLER, run)
        .aliases(&["nodeipam"])
        .for_provider(PROVIDER_NAME)
        .disabled_by_default()
        .requires_settings(cloud_allocator_configured)
        .event_reporter("cidrAllocator")
}

/// `--allocate-node-cidrs` and `--cidr-allocator-type=CloudAllocator`.
pub fn cloud_allocator_configured(settings: &ControllerSettings) -> Result<(), String> {
    if !settings.allocate_node_cidrs {
        Err("--allocate-node-cidrs is false (upstream: the AllocateNodeCIDRs is not enabled)".to_owned())
    } else if settings.cidr_allocator_type != CLOUD_ALLOCATOR {
        Err(format!(
            "--cidr-allocator-type is {:?}; this controller implements {CLOUD_ALLOCATOR} only",
            settings.cidr_allocator_type
        ))
    } else {
        Ok(())
    }
}

/// Why an instance gives no pod CIDRs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// No interface, or no alias range on the pod interface.
    #[error("has no ranges from which CIDRs can be allocated")]
    NoRanges,
    /// A range Compute gave is not a CIDR, or two ranges are not one IPv4 and one IPv6.
    #[error("has ranges {0:?} that are not one IPv4 and one IPv6 CIDR")]
    Invalid(Vec<String>),
}

/// The pod CIDRs of `instance`: the first alias IP range of `nic0` (else the first interface), then
/// that interface's IPv6 address (the external one for `ipv6AccessType: EXTERNAL`) as a `/112`.
pub fn pod_cidrs(instance: &Instance) -> Result<Vec<String>, RangeError> {
    let interfaces = &instance.network_interfaces;
    let nic = interfaces
        .iter()
        .find(|nic| nic.name.as_deref() == Some("nic0"))
        .or_else(|| interfaces.first())
        .ok_or(RangeError::NoRanges)?;
    let range = nic
        .alias_ip_ranges
        .first()
        .and_then(|r| r.ip_cidr_range.as_deref())
        .filter(|r| !r.is_empty())
        .ok_or(RangeError::NoRanges)?;
    let mut cidrs = vec![range.to_owned()];
    let ipv6 = if nic.ipv_6_access_type == Some(Ipv6AccessType::External) {
        nic.ipv_6_access_configs
            .iter()
            .find_map(|a| a.external_ipv_6.as_deref())
    } else {
        nic.ipv_6_address.as_deref()
    };
    if let Some(ipv6) = ipv6.filter(|a| !a.is_empty()) {
        cidrs.push(format!("{ipv6}/{IPV6_POD_PREFIX}"));
    }
    let parsed: Result<Vec<Cidr>, _> = cidrs.iter().map(|c| c.parse()).collect();
    match parsed.as_deref() {
        Ok([_]) => Ok(cidrs),
        Ok([a, b]) if a.is_ipv4() != b.is_ipv4() => Ok(cidrs),
        _ => Err(RangeError::Invalid(cidrs)),
    }
}

/// Whether `node` has work for the allocator: no pod CIDR, or a network not marked available.
pub fn needs_allocation(node: &CachedNode) -> bool {
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
    #[error("failed to allocate cidr: Node {node} {error}")]
    Ranges { node: String, error: RangeError },
    #[error("failed to update the node's pod CIDRs: {0}")]
    Spec(#[source] kube::Error),
    #[error("failed to set the NetworkUnavailable condition: {0}")]
    Condition(#[source] kube::Error),
}

struct Ipam {
    controller: ControllerContext,
    provider: Arc<GceProvider>,
    api: Api<Node>,
    backoff: Backoff,
}

async fn run(controller: ControllerContext) {
    let Some(provider) = controller.provider_as::<GceProvider>() else {
        tracing::error!(
            controller = NODE_IPAM_CONTROLLER,
            "the cloud provider is not gce; the controller does nothing"
        );
        return;
    };
    let informer = controller.nodes();
    tokio::select! {
        () = controller.stop().cancelled() => return,
        () = informer.ready() => {}
    }
    let context = Arc::new(Ipam {
        api: Api::all(controller.client().clone()),
        backoff: Backoff::per_key(Duration::from_millis(250), Duration::from_secs(300)),
        provider,
        controller: controller.clone(),
    });
    let forget = tokio::spawn(forget_deleted(context.clone()));
    controller.set_started();
    let queued = controller.clone();
    let changes = informer
        .subscribe()
        .filter(|node| std::future::ready(needs_allocation(node)))
        .inspect(move |node| queued.queue().add(node.name()));
    let (queued, store) = (controller.clone(), informer.store());
    let all = futures::stream::once(async move {
        queued.queue().add_all(
            store
                .state()
                .iter()
                .filter(|node| needs_allocation(node))
                .map(|node| node.name()),
        );
    });
    let stop = controller.stop().clone();
    Controller::for_shared_stream(changes, informer.store())
        .with_config(Config::default().concurrency(WORKERS))
        .reconcile_all_on(all)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, context)
        .for_each(|_| async {})
        .await;
    forget.abort();
}

async fn reconcile(node: Arc<CachedNode>, context: Arc<Ipam>) -> Result<Action, IpamError> {
    if !needs_allocation(&node) {
        context.backoff.forget(node.uid());
        return Ok(Action::await_change());
    }
    let controller = &context.controller;
    let _working = controller.working_on(node.name());
    let started = Instant::now();
    let outcome = allocate(&context, &node).await;
    controller.record_reconcile(outcome.is_ok(), started.elapsed());
    if outcome.is_ok() {
        context.backoff.forget(node.uid());
    }
    outcome.map(|()| Action::await_change())
}

async fn allocate(context: &Ipam, node: &CachedNode) -> Result<(), IpamError> {
    let controller = &context.controller;
    let name = node.name();
    let provider_id = node
        .provider_id()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| IpamError::NoProviderId(name.to_owned()))?;
    let cx = controller.call_context();
    let found = context.provider.instance_by_provider_id(&cx, provider_id).await;
    let cidrs = match found {
        Ok(Some(instance)) => pod_cidrs(&instance).map_err(|error| IpamError::Ranges {
            node: name.to_owned(),
            error,
        }),
        Ok(None) => Err(IpamError::NoInstance(provider_id.to_owned())),
        Err(error) => Err(IpamError::Cloud(error)),
    };
    let cidrs = match cidrs {
        Ok(cidrs) => cidrs,
        Err(error) => {
            if !matches!(&error, IpamError::Cloud(CloudError::Cancelled)) {
                status_change(controller, node, "CIDRNotAvailable").await;
            }
            return Err(error);
        }
    };
    let current: Vec<&str> = node.pod_cidrs().collect();
    if !same_cidrs(&current, &cidrs) {
        if !current.is_empty() {
            tracing::error!(node = name, ?current, proposed = ?cidrs, "PodCIDR being reassigned");
        }
        let patch = json!({"spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs}});
        if let Err(error) = context
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            status_change(controller, node, "CIDRAssignmentFailed").await;
            return Err(IpamError::Spec(error));
        }
        tracing::info!(node = name, ?cidrs, "set the node's pod CIDRs");
    }
    set_network_available(&context.api, node)
        .await
        .map_err(IpamError::Condition)
}

/// Whether the node's CIDRs are `proposed`, as networks (`10.4.1.7/24` is `10.4.1.0/24`).
fn same_cidrs(current: &[&str], proposed: &[String]) -> bool {
    let parse = |c: &str| c.parse::<Cidr>().ok();
    current.len() == proposed.len()
        && current
            .iter()
            .zip(proposed)
            .all(|(a, b)| match (parse(a), parse(b)) {
                (Some(a), Some(b)) => a.contains(&b) && b.contains(&a),
                _ => false,
            })
        && !current.is_empty()
}

/// Sets `NetworkUnavailable` to `False`/`RouteCreated` unless it is already; a new condition (or one
/// whose status changes) gets a transition time, an unchanged status keeps its own.
async fn set_network_available(api: &Api<Node>, node: &CachedNode) -> Result<(), kube::Error> {
    const MESSAGE: &str = "NodeController create implicit route";
    let current = node.condition("NetworkUnavailable");
    if current == Some(("False", Some("RouteCreated"))) {
        return Ok(());
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
    api.patch_status(node.name(), &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map(|_| ())
}

/// Upstream's `RecordNodeStatusChange`: a Normal Event whose reason is the new status.
async fn status_change(controller: &ControllerContext, node: &CachedNode, status: &str) {
    let reference = event_reference(&node.to_node());
    let note = format!("Node {} status is now: {status}", node.name());
    controller
        .event(&reference, EventType::Normal, status, "AllocateCIDR", note)
        .await;
}

fn error_policy(node: Arc<CachedNode>, error: &IpamError, context: Arc<Ipam>) -> Action {
    let after = match error {
        IpamError::Cloud(CloudError::Retry { after, .. }) => *after,
        _ => context.backoff.failed(node.uid()),
    };
    tracing::warn!(node = node.name(), %error, retry_in = ?after, "node-ipam: cannot allocate");
    context.controller.queue().add_after(node.name(), after, true);
    Action::requeue(after)
}

/// Forgets the failures of nodes that are gone.
async fn forget_deleted(context: Arc<Ipam>) {
    let mut deletions = std::pin::pin!(context.controller.nodes().deletions());
    while let Some(node) = deletions.next().await {
        context.backoff.forget(node.uid());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(value: serde_json::Value) -> Instance {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_pod_range_is_nic0s_first_alias_range_then_its_ipv6_address_as_a_112() {
        let dual = instance(json!({"networkInterfaces": [
            {"name": "nic1", "aliasIpRanges": [{"ipCidrRange": "10.9.0.0/24"}]},
            {"name": "nic0", "aliasIpRanges": [{"ipCidrRange": "10.4.1.0/24"}, {"ipCidrRange": "10.5.0.0/24"}],
             "ipv6Address": "2600:1900:4000:318:0:7::"},
        ]}));
        assert_eq!(
            pod_cidrs(&dual).unwrap(),
            ["10.4.1.0/24", "2600:1900:4000:318:0:7::/112"]
        );
        let external = instance(json!({"networkInterfaces": [
            {"aliasIpRanges": [{"ipCidrRange": "10.4.2.0/24"}], "ipv6AccessType": "EXTERNAL",
             "ipv6AccessConfigs": [{"externalIpv6": "2600:1900:1:2:0:9::"}]},
        ]}));
        assert_eq!(
            pod_cidrs(&external).unwrap(),
            ["10.4.2.0/24", "2600:1900:1:2:0:9::/112"]
        );
    }

    #[test]
    fn no_interface_or_no_alias_range_is_no_ranges_and_bad_ranges_are_refused() {
        assert_eq!(pod_cidrs(&instance(json!({}))), Err(RangeError::NoRanges));
        assert_eq!(
            pod_cidrs(&instance(
                json!({"networkInterfaces": [{"name": "nic0", "networkIP": "10.128.0.2"}]})
            )),
            Err(RangeError::NoRanges)
        );
        assert_eq!(
            pod_cidrs(&instance(
                json!({"networkInterfaces": [{"aliasIpRanges": [{"ipCidrRange": "/24"}]}]})
            )),
            Err(RangeError::Invalid(vec!["/24".to_owned()]))
        );
    }

    #[test]
    fn the_controller_runs_only_with_the_cloud_allocator() {
        let mut settings = ControllerSettings::defaults("test");
        assert!(
            cloud_allocator_configured(&settings)
                .unwrap_err()
                .contains("--allocate-node-cidrs is false")
        );
        settings.allocate_node_cidrs = true;
        assert!(
            cloud_allocator_configured(&settings)
                .unwrap_err()
                .contains("\"RangeAllocator\"")
        );
        settings.cidr_allocator_type = CLOUD_ALLOCATOR.to_owned();
        assert_eq!(cloud_allocator_configured(&settings), Ok(()));
        let definition = definition();
        assert_eq!(definition.name(), NODE_IPAM_CONTROLLER);
        assert_eq!(definition.provider(), Some(PROVIDER_NAME));
        assert_eq!(definition.reporter(), "cidrAllocator");
    }

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
    fn cidrs_compare_as_networks() {
        assert!(same_cidrs(&["10.4.1.0/24"], &["10.4.1.0/24".to_owned()]));
        assert!(same_cidrs(&["10.4.1.7/24"], &["10.4.1.0/24".to_owned()]));
        assert!(!same_cidrs(&[], &["10.4.1.0/24".to_owned()]));
        assert!(!same_cidrs(&["10.4.1.0/24"], &["10.4.2.0/24".to_owned()]));
        assert!(!same_cidrs(
            &["10.4.1.0/24"],
            &["10.4.1.0/24".to_owned(), "fd00::/112".to_owned()]
        ));
    }
}
