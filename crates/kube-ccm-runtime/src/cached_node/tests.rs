use serde_json::json;

use super::*;

fn recache(node: &Node) -> CachedNode {
    serde_json::from_value(serde_json::to_value(node).unwrap()).unwrap()
}

fn kubelet_node() -> serde_json::Value {
    json!({
        "metadata": {
            "name": "n1", "uid": "u1", "resourceVersion": "7", "creationTimestamp": "2026-11-22T10:00:00Z",
            "labels": {"kubernetes.io/hostname": "n1", "topology.kubernetes.io/zone": "z1"},
            "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.0.1"},
            "managedFields": [{"manager": "kubelet", "operation": "Update"}],
        },
        "spec": {
            "providerID": "fake://z1/n1", "podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00::/64"],
            "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}],
        },
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n1"}],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready",
                 "lastHeartbeatTime": "2026-11-22T10:00:00Z", "lastTransitionTime": "2026-11-22T10:00:00Z"},
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
            ],
            "images": [{"names": ["img"], "sizeBytes": 1}],
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "3800m", "memory": "15Gi", "pods": "110"},
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "k",
                "osImage": "o", "containerRuntimeVersion": "c", "kubeletVersion": "v", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64"},
        },
    })
}

#[test]
fn keeps_what_controllers_read_and_drops_the_inventory() {
    let cached: CachedNode = serde_json::from_value(kubelet_node()).unwrap();
    assert_eq!(cached.name(), "n1");
    assert_eq!(cached.label("topology.kubernetes.io/zone"), Some("z1"));
    assert_eq!(cached.label("missing"), None);
    assert_eq!(cached.provider_id(), Some("fake://z1/n1"));
    assert_eq!(
        cached.pod_cidrs().collect::<Vec<_>>(),
        ["10.244.1.0/24", "fd00::/64"]
    );
    assert!(cached.has_taint("node.cloudprovider.kubernetes.io/uninitialized"));
    assert!(cached.is_ready());
    assert_eq!(
        cached.condition("NetworkUnavailable"),
        Some(("False", Some("RouteCreated")))
    );
    assert!(!cached.deleting());

    let expected: Node = serde_json::from_value(json!({
        "metadata": {
            "name": "n1", "uid": "u1", "resourceVersion": "7", "creationTimestamp": "2026-11-22T10:00:00Z",
            "labels": {"kubernetes.io/hostname": "n1", "topology.kubernetes.io/zone": "z1"},
            "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.0.1"},
        },
        "spec": {
            "providerID": "fake://z1/n1", "podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00::/64"],
            "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}],
        },
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n1"}],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
            ],
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "3800m", "memory": "15Gi", "pods": "110"},
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "k",
                "osImage": "o", "containerRuntimeVersion": "c", "kubeletVersion": "v", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64"},
        },
    }))
    .unwrap();
    assert_eq!(cached.to_node(), expected);
    assert_eq!(cached.node_info_field("systemUUID"), Some("s"));
    assert_eq!(cached.node_info_field("kubeletVersion"), Some("v"));
    // Caching the materialised node again changes nothing.
    assert_eq!(recache(&cached.to_node()), cached);
}

#[test]
fn an_empty_node_round_trips() {
    let cached: CachedNode = serde_json::from_value(json!({"metadata": {"name": "bare"}})).unwrap();
    assert_eq!(cached.pod_cidrs().count(), 0);
    assert!(!cached.is_ready());
    let node = cached.to_node();
    assert_eq!(node.metadata.name.as_deref(), Some("bare"));
    assert_eq!(node.metadata.labels, None);
    assert_eq!(recache(&node), cached);
}

#[test]
fn an_old_node_with_only_pod_cidr() {
    let cached: CachedNode =
        serde_json::from_value(json!({"metadata": {"name": "old"}, "spec": {"podCIDR": "10.1.0.0/24"}}))
            .unwrap();
    assert_eq!(cached.pod_cidrs().collect::<Vec<_>>(), ["10.1.0.0/24"]);
}

#[test]
fn repeated_strings_are_shared() {
    let a: CachedNode = serde_json::from_value(kubelet_node()).unwrap();
    let b: CachedNode = serde_json::from_value(kubelet_node()).unwrap();
    assert!(Arc::ptr_eq(&a.conditions[0].type_, &b.conditions[0].type_));
    assert!(
        Arc::ptr_eq(&a.conditions, &b.conditions),
        "the same conditions, one list"
    );
    assert!(
        Arc::ptr_eq(&a.capacity, &b.capacity),
        "one instance type, one capacity"
    );
    assert!(
        Arc::ptr_eq(&a.node_info_shared, &b.node_info_shared),
        "one kubelet build, one node info"
    );
}

#[test]
fn packed_strings_of_every_length_and_content() {
    let long = "x".repeat(300);
    let items = ["", "a", "ключ", long.as_str(), "with\0nul and = signs"];
    let packed = Packed::new(items);
    assert_eq!(packed.iter().collect::<Vec<_>>(), items);
    let map: BTreeMap<String, String> = [("b", "2"), ("a", ""), ("c", long.as_str())]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let pairs = Packed::pairs(Some(&map));
    assert_eq!(pairs.get("a"), Some(""));
    assert_eq!(pairs.get("c"), Some(long.as_str()));
    assert_eq!(pairs.get("d"), None);
    assert_eq!(pairs.to_map(), Some(map));
    assert_eq!(Packed::pairs(None).to_map(), None);
}
