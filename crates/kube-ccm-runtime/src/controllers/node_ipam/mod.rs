//! `node-ipam-controller`: each node's pod CIDRs (`spec.podCIDR`/`spec.podCIDRs`), from one of two
//! allocators, as `--cidr-allocator-type` names (decision 0042):
//! - `RangeAllocator` ([`range`], route-based clusters; any provider): the next free networks of
//!   `--cluster-cidr`, sized by `--node-cidr-mask-size*`.
//! - `CloudAllocator` ([`cloud`]): the ranges the cloud assigned the node's instance, asked of the
//!   provider's [`PodCidrs`](kube_ccm_provider::PodCidrs) (GCE: alias IP ranges); a provider without it
//!   skips the controller, saying so.
//!
//! Off unless named (`--controllers=*,node-ipam-controller`, or its alias `nodeipam`), and it runs only
//! with `--allocate-node-cidrs`. Upstream's flags, with the semantics cloud-provider-gcp's node-IPAM
//! controller gives them: `--service-cluster-ip-range` chooses the cloud allocator's families
//! ([`ClusterStack`]), `--node-cidr-mask-size`, `-ipv4` and `-ipv6` size the range allocator's networks.
//! Events report as `cidrAllocator`; the controller acts as `node-controller`, as upstream's.
//!
//! Deliberate differences from upstream:
//! - When `--allocate-node-cidrs` is false or the allocator type is another, upstream's manager exits
//!   (`the AllocateNodeCIDRs is not enabled`); here the controller is skipped with that reason in the log
//!   and `/readyz?verbose`, and the other controllers run.
//! - An unparsable `--service-cluster-ip-range` stops the start (upstream warns and ignores it).
//! - Retries go on at most every 5 minutes (upstream gives up after 10 until the node changes).

use kube::runtime::events::EventType;
use kube_ccm_provider::flags::{Flag, FlagValue};
use kube_ccm_provider::{ClusterStack, Refused};

use crate::cached_node::CachedNode;
use crate::config::ControllerSettings;
use crate::context::{ControllerContext, event_reference};
use crate::informers::SharedCache;
use crate::registry::{Capability, ControllerDefinition};

pub(crate) mod cloud;
pub(crate) mod range;

/// The controller's name, as upstream's.
pub const NODE_IPAM_CONTROLLER: &str = "node-ipam-controller";
/// `--cidr-allocator-type` for the cloud allocator.
pub const CLOUD_ALLOCATOR: &str = "CloudAllocator";
/// `--cidr-allocator-type` for the range allocator.
pub const RANGE_ALLOCATOR: &str = "RangeAllocator";
/// Syncs at once (upstream's `cidrUpdateWorkers`).
const WORKERS: u16 = 30;

/// The controller, for the framework's registry: `node-ipam-controller` (alias `nodeipam`), off unless
/// named, skipped unless the settings ask for an allocator it has (and, for the cloud allocator, the
/// provider offers pod CIDRs).
pub(crate) fn definition() -> ControllerDefinition {
    ControllerDefinition::new(NODE_IPAM_CONTROLLER, run)
        .aliases(&["nodeipam"])
        .disabled_by_default()
        .requires_settings(allocator_configured)
        .requires_when(
            Capability::PodCidrs,
            "--cidr-allocator-type=CloudAllocator",
            uses_cloud_allocator,
        )
        .reads(&[SharedCache::Nodes])
        .flags(FLAGS)
        .event_reporter("cidrAllocator")
        // Upstream's node-IPAM controller acts as node-controller.
        .service_account("node-controller")
}

/// Upstream's node-IPAM flags.
pub(crate) const FLAGS: &[Flag] = &[
    Flag::value(
        "service-cluster-ip-range",
        "",
        "CIDR Range for Services in cluster (one, or an IPv4 and an IPv6 comma-separated). Its families choose the pod CIDRs node-ipam-controller's cloud allocator gives a node: IPv4 (also without it), IPv4 then IPv6, IPv6 then IPv4, or IPv6.",
    )
    .checked(check_service_ranges),
    Flag::value(
        "node-cidr-mask-size",
        "0",
        "Mask size for node CIDRs of a single-stack cluster (range allocator; default 24 for IPv4, 64 for IPv6). The cloud allocator takes each node's range from the cloud.",
    )
    .checked(check_mask),
    Flag::value(
        "node-cidr-mask-size-ipv4",
        "0",
        "Mask size for IPv4 node CIDRs (range allocator; default 24). The cloud allocator takes each node's range from the cloud.",
    )
    .checked(check_mask),
    Flag::value(
        "node-cidr-mask-size-ipv6",
        "0",
        "Mask size for IPv6 node CIDRs (range allocator; default 64). The cloud allocator takes each node's range from the cloud.",
    )
    .checked(check_mask),
];

fn check_service_ranges(value: &FlagValue) -> Result<(), Refused> {
    ClusterStack::of_service_ranges(value.text())
        .map(drop)
        .map_err(Refused::from)
}

fn check_mask(value: &FlagValue) -> Result<(), Refused> {
    match value.text().trim().parse::<u8>() {
        Ok(size) if size <= 128 => Ok(()),
        _ => Err(format!("{:?} is not a mask size", value.text()).into()),
    }
}

fn uses_cloud_allocator(settings: &ControllerSettings) -> bool {
    settings.cidr_allocator_type == CLOUD_ALLOCATOR
}

/// `--allocate-node-cidrs` and `--cidr-allocator-type=CloudAllocator`, or `RangeAllocator` with a
/// `--cluster-cidr` its mask sizes fit.
pub(crate) fn allocator_configured(settings: &ControllerSettings) -> Result<(), Refused> {
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
pub(crate) fn range_sets(settings: &ControllerSettings) -> Result<Vec<range::CidrSet>, String> {
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
    use kube_ccm_provider::{CallContext, Cidr, CloudProvider, PodCidrs, PodCidrsError};

    use super::*;

    struct Bare;

    impl CloudProvider for Bare {
        fn provider_name(&self) -> &str {
            "bare"
        }
    }

    struct Allocating;

    #[async_trait::async_trait]
    impl PodCidrs for Allocating {
        async fn pod_cidrs(
            &self,
            _cx: &CallContext,
            _provider_id: &str,
            _stack: ClusterStack,
        ) -> Result<Vec<Cidr>, PodCidrsError> {
            Ok(vec!["10.4.0.0/24".parse().unwrap()])
        }
    }

    impl CloudProvider for Allocating {
        fn provider_name(&self) -> &str {
            "allocating"
        }

        fn pod_cidrs(&self) -> Option<&dyn PodCidrs> {
            Some(self)
        }
    }

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
        assert_eq!(definition.provider(), None, "any provider's");
        assert_eq!(definition.reporter(), "cidrAllocator");
        assert_eq!(definition.account(), "node-controller");
    }

    #[test]
    fn the_range_allocator_needs_nothing_of_the_provider_and_the_cloud_allocator_pod_cidrs() {
        let mut settings = ControllerSettings::defaults("test");
        settings.allocate_node_cidrs = true;
        settings.cluster_cidrs = Cidr::parse_list("10.64.0.0/14").unwrap();
        let definition = definition();
        assert_eq!(definition.skip_reason(&Bare, &settings), None);
        settings.cidr_allocator_type = CLOUD_ALLOCATOR.to_owned();
        assert_eq!(
            definition.skip_reason(&Bare, &settings).as_deref(),
            Some("the cloud provider does not support pod CIDRs (--cidr-allocator-type=CloudAllocator)")
        );
        assert_eq!(definition.skip_reason(&Allocating, &settings), None);
        assert_eq!(
            definition.needs(),
            ["pod CIDRs with --cidr-allocator-type=CloudAllocator"]
        );
    }
}
