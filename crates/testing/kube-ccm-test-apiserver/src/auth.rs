//! Authentication (bearer tokens) and RBAC authorisation from stored Roles, ClusterRoles and bindings.
//!
//! With RBAC off every request is allowed. With RBAC on, a request needs a known token (else 401) and a
//! rule that allows it (else 403 with the real server's message). As on the real server: `system:masters`
//! may do anything; `resourceNames` never allows `create` (a create has no name when it is authorised);
//! `list` and `watch` with a `metadata.name=` field selector are authorised for that name.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::resources::{RESOURCES, id_of};
use crate::store::Store;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    /// User name, e.g. `system:serviceaccount:kube-system:cloud-controller-manager`.
    pub name: String,
    /// Groups.
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The identity of a service account's token.
    pub fn service_account(namespace: &str, name: &str) -> UserInfo {
        UserInfo {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_owned(),
            ],
        }
    }

    /// The cluster administrator (`system:masters`).
    pub fn admin() -> UserInfo {
        UserInfo {
            name: "system:admin".to_owned(),
            groups: vec!["system:masters".to_owned(), "system:authenticated".to_owned()],
        }
    }
}

#[derive(Debug)]
pub(crate) struct Auth {
    pub(crate) rbac: bool,
    pub(crate) admin_token: String,
    tokens: HashMap<String, UserInfo>,
}

impl Auth {
    pub(crate) fn new(rbac: bool) -> Auth {
        let admin_token = format!("admin-{}", uuid::Uuid::new_v4().simple());
        let tokens = HashMap::from([(admin_token.clone(), UserInfo::admin())]);
        Auth {
            rbac,
            admin_token,
            tokens,
        }
    }

    /// A new token for `user`.
    pub(crate) fn mint(&mut self, user: UserInfo) -> String {
        let token = format!("token-{}", uuid::Uuid::new_v4().simple());
        self.tokens.insert(token.clone(), user);
        token
    }

    /// The user a token stands for (a TokenReview's answer).
    pub(crate) fn review_token(&self, token: &str) -> Option<UserInfo> {
        self.tokens.get(token).cloned()
    }

    /// The user of a request. `Ok(None)`: anonymous with RBAC off (allowed everything).
    pub(crate) fn authenticate(&self, authorization: Option<&str>) -> Result<Option<UserInfo>, ()> {
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim);
        match (token.and_then(|t| self.tokens.get(t)), self.rbac) {
            (Some(user), _) => Ok(Some(user.clone())),
            (None, false) => Ok(None),
            (None, true) => Err(()),
        }
    }
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`, `…/authorization.k8s.io/v1/subjectaccessreviews` and
/// `…/selfsubjectaccessreviews` (for `caller`, as `kubectl auth can-i` asks), answered as the real server
/// does: the token's user, and the decision of the authoriser that decides this server's own requests.
/// With RBAC off every review of a known token authenticates and every access is allowed.
pub(crate) fn review(
    auth: &Auth,
    store: &Store,
    kind: Review,
    body: &Value,
    caller: Option<&UserInfo>,
) -> Result<Value, String> {
    let spec = body.get("spec").ok_or("spec: Required value")?;
    let status = match kind {
        Review::Token => {
            let token = spec.get("token").and_then(Value::as_str).unwrap_or_default();
            match auth.review_token(token) {
                Some(user) => json!({
                    "authenticated": true,
                    "user": {"username": user.name, "groups": user.groups},
                    "audiences": spec.get("audiences").cloned().unwrap_or_else(|| json!([])),
                }),
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            }
        }
        Review::SubjectAccess | Review::SelfSubjectAccess => {
            let user = match (kind, caller) {
                (Review::SelfSubjectAccess, Some(caller)) => caller.clone(),
                // RBAC off and no token: allowed whatever is asked.
                (Review::SelfSubjectAccess, None) => UserInfo {
                    name: "system:anonymous".to_owned(),
                    groups: vec!["system:unauthenticated".to_owned()],
                },
                _ => UserInfo {
                    name: spec
                        .get("user")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    groups: strings(spec, "groups"),
                },
            };
            if user.name.is_empty() && user.groups.is_empty() {
                return Err(
                    "spec.user: Invalid value: \"\": at least one of user or group must be specified"
                        .to_owned(),
                );
            }
            let decision = match (spec.get("nonResourceAttributes"), spec.get("resourceAttributes")) {
                (Some(attributes), None) => {
                    let verb = attributes.get("verb").and_then(Value::as_str).unwrap_or_default();
                    let path = attributes.get("path").and_then(Value::as_str).unwrap_or_default();
                    authorize(store, &user, &Attributes::NonResource { verb, path })
                }
                (None, Some(attributes)) => {
                    let text = |key: &str| {
                        attributes
                            .get(key)
                            .and_then(Value::as_str)
                            .filter(|v| !v.is_empty())
                    };
                    authorize(
                        store,
                        &user,
                        &Attributes::Resource {
                            verb: text("verb").unwrap_or_default(),
                            group: text("group").unwrap_or_default(),
                            resource: text("resource").unwrap_or_default(),
                            subresource: text("subresource"),
                            namespace: text("namespace"),
                            name: text("name"),
                        },
                    )
                }
                _ => {
                    return Err("spec.resourceAttributes: Invalid value: exactly one of nonResourceAttributes and resourceAttributes must be specified".to_owned());
                }
            };
            match decision {
                _ if !auth.rbac => json!({"allowed": true, "reason": "RBAC is off"}),
                Ok(()) => json!({"allowed": true, "reason": "allowed by RBAC"}),
                Err(_) => json!({"allowed": false}),
            }
        }
    };
    let (api_version, kind) = match kind {
        Review::Token => ("authentication.k8s.io/v1", "TokenReview"),
        Review::SubjectAccess => ("authorization.k8s.io/v1", "SubjectAccessReview"),
        Review::SelfSubjectAccess => ("authorization.k8s.io/v1", "SelfSubjectAccessReview"),
    };
    Ok(json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    }))
}

/// The reviews the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Review {
    Token,
    SubjectAccess,
    SelfSubjectAccess,
}

/// What a request asks to do, in RBAC terms.
#[derive(Debug, Clone)]
pub(crate) enum Attributes<'a> {
    Resource {
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        subresource: Option<&'a str>,
        namespace: Option<&'a str>,
        name: Option<&'a str>,
    },
    NonResource {
        verb: &'a str,
        path: &'a str,
    },
}

fn strings(value: &Value, key: &str) -> Vec<String> {
    value
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn subject_matches(subject: &Value, user: &UserInfo, binding_namespace: &str) -> bool {
    let name = subject.get("name").and_then(Value::as_str).unwrap_or_default();
    match subject.get("kind").and_then(Value::as_str) {
        Some("User") => user.name == name,
        Some("Group") => user.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let namespace = subject
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or(binding_namespace);
            user.name == format!("system:serviceaccount:{namespace}:{name}")
        }
        _ => false,
    }
}

fn rule_allows(rule: &Value, attributes: &Attributes<'_>) -> bool {
    let verbs = strings(rule, "verbs");
    match *attributes {
        Attributes::Resource {
            verb,
            group,
            resource,
            subresource,
            name,
            ..
        } => {
            if !verbs.iter().any(|v| v == "*" || v == verb) {
                return false;
            }
            if !strings(rule, "apiGroups").iter().any(|g| g == "*" || g == group) {
                return false;
            }
            let combined = match subresource {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_owned(),
            };
            let resource_ok = strings(rule, "resources").iter().any(|r| {
                r == "*" || *r == combined || subresource.is_some_and(|sub| *r == format!("*/{sub}"))
            });
            if !resource_ok {
                return false;
            }
            let names = strings(rule, "resourceNames");
            names.is_empty() || name.is_some_and(|n| names.iter().any(|allowed| allowed == n))
        }
        Attributes::NonResource { verb, path } => {
            verbs.iter().any(|v| v == "*" || v == verb)
                && strings(rule, "nonResourceURLs").iter().any(|url| {
                    url == "*"
                        || url == path
                        || url
                            .strip_suffix('*')
                            .is_some_and(|prefix| path.starts_with(prefix))
                })
        }
    }
}

fn role_rules(store: &Store, kind: &str, name: &str, namespace: &str) -> Vec<Value> {
    let (id, key) = match kind {
        "ClusterRole" => (
            id_of("rbac.authorization.k8s.io", "clusterroles"),
            (String::new(), name.to_owned()),
        ),
        "Role" => (
            id_of("rbac.authorization.k8s.io", "roles"),
            (namespace.to_owned(), name.to_owned()),
        ),
        _ => return Vec::new(),
    };
    store
        .get(id, &key)
        .and_then(|role| role.object.get("rules").and_then(Value::as_array).cloned())
        .unwrap_or_default()
}

/// Whether `user` may do what `attributes` describe; on refusal, the real server's message.
pub(crate) fn authorize(store: &Store, user: &UserInfo, attributes: &Attributes<'_>) -> Result<(), String> {
    if user.groups.iter().any(|g| g == "system:masters") {
        return Ok(());
    }
    let allowed_by = |binding: &Value, binding_namespace: &str| {
        let subjects = binding
            .get("subjects")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if !subjects
            .iter()
            .any(|s| subject_matches(s, user, binding_namespace))
        {
            return false;
        }
        let role_ref = binding.get("roleRef").cloned().unwrap_or(Value::Null);
        let kind = role_ref.get("kind").and_then(Value::as_str).unwrap_or_default();
        let name = role_ref.get("name").and_then(Value::as_str).unwrap_or_default();
        role_rules(store, kind, name, binding_namespace)
            .iter()
            .any(|rule| rule_allows(rule, attributes))
    };
    let cluster_bindings = store.list(id_of("rbac.authorization.k8s.io", "clusterrolebindings"), None);
    if cluster_bindings.iter().any(|b| allowed_by(&b.object, "")) {
        return Ok(());
    }
    if let Attributes::Resource {
        namespace: Some(namespace),
        ..
    } = attributes
    {
        let bindings = store.list(
            id_of("rbac.authorization.k8s.io", "rolebindings"),
            Some(namespace),
        );
        if bindings.iter().any(|b| allowed_by(&b.object, namespace)) {
            return Ok(());
        }
    }
    Err(forbidden_message(user, attributes))
}

fn forbidden_message(user: &UserInfo, attributes: &Attributes<'_>) -> String {
    match *attributes {
        Attributes::Resource {
            verb,
            group,
            resource,
            subresource,
            namespace,
            name,
        } => {
            let qualified = if group.is_empty() {
                resource.to_owned()
            } else {
                format!("{resource}.{group}")
            };
            let object = match name {
                Some(name) => format!("{qualified} {name:?}"),
                None => qualified,
            };
            let combined = match subresource {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_owned(),
            };
            let scope = match namespace {
                Some(ns) => format!("in the namespace {ns:?}"),
                None => "at the cluster scope".to_owned(),
            };
            format!(
                "{object} is forbidden: User {:?} cannot {verb} resource {combined:?} in API group {group:?} {scope}",
                user.name
            )
        }
        Attributes::NonResource { verb, path } => {
            format!("forbidden: User {:?} cannot {verb} path {path:?}", user.name)
        }
    }
}

/// Objects every real cluster has that matter here: namespaces, discovery for authenticated users, and
/// kube-controller-manager's Lease rules and the leader-locking Role that the seed guide patches.
pub(crate) fn bootstrap_objects() -> Vec<Value> {
    let mut objects: Vec<Value> = ["default", "kube-system", "kube-public", "kube-node-lease"]
        .into_iter()
        .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}))
        .collect();
    // The API server's own Service, which kube-apiserver's bootstrap controller makes in `default`.
    objects.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {
            "type": "ClusterIP", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
            "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}],
            "sessionAffinity": "None", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
        },
        "status": {"loadBalancer": {}},
    }));
    objects.extend([
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:discovery", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "rules": [{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/readyz", "/version", "/version/", "/openapi", "/openapi/*"], "verbs": ["get"]}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:discovery", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:discovery"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:basic-user", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "rules": [{"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews"], "verbs": ["create"]}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:basic-user", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:basic-user"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:auth-delegator", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "rules": [
                {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "extension-apiserver-authentication-reader", "namespace": "kube-system", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["extension-apiserver-authentication"], "verbs": ["get", "list", "watch"]}],
        }),
        // kube-controller-manager's own role: here only its rules on Leases (the real one has many more).
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:kube-controller-manager", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["kube-controller-manager"], "verbs": ["get", "update"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:kube-controller-manager", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kube-controller-manager"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-controller-manager"}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "system::leader-locking-kube-controller-manager", "namespace": "kube-system", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            // As kube-apiserver 1.37 bootstraps it: every Lease in kube-system.
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "watch", "list", "create", "update"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leasecandidates"], "verbs": ["get", "watch", "list", "create", "update"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "system::leader-locking-kube-controller-manager", "namespace": "kube-system", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "system::leader-locking-kube-controller-manager"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-controller-manager"},
                {"kind": "ServiceAccount", "name": "kube-controller-manager", "namespace": "kube-system"},
                {"kind": "ServiceAccount", "name": "leader-election-controller", "namespace": "kube-system"},
            ],
        }),
    ]);
    debug_assert!(
        objects
            .iter()
            .all(|o| RESOURCES.iter().any(|r| r.kind == o["kind"]))
    );
    objects
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::ResourceId;

    fn put(store: &mut Store, id: ResourceId, object: Value) {
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        store.put(id, (namespace, name), object);
    }

    fn lease_request<'a>(verb: &'a str, name: Option<&'a str>) -> Attributes<'a> {
        Attributes::Resource {
            verb,
            group: "coordination.k8s.io",
            resource: "leases",
            subresource: None,
            namespace: Some("kube-system"),
            name,
        }
    }

    fn store_with_seed_guide_role() -> Store {
        let mut store = Store::new(100);
        put(
            &mut store,
            id_of("rbac.authorization.k8s.io", "roles"),
            json!({
                "metadata": {"name": "r", "namespace": "kube-system"},
                "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["m"], "verbs": ["create", "list", "get", "update"]}],
            }),
        );
        put(
            &mut store,
            id_of("rbac.authorization.k8s.io", "rolebindings"),
            json!({
                "metadata": {"name": "r", "namespace": "kube-system"},
                "roleRef": {"kind": "Role", "name": "r"},
                "subjects": [{"kind": "ServiceAccount", "name": "ccm"}],
            }),
        );
        store
    }

    #[test]
    fn resource_names_allow_named_verbs_but_never_create() {
        let store = store_with_seed_guide_role();
        let ccm = UserInfo::service_account("kube-system", "ccm");
        assert_eq!(authorize(&store, &ccm, &lease_request("get", Some("m"))), Ok(()));
        assert_eq!(
            authorize(&store, &ccm, &lease_request("update", Some("m"))),
            Ok(())
        );
        assert!(authorize(&store, &ccm, &lease_request("get", Some("other"))).is_err());
        assert_eq!(
            authorize(&store, &ccm, &lease_request("create", None)).unwrap_err(),
            "leases.coordination.k8s.io is forbidden: User \"system:serviceaccount:kube-system:ccm\" cannot create resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-system\""
        );
        let other = UserInfo::service_account("default", "ccm");
        assert!(
            authorize(&store, &other, &lease_request("get", Some("m"))).is_err(),
            "a service account of another namespace"
        );
    }

    #[test]
    fn masters_and_discovery() {
        let mut store = Store::new(100);
        for object in bootstrap_objects() {
            let id = crate::resources::find_kind(
                object["apiVersion"].as_str().unwrap(),
                object["kind"].as_str().unwrap(),
            )
            .unwrap();
            put(&mut store, id, object);
        }
        assert_eq!(
            authorize(&store, &UserInfo::admin(), &lease_request("delete", Some("x"))),
            Ok(())
        );
        let user = UserInfo {
            name: "u".into(),
            groups: vec!["system:authenticated".into()],
        };
        assert_eq!(
            authorize(
                &store,
                &user,
                &Attributes::NonResource {
                    verb: "get",
                    path: "/apis/coordination.k8s.io/v1"
                }
            ),
            Ok(())
        );
        assert_eq!(
            authorize(
                &store,
                &user,
                &Attributes::NonResource {
                    verb: "get",
                    path: "/metrics"
                }
            )
            .unwrap_err(),
            "forbidden: User \"u\" cannot get path \"/metrics\""
        );
    }

    #[test]
    fn subresources_need_their_own_rule() {
        let rule = json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]});
        let status = Attributes::Resource {
            verb: "patch",
            group: "",
            resource: "nodes",
            subresource: Some("status"),
            namespace: None,
            name: Some("n"),
        };
        assert!(!rule_allows(&rule, &status));
        assert!(rule_allows(
            &json!({"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}),
            &status
        ));
        assert!(rule_allows(
            &json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}),
            &status
        ));
    }
}
