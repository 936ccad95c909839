//! Upstream's `CloudAllocator` (`--cidr-allocator-type=CloudAllocator`): each node's pod CIDRs are its
//! instance's alias IP range, as the GCP cloud-controller-manager's `cloudCIDRAllocator` sets them (the
//! behaviour, and where it differs from upstream, is described in [`super`]).

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use google_cloud_compute_v1::model::{Instance, NetworkInterface};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch};
use kube_ccm_provider::CloudError;
use kube_ccm_runtime::{Action, Backoff, CachedNode, Cidr, ControllerContext, Written, runner};
use serde_json::json;

use super::{IPV6_POD_PREFIX, NODE_IPAM_CONTROLLER, TAINT_NETWORK_UNAVAILABLE, WORKERS, status_change};
use crate::GceProvider;

/// Which families of pod CIDRs nodes get, in order: upstream's cluster stack type, from the families of
/// `--service-cluster-ip-range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    /// No service range, or an IPv4 one.
    Ipv4,
    /// An IPv4 and then an IPv6 service range.
    Ipv4Ipv6,
    /// An IPv6 and then an IPv4 service range.
    Ipv6Ipv4,
    /// An IPv6 service range alone.
    Ipv6,
}

impl Stack {
    /// The stack of `--service-cluster-ip-range` (at most two CIDRs, of different families).
    pub fn of_service_ranges(text: &str) -> Result<Stack, String> {
        let items: Vec<&str> = text.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        let ranges = items
            .iter()
            .map(|item| {
                item.parse::<Cidr>()
                    .map_err(|error| format!("{item:?} is not a CIDR: {error}"))
            })
            .collect::<Result<Vec<Cidr>, String>>()?;
        match ranges.as_slice() {
            [] => Ok(Stack::Ipv4),
            [one] if one.is_ipv4() => Ok(Stack::Ipv4),
            [_] => Ok(Stack::Ipv6),
            [a, b] if a.is_ipv4() && !b.is_ipv4() => Ok(Stack::Ipv4Ipv6),
            [a, b] if !a.is_ipv4() && b.is_ipv4() => Ok(Stack::Ipv6Ipv4),
            [_, _] => Err("the two ranges are not dual stack (from different IP families)".to_owned()),
            _ => Err("can not contain more than two entries".to_owned()),
        }
    }
}

impl std::fmt::Display for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stack::Ipv4 => "IPv4",
            Stack::Ipv4Ipv6 => "IPv4_IPv6",
            Stack::Ipv6Ipv4 => "IPv6_IPv4",
            Stack::Ipv6 => "IPv6",
        })
    }
}

/// Why an instance gives no pod CIDRs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// No interface, or one with neither an alias range nor an IPv6 address.
    #[error("has no ranges from which CIDRs can be allocated")]
    NoRanges,
    /// The pod interface lacks a range of a family the cluster's stack needs.
    #[error("has no ranges from which CIDRs can be allocated for the cluster stack family {0}")]
    Family(Stack),
    /// A range Compute gave is not a CIDR.
    #[error("has ranges {0:?} that are not one IPv4 and one IPv6 CIDR")]
    Invalid(Vec<String>),
}

/// An interface's IPv6 pod range, as upstream's `GetIPV6Address`: its
/// [`ipv6_address`](crate::instances::ipv6_address) masked to a `/112`.
pub fn ipv6_range(nic: &NetworkInterface) -> Option<String> {
    let address = crate::instances::ipv6_address(nic)?;
    Some(match address.parse::<Ipv6Addr>() {
        Ok(ip) => {
            let mask = u128::MAX << (128 - u32::from(IPV6_POD_PREFIX));
            format!("{}/{IPV6_POD_PREFIX}", Ipv6Addr::from(u128::from(ip) & mask))
        }
        // Refused as invalid below.
        Err(_) => format!("{address}/{IPV6_POD_PREFIX}"),
    })
}

/// The pod CIDRs of `instance` for a cluster of `stack`, as upstream's cloud allocator picks them: from the
/// interface `nic0` (else the first), its first alias IP range and its [`ipv6_range`], in the stack's
/// order.
pub fn pod_cidrs(instance: &Instance, stack: Stack) -> Result<Vec<String>, RangeError> {
    let interfaces = &instance.network_interfaces;
    match interfaces.as_slice() {
        [] => return Err(RangeError::NoRanges),
        [only] if only.alias_ip_ranges.is_empty() && ipv6_range(only).is_none() => {
            return Err(RangeError::NoRanges);
        }
        _ => {}
    }
    let nic = interfaces
        .iter()
        .find(|nic| nic.name.as_deref() == Some("nic0"))
        .unwrap_or(&interfaces[0]);
    let ipv4 = nic
        .alias_ip_ranges
        .first()
        .and_then(|r| r.ip_cidr_range.clone())
        .filter(|r| !r.is_empty());
    let ipv6 = ipv6_range(nic);
    let cidrs = match (stack, ipv4, ipv6) {
        (Stack::Ipv4, Some(v4), _) => vec![v4],
        (Stack::Ipv4Ipv6, Some(v4), Some(v6)) => vec![v4, v6],
        (Stack::Ipv6Ipv4, Some(v4), Some(v6)) => vec![v6, v4],
        (Stack::Ipv6, _, Some(v6)) => vec![v6],
        _ => return Err(RangeError::Family(stack)),
    };
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
    api: Api<Written<Node>>,
    backoff: Backoff,
    stack: Stack,
    /// Per node (uid), the resource versions its last successful allocation wrote.
    written: parking_lot::Mutex<HashMap<String, Vec<String>>>,
}

pub(super) async fn run(controller: ControllerContext) {
    let Some(provider) = controller.provider_as::<GceProvider>() else {
        tracing::error!(
            controller = NODE_IPAM_CONTROLLER,
            "the cloud provider is not gce; the controller does nothing"
        );
        return;
    };
    let stack = match Stack::of_service_ranges(controller.settings().flags.text("service-cluster-ip-range")) {
        Ok(stack) => stack,
        Err(error) => {
            tracing::error!(controller = NODE_IPAM_CONTROLLER, %error, "--service-cluster-ip-range; the controller does nothing");
            return;
        }
    };
    tracing::info!(controller = NODE_IPAM_CONTROLLER, %stack, "allocating pod CIDRs from the instances' ranges");
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
    // rest is on its way, and Compute need not be asked again.
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
    let cx = controller.call_context();
    let found = context.provider.instance_by_provider_id(&cx, provider_id).await;
    let cidrs = match found {
        Ok(Some(instance)) => pod_cidrs(&instance, context.stack).map_err(|error| IpamError::Ranges {
            node: name.to_owned(),
            error,
        }),
        Ok(None) => Err(IpamError::NoInstance(provider_id.to_owned())),
        Err(error) => Err(IpamError::Cloud(error)),
    };
    let cidrs = match cidrs {
        Ok(cidrs) => cidrs,
        Err(error) => {
            // As upstream, a node whose pod interface lacks a family the stack needs gets no Event.
            let quiet = matches!(
                &error,
                IpamError::Cloud(CloudError::Cancelled)
                    | IpamError::Ranges {
                        error: RangeError::Family(_),
                        ..
                    }
            );
            if !quiet {
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
        match context
            .api
            .patch(
                name,
                &kube_ccm_runtime::written::patch_params(),
                &Patch::Merge(patch),
            )
            .await
        {
            Ok(patched) => written.extend(patched.metadata.resource_version),
            Err(error) => {
                status_change(controller, node, "CIDRAssignmentFailed").await;
                return Err(IpamError::Spec(error));
            }
        }
        tracing::info!(node = name, ?cidrs, "set the node's pod CIDRs");
    }
    let version = set_network_available(&context.api, node)
        .await
        .map_err(IpamError::Condition)?;
    written.extend(version);
    Ok(written)
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
    kube_ccm_runtime::written::patch_status(
        api,
        node.name(),
        &kube_ccm_runtime::written::patch_params(),
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
    use kube_ccm_runtime::{FlagValue, FlagValues};

    use super::super::no_gke_features;
    use super::*;

    fn instance(value: serde_json::Value) -> Instance {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_pod_ranges_are_nic0s_first_alias_range_and_its_ipv6_112_as_the_stack_asks() {
        let dual = instance(json!({"networkInterfaces": [
            {"name": "nic1", "aliasIpRanges": [{"ipCidrRange": "10.9.0.0/24"}]},
            {"name": "nic0", "aliasIpRanges": [{"ipCidrRange": "10.4.1.0/24"}, {"ipCidrRange": "10.5.0.0/24"}],
             "ipv6Address": "2600:1900:4000:318:0:7:0:5"},
        ]}));
        assert_eq!(pod_cidrs(&dual, Stack::Ipv4).unwrap(), ["10.4.1.0/24"]);
        // The address masked to its /112, as upstream's GetIPV6Address.
        assert_eq!(
            pod_cidrs(&dual, Stack::Ipv4Ipv6).unwrap(),
            ["10.4.1.0/24", "2600:1900:4000:318:0:7::/112"]
        );
        assert_eq!(
            pod_cidrs(&dual, Stack::Ipv6Ipv4).unwrap(),
            ["2600:1900:4000:318:0:7::/112", "10.4.1.0/24"]
        );
        assert_eq!(
            pod_cidrs(&dual, Stack::Ipv6).unwrap(),
            ["2600:1900:4000:318:0:7::/112"]
        );
        // The internal address first; only without one, the last external access config's.
        let external = instance(json!({"networkInterfaces": [
            {"aliasIpRanges": [{"ipCidrRange": "10.4.2.0/24"}], "ipv6AccessType": "EXTERNAL",
             "ipv6AccessConfigs": [{"externalIpv6": "2600:1900:1:2:0:8::"}, {"externalIpv6": "2600:1900:1:2:0:9::"}]},
        ]}));
        assert_eq!(
            pod_cidrs(&external, Stack::Ipv4Ipv6).unwrap(),
            ["10.4.2.0/24", "2600:1900:1:2:0:9::/112"]
        );
        let mut both = external.clone();
        both.network_interfaces[0].ipv_6_address = Some("2600:1900:1:3::".to_owned());
        assert_eq!(
            ipv6_range(&both.network_interfaces[0]).as_deref(),
            Some("2600:1900:1:3::/112")
        );
        let v4_only =
            instance(json!({"networkInterfaces": [{"aliasIpRanges": [{"ipCidrRange": "10.4.3.0/24"}]}]}));
        assert_eq!(
            pod_cidrs(&v4_only, Stack::Ipv4Ipv6),
            Err(RangeError::Family(Stack::Ipv4Ipv6))
        );
    }

    #[test]
    fn the_stack_is_the_service_ranges_families() {
        assert_eq!(Stack::of_service_ranges(""), Ok(Stack::Ipv4));
        assert_eq!(Stack::of_service_ranges("10.0.0.0/16"), Ok(Stack::Ipv4));
        assert_eq!(Stack::of_service_ranges("fd00::/108"), Ok(Stack::Ipv6));
        assert_eq!(
            Stack::of_service_ranges("10.0.0.0/16, fd00::/108"),
            Ok(Stack::Ipv4Ipv6)
        );
        assert_eq!(
            Stack::of_service_ranges("fd00::/108,10.0.0.0/16"),
            Ok(Stack::Ipv6Ipv4)
        );
        assert!(
            Stack::of_service_ranges("10.0.0.0/16,10.1.0.0/16")
                .unwrap_err()
                .contains("not dual stack")
        );
        assert!(
            Stack::of_service_ranges("10.0.0.0/16,fd00::/108,10.1.0.0/16")
                .unwrap_err()
                .contains("more than two")
        );
        assert!(
            Stack::of_service_ranges("services")
                .unwrap_err()
                .contains("\"services\" is not a CIDR")
        );
        let mut flags = FlagValues::default();
        assert_eq!(no_gke_features(&flags), Ok(()));
        flags.insert("enable-multi-networking", FlagValue::Bool(true));
        assert_eq!(
            no_gke_features(&flags).unwrap_err(),
            "--enable-multi-networking is not implemented here; run without it".into()
        );
    }

    #[test]
    fn no_interface_or_no_range_is_no_ranges_and_bad_ranges_are_refused() {
        assert_eq!(
            pod_cidrs(&instance(json!({})), Stack::Ipv4),
            Err(RangeError::NoRanges)
        );
        assert_eq!(
            pod_cidrs(
                &instance(json!({"networkInterfaces": [{"name": "nic0", "networkIP": "10.128.0.2"}]})),
                Stack::Ipv4
            ),
            Err(RangeError::NoRanges)
        );
        assert_eq!(
            pod_cidrs(
                &instance(json!({"networkInterfaces": [{"aliasIpRanges": [{"ipCidrRange": "/24"}]}]})),
                Stack::Ipv4
            ),
            Err(RangeError::Invalid(vec!["/24".to_owned()]))
        );
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
