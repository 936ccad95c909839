//! Cloud routes for node pod CIDRs.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::NodeAddress;

use crate::{CallContext, CloudError};

/// A route to a node's pod CIDR.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Route {
    /// The cloud's name for it (opaque).
    pub name: String,
    /// The node it sends traffic to: its name, or in a listed route its provider ID (anything containing
    /// `://`) when the cloud knows the instance but not the node's name; the route controller matches that
    /// to the node's `spec.providerID`.
    pub target_node: String,
    /// Whether `target_node_addresses` is meaningful (providers that route by address): a route whose
    /// node's addresses changed is then replaced.
    pub enable_node_addresses: bool,
    /// The node's addresses when the route was made.
    pub target_node_addresses: Vec<NodeAddress>,
    /// The pod CIDR.
    pub destination_cidr: String,
    /// The target is gone; the route drops traffic. Such routes are deleted.
    pub blackhole: bool,
}

/// A cloud's routes (upstream's `Routes`).
#[async_trait]
pub trait Routes: Send + Sync {
    /// Every route of the cluster.
    async fn list_routes(&self, cx: &CallContext, cluster_name: &str) -> Result<Vec<Route>, CloudError>;
    /// Creates a route; `name_hint` is unique (the node's UID).
    async fn create_route(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), CloudError>;
    /// Deletes a route.
    async fn delete_route(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        route: &Route,
    ) -> Result<(), CloudError>;
}
