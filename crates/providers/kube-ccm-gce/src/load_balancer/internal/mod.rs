//! Internal load balancers (`networking.gke.io/load-balancer-type: Internal`, the deprecated
//! `cloud.google.com/load-balancer-type`, or the class `networking.gke.io/l4-regional-internal-legacy`), as
//! upstream's `ensureInternalLoadBalancer`, with upstream's names so its load balancers are adopted:
//!
//! | object | name |
//! |---|---|
//! | forwarding rule (`INTERNAL`), temporary address | `<lb>`: `a` + the service UID without dashes, 32 characters |
//! | regional backend service | `<lb>`, or shared (`…backend-share: "true"`): `k8s-<cluster ID>-internal-<tcp\|udp>-nmv1-<sha1 of the affinity, 16>` |
//! | instance groups, one per zone | `k8s-ig--<cluster ID>`, shared by every internal load balancer |
//! | health check (global, `HTTP`) | `k8s-<cluster ID>-node` on kube-proxy's `:10256/healthz`, or `<lb>` on the `healthCheckNodePort` (`externalTrafficPolicy: Local`) |
//! | firewall for clients | `k8s-fw-<lb>` |
//! | firewall for health checks | `<health check>-hc` (`--cloud-provider-gce-lb-src-cidrs`) |
//!
//! An ensure: the zones' instance groups hold the nodes' instances; the health check is made or
//! corrected; unless the forwarding rule stays as it is, an address is held under `<lb>` while the rule is
//! made (the requested `loadBalancerIP`, else the rule's current IP when its subnet stays, else a new one)
//! and always released after, as upstream (which holds one on every ensure, so an ensure with nothing to
//! change writes twice there and never here); a
//! forwarding rule that differs (IP, protocol, ports, all-ports, backend service, subnet, global access) is
//! deleted before the backend service changes and made again; the backend service is made or updated
//! (with its fingerprint); the firewalls follow. A backend service or health check the service used before
//! (another name) is deleted at the end. A forwarding rule of the other scheme (an external load balancer
//! the service had) is taken down first.
//!
//! Annotations: `networking.gke.io/internal-load-balancer-subnet` (a subnet of the region; else the
//! cloud-config's `subnetwork-name`), `networking.gke.io/internal-load-balancer-allow-global-access:
//! "true"`, `alpha.cloud.google.com/load-balancer-backend-share: "true"` (or `cloud.google.com/…`).
//!
//! As upstream, the service carries the finalizer `gke.networking.io/l4-ilb-v1` while its internal load
//! balancer exists: added before anything is made, removed once everything is deleted (through the status
//! subresource, with the client of the leading process; a provider used without one, in tests and tools,
//! leaves the service alone). A service upstream gave the finalizer loses it when this provider deletes
//! its load balancer.
//! While it is there the load balancer exists for the service controller, even once the rule is gone (a
//! delete that failed half-way is made again). A service with GKE's newer controller's finalizer
//! (`gke.networking.io/l4-ilb-v2`) and no rule of ours is that controller's. A delete follows what the
//! rule points at (backend service, its health checks), as the spec may have changed since.
//!
//! Not here (upstream has them): the `LoadBalancerPortsError` condition on the service, the `ILBSubsets`
//! and `SkipIGsManagement` gates, nodes filtered by `cloud.google.com/gke-node-pool-subnet`, and legacy
//! (non-VPC) networks.

mod backend_service;
mod finalizer;
pub mod ipv6;
mod plan;

use std::collections::BTreeSet;
use std::sync::Arc;

use google_cloud_compute_v1::model::{self, Address, BackendService, ForwardingRule};
use google_cloud_lro::Poller;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube_ccm_provider::{CloudError, default_load_balancer_name};

pub use self::backend_service::backend_services_equal;
use self::backend_service::backends;
pub use self::plan::{
    ANNOTATION_BACKEND_SHARE, ANNOTATION_BACKEND_SHARE_BETA, ANNOTATION_GLOBAL_ACCESS, ANNOTATION_SUBNET,
    InternalPlan, MAX_RULE_PORTS, plan, shared_backend_service,
};
use super::instance_groups::group_name;
use super::{firewall_description, is_internal_rule, link_path, service_description};
use crate::client::Attributed as _;
use crate::{GceProvider, WriteError, gce_error, last_component};

/// The internal forwarding rule's `loadBalancingScheme`.
pub const SCHEME_INTERNAL: &str = "INTERNAL";
/// Upstream's finalizer on a service with an internal load balancer.
pub const FINALIZER_ILB_V1: &str = "gke.networking.io/l4-ilb-v1";
/// The finalizer of GKE's newer internal load-balancer controller: such a service is not this one's.
pub const FINALIZER_ILB_V2: &str = "gke.networking.io/l4-ilb-v2";

/// Whether the service carries `finalizer`.
pub fn has_finalizer(service: &Service, finalizer: &str) -> bool {
    service
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == finalizer)
}

/// The rule `plan` wants (`backend_service` and `subnet` links, the IP if known).
fn wanted_rule(
    plan: &InternalPlan,
    ip: Option<&str>,
    backend_service: &str,
    subnet: Option<&str>,
    network: &str,
) -> ForwardingRule {
    let mut rule = ForwardingRule::default();
    rule.name = Some(plan.name.clone());
    rule.description = Some(plan.description.clone());
    rule.ip_address = ip.map(str::to_owned);
    rule.ip_protocol = Some(model::forwarding_rule::IPProtocol::from(plan.protocol.as_str()));
    rule.load_balancing_scheme = Some(model::forwarding_rule::LoadBalancingScheme::from(SCHEME_INTERNAL));
    rule.backend_service = Some(backend_service.to_owned());
    if plan.all_ports {
        rule.all_ports = Some(true);
    } else {
        rule.ports = plan.ports.clone();
    }
    rule.subnetwork = subnet.map(str::to_owned);
    rule.network = Some(network.to_owned());
    if plan.global_access {
        rule.allow_global_access = Some(true);
    }
    rule
}

/// Upstream's `forwardingRulesEqual`: IP (unless either is unset; an IPv6 rule's without the `/96`
/// Compute writes), protocol, scheme, ports as a set, all-ports, backend service (by path), global
/// access, subnet (as written), and whether it is IPv6. Network and description are not compared.
pub fn rules_equal(have: &ForwardingRule, want: &ForwardingRule) -> bool {
    let ip = match (ipv6::rule_address(have), ipv6::rule_address(want)) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    // Unset, `IPV4` and `UNSPECIFIED_VERSION` are all an IPv4 rule.
    let version = |r: &ForwardingRule| r.ip_version.as_ref().and_then(|v| v.name()) == Some("IPV6");
    let name = |v: &Option<String>| v.clone().unwrap_or_default();
    let protocol = |r: &ForwardingRule| {
        r.ip_protocol
            .as_ref()
            .and_then(|p| p.name())
            .unwrap_or_default()
            .to_owned()
    };
    let scheme = |r: &ForwardingRule| {
        r.load_balancing_scheme
            .as_ref()
            .and_then(|s| s.name())
            .unwrap_or_default()
            .to_ascii_uppercase()
    };
    let ports = |r: &ForwardingRule| r.ports.iter().cloned().collect::<BTreeSet<String>>();
    let backend = |r: &ForwardingRule| link_path(r.backend_service.as_deref().unwrap_or_default()).to_owned();
    ip && version(have) == version(want)
        && protocol(have) == protocol(want)
        && scheme(have) == scheme(want)
        && ports(have) == ports(want)
        && have.all_ports.unwrap_or(false) == want.all_ports.unwrap_or(false)
        && backend(have) == backend(want)
        && have.allow_global_access.unwrap_or(false) == want.allow_global_access.unwrap_or(false)
        && name(&have.subnetwork) == name(&want.subnetwork)
}

/// The IP the rule is to have (the requested one, else the rule's while its subnet stays), and the
/// rule's IP when the rule stays as it is: no address is held for it then (upstream holds one on every
/// ensure).
fn wanted_ip(
    plan: &InternalPlan,
    rule: Option<&ForwardingRule>,
    subnet: Option<&str>,
    backend_service: &str,
) -> (Option<String>, Option<String>) {
    let ip = plan.requested_ip.clone().or_else(|| {
        rule.filter(|r| r.subnetwork.as_deref().unwrap_or_default() == subnet.unwrap_or_default())
            .and_then(|r| r.ip_address.clone())
    });
    let kept = rule
        .filter(|r| rules_equal(r, &wanted_rule(plan, ip.as_deref(), backend_service, subnet, "")))
        .and_then(|r| r.ip_address.clone());
    (ip, kept)
}

impl GceProvider {
    /// The subnet's link: the annotation's name in this region, else the cloud-config's
    /// `subnetwork-name` (a name or a link); `None` when neither says.
    fn subnet_url(&self, plan: &InternalPlan) -> Option<String> {
        let name = plan
            .subnet
            .clone()
            .or_else(|| Some(self.config.subnetwork_name.trim().to_owned()).filter(|s| !s.is_empty()))?;
        if let Some(at) = name.find("projects/") {
            return Some(format!("https://www.googleapis.com/compute/v1/{}", &name[at..]));
        }
        Some(format!(
            "https://www.googleapis.com/compute/v1/projects/{}/regions/{}/subnetworks/{name}",
            self.config.network_project(),
            self.region()
        ))
    }

    /// Holds the address `plan.name` for the rule to take (`ip`, or a new one when `None`); its IP and
    /// whether the reservation is ours to release. An address of that name with another IP or type is
    /// deleted first; an IP another reservation holds (the user's) is used as it is.
    async fn hold_internal_address(
        &self,
        plan: &InternalPlan,
        service: &Service,
        ip: Option<&str>,
        subnet: Option<&str>,
    ) -> Result<(String, bool), CloudError> {
        if let Some(existing) = self.get_address(&plan.name).await? {
            let internal = existing.address_type.as_ref().and_then(|t| t.name()) == Some("INTERNAL");
            let same_ip = ip.is_none_or(|ip| existing.address.as_deref() == Some(ip));
            if internal && same_ip {
                let held = existing
                    .address
                    .ok_or_else(|| CloudError::provider(format!("address {} has no IP", plan.name)))?;
                return Ok((held, true));
            }
            self.delete_address(&plan.name).await?;
        }
        let mut address = Address::default();
        address.name = Some(plan.name.clone());
        address.description = Some(service_description(service));
        address.address = ip.map(str::to_owned);
        address.address_type = Some(model::address::AddressType::from("INTERNAL"));
        address.subnetwork = subnet.map(str::to_owned);
        let done = self
            .clients
            .addresses
            .insert()
            .set_project(self.project())
            .set_region(self.region())
            .set_body(address)
            .attributed()
            .poller()
            .until_done()
            .await;
        match (WriteError::check(done), ip) {
            (Ok(()), _) => {}
            // Another reservation holds the IP: the user's, kept.
            (Err(error), Some(ip))
                if error.is_conflict() || matches!(error, WriteError::Failed { http: Some(400), .. }) =>
            {
                let reserved = self
                    .clients
                    .addresses
                    .list()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_filter(format!("address = \"{ip}\""))
                    .attributed()
                    .send()
                    .await
                    .map_err(|e| gce_error("addresses.list", e))?;
                let Some(theirs) = reserved.items.first() else {
                    return Err(error.into_cloud("addresses.insert"));
                };
                let ours = theirs.name.as_deref() == Some(plan.name.as_str());
                return Ok((ip.to_owned(), ours));
            }
            (Err(error), _) => return Err(error.into_cloud("addresses.insert")),
        }
        Ok((self.address_ip(&plan.name).await?, true))
    }

    pub(super) async fn ensure_internal(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let cluster_id = self.load_cluster_id().await?;
        let plan = plan(service, &cluster_id)?;
        let (instances, vms) = self.node_instances(nodes).await?;
        let tags = self.target_tags(&vms)?;
        let mut rule = self.get_rule(&plan.name).await?;
        // As upstream: a service GKE's newer controller owns (its finalizer, no rule of ours, not ours
        // before) is its.
        if rule.is_none()
            && !has_finalizer(service, FINALIZER_ILB_V1)
            && has_finalizer(service, FINALIZER_ILB_V2)
        {
            return Err(CloudError::ImplementedElsewhere);
        }
        self.add_ilb_finalizer(service).await?;
        if rule.as_ref().is_some_and(|r| !is_internal_rule(r)) {
            // The service had an external load balancer: it goes first.
            self.delete_external(service).await?;
            rule = None;
        }
        let groups = self
            .ensure_instance_groups(&group_name(&cluster_id), &instances)
            .await?;
        let old_backend = rule
            .as_ref()
            .and_then(|r| r.backend_service.as_deref())
            .map(|link| last_component(link).to_owned());
        let old_backend = match old_backend {
            Some(name) => self.get_backend_service(&name).await?,
            None => None,
        };
        let (hc_name, hc_port) = plan.health_check.clone();
        let hc_description = if plan.local { plan.description.as_str() } else { "" };
        let hc_link = self
            .ensure_internal_health_check(&hc_name, hc_port, hc_description)
            .await?;
        // Without a subnet named (annotation or cloud-config), the one Compute chose for the rule stays
        // (upstream finds the region's subnet at start; a rule compared against none would be remade).
        let subnet = self
            .subnet_url(&plan)
            .or_else(|| rule.as_ref().and_then(|r| r.subnetwork.clone()));
        let (ip, kept) = wanted_ip(
            &plan,
            rule.as_ref(),
            subnet.as_deref(),
            &self.backend_service_url(&plan.backend_service),
        );
        // Read before an address is held, so no error in between leaves it held.
        let mut ipv6_before = ipv6::Ipv6Before {
            rule: self.get_rule(&ipv6::rule_name(&plan.name)).await?,
            deleted: false,
        };
        let (ip, ours) = match kept {
            // An address an earlier ensure held and could not release goes now.
            Some(ip) => (ip, self.get_address(&plan.name).await?.is_some()),
            None => {
                self.hold_internal_address(&plan, service, ip.as_deref(), subnet.as_deref())
                    .await?
            }
        };
        let made = self
            .ensure_internal_with_address(
                &plan,
                (rule, &mut ipv6_before),
                &ip,
                subnet.as_deref(),
                &hc_link,
                &groups,
                tags.clone(),
            )
            .await;
        // The rule holds the IP now (or the ensure failed): the reservation goes, as upstream.
        if ours {
            self.delete_address(&plan.name).await?;
        }
        let (ip, rule_subnet) = made?;
        let ipv6 = self
            .ensure_internal_ipv6(&plan, service, rule_subnet.as_deref(), tags, ipv6_before)
            .await;
        // The IPv4 rule has moved to the new backend service (the IPv6 one with it, or gone): the old
        // one is cleared even when the IPv6 side failed, as a later ensure would not know it.
        self.clear_previous_internal(&plan, old_backend, &cluster_id)
            .await;
        Ok(super::passthrough_status(service, Some(ip), ipv6?))
    }

    /// The rule, backend service and firewalls, with the address held; the rule's IP and subnet. The
    /// IPv6 rule is deleted with the IPv4 one when that is made again.
    #[allow(clippy::too_many_arguments)]
    async fn ensure_internal_with_address(
        &self,
        plan: &InternalPlan,
        (rule, ipv6): (Option<ForwardingRule>, &mut ipv6::Ipv6Before),
        ip: &str,
        subnet: Option<&str>,
        health_check: &str,
        groups: &[String],
        tags: Vec<String>,
    ) -> Result<(String, Option<String>), CloudError> {
        let wanted = wanted_rule(
            plan,
            Some(ip),
            &self.backend_service_url(&plan.backend_service),
            subnet,
            &self.network_url()?,
        );
        let mut rule = rule;
        if let Some(have) = rule.as_ref().filter(|r| !rules_equal(r, &wanted)) {
            // When what changed is shared (backend service, protocol, ports, global access), the IPv6
            // rule goes first and is made again after; an IPv4 address or subnet is the IPv4 rule's own.
            let mut shared = wanted.clone();
            shared.ip_address = None;
            shared.subnetwork.clone_from(&have.subnetwork);
            if ipv6.rule.is_some() && !rules_equal(have, &shared) {
                self.delete_rule(&ipv6::rule_name(&plan.name)).await?;
                ipv6.deleted = true;
            }
            self.delete_rule(&plan.name).await?;
            rule = None;
        }
        self.ensure_backend_service(plan, health_check, groups).await?;
        if rule.is_none() {
            self.insert_rule(wanted).await?;
        }
        let made = self.get_rule(&plan.name).await?;
        let subnet = made.as_ref().and_then(|r| r.subnetwork.clone());
        let ip = made
            .and_then(|r| r.ip_address)
            .ok_or_else(|| CloudError::provider(format!("forwarding rule {} has no IP", plan.name)))?;
        let traffic = self.firewall(
            format!("k8s-fw-{}", plan.name),
            firewall_description(&plan.service, &ip),
            plan.source_ranges.clone(),
            Some(&ip),
            (&plan.protocol, plan.firewall_ports.clone()),
            tags.clone(),
        )?;
        self.ensure_firewall(traffic).await?;
        let checks = self.firewall(
            plan.health_check_firewall(),
            String::new(),
            self.load_balancer_source_ranges(),
            None,
            ("TCP", vec![plan.health_check.1.to_string()]),
            tags,
        )?;
        self.ensure_firewall(checks).await?;
        Ok((ip, subnet))
    }

    /// A backend service, and its health check, the service used before under other names: deleted
    /// (failures only logged, as upstream).
    async fn clear_previous_internal(
        &self,
        plan: &InternalPlan,
        old: Option<BackendService>,
        cluster_id: &str,
    ) {
        let Some(old) = old else {
            return;
        };
        let old_name = old.name.clone().unwrap_or_default();
        if old_name != plan.backend_service
            && let Err(error) = self.delete_backend_service(&old_name).await
        {
            tracing::warn!(%error, backend_service = %old_name, "gce: the previous backend service was not deleted");
        }
        if let [check] = old.health_checks.as_slice() {
            let check = last_component(check).to_owned();
            if check != plan.health_check.0 {
                let shared = check == format!("k8s-{cluster_id}-node");
                tracing::debug!(%check, shared, "gce: deleting the previous health check");
                if let Err(error) = self
                    .delete_internal_health_check(&check, &format!("{check}-hc"))
                    .await
                {
                    tracing::warn!(%error, health_check = %check, "gce: the previous health check was not deleted");
                }
            }
        }
    }

    pub(super) async fn update_internal(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        let cluster_id = self.load_cluster_id().await?;
        let plan = plan(service, &cluster_id)?;
        let (instances, _) = self.node_instances(nodes).await?;
        let groups = self
            .ensure_instance_groups(&group_name(&cluster_id), &instances)
            .await?;
        let mut existing = self
            .get_backend_service(&plan.backend_service)
            .await?
            .ok_or_else(|| {
                CloudError::provider(format!("backend service {} does not exist", plan.backend_service))
            })?;
        let have: BTreeSet<String> = existing
            .backends
            .iter()
            .filter_map(|b| b.group.as_deref())
            .map(|g| link_path(g).to_owned())
            .collect();
        let want: BTreeSet<String> = groups.iter().map(|g| link_path(g).to_owned()).collect();
        if have == want {
            return Ok(());
        }
        existing.backends = backends(&groups);
        self.update_backend_service(&plan.backend_service, existing).await
    }

    pub(super) async fn delete_internal(&self, service: &Service) -> Result<(), CloudError> {
        self.delete_internal_parts(service, true).await
    }

    /// [`Self::delete_internal`]; with `shared: false` the cluster's shared parts (backend service
    /// `k8s-<ID>-internal-…`, health check `k8s-<ID>-node`, instance groups) are left alone (the orphan
    /// sweep's delete: another deleter of shared parts would race the ensures that make them).
    pub(super) async fn delete_internal_parts(
        &self,
        service: &Service,
        shared: bool,
    ) -> Result<(), CloudError> {
        let cluster_id = self.load_cluster_id().await?;
        let name = default_load_balancer_name(service);
        // What the rule points at, when it is still there: the spec may have changed since (traffic
        // policy, backend sharing, type). Else the names the spec gives, as upstream.
        let referenced = match self.get_rule(&name).await? {
            Some(rule) => match rule.backend_service.as_deref().map(last_component) {
                Some(backend) => self.get_backend_service(backend).await?,
                None => None,
            },
            None => None,
        };
        let (backend, checks) = match referenced {
            Some(backend) => (
                backend.name.clone().unwrap_or_else(|| name.clone()),
                backend
                    .health_checks
                    .iter()
                    .map(|c| last_component(c).to_owned())
                    .collect::<Vec<_>>(),
            ),
            None => {
                let backend = plan(service, &cluster_id).map_or_else(|_| name.clone(), |p| p.backend_service);
                let check = if kube_ccm_provider::service::requests_only_local_traffic(service) {
                    name.clone()
                } else {
                    format!("k8s-{cluster_id}-node")
                };
                (backend, vec![check])
            }
        };
        let shared_backend = backend.starts_with(&format!("k8s-{cluster_id}-internal-"));
        let shared_check = format!("k8s-{cluster_id}-node");
        self.delete_address(&name).await?;
        // Both rules use the backend service: they go before it.
        self.delete_internal_ipv6_named(&name).await?;
        self.delete_rule(&name).await?;
        if shared || !shared_backend {
            self.delete_backend_service(&backend).await?;
        }
        self.delete_firewall(&format!("k8s-fw-{name}")).await?;
        self.delete_firewall(&name).await?;
        for check in checks.iter().filter(|c| shared || **c != shared_check) {
            self.delete_internal_health_check(check, &format!("{check}-hc"))
                .await?;
        }
        if shared {
            self.delete_instance_groups(&group_name(&cluster_id)).await?;
        }
        self.remove_ilb_finalizer(service).await
    }
}
