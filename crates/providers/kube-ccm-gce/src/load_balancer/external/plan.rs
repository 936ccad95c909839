//! What a service wants of its external load balancer, worked out before any request ([`plan`]), and
//! what an ensure changes, worked out from what the cloud holds as fetched ([`actions`],
//! [`instance_changes`]): pure, so each decision is tested without a cloud; the ensure only applies them.

use std::collections::BTreeSet;

use google_cloud_compute_v1::model::{ForwardingRule, TargetPool};
use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::service::{self, annotation, service_key};
use kube_ccm_provider::{CloudError, default_load_balancer_name};

use super::super::health_check::{health_check_of, session_affinity};
use super::super::{ANNOTATION_NETWORK_TIER, link_path, service_description};
use crate::last_component;

/// What a service wants, worked out before any request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The load balancer's name.
    pub name: String,
    /// `ns/name`.
    pub service: String,
    /// `{"kubernetes.io/service-name":"ns/name"}`.
    pub description: String,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// `min-max` of the service's ports.
    pub port_range: String,
    /// The ports, condensed (`80`, `443-445`).
    pub ports: Vec<String>,
    /// Client source ranges.
    pub source_ranges: Vec<String>,
    /// `PREMIUM` or `STANDARD`.
    pub network_tier: String,
    /// `CLIENT_IP` or `NONE`.
    pub session_affinity: String,
    /// The health check's name and port.
    pub health_check: (String, i32),
    /// Whether the health check is the service's own (`externalTrafficPolicy: Local`).
    pub local: bool,
    /// The requested IP, if any.
    pub requested_ip: Option<String>,
}

/// Sorted ports as ranges: `[80, 443, 444, 445]` → `["80", "443-445"]`.
pub fn condensed_ports(ports: &BTreeSet<i32>) -> Vec<String> {
    let mut out = Vec::new();
    let mut ports = ports.iter().copied().peekable();
    while let Some(start) = ports.next() {
        let mut end = start;
        while let Some(next) = ports.next_if(|&next| end.checked_add(1) == Some(next)) {
            end = next;
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out
}

/// Works out what `service` wants; `cluster_id` names the shared health check.
pub fn plan(service: &Service, cluster_id: &str) -> Result<Plan, CloudError> {
    let invalid = |message: String| CloudError::provider(message);
    let spec = service.spec.clone().unwrap_or_default();
    let ports = spec.ports.unwrap_or_default();
    if ports.is_empty() {
        return Err(invalid("no ports specified for GCE load balancer".into()));
    }
    let protocols: BTreeSet<String> = ports
        .iter()
        .map(|p| p.protocol.clone().unwrap_or_else(|| "TCP".into()))
        .collect();
    if protocols.len() > 1 {
        return Err(invalid("mixed protocol is not supported for LoadBalancer".into()));
    }
    let protocol = protocols.into_iter().next().expect("one protocol");
    if protocol != "TCP" && protocol != "UDP" {
        return Err(invalid(format!(
            "invalid protocol {protocol}, only TCP and UDP are supported"
        )));
    }
    let numbers: BTreeSet<i32> = ports.iter().map(|p| p.port).collect();
    let (min, max) = (numbers.first().copied(), numbers.last().copied());
    let port_range = format!("{}-{}", min.expect("ports"), max.expect("ports"));

    let source_ranges = service::load_balancer_source_ranges(service)?
        .iter()
        .map(ToString::to_string)
        .collect();
    let network_tier = match annotation(service, ANNOTATION_NETWORK_TIER) {
        None | Some("Premium") => "PREMIUM",
        Some("Standard") => "STANDARD",
        Some(other) => return Err(invalid(format!("unsupported network tier: {other:?}"))),
    };
    let session_affinity = session_affinity(service);
    let name = default_load_balancer_name(service);
    let (health_check, local) = health_check_of(service, &name, cluster_id);
    Ok(Plan {
        service: service_key(service),
        description: service_description(service),
        protocol,
        port_range,
        ports: condensed_ports(&numbers),
        source_ranges,
        network_tier: network_tier.to_owned(),
        session_affinity: session_affinity.to_owned(),
        health_check,
        local,
        requested_ip: spec.load_balancer_ip.filter(|ip| !ip.is_empty()),
        name,
    })
}

impl Plan {
    /// The clients' firewall, `k8s-fw-<lb>`: upstream's name, so its firewalls are adopted.
    pub fn client_firewall(&self) -> String {
        format!("k8s-fw-{}", self.name)
    }

    /// The firewalls' description, so a firewall says whose it is: upstream's (space included),
    /// `{"kubernetes.io/service-name":"ns/name", "kubernetes.io/service-ip":"IP"}`.
    pub fn firewall_description(&self, ip: &str) -> String {
        super::super::firewall_description(&self.service, ip)
    }

    /// The health checks' firewall: `k8s-<lb>-http-hc` for the service's own health check, else the
    /// cluster's shared `k8s-<cluster ID>-node-http-hc` (upstream's names).
    pub fn health_check_firewall(&self, cluster_id: &str) -> String {
        if self.local {
            format!("k8s-{}-http-hc", self.name)
        } else {
            format!("k8s-{cluster_id}-node-http-hc")
        }
    }

    /// The health checks' firewall's description: the service's (with `ip`) when the health check is its
    /// own, else `{"kubernetes.io/cluster-id":"<cluster ID>"}`, as the shared one is no service's.
    pub fn health_check_firewall_description(&self, cluster_id: &str, ip: &str) -> String {
        if self.local {
            self.firewall_description(ip)
        } else {
            format!("{{\"kubernetes.io/cluster-id\":\"{cluster_id}\"}}")
        }
    }
}

/// Where the load balancer's IP comes from, decided by [`actions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressAction {
    /// The forwarding rule's IP (the requested one, or the rule stays): used as it is, nothing reserved.
    Use(String),
    /// The requested IP, which the rule does not hold: it must be a reserved address (`addresses.list`),
    /// else the ensure fails.
    CheckReserved(String),
    /// An address reserved under the load balancer's name, holding the rule's IP when it has one, so the
    /// IP survives the rule being made again; released once the rule holds it.
    Reserve(Option<String>),
}

/// What an ensure changes, decided by [`actions`] from what the cloud holds; applied in upstream's order
/// (address, clients' firewall, deletions, health check, pool, rule, release).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actions {
    /// Where the IP comes from.
    pub address: AddressAction,
    /// The existing rule is deleted (its IP, ports or protocol differ, or its pool is made again), before
    /// the pool, which it points at.
    pub delete_rule: bool,
    /// The existing pool is deleted (its session affinity or health check differs), to be made again.
    pub delete_pool: bool,
    /// Health checks the deleted pool used that are no longer wanted (the traffic policy flipped), each
    /// with its firewall: deleted after the pool, in the pool's order.
    pub delete_health_checks: Vec<(String, String)>,
    /// A pool is made (none exists, or it was deleted).
    pub make_pool: bool,
    /// A rule is made (none exists, or it was deleted).
    pub make_rule: bool,
    /// Without a requested IP, the temporary address is released once the new rule holds its IP, as
    /// upstream (also when this ensure reserved it, which only the apply step knows).
    pub release_address: bool,
}

/// Works out what an ensure changes from the forwarding rule and target pool the cloud holds (as fetched,
/// an internal load balancer's rule already taken down): the pool is made again when its session affinity
/// (if set) or health check (`projects/<project>/global/httpHealthChecks/<name>`) differs; the rule when
/// the requested IP, its ports or protocol differ, or its pool is made again.
pub fn actions(
    plan: &Plan,
    rule: Option<&ForwardingRule>,
    pool: Option<&TargetPool>,
    project: &str,
) -> Actions {
    let (hc_name, _) = &plan.health_check;
    let hc_path = format!("projects/{project}/global/httpHealthChecks/{hc_name}");
    let recreate_pool = pool.is_some_and(|p| {
        let affinity = p
            .session_affinity
            .as_ref()
            .and_then(|a| a.name())
            .unwrap_or_default();
        (!affinity.is_empty() && affinity != plan.session_affinity)
            || p.health_checks
                .iter()
                .map(|h| link_path(h))
                .ne([hc_path.as_str()])
    });
    let rule_stale = rule.is_some_and(|r| {
        plan.requested_ip
            .as_ref()
            .is_some_and(|ip| r.ip_address.as_ref() != Some(ip))
            || r.port_range.as_deref() != Some(plan.port_range.as_str())
            || r.ip_protocol.as_ref().and_then(|p| p.name()) != Some(plan.protocol.as_str())
    });
    // The rule keeps its IP while it stays; one about to be made (again) gets a reserved one.
    let address = match (&plan.requested_ip, rule.and_then(|r| r.ip_address.clone())) {
        (None, Some(ip)) if !rule_stale && !recreate_pool => AddressAction::Use(ip),
        (Some(requested), Some(ip)) if ip == *requested => AddressAction::Use(ip),
        (Some(requested), _) => AddressAction::CheckReserved(requested.clone()),
        (None, rule_ip) => AddressAction::Reserve(rule_ip),
    };
    // The health check the old pool used, when the traffic policy flipped.
    let mut delete_health_checks = Vec::new();
    if let (true, Some(old)) = (recreate_pool, pool) {
        for old_check in &old.health_checks {
            let old_name = last_component(old_check);
            if old_name != hc_name.as_str() {
                let firewall = if old_name == plan.name {
                    format!("k8s-{}-http-hc", plan.name)
                } else {
                    // The shared `k8s-<cluster ID>-node`.
                    format!("{old_name}-http-hc")
                };
                delete_health_checks.push((old_name.to_owned(), firewall));
            }
        }
    }
    let make_rule = rule.is_none() || rule_stale || recreate_pool;
    Actions {
        address,
        delete_rule: rule.is_some() && (rule_stale || recreate_pool),
        delete_pool: recreate_pool,
        delete_health_checks,
        make_pool: pool.is_none() || recreate_pool,
        make_rule,
        release_address: plan.requested_ip.is_none() && make_rule,
    }
}

/// The instances to add to a target pool holding `have` and to remove from it, so it holds exactly
/// `want`: compared as `projects/…` paths (Compute returns full links), each once, sorted.
pub fn instance_changes<'a>(have: &'a [String], want: &'a [String]) -> (Vec<&'a str>, Vec<&'a str>) {
    let have: BTreeSet<&str> = have.iter().map(|i| link_path(i)).collect();
    let want: BTreeSet<&str> = want.iter().map(|i| link_path(i)).collect();
    (
        want.difference(&have).copied().collect(),
        have.difference(&want).copied().collect(),
    )
}

#[cfg(test)]
mod tests;
