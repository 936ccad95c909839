//! `node-ipam-controller` with upstream's `CloudAllocator`: each node's pod CIDRs are its instance's alias
//! IP range, as the GCP cloud-controller-manager's `cloudCIDRAllocator` sets them; or, with
//! `--cidr-allocator-type=RangeAllocator` (route-based clusters), upstream's range allocator ([`range`]):
//! the next free networks of `--cluster-cidr`.
//!
//! A provider's own controller, registered through the framework's controller registry
//! ([`definition`]): it runs only with `--cloud-provider=gce`, `--allocate-node-cidrs` and
//! `--cidr-allocator-type=CloudAllocator` (or `RangeAllocator`), and only when named (`--controllers=*,node-ipam-controller`,
//! or its alias `nodeipam`).
//!
//! Per node, as upstream:
//! - The node needs a provider ID (`node … doesn't have providerID`, retried; the cloud-node controller
//!   sets it).
//! - Its instance's pod ranges ([`pod_cidrs`]), from the interface `nic0` (else the first): its first
//!   alias IP range for IPv4, its IPv6 address masked to a `/112` ([`ipv6_range`]) for IPv6, as the
//!   cluster's stack asks ([`Stack`], from the families of `--service-cluster-ip-range`, upstream's
//!   node-IPAM flag: IPv4 without it). An instance that is gone, or has no range at all, gets the Event
//!   `CIDRNotAvailable` and is retried; one lacking a family the stack needs is retried without an Event.
//! - `spec.podCIDR`/`spec.podCIDRs` are patched when they differ (a node whose CIDRs are set already and
//!   differ is logged as being reassigned and patched anyway, as upstream; the API server refuses that
//!   write, and the node gets `CIDRAssignmentFailed`).
//! - `NetworkUnavailable` is set `False`, reason `RouteCreated` (pods routed by alias ranges need no
//!   route), when it is not already.
//!
//! Work is queued for a node with no pod CIDR, or whose `NetworkUnavailable` is not `False`, or that
//! carries the `node.kubernetes.io/network-unavailable` taint, as upstream's update handler does.
//! Failures are retried per node from 250 ms doubling to 5 minutes. Events report as `cidrAllocator`.
//! The states between the controller's own two writes (pod CIDRs, then the condition) are recognised by
//! their resource versions and not worked on again, so a node costs one Compute look-up.
//!
//! Deliberate differences from upstream:
//! - Upstream also queues every node when its informer starts; here the same filter applies then too,
//!   so a new leader does not ask Compute about every node already allocated.
//! - Upstream stops retrying a node after 10 failures until the node changes; here the retries go on,
//!   at most every 5 minutes.
//! - When `--allocate-node-cidrs` is false or the allocator type is another, upstream's manager exits
//!   (`the AllocateNodeCIDRs is not enabled`); here the controller is skipped with that reason in the log
//!   and `/readyz?verbose`, and the other controllers run.
//! - GKE's multi-networking (`Network` objects, several interfaces' ranges) and multi-subnet clusters are
//!   not implemented: with `--enable-multi-networking` or `--enable-multi-subnet-cluster` the manager
//!   does not start when this controller is enabled. `--node-cidr-mask-size*` size the range
//!   allocator's networks (the cloud allocator takes each node's from Compute).
//! - An unparsable `--service-cluster-ip-range` stops the start (upstream warns and ignores it).

use kube::runtime::events::EventType;
use kube_ccm_provider::Refused;
use kube_ccm_runtime::{
    CachedNode, ControllerContext, ControllerDefinition, ControllerSettings, Flag, FlagValue, FlagValues,
    SharedCache, event_reference,
};

use crate::PROVIDER_NAME;

pub mod cloud;
pub mod range;

pub use self::cloud::{RangeError, Stack, ipv6_range, needs_allocation, pod_cidrs};

/// The controller's name, as upstream's.
pub const NODE_IPAM_CONTROLLER: &str = "node-ipam-controller";
/// `--cidr-allocator-type` for the cloud allocator.
pub const CLOUD_ALLOCATOR: &str = "CloudAllocator";
/// `--cidr-allocator-type` for the range allocator.
pub const RANGE_ALLOCATOR: &str = "RangeAllocator";
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
        .requires_settings(allocator_configured)
        .reads(&[SharedCache::Nodes])
        .flags(FLAGS)
        .validated_by(no_gke_features)
        .event_reporter("cidrAllocator")
        // Upstream's node-IPAM controller acts as node-controller.
        .service_account("node-controller")
}

/// Upstream's node-IPAM flags (the GCP manager's).
pub const FLAGS: &[Flag] = &[
    Flag::value(
        "service-cluster-ip-range",
        "",
        "CIDR Range for Services in cluster (one, or an IPv4 and an IPv6 comma-separated). Its families choose the pod CIDRs a node gets from its instance, as upstream's cloud allocator: IPv4 (also without it), IPv4 then IPv6, IPv6 then IPv4, or IPv6.",
    )
    .checked(check_service_ranges),
    Flag::value(
        "node-cidr-mask-size",
        "0",
        "Mask size for node CIDRs of a single-stack cluster (range allocator; default 24 for IPv4, 64 for IPv6). The cloud allocator takes each node's range from Compute.",
    )
    .checked(check_mask),
    Flag::value(
        "node-cidr-mask-size-ipv4",
        "0",
        "Mask size for IPv4 node CIDRs (range allocator; default 24). The cloud allocator takes each node's range from Compute.",
    )
    .checked(check_mask),
    Flag::value(
        "node-cidr-mask-size-ipv6",
        "0",
        "Mask size for IPv6 node CIDRs (range allocator; default 64). The cloud allocator takes each node's range from Compute.",
    )
    .checked(check_mask),
    Flag::bool(
        "enable-multi-subnet-cluster",
        "false",
        "Not implemented (GKE's node topology): node-ipam-controller does not start with it.",
    ),
    Flag::bool(
        "enable-multi-networking",
        "false",
        "Not implemented (GKE's multi-networking): node-ipam-controller does not start with it.",
    ),
];

fn check_service_ranges(value: &FlagValue) -> Result<(), Refused> {
    Stack::of_service_ranges(value.text())
        .map(drop)
        .map_err(Refused::from)
}

fn check_mask(value: &FlagValue) -> Result<(), Refused> {
    match value.text().trim().parse::<u8>() {
        Ok(size) if size <= 128 => Ok(()),
        _ => Err(format!("{:?} is not a mask size", value.text()).into()),
    }
}

/// GKE's features this controller does not implement are off.
pub fn no_gke_features(flags: &FlagValues) -> Result<(), Refused> {
    for flag in ["enable-multi-subnet-cluster", "enable-multi-networking"] {
        if flags.is_true(flag) {
            return Err(format!("--{flag} is not implemented here; run without it").into());
        }
    }
    Ok(())
}

/// `--allocate-node-cidrs` and `--cidr-allocator-type=CloudAllocator`, or `RangeAllocator` with a
/// `--cluster-cidr` its mask sizes fit.
pub fn allocator_configured(settings: &ControllerSettings) -> Result<(), Refused> {
    if !settings.allocate_node_cidrs {
        return Err("--allocate-node-cidrs is false (upstream: the AllocateNodeCIDRs is not enabled)".into());
    }
    match settings.cidr_allocator_type.as_str() {
        CLOUD_ALLOCATOR => Ok(()),
        RANGE_ALLOCATOR => range_sets(settings).map(drop).map_err(Refused::from),
        other => Err(format!(
            "--cidr-allocator-type is {other:?}; this controller implements {CLOUD_ALLOCATOR} and {RANGE_ALLOCATOR}"
        ).into()),
    }
}

/// The range allocator's sets: `--cluster-cidr` cut by the mask sizes (IPv4 24 and IPv6 64 unless
/// `--node-cidr-mask-size-ipv4`/`-ipv6`, or `--node-cidr-mask-size` for a single-stack cluster, say).
pub fn range_sets(settings: &ControllerSettings) -> Result<Vec<range::CidrSet>, String> {
    let size = |flag: &str| settings.flags.text(flag).trim().parse::<u8>().unwrap_or(0);
    let (single, v4, v6) = (
        size("node-cidr-mask-size"),
        size("node-cidr-mask-size-ipv4"),
        size("node-cidr-mask-size-ipv6"),
    );
    if single != 0 && settings.cluster_cidrs.len() > 1 {
        return Err("--node-cidr-mask-size is for a single-stack cluster; use --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6".to_owned());
    }
    let pick = |family: u8, default: u8| match (family, single) {
        (0, 0) => default,
        (0, single) => single,
        (family, _) => family,
    };
    range::sets(&settings.cluster_cidrs, pick(v4, 24), pick(v6, 64))
}

/// Runs the allocator `--cidr-allocator-type` names.
async fn run(controller: ControllerContext) {
    if controller.settings().cidr_allocator_type == RANGE_ALLOCATOR {
        match range_sets(controller.settings()) {
            Ok(sets) => range::run(controller, sets).await,
            Err(error) => {
                tracing::error!(controller = NODE_IPAM_CONTROLLER, %error, "the range allocator does nothing");
            }
        }
    } else {
        cloud::run(controller).await;
    }
}

/// Upstream's `RecordNodeStatusChange`: a Normal Event whose reason is the new status.
async fn status_change(controller: &ControllerContext, node: &CachedNode, status: &str) {
    let reference = event_reference(node);
    let note = format!("Node {} status is now: {status}", node.name());
    controller
        .event(&reference, EventType::Normal, status, "AllocateCIDR", note)
        .await;
}

#[cfg(test)]
mod tests {
    use kube_ccm_runtime::Cidr;

    use super::*;

    #[test]
    fn the_controller_runs_with_the_cloud_or_the_range_allocator() {
        let mut settings = ControllerSettings::defaults("test");
        assert!(
            allocator_configured(&settings)
                .unwrap_err()
                .reason()
                .contains("--allocate-node-cidrs is false")
        );
        settings.allocate_node_cidrs = true;
        assert_eq!(
            settings.cidr_allocator_type, RANGE_ALLOCATOR,
            "upstream's default"
        );
        assert!(
            allocator_configured(&settings)
                .unwrap_err()
                .reason()
                .contains("--cluster-cidr is empty")
        );
        settings.cluster_cidrs = Cidr::parse_list("10.64.0.0/14,fd00:10::/56").unwrap();
        assert_eq!(allocator_configured(&settings), Ok(()));
        let sets = range_sets(&settings).unwrap();
        assert_eq!(sets.len(), 2);
        settings
            .flags
            .insert("node-cidr-mask-size", FlagValue::Value("26".into()));
        assert!(
            allocator_configured(&settings)
                .unwrap_err()
                .reason()
                .contains("single-stack")
        );
        settings.cluster_cidrs = Cidr::parse_list("10.64.0.0/14").unwrap();
        settings
            .flags
            .insert("node-cidr-mask-size", FlagValue::Value("8".into()));
        assert!(
            allocator_configured(&settings)
                .unwrap_err()
                .reason()
                .contains("does not fit")
        );
        settings.cidr_allocator_type = "IPAMFromCluster".to_owned();
        assert!(
            allocator_configured(&settings)
                .unwrap_err()
                .reason()
                .contains("\"IPAMFromCluster\"")
        );
        settings.cidr_allocator_type = CLOUD_ALLOCATOR.to_owned();
        assert_eq!(allocator_configured(&settings), Ok(()));
        let definition = definition();
        assert_eq!(definition.name(), NODE_IPAM_CONTROLLER);
        assert_eq!(definition.provider(), Some(PROVIDER_NAME));
        assert_eq!(definition.reporter(), "cidrAllocator");
    }
}
