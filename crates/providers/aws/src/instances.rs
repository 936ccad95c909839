//! Instances: node → EC2 instance, answered for many nodes with one `DescribeInstances` per 200 nodes.
//!
//! - Provider IDs as upstream: `aws:///<az>/<i-id>`, `aws:////<i-id>` and a bare `i-…` are accepted;
//!   `aws:///<az>/<i-id>` is given.
//! - A node without a provider ID is found by its name: `i-…` (resource-based names, with or without a
//!   domain) directly, else by `private-dns-name` among this cluster's instances (tagged
//!   `kubernetes.io/cluster/<id>` or the legacy `KubernetesCluster=<id>`).
//! - Gone = absent or `terminated`; shut down = `stopped` (as upstream).
//! - Addresses per `NodeIPFamilies`: ENIs in device order, in use only; private IPv4s as `InternalIP`,
//!   the public IPv4 as `ExternalIP`, the private DNS name as `InternalDNS` and `Hostname`, the public
//!   one as `ExternalDNS`; the first IPv6 of each ENI as `InternalIP`.
//! - Labels: zone, region and instance type (by the framework), plus `topology.k8s.aws/zone-id` from
//!   `DescribeAvailabilityZones` (read once, again when an unknown zone appears).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, Instance, InstanceStateName, NetworkInterfaceStatus};
use cloud_provider::{CallContext, CloudError, InstanceMetadata, InstancesV2};
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::config::IpFamily;
use crate::{AwsProvider, aws_error};

/// The zone-ID label (`use1-az1`), as upstream.
pub const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";
/// EC2 takes at most this many values per filter.
const FILTER_VALUES: usize = 200;
/// States an instance found by name may be in (upstream's list: not terminated).
const LIVE_STATES: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

/// How a node names its instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InstanceKey {
    /// By instance ID (from the provider ID, or a resource-based node name).
    Id(String),
    /// By private DNS name (the node's name).
    PrivateDns(String),
}

/// An instance's provider ID, `aws:///<az>/<i-id>`.
pub(crate) fn provider_id(instance: &Instance) -> String {
    let zone = instance
        .placement()
        .and_then(|p| p.availability_zone())
        .unwrap_or_default();
    format!("aws:///{zone}/{}", instance.instance_id().unwrap_or_default())
}

/// The instance ID in a provider ID: `aws:///<az>/<id>`, `aws:////<id>` or a bare `i-…`; `None` for
/// anything else (another provider's ID, a Fargate node, a malformed one).
pub fn instance_id_of(provider_id: &str) -> Option<&str> {
    let id = match provider_id.strip_prefix("aws://") {
        Some(rest) => rest.rsplit('/').next()?,
        None if !provider_id.contains('/') => provider_id,
        None => return None,
    };
    (id.starts_with("i-") && id.len() > 2).then_some(id)
}

/// The key to look `node` up by.
pub fn key_of(node: &Node) -> Option<InstanceKey> {
    let provider_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty());
    if let Some(provider_id) = provider_id {
        return instance_id_of(provider_id).map(|id| InstanceKey::Id(id.to_owned()));
    }
    let name = node.metadata.name.as_deref()?;
    let first = name.split('.').next().unwrap_or(name);
    if first.starts_with("i-") {
        return Some(InstanceKey::Id(first.to_owned()));
    }
    Some(InstanceKey::PrivateDns(name.to_owned()))
}

impl AwsProvider {
    /// The instances for `keys`. Look-ups made close together ([`crate::batch`]: the node
    /// controller's batches, the lifecycle controller's, the load balancers') share requests: one
    /// `DescribeInstances` per 200 IDs and one per 200 names, each paged by 1,000.
    pub(crate) async fn describe(
        &self,
        keys: &[InstanceKey],
    ) -> Result<HashMap<InstanceKey, Instance>, CloudError> {
        let ec2 = self.ec2.clone();
        let cluster = self.config.cluster_id().to_owned();
        let found = self
            .describer
            .describe(keys, move |keys| async move {
                describe_now(&ec2, &cluster, &keys).await
            })
            .await?;
        Ok(keys
            .iter()
            .filter_map(|k| Some((k.clone(), found.get(k)?.clone())))
            .collect())
    }

    /// `zone name → zone ID`, read once and again when `zone` is not in it (one request at a time).
    async fn zone_id(&self, zone: &str) -> Result<Option<String>, CloudError> {
        // Held across the request: concurrent batches that miss wait for one request, not one each.
        let mut ids = self.zone_ids.lock().await;
        if let Some(id) = ids.get(zone) {
            return Ok(Some(id.clone()));
        }
        let output = self
            .ec2
            .describe_availability_zones()
            .send()
            .await
            .map_err(aws_error)?;
        for z in output.availability_zones() {
            if let (Some(name), Some(id)) = (z.zone_name(), z.zone_id()) {
                ids.insert(name.to_owned(), id.to_owned());
            }
        }
        Ok(ids.get(zone).cloned())
    }

    fn metadata(&self, instance: &Instance, zone_id: Option<String>) -> InstanceMetadata {
        let zone = instance
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_owned();
        let mut additional_labels = BTreeMap::new();
        if let Some(zone_id) = zone_id {
            additional_labels.insert(ZONE_ID_LABEL.to_owned(), zone_id);
        }
        InstanceMetadata {
            provider_id: provider_id(instance),
            instance_type: instance
                .instance_type()
                .map(|t| t.as_str().to_owned())
                .unwrap_or_default(),
            node_addresses: addresses(instance, &self.config.node_ip_families),
            region: self.region.clone(),
            zone,
            additional_labels,
        }
    }

    /// Looks up `nodes` in one pass; each node's instance, or `None` when EC2 has none for it.
    async fn lookup(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Result<Vec<Option<Instance>>, CloudError> {
        let keys: Vec<Option<InstanceKey>> = nodes.iter().map(|n| key_of(n)).collect();
        let wanted: Vec<InstanceKey> = keys.iter().flatten().cloned().collect();
        let found = cx.call("DescribeInstances", self.describe(&wanted)).await?;
        Ok(keys
            .into_iter()
            .map(|key| key.and_then(|k| found.get(&k).cloned()))
            .collect())
    }
}

/// The instances for `keys`, now: one `DescribeInstances` per 200 IDs and one per 200 names, each paged by
/// 1,000. A filter on `instance-id` (unlike `InstanceIds`) does not fail the whole call for one missing
/// instance.
async fn describe_now(
    ec2: &aws_sdk_ec2::Client,
    cluster: &str,
    keys: &BTreeSet<InstanceKey>,
) -> Result<HashMap<InstanceKey, Instance>, CloudError> {
    let ids: Vec<String> = keys
        .iter()
        .filter_map(|k| {
            if let InstanceKey::Id(id) = k {
                Some(id.clone())
            } else {
                None
            }
        })
        .collect();
    let names: Vec<String> = keys
        .iter()
        .filter_map(|k| {
            if let InstanceKey::PrivateDns(n) = k {
                Some(n.clone())
            } else {
                None
            }
        })
        .collect();
    let mut found = HashMap::new();
    for chunk in ids.chunks(FILTER_VALUES) {
        for instance in describe_filtered(ec2, vec![filter("instance-id", chunk)]).await? {
            if let Some(id) = instance.instance_id() {
                found.insert(InstanceKey::Id(id.to_owned()), instance);
            }
        }
    }
    for chunk in names.chunks(FILTER_VALUES) {
        let filters = vec![
            filter("private-dns-name", chunk),
            filter("instance-state-name", &LIVE_STATES.map(String::from)),
        ];
        for instance in describe_filtered(ec2, filters).await? {
            if !is_this_clusters(cluster, &instance) {
                continue;
            }
            if let Some(name) = instance.private_dns_name() {
                found.insert(InstanceKey::PrivateDns(name.to_owned()), instance);
            }
        }
    }
    Ok(found)
}

async fn describe_filtered(
    ec2: &aws_sdk_ec2::Client,
    filters: Vec<Filter>,
) -> Result<Vec<Instance>, CloudError> {
    let mut pages = ec2
        .describe_instances()
        .set_filters(Some(filters))
        .max_results(1000)
        .into_paginator()
        .send();
    let mut instances = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(aws_error)?;
        instances.extend(
            page.reservations()
                .iter()
                .flat_map(|r| r.instances().iter().cloned()),
        );
    }
    Ok(instances)
}

/// Whether the instance carries the cluster's tag (any instance when no cluster ID is configured).
fn is_this_clusters(cluster: &str, instance: &Instance) -> bool {
    cluster.is_empty()
        || instance.tags().iter().any(|tag| {
            let key = tag.key().unwrap_or_default();
            key == format!("kubernetes.io/cluster/{cluster}")
                || (key == "KubernetesCluster" && tag.value() == Some(cluster))
        })
}

fn filter(name: &str, values: &[String]) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.to_vec()))
        .build()
}

fn state(instance: &Instance) -> Option<&InstanceStateName> {
    instance.state().and_then(|s| s.name())
}

/// The node addresses of `instance`, family by family, as upstream orders them.
pub fn addresses(instance: &Instance, families: &[IpFamily]) -> Vec<NodeAddress> {
    let address = |kind: &str, value: &str| NodeAddress {
        type_: kind.to_owned(),
        address: value.to_owned(),
    };
    let mut interfaces: Vec<_> = instance
        .network_interfaces()
        .iter()
        .filter(|i| i.status() == Some(&NetworkInterfaceStatus::InUse))
        .collect();
    interfaces.sort_by_key(|i| i.attachment().and_then(|a| a.device_index()).unwrap_or(i32::MAX));
    let mut out = Vec::new();
    for family in families {
        match family {
            IpFamily::V4 => {
                for interface in &interfaces {
                    for ip in interface
                        .private_ip_addresses()
                        .iter()
                        .filter_map(|p| p.private_ip_address())
                    {
                        out.push(address("InternalIP", ip));
                    }
                }
                if let Some(ip) = instance.public_ip_address().filter(|s| !s.is_empty()) {
                    out.push(address("ExternalIP", ip));
                }
                if let Some(name) = instance.private_dns_name().filter(|s| !s.is_empty()) {
                    out.push(address("InternalDNS", name));
                    out.push(address("Hostname", name));
                }
                if let Some(name) = instance.public_dns_name().filter(|s| !s.is_empty()) {
                    out.push(address("ExternalDNS", name));
                }
            }
            IpFamily::V6 => {
                for interface in &interfaces {
                    if let Some(ip) = interface.ipv6_addresses().iter().find_map(|a| a.ipv6_address()) {
                        out.push(address("InternalIP", ip));
                    }
                }
            }
        }
    }
    out
}

#[async_trait]
impl InstancesV2 for AwsProvider {
    async fn instance_exists(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        let nodes = [Arc::new(node.clone())];
        self.instance_exists_batch(cx, &nodes)
            .await
            .pop()
            .expect("one result per node")
    }

    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        let nodes = [Arc::new(node.clone())];
        self.instance_shutdown_batch(cx, &nodes)
            .await
            .pop()
            .expect("one result per node")
    }

    async fn instance_metadata(&self, cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError> {
        let nodes = [Arc::new(node.clone())];
        self.instance_metadata_batch(cx, &nodes)
            .await
            .pop()
            .expect("one result per node")
    }

    async fn instance_exists_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        match self.lookup(cx, nodes).await {
            Ok(found) => found
                .into_iter()
                .map(|i| {
                    Ok(i.as_ref()
                        .and_then(state)
                        .is_some_and(|s| *s != InstanceStateName::Terminated))
                })
                .collect(),
            Err(error) => copies(&error, nodes.len()),
        }
    }

    async fn instance_shutdown_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        match self.lookup(cx, nodes).await {
            Ok(found) => found
                .into_iter()
                .map(|i| Ok(i.as_ref().and_then(state) == Some(&InstanceStateName::Stopped)))
                .collect(),
            Err(error) => copies(&error, nodes.len()),
        }
    }

    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        let found = match self.lookup(cx, nodes).await {
            Ok(found) => found,
            Err(error) => return copies(&error, nodes.len()),
        };
        let mut out = Vec::with_capacity(nodes.len());
        for instance in found {
            out.push(match instance {
                None => Err(CloudError::InstanceNotFound),
                Some(instance) => {
                    let zone = instance
                        .placement()
                        .and_then(|p| p.availability_zone())
                        .unwrap_or_default();
                    match cx.call("DescribeAvailabilityZones", self.zone_id(zone)).await {
                        Ok(zone_id) => Ok(self.metadata(&instance, zone_id)),
                        Err(error) => Err(error),
                    }
                }
            });
        }
        out
    }
}

/// The same failure for every node of a batch.
fn copies<T>(error: &CloudError, n: usize) -> Vec<Result<T, CloudError>> {
    (0..n)
        .map(|_| {
            Err(match error {
                CloudError::Retry { after, message } => CloudError::Retry {
                    after: *after,
                    message: message.clone(),
                },
                CloudError::Timeout => CloudError::Timeout,
                CloudError::Cancelled => CloudError::Cancelled,
                other => CloudError::provider(other.to_string()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, provider_id: Option<&str>) -> Node {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}, "spec": {"providerID": provider_id}}),
        )
        .unwrap()
    }

    #[test]
    fn provider_ids_and_names_map_to_keys_as_upstream() {
        assert_eq!(instance_id_of("aws:///us-east-1a/i-0abc"), Some("i-0abc"));
        assert_eq!(instance_id_of("aws:////i-0abc"), Some("i-0abc"));
        assert_eq!(instance_id_of("i-0abc"), Some("i-0abc"));
        assert_eq!(instance_id_of("aws:///us-east-1a/fargate-10.0.0.1"), None);
        assert_eq!(instance_id_of("gce://p/z/n"), None);
        assert_eq!(
            key_of(&node("x", Some("aws:///us-east-1a/i-1"))),
            Some(InstanceKey::Id("i-1".into()))
        );
        assert_eq!(
            key_of(&node("i-2.us-west-2.compute.internal", None)),
            Some(InstanceKey::Id("i-2".into()))
        );
        assert_eq!(
            key_of(&node("ip-10-0-0-1.ec2.internal", None)),
            Some(InstanceKey::PrivateDns("ip-10-0-0-1.ec2.internal".into()))
        );
        assert_eq!(key_of(&node("n", Some("gce://p/z/n"))), None);
    }
}
