//! `deploy/overlays/gce/iam-role.yaml` grants exactly the Compute permissions of the API methods this
//! crate's code calls: every `clients.<service>.<method>()` in `src/` maps (by the table below, after
//! Compute's documented permissions per method) to permissions the role has, and every permission of the
//! role is needed by some call. Nothing here can enforce IAM (the Compute double does not), so this keeps
//! the role and the code in step; it cannot prove the table right.

use std::collections::BTreeSet;
use std::path::Path;

/// The permissions one method needs: the method's own, and what its body uses (the network a route or
/// firewall changes, the instances and health checks a pool points at, the operation awaited).
fn permissions(service: &str, method: &str) -> Option<&'static [&'static str]> {
    Some(match (service, method) {
        ("instances", "aggregated_list") => &["compute.instances.list"],
        ("routes", "list") => &["compute.routes.list"],
        ("routes", "insert") => &[
            "compute.routes.create",
            "compute.networks.updatePolicy",
            "compute.instances.use",
            "compute.globalOperations.get",
        ],
        ("routes", "delete") => &[
            "compute.routes.delete",
            "compute.networks.updatePolicy",
            "compute.globalOperations.get",
        ],
        ("firewalls", "get") => &["compute.firewalls.get"],
        ("firewalls", "insert") => &[
            "compute.firewalls.create",
            "compute.networks.updatePolicy",
            "compute.globalOperations.get",
        ],
        ("firewalls", "patch") => &[
            "compute.firewalls.update",
            "compute.networks.updatePolicy",
            "compute.globalOperations.get",
        ],
        ("firewalls", "delete") => &[
            "compute.firewalls.delete",
            "compute.networks.updatePolicy",
            "compute.globalOperations.get",
        ],
        ("http_health_checks", "get") => &["compute.httpHealthChecks.get"],
        ("http_health_checks", "insert") => {
            &["compute.httpHealthChecks.create", "compute.globalOperations.get"]
        }
        ("http_health_checks", "patch") => {
            &["compute.httpHealthChecks.update", "compute.globalOperations.get"]
        }
        ("http_health_checks", "delete") => {
            &["compute.httpHealthChecks.delete", "compute.globalOperations.get"]
        }
        ("target_pools", "get") => &["compute.targetPools.get"],
        ("target_pools", "list") => &["compute.targetPools.list"],
        ("target_pools", "insert") => &[
            "compute.targetPools.create",
            "compute.instances.use",
            "compute.httpHealthChecks.useReadOnly",
            "compute.regionOperations.get",
        ],
        ("target_pools", "delete") => &["compute.targetPools.delete", "compute.regionOperations.get"],
        ("target_pools", "add_instance") => &[
            "compute.targetPools.addInstance",
            "compute.instances.use",
            "compute.regionOperations.get",
        ],
        ("target_pools", "remove_instance") => &[
            "compute.targetPools.removeInstance",
            "compute.regionOperations.get",
        ],
        ("forwarding_rules", "get") => &["compute.forwardingRules.get"],
        ("forwarding_rules", "list") => &["compute.forwardingRules.list"],
        ("forwarding_rules", "insert") => &[
            "compute.forwardingRules.create",
            "compute.targetPools.use",
            "compute.regionBackendServices.use",
            "compute.addresses.use",
            "compute.subnetworks.use",
            "compute.networks.use",
            "compute.regionOperations.get",
        ],
        ("forwarding_rules", "delete") => &["compute.forwardingRules.delete", "compute.regionOperations.get"],
        ("subnetworks", "get") => &["compute.subnetworks.get"],
        ("addresses", "get") => &["compute.addresses.get"],
        ("addresses", "list") => &["compute.addresses.list"],
        ("addresses", "insert") => &[
            "compute.addresses.create",
            "compute.addresses.createInternal",
            "compute.subnetworks.use",
            "compute.regionOperations.get",
        ],
        ("health_checks", "get") => &["compute.healthChecks.get"],
        ("health_checks", "insert") => &["compute.healthChecks.create", "compute.globalOperations.get"],
        ("health_checks", "update") => &["compute.healthChecks.update", "compute.globalOperations.get"],
        ("health_checks", "delete") => &["compute.healthChecks.delete", "compute.globalOperations.get"],
        ("backend_services", "get") => &["compute.regionBackendServices.get"],
        ("backend_services", "list") => &["compute.regionBackendServices.list"],
        ("backend_services", "insert") => &[
            "compute.regionBackendServices.create",
            "compute.healthChecks.useReadOnly",
            "compute.instanceGroups.use",
            "compute.regionOperations.get",
        ],
        ("backend_services", "update") => &[
            "compute.regionBackendServices.update",
            "compute.healthChecks.useReadOnly",
            "compute.instanceGroups.use",
            "compute.regionOperations.get",
        ],
        ("backend_services", "delete") => &[
            "compute.regionBackendServices.delete",
            "compute.regionOperations.get",
        ],
        ("instance_groups", "get") => &["compute.instanceGroups.get"],
        ("instance_groups", "aggregated_list" | "list_instances") => &["compute.instanceGroups.list"],
        ("instance_groups", "insert") => &[
            "compute.instanceGroups.create",
            "compute.networks.use",
            "compute.zoneOperations.get",
        ],
        ("instance_groups", "add_instances") => &[
            "compute.instanceGroups.update",
            "compute.instances.use",
            "compute.zoneOperations.get",
        ],
        ("instance_groups", "remove_instances") => &[
            "compute.instanceGroups.update",
            "compute.instances.use",
            "compute.zoneOperations.get",
        ],
        ("instance_groups", "delete") => &["compute.instanceGroups.delete", "compute.zoneOperations.get"],
        ("addresses", "delete") => &["compute.addresses.delete", "compute.regionOperations.get"],
        _ => return None,
    })
}

/// Every `clients.<service>.<method>(` in `source`, however rustfmt broke the chain across lines.
fn calls(source: &str) -> Vec<(String, String)> {
    let compact: String = source
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" .", ".");
    let mut found = Vec::new();
    for (at, _) in compact.match_indices("clients.") {
        let rest = &compact[at + "clients.".len()..];
        let word = |s: &str| -> String {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        let service = word(rest);
        let Some(after) = rest[service.len()..].strip_prefix('.') else {
            continue;
        };
        let method = word(after);
        if after[method.len()..].starts_with('(') {
            found.push((service, method));
        }
    }
    found
}

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.extend(calls(&std::fs::read_to_string(&path).unwrap()));
        }
    }
}

#[test]
fn the_shipped_role_grants_exactly_what_the_code_calls() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    sources(&crate_dir.join("src"), &mut found);
    assert!(
        found.len() >= 20,
        "the scan finds the provider's calls: {found:?}"
    );
    let mut needed = BTreeSet::new();
    for (service, method) in &found {
        let permissions = permissions(service, method).unwrap_or_else(|| {
            panic!("clients.{service}.{method}() has no permissions in this test's table")
        });
        needed.extend(permissions.iter().map(|p| (*p).to_owned()));
    }
    let role = std::fs::read_to_string(crate_dir.join("../../../deploy/overlays/gce/iam-role.yaml")).unwrap();
    let granted: BTreeSet<String> = role
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .map(|p| p.trim().to_owned())
        .collect();
    let missing: Vec<_> = needed.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&needed).collect();
    assert!(missing.is_empty(), "the role lacks {missing:?}");
    assert!(
        unused.is_empty(),
        "the role grants {unused:?}, which no call needs"
    );
}

#[test]
fn the_scan_sees_chains_broken_across_lines() {
    let source =
        "self\n    .clients\n    .target_pools\n    .add_instance()\n; self.clients.routes.list().send()";
    assert_eq!(
        calls(source),
        [
            ("target_pools".into(), "add_instance".into()),
            ("routes".into(), "list".into())
        ]
    );
}
