//! Load balancers for `type: LoadBalancer` services.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use crate::{CallContext, CloudError, LoadBalancerClasses, Refused};

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

/// Whether `name` is one [`default_load_balancer_name`] gives a service with a whole UID: `a` and 31 hex
/// digits. A provider listing its load balancers for the orphan sweep keeps to these, so another tool's
/// (the AWS Load Balancer Controller's `k8s-…`) is never taken for a service's.
pub fn is_default_load_balancer_name(name: &str) -> bool {
    name.len() == 32
        && name
            .strip_prefix('a')
            .is_some_and(|uid| uid.chars().all(|c| c.is_ascii_hexdigit()))
}

/// A load balancer the cloud holds for this cluster, found by [`LoadBalancer::list_load_balancers`] for
/// the orphan sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterLoadBalancer {
    /// The name [`LoadBalancer::load_balancer_name`] gave it: the sweep keeps it while a service of the
    /// cluster still maps to this name. Empty for a leftover part whose load balancer's name the cloud
    /// cannot tell (a target group whose load balancer is gone): the sweep keeps that while `service`
    /// exists, and always when `service` is `None`.
    pub name: String,
    /// `namespace/name` of the service it was made for, when the cloud records it (a tag, a
    /// description): the sweep reads that service before deleting, and records its Events on it.
    pub service: Option<String>,
    /// The cloud's identifiers of what was found for it (load balancer, target groups, security groups,
    /// forwarding rules, …), for the provider's delete and for the log. A half-made or half-deleted load
    /// balancer lists only the parts that are left.
    pub parts: Vec<String>,
}

impl ClusterLoadBalancer {
    /// What tells it from the others: its name, or for a leftover part without one, the parts.
    pub fn key(&self) -> String {
        if self.name.is_empty() {
            self.parts.join(",")
        } else {
            self.name.clone()
        }
    }
}

/// A cloud's load balancers (upstream's `LoadBalancer`). Every method must be idempotent: a call abandoned
/// at its deadline is made again, perhaps by another process.
///
/// # Example
///
/// Load balancers kept in a map, named as upstream names them (so a new process finds the one an old one
/// made): ensure makes or updates, and changes nothing when nothing changed; delete of a missing one is
/// done already.
///
/// ```
/// use std::collections::BTreeMap;
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
///
/// use async_trait::async_trait;
/// use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
/// use kube_ccm_provider::{CallContext, CloudError, LoadBalancer};
///
/// #[derive(Default)]
/// struct Balancers(Mutex<BTreeMap<String, Vec<String>>>);
///
/// fn status() -> LoadBalancerStatus {
///     let ingress = LoadBalancerIngress { ip: Some("203.0.113.10".into()), ..Default::default() };
///     LoadBalancerStatus { ingress: Some(vec![ingress]) }
/// }
///
/// #[async_trait]
/// impl LoadBalancer for Balancers {
///     async fn get_load_balancer(
///         &self, _cx: &CallContext, cluster: &str, service: &Service,
///     ) -> Result<Option<LoadBalancerStatus>, CloudError> {
///         let name = self.load_balancer_name(cluster, service);
///         Ok(self.0.lock().unwrap().contains_key(&name).then(status))
///     }
///
///     async fn ensure_load_balancer(
///         &self, cx: &CallContext, cluster: &str, service: &Service, nodes: &[Arc<Node>],
///     ) -> Result<LoadBalancerStatus, CloudError> {
///         self.update_load_balancer(cx, cluster, service, nodes).await?;
///         Ok(status())
///     }
///
///     async fn update_load_balancer(
///         &self, _cx: &CallContext, cluster: &str, service: &Service, nodes: &[Arc<Node>],
///     ) -> Result<(), CloudError> {
///         let wanted: Vec<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
///         let name = self.load_balancer_name(cluster, service);
///         let mut held = self.0.lock().unwrap();
///         if held.get(&name) != Some(&wanted) {
///             held.insert(name, wanted); // the only write, and only when something changed
///         }
///         Ok(())
///     }
///
///     async fn ensure_load_balancer_deleted(
///         &self, _cx: &CallContext, cluster: &str, service: &Service,
///     ) -> Result<(), CloudError> {
///         self.0.lock().unwrap().remove(&self.load_balancer_name(cluster, service));
///         Ok(())
///     }
/// }
///
/// let service: Service = serde_json::from_value(serde_json::json!({
///     "metadata": {"name": "web", "uid": "5a1f-77"}, "spec": {"type": "LoadBalancer"},
/// })).unwrap();
/// let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).unwrap();
/// let (balancers, cx) = (Balancers::default(), CallContext::with_timeout(Duration::from_secs(5)));
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// for _ in 0..2 {
///     let made = runtime.block_on(balancers.ensure_load_balancer(&cx, "k", &service, &[Arc::new(node.clone())]));
///     assert_eq!(made.unwrap(), status());
/// }
/// assert_eq!(balancers.0.lock().unwrap().len(), 1, "ensured twice, one load balancer");
/// runtime.block_on(balancers.ensure_load_balancer_deleted(&cx, "k", &service)).unwrap();
/// runtime.block_on(balancers.ensure_load_balancer_deleted(&cx, "k", &service)).unwrap();
/// assert!(runtime.block_on(balancers.get_load_balancer(&cx, "k", &service)).unwrap().is_none());
/// ```
#[async_trait]
pub trait LoadBalancer: Send + Sync {
    /// The load balancer's status, or `None` when it does not exist.
    async fn get_load_balancer(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, CloudError>;

    /// The services this provider makes load balancers for, by `spec.loadBalancerClass`: asked once when
    /// the service controller starts. The default, services without a class, is upstream's. Services of
    /// any other class are never handed to the provider, and the controller writes neither their status
    /// nor their finalizer, so two managers serving different classes share a cluster. (A service that
    /// leaves type LoadBalancer loses its class; the one recorded with the finalizer,
    /// [`ANNOTATION_LOAD_BALANCER_CLASS`](crate::names::ANNOTATION_LOAD_BALANCER_CLASS), says whose
    /// clean-up it is.)
    fn classes(&self) -> LoadBalancerClasses {
        LoadBalancerClasses::default()
    }

    /// Whether this cloud's load balancer for `service` serves every IP family the service asks for
    /// ([`service::ip_families`](crate::service::ip_families), in its order); `Err(why)` when it does not.
    /// The service controller then records the Event `IPFamiliesNotServed` (a Warning, unless the
    /// service's policy is `PreferDualStack`) and still asks for the load balancer, which serves what it
    /// can. The default: IPv4 only, as upstream's providers.
    fn check_ip_families(&self, service: &Service) -> Result<(), Refused> {
        let families = crate::service::ip_families(service);
        if families == [crate::service::IpFamily::Ipv4] {
            Ok(())
        } else {
            Err("this cloud's load balancers serve IPv4 only".into())
        }
    }

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

    /// Every load balancer (or part of one) the cloud holds that is *provably this cluster's*: tagged or
    /// named for `cluster_name` as this provider (and upstream's) makes them, grouped by the name
    /// [`LoadBalancer::load_balancer_name`] gave them. Anything whose owner cannot be told must be left
    /// out: the orphan sweep deletes what this lists and no service of the cluster claims. The default,
    /// `NotImplemented`, turns the sweep off for the provider.
    async fn list_load_balancers(
        &self,
        _cx: &CallContext,
        _cluster_name: &str,
    ) -> Result<Vec<ClusterLoadBalancer>, CloudError> {
        Err(CloudError::NotImplemented)
    }

    /// Deletes `load_balancer` (found by [`LoadBalancer::list_load_balancers`]) and every part of it;
    /// `Ok` when it is already gone. Called only once no service claims it.
    async fn delete_load_balancer(
        &self,
        _cx: &CallContext,
        _cluster_name: &str,
        _load_balancer: &ClusterLoadBalancer,
    ) -> Result<(), CloudError> {
        Err(CloudError::NotImplemented)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_default_names_are_default_names() {
        assert!(is_default_load_balancer_name("a0a1b2c3d4e5f60718293a4b5c6d7e8f"));
        assert!(
            !is_default_load_balancer_name("a0a1b2c3d4e5f60718293a4b5c6d7e8"),
            "31 characters"
        );
        assert!(!is_default_load_balancer_name("k8s-default-web-0123456789abcdef"));
        assert!(!is_default_load_balancer_name("b0a1b2c3d4e5f60718293a4b5c6d7e8f"));
        assert!(!is_default_load_balancer_name("a0a1b2c3d4e5f60718293a4b5c6d7e8g"));
    }

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
