//! The pod CIDRs Compute assigns instances, for the framework's `node-ipam-controller` with
//! `--cidr-allocator-type=CloudAllocator` ([`PodCidrs`]), as the GCP cloud-controller-manager's
//! `cloudCIDRAllocator` reads them: from the interface `nic0` (else the first), its first alias IP range
//! for IPv4, its IPv6 address masked to a `/112` ([`ipv6_range`]) for IPv6, in the cluster stack's order.
//!
//! GKE's multi-networking (`Network` objects, several interfaces' ranges) and multi-subnet clusters are
//! not implemented: `--enable-multi-networking` and `--enable-multi-subnet-cluster` stop the start.

use std::net::Ipv6Addr;

use async_trait::async_trait;
use google_cloud_compute_v1::model::{Instance, NetworkInterface};
use kube_ccm_provider::flags::FlagValues;
use kube_ccm_provider::{CallContext, Cidr, ClusterStack, PodCidrs, PodCidrsError, Refused};

use crate::GceProvider;

/// The prefix of the IPv6 pod range carved from the interface's address (upstream's).
const IPV6_POD_PREFIX: u8 = 112;

/// GKE's `--enable-multi-subnet-cluster` and `--enable-multi-networking` ([`crate::flags::FLAGS`]) are
/// off: this provider does not implement them.
pub fn no_gke_features(flags: &FlagValues) -> Result<(), Refused> {
    for flag in ["enable-multi-subnet-cluster", "enable-multi-networking"] {
        if flags.is_true(flag) {
            return Err(format!("--{flag} is not implemented here; run without it").into());
        }
    }
    Ok(())
}

/// Why an instance gives no pod CIDRs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// No interface, or one with neither an alias range nor an IPv6 address.
    #[error("has no ranges from which CIDRs can be allocated")]
    NoRanges,
    /// The pod interface lacks a range of a family the cluster's stack needs.
    #[error("has no ranges from which CIDRs can be allocated for the cluster stack family {0}")]
    Family(ClusterStack),
    /// A range Compute gave is not a CIDR of its family.
    #[error("has ranges {0:?} that are not one IPv4 and one IPv6 CIDR")]
    Invalid(Vec<String>),
}

impl From<RangeError> for PodCidrsError {
    fn from(error: RangeError) -> PodCidrsError {
        match error {
            RangeError::Family(stack) => PodCidrsError::MissingFamily(stack),
            other => PodCidrsError::NoRanges(other.to_string()),
        }
    }
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

/// The pod CIDRs of `instance` for a cluster of `stack`, as upstream's cloud allocator picks them.
pub fn pod_cidrs(instance: &Instance, stack: ClusterStack) -> Result<Vec<Cidr>, RangeError> {
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
    // Only the families the stack needs are read: a bad range of another family is no concern.
    let (ipv4, ipv6) = match stack {
        ClusterStack::Ipv4 => (ipv4, None),
        ClusterStack::Ipv6 => (None, ipv6),
        ClusterStack::Ipv4Ipv6 | ClusterStack::Ipv6Ipv4 => (ipv4, ipv6),
    };
    let texts: Vec<String> = ipv4.iter().chain(&ipv6).cloned().collect();
    let parse = |text: Option<String>, ipv4: bool| -> Result<Option<Cidr>, RangeError> {
        match text.map(|t| t.parse::<Cidr>()) {
            None => Ok(None),
            Some(Ok(cidr)) if cidr.is_ipv4() == ipv4 => Ok(Some(cidr)),
            Some(_) => Err(RangeError::Invalid(texts.clone())),
        }
    };
    let (ipv4, ipv6) = (parse(ipv4, true)?, parse(ipv6, false)?);
    stack.pick(ipv4, ipv6).ok_or(RangeError::Family(stack))
}

#[async_trait]
impl PodCidrs for GceProvider {
    async fn pod_cidrs(
        &self,
        cx: &CallContext,
        provider_id: &str,
        stack: ClusterStack,
    ) -> Result<Vec<Cidr>, PodCidrsError> {
        match self.instance_by_provider_id(cx, provider_id).await? {
            Some(instance) => Ok(pod_cidrs(&instance, stack)?),
            None => Err(PodCidrsError::InstanceNotFound(provider_id.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn instance(value: serde_json::Value) -> Instance {
        serde_json::from_value(value).unwrap()
    }

    fn texts(cidrs: Result<Vec<Cidr>, RangeError>) -> Vec<String> {
        cidrs.unwrap().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_pod_ranges_are_nic0s_first_alias_range_and_its_ipv6_112_as_the_stack_asks() {
        let dual = instance(json!({"networkInterfaces": [
            {"name": "nic1", "aliasIpRanges": [{"ipCidrRange": "10.9.0.0/24"}]},
            {"name": "nic0", "aliasIpRanges": [{"ipCidrRange": "10.4.1.0/24"}, {"ipCidrRange": "10.5.0.0/24"}],
             "ipv6Address": "2600:1900:4000:318:0:7:0:5"},
        ]}));
        assert_eq!(texts(pod_cidrs(&dual, ClusterStack::Ipv4)), ["10.4.1.0/24"]);
        // The address masked to its /112, as upstream's GetIPV6Address.
        assert_eq!(
            texts(pod_cidrs(&dual, ClusterStack::Ipv4Ipv6)),
            ["10.4.1.0/24", "2600:1900:4000:318:0:7::/112"]
        );
        assert_eq!(
            texts(pod_cidrs(&dual, ClusterStack::Ipv6Ipv4)),
            ["2600:1900:4000:318:0:7::/112", "10.4.1.0/24"]
        );
        assert_eq!(
            texts(pod_cidrs(&dual, ClusterStack::Ipv6)),
            ["2600:1900:4000:318:0:7::/112"]
        );
        // The internal address first; only without one, the last external access config's.
        let external = instance(json!({"networkInterfaces": [
            {"aliasIpRanges": [{"ipCidrRange": "10.4.2.0/24"}], "ipv6AccessType": "EXTERNAL",
             "ipv6AccessConfigs": [{"externalIpv6": "2600:1900:1:2:0:8::"}, {"externalIpv6": "2600:1900:1:2:0:9::"}]},
        ]}));
        assert_eq!(
            texts(pod_cidrs(&external, ClusterStack::Ipv4Ipv6)),
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
            pod_cidrs(&v4_only, ClusterStack::Ipv4Ipv6),
            Err(RangeError::Family(ClusterStack::Ipv4Ipv6))
        );
        assert!(matches!(
            PodCidrsError::from(RangeError::Family(ClusterStack::Ipv6)),
            PodCidrsError::MissingFamily(ClusterStack::Ipv6)
        ));
    }

    #[test]
    fn no_interface_or_no_range_is_no_ranges_and_bad_ranges_are_refused() {
        assert_eq!(
            pod_cidrs(&instance(json!({})), ClusterStack::Ipv4),
            Err(RangeError::NoRanges)
        );
        assert_eq!(
            pod_cidrs(
                &instance(json!({"networkInterfaces": [{"name": "nic0", "networkIP": "10.128.0.2"}]})),
                ClusterStack::Ipv4
            ),
            Err(RangeError::NoRanges)
        );
        assert_eq!(
            pod_cidrs(
                &instance(json!({"networkInterfaces": [{"aliasIpRanges": [{"ipCidrRange": "/24"}]}]})),
                ClusterStack::Ipv4
            ),
            Err(RangeError::Invalid(vec!["/24".to_owned()]))
        );
        // An alias range of the wrong family is no IPv4 range.
        assert_eq!(
            pod_cidrs(
                &instance(json!({"networkInterfaces": [{"aliasIpRanges": [{"ipCidrRange": "fd00::/64"}]}]})),
                ClusterStack::Ipv4
            ),
            Err(RangeError::Invalid(vec!["fd00::/64".to_owned()]))
        );
        // A bad range of a family the stack does not need is no concern.
        let bad_ipv6 = instance(json!({"networkInterfaces": [
            {"aliasIpRanges": [{"ipCidrRange": "10.4.4.0/24"}], "ipv6Address": "not-an-address"},
        ]}));
        assert_eq!(texts(pod_cidrs(&bad_ipv6, ClusterStack::Ipv4)), ["10.4.4.0/24"]);
        assert!(matches!(
            pod_cidrs(&bad_ipv6, ClusterStack::Ipv4Ipv6),
            Err(RangeError::Invalid(_))
        ));
        assert!(matches!(
            PodCidrsError::from(RangeError::NoRanges),
            PodCidrsError::NoRanges(why) if why == "has no ranges from which CIDRs can be allocated"
        ));
    }

    #[test]
    fn gkes_features_stop_the_start() {
        let mut flags = FlagValues::default();
        assert_eq!(no_gke_features(&flags), Ok(()));
        flags.insert(
            "enable-multi-networking",
            kube_ccm_provider::flags::FlagValue::Bool(true),
        );
        assert_eq!(
            no_gke_features(&flags).unwrap_err(),
            "--enable-multi-networking is not implemented here; run without it".into()
        );
    }
}
