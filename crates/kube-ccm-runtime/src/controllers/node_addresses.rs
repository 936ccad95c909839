//! Which addresses a node gets: the cloud's, filtered by the IPs its kubelet was told to use
//! (`alpha.kubernetes.io/provided-node-ip`), as upstream's `GetNodeAddressesFromNodeIP`. Pure.

use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::core::v1::NodeAddress;

/// The node's IPs cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NodeIpError {
    /// The annotation is not one IP or a dual-stack pair.
    #[error("failed to parse node IP {annotation:?}: {detail}")]
    Parse { annotation: String, detail: String },
    /// One of its IPs is not among the cloud's addresses.
    #[error("failed to get node address from cloud provider that matches ip: {ip}")]
    NotFound { ip: IpAddr },
}

/// An IP as Go's `ParseIPSloppy`: IPv4 octets may have leading zeros.
fn parse_ip_sloppy(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    let octets: Vec<&str> = text.split('.').collect();
    if octets.len() != 4 {
        return None;
    }
    let mut bytes = [0_u8; 4];
    for (byte, octet) in bytes.iter_mut().zip(octets) {
        if octet.is_empty() || octet.len() > 3 || !octet.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *byte = octet.parse().ok()?;
    }
    Some(IpAddr::V4(Ipv4Addr::from(bytes)))
}

/// `ParseNodeIPAnnotation`: one IP, or a dual-stack pair (no spaces, as the kubelet writes it).
fn parse_node_ips(annotation: &str) -> Result<Vec<IpAddr>, NodeIpError> {
    let error = |detail: String| NodeIpError::Parse {
        annotation: annotation.to_owned(),
        detail,
    };
    let ips = annotation
        .split(',')
        .map(|part| parse_ip_sloppy(part).ok_or_else(|| error(format!("could not parse {part:?}"))))
        .collect::<Result<Vec<IpAddr>, _>>()?;
    if ips.len() > 2 || (ips.len() == 2 && ips[0].is_ipv4() == ips[1].is_ipv4()) {
        return Err(error(
            "must contain either a single IP or a dual-stack pair of IPs".to_owned(),
        ));
    }
    if ips.len() == 2 && ips.iter().any(IpAddr::is_unspecified) {
        return Err(error(
            "dual-stack node IP cannot include '0.0.0.0' or '::'".to_owned(),
        ));
    }
    Ok(ips)
}

/// `GetNodeAddressesFromNodeIP`: for each provided IP in order, every cloud address equal to it (its type is
/// then "enforced"); then every cloud address of a type no provided IP enforced. Every provided IP must
/// match, so a dual-stack node keeps both of its IPs.
fn filter_by_node_ips(annotation: &str, cloud: &[NodeAddress]) -> Result<Vec<NodeAddress>, NodeIpError> {
    let ips = parse_node_ips(annotation)?;
    let mut kept: Vec<NodeAddress> = Vec::new();
    let mut enforced: Vec<&str> = Vec::new();
    for ip in ips {
        let matching: Vec<&NodeAddress> = cloud
            .iter()
            .filter(|a| parse_ip_sloppy(&a.address) == Some(ip))
            .collect();
        if matching.is_empty() {
            return Err(NodeIpError::NotFound { ip });
        }
        for address in matching {
            kept.push(address.clone());
            enforced.push(&address.type_);
        }
    }
    kept.extend(
        cloud
            .iter()
            .filter(|a| !enforced.contains(&a.type_.as_str()))
            .cloned(),
    );
    Ok(kept)
}

/// When the addresses are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moment {
    /// At initialisation: the provided IPs must match even when the cloud returned no addresses (the node
    /// then stays tainted).
    Initialization,
    /// On a refresh: a cloud with no addresses leaves the node's as they are.
    Refresh,
}

/// The addresses a node should have, from the cloud's, its current ones and its provided IPs. `Ok(None)`:
/// leave them (the cloud gave none).
///
/// With no `Hostname` from the cloud, the node's current one is kept (as upstream).
pub(crate) fn desired_addresses(
    current: &[NodeAddress],
    cloud: &[NodeAddress],
    provided_ips: Option<&str>,
    moment: Moment,
) -> Result<Option<Vec<NodeAddress>>, NodeIpError> {
    if cloud.is_empty() {
        if let (Moment::Initialization, Some(annotation)) = (moment, provided_ips) {
            filter_by_node_ips(annotation, cloud)?;
        }
        return Ok(None);
    }
    let mut addresses = cloud.to_vec();
    if !addresses.iter().any(|a| a.type_ == "Hostname")
        && let Some(hostname) = current.iter().find(|a| a.type_ == "Hostname")
    {
        addresses.push(hostname.clone());
    }
    match provided_ips {
        Some(annotation) => filter_by_node_ips(annotation, &addresses).map(Some),
        None => Ok(Some(addresses)),
    }
}

/// Whether two address lists differ. Upstream compares a type → address map, so a node with two addresses
/// of one type (dual-stack) always looks changed and is patched on every refresh; here the lists are
/// compared as sets of (type, address) pairs.
pub(crate) fn addresses_differ(a: &[NodeAddress], b: &[NodeAddress]) -> bool {
    if a.len() != b.len() {
        return true;
    }
    let key = |list: &[NodeAddress]| {
        let mut pairs: Vec<(String, String)> = list
            .iter()
            .map(|x| (x.type_.clone(), x.address.clone()))
            .collect();
        pairs.sort();
        pairs
    };
    key(a) != key(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(type_: &str, address: &str) -> NodeAddress {
        NodeAddress {
            type_: type_.to_owned(),
            address: address.to_owned(),
        }
    }

    fn pairs(list: &[NodeAddress]) -> Vec<(&str, &str)> {
        list.iter()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect()
    }

    #[track_caller]
    fn check(cloud: &[NodeAddress], provided: &str, expected: Result<&[(&str, &str)], &str>) {
        let actual = desired_addresses(&[], cloud, Some(provided), Moment::Refresh);
        match (actual, expected) {
            (Ok(Some(list)), Ok(want)) => assert_eq!(pairs(&list), want, "{provided}"),
            (Err(error), Err(want)) => assert_eq!(error.to_string(), want, "{provided}"),
            (other, want) => panic!("{provided}: {other:?}, expected {want:?}"),
        }
    }

    #[test]
    fn the_kubelets_hostname_is_kept_when_the_cloud_has_none() {
        let current = [address("Hostname", "node-1")];
        let cloud = [address("InternalIP", "10.0.0.1")];
        let desired = desired_addresses(&current, &cloud, None, Moment::Refresh)
            .unwrap()
            .unwrap();
        assert_eq!(
            pairs(&desired),
            [("InternalIP", "10.0.0.1"), ("Hostname", "node-1")]
        );
        assert_eq!(
            desired_addresses(&current, &[], None, Moment::Refresh),
            Ok(None),
            "no cloud addresses: leave the node's"
        );
    }

    #[test]
    fn provided_ips_as_upstream() {
        let cloud = [
            address("InternalIP", "10.0.0.1"),
            address("InternalIP", "10.0.0.2"),
            address("InternalIP", "fd00::1"),
            address("ExternalIP", "1.2.3.4"),
        ];
        // One IP: it alone of its type, then the other types.
        check(
            &cloud,
            "10.0.0.2",
            Ok(&[("InternalIP", "10.0.0.2"), ("ExternalIP", "1.2.3.4")]),
        );
        // A dual-stack pair: both kept, in the annotation's order.
        check(
            &cloud,
            "fd00::1,10.0.0.1",
            Ok(&[
                ("InternalIP", "fd00::1"),
                ("InternalIP", "10.0.0.1"),
                ("ExternalIP", "1.2.3.4"),
            ]),
        );
        // An IP under two types is kept under both; types an IP enforced lose their other addresses.
        let twice = [
            address("InternalIP", "10.0.0.1"),
            address("ExternalIP", "10.0.0.1"),
            address("ExternalIP", "1.2.3.4"),
        ];
        check(
            &twice,
            "10.0.0.1",
            Ok(&[("InternalIP", "10.0.0.1"), ("ExternalIP", "10.0.0.1")]),
        );
        // IPv4 with leading zeros, as Go's sloppy parser.
        check(
            &cloud,
            "010.000.000.002",
            Ok(&[("InternalIP", "10.0.0.2"), ("ExternalIP", "1.2.3.4")]),
        );
        check(
            &cloud,
            "10.9.9.9",
            Err("failed to get node address from cloud provider that matches ip: 10.9.9.9"),
        );
        check(
            &cloud,
            "10.0.0.1,fd00::9",
            Err("failed to get node address from cloud provider that matches ip: fd00::9"),
        );
        check(
            &cloud,
            "10.0.0.1,10.0.0.2",
            Err(
                "failed to parse node IP \"10.0.0.1,10.0.0.2\": must contain either a single IP or a dual-stack pair of IPs",
            ),
        );
        check(
            &cloud,
            "10.0.0.1, fd00::1",
            Err("failed to parse node IP \"10.0.0.1, fd00::1\": could not parse \" fd00::1\""),
        );
        check(
            &cloud,
            "0.0.0.0,fd00::1",
            Err(
                "failed to parse node IP \"0.0.0.0,fd00::1\": dual-stack node IP cannot include '0.0.0.0' or '::'",
            ),
        );
        check(
            &cloud,
            "",
            Err("failed to parse node IP \"\": could not parse \"\""),
        );
    }

    #[test]
    fn at_initialisation_the_ips_must_match_even_without_cloud_addresses() {
        assert_eq!(
            desired_addresses(&[], &[], Some("10.0.0.1"), Moment::Initialization),
            Err(NodeIpError::NotFound {
                ip: "10.0.0.1".parse().unwrap()
            })
        );
        assert_eq!(
            desired_addresses(&[], &[], Some("10.0.0.1"), Moment::Refresh),
            Ok(None)
        );
        assert_eq!(
            desired_addresses(&[], &[], None, Moment::Initialization),
            Ok(None)
        );
    }

    #[test]
    fn comparison_ignores_order() {
        let a = [address("InternalIP", "10.0.0.1"), address("Hostname", "n")];
        let b = [address("Hostname", "n"), address("InternalIP", "10.0.0.1")];
        assert!(!addresses_differ(&a, &b));
        assert!(addresses_differ(&a, &b[..1]));
    }
}
