//! Instances: what the node controllers ask the cloud.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::CloudError;

/// What the cloud says about a node's instance.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceMetadata {
    /// `<provider>://<instance>`; empty when the provider cannot tell (the node then stays tainted unless
    /// it already has one).
    pub provider_id: String,
    /// Instance type, e.g. `m5.large`.
    pub instance_type: String,
    /// Addresses (`InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS`, `ExternalDNS`).
    pub node_addresses: Vec<NodeAddress>,
    /// Zone.
    pub zone: String,
    /// Region.
    pub region: String,
    /// More labels; keys under `kubernetes.io/` or `k8s.io/` are dropped, existing labels are not
    /// overwritten.
    pub additional_labels: BTreeMap<String, String>,
}

/// Instance look-ups by node (upstream's `InstancesV2`). Implementations should use `spec.providerID` when
/// the node has one and fall back to the node name.
///
/// The `*_batch` methods answer many nodes at once; their defaults call the single forms concurrently.
/// Override them when the cloud has a batch API: the controllers always call the batch forms.
#[async_trait]
pub trait InstancesV2: Send + Sync {
    /// Whether the instance exists. `false` gets the node deleted; stopped instances exist.
    async fn instance_exists(&self, node: &Node) -> Result<bool, CloudError>;

    /// Whether the instance is shut down (it keeps its node, with the shutdown taint).
    async fn instance_shutdown(&self, node: &Node) -> Result<bool, CloudError>;

    /// Everything the cloud-node controller needs to initialise the node.
    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, CloudError>;

    /// [`InstancesV2::instance_exists`] for many nodes; one result per node, in order.
    async fn instance_exists_batch(&self, nodes: &[Arc<Node>]) -> Vec<Result<bool, CloudError>> {
        futures::future::join_all(nodes.iter().map(|node| self.instance_exists(node))).await
    }

    /// [`InstancesV2::instance_shutdown`] for many nodes; one result per node, in order.
    async fn instance_shutdown_batch(&self, nodes: &[Arc<Node>]) -> Vec<Result<bool, CloudError>> {
        futures::future::join_all(nodes.iter().map(|node| self.instance_shutdown(node))).await
    }

    /// [`InstancesV2::instance_metadata`] for many nodes; one result per node, in order.
    async fn instance_metadata_batch(
        &self,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        futures::future::join_all(nodes.iter().map(|node| self.instance_metadata(node))).await
    }
}
