//! External network load balancers for `type: LoadBalancer` services, as upstream's target-pool based
//! `ensureExternalLoadBalancer`, with upstream's names so the in-tree provider's load balancers are adopted:
//!
//! | object | name |
//! |---|---|
//! | forwarding rule, target pool, temporary address | `a` + the service UID without dashes, 32 characters |
//! | firewall for clients | `k8s-fw-<lb>` |
//! | HTTP health check | `k8s-<cluster ID>-node` on kube-proxy's `:10256/healthz` (shared), or `<lb>` on the `healthCheckNodePort` (`externalTrafficPolicy: Local`) |
//! | firewall for health checks | `k8s-<cluster ID>-node-http-hc` or `k8s-<lb>-http-hc` |
//!
//! The cluster ID is upstream's: the ConfigMap `kube-system/ingress-uid` (`provider-uid`, else `uid`),
//! made with a random ID when missing, read when this process starts leading.
//!
//! Each call compares what exists with what is wanted and changes only what differs: the target pool's
//! instances by `addInstance`/`removeInstance`; the pool recreated when its session affinity or health
//! check changes; the forwarding rule recreated when its address, ports or protocol change (or its pool
//! was recreated); firewalls and health checks patched. Without `loadBalancerIP` an address is reserved
//! under the load balancer's name to keep the IP across a recreation, and released once the forwarding
//! rule holds it, as upstream; with it, the IP must be a reserved address or the rule's current one.
//!
//! Not here: internal load balancers (`networking.gke.io/load-balancer-type: Internal`): a clear error,
//! which the service controller reports as an event. Services for other implementations
//! (`spec.loadBalancerClass` other than upstream's legacy external class, `cloud.google.com/l4-rbs:
//! enabled`) are `ImplementedElsewhere`.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use cloud_provider::{CallContext, CloudError, LoadBalancer, default_load_balancer_name};
use google_cloud_compute_v1::model::{
    self, Address, Firewall, ForwardingRule, HttpHealthCheck, InstanceReference, TargetPool,
    TargetPoolsAddInstanceRequest, TargetPoolsRemoveInstanceRequest,
};
use google_cloud_lro::Poller;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use crate::client::Attributed as _;
use crate::instances::InstanceRef;
use crate::{GceProvider, WriteError, gce_error, is_not_found, last_component};

/// The internal-load-balancer annotation, and its deprecated form.
pub const ANNOTATION_LOAD_BALANCER_TYPE: &str = "networking.gke.io/load-balancer-type";
/// Deprecated form of [`ANNOTATION_LOAD_BALANCER_TYPE`].
pub const ANNOTATION_LOAD_BALANCER_TYPE_DEPRECATED: &str = "cloud.google.com/load-balancer-type";
/// `Standard` or `Premium` (the default).
pub const ANNOTATION_NETWORK_TIER: &str = "cloud.google.com/network-tier";
/// `enabled`: a backend-service based load balancer, made by another controller.
pub const ANNOTATION_RBS: &str = "cloud.google.com/l4-rbs";
/// The only `loadBalancerClass` this provider serves (upstream's legacy external class).
pub const CLASS_LEGACY_EXTERNAL: &str = "networking.gke.io/l4-regional-external-legacy";
/// Upstream's legacy internal class (internal load balancers: not yet).
pub const CLASS_LEGACY_INTERNAL: &str = "networking.gke.io/l4-regional-internal-legacy";
/// The source ranges of Google's health checkers (upstream's defaults).
pub const HEALTH_CHECK_SOURCE_RANGES: [&str; 4] = [
    "130.211.0.0/22",
    "35.191.0.0/16",
    "209.85.152.0/22",
    "209.85.204.0/22",
];
/// kube-proxy's health port, for the shared node health check.
pub const NODE_HEALTH_CHECK_PORT: i32 = 10256;
/// The ConfigMap holding the cluster ID (namespace `kube-system`).
pub const CLUSTER_ID_CONFIG_MAP: &str = "ingress-uid";

/// A target pool is created with at most this many instances; the rest are added after.
const POOL_CREATE_INSTANCES: usize = 200;
/// Instances per `addInstance`/`removeInstance`.
const POOL_UPDATE_INSTANCES: usize = 1000;

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

fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn class(service: &Service) -> Option<&str> {
    service.spec.as_ref()?.load_balancer_class.as_deref()
}

/// Whether another implementation owns the service's load balancer.
fn implemented_elsewhere(service: &Service) -> bool {
    matches!(class(service), Some(c) if c != CLASS_LEGACY_EXTERNAL && c != CLASS_LEGACY_INTERNAL)
        || annotation(service, ANNOTATION_RBS) == Some("enabled")
}

/// Whether the service asks for an internal load balancer.
fn wants_internal(service: &Service) -> bool {
    if let Some(class) = class(service) {
        return class == CLASS_LEGACY_INTERNAL;
    }
    annotation(service, ANNOTATION_LOAD_BALANCER_TYPE)
        .or_else(|| annotation(service, ANNOTATION_LOAD_BALANCER_TYPE_DEPRECATED))
        .is_some_and(|t| t.eq_ignore_ascii_case("internal"))
}

/// `ns/name`.
fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `{"kubernetes.io/service-name":"ns/name"}`, as upstream writes it.
fn service_description(service: &Service) -> String {
    format!("{{\"kubernetes.io/service-name\":\"{}\"}}", service_key(service))
}

/// The firewalls' description: `{"kubernetes.io/service-name":"ns/name", "kubernetes.io/service-ip":"IP"}`
/// (upstream's, space included).
fn firewall_description(plan: &Plan, ip: &str) -> String {
    format!(
        "{{\"kubernetes.io/service-name\":\"{}\", \"kubernetes.io/service-ip\":\"{ip}\"}}",
        plan.service
    )
}

/// Sorted ports as ranges: `[80, 443, 444, 445]` → `["80", "443-445"]`.
pub fn condensed_ports(ports: &BTreeSet<i32>) -> Vec<String> {
    let mut out = Vec::new();
    let mut ports = ports.iter().copied().peekable();
    while let Some(start) = ports.next() {
        let mut end = start;
        while ports.peek() == Some(&(end + 1)) {
            end = ports.next().expect("peeked");
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

    let source_ranges = match spec.load_balancer_source_ranges.filter(|r| !r.is_empty()) {
        Some(ranges) => ranges,
        None => match annotation(service, "service.beta.kubernetes.io/load-balancer-source-ranges") {
            Some(value) => value
                .split(',')
                .map(|r| r.trim().to_owned())
                .filter(|r| !r.is_empty())
                .collect(),
            None => vec!["0.0.0.0/0".to_owned()],
        },
    };
    for range in &source_ranges {
        if !is_cidr(range) {
            return Err(invalid(format!(
                "service.Spec.LoadBalancerSourceRanges: {range:?} is not valid. Expecting a list of IP ranges. For example, 10.0.0.0/24"
            )));
        }
    }
    let network_tier = match annotation(service, ANNOTATION_NETWORK_TIER) {
        None | Some("Premium") => "PREMIUM",
        Some("Standard") => "STANDARD",
        Some(other) => return Err(invalid(format!("unsupported network tier: {other:?}"))),
    };
    let session_affinity = match spec.session_affinity.as_deref() {
        Some("ClientIP") => "CLIENT_IP",
        _ => "NONE",
    };
    let name = default_load_balancer_name(service);
    let node_port = spec.health_check_node_port.filter(|p| *p != 0);
    let local = spec.external_traffic_policy.as_deref() == Some("Local") && node_port.is_some();
    let health_check = match node_port {
        Some(port) if local => (name.clone(), port),
        _ => (format!("k8s-{cluster_id}-node"), NODE_HEALTH_CHECK_PORT),
    };
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

fn is_cidr(range: &str) -> bool {
    let Some((ip, bits)) = range.split_once('/') else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits.parse::<u8>().is_ok_and(|b| b <= 32),
        Ok(std::net::IpAddr::V6(_)) => bits.parse::<u8>().is_ok_and(|b| b <= 128),
        Err(_) => false,
    }
}

/// `Ok(None)` for a 404.
fn found<T>(result: Result<T, google_cloud_gax::error::Error>, what: &str) -> Result<Option<T>, CloudError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) if is_not_found(&error) => Ok(None),
        Err(error) => Err(gce_error(what, error)),
    }
}

/// A write awaited; 404 is done (for deletes).
fn deleted(result: Result<(), WriteError>, what: &str) -> Result<(), CloudError> {
    match result {
        Err(error) if error.is_not_found() => Ok(()),
        other => other.map_err(|e| e.into_cloud(what)),
    }
}

/// A write awaited; 409 is done (for inserts).
fn inserted(result: Result<(), WriteError>, what: &str) -> Result<bool, CloudError> {
    match result {
        Ok(()) => Ok(true),
        Err(error) if error.is_conflict() => Ok(false),
        Err(error) => Err(error.into_cloud(what)),
    }
}

/// Whether the firewall Compute has is the one wanted: ranges, tags and ports as sets (Compute may list
/// them in another order), protocols in any case, an unset priority as Compute's default (1000).
pub fn firewall_matches(existing: &Firewall, wanted: &Firewall) -> bool {
    fn set(items: &[String]) -> BTreeSet<&str> {
        items.iter().map(String::as_str).collect()
    }
    fn allowed(f: &Firewall) -> BTreeSet<(String, BTreeSet<&str>)> {
        f.allowed
            .iter()
            .map(|a| {
                (
                    a.ip_protocol.as_deref().unwrap_or_default().to_ascii_lowercase(),
                    set(&a.ports),
                )
            })
            .collect()
    }
    existing.description == wanted.description
        && set(&existing.source_ranges) == set(&wanted.source_ranges)
        && set(&existing.destination_ranges) == set(&wanted.destination_ranges)
        && set(&existing.target_tags) == set(&wanted.target_tags)
        && existing.allowed.len() == wanted.allowed.len()
        && allowed(existing) == allowed(wanted)
        && existing.priority.unwrap_or(1000) == wanted.priority.unwrap_or(1000)
}

/// Compares `projects/…` paths of links.
fn link_path(link: &str) -> &str {
    link.find("projects/").map_or(link, |at| &link[at..])
}

impl GceProvider {
    fn region(&self) -> String {
        self.config.region().expect("validated with the configuration")
    }

    fn project(&self) -> &str {
        &self.config.project_id
    }

    fn network_url(&self) -> Result<String, CloudError> {
        let path = self.config.network_path().ok_or_else(|| {
            CloudError::provider(
                "load balancers need network-name in the cloud-config ([global] network-name)",
            )
        })?;
        Ok(format!("https://www.googleapis.com/compute/v1/{path}"))
    }

    /// The nodes' instances (`zones/Z/instances/N`) and their network tags; nodes without an instance are
    /// left out (as upstream); none at all is an error.
    async fn node_instances(
        &self,
        nodes: &[Arc<Node>],
    ) -> Result<(Vec<String>, Vec<model::Instance>), CloudError> {
        if nodes.is_empty() {
            return Err(CloudError::provider("cannot EnsureLoadBalancer() with no hosts"));
        }
        let refs: Vec<InstanceRef> = nodes.iter().filter_map(|n| self.instance_ref(n).ok()).collect();
        let instances: Vec<model::Instance> = self.find(&refs).await?.into_iter().flatten().collect();
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

    /// The firewall target tags: `node-tags`, else per instance the longest of its tags that prefixes its
    /// name (upstream's `computeHostTags`).
    fn target_tags(&self, instances: &[model::Instance]) -> Result<Vec<String>, CloudError> {
        if !self.config.node_tags.is_empty() {
            return Ok(self.config.node_tags.clone());
        }
        let mut tags = BTreeSet::new();
        for instance in instances {
            let name = instance.name.as_deref().unwrap_or_default();
            let tag = instance
                .tags
                .as_ref()
                .into_iter()
                .flat_map(|t| t.items.iter())
                .filter(|t| name.starts_with(t.as_str()))
                .max_by_key(|t| t.len())
                .ok_or_else(|| {
                    CloudError::provider(format!(
                        "no node tags supplied (node-tags) and no tag of instance {name} prefixes its name"
                    ))
                })?;
            tags.insert(tag.clone());
        }
        Ok(tags.into_iter().collect())
    }

    async fn ensure_firewall(&self, wanted: Firewall) -> Result<(), CloudError> {
        let name = wanted.name.clone().unwrap_or_default();
        let existing = found(
            self.clients
                .firewalls
                .get()
                .set_project(self.project())
                .set_firewall(&name)
                .attributed()
                .send()
                .await,
            "firewalls.get",
        )?;
        let result = match existing {
            None => {
                let done = self
                    .clients
                    .firewalls
                    .insert()
                    .set_project(self.project())
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                return inserted(WriteError::check(done), "firewalls.insert").map(|_| ());
            }
            Some(existing) => {
                if firewall_matches(&existing, &wanted) {
                    return Ok(());
                }
                self.clients
                    .firewalls
                    .patch()
                    .set_project(self.project())
                    .set_firewall(&name)
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await
            }
        };
        WriteError::check(result).map_err(|e| e.into_cloud("firewalls.patch"))
    }

    async fn delete_firewall(&self, name: &str) -> Result<(), CloudError> {
        let done = self
            .clients
            .firewalls
            .delete()
            .set_project(self.project())
            .set_firewall(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        deleted(WriteError::check(done), "firewalls.delete")
    }

    /// A firewall letting `sources` reach `ip` on `(protocol, ports)` of the instances tagged `tags`.
    fn firewall(
        &self,
        name: String,
        description: String,
        sources: Vec<String>,
        ip: &str,
        (protocol, ports): (&str, Vec<String>),
        tags: Vec<String>,
    ) -> Result<Firewall, CloudError> {
        let mut allowed = model::firewall::Allowed::default();
        allowed.ip_protocol = Some(protocol.to_ascii_lowercase());
        allowed.ports = ports;
        let mut firewall = Firewall::default();
        firewall.name = Some(name);
        firewall.description = Some(description);
        firewall.network = Some(self.network_url()?);
        firewall.source_ranges = sources;
        firewall.destination_ranges = vec![ip.to_owned()];
        firewall.target_tags = tags;
        firewall.allowed = vec![allowed];
        firewall.priority = Some(1000);
        Ok(firewall)
    }

    /// The health check, made or corrected; its link.
    async fn ensure_health_check(&self, name: &str, port: i32) -> Result<String, CloudError> {
        let mut wanted = HttpHealthCheck::default();
        wanted.name = Some(name.to_owned());
        wanted.port = Some(port);
        wanted.request_path = Some("/healthz".into());
        wanted.description = Some(format!("{{\"kubernetes.io/service-name\":\"{name}\"}}"));
        wanted.check_interval_sec = Some(8);
        wanted.timeout_sec = Some(1);
        wanted.healthy_threshold = Some(1);
        wanted.unhealthy_threshold = Some(3);
        let get = || {
            self.clients
                .http_health_checks
                .get()
                .set_project(self.project())
                .set_http_health_check(name)
                .attributed()
                .send()
        };
        match found(get().await, "httpHealthChecks.get")? {
            None => {
                let done = self
                    .clients
                    .http_health_checks
                    .insert()
                    .set_project(self.project())
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                inserted(WriteError::check(done), "httpHealthChecks.insert")?;
            }
            Some(existing) => {
                // Larger intervals and thresholds set by hand are kept, as upstream.
                let lower = |have: Option<i32>, want: Option<i32>| have.unwrap_or(0) < want.unwrap_or(0);
                let stale = existing.port != wanted.port
                    || existing.request_path != wanted.request_path
                    || existing.description != wanted.description
                    || lower(existing.check_interval_sec, wanted.check_interval_sec)
                    || lower(existing.timeout_sec, wanted.timeout_sec)
                    || lower(existing.healthy_threshold, wanted.healthy_threshold)
                    || lower(existing.unhealthy_threshold, wanted.unhealthy_threshold);
                if stale {
                    let done = self
                        .clients
                        .http_health_checks
                        .patch()
                        .set_project(self.project())
                        .set_http_health_check(name)
                        .set_body(wanted)
                        .attributed()
                        .poller()
                        .until_done()
                        .await;
                    WriteError::check(done).map_err(|e| e.into_cloud("httpHealthChecks.patch"))?;
                }
            }
        }
        let check = get().await.map_err(|e| gce_error("httpHealthChecks.get", e))?;
        Ok(check.self_link.unwrap_or_default())
    }

    /// Deletes a health check and its firewall; one still used by a target pool is kept (with its
    /// firewall), as upstream.
    async fn delete_health_check(&self, name: &str, firewall: &str) -> Result<(), CloudError> {
        let done = self
            .clients
            .http_health_checks
            .delete()
            .set_project(self.project())
            .set_http_health_check(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        match WriteError::check(done) {
            // Compute: 400 `resourceInUseByAnotherResource`, "… is already being used by …".
            Err(WriteError::Request(e))
                if e.http_payload().is_some_and(|b| {
                    String::from_utf8_lossy(b).contains("resourceInUseByAnotherResource")
                }) || e.to_string().contains("is already being used by") =>
            {
                return Ok(());
            }
            other => deleted(other, "httpHealthChecks.delete")?,
        }
        self.delete_firewall(firewall).await
    }

    fn health_check_firewall(&self, plan: &Plan, cluster_id: &str) -> String {
        if plan.local {
            format!("k8s-{}-http-hc", plan.name)
        } else {
            format!("k8s-{cluster_id}-node-http-hc")
        }
    }

    async fn get_rule(&self, name: &str) -> Result<Option<ForwardingRule>, CloudError> {
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

    async fn delete_rule(&self, name: &str) -> Result<(), CloudError> {
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

    async fn get_pool(&self, name: &str) -> Result<Option<TargetPool>, CloudError> {
        found(
            self.clients
                .target_pools
                .get()
                .set_project(self.project())
                .set_region(self.region())
                .set_target_pool(name)
                .attributed()
                .send()
                .await,
            "targetPools.get",
        )
    }

    async fn delete_pool(&self, name: &str) -> Result<(), CloudError> {
        let done = self
            .clients
            .target_pools
            .delete()
            .set_project(self.project())
            .set_region(self.region())
            .set_target_pool(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        deleted(WriteError::check(done), "targetPools.delete")
    }

    /// Adds and removes instances so the pool holds exactly `wanted`.
    async fn update_pool(&self, pool: &TargetPool, wanted: &[String]) -> Result<(), CloudError> {
        let name = pool.name.clone().unwrap_or_default();
        let have: BTreeSet<&str> = pool.instances.iter().map(|i| link_path(i)).collect();
        let want: BTreeSet<&str> = wanted.iter().map(|i| link_path(i)).collect();
        let reference = |link: &&str| {
            let mut r = InstanceReference::default();
            r.instance = Some((*link).to_owned());
            r
        };
        let add: Vec<&str> = want.difference(&have).copied().collect();
        for chunk in add.chunks(POOL_UPDATE_INSTANCES) {
            let mut body = TargetPoolsAddInstanceRequest::default();
            body.instances = chunk.iter().map(reference).collect();
            let done = self
                .clients
                .target_pools
                .add_instance()
                .set_project(self.project())
                .set_region(self.region())
                .set_target_pool(&name)
                .set_body(body)
                .attributed()
                .poller()
                .until_done()
                .await;
            WriteError::check(done).map_err(|e| e.into_cloud("targetPools.addInstance"))?;
        }
        let remove: Vec<&str> = have.difference(&want).copied().collect();
        for chunk in remove.chunks(POOL_UPDATE_INSTANCES) {
            let mut body = TargetPoolsRemoveInstanceRequest::default();
            body.instances = chunk.iter().map(reference).collect();
            let done = self
                .clients
                .target_pools
                .remove_instance()
                .set_project(self.project())
                .set_region(self.region())
                .set_target_pool(&name)
                .set_body(body)
                .attributed()
                .poller()
                .until_done()
                .await;
            WriteError::check(done).map_err(|e| e.into_cloud("targetPools.removeInstance"))?;
        }
        Ok(())
    }

    async fn get_address(&self, name: &str) -> Result<Option<Address>, CloudError> {
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

    async fn delete_address(&self, name: &str) -> Result<(), CloudError> {
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

    /// The IP to use, and whether a temporary address was reserved for it (to release afterwards).
    async fn address_for(
        &self,
        plan: &Plan,
        service: &Service,
        rule: Option<&ForwardingRule>,
    ) -> Result<(String, bool), CloudError> {
        let rule_ip = rule.and_then(|r| r.ip_address.clone());
        if let Some(requested) = &plan.requested_ip {
            if rule_ip.as_deref() == Some(requested.as_str()) {
                return Ok((requested.clone(), false));
            }
            let reserved = self
                .clients
                .addresses
                .list()
                .set_project(self.project())
                .set_region(self.region())
                .set_filter(format!("address = \"{requested}\""))
                .attributed()
                .send()
                .await
                .map_err(|e| gce_error("addresses.list", e))?;
            if reserved.items.is_empty() {
                return Err(CloudError::provider(format!(
                    "requested ip {requested:?} is neither static nor assigned to the LB"
                )));
            }
            return Ok((requested.clone(), false));
        }
        let mut address = Address::default();
        address.name = Some(plan.name.clone());
        address.description = Some(service_description(service));
        address.address = rule_ip;
        address.network_tier = Some(model::address::NetworkTier::from(plan.network_tier.as_str()));
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
        let reserved_now = inserted(WriteError::check(done), "addresses.insert")?;
        let address = self
            .get_address(&plan.name)
            .await?
            .and_then(|a| a.address)
            .ok_or_else(|| CloudError::provider(format!("address {} has no IP", plan.name)))?;
        Ok((address, reserved_now))
    }

    async fn ensure_external(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let cluster_id = self.load_cluster_id().await?;
        let plan = plan(service, &cluster_id)?;
        let (instances, vms) = self.node_instances(nodes).await?;
        let tags = self.target_tags(&vms)?;
        let rule = self.get_rule(&plan.name).await?;
        let pool = self.get_pool(&plan.name).await?;
        let (hc_name, hc_port) = plan.health_check.clone();
        let hc_path = format!("projects/{}/global/httpHealthChecks/{hc_name}", self.project());
        let recreate_pool = pool.as_ref().is_some_and(|p| {
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
        let rule_stale = rule.as_ref().is_some_and(|r| {
            plan.requested_ip
                .as_ref()
                .is_some_and(|ip| r.ip_address.as_ref() != Some(ip))
                || r.port_range.as_deref() != Some(plan.port_range.as_str())
                || r.ip_protocol.as_ref().and_then(|p| p.name()) != Some(plan.protocol.as_str())
        });
        // The rule keeps its IP while it stays; one about to be made (again) gets a reserved one.
        let (ip, reserved_now) = match rule.as_ref().and_then(|r| r.ip_address.clone()) {
            Some(ip) if plan.requested_ip.is_none() && !rule_stale && !recreate_pool => (ip, false),
            _ => self.address_for(&plan, service, rule.as_ref()).await?,
        };
        let fw = self.firewall(
            format!("k8s-fw-{}", plan.name),
            firewall_description(&plan, &ip),
            plan.source_ranges.clone(),
            &ip,
            (&plan.protocol, plan.ports.clone()),
            tags.clone(),
        )?;
        self.ensure_firewall(fw).await?;

        if rule.is_some() && (rule_stale || recreate_pool) {
            self.delete_rule(&plan.name).await?;
        }
        if let (true, Some(old)) = (recreate_pool, &pool) {
            self.delete_pool(&plan.name).await?;
            // The health check the old pool used, when the traffic policy flipped.
            for old_check in &old.health_checks {
                let old_name = last_component(old_check);
                if old_name != hc_name {
                    let firewall = if old_name == plan.name {
                        format!("k8s-{}-http-hc", plan.name)
                    } else {
                        // The shared `k8s-<cluster ID>-node`.
                        format!("{old_name}-http-hc")
                    };
                    self.delete_health_check(old_name, &firewall).await?;
                }
            }
        }

        let hc_fw = self.firewall(
            self.health_check_firewall(&plan, &cluster_id),
            if plan.local {
                firewall_description(&plan, &ip)
            } else {
                format!("{{\"kubernetes.io/cluster-id\":\"{cluster_id}\"}}")
            },
            HEALTH_CHECK_SOURCE_RANGES
                .iter()
                .map(|r| (*r).to_owned())
                .collect(),
            &ip,
            ("TCP", vec![hc_port.to_string()]),
            tags,
        )?;
        self.ensure_firewall(hc_fw).await?;
        let hc_link = self.ensure_health_check(&hc_name, hc_port).await?;

        let pool = match pool.filter(|_| !recreate_pool) {
            Some(pool) => pool,
            None => {
                let mut wanted = TargetPool::default();
                wanted.name = Some(plan.name.clone());
                wanted.description = Some(plan.description.clone());
                wanted.instances = instances.iter().take(POOL_CREATE_INSTANCES).cloned().collect();
                wanted.health_checks = vec![hc_link];
                wanted.session_affinity = Some(model::target_pool::SessionAffinity::from(
                    plan.session_affinity.as_str(),
                ));
                let done = self
                    .clients
                    .target_pools
                    .insert()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                inserted(WriteError::check(done), "targetPools.insert")?;
                self.get_pool(&plan.name).await?.ok_or_else(|| {
                    CloudError::provider(format!("target pool {} vanished after it was made", plan.name))
                })?
            }
        };
        self.update_pool(&pool, &instances).await?;

        let make_rule = rule.is_none() || rule_stale || recreate_pool;
        if make_rule {
            let mut wanted = ForwardingRule::default();
            wanted.name = Some(plan.name.clone());
            wanted.description = Some(plan.description.clone());
            wanted.ip_address = Some(ip.clone());
            wanted.ip_protocol = Some(model::forwarding_rule::IPProtocol::from(plan.protocol.as_str()));
            wanted.port_range = Some(plan.port_range.clone());
            wanted.target = Some(format!(
                "https://www.googleapis.com/compute/v1/projects/{}/regions/{}/targetPools/{}",
                self.project(),
                self.region(),
                plan.name
            ));
            wanted.network_tier = Some(model::forwarding_rule::NetworkTier::from(
                plan.network_tier.as_str(),
            ));
            let done = self
                .clients
                .forwarding_rules
                .insert()
                .set_project(self.project())
                .set_region(self.region())
                .set_body(wanted)
                .attributed()
                .poller()
                .until_done()
                .await;
            inserted(WriteError::check(done), "forwardingRules.insert")?;
        }
        // The rule holds the IP now: the temporary reservation goes, as upstream.
        if plan.requested_ip.is_none() && (reserved_now || make_rule) {
            self.delete_address(&plan.name).await?;
        }
        Ok(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(ip),
                ..LoadBalancerIngress::default()
            }]),
        })
    }

    async fn update_external(&self, service: &Service, nodes: &[Arc<Node>]) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        let (instances, _) = self.node_instances(nodes).await?;
        let pool = self
            .get_pool(&name)
            .await?
            .ok_or_else(|| CloudError::provider(format!("target pool {name} does not exist")))?;
        self.update_pool(&pool, &instances).await
    }

    async fn delete_external(&self, service: &Service) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        self.delete_firewall(&format!("k8s-fw-{name}")).await?;
        self.delete_address(&name).await?;
        self.delete_rule(&name).await?;
        self.delete_pool(&name).await?;
        let local = found(
            self.clients
                .http_health_checks
                .get()
                .set_project(self.project())
                .set_http_health_check(&name)
                .attributed()
                .send()
                .await,
            "httpHealthChecks.get",
        )?
        .is_some();
        self.delete_health_check(&name, &format!("k8s-{name}-http-hc"))
            .await?;
        if let (false, Ok(cluster_id)) = (local, self.load_cluster_id().await) {
            self.delete_health_check(
                &format!("k8s-{cluster_id}-node"),
                &format!("k8s-{cluster_id}-node-http-hc"),
            )
            .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl LoadBalancer for GceProvider {
    async fn get_load_balancer(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, CloudError> {
        let name = default_load_balancer_name(service);
        let rule = cx.call("forwardingRules.get", self.get_rule(&name)).await?;
        Ok(rule.map(|r| LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: r.ip_address,
                ..LoadBalancerIngress::default()
            }]),
        }))
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
            return Err(CloudError::provider(format!(
                "internal load balancers ({ANNOTATION_LOAD_BALANCER_TYPE}: Internal) are not supported by the gce provider yet; remove the annotation for an external one"
            )));
        }
        cx.call(
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
            return Ok(());
        }
        cx.call(
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
        cx.call("delete_external_load_balancer", self.delete_external(service))
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
    fn plans_as_upstream() {
        let s = service(
            serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 443}, {"port": 80}, {"port": 444}], "sessionAffinity": "ClientIP"}),
            serde_json::json!({}),
        );
        let p = plan(&s, "c1d2").unwrap();
        assert_eq!(p.name, "a0a1b2c3d4e5f60718293a4b5c6d7e8f");
        assert_eq!(p.description, r#"{"kubernetes.io/service-name":"shop/web"}"#);
        assert_eq!((p.protocol.as_str(), p.port_range.as_str()), ("TCP", "80-444"));
        assert_eq!(p.ports, ["80", "443-444"]);
        assert_eq!(p.source_ranges, ["0.0.0.0/0"]);
        assert_eq!(
            (p.network_tier.as_str(), p.session_affinity.as_str()),
            ("PREMIUM", "CLIENT_IP")
        );
        assert_eq!(p.health_check, ("k8s-c1d2-node".to_owned(), 10256));
        assert!(!p.local);

        let local = service(
            serde_json::json!({"ports": [{"port": 53, "protocol": "UDP"}], "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000, "loadBalancerSourceRanges": ["10.0.0.0/8"]}),
            serde_json::json!({"cloud.google.com/network-tier": "Standard"}),
        );
        let p = plan(&local, "c1d2").unwrap();
        assert_eq!(
            p.health_check,
            ("a0a1b2c3d4e5f60718293a4b5c6d7e8f".to_owned(), 31000)
        );
        assert!(p.local);
        assert_eq!(
            (
                p.protocol.as_str(),
                p.port_range.as_str(),
                p.network_tier.as_str()
            ),
            ("UDP", "53-53", "STANDARD")
        );
        assert_eq!(p.source_ranges, ["10.0.0.0/8"]);
    }

    #[test]
    fn bad_services_are_one_clear_error() {
        let cases = [
            (
                serde_json::json!({"ports": []}),
                serde_json::json!({}),
                "no ports specified",
            ),
            (
                serde_json::json!({"ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}),
                serde_json::json!({}),
                "mixed protocol is not supported",
            ),
            (
                serde_json::json!({"ports": [{"port": 80, "protocol": "SCTP"}]}),
                serde_json::json!({}),
                "invalid protocol SCTP",
            ),
            (
                serde_json::json!({"ports": [{"port": 80}], "loadBalancerSourceRanges": ["10.0.0.0"]}),
                serde_json::json!({}),
                "is not valid",
            ),
            (
                serde_json::json!({"ports": [{"port": 80}]}),
                serde_json::json!({"cloud.google.com/network-tier": "Gold"}),
                "unsupported network tier",
            ),
        ];
        for (spec, annotations, needle) in cases {
            let error = plan(&service(spec.clone(), annotations), "c")
                .unwrap_err()
                .to_string();
            assert!(error.contains(needle), "{spec}: {error}");
        }
    }

    #[test]
    fn firewalls_compare_as_compute_returns_them() {
        let wanted: Firewall = serde_json::from_value(serde_json::json!({
            "description": "d", "sourceRanges": ["10.0.0.0/8", "192.168.0.0/16"],
            "destinationRanges": ["34.1.1.1"], "targetTags": ["a", "b"],
            "allowed": [{"IPProtocol": "tcp", "ports": ["80", "443-445"]}], "priority": 1000,
        }))
        .unwrap();
        let reordered: Firewall = serde_json::from_value(serde_json::json!({
            "description": "d", "sourceRanges": ["192.168.0.0/16", "10.0.0.0/8"],
            "destinationRanges": ["34.1.1.1"], "targetTags": ["b", "a"],
            "allowed": [{"IPProtocol": "TCP", "ports": ["443-445", "80"]}],
        }))
        .unwrap();
        assert!(firewall_matches(&reordered, &wanted));
        let mut other_port = reordered.clone();
        other_port.allowed[0].ports = vec!["80".into()];
        assert!(!firewall_matches(&other_port, &wanted));
        let mut other_source = reordered.clone();
        other_source.source_ranges.pop();
        assert!(!firewall_matches(&other_source, &wanted));
        let mut other_priority = reordered;
        other_priority.priority = Some(999);
        assert!(!firewall_matches(&other_priority, &wanted));
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
        assert_eq!(
            condensed_ports(&BTreeSet::from([1, 2, 3, 5, 7, 8])),
            ["1-3", "5", "7-8"]
        );
    }
}
