//! The node controllers' view of a provider's instances: its `InstancesV2`, or else its older `Instances`
//! (with `Zones`) answering the same questions exactly as upstream's node controllers do with them.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use kube_ccm_provider::{
    CallContext, CloudError, CloudProvider, InstanceMetadata, Instances, InstancesV2, Zones,
};

/// The provider's instance look-ups: `InstancesV2` when it has them, the `Instances` adapter otherwise.
pub(crate) fn instances_of(provider: &dyn CloudProvider) -> Option<Box<dyn InstancesV2 + '_>> {
    if let Some(v2) = provider.instances_v2() {
        return Some(Box::new(Borrowed(v2)));
    }
    provider.instances().map(|instances| {
        Box::new(FromInstances {
            instances,
            zones: provider.zones(),
            provider_name: provider.provider_name(),
        }) as Box<dyn InstancesV2 + '_>
    })
}

/// `InstancesV2` as the provider has it, its batches held to one answer per node: a batch of another
/// length cannot be matched to its nodes (a short one would pin "gone" on the wrong node), so every node
/// gets an error instead.
struct Borrowed<'a>(&'a dyn InstancesV2);

/// `answers` when there is one per node, else an error for each node.
fn one_per_node<T>(nodes: usize, answers: Vec<Result<T, CloudError>>) -> Vec<Result<T, CloudError>> {
    if answers.len() == nodes {
        return answers;
    }
    let message = format!("the provider gave {} answers for {nodes} nodes", answers.len());
    (0..nodes)
        .map(|_| Err(CloudError::provider(message.clone())))
        .collect()
}

#[async_trait]
impl InstancesV2 for Borrowed<'_> {
    async fn instance_exists(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        self.0.instance_exists(cx, node).await
    }

    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        self.0.instance_shutdown(cx, node).await
    }

    async fn instance_metadata(&self, cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError> {
        self.0.instance_metadata(cx, node).await
    }

    async fn instance_exists_batch(
        &self,
        cx: &CallContext,
        nodes: &[std::sync::Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        one_per_node(nodes.len(), self.0.instance_exists_batch(cx, nodes).await)
    }

    async fn instance_shutdown_batch(
        &self,
        cx: &CallContext,
        nodes: &[std::sync::Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        one_per_node(nodes.len(), self.0.instance_shutdown_batch(cx, nodes).await)
    }

    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[std::sync::Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        one_per_node(nodes.len(), self.0.instance_metadata_batch(cx, nodes).await)
    }
}

/// Upstream's node controllers over `Instances` (v1) and `Zones`.
struct FromInstances<'a> {
    instances: &'a dyn Instances,
    zones: Option<&'a dyn Zones>,
    provider_name: &'a str,
}

fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

fn spec_provider_id(node: &Node) -> Option<&str> {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty())
}

impl FromInstances<'_> {
    /// `GetInstanceProviderID`: `<provider>://<instance ID>`.
    async fn provider_id(&self, cx: &CallContext, node: &Node) -> Result<String, CloudError> {
        if let Some(id) = spec_provider_id(node) {
            return Ok(id.to_owned());
        }
        match self.instances.instance_id(cx, name(node)).await {
            Ok(id) => Ok(format!("{}://{id}", self.provider_name)),
            Err(error @ (CloudError::NotImplemented | CloudError::InstanceNotFound)) => Err(error),
            Err(error) => Err(CloudError::provider(format!(
                "failed to get instance ID from cloud provider: {error}"
            ))),
        }
    }
}

#[async_trait]
impl InstancesV2 for FromInstances<'_> {
    async fn instance_exists(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        let provider_id = match self.provider_id(cx, node).await {
            Ok(id) => id,
            Err(CloudError::InstanceNotFound) => return Ok(false),
            Err(error) => return Err(error),
        };
        self.instances
            .instance_exists_by_provider_id(cx, &provider_id)
            .await
    }

    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        let provider_id = match self.provider_id(cx, node).await {
            Ok(id) => id,
            Err(CloudError::InstanceNotFound) => return Ok(false),
            Err(error) => return Err(error),
        };
        match self
            .instances
            .instance_shutdown_by_provider_id(cx, &provider_id)
            .await
        {
            Err(CloudError::NotImplemented) => Ok(false),
            other => other,
        }
    }

    async fn instance_metadata(&self, cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError> {
        let node_name = name(node);
        let provider_id = match self.provider_id(cx, node).await {
            Ok(id) => id,
            // The provider cannot tell: initialise the node by name, without a provider ID.
            Err(CloudError::NotImplemented) => {
                tracing::warn!(
                    node = node_name,
                    "cloud provider does not set node provider ID, using node name to discover node"
                );
                String::new()
            }
            Err(error) => return Err(error),
        };
        let node_addresses = match self
            .instances
            .node_addresses_by_provider_id(cx, &provider_id)
            .await
        {
            Ok(addresses) => addresses,
            Err(by_id) => self
                .instances
                .node_addresses(cx, node_name)
                .await
                .map_err(|by_name| {
                    CloudError::provider(format!(
                        "error fetching node by provider ID: {by_id}, and error by node name: {by_name}"
                    ))
                })?,
        };
        let instance_type = match self
            .instances
            .instance_type_by_provider_id(cx, &provider_id)
            .await
        {
            Ok(instance_type) => instance_type,
            Err(by_id) => self
                .instances
                .instance_type(cx, node_name)
                .await
                .map_err(|by_name| {
                    CloudError::provider(format!(
                        "InstanceType: Error fetching by providerID: {by_id} Error fetching by NodeName: {by_name}"
                    ))
                })?,
        };
        let (zone, region) = match self.zones {
            None => (String::new(), String::new()),
            Some(zones) => {
                let zone = match zones.zone_by_provider_id(cx, &provider_id).await {
                    Ok(zone) => zone,
                    Err(by_id) => zones.zone_by_node_name(cx, node_name).await.map_err(|by_name| {
                        CloudError::provider(format!(
                            "failed to get zone from cloud provider: Zone: Error fetching by providerID: {by_id} Error fetching by NodeName: {by_name}"
                        ))
                    })?,
                };
                (zone.failure_domain, zone.region)
            }
        };
        Ok(InstanceMetadata {
            provider_id,
            instance_type,
            node_addresses,
            zone,
            region,
            additional_labels: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use std::collections::BTreeMap;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::NodeAddress;
    use kube_ccm_provider::Zone;
    use serde_json::json;

    use super::*;

    /// A v1-only cloud: instances by name, each with an ID (or none: the provider cannot tell), addresses
    /// known by ID only, and a zone known by name only.
    #[derive(Default)]
    struct OldCloud {
        ids: BTreeMap<String, Result<String, &'static str>>,
        calls: Mutex<Vec<String>>,
    }

    fn fail(what: &'static str) -> CloudError {
        match what {
            "not-found" => CloudError::InstanceNotFound,
            "not-implemented" => CloudError::NotImplemented,
            other => CloudError::provider(other),
        }
    }

    #[async_trait]
    impl Instances for OldCloud {
        async fn node_addresses(
            &self,
            _: &CallContext,
            node_name: &str,
        ) -> Result<Vec<NodeAddress>, CloudError> {
            self.calls.lock().push(format!("addresses({node_name})"));
            Ok(vec![NodeAddress {
                type_: "Hostname".into(),
                address: node_name.into(),
            }])
        }
        async fn node_addresses_by_provider_id(
            &self,
            _: &CallContext,
            id: &str,
        ) -> Result<Vec<NodeAddress>, CloudError> {
            self.calls.lock().push(format!("addresses-by-id({id})"));
            if id.is_empty() {
                return Err(CloudError::provider("no ID"));
            }
            Ok(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: "10.0.0.1".into(),
            }])
        }
        async fn instance_id(&self, _: &CallContext, node_name: &str) -> Result<String, CloudError> {
            match self.ids.get(node_name) {
                Some(Ok(id)) => Ok(id.clone()),
                Some(Err(what)) => Err(fail(what)),
                None => Err(CloudError::InstanceNotFound),
            }
        }
        async fn instance_type(&self, _: &CallContext, _: &str) -> Result<String, CloudError> {
            Ok("by-name.large".into())
        }
        async fn instance_type_by_provider_id(
            &self,
            _: &CallContext,
            id: &str,
        ) -> Result<String, CloudError> {
            if id.is_empty() {
                Err(CloudError::NotImplemented)
            } else {
                Ok("by-id.large".into())
            }
        }
        async fn instance_exists_by_provider_id(&self, _: &CallContext, _: &str) -> Result<bool, CloudError> {
            Ok(true)
        }
        async fn instance_shutdown_by_provider_id(
            &self,
            _: &CallContext,
            _: &str,
        ) -> Result<bool, CloudError> {
            Err(CloudError::NotImplemented)
        }
    }

    #[async_trait]
    impl Zones for OldCloud {
        async fn zone(&self, _: &CallContext) -> Result<Zone, CloudError> {
            Err(CloudError::NotImplemented)
        }
        async fn zone_by_provider_id(&self, _: &CallContext, _: &str) -> Result<Zone, CloudError> {
            Err(CloudError::NotImplemented)
        }
        async fn zone_by_node_name(&self, _: &CallContext, _: &str) -> Result<Zone, CloudError> {
            Ok(Zone {
                failure_domain: "z1".into(),
                region: "r1".into(),
            })
        }
    }

    impl CloudProvider for OldCloud {
        fn provider_name(&self) -> &str {
            "old"
        }
        fn instances(&self) -> Option<&dyn Instances> {
            Some(self)
        }
        fn zones(&self) -> Option<&dyn Zones> {
            Some(self)
        }
    }

    fn node(name: &str, provider_id: Option<&str>) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"providerID": provider_id}}))
            .unwrap()
    }

    #[tokio::test]
    async fn metadata_from_instances_and_zones_as_upstream() {
        let cloud = OldCloud {
            ids: [
                ("n1".to_owned(), Ok("i-1".to_owned())),
                ("n2".to_owned(), Err("not-implemented")),
                ("n3".to_owned(), Err("boom")),
            ]
            .into(),
            ..OldCloud::default()
        };
        let instances = instances_of(&cloud).unwrap();
        let cx = CallContext::with_timeout(Duration::from_secs(5));
        let n1 = instances.instance_metadata(&cx, &node("n1", None)).await.unwrap();
        assert_eq!(
            (
                n1.provider_id.as_str(),
                n1.instance_type.as_str(),
                n1.zone.as_str(),
                n1.region.as_str()
            ),
            ("old://i-1", "by-id.large", "z1", "r1")
        );
        assert_eq!(n1.node_addresses[0].type_, "InternalIP");
        // The provider cannot tell the ID: initialised by name.
        let n2 = instances.instance_metadata(&cx, &node("n2", None)).await.unwrap();
        assert_eq!(
            (
                n2.provider_id.as_str(),
                n2.instance_type.as_str(),
                n2.node_addresses[0].type_.as_str()
            ),
            ("", "by-name.large", "Hostname")
        );
        let n3 = instances
            .instance_metadata(&cx, &node("n3", None))
            .await
            .unwrap_err();
        assert_eq!(
            n3.to_string(),
            "failed to get instance ID from cloud provider: boom"
        );
        // A node with a provider ID is looked up by it, without asking for an ID.
        let known = instances
            .instance_metadata(&cx, &node("n9", Some("old://i-9")))
            .await
            .unwrap();
        assert_eq!(known.provider_id, "old://i-9");
    }

    #[tokio::test]
    async fn existence_and_shutdown_as_upstream() {
        let cloud = OldCloud {
            ids: [("n1".to_owned(), Ok("i-1".to_owned()))].into(),
            ..OldCloud::default()
        };
        let instances = instances_of(&cloud).unwrap();
        let cx = CallContext::with_timeout(Duration::from_secs(5));
        assert!(instances.instance_exists(&cx, &node("n1", None)).await.unwrap());
        // No instance of that name: gone.
        assert!(!instances.instance_exists(&cx, &node("gone", None)).await.unwrap());
        // Shutdown unknown to the provider: not shut down.
        assert!(!instances.instance_shutdown(&cx, &node("n1", None)).await.unwrap());
        assert!(
            !instances
                .instance_shutdown(&cx, &node("gone", None))
                .await
                .unwrap()
        );
    }

    /// A provider whose batches answer one node short.
    struct ShortBatches;

    #[async_trait]
    impl InstancesV2 for ShortBatches {
        async fn instance_exists(&self, _: &CallContext, _: &Node) -> Result<bool, CloudError> {
            Ok(false)
        }
        async fn instance_shutdown(&self, _: &CallContext, _: &Node) -> Result<bool, CloudError> {
            Ok(false)
        }
        async fn instance_metadata(&self, _: &CallContext, _: &Node) -> Result<InstanceMetadata, CloudError> {
            Err(CloudError::InstanceNotFound)
        }
        async fn instance_exists_batch(
            &self,
            _: &CallContext,
            nodes: &[std::sync::Arc<Node>],
        ) -> Vec<Result<bool, CloudError>> {
            nodes.iter().skip(1).map(|_| Ok(false)).collect()
        }
    }

    #[async_trait]
    impl CloudProvider for ShortBatches {
        fn provider_name(&self) -> &str {
            "short"
        }
        fn instances_v2(&self) -> Option<&dyn InstancesV2> {
            Some(self)
        }
    }

    #[tokio::test]
    async fn a_batch_of_the_wrong_length_is_an_error_for_every_node_never_gone() {
        let instances = instances_of(&ShortBatches).unwrap();
        let cx = CallContext::with_timeout(Duration::from_secs(5));
        let nodes = [
            std::sync::Arc::new(node("a", None)),
            std::sync::Arc::new(node("b", None)),
        ];
        let answers = instances.instance_exists_batch(&cx, &nodes).await;
        assert_eq!(answers.len(), 2);
        assert!(answers.iter().all(Result::is_err), "{answers:?}");
    }
}
