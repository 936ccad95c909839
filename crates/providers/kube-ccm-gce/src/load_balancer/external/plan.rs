//! What a service wants of its external load balancer, worked out before any request.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::service::{self, annotation, service_key};
use kube_ccm_provider::{CloudError, default_load_balancer_name};

use super::super::health_check::{health_check_of, session_affinity};
use super::super::{ANNOTATION_NETWORK_TIER, service_description};

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
            serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 53, "protocol": "UDP"}], "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000, "loadBalancerSourceRanges": ["10.0.0.0/8"]}),
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
    fn ports_condense_into_ranges() {
        assert_eq!(
            condensed_ports(&BTreeSet::from([1, 2, 3, 5, 7, 8])),
            ["1-3", "5", "7-8"]
        );
        // The top of the range does not overflow.
        assert_eq!(
            condensed_ports(&BTreeSet::from([i32::MAX - 1, i32::MAX])),
            [format!("{}-{}", i32::MAX - 1, i32::MAX)]
        );
    }
}
