//! Instances: what the node controllers ask.

use std::sync::Arc;

use kube_ccm::async_trait;
use kube_ccm::k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube_ccm::provider::{
    CallContext, Cidr, CloudError, ClusterStack, InstanceMetadata, InstancesV2, PodCidrs, PodCidrsError,
};

use crate::ExampleCloud;
use crate::cloud::{Instance, State};

// ANCHOR: lookup
/// The node's instance: by provider ID when the node has one, else by name.
fn find<'a>(state: &'a State, node: &Node) -> Option<&'a Instance> {
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    match provider_id.and_then(ExampleCloud::instance_id) {
        Some(id) => state.instances.iter().find(|i| i.id == id),
        None => state
            .instances
            .iter()
            .find(|i| Some(&i.name) == node.metadata.name.as_ref()),
    }
}

/// The node's instance unless it is gone: a terminated instance has no metadata to give.
fn live<'a>(state: &'a State, node: &Node) -> Result<&'a Instance, CloudError> {
    find(state, node)
        .filter(|i| i.state != "terminated")
        .ok_or(CloudError::InstanceNotFound)
}
// ANCHOR_END: lookup

// ANCHOR: instances
#[async_trait]
impl InstancesV2 for ExampleCloud {
    async fn instance_exists(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        let state = cx.guard(self.cloud.read()).await?;
        Ok(find(&state, node).is_some_and(|i| i.state != "terminated"))
    }

    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        let state = cx.guard(self.cloud.read()).await?;
        Ok(find(&state, node).is_some_and(|i| i.state == "stopped"))
    }

    async fn instance_metadata(&self, cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError> {
        let state = cx.guard(self.cloud.read()).await?;
        let instance = live(&state, node)?;
        Ok(metadata(instance, &self.region))
    }

    // One read of the cloud answers every node: override the batch form when your API can.
    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        let state = match cx.guard(self.cloud.read()).await {
            Ok(state) => state,
            Err(error) => {
                let message = error.to_string();
                return nodes
                    .iter()
                    .map(|_| Err(CloudError::provider(message.clone())))
                    .collect();
            }
        };
        nodes
            .iter()
            .map(|node| {
                let instance = live(&state, node)?;
                Ok(metadata(instance, &self.region))
            })
            .collect()
    }
}
// ANCHOR_END: instances

// ANCHOR: pod_cidrs
#[async_trait]
impl PodCidrs for ExampleCloud {
    async fn pod_cidrs(
        &self,
        cx: &CallContext,
        provider_id: &str,
        stack: ClusterStack,
    ) -> Result<Vec<Cidr>, PodCidrsError> {
        let state = cx.guard(self.cloud.read()).await?;
        let id = ExampleCloud::instance_id(provider_id);
        let instance = state
            .instances
            .iter()
            .find(|i| Some(i.id.as_str()) == id && i.state != "terminated")
            .ok_or_else(|| PodCidrsError::InstanceNotFound(provider_id.to_owned()))?;
        let ranges: Vec<Cidr> = instance.pod_cidrs.iter().filter_map(|c| c.parse().ok()).collect();
        if ranges.is_empty() {
            return Err(PodCidrsError::NoRanges("has no pod ranges".to_owned()));
        }
        // One of each family the cluster's stack asks for, in its order.
        stack
            .pick_from(&ranges)
            .ok_or(PodCidrsError::MissingFamily(stack))
    }
}
// ANCHOR_END: pod_cidrs

fn metadata(instance: &Instance, region: &str) -> InstanceMetadata {
    let address = |kind: &str, value: &str| NodeAddress {
        type_: kind.to_owned(),
        address: value.to_owned(),
    };
    InstanceMetadata {
        provider_id: ExampleCloud::provider_id(instance),
        instance_type: instance.instance_type.clone(),
        node_addresses: vec![
            address("InternalIP", &instance.address),
            address("Hostname", &instance.name),
        ],
        zone: instance.zone.clone(),
        region: region.to_owned(),
        additional_labels: [("example.com/instance-id".to_owned(), instance.id.clone())].into(),
    }
}
