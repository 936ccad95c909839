//! What a service wants of its internal load balancer, worked out before any request.

use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::service::{self, annotation, service_key};
use kube_ccm_provider::{CloudError, default_load_balancer_name};

use super::super::external::condensed_ports;
use super::super::health_check::{health_check_of, session_affinity};
use super::super::service_description;

/// The subnet the load balancer's address is taken from (a name in the cluster's region).
pub const ANNOTATION_SUBNET: &str = "networking.gke.io/internal-load-balancer-subnet";
/// `"true"`: clients in every region of the network may connect.
pub const ANNOTATION_GLOBAL_ACCESS: &str = "networking.gke.io/internal-load-balancer-allow-global-access";
/// `"true"`: services of one protocol and affinity share a backend service (not with local traffic).
pub const ANNOTATION_BACKEND_SHARE: &str = "alpha.cloud.google.com/load-balancer-backend-share";
/// The older form of [`ANNOTATION_BACKEND_SHARE`].
pub const ANNOTATION_BACKEND_SHARE_BETA: &str = "cloud.google.com/load-balancer-backend-share";
/// A forwarding rule lists at most this many ports; a service with more gets all ports.
pub const MAX_RULE_PORTS: usize = 5;

/// What a service wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalPlan {
    /// The load balancer's name (forwarding rule, address; backend service and health check unless
    /// shared).
    pub name: String,
    /// `ns/name`.
    pub service: String,
    /// `{"kubernetes.io/service-name":"ns/name"}`.
    pub description: String,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The service's ports, as the forwarding rule lists them (none with [`InternalPlan::all_ports`]).
    pub ports: Vec<String>,
    /// More than [`MAX_RULE_PORTS`] ports: the rule takes every port.
    pub all_ports: bool,
    /// The ports, condensed, for the firewall (`80`, `443-445`).
    pub firewall_ports: Vec<String>,
    /// Client source ranges.
    pub source_ranges: Vec<String>,
    /// `CLIENT_IP` or `NONE`.
    pub session_affinity: String,
    /// The backend service's name: the load balancer's, or a shared one.
    pub backend_service: String,
    /// The backend service's description (empty when shared).
    pub backend_description: String,
    /// The health check's name and port.
    pub health_check: (String, i32),
    /// Whether the health check is the service's own (`externalTrafficPolicy: Local`).
    pub local: bool,
    /// The subnet annotation's name, if any.
    pub subnet: Option<String>,
    /// Clients in every region may connect.
    pub global_access: bool,
    /// The requested IP, if any.
    pub requested_ip: Option<String>,
}

impl InternalPlan {
    /// The health-check firewall: `k8s-<cluster ID>-node-hc` when shared, `<lb>-hc` otherwise.
    pub fn health_check_firewall(&self) -> String {
        format!("{}-hc", self.health_check.0)
    }
}

/// Works out what `service` wants; `cluster_id` names the shared health check and backend services.
pub fn plan(service: &Service, cluster_id: &str) -> Result<InternalPlan, CloudError> {
    let invalid = |message: String| CloudError::provider(message);
    let spec = service.spec.clone().unwrap_or_default();
    let ports = spec.ports.unwrap_or_default();
    if ports.is_empty() {
        return Err(invalid("no ports specified for GCE load balancer".into()));
    }
    let protocol_of =
        |p: &k8s_openapi::api::core::v1::ServicePort| p.protocol.clone().unwrap_or_else(|| "TCP".into());
    let protocol = protocol_of(&ports[0]);
    if ports.iter().any(|p| protocol_of(p) != protocol) {
        return Err(invalid("mixed protocol is not supported for LoadBalancer".into()));
    }
    if protocol != "TCP" && protocol != "UDP" {
        return Err(invalid(format!(
            "Invalid protocol {protocol}, only TCP and UDP are supported"
        )));
    }
    let numbers: std::collections::BTreeSet<i32> = ports.iter().map(|p| p.port).collect();
    let all_ports = ports.len() > MAX_RULE_PORTS;
    let rule_ports = if all_ports {
        Vec::new()
    } else {
        ports.iter().map(|p| p.port.to_string()).collect()
    };
    // A Compute firewall holds one family: with IPv4 ranges given, the IPv6 ones are the IPv6
    // firewall's (`ipv6.rs`).
    let ranges = service::load_balancer_source_ranges(service)?;
    let any_ipv4 = ranges.iter().any(kube_ccm_provider::Cidr::is_ipv4);
    let source_ranges = ranges
        .iter()
        .filter(|r| r.is_ipv4() || !any_ipv4)
        .map(ToString::to_string)
        .collect();
    let session_affinity = session_affinity(service);
    let name = default_load_balancer_name(service);
    let (health_check, local) = health_check_of(service, &name, cluster_id);
    let share = [ANNOTATION_BACKEND_SHARE, ANNOTATION_BACKEND_SHARE_BETA]
        .iter()
        .any(|key| annotation(service, key) == Some("true"))
        && !service::requests_only_local_traffic(service);
    let description = service_description(service);
    let (backend_service, backend_description) = if share {
        (
            shared_backend_service(cluster_id, &protocol, spec.session_affinity.as_deref()),
            String::new(),
        )
    } else {
        (name.clone(), description.clone())
    };
    Ok(InternalPlan {
        service: service_key(service),
        description,
        protocol,
        ports: rule_ports,
        all_ports,
        firewall_ports: condensed_ports(&numbers),
        source_ranges,
        session_affinity: session_affinity.to_owned(),
        backend_service,
        backend_description,
        health_check,
        local,
        subnet: annotation(service, ANNOTATION_SUBNET)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
        global_access: annotation(service, ANNOTATION_GLOBAL_ACCESS) == Some("true"),
        requested_ip: spec.load_balancer_ip.filter(|ip| !ip.is_empty()),
        name,
    })
}

/// Upstream's shared backend service: `k8s-<cluster ID>-internal-<tcp|udp>-nmv1-<h>`, `<h>` the first 16
/// hex digits of the SHA-1 of the service's session affinity as written in the spec (`None`, `ClientIP`).
pub fn shared_backend_service(cluster_id: &str, protocol: &str, affinity: Option<&str>) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        affinity.unwrap_or_default().as_bytes(),
    );
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "k8s-{cluster_id}-internal-{}-nmv1-{}",
        protocol.to_ascii_lowercase(),
        &hex[..16]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(spec: serde_json::Value, annotations: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "api", "namespace": "shop", "uid": "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", "annotations": annotations},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn plans_as_upstream() {
        let s = service(
            serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 443}, {"port": 80}, {"port": 444}]}),
            serde_json::json!({"networking.gke.io/load-balancer-type": "Internal"}),
        );
        let p = plan(&s, "c1d2").unwrap();
        assert_eq!(p.name, "a0a1b2c3d4e5f60718293a4b5c6d7e8f");
        assert_eq!(p.backend_service, p.name);
        assert_eq!(
            p.backend_description,
            r#"{"kubernetes.io/service-name":"shop/api"}"#
        );
        assert_eq!(p.ports, ["443", "80", "444"]);
        assert!(!p.all_ports);
        assert_eq!(p.firewall_ports, ["80", "443-444"]);
        assert_eq!(p.health_check, ("k8s-c1d2-node".to_owned(), 10256));
        assert_eq!(p.health_check_firewall(), "k8s-c1d2-node-hc");
        assert_eq!((p.subnet.as_deref(), p.global_access), (None, false));
        assert_eq!(p.source_ranges, ["0.0.0.0/0"]);

        let local = service(
            serde_json::json!({"type": "LoadBalancer", "ports": (1..=6).map(|n| serde_json::json!({"port": 8000 + n, "protocol": "UDP"})).collect::<Vec<_>>(), "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000, "sessionAffinity": "ClientIP", "loadBalancerIP": "10.0.0.9"}),
            serde_json::json!({
                ANNOTATION_SUBNET: "ilb-subnet", ANNOTATION_GLOBAL_ACCESS: "true",
                // Not shared with local traffic.
                ANNOTATION_BACKEND_SHARE: "true",
            }),
        );
        let p = plan(&local, "c1d2").unwrap();
        assert!(p.all_ports && p.ports.is_empty());
        assert_eq!(p.firewall_ports, ["8001-8006"]);
        assert_eq!(p.health_check, (p.name.clone(), 31000));
        assert_eq!(p.health_check_firewall(), format!("{}-hc", p.name));
        assert_eq!(
            (p.protocol.as_str(), p.session_affinity.as_str()),
            ("UDP", "CLIENT_IP")
        );
        assert_eq!((p.subnet.as_deref(), p.global_access), (Some("ilb-subnet"), true));
        assert_eq!(p.requested_ip.as_deref(), Some("10.0.0.9"));
        assert_eq!(p.backend_service, p.name);
    }

    #[test]
    fn shared_backend_services_are_named_by_protocol_and_affinity() {
        let shared = service(
            serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 80}], "sessionAffinity": "None"}),
            serde_json::json!({ANNOTATION_BACKEND_SHARE_BETA: "true"}),
        );
        let p = plan(&shared, "c1d2").unwrap();
        // SHA-1 of "None" is 6eef6648406c333a4035cd5e60d0bf2ecf2606d7.
        assert_eq!(p.backend_service, "k8s-c1d2-internal-tcp-nmv1-6eef6648406c333a");
        assert_eq!(p.backend_description, "");
        assert_eq!(
            shared_backend_service("c1d2", "UDP", Some("ClientIP")),
            "k8s-c1d2-internal-udp-nmv1-1668fd70f588116e"
        );
    }

    #[test]
    fn bad_services_are_one_clear_error() {
        for (spec, needle) in [
            (serde_json::json!({"ports": []}), "no ports specified"),
            (
                serde_json::json!({"ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}),
                "mixed protocol is not supported",
            ),
            (
                serde_json::json!({"ports": [{"port": 80, "protocol": "SCTP"}]}),
                "Invalid protocol SCTP",
            ),
            (
                serde_json::json!({"ports": [{"port": 80}], "loadBalancerSourceRanges": ["10.0.0.0"]}),
                "is not valid",
            ),
        ] {
            let error = plan(&service(spec.clone(), serde_json::json!({})), "c")
                .unwrap_err()
                .to_string();
            assert!(error.contains(needle), "{spec}: {error}");
        }
    }
}
