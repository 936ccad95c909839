//! Lease (`coordination.k8s.io`), Event (core/v1 and `events.k8s.io/v1`) and RBAC objects.

use serde_json::Value;

use super::field::{Errors, Path, Shown};
use super::names::{dns1123_subdomain, path_segment, qualified_name};

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
const EVENT_TYPES: [&str; 2] = ["Normal", "Warning"];

fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `ValidateLeaseSpec`.
pub(crate) fn lease(lease: &Value, errors: &mut Errors) {
    let spec = Path::root("spec");
    if let Some(duration) = lease
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_i64)
        && duration <= 0
    {
        errors.invalid(
            spec.child("leaseDurationSeconds"),
            Shown::number(duration),
            "must be greater than 0",
        );
    }
    if let Some(transitions) = lease.pointer("/spec/leaseTransitions").and_then(Value::as_i64)
        && transitions < 0
    {
        errors.invalid(
            spec.child("leaseTransitions"),
            Shown::number(transitions),
            "must be greater than or equal to 0",
        );
    }
    let strategy = text(lease, "/spec/strategy");
    if !strategy.is_empty() {
        // Upstream reports it at a doubled path.
        let at = spec.child("strategy").child("strategy");
        if strategy.contains('/') {
            errors.invalid_each(&at, strategy, qualified_name(strategy));
        } else if strategy != "OldestEmulationVersion" {
            errors.not_supported(at, strategy, &["OldestEmulationVersion"]);
        }
    }
    if !text(lease, "/spec/preferredHolder").is_empty() && strategy.is_empty() {
        errors.forbidden(
            spec.child("preferredHolder"),
            "may only be specified if `strategy` is defined",
        );
    }
}

/// A field of an Event: its core/v1 name (events.k8s.io/v1 reports errors with the core names).
struct EventFields {
    involved_namespace: &'static str,
    message: &'static str,
    event_time: &'static str,
    /// The reporting controller's JSON pointer and its name in errors (`reportingComponent` in core/v1).
    reporting_controller: (&'static str, &'static str),
}

const CORE_EVENT: EventFields = EventFields {
    involved_namespace: "/involvedObject/namespace",
    message: "/message",
    event_time: "/eventTime",
    reporting_controller: ("/reportingComponent", "reportingComponent"),
};

const EVENTS_V1: EventFields = EventFields {
    involved_namespace: "/regarding/namespace",
    message: "/note",
    event_time: "/eventTime",
    reporting_controller: ("/reportingController", "reportingController"),
};

fn at_most(errors: &mut Errors, path: &str, value: &str, max: usize) {
    if value.len() > max {
        errors.invalid(
            Path::root(path),
            Shown::text(""),
            format!("can have at most {max} characters"),
        );
    }
}

/// `ValidateEventCreate`/`Update`: the legacy rules for every version; `events_v1` adds the strict ones of
/// `events.k8s.io/v1`.
pub(crate) fn event(event: &Value, events_v1: bool, errors: &mut Errors) {
    let fields = if events_v1 { &EVENTS_V1 } else { &CORE_EVENT };
    let namespace = text(event, "/metadata/namespace");
    let involved = text(event, fields.involved_namespace);
    let new_style = !text(event, fields.event_time).is_empty();
    let mismatch = if new_style {
        involved.is_empty() && !matches!(namespace, "default" | "kube-system")
            || !involved.is_empty() && involved != namespace
    } else {
        involved.is_empty() && !matches!(namespace, "" | "default")
            || !involved.is_empty() && involved != namespace
    };
    if mismatch {
        errors.invalid(
            Path::root("involvedObject").child("namespace"),
            Shown::text(involved),
            "does not match event.namespace",
        );
    }
    if new_style {
        let (pointer, field) = fields.reporting_controller;
        let controller = text(event, pointer);
        if controller.is_empty() {
            errors.required(Path::root(field), "");
        }
        errors.invalid_each(&Path::root(field), controller, qualified_name(controller));
        for (field, pointer) in [
            ("reportingInstance", "/reportingInstance"),
            ("action", "/action"),
            ("reason", "/reason"),
        ] {
            let value = text(event, pointer);
            if value.is_empty() {
                errors.required(Path::root(field), "");
            }
            at_most(errors, field, value, 128);
        }
        at_most(errors, "message", text(event, fields.message), 1024);
    }
    if !namespace.is_empty() {
        errors.invalid_each(&Path::root("namespace"), namespace, dns1123_subdomain(namespace));
    }
    if !events_v1 {
        return;
    }
    if !new_style {
        errors.required(Path::root("eventTime"), "");
    }
    let kind = text(event, "/type");
    if !EVENT_TYPES.contains(&kind) {
        errors.invalid(
            Path::root("type"),
            Shown::text(""),
            format!("has invalid value: {kind}"),
        );
    }
    if let Some(series) = event.get("series").filter(|s| !s.is_null()) {
        if series.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
            errors.invalid(
                Path::root("series").child("count"),
                Shown::text(""),
                "should be at least 2",
            );
        }
        if text(series, "/lastObservedTime").is_empty() {
            errors.required(Path::root("series").child("lastObservedTime"), "");
        }
    }
    for (field, pointer) in [
        ("firstTimestamp", "/deprecatedFirstTimestamp"),
        ("lastTimestamp", "/deprecatedLastTimestamp"),
        ("count", "/deprecatedCount"),
    ] {
        if event
            .pointer(pointer)
            .is_some_and(|v| !v.is_null() && v.as_i64() != Some(0))
        {
            errors.invalid(Path::root(field), Shown::text(""), "needs to be unset");
        }
    }
    let source = event.pointer("/deprecatedSource");
    if source.is_some_and(|s| !text(s, "/component").is_empty() || !text(s, "/host").is_empty()) {
        errors.invalid(Path::root("source"), Shown::text(""), "needs to be unset");
    }
}

/// Role and ClusterRole rules.
pub(crate) fn role(role: &Value, namespaced: bool, errors: &mut Errors) {
    let rules = role
        .get("rules")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for (index, rule) in rules.iter().enumerate() {
        let at = Path::root("rules").index(index);
        let list = |field: &str| -> Vec<&str> {
            rule.get(field)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect()
        };
        if list("verbs").is_empty() {
            errors.required(at.child("verbs"), "verbs must contain at least one value");
        }
        let urls = list("nonResourceURLs");
        if !urls.is_empty() {
            let shown = Shown::marshalled(&Value::from(urls.clone()));
            if namespaced {
                errors.invalid(
                    at.child("nonResourceURLs"),
                    shown,
                    "namespaced rules cannot apply to non-resource URLs",
                );
                continue;
            }
            if !list("apiGroups").is_empty()
                || !list("resources").is_empty()
                || !list("resourceNames").is_empty()
            {
                errors.invalid(
                    at.child("nonResourceURLs"),
                    shown,
                    "rules cannot apply to both regular resources and non-resource URLs",
                );
            }
            continue;
        }
        if rule
            .get("apiGroups")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
        {
            errors.required(
                at.child("apiGroups"),
                "resource rules must supply at least one api group",
            );
        }
        if list("resources").is_empty() {
            errors.required(
                at.child("resources"),
                "resource rules must supply at least one resource",
            );
        }
    }
}

/// RoleBinding and ClusterRoleBinding.
pub(crate) fn binding(binding: &Value, cluster: bool, errors: &mut Errors) {
    let role_ref = Path::root("roleRef");
    let group = text(binding, "/roleRef/apiGroup");
    if group != RBAC_GROUP {
        errors.not_supported(role_ref.child("apiGroup"), group, &[RBAC_GROUP]);
    }
    let kind = text(binding, "/roleRef/kind");
    let kinds: &'static [&'static str] = if cluster {
        &["ClusterRole"]
    } else {
        &["Role", "ClusterRole"]
    };
    if !kinds.contains(&kind) {
        errors.not_supported(role_ref.child("kind"), kind, kinds);
    }
    let name = text(binding, "/roleRef/name");
    if name.is_empty() {
        errors.required(role_ref.child("name"), "");
    } else {
        errors.invalid_each(&role_ref.child("name"), name, path_segment(name));
    }
    let subjects = binding
        .get("subjects")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for (index, subject) in subjects.iter().enumerate() {
        let at = Path::root("subjects").index(index);
        let name = text(subject, "/name");
        if name.is_empty() {
            errors.required(at.child("name"), "");
        }
        let group = text(subject, "/apiGroup");
        match text(subject, "/kind") {
            "ServiceAccount" => {
                if !name.is_empty() {
                    errors.invalid_each(&at.child("name"), name, dns1123_subdomain(name));
                }
                if !group.is_empty() {
                    errors.not_supported(at.child("apiGroup"), group, &[""]);
                }
                if cluster && text(subject, "/namespace").is_empty() {
                    errors.required(at.child("namespace"), "");
                }
            }
            kind @ ("User" | "Group") => {
                if name.is_empty() {
                    let what = if kind == "User" { "user" } else { "group" };
                    errors.invalid(
                        at.child("name"),
                        Shown::text(""),
                        format!("{what} name cannot be empty"),
                    );
                }
                if group != RBAC_GROUP {
                    errors.not_supported(at.child("apiGroup"), group, &[RBAC_GROUP]);
                }
            }
            other => errors.not_supported(at.child("kind"), other, &["ServiceAccount", "User", "Group"]),
        }
    }
}

/// A binding's role reference cannot change.
pub(crate) fn binding_update(new: &Value, old: &Value, errors: &mut Errors) {
    if new.get("roleRef") != old.get("roleRef") {
        let role_ref = new.get("roleRef").cloned().unwrap_or(Value::Null);
        errors.invalid(
            Path::root("roleRef"),
            Shown::fields(&[
                ("APIGroup", role_ref.get("apiGroup").unwrap_or(&Value::Null)),
                ("Kind", role_ref.get("kind").unwrap_or(&Value::Null)),
                ("Name", role_ref.get("name").unwrap_or(&Value::Null)),
            ]),
            "cannot change roleRef",
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

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
    fn leases() {
        let l = json!({"spec": {"leaseDurationSeconds": -1, "leaseTransitions": -2, "preferredHolder": "x"}});
        assert_eq!(
            rendered(|e| lease(&l, e)),
            [
                "spec.leaseDurationSeconds: Invalid value: -1: must be greater than 0",
                "spec.leaseTransitions: Invalid value: -2: must be greater than or equal to 0",
                "spec.preferredHolder: Forbidden: may only be specified if `strategy` is defined",
            ]
        );
    }

    #[test]
    fn events_of_both_apis() {
        let good = json!({"metadata": {"namespace": "default"}, "eventTime": "2026-01-01T00:00:00.000000Z",
            "regarding": {"kind": "Node", "name": "n1"}, "reportingController": "cloud-node-controller",
            "reportingInstance": "host_1", "action": "InitializeNode", "reason": "Synced", "type": "Normal", "note": "ok"});
        assert!(rendered(|e| event(&good, true, e)).is_empty());
        let mut long = good.clone();
        long["note"] = json!("n".repeat(1025));
        long["type"] = json!("Info");
        assert_eq!(
            rendered(|e| event(&long, true, e)),
            [
                "message: Invalid value: \"\": can have at most 1024 characters",
                "type: Invalid value: \"\": has invalid value: Info",
            ]
        );
        let legacy = json!({"metadata": {"namespace": "kube-system"}, "involvedObject": {"kind": "Node", "name": "n1"}, "reason": "x"});
        assert_eq!(
            rendered(|e| event(&legacy, false, e)),
            ["involvedObject.namespace: Invalid value: \"\": does not match event.namespace"]
        );
    }

    #[test]
    fn rbac() {
        let r = json!({"rules": [{"apiGroups": [""], "resources": ["nodes"]}, {"verbs": ["get"], "nonResourceURLs": ["/metrics"]}]});
        assert_eq!(
            rendered(|e| role(&r, true, e)),
            [
                "rules[0].verbs: Required value: verbs must contain at least one value",
                "rules[1].nonResourceURLs: Invalid value: [\"/metrics\"]: namespaced rules cannot apply to non-resource URLs",
            ]
        );
        let b = json!({"roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "r"}, "subjects": [
            {"kind": "ServiceAccount", "name": "sa"}, {"kind": "User", "name": "u"}, {"kind": "Robot", "name": "x"}]});
        assert_eq!(
            rendered(|e| binding(&b, true, e)),
            [
                "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                "subjects[0].namespace: Required value",
                "subjects[1].apiGroup: Unsupported value: \"\": supported values: \"rbac.authorization.k8s.io\"",
                "subjects[2].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
            ]
        );
    }
}
