//! Pod CIDRs a cloud assigns its instances: the hook behind the framework's node-IPAM controller with
//! `--cidr-allocator-type=CloudAllocator` (upstream's cloud CIDR allocator; GCE's alias IP ranges). The
//! range allocator (`RangeAllocator`) needs nothing from a provider.

use async_trait::async_trait;

use crate::{CallContext, Cidr, CloudError};

/// Which families of pod CIDRs nodes get, in order: upstream's cluster stack type, from the families of
/// `--service-cluster-ip-range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterStack {
    /// No service range, or an IPv4 one.
    Ipv4,
    /// An IPv4 and then an IPv6 service range.
    Ipv4Ipv6,
    /// An IPv6 and then an IPv4 service range.
    Ipv6Ipv4,
    /// An IPv6 service range alone.
    Ipv6,
}

impl ClusterStack {
    /// The stack of `--service-cluster-ip-range` (at most two CIDRs, of different families).
    pub fn of_service_ranges(text: &str) -> Result<ClusterStack, String> {
        let items: Vec<&str> = text.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        let ranges = items
            .iter()
            .map(|item| {
                item.parse::<Cidr>()
                    .map_err(|error| format!("{item:?} is not a CIDR: {error}"))
            })
            .collect::<Result<Vec<Cidr>, String>>()?;
        match ranges.as_slice() {
            [] => Ok(ClusterStack::Ipv4),
            [one] if one.is_ipv4() => Ok(ClusterStack::Ipv4),
            [_] => Ok(ClusterStack::Ipv6),
            [a, b] if a.is_ipv4() && !b.is_ipv4() => Ok(ClusterStack::Ipv4Ipv6),
            [a, b] if !a.is_ipv4() && b.is_ipv4() => Ok(ClusterStack::Ipv6Ipv4),
            [_, _] => Err("the two ranges are not dual stack (from different IP families)".to_owned()),
            _ => Err("can not contain more than two entries".to_owned()),
        }
    }

    /// The pod CIDRs of this stack out of an instance's IPv4 and IPv6 ranges, in the stack's order;
    /// `None` when a family the stack needs is missing.
    pub fn pick(self, ipv4: Option<Cidr>, ipv6: Option<Cidr>) -> Option<Vec<Cidr>> {
        match (self, ipv4, ipv6) {
            (ClusterStack::Ipv4, Some(v4), _) => Some(vec![v4]),
            (ClusterStack::Ipv4Ipv6, Some(v4), Some(v6)) => Some(vec![v4, v6]),
            (ClusterStack::Ipv6Ipv4, Some(v4), Some(v6)) => Some(vec![v6, v4]),
            (ClusterStack::Ipv6, _, Some(v6)) => Some(vec![v6]),
            _ => None,
        }
    }

    /// [`ClusterStack::pick`] from an instance's ranges: the first of each family.
    pub fn pick_from(self, ranges: &[Cidr]) -> Option<Vec<Cidr>> {
        let first = |ipv4: bool| ranges.iter().copied().find(|c| c.is_ipv4() == ipv4);
        self.pick(first(true), first(false))
    }

    /// Whether `cidrs` are one CIDR of each family of the stack, in its order: exactly what
    /// [`ClusterStack::pick_from`] takes from them.
    pub fn fits(self, cidrs: &[Cidr]) -> bool {
        self.pick_from(cidrs).as_deref() == Some(cidrs)
    }
}

impl std::fmt::Display for ClusterStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClusterStack::Ipv4 => "IPv4",
            ClusterStack::Ipv4Ipv6 => "IPv4_IPv6",
            ClusterStack::Ipv6Ipv4 => "IPv6_IPv4",
            ClusterStack::Ipv6 => "IPv6",
        })
    }
}

/// Why an instance gives a node no pod CIDRs (each is retried, per node, with a back-off).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PodCidrsError {
    /// The cloud has no instance of that provider ID (the Event `CIDRNotAvailable`).
    #[error("instance {0} not found")]
    InstanceNotFound(String),
    /// The instance has no range to give, or ranges that are not CIDRs (the Event `CIDRNotAvailable`);
    /// the text ends upstream's `Node <name> …` message.
    #[error("{0}")]
    NoRanges(String),
    /// The instance lacks a range of a family the stack needs (no Event, as upstream: the range may come).
    #[error("has no ranges from which CIDRs can be allocated for the cluster stack family {0}")]
    MissingFamily(ClusterStack),
    /// The look-up failed (`Retry` and `Throttled` set the retry's delay).
    #[error(transparent)]
    Cloud(#[from] CloudError),
}

/// The pod CIDRs of instances, as the cloud assigned them (GCE: an interface's alias IP range and its
/// IPv6 range). Offered through [`CloudProvider::pod_cidrs`](crate::CloudProvider::pod_cidrs); the
/// framework's `node-ipam-controller` calls it once per node that needs CIDRs when
/// `--cidr-allocator-type=CloudAllocator`, and writes the answer to `spec.podCIDR`/`spec.podCIDRs` and
/// the `NetworkUnavailable` condition.
#[async_trait]
pub trait PodCidrs: Send + Sync {
    /// The pod CIDRs of the instance `provider_id` for a cluster of `stack`: one per family the stack
    /// names, in its order ([`ClusterStack::pick`]).
    async fn pod_cidrs(
        &self,
        cx: &CallContext,
        provider_id: &str,
        stack: ClusterStack,
    ) -> Result<Vec<Cidr>, PodCidrsError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stack_is_the_service_ranges_families() {
        assert_eq!(ClusterStack::of_service_ranges(""), Ok(ClusterStack::Ipv4));
        assert_eq!(
            ClusterStack::of_service_ranges("10.0.0.0/16"),
            Ok(ClusterStack::Ipv4)
        );
        assert_eq!(
            ClusterStack::of_service_ranges("fd00::/108"),
            Ok(ClusterStack::Ipv6)
        );
        assert_eq!(
            ClusterStack::of_service_ranges("10.0.0.0/16, fd00::/108"),
            Ok(ClusterStack::Ipv4Ipv6)
        );
        assert_eq!(
            ClusterStack::of_service_ranges("fd00::/108,10.0.0.0/16"),
            Ok(ClusterStack::Ipv6Ipv4)
        );
        let refused = |text: &str, why: &str| {
            let error = ClusterStack::of_service_ranges(text).unwrap_err();
            assert!(error.contains(why), "{text}: {error}");
        };
        refused("10.0.0.0/16,10.1.0.0/16", "not dual stack");
        refused("10.0.0.0/16,fd00::/108,10.1.0.0/16", "more than two");
        refused("services", "\"services\" is not a CIDR");
    }

    #[test]
    fn a_stack_picks_its_families_in_its_order_or_nothing() {
        let v4: Cidr = "10.4.1.0/24".parse().unwrap();
        let v6: Cidr = "fd00:1::/112".parse().unwrap();
        assert_eq!(ClusterStack::Ipv4.pick(Some(v4), Some(v6)), Some(vec![v4]));
        assert_eq!(
            ClusterStack::Ipv4Ipv6.pick(Some(v4), Some(v6)),
            Some(vec![v4, v6])
        );
        assert_eq!(
            ClusterStack::Ipv6Ipv4.pick(Some(v4), Some(v6)),
            Some(vec![v6, v4])
        );
        assert_eq!(ClusterStack::Ipv6.pick(None, Some(v6)), Some(vec![v6]));
        assert_eq!(ClusterStack::Ipv4Ipv6.pick(Some(v4), None), None);
        assert_eq!(ClusterStack::Ipv4.pick(None, Some(v6)), None);
        let other: Cidr = "10.9.0.0/24".parse().unwrap();
        assert_eq!(
            ClusterStack::Ipv4Ipv6.pick_from(&[v6, v4, other]),
            Some(vec![v4, v6])
        );
        assert_eq!(ClusterStack::Ipv6.pick_from(&[v4]), None);
        assert!(ClusterStack::Ipv4Ipv6.fits(&[v4, v6]));
        assert!(ClusterStack::Ipv6Ipv4.fits(&[v6, v4]));
        assert!(!ClusterStack::Ipv4Ipv6.fits(&[v6, v4]), "the stack's order");
        assert!(!ClusterStack::Ipv4.fits(&[]));
        assert!(!ClusterStack::Ipv4.fits(&[v4, v4]));
        assert!(!ClusterStack::Ipv6.fits(&[v4]));
    }
}
