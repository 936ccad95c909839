//! Fargate nodes, as upstream's Fargate variant finds them: by the attached network interface that has the
//! private IP their provider ID names (`aws:///<az>/<…>/fargate-<ip>`, the IP also written
//! `fargate-ip-10-0-0-1.<domain>`), in the configured VPC; no instance type.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_ec2::types::NetworkInterface;
use k8s_openapi::api::core::v1::NodeAddress;
use kube_ccm_provider::{CloudError, InstanceMetadata};

use crate::config::IpFamily;
use crate::{AwsProvider, FILTER_VALUES, ZONE_ID_LABEL, aws_error, filter};

/// The private IP of a Fargate provider ID (last segment `fargate-<ip>` or `fargate-ip-a-b-c-d[.domain]`);
/// `None` when it is not one, or its IP is not an IP.
pub fn ip_of(provider_id: &str) -> Option<std::net::IpAddr> {
    let rest = provider_id.strip_prefix("aws://")?;
    let last = rest.rsplit('/').next()?;
    let ip = last.strip_prefix("fargate-")?;
    match ip.strip_prefix("ip-") {
        Some(name) => name.split('.').next()?.replace('-', ".").parse().ok(),
        None => ip.parse().ok(),
    }
}

impl AwsProvider {
    /// The attached network interfaces with `ips` as their private IP, in the configured VPC (any without
    /// one), by IP: one `DescribeNetworkInterfaces` per 200 IPs.
    pub(crate) async fn fargate_interfaces(
        &self,
        ips: &BTreeSet<std::net::IpAddr>,
    ) -> Result<HashMap<std::net::IpAddr, Vec<NetworkInterface>>, CloudError> {
        let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
        let mut found: HashMap<std::net::IpAddr, Vec<NetworkInterface>> = HashMap::new();
        for chunk in ips.chunks(FILTER_VALUES) {
            let mut filters = vec![
                filter("private-ip-address", chunk),
                filter("attachment.status", &["attached".to_owned()]),
            ];
            if !self.config.vpc.is_empty() {
                filters.push(filter("vpc-id", std::slice::from_ref(&self.config.vpc)));
            }
            let mut pages = self
                .ec2
                .describe_network_interfaces()
                .set_filters(Some(filters))
                .max_results(1000)
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(aws_error)?;
                for interface in page.network_interfaces() {
                    if let Some(ip) = interface.private_ip_address().and_then(|ip| ip.parse().ok()) {
                        found.entry(ip).or_default().push(interface.clone());
                    }
                }
            }
        }
        Ok(found)
    }

    /// A Fargate node's metadata, from its network interface (as upstream: no instance type).
    pub(crate) fn fargate_metadata(
        &self,
        provider_id: &str,
        interface: &NetworkInterface,
        zone_id: Option<String>,
    ) -> InstanceMetadata {
        let mut node_addresses = Vec::new();
        let address = |kind: &str, value: &str| NodeAddress {
            type_: kind.to_owned(),
            address: value.to_owned(),
        };
        for family in &self.config.node_ip_families {
            match family {
                IpFamily::V4 => {
                    if let Some(ip) = interface.private_ip_address() {
                        node_addresses.push(address("InternalIP", ip));
                    }
                    if let Some(name) = interface.private_dns_name().filter(|n| !n.is_empty()) {
                        node_addresses.push(address("InternalDNS", name));
                    }
                }
                IpFamily::V6 => {
                    if let Some(ip) = interface.ipv6_addresses().first().and_then(|a| a.ipv6_address()) {
                        node_addresses.push(address("InternalIP", ip));
                    }
                }
            }
        }
        let mut additional_labels = BTreeMap::new();
        if let Some(zone_id) = zone_id {
            additional_labels.insert(ZONE_ID_LABEL.to_owned(), zone_id);
        }
        InstanceMetadata {
            provider_id: provider_id.to_owned(),
            instance_type: String::new(),
            node_addresses,
            region: self.region.clone(),
            zone: interface.availability_zone().unwrap_or_default().to_owned(),
            additional_labels,
        }
    }
}
