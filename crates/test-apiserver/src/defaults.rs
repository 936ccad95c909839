//! Defaulting and allocation the real server does on write, for the types where clients depend on it.

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// Cluster IPs and node ports handed out so far.
#[derive(Debug)]
pub(crate) struct Allocations {
    next_cluster_ip: u32,
    next_node_port: u16,
}

impl Default for Allocations {
    fn default() -> Self {
        Allocations {
            next_cluster_ip: 10,
            next_node_port: 30000,
        }
    }
}

impl Allocations {
    fn cluster_ip(&mut self) -> String {
        let n = self.next_cluster_ip;
        self.next_cluster_ip += 1;
        format!("10.96.{}.{}", (n >> 8) & 0xff, n & 0xff)
    }

    fn node_port(&mut self) -> u16 {
        let port = self.next_node_port;
        self.next_node_port = if port >= 32767 { 30000 } else { port + 1 };
        port
    }
}

/// Applies defaults to a new or updated object. `old` is the stored object for updates: allocated values
/// the update omits are kept, as the real server's `patchAllocatedValues` does.
pub(crate) fn apply(
    resource: &ResourceType,
    object: &mut Value,
    old: Option<&Value>,
    allocations: &mut Allocations,
) {
    match (resource.group, resource.plural) {
        ("", "services") => service(object, old, allocations),
        ("", "namespaces") if old.is_none() => {
            object["status"] = json!({"phase": "Active"});
        }
        _ => {}
    }
}

fn service(object: &mut Value, old: Option<&Value>, allocations: &mut Allocations) {
    if !object.get("spec").is_some_and(Value::is_object) {
        object["spec"] = json!({});
    }
    let old_spec = old.and_then(|o| o.get("spec")).cloned().unwrap_or(Value::Null);
    let spec = object["spec"].as_object_mut().expect("made an object above");
    let service_type = spec
        .entry("type")
        .or_insert(json!("ClusterIP"))
        .as_str()
        .unwrap_or("ClusterIP")
        .to_owned();
    spec.entry("sessionAffinity").or_insert(json!("None"));
    if service_type != "ExternalName" {
        let keep = old_spec
            .get("clusterIP")
            .filter(|ip| ip.as_str().is_some_and(|s| !s.is_empty()))
            .cloned();
        let cluster_ip = match spec.get("clusterIP").and_then(Value::as_str) {
            Some(ip) if !ip.is_empty() => ip.to_owned(),
            _ => keep
                .and_then(|ip| ip.as_str().map(str::to_owned))
                .unwrap_or_else(|| allocations.cluster_ip()),
        };
        spec.insert("clusterIP".to_owned(), json!(cluster_ip));
        if cluster_ip != "None" {
            spec.insert("clusterIPs".to_owned(), json!([cluster_ip]));
        }
        spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
        spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
        spec.entry("internalTrafficPolicy").or_insert(json!("Cluster"));
    }
    let exposes_node_ports = matches!(service_type.as_str(), "NodePort" | "LoadBalancer");
    if exposes_node_ports {
        spec.entry("externalTrafficPolicy").or_insert(json!("Cluster"));
    }
    if service_type == "LoadBalancer" {
        spec.entry("allocateLoadBalancerNodePorts").or_insert(json!(true));
    }
    let old_ports = old_spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports.iter_mut().filter_map(Value::as_object_mut) {
            port.entry("protocol").or_insert(json!("TCP"));
            if let Some(number) = port.get("port").cloned() {
                port.entry("targetPort").or_insert(number);
            }
            if exposes_node_ports && port.get("nodePort").is_none_or(|p| p.as_u64().unwrap_or(0) == 0) {
                let previous = old_ports
                    .iter()
                    .find(|p| p.get("port") == port.get("port"))
                    .and_then(|p| p.get("nodePort"))
                    .cloned();
                let node_port = previous
                    .filter(|p| p.as_u64().unwrap_or(0) > 0)
                    .unwrap_or_else(|| json!(allocations.node_port()));
                port.insert("nodePort".to_owned(), node_port);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{RESOURCES, find};

    #[test]
    fn load_balancer_services_get_ips_ports_and_keep_them() {
        let services = &RESOURCES[find("", "v1", "services").unwrap()];
        let mut allocations = Allocations::default();
        let mut service = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        apply(services, &mut service, None, &mut allocations);
        assert_eq!(service["spec"]["clusterIP"], "10.96.0.10");
        assert_eq!(
            service["spec"]["ports"][0],
            json!({"port": 80, "protocol": "TCP", "targetPort": 80, "nodePort": 30000})
        );
        assert_eq!(service["spec"]["externalTrafficPolicy"], "Cluster");
        let mut update = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        apply(services, &mut update, Some(&service), &mut allocations);
        assert_eq!(update["spec"]["clusterIP"], "10.96.0.10");
        assert_eq!(update["spec"]["ports"][0]["nodePort"], 30000);
    }
}
