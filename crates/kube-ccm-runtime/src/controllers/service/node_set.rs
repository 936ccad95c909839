//! The load balancers' node set (upstream's stable node-set predicates) and what a load balancer depends
//! on, as hashes: a sync is needed when either changes.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::names::{
    LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS, TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER,
};
use serde_json::json;

use crate::cached_node::CachedNode;
use crate::informers::Cache;

/// Go's `strconv.ParseBool`.
pub(super) fn parse_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Upstream's `nodeIncludedPredicate`: the exclude label absent, or parsing as false (an unparsable value
/// excludes the node, as upstream).
fn included_by_label(node: &CachedNode) -> bool {
    node.label(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS)
        .is_none_or(|v| parse_bool(v) == Some(false))
}

/// Upstream's stable node-set predicates: not being deleted, included by label, not tainted for deletion
/// by the cluster autoscaler. Readiness is not one.
pub(super) fn in_load_balancer(node: &CachedNode) -> bool {
    !node.deleting() && !node.has_taint(TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER) && included_by_label(node)
}

/// What makes upstream sync load balancers' hosts: a node added or deleted, a node's provider ID changed,
/// or its exclude label flipped. Other changes — the autoscaler's deletion taint among them — take effect
/// at the next sync something else causes (upstream leaves such nodes in for connection draining).
pub(super) fn sync_trigger(nodes: &Cache<CachedNode>) -> u64 {
    let nodes = nodes.state();
    let mut keys: Vec<(&str, Option<&str>, bool)> = nodes
        .iter()
        .map(|n| (n.name(), n.provider_id(), included_by_label(n)))
        .collect();
    keys.sort_unstable();
    let mut hasher = DefaultHasher::new();
    keys.hash(&mut hasher);
    hasher.finish()
}

/// The load balancers' node set.
pub(super) struct NodeSet {
    /// Sorted by name.
    pub(super) nodes: Vec<Arc<CachedNode>>,
    /// Of the names and provider IDs (what a load balancer depends on).
    pub(super) hash: u64,
}

/// The node set of the cache's `nodes` (every node, in the cache's order): the positions of its nodes
/// in `nodes`, sorted by name, and its hash.
pub(super) fn select(nodes: &[Arc<CachedNode>]) -> (Vec<usize>, u64) {
    let mut selected: Vec<usize> = (0..nodes.len())
        .filter(|&i| in_load_balancer(&nodes[i]))
        .collect();
    selected.sort_by(|&a, &b| nodes[a].name().cmp(nodes[b].name()));
    let mut hasher = DefaultHasher::new();
    for &i in &selected {
        nodes[i].name().hash(&mut hasher);
        nodes[i].provider_id().hash(&mut hasher);
    }
    (selected, hasher.finish())
}

/// Identifies the versions of `nodes`, in order: the same hash, the same node objects (a resource
/// version names one write of one object).
pub(super) fn versions(nodes: &[Arc<CachedNode>]) -> u64 {
    let mut hasher = DefaultHasher::new();
    nodes.len().hash(&mut hasher);
    for node in nodes {
        node.name().hash(&mut hasher);
        node.resource_version().hash(&mut hasher);
    }
    hasher.finish()
}

/// Identifies what of a service a load balancer depends on (upstream's `needsUpdate` fields).
pub(super) fn spec_hash(service: &Service) -> u64 {
    let spec = service.spec.clone().unwrap_or_default();
    let relevant = json!({
        "uid": service.metadata.uid,
        "annotations": service.metadata.annotations,
        "type": spec.type_,
        "ports": spec.ports,
        "sourceRanges": spec.load_balancer_source_ranges,
        "sessionAffinity": spec.session_affinity,
        "sessionAffinityConfig": spec.session_affinity_config,
        "loadBalancerIP": spec.load_balancer_ip,
        "externalIPs": spec.external_ips,
        "externalTrafficPolicy": spec.external_traffic_policy,
        "healthCheckNodePort": spec.health_check_node_port,
        "ipFamilies": spec.ip_families.as_ref().map(Vec::len),
        // Not upstream's: whether a family the provider cannot serve is required (the Event's type, a
        // provider's choice of fallback) follows the policy.
        "ipFamilyPolicy": spec.ip_family_policy,
    });
    let mut hasher = DefaultHasher::new();
    relevant.to_string().hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(value: serde_json::Value) -> CachedNode {
        serde_json::from_value(value).unwrap()
    }

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn node_set_predicates() {
        assert!(in_load_balancer(&node(json!({"metadata": {"name": "a"}}))));
        assert!(in_load_balancer(&node(
            json!({"metadata": {"name": "a", "labels": {LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: "false"}}})
        )));
        assert!(!in_load_balancer(&node(
            json!({"metadata": {"name": "a", "labels": {LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: "true"}}})
        )));
        assert!(
            !in_load_balancer(&node(
                json!({"metadata": {"name": "a", "labels": {LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: "yes"}}})
            )),
            "unparsable excludes"
        );
        assert!(!in_load_balancer(&node(
            json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"}})
        )));
        assert!(!in_load_balancer(&node(
            json!({"metadata": {"name": "a"}, "spec": {"taints": [{"key": TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER, "effect": "NoSchedule"}]}})
        )));
        let ready_or_not = node(
            json!({"metadata": {"name": "a"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        );
        assert!(in_load_balancer(&ready_or_not), "readiness is not a predicate");
    }

    #[test]
    fn the_selection_is_sorted_by_name_and_the_versions_follow_every_write() {
        let at = |name: &str, version: &str, labels: serde_json::Value| {
            Arc::new(node(
                json!({"metadata": {"name": name, "resourceVersion": version, "labels": labels}}),
            ))
        };
        let nodes = vec![
            at("c", "1", json!({})),
            at(
                "a",
                "2",
                json!({LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: "true"}),
            ),
            at("b", "3", json!({})),
        ];
        let (selected, hash) = select(&nodes);
        assert_eq!(selected, [2, 0], "b then c; a excluded");
        let mut written = nodes.clone();
        written[1] = at("a", "4", json!({}));
        assert_ne!(versions(&nodes), versions(&written), "a write is a new version");
        assert_ne!(select(&written).1, hash, "a joined");
        assert_eq!(versions(&nodes), versions(&nodes.clone()));
        let reordered = vec![nodes[2].clone(), nodes[0].clone(), nodes[1].clone()];
        assert_ne!(
            versions(&nodes),
            versions(&reordered),
            "positions are what the memo keeps: another order is another list"
        );
    }

    #[test]
    fn spec_hash_ignores_status_and_unrelated_fields() {
        let a = service(
            json!({"metadata": {"name": "s", "uid": "u"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
        );
        let mut b = a.clone();
        b.status =
            Some(serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}})).unwrap());
        b.metadata.resource_version = Some("9".into());
        assert_eq!(spec_hash(&a), spec_hash(&b));
        let c = service(
            json!({"metadata": {"name": "s", "uid": "u"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 81}]}}),
        );
        assert_ne!(spec_hash(&a), spec_hash(&c));
    }
}
