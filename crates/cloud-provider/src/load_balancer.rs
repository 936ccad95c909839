//! Load balancers for `type: LoadBalancer` services.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use crate::{CallContext, CloudError};

/// Upstream's default load-balancer name: `a` + the service UID without dashes, at most 32 characters.
pub fn default_load_balancer_name(service: &Service) -> String {
    let uid: String = service
        .metadata
        .uid
        .as_deref()
        .unwrap_or_default()
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut name = format!("a{uid}");
    name.truncate(32);
    name
}

/// A cloud's load balancers (upstream's `LoadBalancer`). Every method must be idempotent: a call abandoned
/// at its deadline is made again, perhaps by another process.
#[async_trait]
pub trait LoadBalancer: Send + Sync {
    /// The load balancer's status, or `None` when it does not exist.
    async fn get_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, CloudError>;

    /// The name the cloud object has (or will have).
    fn load_balancer_name(&self, _cluster_name: &str, service: &Service) -> String {
        default_load_balancer_name(service)
    }

    /// Creates or updates the load balancer to send the service's traffic to `nodes`.
    async fn ensure_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError>;

    /// Points an existing load balancer at `nodes` (the node set changed).
    async fn update_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError>;

    /// Deletes the load balancer; `Ok` when it is already gone. Must not return `ImplementedElsewhere`.
    async fn ensure_load_balancer_deleted(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<(), CloudError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_name_is_a_plus_uid_without_dashes_truncated() {
        let service: Service = serde_json::from_value(
            serde_json::json!({"metadata": {"uid": "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"}}),
        )
        .unwrap();
        assert_eq!(
            default_load_balancer_name(&service),
            "a0a1b2c3d4e5f60718293a4b5c6d7e8f"
        );
        assert_eq!(default_load_balancer_name(&service).len(), 32);
    }
}
