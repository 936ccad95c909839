//! The core group's kinds this server stores: Node, Service, ConfigMap, Secret (as
//! `pkg/apis/core/validation`).

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde_json::{Value, json};

use super::field::{Errors, Path, Problem, Shown};
use super::meta::labels;
use super::names::{config_key, dns1123_label, dns1123_subdomain, label_value, qualified_name};

const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];
const SERVICE_TYPES: &[&str] = &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
const IP_MODES: &[&str] = &["Proxy", "VIP"];
/// The largest total size of a ConfigMap's or Secret's values, in bytes.
const DATA_MAX_BYTES: usize = 1024 * 1024;

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn items<'a>(object: &'a Value, pointer: &str) -> &'a [Value] {
    object
        .pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn is_cidr(text: &str) -> bool {
    text.split_once('/').is_some_and(|(ip, bits)| {
        ip.parse::<IpAddr>().is_ok_and(|ip| {
            let max = if ip.is_ipv4() { 32 } else { 128 };
            bits.parse::<u8>().is_ok_and(|bits| bits <= max)
        })
    })
}

/// `spec.taints` — at `metadata.taints`, as upstream reports them.
fn taints(node: &Value, errors: &mut Errors) {
    let path = Path::root("metadata").child("taints");
    let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
    for (index, taint) in items(node, "/spec/taints").iter().enumerate() {
        let at = path.index(index);
        let key = text(taint, "/key");
        errors.invalid_each(&at.child("key"), key, qualified_name(key));
        let value = text(taint, "/value");
        let messages = label_value(value);
        if !messages.is_empty() {
            errors.invalid(at.child("value"), Shown::text(value), messages.join(";"));
        }
        let effect = text(taint, "/effect");
        if effect.is_empty() {
            errors.required(at.child("effect"), "");
        } else if !TAINT_EFFECTS.contains(&effect) {
            errors.not_supported(at.child("effect"), effect, TAINT_EFFECTS);
        }
        if !seen.insert((key, effect)) {
            let shown = Shown::fields(&[
                ("Key", &json!(key)),
                ("Value", &json!(value)),
                ("Effect", &json!(effect)),
                ("TimeAdded", taint.get("timeAdded").unwrap_or(&Value::Null)),
            ]);
            errors.duplicate(at, shown, "taints must be unique by key and effect pair");
        }
    }
}

fn pod_cidrs(node: &Value) -> Vec<&str> {
    let plural: Vec<&str> = items(node, "/spec/podCIDRs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if plural.is_empty() {
        Some(text(node, "/spec/podCIDR"))
            .filter(|c| !c.is_empty())
            .into_iter()
            .collect()
    } else {
        plural
    }
}

/// `ValidateNode`.
pub(crate) fn node(node: &Value, errors: &mut Errors) {
    taints(node, errors);
    let path = Path::root("spec").child("podCIDRs");
    let cidrs = pod_cidrs(node);
    for (index, cidr) in cidrs.iter().enumerate() {
        if !is_cidr(cidr) {
            errors.invalid(
                path.index(index),
                Shown::text(cidr),
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            );
        } else if cidrs[..index].contains(cidr) {
            errors.duplicate(path.index(index), Shown::text(cidr), "");
        }
    }
    if cidrs.len() > 1 {
        let families: BTreeSet<bool> = cidrs
            .iter()
            .filter_map(|c| c.split_once('/')?.0.parse::<IpAddr>().ok())
            .map(|ip| ip.is_ipv4())
            .collect();
        if cidrs.len() > 2 || families.len() != 2 {
            errors.invalid(
                path,
                Shown::marshalled(&json!(cidrs)),
                "may specify no more than one CIDR for each IP family",
            );
        }
    }
}

/// `ValidateNodeUpdate`: provider ID and pod CIDRs only from "" to a value; no duplicate addresses.
pub(crate) fn node_update(new: &Value, old: &Value, errors: &mut Errors) {
    let old_provider = text(old, "/spec/providerID");
    if !old_provider.is_empty() && text(new, "/spec/providerID") != old_provider {
        errors.forbidden(
            Path::root("spec").child("providerID"),
            "node updates may not change providerID except from \"\" to valid",
        );
    }
    let (old_cidrs, new_cidrs) = (pod_cidrs(old), pod_cidrs(new));
    if !old_cidrs.is_empty() && old_cidrs != new_cidrs {
        errors.forbidden(
            Path::root("spec").child("podCIDRs"),
            "node updates may not change podCIDR except from \"\" to valid",
        );
    }
    let mut seen = BTreeSet::new();
    for (index, address) in items(new, "/status/addresses").iter().enumerate() {
        let pair = (text(address, "/type"), text(address, "/address"));
        if !seen.insert(pair) {
            errors.duplicate(
                Path::root("status").child("addresses").index(index),
                Shown::fields(&[("Type", &json!(pair.0)), ("Address", &json!(pair.1))]),
                "",
            );
        }
    }
}

/// An IANA service port name (a `targetPort` given by name).
fn port_name_errors(name: &str) -> Vec<&'static str> {
    let mut errors = Vec::new();
    if name.len() > 15 {
        errors.push("must be no more than 15 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        errors.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)");
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        errors.push("must contain at least one letter (a-z)");
    }
    if name.contains("--") {
        errors.push("must not contain consecutive hyphens");
    }
    if name.starts_with('-') || name.ends_with('-') {
        errors.push("must not begin or end with a hyphen");
    }
    errors
}

fn ports(service: &Value, service_type: &str, errors: &mut Errors) {
    let path = Path::root("spec").child("ports");
    let ports = items(service, "/spec/ports");
    if ports.is_empty() && service_type != "ExternalName" && text(service, "/spec/clusterIP") != "None" {
        errors.required(path.clone(), "");
    }
    let mut names = BTreeSet::new();
    let mut node_ports = BTreeSet::new();
    let mut protocol_ports = BTreeSet::new();
    for (index, port) in ports.iter().enumerate() {
        let at = path.index(index);
        let name = text(port, "/name");
        if name.is_empty() {
            if ports.len() > 1 {
                errors.required(at.child("name"), "");
            }
        } else {
            errors.invalid_each(&at.child("name"), name, dns1123_label(name));
            if !names.insert(name) {
                errors.duplicate(at.child("name"), Shown::text(name), "");
            }
        }
        let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=65535).contains(&number) {
            errors.invalid(
                at.child("port"),
                Shown::number(number),
                "must be between 1 and 65535, inclusive",
            );
        }
        let protocol = text(port, "/protocol");
        if protocol.is_empty() {
            errors.required(at.child("protocol"), "");
        } else if !PROTOCOLS.contains(&protocol) {
            errors.not_supported(at.child("protocol"), protocol, PROTOCOLS);
        }
        match port.get("targetPort") {
            Some(Value::Number(n)) => {
                let n = n.as_i64().unwrap_or(0);
                if !(1..=65535).contains(&n) {
                    errors.invalid(
                        at.child("targetPort"),
                        Shown::number(n),
                        "must be between 1 and 65535, inclusive",
                    );
                }
            }
            Some(Value::String(name)) => {
                for message in port_name_errors(name) {
                    errors.invalid(at.child("targetPort"), Shown::text(name), message);
                }
            }
            _ => {}
        }
        if let Some(node_port) = port.get("nodePort").and_then(Value::as_i64).filter(|p| *p != 0) {
            if service_type == "ClusterIP" {
                errors.forbidden(at.child("nodePort"), "may not be used when `type` is 'ClusterIP'");
            } else if !node_ports.insert((protocol, node_port)) {
                errors.duplicate(at.child("nodePort"), Shown::number(node_port), "");
            }
        }
        if !protocol_ports.insert((protocol, number)) {
            errors.duplicate(
                at,
                Shown::fields(&[("Protocol", &json!(protocol)), ("Port", &json!(number))]),
                "",
            );
        }
    }
}

/// `ValidateService` (the fields this project and its tests use; cluster IPs are allocated here).
pub(crate) fn service(service: &Value, errors: &mut Errors) {
    let spec = Path::root("spec");
    let service_type = text(service, "/spec/type");
    if service_type.is_empty() {
        errors.required(spec.child("type"), "");
    } else if !SERVICE_TYPES.contains(&service_type) {
        errors.not_supported(spec.child("type"), service_type, SERVICE_TYPES);
    }
    ports(service, service_type, errors);
    if let Some(selector) = service.pointer("/spec/selector").and_then(Value::as_object) {
        let map = selector
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect();
        labels(&map, &spec.child("selector"), errors);
    }
    if let Some(class) = service.pointer("/spec/loadBalancerClass").and_then(Value::as_str) {
        if service_type == "LoadBalancer" {
            errors.invalid_each(&spec.child("loadBalancerClass"), class, qualified_name(class));
        } else {
            errors.forbidden(
                spec.child("loadBalancerClass"),
                "may only be used when `type` is 'LoadBalancer'",
            );
        }
    }
}

/// `ValidateServiceUpdate`'s additions: the load-balancer class cannot change while the type stays LoadBalancer.
pub(crate) fn service_update(new: &Value, old: &Value, errors: &mut Errors) {
    let is_lb = |s: &Value| text(s, "/spec/type") == "LoadBalancer";
    let (new_class, old_class) = (
        new.pointer("/spec/loadBalancerClass"),
        old.pointer("/spec/loadBalancerClass"),
    );
    if is_lb(new) && is_lb(old) && new_class != old_class {
        errors.invalid(
            Path::root("spec").child("loadBalancerClass"),
            Shown::json(new_class.unwrap_or(&Value::Null)),
            "may not change once set",
        );
    }
}

/// `status.loadBalancer` (`ValidateLoadBalancerStatus`), checked on writes of `/status`.
pub(crate) fn load_balancer_status(service: &Value, errors: &mut Errors) {
    let service_type = text(service, "/spec/type");
    let path = Path::root("status").child("loadBalancer").child("ingress");
    let ingress = items(service, "/status/loadBalancer/ingress");
    if !ingress.is_empty() && service_type != "LoadBalancer" {
        errors.forbidden(
            path.clone(),
            "may only be used when `spec.type` is 'LoadBalancer'",
        );
    }
    for (index, entry) in ingress.iter().enumerate() {
        let at = path.index(index);
        let ip = text(entry, "/ip");
        if !ip.is_empty() && ip.parse::<IpAddr>().is_err() {
            errors.invalid(
                at.child("ip"),
                Shown::text(ip),
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            );
        }
        match entry.get("ipMode").and_then(Value::as_str) {
            None if !ip.is_empty() => {
                errors.required(at.child("ipMode"), "must be specified when `ip` is set")
            }
            Some(_) if ip.is_empty() => {
                errors.forbidden(at.child("ipMode"), "may not be specified when `ip` is not set")
            }
            Some(mode) if !IP_MODES.contains(&mode) => {
                errors.not_supported(at.child("ipMode"), mode, IP_MODES)
            }
            _ => {}
        }
        let hostname = text(entry, "/hostname");
        if !hostname.is_empty() {
            errors.invalid_each(&at.child("hostname"), hostname, dns1123_subdomain(hostname));
            if hostname.parse::<IpAddr>().is_ok() {
                errors.invalid(
                    at.child("hostname"),
                    Shown::text(hostname),
                    "must be a DNS name, not an IP address",
                );
            }
        }
    }
}

/// ConfigMap (`ValidateConfigMap`) and Secret keys and sizes.
pub(crate) fn config_map(object: &Value, secret: bool, errors: &mut Errors) {
    let mut total = 0;
    let maps: &[&str] = if secret {
        &["data", "stringData"]
    } else {
        &["data", "binaryData"]
    };
    for map in maps {
        for (key, value) in object.get(*map).and_then(Value::as_object).into_iter().flatten() {
            let path = Path::root(map).key(key);
            errors.invalid_each(&path, key, config_key(key));
            total += value.as_str().map_or(0, str::len);
        }
    }
    if !secret
        && let (Some(data), Some(binary)) = (
            object.get("data").and_then(Value::as_object),
            object.get("binaryData").and_then(Value::as_object),
        )
    {
        for key in data.keys().filter(|k| binary.contains_key(*k)) {
            errors.invalid(
                Path::root("data").key(key),
                Shown::text(key),
                "duplicate of key present in binaryData",
            );
        }
    }
    if total > DATA_MAX_BYTES {
        let path = if secret {
            Path::root("data")
        } else {
            Path::root("")
        };
        errors.push(path, Problem::TooLong(DATA_MAX_BYTES));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(check: impl FnOnce(&mut Errors)) -> Vec<String> {
        let mut errors = Errors::default();
        check(&mut errors);
        errors
            .0
            .iter()
            .map(super::super::field::FieldError::render)
            .collect()
    }

    #[test]
    fn node_taints_cidrs_and_immutable_fields() {
        let n = json!({"spec": {
            "taints": [
                {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"},
                {"key": "k", "effect": "Sometimes"},
                {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "x", "effect": "NoSchedule"},
            ],
            "podCIDRs": ["10.244.1.0/24", "10.244.2.0/24"],
        }});
        assert_eq!(
            rendered(|e| node(&n, e)),
            [
                "metadata.taints[1].effect: Unsupported value: \"Sometimes\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"",
                "metadata.taints[2]: Duplicate value: {\"Key\":\"node.cloudprovider.kubernetes.io/uninitialized\",\"Value\":\"x\",\"Effect\":\"NoSchedule\",\"TimeAdded\":null}: taints must be unique by key and effect pair",
                "spec.podCIDRs: Invalid value: [\"10.244.1.0/24\",\"10.244.2.0/24\"]: may specify no more than one CIDR for each IP family",
            ]
        );
        let old = json!({"spec": {"providerID": "fake://a", "podCIDRs": ["10.0.0.0/24"]}});
        let new = json!({"spec": {"providerID": "fake://b", "podCIDRs": ["10.0.0.0/24"]}, "status": {"addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"}, {"type": "InternalIP", "address": "10.0.0.1"}]}});
        assert_eq!(
            rendered(|e| node_update(&new, &old, e)),
            [
                "spec.providerID: Forbidden: node updates may not change providerID except from \"\" to valid",
                "status.addresses[1]: Duplicate value: {\"Type\":\"InternalIP\",\"Address\":\"10.0.0.1\"}",
            ]
        );
        let set_once = json!({"spec": {"providerID": "fake://a"}});
        assert!(rendered(|e| node_update(&set_once, &json!({"spec": {}}), e)).is_empty());
    }

    #[test]
    fn services() {
        let s = json!({"spec": {"type": "LoadBalancer", "ports": [
            {"port": 80, "protocol": "TCP", "targetPort": 8080},
            {"port": 70000, "protocol": "ICMP", "name": "b"},
        ]}, "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3"}, {"hostname": "1.2.3.4"}]}}});
        assert_eq!(
            rendered(|e| {
                service(&s, e);
                load_balancer_status(&s, e);
            }),
            [
                "spec.ports[0].name: Required value",
                "spec.ports[1].port: Invalid value: 70000: must be between 1 and 65535, inclusive",
                "spec.ports[1].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                "status.loadBalancer.ingress[0].ip: Invalid value: \"1.2.3\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                "status.loadBalancer.ingress[0].ipMode: Required value: must be specified when `ip` is set",
                "status.loadBalancer.ingress[1].hostname: Invalid value: \"1.2.3.4\": must be a DNS name, not an IP address",
            ]
        );
        let old = json!({"spec": {"type": "LoadBalancer"}});
        let new = json!({"spec": {"type": "LoadBalancer", "loadBalancerClass": "x.io/lb"}});
        assert_eq!(
            rendered(|e| service_update(&new, &old, e)),
            ["spec.loadBalancerClass: Invalid value: \"x.io/lb\": may not change once set"]
        );
    }

    #[test]
    fn config_maps() {
        let big = "x".repeat(DATA_MAX_BYTES + 1);
        let c = json!({"data": {"ok.yaml": "a", "..x": "b", "big": big}});
        assert_eq!(
            rendered(|e| config_map(&c, false, e)),
            [
                "data[..x]: Invalid value: \"..x\": must not start with '..'",
                "[]: Too long: may not be more than 1048576 bytes",
            ]
        );
    }
}
