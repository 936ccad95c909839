//! What a service asks of its NLB, as upstream reads it (pure: no AWS call).
//!
//! Upstream's annotations for NLBs (prefix `service.beta.kubernetes.io/aws-load-balancer-`):
//! - `ssl-cert`, `ssl-ports`: TLS listeners with the certificate on those TCP ports (every TCP port by
//!   default), with `ssl-negotiation-policy` as their policy; `backend-protocol: ssl` makes their targets
//!   TLS too.
//! - `healthcheck-protocol` (TCP, HTTP, HTTPS), `-port` (`traffic-port` or a number), `-path`,
//!   `-interval`, `-timeout`, `-healthy-threshold`, `-unhealthy-threshold` (upstream's
//!   `buildNLBHealthCheckConfiguration`).
//! - `target-group-attributes` (`preserve_client_ip.enabled`, `proxy_protocol_v2.enabled`).
//! - `cross-zone-load-balancing-enabled`, `access-log-enabled`, `-s3-bucket-name`, `-s3-bucket-prefix`:
//!   the NLB's attributes, synced to upstream's defaults (off) when not annotated.
//! - `eip-allocations`, `private-ipv4-addresses`: one per subnet, when the NLB is made.
//! - `additional-resource-tags`: more tags on the NLB and its target groups, when they are made.
//! - `target-node-labels`: only matching nodes are targets.
//!
//! Upstream ignores the classic-only ones (`proxy-protocol`, draining, idle timeout) for NLBs, and so does
//! this; `extra-security-groups` upstream refuses, and `security-groups` only matters in upstream's
//! managed security-group mode, which this provider does not implement.

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types::{
    Certificate, IpAddressType, Listener, ProtocolEnum, SubnetMapping,
};
use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::{CloudError, service};

use super::super::{SslPorts, annotation, go_bool, key_values, number};

/// A service port as the NLB serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// The listener's port.
    pub port: i32,
    /// The listener's protocol: TCP, UDP, or TLS with a certificate.
    pub protocol: ProtocolEnum,
    /// The targets' protocol (TLS for `backend-protocol: ssl` on a TLS listener).
    pub traffic_protocol: ProtocolEnum,
    /// Where the targets listen.
    pub node_port: i32,
    /// The certificate of a TLS listener.
    pub certificate: Option<String>,
    /// The TLS listener's security policy (`ssl-negotiation-policy`).
    pub ssl_policy: Option<String>,
    /// The target group's health check.
    pub health: Health,
}

/// A target group's health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// TCP, HTTP or HTTPS.
    pub protocol: ProtocolEnum,
    /// `traffic-port` or a port number.
    pub port: String,
    /// For HTTP and HTTPS.
    pub path: Option<String>,
    /// Seconds between checks.
    pub interval: i32,
    /// Seconds to wait.
    pub timeout: i32,
    /// Checks to pass.
    pub healthy: i32,
    /// Checks to fail.
    pub unhealthy: i32,
}

/// The cloud-config's `ClusterServiceLoadBalancerHealthProbeMode = Shared`: kube-proxy's port and path
/// for services that are not `externalTrafficPolicy: Local`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedProbe {
    /// kube-proxy's health port.
    pub port: u16,
    /// Its path.
    pub path: String,
}

/// The NLB's attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlbAttributes {
    /// `load_balancing.cross_zone.enabled`.
    pub cross_zone: bool,
    /// `access_logs.s3.enabled`.
    pub access_log_enabled: bool,
    /// `access_logs.s3.bucket`.
    pub access_log_bucket: String,
    /// `access_logs.s3.prefix`.
    pub access_log_prefix: String,
}

impl NlbAttributes {
    /// As the ELBv2 API names them, upstream's way: the bucket and prefix only with access logs on (the
    /// API refuses an empty bucket).
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = vec![
            ("load_balancing.cross_zone.enabled", self.cross_zone.to_string()),
            ("access_logs.s3.enabled", self.access_log_enabled.to_string()),
        ];
        if self.access_log_enabled {
            pairs.push(("access_logs.s3.bucket", self.access_log_bucket.clone()));
            pairs.push(("access_logs.s3.prefix", self.access_log_prefix.clone()));
        }
        pairs
    }
}

/// What the service asks of its NLB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedNlb {
    /// One per TCP or UDP port with a node port.
    pub mappings: Vec<Mapping>,
    /// The NLB's attributes.
    pub attributes: NlbAttributes,
    /// `target-group-attributes`: only these are set, the others left as they are.
    pub target_group_attributes: BTreeMap<String, String>,
    /// `eip-allocations`, one per subnet.
    pub eip_allocations: Option<Vec<String>>,
    /// `private-ipv4-addresses`, one per subnet.
    pub private_ipv4_addresses: Option<Vec<String>>,
    /// `additional-resource-tags`.
    pub tags: BTreeMap<String, String>,
    /// `target-node-labels`.
    pub target_node_labels: BTreeMap<String, String>,
    /// `ipv4` or `dualstack` (`families.rs`).
    pub ip_address_type: IpAddressType,
}

fn refuse<T>(why: String) -> Result<T, CloudError> {
    Err(CloudError::provider(why))
}

/// Upstream's `buildNLBHealthCheckConfiguration`.
fn health(service: &Service, shared: Option<&SharedProbe>) -> Result<Health, CloudError> {
    let local = service::needs_health_check(service);
    let mut health = if local {
        let node_port = service.spec.as_ref().and_then(|s| s.health_check_node_port);
        Health {
            protocol: ProtocolEnum::Http,
            port: node_port.unwrap_or_default().to_string(),
            path: Some(service::HEALTH_CHECK_PATH.into()),
            interval: 10,
            timeout: 10,
            healthy: 2,
            unhealthy: 2,
        }
    } else {
        Health {
            protocol: ProtocolEnum::Tcp,
            port: "traffic-port".into(),
            path: Some("/".into()),
            interval: 30,
            timeout: 10,
            healthy: 3,
            unhealthy: 3,
        }
    };
    if let Some(protocol) = annotation(service, "healthcheck-protocol") {
        health.protocol = ProtocolEnum::from(protocol.to_uppercase().as_str());
    }
    match health.protocol {
        ProtocolEnum::Http | ProtocolEnum::Https => {
            if let Some(path) = annotation(service, "healthcheck-path") {
                health.path = Some(path);
            }
        }
        ProtocolEnum::Tcp => health.path = None,
        ref other => return refuse(format!("Unsupported health check protocol {}", other.as_str())),
    }
    if let Some(port) = annotation(service, "healthcheck-port") {
        health.port = port;
    }
    if let Some(shared) = shared.filter(|_| !local) {
        health.protocol = ProtocolEnum::Http;
        health.port = shared.port.to_string();
        health.path = Some(shared.path.clone());
    }
    for (key, value) in [
        ("healthcheck-interval", &mut health.interval),
        ("healthcheck-timeout", &mut health.timeout),
        ("healthcheck-healthy-threshold", &mut health.healthy),
        ("healthcheck-unhealthy-threshold", &mut health.unhealthy),
    ] {
        if let Some(annotated) = number(service, key)? {
            *value = annotated;
        }
    }
    if health.port != "traffic-port" && health.port.parse::<u16>().is_err() {
        return refuse(format!("Invalid health check port '{}'", health.port));
    }
    Ok(health)
}

/// Upstream's validation of `target-group-attributes`.
fn target_group_attributes(service: &Service) -> Result<BTreeMap<String, String>, CloudError> {
    let attributes = key_values(service, "target-group-attributes");
    let prefix = "error validating target group attributes";
    let udp = service
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .any(|p| p.protocol.as_deref() == Some("UDP"));
    for (key, value) in &attributes {
        if value.is_empty() {
            return refuse(format!("{prefix}: attribute value is empty for {key:?}"));
        }
        match key.as_str() {
            "preserve_client_ip.enabled" | "proxy_protocol_v2.enabled" => {
                if value != "true" && value != "false" {
                    return refuse(format!("{prefix}: invalid attribute value for {key:?}: {value}"));
                }
                if key == "preserve_client_ip.enabled" && udp && value == "false" {
                    return refuse(format!(
                        "{prefix}: client IP preservation can't be disabled for UDP ports"
                    ));
                }
            }
            other => {
                return refuse(format!(
                    "{prefix}: the attribute {other:?} is not supported by the controller or is invalid"
                ));
            }
        }
    }
    Ok(attributes)
}

/// The target-group attributes to set: those of `wanted` that the group has (`have`, as ELBv2 describes
/// them) with another value; the others are left as they are, and ones the group does not have are
/// skipped (upstream's `buildTargetGroupAttributes`).
pub(super) fn target_group_attribute_changes(
    have: &BTreeMap<&str, &str>,
    wanted: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    wanted
        .iter()
        .filter(|(key, value)| have.get(key.as_str()).is_some_and(|v| v != value))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// A comma-separated annotation, as upstream splits it (no trimming).
fn split(service: &Service, key: &str) -> Option<Vec<String>> {
    annotation(service, key).map(|list| list.split(',').map(str::to_owned).collect())
}

/// The service's NLB as upstream would make it, or why it cannot have one.
pub fn wanted(
    service: &Service,
    shared: Option<&SharedProbe>,
    managed_group: bool,
) -> Result<WantedNlb, CloudError> {
    let spec = service.spec.clone().unwrap_or_default();
    let health = health(service, shared)?;
    let certificate = annotation(service, "ssl-cert").filter(|c| !c.is_empty());
    let ssl_ports = SslPorts::of(service);
    let ssl_policy = annotation(service, "ssl-negotiation-policy").filter(|p| !p.is_empty());
    let tls_backend = annotation(service, "backend-protocol").as_deref() == Some("ssl");
    let mut mappings = Vec::new();
    for port in spec.ports.iter().flatten() {
        let protocol = match port.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => ProtocolEnum::Tcp,
            "UDP" => ProtocolEnum::Udp,
            other => {
                return refuse(format!(
                    "port {}: protocol {other}: NLBs take TCP and UDP",
                    port.port
                ));
            }
        };
        let Some(node_port) = port.node_port.filter(|p| *p > 0) else {
            continue;
        };
        let on_ssl_port = ssl_ports.covers(port.port, port.name.as_deref().unwrap_or_default());
        let mut mapping = Mapping {
            port: port.port,
            protocol: protocol.clone(),
            traffic_protocol: protocol.clone(),
            node_port,
            certificate: None,
            ssl_policy: None,
            health: health.clone(),
        };
        if let Some(certificate) = certificate
            .as_ref()
            .filter(|_| protocol != ProtocolEnum::Udp && on_ssl_port)
        {
            mapping.protocol = ProtocolEnum::Tls;
            mapping.certificate = Some(certificate.clone());
            mapping.ssl_policy = ssl_policy.clone();
            if tls_backend {
                mapping.traffic_protocol = ProtocolEnum::Tls;
            }
        }
        mappings.push(mapping);
    }
    if mappings.is_empty() {
        return refuse("the service has no port with a node port yet".into());
    }
    Ok(WantedNlb {
        mappings,
        attributes: NlbAttributes {
            cross_zone: go_bool(service, "cross-zone-load-balancing-enabled")?.unwrap_or(false),
            access_log_enabled: go_bool(service, "access-log-enabled")?.unwrap_or(false),
            access_log_bucket: annotation(service, "access-log-s3-bucket-name").unwrap_or_default(),
            access_log_prefix: annotation(service, "access-log-s3-bucket-prefix").unwrap_or_default(),
        },
        target_group_attributes: target_group_attributes(service)?,
        eip_allocations: split(service, "eip-allocations"),
        private_ipv4_addresses: split(service, "private-ipv4-addresses"),
        tags: key_values(service, "additional-resource-tags"),
        target_node_labels: key_values(service, "target-node-labels"),
        ip_address_type: super::families::ip_address_type(service, managed_group)?,
    })
}

/// Whether the NLB's listener is `mapping`'s (the target group compared apart): protocol, and for TLS the
/// certificate and policy, for TCP no certificate (upstream's `listenerNeedsModification`, less its check
/// that a TCP listener has no policy: ELBv2 gives none to one, and moto gives every one a default).
pub(super) fn same_listener(listener: &Listener, mapping: &Mapping) -> bool {
    let certificate = listener
        .certificates()
        .first()
        .and_then(Certificate::certificate_arn);
    listener.protocol() == Some(&mapping.protocol)
        && match mapping.protocol {
            ProtocolEnum::Tls => {
                certificate == mapping.certificate.as_deref()
                    && listener.ssl_policy().unwrap_or_default()
                        == mapping.ssl_policy.as_deref().unwrap_or_default()
            }
            _ => certificate.is_none(),
        }
}

/// The subnets as the NLB is made in them, with `eip-allocations` and `private-ipv4-addresses`, one each
/// per subnet (upstream's `createSubnetMappings`).
pub(super) fn subnet_mappings(
    subnets: &[String],
    wanted: &WantedNlb,
) -> Result<Vec<SubnetMapping>, CloudError> {
    for (what, list) in [
        ("EIP AllocationIDs", &wanted.eip_allocations),
        ("Private IPv4Addresses", &wanted.private_ipv4_addresses),
    ] {
        if let Some(list) = list.as_ref().filter(|l| l.len() != subnets.len()) {
            return Err(CloudError::provider(format!(
                "error creating load balancer: Must have same number of {what} ({}) and SubnetIDs ({})",
                list.len(),
                subnets.len()
            )));
        }
    }
    Ok(subnets
        .iter()
        .enumerate()
        .map(|(n, subnet)| {
            SubnetMapping::builder()
                .subnet_id(subnet)
                .set_allocation_id(wanted.eip_allocations.as_ref().map(|l| l[n].clone()))
                .set_private_ipv4_address(wanted.private_ipv4_addresses.as_ref().map(|l| l[n].clone()))
                .build()
        })
        .collect())
}

#[cfg(test)]
mod tests;
