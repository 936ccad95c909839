//! The RBAC both controller managers need for migration Leases.
//!
//! Kubernetes' bootstrap Role `system::leader-locking-kube-controller-manager` (1.37) lets
//! kube-controller-manager use every Lease in `kube-system`, but a cluster may have narrowed it, and a
//! cloud-controller-manager's main-lock role (`deploy/rbac/leader-election-rbac.yaml` here) covers only its
//! own Lease, so both managers get rules for the migration Leases. The seed guide patches `create` into a
//! rule restricted by
//! `resourceNames`, which grants nothing: a create request has no name when it is authorised. Here `create`
//! gets a rule of its own, and every other verb is limited to the named Leases.

use serde_json::{Value, json};

use crate::config::{CLOUD_CONTROLLER_MANAGER, KUBE_CONTROLLER_MANAGER};

/// Verbs the elector uses on a Lease it knows the name of: read, replace, and the list + watch (with a
/// `metadata.name` field selector) by which standbys follow it.
pub const NAMED_LEASE_VERBS: [&str; 4] = ["get", "list", "watch", "update"];
/// Verbs the elector uses on Leases whose name cannot be given: creating the Lease when it does not exist.
pub const UNNAMED_LEASE_VERBS: [&str; 1] = ["create"];

/// What to generate RBAC for.
#[derive(Debug, Clone)]
pub struct RbacRequest {
    /// Namespace of the Leases (`--leader-elect-resource-namespace`).
    pub namespace: String,
    /// Names of the migration Leases.
    pub leases: Vec<String>,
}

/// One Role and one RoleBinding per controller manager, as Kubernetes objects.
pub fn migration_rbac(request: &RbacRequest) -> Vec<Value> {
    let managers = [
        (
            KUBE_CONTROLLER_MANAGER,
            json!([
                {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "system:kube-controller-manager"},
                {"kind": "ServiceAccount", "name": "kube-controller-manager", "namespace": "kube-system"},
            ]),
        ),
        (
            CLOUD_CONTROLLER_MANAGER,
            json!([
                {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "system:cloud-controller-manager"},
                {"kind": "ServiceAccount", "name": "cloud-controller-manager", "namespace": "kube-system"},
            ]),
        ),
    ];
    let mut objects = Vec::new();
    for (component, subjects) in managers {
        let name = format!("system::leader-migration-{component}");
        let labels = json!({"app.kubernetes.io/component": component, "app.kubernetes.io/part-of": "leader-migration"});
        objects.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": request.namespace, "labels": labels},
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": UNNAMED_LEASE_VERBS},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": request.leases, "verbs": NAMED_LEASE_VERBS},
            ],
        }));
        objects.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": request.namespace, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subjects,
        }));
    }
    objects
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_role_and_binding_per_manager_restricted_to_the_leases() {
        let objects = migration_rbac(&RbacRequest {
            namespace: "kube-system".into(),
            leases: vec!["a".into(), "b".into()],
        });
        let kinds: Vec<(&str, &str)> = objects
            .iter()
            .map(|o| {
                (
                    o["kind"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("Role", "system::leader-migration-kube-controller-manager"),
                ("RoleBinding", "system::leader-migration-kube-controller-manager"),
                ("Role", "system::leader-migration-cloud-controller-manager"),
                ("RoleBinding", "system::leader-migration-cloud-controller-manager"),
            ]
        );
        let rules = &objects[0]["rules"];
        assert_eq!(
            rules[0],
            json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]})
        );
        assert_eq!(rules[1]["resourceNames"], json!(["a", "b"]));
        assert_eq!(rules[1]["verbs"], json!(["get", "list", "watch", "update"]));
        for object in &objects {
            assert_eq!(object["metadata"]["namespace"], "kube-system");
            for rule in object["rules"].as_array().into_iter().flatten() {
                assert!(
                    !rule["verbs"].as_array().unwrap().contains(&json!("*")),
                    "no wildcard verbs"
                );
            }
        }
    }
}
