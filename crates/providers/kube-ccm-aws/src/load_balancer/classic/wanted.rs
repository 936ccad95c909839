//! What a service asks of its classic ELB, as upstream reads it (pure: no AWS call).
//!
//! Upstream's annotations (prefix `service.beta.kubernetes.io/aws-load-balancer-`):
//! - `ssl-cert`, `ssl-ports` (numbers or names, default every port), `backend-protocol`: an SSL or HTTPS
//!   listener with the certificate on those ports (backend `ssl`/`tcp` → SSL, `https`/`http` → HTTPS);
//!   without a certificate, `backend-protocol: http` makes HTTP listeners (upstream's `buildListener`).
//! - `ssl-negotiation-policy`: the predefined policy the TLS listeners use.
//! - `proxy-protocol: *`: the proxy protocol to every backend port.
//! - `access-log-*`, `connection-draining-*`, `connection-idle-timeout`,
//!   `cross-zone-load-balancing-enabled`: the ELB's attributes, upstream's defaults otherwise (access log
//!   and draining off, idle timeout 60 s, cross-zone off), synced whether or not annotated, as upstream.
//! - `healthcheck-protocol`, `-port` (`traffic-port` or a number), `-path`, `-interval`, `-timeout`,
//!   `-healthy-threshold`, `-unhealthy-threshold`: the health check (upstream's 10/5/2/6 otherwise).
//! - `additional-resource-tags` (`k=v,…`): more tags on the ELB and the security group made for it.
//! - `security-groups` (replaces the group made for the ELB) and `extra-security-groups` (added).
//! - `target-node-labels` (`k=v,…`, an empty value matching any): only matching nodes are registered.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::service;
use kube_ccm_provider::{CloudError, default_load_balancer_name};

use super::super::{
    PREFIX, SslPorts, annotated_subnets, annotation, go_bool, is_internal, key_values, list, number,
};

/// Health-check settings as upstream's defaults for classic ELBs.
const HEALTH_INTERVAL: i32 = 10;
const HEALTH_TIMEOUT: i32 = 5;
const HEALTHY_THRESHOLD: i32 = 2;
const UNHEALTHY_THRESHOLD: i32 = 6;
/// Upstream's default idle timeout, seconds.
const IDLE_TIMEOUT: i32 = 60;
/// `healthcheck-port` naming the traffic port.
const TRAFFIC_PORT: &str = "traffic-port";

/// What the service asks of its ELB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The ELB's name.
    pub name: String,
    /// One per TCP port with a node port.
    pub listeners: Vec<WantedListener>,
    /// Internal scheme.
    pub internal: bool,
    /// Who may connect (`loadBalancerSourceRanges`, default everyone).
    pub source_ranges: Vec<String>,
    /// The health check.
    pub health: WantedHealthCheck,
    /// Subnets from the annotation.
    pub subnets: Option<Vec<String>>,
    /// `namespace/name`.
    pub service: String,
    /// The ELB's attributes.
    pub attributes: WantedAttributes,
    /// `additional-resource-tags`.
    pub tags: BTreeMap<String, String>,
    /// `target-node-labels`.
    pub target_node_labels: BTreeMap<String, String>,
    /// `proxy-protocol: *`.
    pub proxy_protocol: bool,
    /// `ssl-negotiation-policy`.
    pub ssl_negotiation_policy: Option<String>,
    /// `security-groups`: the ELB's groups instead of the one made for it.
    pub security_groups: Vec<String>,
    /// `extra-security-groups`: groups added to the ELB's.
    pub extra_security_groups: Vec<String>,
}

/// A listener, as the ELB API names its parts (protocols in upper case, as ELB answers them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedListener {
    /// The load balancer's port.
    pub port: i32,
    /// The node port it forwards to.
    pub node_port: i32,
    /// `TCP`, `SSL`, `HTTP` or `HTTPS`.
    pub protocol: String,
    /// The backend's.
    pub instance_protocol: String,
    /// The certificate of an SSL or HTTPS listener.
    pub certificate: Option<String>,
}

/// The health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedHealthCheck {
    /// `TCP:30080`, `HTTP:32000/healthz`.
    pub target: String,
    /// Seconds.
    pub interval: i32,
    /// Seconds.
    pub timeout: i32,
    /// Checks.
    pub healthy_threshold: i32,
    /// Checks.
    pub unhealthy_threshold: i32,
}

/// The ELB's attributes (upstream's defaults where not annotated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedAttributes {
    /// Access logs on.
    pub access_log_enabled: bool,
    /// Minutes between log files.
    pub access_log_emit_interval: Option<i32>,
    /// The log bucket.
    pub access_log_bucket: Option<String>,
    /// The logs' prefix in it.
    pub access_log_prefix: Option<String>,
    /// Connection draining on.
    pub draining_enabled: bool,
    /// Seconds of draining.
    pub draining_timeout: Option<i32>,
    /// Seconds a connection may idle.
    pub idle_timeout: i32,
    /// Cross-zone load balancing on.
    pub cross_zone: bool,
}

fn refuse<T>(why: String) -> Result<T, CloudError> {
    Err(CloudError::provider(why))
}

/// Upstream's `buildListener` for each TCP port with a node port.
fn listeners(service: &Service) -> Result<Vec<WantedListener>, CloudError> {
    let spec = service.spec.clone().unwrap_or_default();
    let certificate = annotation(service, "ssl-cert").filter(|c| !c.is_empty());
    let backend = annotation(service, "backend-protocol").unwrap_or_default();
    let ssl_ports = SslPorts::of(service);
    let mut listeners = Vec::new();
    for port in spec.ports.iter().flatten() {
        let protocol = port.protocol.as_deref().unwrap_or("TCP");
        if protocol != "TCP" {
            return refuse(format!(
                "port {}: protocol {protocol}: classic ELBs take TCP only ({PREFIX}type: nlb takes UDP)",
                port.port
            ));
        }
        let Some(node_port) = port.node_port.filter(|p| *p > 0) else {
            continue;
        };
        // Upstream compares classic ports' names in lower case.
        let name = port.name.as_deref().unwrap_or_default().to_lowercase();
        let on_ssl_port = ssl_ports.covers(port.port, &name);
        let (protocol, instance_protocol, certificate) = match &certificate {
            Some(certificate) if on_ssl_port => {
                let (front, back) = match backend.as_str() {
                    "" => ("SSL", "TCP".to_owned()),
                    "https" | "http" => ("HTTPS", backend.to_uppercase()),
                    "ssl" | "tcp" => ("SSL", backend.to_uppercase()),
                    other => {
                        return refuse(format!(
                            "Invalid backend protocol {other} for {certificate} in {PREFIX}backend-protocol"
                        ));
                    }
                };
                (front.to_owned(), back, Some(certificate.clone()))
            }
            _ if backend == "http" => ("HTTP".to_owned(), "HTTP".to_owned(), None),
            _ => ("TCP".to_owned(), "TCP".to_owned(), None),
        };
        listeners.push(WantedListener {
            port: port.port,
            node_port,
            protocol,
            instance_protocol,
            certificate,
        });
    }
    Ok(listeners)
}

/// Upstream's health check: its target from the traffic policy and the annotations, its timing from the
/// annotations or the defaults.
fn health(service: &Service, first_node_port: i32) -> Result<WantedHealthCheck, CloudError> {
    let port_annotation = annotation(service, "healthcheck-port");
    let (mut protocol, mut port, mut path) = match service::health_check_path_port(service) {
        Some((path, node_port)) => {
            let port = if port_annotation.as_deref() == Some(TRAFFIC_PORT) {
                first_node_port
            } else {
                node_port
            };
            ("HTTP".to_owned(), port, path.to_owned())
        }
        _ => {
            let backend = annotation(service, "backend-protocol")
                .unwrap_or_default()
                .to_lowercase();
            let protocol = if matches!(backend.as_str(), "https" | "ssl") {
                "SSL"
            } else {
                "TCP"
            };
            (protocol.to_owned(), first_node_port, String::new())
        }
    };
    if let Some(annotated) = annotation(service, "healthcheck-protocol") {
        protocol = annotated.to_uppercase();
    }
    if let Some(annotated) = port_annotation.filter(|p| p != TRAFFIC_PORT) {
        port = annotated.trim().parse().or_else(|_| {
            refuse(format!(
                "error parsing service annotation: {PREFIX}healthcheck-port={annotated}"
            ))
        })?;
    }
    if matches!(protocol.as_str(), "HTTP" | "HTTPS") {
        if path.is_empty() {
            path = "/".to_owned();
        }
        if let Some(annotated) = annotation(service, "healthcheck-path").filter(|p| !p.is_empty()) {
            path = annotated;
        }
    } else {
        path.clear();
    }
    let wanted = WantedHealthCheck {
        target: format!("{protocol}:{port}{path}"),
        interval: number(service, "healthcheck-interval")?.unwrap_or(HEALTH_INTERVAL),
        timeout: number(service, "healthcheck-timeout")?.unwrap_or(HEALTH_TIMEOUT),
        healthy_threshold: number(service, "healthcheck-healthy-threshold")?.unwrap_or(HEALTHY_THRESHOLD),
        unhealthy_threshold: number(service, "healthcheck-unhealthy-threshold")?
            .unwrap_or(UNHEALTHY_THRESHOLD),
    };
    // The minimums the ELB API takes (upstream's ValidateHealthCheck).
    for (what, value, least) in [
        ("interval", wanted.interval, 5),
        ("timeout", wanted.timeout, 2),
        ("healthy-threshold", wanted.healthy_threshold, 2),
        ("unhealthy-threshold", wanted.unhealthy_threshold, 2),
    ] {
        if value < least {
            return refuse(format!(
                "some of the load balancer health check parameters are invalid: {PREFIX}healthcheck-{what}={value} is below {least}"
            ));
        }
    }
    Ok(wanted)
}

fn attributes(service: &Service) -> Result<WantedAttributes, CloudError> {
    let text = |key: &str| annotation(service, key).filter(|v| !v.is_empty());
    Ok(WantedAttributes {
        access_log_enabled: go_bool(service, "access-log-enabled")?.unwrap_or(false),
        access_log_emit_interval: number(service, "access-log-emit-interval")?,
        access_log_bucket: text("access-log-s3-bucket-name"),
        access_log_prefix: text("access-log-s3-bucket-prefix"),
        draining_enabled: go_bool(service, "connection-draining-enabled")?.unwrap_or(false),
        draining_timeout: number(service, "connection-draining-timeout")?,
        idle_timeout: number(service, "connection-idle-timeout")?.unwrap_or(IDLE_TIMEOUT),
        cross_zone: go_bool(service, "cross-zone-load-balancing-enabled")?.unwrap_or(false),
    })
}

/// The service's ELB as upstream would make it, or why it cannot have one.
pub fn wanted(service: &Service) -> Result<Wanted, CloudError> {
    let spec = service.spec.clone().unwrap_or_default();
    if spec.session_affinity.as_deref().is_some_and(|a| a != "None") {
        return refuse(format!(
            "session affinity {:?} is not supported by AWS load balancers",
            spec.session_affinity.unwrap_or_default()
        ));
    }
    if spec.load_balancer_ip.as_deref().is_some_and(|ip| !ip.is_empty()) {
        return refuse("spec.loadBalancerIP is not supported by AWS load balancers".into());
    }
    let listeners = listeners(service)?;
    let Some(first) = listeners.first() else {
        return refuse("the service has no port with a node port yet".into());
    };
    let health = health(service, first.node_port)?;
    let proxy_protocol = match annotation(service, "proxy-protocol").filter(|v| !v.is_empty()) {
        None => false,
        Some(value) if value == "*" => true,
        Some(value) => {
            return refuse(format!(
                "annotation \"{PREFIX}proxy-protocol\"={value:?} detected, but the only value supported currently is '*'"
            ));
        }
    };
    let source_ranges = service::load_balancer_source_ranges(service)?
        .iter()
        .map(ToString::to_string)
        .collect();
    Ok(Wanted {
        name: default_load_balancer_name(service),
        listeners,
        internal: is_internal(service),
        source_ranges,
        health,
        subnets: annotated_subnets(service),
        service: format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or("default"),
            service.metadata.name.as_deref().unwrap_or_default()
        ),
        attributes: attributes(service)?,
        tags: key_values(service, "additional-resource-tags"),
        target_node_labels: key_values(service, "target-node-labels"),
        proxy_protocol,
        ssl_negotiation_policy: annotation(service, "ssl-negotiation-policy"),
        security_groups: list(service, "security-groups"),
        extra_security_groups: list(service, "extra-security-groups"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    fn base() -> serde_json::Value {
        serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"},
            "spec": {"type": "LoadBalancer", "ports": [
                {"name": "http", "port": 80, "nodePort": 30080},
                {"name": "https", "port": 443, "nodePort": 30443},
                {"port": 8080},
            ]},
        })
    }

    fn annotated(annotations: serde_json::Value) -> Service {
        let mut value = base();
        value["metadata"]["annotations"] = annotations;
        service(value)
    }

    #[test]
    fn services_are_validated_and_mapped_as_upstream() {
        let wanted = wanted(&service(base())).unwrap();
        assert_eq!(wanted.name, "a0a1b2c3d4e5f60718293a4b5c6d7e8f");
        let plain: Vec<(i32, i32, &str)> = wanted
            .listeners
            .iter()
            .map(|l| (l.port, l.node_port, l.protocol.as_str()))
            .collect();
        assert_eq!(plain, [(80, 30080, "TCP"), (443, 30443, "TCP")]);
        assert_eq!(wanted.health.target, "TCP:30080");
        assert_eq!(
            (
                wanted.health.interval,
                wanted.health.timeout,
                wanted.health.healthy_threshold,
                wanted.health.unhealthy_threshold
            ),
            (10, 5, 2, 6)
        );
        assert_eq!(wanted.source_ranges, ["0.0.0.0/0"]);
        assert_eq!(wanted.service, "shop/web");
        assert_eq!(
            wanted.attributes,
            WantedAttributes {
                access_log_enabled: false,
                access_log_emit_interval: None,
                access_log_bucket: None,
                access_log_prefix: None,
                draining_enabled: false,
                draining_timeout: None,
                idle_timeout: 60,
                cross_zone: false,
            }
        );
        assert!(!wanted.proxy_protocol && wanted.tags.is_empty() && wanted.security_groups.is_empty());
        // Source ranges as upstream's service helper reads them: the field, else the annotation, each
        // as its network; a bad one is an error naming where it came from.
        let from_annotation = annotated(serde_json::json!({
            "service.beta.kubernetes.io/load-balancer-source-ranges": "192.168.1.9/24, 10.0.0.0/8"
        }));
        assert_eq!(
            super::wanted(&from_annotation).unwrap().source_ranges,
            ["10.0.0.0/8", "192.168.1.0/24"]
        );
        let mut bad = base();
        bad["spec"]["loadBalancerSourceRanges"] = serde_json::json!(["10.0.0.0"]);
        let error = super::wanted(&service(bad)).unwrap_err().to_string();
        assert!(error.contains("service.Spec.LoadBalancerSourceRanges"), "{error}");
        let mut local = base();
        local["spec"]["externalTrafficPolicy"] = "Local".into();
        local["spec"]["healthCheckNodePort"] = 32000.into();
        assert_eq!(
            super::wanted(&service(local)).unwrap().health.target,
            "HTTP:32000/healthz"
        );
        for (field, value, message) in [
            (
                "sessionAffinity",
                serde_json::json!("ClientIP"),
                "session affinity \"ClientIP\" is not supported by AWS load balancers",
            ),
            (
                "loadBalancerIP",
                serde_json::json!("1.2.3.4"),
                "spec.loadBalancerIP is not supported by AWS load balancers",
            ),
            (
                "ports",
                serde_json::json!([{"port": 53, "nodePort": 30053, "protocol": "UDP"}]),
                "port 53: protocol UDP: classic ELBs take TCP only (service.beta.kubernetes.io/aws-load-balancer-type: nlb takes UDP)",
            ),
            (
                "ports",
                serde_json::json!([{"port": 80}]),
                "the service has no port with a node port yet",
            ),
        ] {
            let mut bad = base();
            bad["spec"][field] = value;
            assert_eq!(super::wanted(&service(bad)).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn listeners_follow_upstreams_build_listener() {
        // (annotations, expected (port, protocol, instance protocol, certificate) per listener)
        let check = |annotations: serde_json::Value, expected: &[(i32, &str, &str, Option<&str>)]| {
            let listeners = wanted(&annotated(annotations.clone())).unwrap().listeners;
            let got: Vec<(i32, &str, &str, Option<&str>)> = listeners
                .iter()
                .map(|l| {
                    (
                        l.port,
                        l.protocol.as_str(),
                        l.instance_protocol.as_str(),
                        l.certificate.as_deref(),
                    )
                })
                .collect();
            assert_eq!(got, expected, "{annotations}");
        };
        let cert = "arn:aws:acm:us-east-1:123456789012:certificate/x";
        let key = |k: &str| format!("{PREFIX}{k}");
        check(
            serde_json::json!({key("ssl-cert"): cert}),
            &[(80, "SSL", "TCP", Some(cert)), (443, "SSL", "TCP", Some(cert))],
        );
        check(
            serde_json::json!({key("ssl-cert"): cert, key("ssl-ports"): "443"}),
            &[(80, "TCP", "TCP", None), (443, "SSL", "TCP", Some(cert))],
        );
        // Ports by name, and `*` for all.
        check(
            serde_json::json!({key("ssl-cert"): cert, key("ssl-ports"): "https", key("backend-protocol"): "http"}),
            &[(80, "HTTP", "HTTP", None), (443, "HTTPS", "HTTP", Some(cert))],
        );
        check(
            serde_json::json!({key("ssl-cert"): cert, key("ssl-ports"): "*", key("backend-protocol"): "https"}),
            &[
                (80, "HTTPS", "HTTPS", Some(cert)),
                (443, "HTTPS", "HTTPS", Some(cert)),
            ],
        );
        check(
            serde_json::json!({key("ssl-cert"): cert, key("backend-protocol"): "ssl"}),
            &[(80, "SSL", "SSL", Some(cert)), (443, "SSL", "SSL", Some(cert))],
        );
        // Without a certificate only `http` changes anything.
        check(
            serde_json::json!({key("backend-protocol"): "http"}),
            &[(80, "HTTP", "HTTP", None), (443, "HTTP", "HTTP", None)],
        );
        check(
            serde_json::json!({key("backend-protocol"): "https"}),
            &[(80, "TCP", "TCP", None), (443, "TCP", "TCP", None)],
        );
        let bad = wanted(&annotated(
            serde_json::json!({key("ssl-cert"): cert, key("backend-protocol"): "udp"}),
        ));
        assert_eq!(
            bad.unwrap_err().to_string(),
            format!("Invalid backend protocol udp for {cert} in {PREFIX}backend-protocol")
        );
    }

    #[test]
    fn health_checks_follow_the_traffic_policy_and_the_annotations() {
        let key = |k: &str| format!("{PREFIX}{k}");
        let check = |spec: serde_json::Value, annotations: serde_json::Value, expected: &str| {
            let mut value = base();
            for (field, v) in spec.as_object().unwrap() {
                value["spec"][field] = v.clone();
            }
            value["metadata"]["annotations"] = annotations.clone();
            let health = wanted(&service(value)).unwrap().health;
            assert_eq!(health.target, expected, "{spec} {annotations}");
        };
        let local = serde_json::json!({"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000});
        check(serde_json::json!({}), serde_json::json!({}), "TCP:30080");
        check(local.clone(), serde_json::json!({}), "HTTP:32000/healthz");
        check(
            local.clone(),
            serde_json::json!({key("healthcheck-port"): "traffic-port"}),
            "HTTP:30080/healthz",
        );
        check(
            local,
            serde_json::json!({key("healthcheck-path"): "/ready"}),
            "HTTP:32000/ready",
        );
        check(
            serde_json::json!({}),
            serde_json::json!({key("backend-protocol"): "ssl"}),
            "SSL:30080",
        );
        check(
            serde_json::json!({}),
            serde_json::json!({key("healthcheck-protocol"): "http", key("healthcheck-port"): "10256"}),
            "HTTP:10256/",
        );
        check(
            serde_json::json!({}),
            serde_json::json!({key("healthcheck-protocol"): "HTTPS", key("healthcheck-path"): "/z"}),
            "HTTPS:30080/z",
        );
        let timed = wanted(&annotated(serde_json::json!({
            key("healthcheck-interval"): "30",
            key("healthcheck-timeout"): "7",
            key("healthcheck-healthy-threshold"): "3",
            key("healthcheck-unhealthy-threshold"): "4",
        })))
        .unwrap()
        .health;
        assert_eq!(
            (
                timed.interval,
                timed.timeout,
                timed.healthy_threshold,
                timed.unhealthy_threshold
            ),
            (30, 7, 3, 4)
        );
        for (annotations, message) in [
            (
                serde_json::json!({key("healthcheck-interval"): "often"}),
                format!("error parsing service annotation: {PREFIX}healthcheck-interval=often"),
            ),
            (
                serde_json::json!({key("healthcheck-timeout"): "1"}),
                format!(
                    "some of the load balancer health check parameters are invalid: {PREFIX}healthcheck-timeout=1 is below 2"
                ),
            ),
        ] {
            assert_eq!(wanted(&annotated(annotations)).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn attributes_tags_groups_and_policies_come_from_annotations() {
        let key = |k: &str| format!("{PREFIX}{k}");
        let wanted = wanted(&annotated(serde_json::json!({
            key("access-log-enabled"): "true",
            key("access-log-emit-interval"): "5",
            key("access-log-s3-bucket-name"): "logs",
            key("access-log-s3-bucket-prefix"): "elb/web",
            key("connection-draining-enabled"): "T",
            key("connection-draining-timeout"): "30",
            key("connection-idle-timeout"): "120",
            key("cross-zone-load-balancing-enabled"): "1",
            key("additional-resource-tags"): "team=web, cost-centre=42,flag",
            key("target-node-labels"): "pool=edge,zone",
            key("proxy-protocol"): "*",
            key("ssl-negotiation-policy"): "ELBSecurityPolicy-TLS-1-2-2017-01",
            key("security-groups"): "sg-1, sg-2",
            key("extra-security-groups"): "sg-3,",
        })))
        .unwrap();
        assert_eq!(
            wanted.attributes,
            WantedAttributes {
                access_log_enabled: true,
                access_log_emit_interval: Some(5),
                access_log_bucket: Some("logs".into()),
                access_log_prefix: Some("elb/web".into()),
                draining_enabled: true,
                draining_timeout: Some(30),
                idle_timeout: 120,
                cross_zone: true,
            }
        );
        let pairs =
            |map: &BTreeMap<String, String>| map.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
        assert_eq!(pairs(&wanted.tags), ["cost-centre=42", "flag=", "team=web"]);
        assert_eq!(pairs(&wanted.target_node_labels), ["pool=edge", "zone="]);
        assert!(wanted.proxy_protocol);
        assert_eq!(
            wanted.ssl_negotiation_policy.as_deref(),
            Some("ELBSecurityPolicy-TLS-1-2-2017-01")
        );
        assert_eq!(wanted.security_groups, ["sg-1", "sg-2"]);
        assert_eq!(wanted.extra_security_groups, ["sg-3"]);
        for (annotations, message) in [
            (
                serde_json::json!({key("proxy-protocol"): "80"}),
                format!(
                    "annotation \"{PREFIX}proxy-protocol\"=\"80\" detected, but the only value supported currently is '*'"
                ),
            ),
            (
                serde_json::json!({key("cross-zone-load-balancing-enabled"): "yes"}),
                format!("error parsing service annotation: {PREFIX}cross-zone-load-balancing-enabled=yes"),
            ),
        ] {
            assert_eq!(
                super::wanted(&annotated(annotations)).unwrap_err().to_string(),
                message
            );
        }
    }
}
