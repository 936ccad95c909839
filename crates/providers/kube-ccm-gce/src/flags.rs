//! The provider's flags, upstream's GCE manager's: the ranges Google's load-balancer proxies and health
//! checkers connect from, opened in the health-check firewalls.
//!
//! - `--cloud-provider-gce-lb-src-cidrs` (L3/L4): the source ranges of the health-check firewalls this
//!   provider makes (`k8s-<cluster ID>-node-http-hc`, `k8s-<lb>-http-hc`).
//! - `--cloud-provider-gce-l7lb-src-cidrs` (L7): checked and kept
//!   ([`GceProvider::l7_load_balancer_source_ranges`](crate::GceProvider::l7_load_balancer_source_ranges)),
//!   as upstream, where only ingress controllers built on the provider read it: nothing this manager
//!   makes uses it.
//! - `--enable-multi-subnet-cluster`, `--enable-multi-networking` (GKE's, for its node-IPAM controller):
//!   not implemented, so `true` stops the start of the gce provider (other providers ignore them).
//!
//! Values are comma-separated CIDRs, each read as its network (`10.1.2.3/8` is `10.0.0.0/8`), sorted,
//! without repeats. A repeated flag adds to the list (upstream refuses a second use).

use kube_ccm_provider::flags::{Flag, FlagValue};
use kube_ccm_provider::{Cidr, Refused};

/// L3/L4 source ranges.
pub const LB_SOURCE_RANGES: &str = "cloud-provider-gce-lb-src-cidrs";
/// L7 source ranges.
pub const L7_LB_SOURCE_RANGES: &str = "cloud-provider-gce-l7lb-src-cidrs";
/// Upstream's default L3/L4 ranges (Google's health checkers and proxies).
pub const DEFAULT_LB_SOURCE_RANGES: &str = "130.211.0.0/22,35.191.0.0/16,209.85.152.0/22,209.85.204.0/22";
/// Upstream's default L7 ranges.
pub const DEFAULT_L7_LB_SOURCE_RANGES: &str = "130.211.0.0/22,35.191.0.0/16";

/// The flags, for a binary's registry (`Registry::register_provider_flags`).
pub const FLAGS: &[Flag] = &[
    Flag::list(
        LB_SOURCE_RANGES,
        DEFAULT_LB_SOURCE_RANGES,
        "CIDRs opened in GCE firewall for L4 LB traffic proxy & health checks.",
    )
    .checked(check),
    Flag::list(
        L7_LB_SOURCE_RANGES,
        DEFAULT_L7_LB_SOURCE_RANGES,
        "CIDRs opened in GCE firewall for L7 LB traffic proxy & health checks (kept for ingress controllers; nothing this manager makes uses it).",
    )
    .checked(check),
    Flag::bool(
        "enable-multi-subnet-cluster",
        "false",
        "Not implemented (GKE's node topology): the gce provider does not start with it.",
    ),
    Flag::bool(
        "enable-multi-networking",
        "false",
        "Not implemented (GKE's multi-networking): the gce provider does not start with it.",
    ),
];

fn check(value: &FlagValue) -> Result<(), Refused> {
    source_ranges(value.items()).map(drop).map_err(Refused::from)
}

/// The ranges `items` name: networks, sorted as text, without repeats; at least one.
pub fn source_ranges<S: AsRef<str>>(items: &[S]) -> Result<Vec<String>, String> {
    if items.is_empty() {
        return Err("needs at least one CIDR".to_owned());
    }
    let mut ranges = items
        .iter()
        .map(|item| {
            let item = item.as_ref().trim();
            item.parse::<Cidr>()
                .map(|c| c.network().to_string())
                .map_err(|_| format!("{item:?} is not a CIDR (for example 130.211.0.0/22)"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    ranges.sort();
    ranges.dedup();
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_networks_sorted_once_each_and_bad_ones_are_named() {
        assert_eq!(
            source_ranges(&DEFAULT_LB_SOURCE_RANGES.split(',').collect::<Vec<_>>()).unwrap(),
            [
                "130.211.0.0/22",
                "209.85.152.0/22",
                "209.85.204.0/22",
                "35.191.0.0/16"
            ]
        );
        assert_eq!(
            source_ranges(&["10.1.2.3/8", " 10.0.0.0/8", "2001:db8::1/32"]).unwrap(),
            ["10.0.0.0/8", "2001:db8::/32"]
        );
        assert_eq!(
            source_ranges(&["10.0.0.0/8", "anywhere"]).unwrap_err(),
            "\"anywhere\" is not a CIDR (for example 130.211.0.0/22)"
        );
        assert_eq!(source_ranges::<&str>(&[]).unwrap_err(), "needs at least one CIDR");
        for flag in FLAGS {
            assert_eq!(
                (flag.check)(&FlagValue::List(
                    flag.default.split(',').map(str::to_owned).collect()
                )),
                Ok(())
            );
        }
    }
}
