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
pub fn wanted(service: &Service, shared: Option<&SharedProbe>) -> Result<WantedNlb, CloudError> {
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
        ip_address_type: super::families::ip_address_type(service)?,
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
mod tests {
    use super::super::super::PREFIX;
    use super::*;

    fn service(spec: serde_json::Value, annotations: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
            "spec": spec,
        }))
        .unwrap()
    }

    fn ports() -> serde_json::Value {
        serde_json::json!({"ports": [
            {"name": "http", "port": 80, "nodePort": 30080},
            {"name": "https", "port": 443, "nodePort": 30443},
            {"name": "dns", "port": 53, "nodePort": 30053, "protocol": "UDP"},
        ]})
    }

    fn key(k: &str) -> String {
        format!("{PREFIX}{k}")
    }

    /// A mapping as (port, protocol, traffic protocol, certificate, policy).
    type Listener<'a> = (i32, &'a str, &'a str, Option<&'a str>, Option<&'a str>);

    #[test]
    fn tls_listeners_follow_upstreams_mapping() {
        let check = |annotations: serde_json::Value, expected: &[Listener<'_>]| {
            let wanted = wanted(&service(ports(), annotations.clone()), None).unwrap();
            let got: Vec<_> = wanted
                .mappings
                .iter()
                .map(|m| {
                    (
                        m.port,
                        m.protocol.as_str(),
                        m.traffic_protocol.as_str(),
                        m.certificate.as_deref(),
                        m.ssl_policy.as_deref(),
                    )
                })
                .collect();
            assert_eq!(got, expected, "{annotations}");
        };
        check(
            serde_json::json!({}),
            &[
                (80, "TCP", "TCP", None, None),
                (443, "TCP", "TCP", None, None),
                (53, "UDP", "UDP", None, None),
            ],
        );
        // Every TCP port by default, never UDP.
        check(
            serde_json::json!({key("ssl-cert"): "arn:c"}),
            &[
                (80, "TLS", "TCP", Some("arn:c"), None),
                (443, "TLS", "TCP", Some("arn:c"), None),
                (53, "UDP", "UDP", None, None),
            ],
        );
        check(
            serde_json::json!({key("ssl-cert"): "arn:c", key("ssl-ports"): "https", key("backend-protocol"): "ssl", key("ssl-negotiation-policy"): "ELBSecurityPolicy-TLS13-1-2-2021-06"}),
            &[
                (80, "TCP", "TCP", None, None),
                (
                    443,
                    "TLS",
                    "TLS",
                    Some("arn:c"),
                    Some("ELBSecurityPolicy-TLS13-1-2-2021-06"),
                ),
                (53, "UDP", "UDP", None, None),
            ],
        );
    }

    #[test]
    fn health_checks_are_upstreams_with_their_annotations() {
        let check = |spec: serde_json::Value,
                     annotations: serde_json::Value,
                     shared: Option<&SharedProbe>,
                     expected: (&str, &str, Option<&str>, [i32; 4])| {
            let health = wanted(&service(spec, annotations.clone()), shared)
                .unwrap()
                .mappings[0]
                .health
                .clone();
            assert_eq!(
                (
                    health.protocol.as_str(),
                    health.port.as_str(),
                    health.path.as_deref(),
                    [health.interval, health.timeout, health.healthy, health.unhealthy]
                ),
                expected,
                "{annotations}"
            );
        };
        let mut local = ports();
        local["type"] = "LoadBalancer".into();
        local["externalTrafficPolicy"] = "Local".into();
        local["healthCheckNodePort"] = 32000.into();
        check(
            ports(),
            serde_json::json!({}),
            None,
            ("TCP", "traffic-port", None, [30, 10, 3, 3]),
        );
        check(
            local.clone(),
            serde_json::json!({}),
            None,
            ("HTTP", "32000", Some("/healthz"), [10, 10, 2, 2]),
        );
        check(
            ports(),
            serde_json::json!({key("healthcheck-protocol"): "http", key("healthcheck-port"): "8080", key("healthcheck-interval"): "15", key("healthcheck-unhealthy-threshold"): "5"}),
            None,
            ("HTTP", "8080", Some("/"), [15, 10, 3, 5]),
        );
        check(
            ports(),
            serde_json::json!({key("healthcheck-protocol"): "HTTPS", key("healthcheck-path"): "/ready"}),
            None,
            ("HTTPS", "traffic-port", Some("/ready"), [30, 10, 3, 3]),
        );
        let shared = SharedProbe {
            port: 10256,
            path: "/healthz".into(),
        };
        check(
            ports(),
            serde_json::json!({}),
            Some(&shared),
            ("HTTP", "10256", Some("/healthz"), [30, 10, 3, 3]),
        );
        check(
            local,
            serde_json::json!({}),
            Some(&shared),
            ("HTTP", "32000", Some("/healthz"), [10, 10, 2, 2]),
        );
        for (annotations, message) in [
            (
                serde_json::json!({key("healthcheck-protocol"): "udp"}),
                "Unsupported health check protocol UDP".to_owned(),
            ),
            (
                serde_json::json!({key("healthcheck-port"): "web"}),
                "Invalid health check port 'web'".to_owned(),
            ),
            (
                serde_json::json!({key("healthcheck-timeout"): "soon"}),
                format!("error parsing service annotation: {PREFIX}healthcheck-timeout=soon"),
            ),
        ] {
            assert_eq!(
                wanted(&service(ports(), annotations), None)
                    .unwrap_err()
                    .to_string(),
                message
            );
        }
    }

    #[test]
    fn only_target_group_attributes_the_group_has_and_that_differ_are_set() {
        let have: BTreeMap<&str, &str> = [
            ("proxy_protocol_v2.enabled", "false"),
            ("preserve_client_ip.enabled", "true"),
        ]
        .into();
        let wanted: BTreeMap<String, String> = [
            ("proxy_protocol_v2.enabled", "true"),
            ("preserve_client_ip.enabled", "true"),
            ("something.else", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(
            target_group_attribute_changes(&have, &wanted),
            [("proxy_protocol_v2.enabled".to_owned(), "true".to_owned())]
        );
        assert!(target_group_attribute_changes(&BTreeMap::new(), &wanted).is_empty());
    }

    #[test]
    fn attributes_addresses_tags_and_labels_come_from_annotations() {
        let wanted = wanted(
            &service(
                ports(),
                serde_json::json!({
                    key("cross-zone-load-balancing-enabled"): "true",
                    key("access-log-enabled"): "true",
                    key("access-log-s3-bucket-name"): "logs",
                    key("access-log-s3-bucket-prefix"): "nlb",
                    key("target-group-attributes"): "proxy_protocol_v2.enabled=true,preserve_client_ip.enabled=true",
                    key("eip-allocations"): "eipalloc-1,eipalloc-2",
                    key("private-ipv4-addresses"): "10.0.0.5,10.0.1.5",
                    key("additional-resource-tags"): "team=web",
                    key("target-node-labels"): "pool=edge",
                }),
            ),
            None,
        )
        .unwrap();
        assert_eq!(
            wanted.attributes.pairs(),
            [
                ("load_balancing.cross_zone.enabled", "true".to_owned()),
                ("access_logs.s3.enabled", "true".to_owned()),
                ("access_logs.s3.bucket", "logs".to_owned()),
                ("access_logs.s3.prefix", "nlb".to_owned()),
            ]
        );
        assert_eq!(wanted.target_group_attributes.len(), 2);
        assert_eq!(
            wanted.eip_allocations.as_deref(),
            Some(&["eipalloc-1".to_owned(), "eipalloc-2".to_owned()][..])
        );
        assert_eq!(wanted.private_ipv4_addresses.as_ref().map(Vec::len), Some(2));
        assert_eq!(wanted.tags["team"], "web");
        assert_eq!(wanted.target_node_labels["pool"], "edge");
        let defaults = super::wanted(&service(ports(), serde_json::json!({})), None).unwrap();
        assert_eq!(
            defaults.attributes.pairs(),
            [
                ("load_balancing.cross_zone.enabled", "false".to_owned()),
                ("access_logs.s3.enabled", "false".to_owned()),
            ]
        );
        for (annotations, message) in [
            (
                serde_json::json!({key("target-group-attributes"): "deregistration_delay.timeout_seconds=5"}),
                "error validating target group attributes: the attribute \"deregistration_delay.timeout_seconds\" is not supported by the controller or is invalid",
            ),
            (
                serde_json::json!({key("target-group-attributes"): "preserve_client_ip.enabled=false"}),
                "error validating target group attributes: client IP preservation can't be disabled for UDP ports",
            ),
            (
                serde_json::json!({key("target-group-attributes"): "proxy_protocol_v2.enabled=yes"}),
                "error validating target group attributes: invalid attribute value for \"proxy_protocol_v2.enabled\": yes",
            ),
        ] {
            assert_eq!(
                super::wanted(&service(ports(), annotations), None)
                    .unwrap_err()
                    .to_string(),
                message
            );
        }
    }
}
