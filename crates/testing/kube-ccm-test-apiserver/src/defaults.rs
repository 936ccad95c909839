//! Defaulting and allocation the real server does on write, for the types where clients depend on it.

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// Features of the real server that can be off, as on an older one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Features {
    /// `LoadBalancerIPMode` (Kubernetes 1.30 and later): `status.loadBalancer.ingress[].ipMode` is stored.
    /// Off, the field is dropped from what is written, as the real server drops a disabled field.
    pub(crate) load_balancer_ip_mode: bool,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            load_balancer_ip_mode: true,
        }
    }
}

/// Drops the fields of features that are off from a written object (after validation, which on the real
/// server does not ask for them then).
pub(crate) fn drop_disabled_fields(resource: &ResourceType, object: &mut Value, features: Features) {
    if (resource.group, resource.plural) != ("", "services") || features.load_balancer_ip_mode {
        return;
    }
    if let Some(ingress) = object
        .pointer_mut("/status/loadBalancer/ingress")
        .and_then(Value::as_array_mut)
    {
        for entry in ingress.iter_mut().filter_map(Value::as_object_mut) {
            entry.remove("ipMode");
        }
    }
}

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
        ("", "nodes") if old.is_none() => {
            not_ready_taint(object);
            node_status(object);
        }
        ("coordination.k8s.io", "leases") => coordinated_leader_election_off(object, old),
        ("", "namespaces") if old.is_none() => {
            object["status"] = json!({"phase": "Active"});
        }
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => binding(object),
        _ => {}
    }
}

/// The `TaintNodesByCondition` admission plugin (on by default): a new node gets
/// `node.kubernetes.io/not-ready:NoSchedule` unless it has that taint already, until the node lifecycle
/// controller of kube-controller-manager sees it Ready.
fn not_ready_taint(object: &mut Value) {
    const NOT_READY: &str = "node.kubernetes.io/not-ready";
    if !object["spec"].is_object() {
        object["spec"] = json!({});
    }
    let spec = &mut object["spec"];
    if !spec["taints"].is_array() {
        spec["taints"] = json!([]);
    }
    let taints = spec["taints"].as_array_mut().expect("an array");
    let present = taints
        .iter()
        .any(|t| t["key"] == NOT_READY && t["effect"] == "NoSchedule");
    if !present {
        taints.push(json!({"key": NOT_READY, "effect": "NoSchedule"}));
    }
}

/// A Node's status as the real server stores and encodes it: never absent (its Go struct has no empty
/// form), with the daemon endpoint and the node info's string fields always there. A JSON Patch may name
/// paths under `/status` on any Node.
fn node_status(object: &mut Value) {
    const NODE_INFO: [&str; 10] = [
        "machineID",
        "systemUUID",
        "bootID",
        "kernelVersion",
        "osImage",
        "containerRuntimeVersion",
        "kubeletVersion",
        "kubeProxyVersion",
        "operatingSystem",
        "architecture",
    ];
    if !object["status"].is_object() {
        object["status"] = json!({});
    }
    let status = &mut object["status"];
    if !status["daemonEndpoints"]["kubeletEndpoint"].is_object() {
        status["daemonEndpoints"] = json!({"kubeletEndpoint": {"Port": 0}});
    }
    if !status["nodeInfo"].is_object() {
        status["nodeInfo"] = json!({});
    }
    let info = &mut status["nodeInfo"];
    for field in NODE_INFO {
        if !info[field].is_string() {
            info[field] = json!("");
        }
    }
}

/// The Lease strategy with the `CoordinatedLeaderElection` feature gate off, as it is by default (beta,
/// off, in 1.33–1.37): `strategy` and `preferredHolder` are dropped on create, and on update unless the
/// stored Lease has them already.
fn coordinated_leader_election_off(object: &mut Value, old: Option<&Value>) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for field in ["strategy", "preferredHolder"] {
        if old.is_none_or(|old| old["spec"][field].is_null()) {
            spec.remove(field);
        }
    }
}

/// v1 defaulting of bindings: the role reference's group and each subject's group by kind.
fn binding(object: &mut Value) {
    const RBAC: &str = "rbac.authorization.k8s.io";
    if let Some(role_ref) = object.get_mut("roleRef").and_then(Value::as_object_mut)
        && role_ref
            .get("apiGroup")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        role_ref.insert("apiGroup".to_owned(), json!(RBAC));
    }
    for subject in object
        .get_mut("subjects")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        let kind = subject.get("kind").and_then(Value::as_str).unwrap_or_default();
        let default = if kind == "ServiceAccount" { "" } else { RBAC };
        if subject
            .get("apiGroup")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
            && !default.is_empty()
        {
            subject.insert("apiGroup".to_owned(), json!(default));
        }
    }
}

/// The registry's `dropTypeDependentFields`: a service that no longer needs what its old type allocated
/// loses it, when the client left it as it was (node ports, the load-balancer fields, the external
/// traffic policy).
fn drop_type_dependent_fields(spec: &mut serde_json::Map<String, Value>, old_spec: &Value) {
    let old_type = old_spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    let new_type = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_owned();
    let node_ports = |t: &str| matches!(t, "NodePort" | "LoadBalancer");
    if node_ports(old_type) && !node_ports(&new_type) {
        let old_ports = old_spec
            .get("ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let node_port_of = |port: &Value| port.get("nodePort").cloned();
        let same = spec.get("ports").and_then(Value::as_array).is_some_and(|ports| {
            ports.len() == old_ports.len()
                && ports
                    .iter()
                    .zip(&old_ports)
                    .all(|(a, b)| node_port_of(a) == node_port_of(b))
        });
        if same && let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                port.remove("nodePort");
            }
        }
        if spec.get("externalTrafficPolicy") == old_spec.get("externalTrafficPolicy") {
            spec.remove("externalTrafficPolicy");
        }
    }
    if new_type != "LoadBalancer" {
        spec.remove("allocateLoadBalancerNodePorts");
        spec.remove("loadBalancerClass");
        if spec.get("healthCheckNodePort") == old_spec.get("healthCheckNodePort") {
            spec.remove("healthCheckNodePort");
        }
    }
}

fn service(object: &mut Value, old: Option<&Value>, allocations: &mut Allocations) {
    if !object.get("spec").is_some_and(Value::is_object) {
        object["spec"] = json!({});
    }
    if let Some(old_spec) = old.and_then(|o| o.get("spec"))
        && let Some(spec) = object["spec"].as_object_mut()
    {
        drop_type_dependent_fields(spec, old_spec);
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
        ip_families(spec, &old_spec, &cluster_ip);
        spec.entry("internalTrafficPolicy").or_insert(json!("Cluster"));
    }
    // An ingress with an IP is a virtual IP unless it says otherwise.
    if let Some(ingress) = object
        .pointer_mut("/status/loadBalancer/ingress")
        .and_then(Value::as_array_mut)
    {
        for entry in ingress.iter_mut().filter_map(Value::as_object_mut) {
            if entry
                .get("ip")
                .and_then(Value::as_str)
                .is_some_and(|ip| !ip.is_empty())
            {
                entry.entry("ipMode").or_insert(json!("VIP"));
            }
        }
    }
    let spec = object["spec"].as_object_mut().expect("made an object above");
    let exposes_node_ports = matches!(service_type.as_str(), "NodePort" | "LoadBalancer");
    if exposes_node_ports {
        spec.entry("externalTrafficPolicy").or_insert(json!("Cluster"));
    }
    if service_type == "LoadBalancer" {
        spec.entry("allocateLoadBalancerNodePorts").or_insert(json!(true));
    }
    // As the real registry's `shouldAllocateNodePorts`: a load balancer may do without node ports.
    let allocates_node_ports = service_type == "NodePort"
        || (service_type == "LoadBalancer" && spec["allocateLoadBalancerNodePorts"] != json!(false));
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
            if allocates_node_ports && port.get("nodePort").is_none_or(|p| p.as_u64().unwrap_or(0) == 0) {
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

/// `ipFamilyPolicy`, `ipFamilies`, `clusterIP` and `clusterIPs` as a dual-stack kube-apiserver (IPv4
/// first) sets them: no policy is `RequireDualStack` for two families and for a headless service without
/// a selector, else `SingleStack`; a dual-stack policy adds the other family, `SingleStack` keeps the
/// first; an address per family (IPv4 allocated, its IPv6 twin), `clusterIP` the first.
fn ip_families(spec: &mut serde_json::Map<String, Value>, old_spec: &Value, cluster_ip: &str) {
    let strings = |value: Option<&Value>| -> Vec<String> {
        value
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let headless = cluster_ip == "None";
    let selectorless = spec
        .get("selector")
        .and_then(Value::as_object)
        .is_none_or(serde_json::Map::is_empty);
    let mut families = strings(spec.get("ipFamilies"));
    let policy = match spec.get("ipFamilyPolicy").and_then(Value::as_str) {
        Some(policy) => policy.to_owned(),
        None if families.len() == 2 || (headless && selectorless) => "RequireDualStack".to_owned(),
        None => "SingleStack".to_owned(),
    };
    if families.is_empty() {
        families.push(if cluster_ip.contains(':') { "IPv6" } else { "IPv4" }.to_owned());
    }
    match policy.as_str() {
        "PreferDualStack" | "RequireDualStack" if families.len() == 1 => {
            let other = if families[0] == "IPv6" { "IPv4" } else { "IPv6" };
            families.push(other.to_owned());
        }
        "SingleStack" => families.truncate(1),
        _ => {}
    }
    spec.insert("ipFamilyPolicy".to_owned(), json!(policy));
    spec.insert("ipFamilies".to_owned(), json!(families));
    if headless {
        spec.insert("clusterIP".to_owned(), json!("None"));
        spec.insert("clusterIPs".to_owned(), json!(["None"]));
        return;
    }
    let known: Vec<String> = std::iter::once(cluster_ip.to_owned())
        .chain(strings(spec.get("clusterIPs")))
        .chain(strings(old_spec.get("clusterIPs")))
        .collect();
    let ipv4 = known
        .iter()
        .find(|ip| !ip.contains(':'))
        .cloned()
        .unwrap_or_else(|| cluster_ip.to_owned());
    let ipv6 = known
        .iter()
        .find(|ip| ip.contains(':'))
        .cloned()
        .unwrap_or_else(|| ipv6_twin(&ipv4));
    let ips: Vec<&String> = families
        .iter()
        .map(|family| if family == "IPv6" { &ipv6 } else { &ipv4 })
        .collect();
    spec.insert("clusterIP".to_owned(), json!(ips[0]));
    spec.insert("clusterIPs".to_owned(), json!(ips));
}

/// The IPv6 cluster address of a dual-stack service whose IPv4 one is `ipv4`: in `fd00:96::/108`, from its
/// last two octets.
fn ipv6_twin(ipv4: &str) -> String {
    let octets: Vec<u16> = ipv4.split('.').filter_map(|o| o.parse().ok()).collect();
    match octets.as_slice() {
        [_, _, c, d] => format!("fd00:96::{:x}", (c << 8) | d),
        _ => "fd00:96::1".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{RESOURCES, find};

    #[test]
    fn new_nodes_get_the_not_ready_taint_once_and_updates_keep_theirs() {
        let nodes = &RESOURCES[find("", "v1", "nodes").unwrap()];
        let mut allocations = Allocations::default();
        let not_ready = json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
        let keep = json!({"key": "example.com/keep", "effect": "NoSchedule"});
        for (spec, taints) in [
            (json!(null), json!([not_ready])),
            (json!({"taints": [keep]}), json!([keep, not_ready])),
            (json!({"taints": [not_ready]}), json!([not_ready])),
        ] {
            let mut node = json!({"metadata": {"name": "n"}, "spec": spec});
            apply(nodes, &mut node, None, &mut allocations);
            assert_eq!(node["spec"]["taints"], taints, "{spec}");
        }
        let mut update = json!({"metadata": {"name": "n"}, "spec": {}});
        apply(nodes, &mut update, Some(&json!({})), &mut allocations);
        assert_eq!(
            update["spec"],
            json!({}),
            "admission adds the taint on create only"
        );
    }

    #[test]
    fn lease_fields_of_coordinated_leader_election_are_dropped_as_with_the_gate_off() {
        let leases = &RESOURCES[find("coordination.k8s.io", "v1", "leases").unwrap()];
        let mut allocations = Allocations::default();
        let mut lease = json!({"spec": {"holderIdentity": "a", "strategy": "OldestEmulationVersion", "preferredHolder": "b"}});
        apply(leases, &mut lease, None, &mut allocations);
        assert_eq!(lease["spec"], json!({"holderIdentity": "a"}));
        let stored = json!({"spec": {"strategy": "OldestEmulationVersion"}});
        let mut update = json!({"spec": {"strategy": "OldestEmulationVersion", "preferredHolder": "b"}});
        apply(leases, &mut update, Some(&stored), &mut allocations);
        assert_eq!(
            update["spec"],
            json!({"strategy": "OldestEmulationVersion"}),
            "kept where already set"
        );
    }

    #[test]
    fn ip_families_as_a_dual_stack_kube_apiserver_sets_them() {
        let services = &RESOURCES[find("", "v1", "services").unwrap()];
        let mut allocations = Allocations::default();
        let mut made = |spec: Value, old: Option<&Value>| {
            let mut service = json!({"spec": spec});
            apply(services, &mut service, old, &mut allocations);
            service["spec"].clone()
        };
        let single = made(json!({}), None);
        assert_eq!(
            (
                &single["ipFamilyPolicy"],
                &single["ipFamilies"],
                &single["clusterIPs"]
            ),
            (
                &json!("SingleStack"),
                &json!(["IPv4"]),
                &json!([single["clusterIP"]])
            )
        );
        let required = made(json!({"ipFamilyPolicy": "RequireDualStack"}), None);
        assert_eq!(required["ipFamilies"], json!(["IPv4", "IPv6"]));
        let ips = required["clusterIPs"].as_array().unwrap().clone();
        assert_eq!(required["clusterIP"], ips[0]);
        assert!(ips[1].as_str().unwrap().starts_with("fd00:96::"), "{ips:?}");
        // IPv6 first: clusterIP is the IPv6 address; one family with a dual-stack policy gets the other.
        let six_first = made(
            json!({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6"]}),
            None,
        );
        assert_eq!(six_first["ipFamilies"], json!(["IPv6", "IPv4"]));
        assert_eq!(six_first["clusterIP"], six_first["clusterIPs"][0]);
        assert!(six_first["clusterIP"].as_str().unwrap().contains(':'));
        // Two families without a policy require both; a headless service without a selector too.
        let two = made(json!({"ipFamilies": ["IPv4", "IPv6"]}), None);
        assert_eq!(two["ipFamilyPolicy"], "RequireDualStack");
        let headless = made(json!({"clusterIP": "None"}), None);
        assert_eq!(
            (&headless["ipFamilyPolicy"], &headless["clusterIPs"]),
            (&json!("RequireDualStack"), &json!(["None"]))
        );
        // Back to SingleStack: the second family and its address go, the first address stays.
        let stored = json!({"spec": required.clone()});
        let mut back = required.clone();
        back["ipFamilyPolicy"] = json!("SingleStack");
        let back = made(back, Some(&stored));
        assert_eq!(back["ipFamilies"], json!(["IPv4"]));
        assert_eq!(back["clusterIPs"], json!([required["clusterIP"]]));
    }

    #[test]
    fn a_load_balancer_without_node_ports_gets_none() {
        let services = &RESOURCES[find("", "v1", "services").unwrap()];
        let mut allocations = Allocations::default();
        let mut service = json!({"spec": {"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false, "ports": [{"port": 80}]}});
        apply(services, &mut service, None, &mut allocations);
        assert_eq!(service["spec"]["ports"][0].get("nodePort"), None);
        assert_eq!(service["spec"]["externalTrafficPolicy"], "Cluster");
    }

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
