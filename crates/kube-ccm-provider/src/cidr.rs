//! IPv4 and IPv6 CIDRs: parsing and overlap, for `--cluster-cidr`, routes and load balancers' source
//! ranges.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// A network, e.g. `10.244.0.0/16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    address: IpAddr,
    prefix: u8,
}

/// Not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR address: {0}")]
pub struct CidrError(pub String);

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Cidr, CidrError> {
        let invalid = || CidrError(text.to_owned());
        let (address, prefix) = text.trim().split_once('/').ok_or_else(invalid)?;
        let address: IpAddr = address.parse().map_err(|_| invalid())?;
        let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(invalid());
        }
        Ok(Cidr { address, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

impl Cidr {
    /// Whether IPv4.
    pub fn is_ipv4(&self) -> bool {
        self.address.is_ipv4()
    }

    fn bits(&self) -> u128 {
        match self.address {
            IpAddr::V4(v4) => u128::from(u32::from(v4)) << 96,
            IpAddr::V6(v6) => u128::from(v6),
        }
    }

    fn masked(&self, prefix: u8) -> u128 {
        if prefix == 0 {
            0
        } else {
            self.bits() & (u128::MAX << (128 - u32::from(prefix)))
        }
    }

    /// The network itself: the address with its host bits cleared (`10.1.2.3/8` is `10.0.0.0/8`), as
    /// Go's `net.ParseCIDR` reads a CIDR.
    pub fn network(&self) -> Cidr {
        let bits = self.masked(self.prefix);
        let address = match self.address {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from((bits >> 96) as u32)),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(bits)),
        };
        Cidr {
            address,
            prefix: self.prefix,
        }
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// The address bits of the family (32 or 128).
    pub fn family_bits(&self) -> u8 {
        if self.is_ipv4() { 32 } else { 128 }
    }

    /// The `index`-th network of prefix `sub_prefix` inside this one (`10.64.0.0/14`, 24, 3 is
    /// `10.64.3.0/24`); `None` when `sub_prefix` is shorter than this network's, longer than the
    /// family's, or `index` is past the last one.
    pub fn subnet(&self, sub_prefix: u8, index: u128) -> Option<Cidr> {
        if sub_prefix < self.prefix || sub_prefix > self.family_bits() {
            return None;
        }
        let count_bits = u32::from(sub_prefix - self.prefix);
        if count_bits < 128 && index >= 1u128 << count_bits {
            return None;
        }
        let step = 128 - u32::from(sub_prefix); // the subnet's host bits, in the 128-bit layout
        let bits = self.masked(self.prefix) | index.checked_shl(step).unwrap_or(0);
        let address = if self.is_ipv4() {
            IpAddr::V4(std::net::Ipv4Addr::from((bits >> 96) as u32))
        } else {
            IpAddr::V6(std::net::Ipv6Addr::from(bits))
        };
        Some(Cidr {
            address,
            prefix: sub_prefix,
        })
    }

    /// The indexes of the networks of prefix `sub_prefix` that `inner` covers, first and last (`inner`
    /// may be larger or smaller than one); `None` when `inner` is not inside this network.
    pub fn subnet_indexes(&self, sub_prefix: u8, inner: &Cidr) -> Option<(u128, u128)> {
        if !self.contains(inner) || sub_prefix < self.prefix || sub_prefix > self.family_bits() {
            return None;
        }
        let step = 128 - u32::from(sub_prefix);
        let offset = |bits: u128| (bits - self.masked(self.prefix)).checked_shr(step).unwrap_or(0);
        Some((offset(inner.masked(inner.prefix)), offset(inner.last())))
    }

    /// Whether the two networks share any address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        if self.is_ipv4() != other.is_ipv4() {
            return false;
        }
        let shortest = self.prefix.min(other.prefix);
        self.masked(shortest) == other.masked(shortest)
    }

    /// The network's last address, as bits (IPv4 in the top 32).
    fn last(&self) -> u128 {
        let host_bits = if self.is_ipv4() { 32 } else { 128 } - u32::from(self.prefix);
        let ones = if host_bits == 0 {
            0
        } else {
            u128::MAX >> (128 - host_bits)
        };
        let ones = if self.is_ipv4() { ones << 96 } else { ones };
        self.masked(self.prefix) | ones
    }

    /// Whether the address (bits of `family`) is in this network.
    fn holds(&self, ipv4: bool, bits: u128) -> bool {
        if self.is_ipv4() != ipv4 {
            return false;
        }
        let mask = if self.prefix == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(self.prefix))
        };
        bits & mask == self.masked(self.prefix)
    }

    /// Whether `inner` lies entirely inside this network.
    pub fn contains(&self, inner: &Cidr) -> bool {
        inner.prefix >= self.prefix && self.holds(inner.is_ipv4(), inner.masked(inner.prefix))
    }

    /// Upstream's `isResponsibleForRoute`: a route is the route controller's when its first or last
    /// address is inside one of the cluster's CIDRs (so a VPC's supernet route, `10.0.0.0/8` for a cluster
    /// of `10.244.0.0/16`, is not).
    pub fn responsible_for(cluster: &[Cidr], route: &Cidr) -> bool {
        let (first, last) = (route.masked(route.prefix), route.last());
        cluster
            .iter()
            .any(|c| c.holds(route.is_ipv4(), first) || c.holds(route.is_ipv4(), last))
    }

    /// Parses a comma-separated list (as `--cluster-cidr`): at most one per family.
    pub fn parse_list(text: &str) -> Result<Vec<Cidr>, CidrError> {
        let cidrs: Vec<Cidr> = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let dual_stack = cidrs.len() == 2 && cidrs[0].is_ipv4() != cidrs[1].is_ipv4();
        if cidrs.len() > 2 || (cidrs.len() == 2 && !dual_stack) {
            return Err(CidrError(format!("{text} (at most one IPv4 and one IPv6 CIDR)")));
        }
        Ok(cidrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `--cluster-cidr` values: parsed or refused, never a panic; what parses prints back the same.
        #[test]
        fn any_list_is_parsed_or_refused(text in prop_oneof![
            "\\PC{0,40}",
            "([0-9]{1,4}\\.[0-9]{1,4}\\.[0-9]{1,4}\\.[0-9]{1,4}/[0-9]{1,3},?){0,3}",
            "([0-9a-f:]{0,20}/[0-9]{1,3},?){0,3}",
        ]) {
            if let Ok(cidrs) = Cidr::parse_list(&text) {
                for cidr in cidrs {
                    let again = Cidr::parse_list(&cidr.to_string()).unwrap();
                    prop_assert_eq!(again, vec![cidr]);
                }
            }
        }
    }

    fn cidr(text: &str) -> Cidr {
        text.parse().unwrap()
    }

    #[test]
    fn overlap() {
        assert!(cidr("10.244.0.0/16").overlaps(&cidr("10.244.3.0/24")));
        assert!(cidr("10.244.3.0/24").overlaps(&cidr("10.244.0.0/16")));
        assert!(!cidr("10.244.0.0/16").overlaps(&cidr("10.245.0.0/24")));
        assert!(!cidr("10.0.0.0/8").overlaps(&cidr("fd00::/8")));
        assert!(cidr("fd00:10::/56").overlaps(&cidr("fd00:10::/64")));
        assert!(cidr("0.0.0.0/0").overlaps(&cidr("1.2.3.4/32")));
    }

    #[test]
    fn containment_and_responsibility() {
        let cluster = [cidr("10.244.0.0/16"), cidr("fd00:10::/56")];
        assert!(cidr("10.244.0.0/16").contains(&cidr("10.244.3.0/24")));
        assert!(!cidr("10.244.3.0/24").contains(&cidr("10.244.0.0/16")));
        assert!(Cidr::responsible_for(&cluster, &cidr("10.244.3.0/24")));
        assert!(Cidr::responsible_for(&cluster, &cidr("fd00:10:0:1::/64")));
        assert!(
            !Cidr::responsible_for(&cluster, &cidr("10.0.0.0/8")),
            "a supernet is not ours"
        );
        assert!(
            Cidr::responsible_for(&[cidr("10.0.0.0/16")], &cidr("10.0.0.0/8")),
            "its first address is"
        );
        assert!(!Cidr::responsible_for(&cluster, &cidr("10.245.0.0/24")));
        assert!(Cidr::responsible_for(&[cidr("0.0.0.0/0")], &cidr("1.2.3.4/32")));
        assert!(!Cidr::responsible_for(
            &[cidr("10.244.0.0/16")],
            &cidr("10.243.255.0/23")
        ));
        assert!(Cidr::responsible_for(
            &[cidr("10.244.0.0/16")],
            &cidr("10.244.255.255/32")
        ));
    }

    #[test]
    fn subnets_by_index_and_back() {
        let cluster = cidr("10.64.0.0/14");
        assert_eq!(cluster.subnet(24, 0).unwrap().to_string(), "10.64.0.0/24");
        assert_eq!(cluster.subnet(24, 3).unwrap().to_string(), "10.64.3.0/24");
        assert_eq!(cluster.subnet(24, 1023).unwrap().to_string(), "10.67.255.0/24");
        assert!(cluster.subnet(24, 1024).is_none());
        assert!(cluster.subnet(13, 0).is_none() && cluster.subnet(33, 0).is_none());
        assert_eq!(cluster.subnet_indexes(24, &cidr("10.64.3.0/24")), Some((3, 3)));
        assert_eq!(cluster.subnet_indexes(24, &cidr("10.64.4.0/23")), Some((4, 5)));
        assert_eq!(cluster.subnet_indexes(24, &cidr("10.64.4.128/25")), Some((4, 4)));
        assert_eq!(cluster.subnet_indexes(24, &cidr("10.68.0.0/24")), None);
        let v6 = cidr("fd00:10::/56");
        assert_eq!(v6.subnet(64, 5).unwrap().to_string(), "fd00:10:0:5::/64");
        assert_eq!(v6.subnet_indexes(64, &cidr("fd00:10:0:5::/64")), Some((5, 5)));
    }

    #[test]
    fn the_network_clears_the_host_bits() {
        assert_eq!(cidr("10.1.2.3/8").network().to_string(), "10.0.0.0/8");
        assert_eq!(cidr("192.168.7.9/32").network().to_string(), "192.168.7.9/32");
        assert_eq!(cidr("1.2.3.4/0").network().to_string(), "0.0.0.0/0");
        assert_eq!(cidr("2001:db8::1/32").network().to_string(), "2001:db8::/32");
        assert_eq!(cidr("fd00::1/128").network().to_string(), "fd00::1/128");
    }

    #[test]
    fn parsing() {
        assert_eq!(cidr("10.244.0.0/16").to_string(), "10.244.0.0/16");
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "fd00::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert_eq!(Cidr::parse_list("10.244.0.0/16, fd00::/56").unwrap().len(), 2);
        assert!(
            Cidr::parse_list("10.0.0.0/16,10.1.0.0/16").is_err(),
            "two IPv4 CIDRs are not dual-stack"
        );
        assert_eq!(Cidr::parse_list("").unwrap(), []);
    }
}
