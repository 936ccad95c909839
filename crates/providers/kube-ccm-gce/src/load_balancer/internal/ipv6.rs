//! The IPv6 side of a dual-stack internal load balancer, as ingress-gce makes it beside an IPv4 one, on
//! upstream's names:
//!
//! | object | name |
//! |---|---|
//! | forwarding rule (`INTERNAL`, `ipVersion: IPV6`, the IPv4 rule's backend service, ports and subnet) | `<lb>-ipv6` |
//! | firewall for clients (the IPv6 ranges of `loadBalancerSourceRanges`, else `::/0`) | `k8s-fw-<lb>-ipv6` |
//! | firewall for health checks ([`HEALTH_CHECK_RANGE_IPV6`]) | `<health check>-hc-ipv6` |
//!
//! It is made when `spec.ipFamilies` has IPv6, after the IPv4 rule (which always exists: the service's
//! other parts hang on it), in the IPv4 rule's subnet. That subnet needs an internal IPv6 range
//! (`ipv6AccessType: INTERNAL`); the provider reads it before asking. Without one, a service that insists
//! (`RequireDualStack`, or IPv6 alone) gets an error naming the subnet and the annotation that picks
//! another; a `PreferDualStack` one stays IPv4, logged. Compute gives the rule a `/96` of the range,
//! written in that CIDR form; its first address is the service's. The rule is made again (keeping its
//! address while the subnet stays) when the IPv4 rule is for what they share (backend service, protocol,
//! ports, global access), and taken down with the clients' firewall when the service drops IPv6 or its
//! load balancer is deleted, always before the backend service both rules use. The health checks' IPv6
//! firewall goes with its health check, which other load balancers may share.

use google_cloud_compute_v1::model::{self, ForwardingRule};
use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::CloudError;
use kube_ccm_provider::service::{
    IpFamily, IpFamilyPolicy, ip_families, ip_family_policy, requested_source_ranges,
};

use super::super::{firewall_description, found};
use super::{InternalPlan, rules_equal, wanted_rule};
use crate::GceProvider;
use crate::client::Attributed as _;

/// Google's health checkers' IPv6 range for passthrough load balancers.
pub const HEALTH_CHECK_RANGE_IPV6: &str = "2600:2d00:1:b029::/64";

/// The IPv6 forwarding rule of the load balancer `lb`.
pub fn rule_name(lb: &str) -> String {
    format!("{lb}-ipv6")
}

/// Whether the service asks for IPv6.
pub(crate) fn wants_ipv6(service: &Service) -> bool {
    ip_families(service).contains(&IpFamily::Ipv6)
}

/// Whether the service's status lists an IPv6 address (its load balancer had one).
fn status_has_ipv6(service: &Service) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref())
        .any(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
}

/// Whether a subnet without an IPv6 range is an error rather than an IPv4-only load balancer.
fn insists(service: &Service) -> bool {
    ip_family_policy(service) == IpFamilyPolicy::RequireDualStack || ip_families(service) == [IpFamily::Ipv6]
}

/// An IPv6 forwarding rule's address: its `IPAddress` without the `/96` Compute writes.
pub(crate) fn rule_address(rule: &ForwardingRule) -> Option<String> {
    let ip = rule.ip_address.as_deref()?;
    Some(ip.split('/').next().unwrap_or(ip).to_owned()).filter(|ip| !ip.is_empty())
}

/// The clients' IPv6 ranges: the IPv6 ones of `loadBalancerSourceRanges`, every address without them;
/// none when only IPv4 ranges are given (no IPv6 client is let in).
fn client_ranges(service: &Service) -> Result<Vec<String>, CloudError> {
    Ok(match requested_source_ranges(service)? {
        None => vec!["::/0".to_owned()],
        Some(ranges) => ranges
            .iter()
            .filter(|r| !r.is_ipv4())
            .map(ToString::to_string)
            .collect(),
    })
}

/// The IPv6 rule as an ensure found it, and whether the ensure has deleted it since (the IPv4 rule was
/// made again): its address is kept all the same.
#[derive(Debug, Default)]
pub(super) struct Ipv6Before {
    pub(super) rule: Option<ForwardingRule>,
    pub(super) deleted: bool,
}

impl GceProvider {
    /// Whether the subnet at `link` has an internal IPv6 range.
    async fn has_internal_ipv6(&self, link: &str) -> Result<bool, CloudError> {
        let path = super::super::link_path(link);
        let (region, name) = match path.split('/').collect::<Vec<_>>().as_slice() {
            ["projects", _, "regions", region, "subnetworks", name] => {
                ((*region).to_owned(), (*name).to_owned())
            }
            _ => {
                return Err(CloudError::provider(format!(
                    "{link:?} is not a subnetwork's link"
                )));
            }
        };
        let project = path.split('/').nth(1).unwrap_or_default().to_owned();
        let subnet = found(
            self.clients
                .subnetworks
                .get()
                .set_project(project)
                .set_region(region)
                .set_subnetwork(name)
                .attributed()
                .send()
                .await,
            "subnetworks.get",
        )?;
        Ok(subnet.is_some_and(|s| {
            s.ipv_6_access_type.as_ref().and_then(|t| t.name()) == Some("INTERNAL")
                && s.internal_ipv_6_prefix.as_deref().is_some_and(|p| !p.is_empty())
        }))
    }

    /// The IPv6 rule and its firewalls for `service`, or their removal when it does not ask for IPv6 (or
    /// may do without); the rule's address. `subnet` is the IPv4 rule's.
    pub(super) async fn ensure_internal_ipv6(
        &self,
        plan: &InternalPlan,
        service: &Service,
        subnet: Option<&str>,
        tags: Vec<String>,
        before: Ipv6Before,
    ) -> Result<Option<String>, CloudError> {
        let name = rule_name(&plan.name);
        let existing = before.rule.as_ref().filter(|_| !before.deleted);
        // The firewall may outlive its rule (a delete cut short): a status with an IPv6 address says so.
        let had_ipv6 = before.rule.is_some() || status_has_ipv6(service);
        if !wants_ipv6(service) {
            if had_ipv6 {
                self.delete_internal_ipv6(plan).await?;
            }
            return Ok(None);
        }
        let subnet = subnet.ok_or_else(|| {
            CloudError::provider(format!("forwarding rule {} has no subnetwork", plan.name))
        })?;
        if !self.has_internal_ipv6(subnet).await? {
            let why = format!(
                "subnetwork {} has no internal IPv6 range for the IPv6 forwarding rule; name one that has with the annotation {}",
                super::super::link_path(subnet),
                super::ANNOTATION_SUBNET
            );
            if insists(service) {
                return Err(CloudError::provider(why));
            }
            tracing::info!(service = %plan.service, %why, "gce: the internal load balancer stays IPv4");
            if had_ipv6 {
                self.delete_internal_ipv6(plan).await?;
            }
            return Ok(None);
        }
        // The rule keeps its address while its subnet stays.
        let keep = before
            .rule
            .as_ref()
            .filter(|r| r.subnetwork.as_deref() == Some(subnet))
            .and_then(rule_address);
        let mut wanted = wanted_rule(
            plan,
            keep.as_deref(),
            &self.backend_service_url(&plan.backend_service),
            Some(subnet),
            &self.network_url()?,
        );
        wanted.name = Some(name.clone());
        wanted.ip_version = Some(model::forwarding_rule::IpVersion::from("IPV6"));
        let unchanged = existing.is_some_and(|r| rules_equal(r, &wanted));
        if existing.is_some() && !unchanged {
            self.delete_rule(&name).await?;
        }
        if !unchanged {
            self.insert_rule(wanted).await?;
        }
        let made = match existing.filter(|_| unchanged) {
            Some(rule) => Some(rule.clone()),
            None => self.get_rule(&name).await?,
        };
        let ip = made
            .as_ref()
            .and_then(rule_address)
            .ok_or_else(|| CloudError::provider(format!("forwarding rule {name} has no IP")))?;
        self.ensure_internal_ipv6_firewalls(plan, service, &ip, tags)
            .await?;
        Ok(Some(ip))
    }

    /// The IPv6 clients' firewall (none when no IPv6 client is let in) and the health checkers' one.
    async fn ensure_internal_ipv6_firewalls(
        &self,
        plan: &InternalPlan,
        service: &Service,
        ip: &str,
        tags: Vec<String>,
    ) -> Result<(), CloudError> {
        let name = rule_name(&plan.name);
        let clients = client_ranges(service)?;
        let firewall = format!("k8s-fw-{name}");
        if clients.is_empty() {
            if self.get_firewall(&firewall).await?.is_some() {
                self.delete_firewall(&firewall).await?;
            }
        } else {
            let traffic = self.firewall(
                firewall,
                firewall_description(&plan.service, ip),
                clients,
                Some(ip),
                (&plan.protocol, plan.firewall_ports.clone()),
                tags.clone(),
            )?;
            self.ensure_firewall(traffic).await?;
        }
        let checks = self.firewall(
            format!("{}-ipv6", plan.health_check_firewall()),
            String::new(),
            vec![HEALTH_CHECK_RANGE_IPV6.to_owned()],
            None,
            ("TCP", vec![plan.health_check.1.to_string()]),
            tags,
        )?;
        self.ensure_firewall(checks).await?;
        Ok(())
    }

    /// The IPv6 rule and the clients' IPv6 firewall, gone (the health checks' one goes with its health
    /// check, which other load balancers may share).
    pub(super) async fn delete_internal_ipv6(&self, plan: &InternalPlan) -> Result<(), CloudError> {
        self.delete_internal_ipv6_named(&plan.name).await
    }

    /// [`Self::delete_internal_ipv6`] for the load balancer `lb`.
    pub(super) async fn delete_internal_ipv6_named(&self, lb: &str) -> Result<(), CloudError> {
        let name = rule_name(lb);
        self.delete_rule(&name).await?;
        self.delete_firewall(&format!("k8s-fw-{name}")).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(spec: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "db"}, "spec": spec})).unwrap()
    }

    #[test]
    fn families_policy_and_ranges() {
        let dual =
            service(serde_json::json!({"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack"}));
        assert!(wants_ipv6(&dual) && !insists(&dual));
        let required = service(
            serde_json::json!({"ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack"}),
        );
        assert!(wants_ipv6(&required) && insists(&required));
        let alone = service(serde_json::json!({"ipFamilies": ["IPv6"]}));
        assert!(insists(&alone));
        assert!(!wants_ipv6(&service(serde_json::json!({}))));
        assert_eq!(client_ranges(&dual).unwrap(), ["::/0"]);
        let ranged = service(serde_json::json!({"loadBalancerSourceRanges": ["10.0.0.0/8", "fd00:1::/64"]}));
        assert_eq!(client_ranges(&ranged).unwrap(), ["fd00:1::/64"]);
        let v4 = service(serde_json::json!({"loadBalancerSourceRanges": ["10.0.0.0/8"]}));
        assert!(client_ranges(&v4).unwrap().is_empty());
        let mut rule = ForwardingRule::default();
        rule.ip_address = Some("fd20:1:2:3:0:7::/96".into());
        assert_eq!(rule_address(&rule).as_deref(), Some("fd20:1:2:3:0:7::"));
    }
}
