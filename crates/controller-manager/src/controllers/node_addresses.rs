//! Which addresses a node gets (upstream's `PreferNodeIP` and Hostname rules). Pure.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::NodeAddress;

/// The kubelet's `--node-ip` is not among the instance's addresses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to get node address from cloud provider that matches ip: {ip}")]
pub(crate) struct ProvidedIpNotFound {
    pub(crate) ip: String,
}

/// The addresses a node should have, from the cloud's addresses, its current ones, and the
/// `alpha.kubernetes.io/provided-node-ip` annotation. `Ok(None)`: the cloud gave none; leave them.
///
/// - When the cloud reports no `Hostname`, the node's current one is kept.
/// - With a provided IP: the matching address comes first and is the only one of its type; the IP must be
///   among the cloud's addresses. `0.0.0.0` or `::` only prefers that family.
pub(crate) fn desired_addresses(
    current: &[NodeAddress],
    cloud: &[NodeAddress],
    provided_ip: Option<&str>,
) -> Result<Option<Vec<NodeAddress>>, ProvidedIpNotFound> {
    if cloud.is_empty() {
        return Ok(None);
    }
    let mut addresses = cloud.to_vec();
    if !addresses.iter().any(|a| a.type_ == "Hostname")
        && let Some(hostname) = current.iter().find(|a| a.type_ == "Hostname")
    {
        addresses.push(hostname.clone());
    }
    let Some(provided) = provided_ip.map(str::trim).filter(|ip| !ip.is_empty()) else {
        return Ok(Some(addresses));
    };
    // Dual-stack annotations list two IPs; the first one decides, as upstream's primary.
    let provided = provided.split(',').next().unwrap_or(provided).trim();
    let Ok(ip) = provided.parse::<IpAddr>() else {
        return Err(ProvidedIpNotFound {
            ip: provided.to_owned(),
        });
    };
    if ip.is_unspecified() {
        let family = |a: &NodeAddress| {
            a.address
                .parse::<IpAddr>()
                .ok()
                .map(|parsed| parsed.is_ipv4() == ip.is_ipv4())
        };
        let (preferred, rest): (Vec<_>, Vec<_>) =
            addresses.into_iter().partition(|a| family(a) == Some(true));
        return Ok(Some(preferred.into_iter().chain(rest).collect()));
    }
    let matching = addresses
        .iter()
        .find(|a| a.address.parse::<IpAddr>().is_ok_and(|parsed| parsed == ip))
        .cloned()
        .ok_or_else(|| ProvidedIpNotFound {
            ip: provided.to_owned(),
        })?;
    let mut result = vec![matching.clone()];
    result.extend(addresses.into_iter().filter(|a| a.type_ != matching.type_));
    Ok(Some(result))
}

/// Whether two address lists differ (as upstream: by length and by type → address).
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

    fn types(list: &[NodeAddress]) -> Vec<(&str, &str)> {
        list.iter()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect()
    }

    #[test]
    fn the_kubelets_hostname_is_kept_when_the_cloud_has_none() {
        let current = [address("Hostname", "node-1")];
        let cloud = [address("InternalIP", "10.0.0.1")];
        let desired = desired_addresses(&current, &cloud, None).unwrap().unwrap();
        assert_eq!(
            types(&desired),
            [("InternalIP", "10.0.0.1"), ("Hostname", "node-1")]
        );
        assert_eq!(
            desired_addresses(&current, &[], None),
            Ok(None),
            "no cloud addresses: leave the node's"
        );
    }

    #[test]
    fn the_provided_ip_comes_first_and_alone_of_its_type() {
        let cloud = [
            address("InternalIP", "10.0.0.1"),
            address("InternalIP", "10.0.0.2"),
            address("ExternalIP", "1.2.3.4"),
        ];
        let desired = desired_addresses(&[], &cloud, Some("10.0.0.2")).unwrap().unwrap();
        assert_eq!(
            types(&desired),
            [("InternalIP", "10.0.0.2"), ("ExternalIP", "1.2.3.4")]
        );
        assert_eq!(
            desired_addresses(&[], &cloud, Some("10.9.9.9")),
            Err(ProvidedIpNotFound {
                ip: "10.9.9.9".into()
            })
        );
        let v6_first = desired_addresses(
            &[],
            &[
                address("InternalIP", "10.0.0.1"),
                address("InternalIP", "fd00::1"),
            ],
            Some("::"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(v6_first[0].address, "fd00::1");
    }

    #[test]
    fn comparison_ignores_order() {
        let a = [address("InternalIP", "10.0.0.1"), address("Hostname", "n")];
        let b = [address("Hostname", "n"), address("InternalIP", "10.0.0.1")];
        assert!(!addresses_differ(&a, &b));
        assert!(addresses_differ(&a, &b[..1]));
    }
}
