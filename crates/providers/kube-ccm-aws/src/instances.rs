//! Instances: node → EC2 instance, answered for many nodes with one `DescribeInstances` per 200 nodes.
//!
//! - Provider IDs as upstream: `aws:///<az>/<i-id>`, `aws:////<i-id>` and a bare `i-…` are accepted;
//!   `aws:///<az>/<i-id>` is given. Fargate nodes (`aws:///<az>/<…>/fargate-<ip>`, the IP also written
//!   `fargate-ip-10-0-0-1.<domain>`) are looked up by their network interface, as upstream: one
//!   `DescribeNetworkInterfaces` per 200 of them (attached, in the configured VPC, by private IP); they exist
//!   while it does and, as upstream answers, count as shut down then too; no instance type.
//! - (Fargate: `fargate.rs`.) A provider ID of any other form cannot be interpreted: every look-up of its node is an error, never
//!   "not found" (upstream's provider errors too), so its node is never deleted for it.
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
use aws_sdk_ec2::types::{Filter, Instance, InstanceStateName, NetworkInterface, NetworkInterfaceStatus};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube_ccm_provider::{CallContext, CloudError, InstanceMetadata, InstancesV2, Refused};

pub use crate::ZONE_ID_LABEL;
use crate::config::IpFamily;
use crate::{AwsProvider, FILTER_VALUES, aws_error, fargate, filter};
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

/// What runs a node: an EC2 instance, or a Fargate task known by its network interface's private IP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NodeKey {
    /// An EC2 instance.
    Instance(InstanceKey),
    /// A Fargate node: the private IP of its network interface.
    Fargate(std::net::IpAddr),
}

/// Whether this provider can interpret `provider_id`: an instance's or a Fargate node's; why not otherwise.
pub fn check_provider_id(provider_id: &str) -> Result<(), Refused> {
    if instance_id_of(provider_id).is_some() || fargate::ip_of(provider_id).is_some() {
        Ok(())
    } else {
        Err(Refused::new(
            "not an AWS instance's (aws:///<zone>/i-…, aws:////i-… or i-…) nor a Fargate node's (aws:///<zone>/…/fargate-<ip>)",
        ))
    }
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
    is_instance_id(id).then_some(id)
}

/// Whether `id` is an EC2 instance ID: `i-` and 8 or 17 lowercase hexadecimal digits. Looked up by a
/// filter, a malformed ID would match nothing and read as "no such instance", deleting its node; EC2
/// answers `InvalidInstanceID.Malformed` for one, an error, and so does this provider.
pub fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The key to look `node` up by; why not, when its provider ID cannot be interpreted.
pub fn key_of(node: &Node) -> Result<NodeKey, String> {
    let provider_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty());
    if let Some(provider_id) = provider_id {
        if let Some(id) = instance_id_of(provider_id) {
            return Ok(NodeKey::Instance(InstanceKey::Id(id.to_owned())));
        }
        if let Some(ip) = fargate::ip_of(provider_id) {
            return Ok(NodeKey::Fargate(ip));
        }
        return Err(format!(
            "provider ID {provider_id:?} cannot be interpreted: {}",
            check_provider_id(provider_id)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        ));
    }
    // A node named for its instance (`i-….<region>.compute.internal`, the resource-name scheme) is looked up
    // by that ID; any other name, `i-am-a-node` too, by private DNS name.
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let first = name.split('.').next().unwrap_or(name);
    if is_instance_id(first) {
        return Ok(NodeKey::Instance(InstanceKey::Id(first.to_owned())));
    }
    Ok(NodeKey::Instance(InstanceKey::PrivateDns(name.to_owned())))
}

/// The EC2 instance key of `node`, if an instance runs it (not a Fargate node, nor an uninterpretable ID).
pub fn instance_key_of(node: &Node) -> Option<InstanceKey> {
    match key_of(node) {
        Ok(NodeKey::Instance(key)) => Some(key),
        _ => None,
    }
}

/// What a look-up found for a node.
enum Found {
    Instance(Box<Instance>),
    Fargate(Box<NetworkInterface>),
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

    /// Looks up `nodes` in one pass: each node's instance or Fargate interface, `None` when EC2 positively
    /// has none, an error when its provider ID cannot be interpreted or a request failed.
    async fn lookup(&self, cx: &CallContext, nodes: &[Arc<Node>]) -> Vec<Result<Option<Found>, CloudError>> {
        let keys: Vec<Result<NodeKey, String>> = nodes.iter().map(|n| key_of(n)).collect();
        let wanted: Vec<InstanceKey> = keys
            .iter()
            .filter_map(|k| match k {
                Ok(NodeKey::Instance(key)) => Some(key.clone()),
                _ => None,
            })
            .collect();
        let ips: BTreeSet<std::net::IpAddr> = keys
            .iter()
            .filter_map(|k| match k {
                Ok(NodeKey::Fargate(ip)) => Some(*ip),
                _ => None,
            })
            .collect();
        let instances = if wanted.is_empty() {
            Ok(HashMap::new())
        } else {
            cx.call("DescribeInstances", self.describe(&wanted)).await
        };
        let interfaces = if ips.is_empty() {
            Ok(HashMap::new())
        } else {
            cx.call("DescribeNetworkInterfaces", self.fargate_interfaces(&ips))
                .await
        };
        keys.into_iter()
            .map(|key| match key {
                Err(why) => Err(CloudError::provider(why)),
                Ok(NodeKey::Instance(key)) => match &instances {
                    Ok(found) => Ok(found.get(&key).cloned().map(|i| Found::Instance(Box::new(i)))),
                    Err(error) => Err(copy(error)),
                },
                Ok(NodeKey::Fargate(ip)) => match &interfaces {
                    Ok(found) => match found.get(&ip).map(Vec::as_slice) {
                        None | Some([]) => Ok(None),
                        Some([interface]) => Ok(Some(Found::Fargate(Box::new(interface.clone())))),
                        Some(_) => Err(CloudError::provider(format!(
                            "more than one attached network interface has the Fargate node's IP {ip} (set VPC in the cloud-config)"
                        ))),
                    },
                    Err(error) => Err(copy(error)),
                },
            })
            .collect()
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
        self.lookup(cx, nodes)
            .await
            .into_iter()
            .map(|found| {
                Ok(match found? {
                    None => false,
                    Some(Found::Instance(i)) => {
                        state(&i).is_some_and(|s| *s != InstanceStateName::Terminated)
                    }
                    Some(Found::Fargate(_)) => true,
                })
            })
            .collect()
    }

    async fn instance_shutdown_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        self.lookup(cx, nodes)
            .await
            .into_iter()
            .map(|found| {
                Ok(match found? {
                    None => false,
                    Some(Found::Instance(i)) => state(&i) == Some(&InstanceStateName::Stopped),
                    // As upstream's Fargate variant answers: shut down whenever its interface exists.
                    Some(Found::Fargate(_)) => true,
                })
            })
            .collect()
    }

    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        let found = self.lookup(cx, nodes).await;
        // The topology of the instances whose nodes need its labels: one request per 100 instances.
        let wanted: Vec<(String, String)> = nodes
            .iter()
            .zip(&found)
            .filter_map(|(node, found)| match found {
                Ok(Some(Found::Instance(instance))) if !has_topology_labels(node) => Some((
                    instance.instance_id()?.to_owned(),
                    instance.instance_type()?.as_str().to_owned(),
                )),
                _ => None,
            })
            .collect();
        let ask = self.topology.to_ask(&self.region, &wanted);
        let topology = if ask.is_empty() {
            Ok(HashMap::new())
        } else {
            cx.call("DescribeInstanceTopology", self.network_nodes(&ask))
                .await
        };
        let mut out = Vec::with_capacity(nodes.len());
        for (node, found) in nodes.iter().zip(found) {
            let found = match found {
                // A terminated instance has nothing to describe: the node would be initialised from it.
                Ok(Some(Found::Instance(instance)))
                    if state(&instance).is_some_and(|s| *s == InstanceStateName::Terminated) =>
                {
                    out.push(Err(CloudError::InstanceNotFound));
                    continue;
                }
                Ok(Some(found)) => found,
                Ok(None) => {
                    out.push(Err(CloudError::InstanceNotFound));
                    continue;
                }
                Err(error) => {
                    out.push(Err(error));
                    continue;
                }
            };
            let zone = match &found {
                Found::Instance(instance) => instance
                    .placement()
                    .and_then(|p| p.availability_zone())
                    .unwrap_or_default(),
                Found::Fargate(interface) => interface.availability_zone().unwrap_or_default(),
            };
            let zone_id = match cx.call("DescribeAvailabilityZones", self.zone_id(zone)).await {
                Ok(zone_id) => zone_id,
                Err(error) => {
                    out.push(Err(error));
                    continue;
                }
            };
            out.push(Ok(match &found {
                Found::Instance(instance) => {
                    let mut metadata = self.metadata(instance, zone_id);
                    let id = instance.instance_id().unwrap_or_default();
                    if ask.contains(&id) {
                        match &topology {
                            Ok(nodes) => {
                                for (layer, network_node) in nodes.get(id).into_iter().flatten().enumerate() {
                                    metadata
                                        .additional_labels
                                        .insert(crate::topology::label(layer + 1), network_node.clone());
                                }
                            }
                            Err(error) => {
                                out.push(Err(copy(error)));
                                continue;
                            }
                        }
                    }
                    metadata
                }
                Found::Fargate(interface) => {
                    let provider_id = node
                        .spec
                        .as_ref()
                        .and_then(|s| s.provider_id.as_deref())
                        .unwrap_or_default();
                    self.fargate_metadata(provider_id, interface, zone_id)
                }
            }));
        }
        out
    }
}

/// Whether the node has its topology labels already (upstream asks again only without them).
fn has_topology_labels(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(&crate::topology::label(1)))
}

/// One failure, again (for each node it concerns).
fn copy(error: &CloudError) -> CloudError {
    match error {
        CloudError::Retry { after, message } => CloudError::Retry {
            after: *after,
            message: message.clone(),
        },
        CloudError::Throttled { after, message } => CloudError::Throttled {
            after: *after,
            message: message.clone(),
        },
        CloudError::Timeout => CloudError::Timeout,
        CloudError::Cancelled => CloudError::Cancelled,
        other => CloudError::provider(other.to_string()),
    }
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
        const ID: &str = "i-0123456789abcdef0";
        assert_eq!(instance_id_of(&format!("aws:///us-east-1a/{ID}")), Some(ID));
        assert_eq!(instance_id_of(&format!("aws:////{ID}")), Some(ID));
        assert_eq!(instance_id_of(ID), Some(ID));
        assert_eq!(instance_id_of("i-0abc1234"), Some("i-0abc1234"));
        assert_eq!(instance_id_of("aws:///us-east-1a/fargate-10.0.0.1"), None);
        assert_eq!(instance_id_of("gce://p/z/n"), None);
        // Malformed: never looked up (a filter would match nothing: "gone").
        for malformed in ["i-0abc", "i-XYZ!", "i-0123456789ABCDEF0", "i-0123456789abcdef00"] {
            assert_eq!(instance_id_of(malformed), None, "{malformed}");
            assert!(
                key_of(&node("x", Some(&format!("aws:///z/{malformed}")))).is_err(),
                "{malformed}"
            );
        }
        let instance = |id: &str| Ok(NodeKey::Instance(InstanceKey::Id(id.into())));
        assert_eq!(
            key_of(&node("x", Some(&format!("aws:///us-east-1a/{ID}")))),
            instance(ID)
        );
        assert_eq!(
            key_of(&node(&format!("{ID}.us-west-2.compute.internal"), None)),
            instance(ID)
        );
        assert_eq!(
            key_of(&node("i-am-a-node", None)),
            Ok(NodeKey::Instance(InstanceKey::PrivateDns("i-am-a-node".into())))
        );
        assert_eq!(
            key_of(&node("ip-10-0-0-1.ec2.internal", None)),
            Ok(NodeKey::Instance(InstanceKey::PrivateDns(
                "ip-10-0-0-1.ec2.internal".into()
            )))
        );
        assert!(key_of(&node("n", Some("gce://p/z/n"))).is_err());
        assert!(key_of(&node("n", Some("aws:///us-east-1a/vol-1"))).is_err());
    }

    #[test]
    fn fargate_provider_ids_name_their_interface_ip_as_upstream() {
        let check = |id: &str, ip: Option<&str>| {
            assert_eq!(
                crate::fargate::ip_of(id),
                ip.map(|ip| ip.parse().unwrap()),
                "{id}"
            );
        };
        check(
            "aws:///us-west-2c/1abc-2def/fargate-192.168.164.88",
            Some("192.168.164.88"),
        );
        check(
            "aws:///us-west-2c/1abc-2def/fargate-ip-192-168-164-88.us-west-2.compute.internal",
            Some("192.168.164.88"),
        );
        check("aws:///us-west-2c/fargate-10.0.0.1", Some("10.0.0.1"));
        check("aws:///us-west-2c/x/fargate-", None);
        check("aws:///us-west-2c/x/fargate-ip-not-an-ip", None);
        check("aws:///us-west-2c/x/fargate-10.0.0", None);
        check("fargate-10.0.0.1", None);
        assert_eq!(
            key_of(&node("f", Some("aws:///us-west-2c/1abc/fargate-10.0.0.1"))),
            Ok(NodeKey::Fargate("10.0.0.1".parse().unwrap()))
        );
    }

    proptest::proptest! {
        /// Whatever the provider ID, a node is either looked up by a well-formed key or its look-up is an
        /// error: it never falls through to "no instance", which would delete its node.
        #[test]
        fn every_provider_id_is_a_well_formed_key_or_an_error(
            id in proptest::prop_oneof![
                proptest::string::string_regex(".{0,40}").unwrap(),
                proptest::string::string_regex("(aws://)?/{0,4}[a-z0-9-]{0,12}/{0,2}(i-|fargate-|fargate-ip-|vol-)?[a-z0-9.-]{0,16}").unwrap(),
                proptest::string::string_regex("(gce|azure|fake)://[a-z0-9/-]{0,20}").unwrap(),
            ]
        ) {
            let named = node("some-node", Some(&id));
            match key_of(&named) {
                _ if id.is_empty() => {}
                Ok(NodeKey::Instance(InstanceKey::Id(instance))) => {
                    proptest::prop_assert!(is_instance_id(&instance));
                    proptest::prop_assert!(check_provider_id(&id).is_ok());
                }
                Ok(NodeKey::Instance(InstanceKey::PrivateDns(_))) => {
                    proptest::prop_assert!(false, "a provider ID {:?} was taken for a name", id);
                }
                Ok(NodeKey::Fargate(_)) => proptest::prop_assert!(check_provider_id(&id).is_ok()),
                Err(why) => {
                    proptest::prop_assert!(check_provider_id(&id).is_err());
                    let quoted = format!("{id:?}");
                    proptest::prop_assert!(why.contains(&quoted));
                }
            }
        }
    }
}
