//! The objects of the nodes benchmark: nodes as a kubelet registers them, and services of another
//! load-balancer class.

use anyhow::Result;
use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::json;

/// A node as a kubelet registers it (conditions, capacity, node info, images), tainted uninitialized.
pub(crate) fn kubelet_node(name: &str, index: u32) -> Result<Node> {
    let images: Vec<serde_json::Value> = (0..10)
        .map(|i| {
            json!({
                "names": [
                    format!("registry.example.com/team-{i}/service@sha256:{:064x}", u64::from(index) * 16 + i),
                    format!("registry.example.com/team-{i}/service:v1.{i}.0"),
                ],
                "sizeBytes": 50_000_000 + i * 1_000_000,
            })
        })
        .collect();
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": format!("kubelet says {reason}"),
            "lastHeartbeatTime": "2026-11-22T10:00:00Z", "lastTransitionTime": "2026-11-22T10:00:00Z",
        })
    };
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/worker": "",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "podCIDR": format!("10.{}.{}.0/24", 64 + index / 256 % 64, index % 256),
            "podCIDRs": [format!("10.{}.{}.0/24", 64 + index / 256 % 64, index % 256)],
            "taints": [{"key": kube_ccm_provider::names::TAINT_UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {"cpu": "8", "memory": "32857812Ki", "pods": "110", "ephemeral-storage": "101430960Ki"},
            "allocatable": {"cpu": "7910m", "memory": "31706836Ki", "pods": "110", "ephemeral-storage": "93478772582"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": format!("{index:032x}"), "systemUUID": format!("ec2{index:029x}"),
                "bootID": format!("{:032x}", u64::from(index) << 8), "kernelVersion": "6.1.0-27-cloud-amd64",
                "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": "v1.33.2", "kubeProxyVersion": "v1.33.2", "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images,
        },
    }))?)
}

pub(crate) fn service(index: u32) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("web-{index}"), "labels": {"app": format!("web-{index}")}},
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": "example.com/another-load-balancer",
            // That controller targets pods: no node ports (a cluster has only 2,768 of them).
            "allocateLoadBalancerNodePorts": false,
            "selector": {"app": format!("web-{index}")},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                      {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}],
        },
    }))?)
}
