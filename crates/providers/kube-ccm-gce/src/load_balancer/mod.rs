//! Load balancers for `type: LoadBalancer` services: which services this provider serves, the pieces the
//! external and internal kinds share (firewalls, health checks, addresses, forwarding rules), and the
//! [`LoadBalancer`] implementation that sends each service to its kind.
//!
//! - [`external`]: upstream's target-pool based external network load balancer.
//! - [`internal`]: upstream's internal load balancer (regional backend service over the cluster's
//!   [`instance_groups`]), for `networking.gke.io/load-balancer-type: Internal` (or the deprecated
//!   `cloud.google.com/load-balancer-type`, or the class `networking.gke.io/l4-regional-internal-legacy`).
//! - [`firewall`]: firewalls, compared as Compute returns them, and the nodes' target tags.
//! - [`health_check`]: upstream's health checks, shared per cluster or per service.
//! - `orphans.rs`: the cluster's load balancers, claimed through links to parts named for the cluster ID,
//!   for the framework's orphan sweep.
//!
//! The provider serves services without a class and upstream's two legacy classes
//! ([`LoadBalancer::classes`]); the framework hands it no other class. Services for other implementations
//! (`cloud.google.com/l4-rbs: enabled`, or another class if one were handed over) are
//! `ImplementedElsewhere`. A service that changes kind has the
//! other kind's load balancer taken down by its next ensure.

pub mod external;
pub mod firewall;
pub mod health_check;
pub mod instance_groups;
pub mod internal;
mod orphans;

use std::sync::Arc;

use async_trait::async_trait;
use google_cloud_compute_v1::model::{self, Address, ForwardingRule};
use google_cloud_lro::Poller;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kube_ccm_provider::service::{self, IpFamily, annotation, load_balancer_class, service_key};
use kube_ccm_provider::{
    CallContext, CloudError, ClusterLoadBalancer, LoadBalancer, LoadBalancerClasses, Refused,
    default_load_balancer_name,
};

use crate::client::Attributed as _;
use crate::instances::{InstanceRef, Lookup};
use crate::{GceProvider, WriteError, gce_error, is_not_found, last_component};

/// The internal-load-balancer annotation, and its deprecated form.
pub const ANNOTATION_LOAD_BALANCER_TYPE: &str = "networking.gke.io/load-balancer-type";
/// Deprecated form of [`ANNOTATION_LOAD_BALANCER_TYPE`].
pub const ANNOTATION_LOAD_BALANCER_TYPE_DEPRECATED: &str = "cloud.google.com/load-balancer-type";
/// `Standard` or `Premium` (the default).
pub const ANNOTATION_NETWORK_TIER: &str = "cloud.google.com/network-tier";
/// `enabled`: a backend-service based load balancer, made by another controller.
pub const ANNOTATION_RBS: &str = "cloud.google.com/l4-rbs";
/// Upstream's legacy external class: the external network load balancer, as for a service without a
/// class.
pub const CLASS_LEGACY_EXTERNAL: &str = "networking.gke.io/l4-regional-external-legacy";
/// Upstream's legacy internal class: the internal load balancer, as the annotation asks for it.
pub const CLASS_LEGACY_INTERNAL: &str = "networking.gke.io/l4-regional-internal-legacy";
/// The ConfigMap holding the cluster ID (namespace `kube-system`).
pub const CLUSTER_ID_CONFIG_MAP: &str = "ingress-uid";

/// An ingress for `ip`. Both kinds pass the connection through to the nodes with the client's address:
/// kube-proxy may short-cut the address in the cluster (`ipMode: VIP`).
fn passthrough_ingress(ip: String) -> LoadBalancerIngress {
    LoadBalancerIngress {
        ip: Some(ip),
        ip_mode: Some("VIP".to_owned()),
        ..LoadBalancerIngress::default()
    }
}

/// The status of a load balancer at `ip`.
pub(super) fn passthrough(ip: String) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![passthrough_ingress(ip)]),
    }
}

/// The status of a load balancer at `ipv4` and `ipv6`: the service's families first, in its order, then
/// the IPv4 address when the service asked for IPv6 alone (the IPv4 rule exists all the same).
pub(super) fn passthrough_status(
    service: &Service,
    ipv4: Option<String>,
    ipv6: Option<String>,
) -> LoadBalancerStatus {
    let (mut ipv4, mut ipv6) = (ipv4, ipv6);
    let mut ingress = Vec::new();
    for family in service::ip_families(service) {
        let ip = match family {
            IpFamily::Ipv4 => ipv4.take(),
            IpFamily::Ipv6 => ipv6.take(),
        };
        ingress.extend(ip.map(passthrough_ingress));
    }
    ingress.extend(ipv4.map(passthrough_ingress));
    LoadBalancerStatus {
        ingress: Some(ingress).filter(|i| !i.is_empty()),
    }
}

/// Services without a class, and the legacy classes.
fn served_classes() -> LoadBalancerClasses {
    LoadBalancerClasses::new(true, [CLASS_LEGACY_EXTERNAL, CLASS_LEGACY_INTERNAL]).unwrap_or_default()
}

/// [`LoadBalancer::check_ip_families`]: target pools serve IPv4 only (Compute refuses an IPv6 rule that
/// sends to one); an internal load balancer's IPv6 rule sends to its backend service.
fn check_ip_families(service: &Service) -> Result<(), Refused> {
    if service::ip_families(service) == [IpFamily::Ipv4]
        || implemented_elsewhere(service)
        || wants_internal(service)
    {
        return Ok(());
    }
    Err(format!(
        "GCE's external network load balancer sends to a target pool, which serves IPv4 only; an internal load balancer ({ANNOTATION_LOAD_BALANCER_TYPE}: Internal) serves IPv6 too, and so does ingress-gce's backend-service load balancer ({ANNOTATION_RBS}: enabled)"
    )
    .into())
}

/// Whether another implementation owns the service's load balancer.
pub(super) fn implemented_elsewhere(service: &Service) -> bool {
    matches!(load_balancer_class(service), Some(c) if c != CLASS_LEGACY_EXTERNAL && c != CLASS_LEGACY_INTERNAL)
        || annotation(service, ANNOTATION_RBS) == Some("enabled")
}

/// Whether the service asks for an internal load balancer.
pub(super) fn wants_internal(service: &Service) -> bool {
    if let Some(class) = load_balancer_class(service) {
        return class == CLASS_LEGACY_INTERNAL;
    }
    annotation(service, ANNOTATION_LOAD_BALANCER_TYPE)
        .or_else(|| annotation(service, ANNOTATION_LOAD_BALANCER_TYPE_DEPRECATED))
        .is_some_and(|t| t.eq_ignore_ascii_case("internal"))
}

/// `{"kubernetes.io/service-name":"ns/name"}`, as upstream writes it.
pub(super) fn service_description(service: &Service) -> String {
    format!("{{\"kubernetes.io/service-name\":\"{}\"}}", service_key(service))
}

/// A firewall's description, so it says whose it is: upstream's (space included),
/// `{"kubernetes.io/service-name":"ns/name", "kubernetes.io/service-ip":"IP"}`.
pub(super) fn firewall_description(service: &str, ip: &str) -> String {
    format!("{{\"kubernetes.io/service-name\":\"{service}\", \"kubernetes.io/service-ip\":\"{ip}\"}}")
}

/// `Ok(None)` for a 404.
pub(super) fn found<T>(
    result: Result<T, google_cloud_gax::error::Error>,
    what: &str,
) -> Result<Option<T>, CloudError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) if is_not_found(&error) => Ok(None),
        Err(error) => Err(gce_error(what, error)),
    }
}

/// A write awaited; 404 is done (for deletes).
pub(super) fn deleted(result: Result<(), WriteError>, what: &str) -> Result<(), CloudError> {
    match result {
        Err(error) if error.is_not_found() => Ok(()),
        other => other.map_err(|e| e.into_cloud(what)),
    }
}

/// A write awaited; 409 is done (for inserts).
pub(super) fn inserted(result: Result<(), WriteError>, what: &str) -> Result<bool, CloudError> {
    match result {
        Ok(()) => Ok(true),
        Err(error) if error.is_conflict() => Ok(false),
        Err(error) => Err(error.into_cloud(what)),
    }
}

/// Whether a forwarding rule is an internal load balancer's (`loadBalancingScheme: INTERNAL`).
pub(super) fn is_internal_rule(rule: &ForwardingRule) -> bool {
    rule.load_balancing_scheme
        .as_ref()
        .and_then(|s| s.name())
        .is_some_and(|s| s.eq_ignore_ascii_case(internal::SCHEME_INTERNAL))
}

/// Compares `projects/…` paths of links.
pub(super) fn link_path(link: &str) -> &str {
    link.find("projects/").map_or(link, |at| &link[at..])
}

impl GceProvider {
    pub(super) fn region(&self) -> String {
        self.config.region().expect("validated with the configuration")
    }

    pub(super) fn project(&self) -> &str {
        &self.config.project_id
    }

    pub(super) fn network_url(&self) -> Result<String, CloudError> {
        let path = self.config.network_path().ok_or_else(|| {
            CloudError::provider(
                "load balancers need network-name in the cloud-config ([global] network-name)",
            )
        })?;
        Ok(format!("https://www.googleapis.com/compute/v1/{path}"))
    }

    /// The nodes' instances (`zones/Z/instances/N`) and their network tags; nodes without an instance are
    /// The nodes' instances (`zones/Z/instances/N`) and their network tags; nodes without an instance are
    /// left out (as upstream); none at all is an error.
    pub(super) async fn node_instances(
        &self,
        nodes: &[Arc<Node>],
    ) -> Result<(Vec<String>, Vec<model::Instance>), CloudError> {
        if nodes.is_empty() {
            return Err(CloudError::provider("cannot EnsureLoadBalancer() with no hosts"));
        }
        let refs: Vec<InstanceRef> = nodes.iter().filter_map(|n| self.instance_ref(n).ok()).collect();
        // A node whose instance is absent (or whose name no instance could have) is left out; one whose
        // zone did not answer fails the whole call, so no backend is dropped on an outage.
        let mut instances: Vec<model::Instance> = Vec::new();
        for lookup in self.find(&refs).await? {
            match lookup {
                Lookup::Found(instance) => instances.push(*instance),
                Lookup::Absent | Lookup::Invalid(_) => {}
                Lookup::Unknown(why) => return Err(CloudError::provider(why)),
            }
        }
        if instances.is_empty() {
            return Err(CloudError::InstanceNotFound);
        }
        let links = instances
            .iter()
            .map(|i| {
                format!(
                    "projects/{}/zones/{}/instances/{}",
                    self.project(),
                    last_component(i.zone.as_deref().unwrap_or_default()),
                    i.name.as_deref().unwrap_or_default()
                )
            })
            .collect();
        Ok((links, instances))
    }

    pub(super) async fn get_rule(&self, name: &str) -> Result<Option<ForwardingRule>, CloudError> {
        found(
            self.clients
                .forwarding_rules
                .get()
                .set_project(self.project())
                .set_region(self.region())
                .set_forwarding_rule(name)
                .attributed()
                .send()
                .await,
            "forwardingRules.get",
        )
    }

    /// Makes the forwarding rule `rule`; `false` when one of its name already exists.
    pub(super) async fn insert_rule(&self, rule: ForwardingRule) -> Result<bool, CloudError> {
        let done = self
            .clients
            .forwarding_rules
            .insert()
            .set_project(self.project())
            .set_region(self.region())
            .set_body(rule)
            .attributed()
            .poller()
            .until_done()
            .await;
        inserted(WriteError::check(done), "forwardingRules.insert")
    }

    pub(super) async fn delete_rule(&self, name: &str) -> Result<(), CloudError> {
        let done = self
            .clients
            .forwarding_rules
            .delete()
            .set_project(self.project())
            .set_region(self.region())
            .set_forwarding_rule(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        deleted(WriteError::check(done), "forwardingRules.delete")
    }

    pub(super) async fn get_address(&self, name: &str) -> Result<Option<Address>, CloudError> {
        found(
            self.clients
                .addresses
                .get()
                .set_project(self.project())
                .set_region(self.region())
                .set_address(name)
                .attributed()
                .send()
                .await,
            "addresses.get",
        )
    }

    /// The IP of the reserved address `name` (made just before: its absence is an error).
    pub(super) async fn address_ip(&self, name: &str) -> Result<String, CloudError> {
        self.get_address(name)
            .await?
            .and_then(|a| a.address)
            .ok_or_else(|| CloudError::provider(format!("address {name} has no IP")))
    }

    pub(super) async fn delete_address(&self, name: &str) -> Result<(), CloudError> {
        let done = self
            .clients
            .addresses
            .delete()
            .set_project(self.project())
            .set_region(self.region())
            .set_address(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        deleted(WriteError::check(done), "addresses.delete")
    }
}

#[async_trait]
impl LoadBalancer for GceProvider {
    /// Services without a class and upstream's two legacy classes, which cloud-provider-gcp serves from
    /// its fork of the service controller.
    fn classes(&self) -> LoadBalancerClasses {
        served_classes()
    }

    /// An internal load balancer serves IPv4 and IPv6 (`internal::ipv6`); the external one, on target
    /// pools, IPv4 only.
    fn check_ip_families(&self, service: &Service) -> Result<(), Refused> {
        check_ip_families(service)
    }

    async fn get_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, CloudError> {
        let name = default_load_balancer_name(service);
        let rule = cx.request("forwardingRules.get", self.get_rule(&name)).await?;
        match rule {
            Some(rule) if is_internal_rule(&rule) && internal::ipv6::wants_ipv6(service) => {
                let ipv6 = cx
                    .request(
                        "forwardingRules.get",
                        self.get_rule(&internal::ipv6::rule_name(&name)),
                    )
                    .await?;
                let ipv6 = ipv6.as_ref().and_then(internal::ipv6::rule_address);
                Ok(Some(passthrough_status(service, rule.ip_address, ipv6)))
            }
            Some(rule) => Ok(Some(rule.ip_address.map(passthrough).unwrap_or_default())),
            // As upstream: the finalizer says a delete is not finished (the rule goes second), so the
            // service controller asks for the delete again instead of letting the service go.
            None if internal::has_finalizer(service, internal::FINALIZER_ILB_V1) => {
                Ok(Some(LoadBalancerStatus::default()))
            }
            None => Ok(None),
        }
    }

    async fn ensure_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        if implemented_elsewhere(service) {
            return Err(CloudError::ImplementedElsewhere);
        }
        if wants_internal(service) {
            return cx
                .request(
                    "ensure_internal_load_balancer",
                    self.ensure_internal(service, nodes),
                )
                .await;
        }
        cx.request(
            "ensure_external_load_balancer",
            self.ensure_external(service, nodes),
        )
        .await
    }

    async fn update_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        if implemented_elsewhere(service) {
            return Err(CloudError::ImplementedElsewhere);
        }
        if wants_internal(service) {
            return cx
                .request(
                    "update_internal_load_balancer",
                    self.update_internal(service, nodes),
                )
                .await;
        }
        cx.request(
            "update_external_load_balancer",
            self.update_external(service, nodes),
        )
        .await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<(), CloudError> {
        if implemented_elsewhere(service) {
            return Ok(());
        }
        // The kind the load balancer *is*, as upstream's: a service that left type LoadBalancer has lost
        // its class (the legacy internal one), and may have lost its annotation.
        let internal = wants_internal(service)
            || internal::has_finalizer(service, internal::FINALIZER_ILB_V1)
            || cx
                .request(
                    "forwardingRules.get",
                    self.get_rule(&default_load_balancer_name(service)),
                )
                .await?
                .as_ref()
                .is_some_and(is_internal_rule);
        if internal {
            return cx
                .request("delete_internal_load_balancer", self.delete_internal(service))
                .await;
        }
        cx.request("delete_external_load_balancer", self.delete_external(service))
            .await
    }

    async fn list_load_balancers(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
    ) -> Result<Vec<ClusterLoadBalancer>, CloudError> {
        cx.call("list_load_balancers", self.cluster_load_balancers())
            .await
    }

    async fn delete_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> Result<(), CloudError> {
        cx.request(
            "delete_load_balancer",
            self.delete_cluster_load_balancer(load_balancer),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(spec: serde_json::Value, annotations: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", "annotations": annotations},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn ownership_and_scheme() {
        let classed = service(
            serde_json::json!({"loadBalancerClass": "example.com/lb"}),
            serde_json::json!({}),
        );
        assert!(implemented_elsewhere(&classed));
        let legacy = service(
            serde_json::json!({"loadBalancerClass": CLASS_LEGACY_EXTERNAL}),
            serde_json::json!({}),
        );
        assert!(!implemented_elsewhere(&legacy) && !wants_internal(&legacy));
        let rbs = service(
            serde_json::json!({}),
            serde_json::json!({"cloud.google.com/l4-rbs": "enabled"}),
        );
        assert!(implemented_elsewhere(&rbs));
        let classes = served_classes();
        assert!(
            classes.serves_unclassed()
                && classes.serves_class(Some(CLASS_LEGACY_EXTERNAL))
                && classes.serves_class(Some(CLASS_LEGACY_INTERNAL))
                && !classes.serves_class(Some("example.com/lb"))
        );
        let dual = |annotations| {
            service(
                serde_json::json!({"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"}),
                annotations,
            )
        };
        let why = check_ip_families(&dual(serde_json::json!({})))
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("target pool") && why.contains(ANNOTATION_RBS),
            "{why}"
        );
        check_ip_families(&dual(
            serde_json::json!({ANNOTATION_LOAD_BALANCER_TYPE: "Internal"}),
        ))
        .unwrap();
        check_ip_families(&dual(serde_json::json!({ANNOTATION_RBS: "enabled"}))).unwrap();
        check_ip_families(&service(serde_json::json!({}), serde_json::json!({}))).unwrap();
        let status = passthrough_status(
            &service(
                serde_json::json!({"ipFamilies": ["IPv6", "IPv4"]}),
                serde_json::json!({}),
            ),
            Some("10.0.0.9".into()),
            Some("fd20::9".into()),
        );
        let ips: Vec<_> = status
            .ingress
            .unwrap()
            .into_iter()
            .map(|i| i.ip.unwrap())
            .collect();
        assert_eq!(ips, ["fd20::9", "10.0.0.9"]);
        let alone = passthrough_status(
            &service(serde_json::json!({"ipFamilies": ["IPv6"]}), serde_json::json!({})),
            Some("10.0.0.9".into()),
            None,
        );
        assert_eq!(alone.ingress.unwrap()[0].ip.as_deref(), Some("10.0.0.9"));
        for key in [
            ANNOTATION_LOAD_BALANCER_TYPE,
            ANNOTATION_LOAD_BALANCER_TYPE_DEPRECATED,
        ] {
            for value in ["Internal", "internal"] {
                assert!(wants_internal(&service(
                    serde_json::json!({}),
                    serde_json::json!({key: value})
                )));
            }
        }
    }
}
