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

/// A cloud's routes (upstream's `Routes`). The route controller lists them every period, creates the
/// missing ones and deletes those of nodes that are gone; creating a route the cloud holds already must not
/// make a second.
///
/// # Example
///
/// ```
/// use std::sync::Mutex;
/// use std::time::Duration;
///
/// use async_trait::async_trait;
/// use kube_ccm_provider::{CallContext, CloudError, Route, Routes};
///
/// #[derive(Default)]
/// struct Table(Mutex<Vec<Route>>);
///
/// #[async_trait]
/// impl Routes for Table {
///     async fn list_routes(&self, _cx: &CallContext, _cluster: &str) -> Result<Vec<Route>, CloudError> {
///         Ok(self.0.lock().unwrap().clone())
///     }
///
///     async fn create_route(
///         &self, _cx: &CallContext, _cluster: &str, name_hint: &str, route: &Route,
///     ) -> Result<(), CloudError> {
///         let mut table = self.0.lock().unwrap();
///         if !table.iter().any(|r| r.destination_cidr == route.destination_cidr) {
///             table.push(Route { name: name_hint.to_owned(), ..route.clone() });
///         }
///         Ok(())
///     }
///
///     async fn delete_route(&self, _cx: &CallContext, _cluster: &str, route: &Route) -> Result<(), CloudError> {
///         self.0.lock().unwrap().retain(|r| r.destination_cidr != route.destination_cidr);
///         Ok(())
///     }
/// }
///
/// let (table, cx) = (Table::default(), CallContext::with_timeout(Duration::from_secs(5)));
/// let route = Route { target_node: "n1".into(), destination_cidr: "10.244.1.0/24".into(), ..Route::default() };
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// runtime.block_on(table.create_route(&cx, "k", "uid-1", &route)).unwrap();
/// runtime.block_on(table.create_route(&cx, "k", "uid-1", &route)).unwrap();
/// assert_eq!(runtime.block_on(table.list_routes(&cx, "k")).unwrap().len(), 1);
/// runtime.block_on(table.delete_route(&cx, "k", &route)).unwrap();
/// assert!(runtime.block_on(table.list_routes(&cx, "k")).unwrap().is_empty());
/// ```
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
