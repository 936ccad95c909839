//! What a request is about: its target (resource, namespace, name, subresource), its verb, and its
//! selectors.

use http::Method;

use crate::apply::Scope;
use crate::resources::{RESOURCES, ResourceId, ResourceType, find};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::Key;
use crate::wire::{Query, percent_decode};
use bytes::Bytes;

/// The object or collection a request is about.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) id: ResourceId,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

impl Target {
    pub(crate) fn resource(&self) -> &'static ResourceType {
        &RESOURCES[self.id]
    }

    pub(crate) fn key(&self) -> Key {
        (
            self.namespace.clone().unwrap_or_default(),
            self.name.clone().unwrap_or_default(),
        )
    }

    pub(crate) fn scope(&self) -> Scope {
        if self.subresource.as_deref() == Some("status") {
            Scope::Status
        } else {
            Scope::Main
        }
    }
}

/// Parses the path after `/api/v1` or `/apis/<group>/<version>`.
pub(crate) fn parse_target(group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let decoded: Vec<String> = rest.iter().map(|s| percent_decode(s)).collect();
    let rest: Vec<&str> = decoded.iter().map(String::as_str).collect();
    let namespaced_form = rest.len() >= 3
        && rest[0] == "namespaces"
        && find(group, version, rest[2]).is_some_and(|id| RESOURCES[id].namespaced);
    let (namespace, rest) = if namespaced_form {
        (Some(rest[1].to_owned()), &rest[2..])
    } else {
        (None, &rest[..])
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, subresource] => (*plural, Some(*name), Some(*subresource)),
        _ => return None,
    };
    let id = find(group, version, plural)?;
    let resource = &RESOURCES[id];
    if resource.namespaced && namespace.is_none() && name.is_some() {
        return None;
    }
    if !resource.namespaced && namespace.is_some() {
        return None;
    }
    if subresource.is_some_and(|s| s != "status" || !resource.status) {
        return None;
    }
    Some(Target {
        id,
        namespace,
        name: name.map(str::to_owned),
        subresource: subresource.map(str::to_owned),
    })
}

/// The Kubernetes verb of a request.
pub(crate) fn verb(method: &Method, target: &Target, query: &Query) -> Option<&'static str> {
    let named = target.name.is_some();
    Some(match (method.as_str(), named) {
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) if query.flag("watch") => "watch",
        ("GET" | "HEAD", false) => "list",
        ("POST", false) if target.subresource.is_none() => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) if target.subresource.is_none() => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    })
}

/// One API request, parsed.
pub(crate) struct ApiRequest<'a> {
    pub(crate) target: Target,
    pub(crate) verb: &'static str,
    pub(crate) query: &'a Query,
    pub(crate) body: Bytes,
    pub(crate) content_type: &'a str,
    pub(crate) user_agent: &'a str,
}

impl ApiRequest<'_> {
    pub(crate) fn manager(&self) -> String {
        match self.query.get("fieldManager") {
            Some(manager) if !manager.is_empty() => manager.to_owned(),
            _ => self
                .user_agent
                .split('/')
                .next()
                .filter(|s| !s.is_empty())
                .unwrap_or("unknown")
                .to_owned(),
        }
    }

    pub(crate) fn dry_run(&self) -> bool {
        self.query.get("dryRun") == Some("All")
    }
}

/// Parses `labelSelector` and `fieldSelector`.
pub(crate) fn selectors(
    resource: &ResourceType,
    query: &Query,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or_default())
        .map_err(ApiError::bad_request)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), resource)
        .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (plural, namespace, name, subresource)
    type Parsed<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a str>);

    #[track_caller]
    fn check(group: &str, version: &str, path: &str, expected: Option<Parsed<'_>>) {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let target = parse_target(group, version, &segments);
        let actual = target.as_ref().map(|t| {
            (
                t.resource().plural,
                t.namespace.as_deref(),
                t.name.as_deref(),
                t.subresource.as_deref(),
            )
        });
        assert_eq!(actual, expected, "{path}");
    }

    #[test]
    fn paths_resolve_to_targets() {
        check("", "v1", "nodes", Some(("nodes", None, None, None)));
        check(
            "",
            "v1",
            "nodes/n1/status",
            Some(("nodes", None, Some("n1"), Some("status"))),
        );
        check("", "v1", "services", Some(("services", None, None, None)));
        check(
            "",
            "v1",
            "namespaces/default/services/s/status",
            Some(("services", Some("default"), Some("s"), Some("status"))),
        );
        check(
            "",
            "v1",
            "namespaces/kube-system",
            Some(("namespaces", None, Some("kube-system"), None)),
        );
        check(
            "",
            "v1",
            "namespaces/kube-system/status",
            Some(("namespaces", None, Some("kube-system"), Some("status"))),
        );
        check(
            "coordination.k8s.io",
            "v1",
            "namespaces/kube-system/leases/l",
            Some(("leases", Some("kube-system"), Some("l"), None)),
        );
        check(
            "rbac.authorization.k8s.io",
            "v1",
            "namespaces/kube-system/roles/system%3A%3Aleader",
            Some(("roles", Some("kube-system"), Some("system::leader"), None)),
        );
        check(
            "coordination.k8s.io",
            "v1",
            "namespaces/kube-system/leases/l/status",
            None,
        );
        check("", "v1", "services/s", None);
        check("", "v1", "widgets", None);
    }
}
