//! The framework's shared caches of cluster objects, for a provider (upstream's `InformerUser`, whose
//! `SetInformers` hands a provider the controllers' informer factory).
//!
//! The process holds one watch and one cache per kind for all its controllers; a provider reads those
//! instead of opening a second watch of the same objects. The caches start when the first controller (or
//! provider) asks for them, so a standby that leads nothing lists nothing: read them while leading (from
//! [`crate::CloudProvider::start_leading`] on), as upstream's providers read their informers once the
//! controllers started.
//!
//! The objects are the caches' projections, as client-go's informer transforms make them: nodes keep their
//! metadata (name, UID, labels, annotations, taints), provider ID, pod CIDRs, addresses, conditions and node
//! info, not their images or volumes; services are whole but for `managedFields` and the last-applied
//! annotation. They are for reading; a write patches the fields it owns.

use async_trait::async_trait;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, Service};

/// A change seen by a cache.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheEvent<K> {
    /// Added or changed (also every object again after a subscriber fell behind).
    Applied(K),
    /// Deleted: its last cached state.
    Deleted(K),
}

/// The process's shared caches ([`crate::InitializeContext::caches`]).
#[async_trait]
pub trait SharedCaches: Send + Sync {
    /// Waits until the node cache holds the first full list, starting its watch if nothing did yet.
    /// Bound the wait: the API server may be unreachable.
    async fn nodes_synced(&self);
    /// Whether the node cache holds the first full list (its watch is not started by asking).
    fn nodes_ready(&self) -> bool;
    /// The cached node called `name`.
    fn node(&self, name: &str) -> Option<Node>;
    /// Every cached node.
    fn nodes(&self) -> Vec<Node>;
    /// Node changes from now on (to build an index: subscribe, then read [`SharedCaches::nodes`]).
    fn node_events(&self) -> BoxStream<'static, CacheEvent<Node>>;

    /// Waits until the service cache holds the first full list, starting its watch if nothing did yet.
    async fn services_synced(&self);
    /// Whether the service cache holds the first full list.
    fn services_ready(&self) -> bool;
    /// The cached service `namespace/name`.
    fn service(&self, namespace: &str, name: &str) -> Option<Service>;
    /// Every cached service.
    fn services(&self) -> Vec<Service>;
    /// Service changes from now on.
    fn service_events(&self) -> BoxStream<'static, CacheEvent<Service>>;
}

/// Caches with nothing in them, never synced: for a provider initialised outside a manager (its tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCaches;

#[async_trait]
impl SharedCaches for NoCaches {
    async fn nodes_synced(&self) {
        std::future::pending::<()>().await;
    }
    fn nodes_ready(&self) -> bool {
        false
    }
    fn node(&self, _name: &str) -> Option<Node> {
        None
    }
    fn nodes(&self) -> Vec<Node> {
        Vec::new()
    }
    fn node_events(&self) -> BoxStream<'static, CacheEvent<Node>> {
        Box::pin(futures::stream::pending())
    }
    async fn services_synced(&self) {
        std::future::pending::<()>().await;
    }
    fn services_ready(&self) -> bool {
        false
    }
    fn service(&self, _namespace: &str, _name: &str) -> Option<Service> {
        None
    }
    fn services(&self) -> Vec<Service> {
        Vec::new()
    }
    fn service_events(&self) -> BoxStream<'static, CacheEvent<Service>> {
        Box::pin(futures::stream::pending())
    }
}

/// Caches holding fixed objects, synced from the start, that never change: for a provider's tests.
#[derive(Debug, Default, Clone)]
pub struct FixedCaches {
    /// The nodes.
    pub nodes: Vec<Node>,
    /// The services.
    pub services: Vec<Service>,
}

#[async_trait]
impl SharedCaches for FixedCaches {
    async fn nodes_synced(&self) {}
    fn nodes_ready(&self) -> bool {
        true
    }
    fn node(&self, name: &str) -> Option<Node> {
        self.nodes
            .iter()
            .find(|node| node.metadata.name.as_deref() == Some(name))
            .cloned()
    }
    fn nodes(&self) -> Vec<Node> {
        self.nodes.clone()
    }
    fn node_events(&self) -> BoxStream<'static, CacheEvent<Node>> {
        Box::pin(futures::stream::pending())
    }
    async fn services_synced(&self) {}
    fn services_ready(&self) -> bool {
        true
    }
    fn service(&self, namespace: &str, name: &str) -> Option<Service> {
        self.services
            .iter()
            .find(|service| {
                service.metadata.namespace.as_deref() == Some(namespace)
                    && service.metadata.name.as_deref() == Some(name)
            })
            .cloned()
    }
    fn services(&self) -> Vec<Service> {
        self.services.clone()
    }
    fn service_events(&self) -> BoxStream<'static, CacheEvent<Service>> {
        Box::pin(futures::stream::pending())
    }
}
