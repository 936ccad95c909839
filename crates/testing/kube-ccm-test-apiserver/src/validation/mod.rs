//! What the real server refuses, refused the same way: decoding (types and unknown fields, `fieldValidation`)
//! and each stored kind's validation, with upstream's status codes, `Status` bodies and messages (as of
//! Kubernetes 1.34).
//!
//! - `decode.rs`: the body as the kind's type (`k8s-openapi`): a type error is a 400 (a 422 `patch` error
//!   for patches, a 500 for apply, as upstream); unknown fields are refused (`Strict`), warned about in a
//!   `Warning` header (`Warn`, the default), or dropped (`Ignore`) — and never stored, as upstream.
//! - `meta.rs`: names per kind, labels, annotations (and their total size), finalizers, generateName.
//! - `core.rs`: Node (taints, pod CIDRs, provider ID and pod CIDRs immutable once set, duplicate
//!   addresses), Service (type, ports, selector, load-balancer class and its immutability, the
//!   load-balancer status), ConfigMap and Secret keys and sizes.
//! - `other.rs`: Lease spec; Events of core/v1 (the legacy rules) and events.k8s.io/v1 (the strict ones);
//!   RBAC roles' rules and bindings' role references and subjects.
//!
//! **Not validated** (this project writes none of it; the crate doc lists it too): Pod and Deployment specs
//! (metadata only), Service cluster IPs and IP families (this server allocates them), owner references,
//! duplicate JSON keys, and the review objects (not served).

mod core;
mod decode;
mod field;
mod meta;
mod names;
mod other;

use serde_json::Value;

use self::decode::{Decoded, render};
pub(crate) use self::field::go_quote;
use self::field::{Errors, FieldError, Path, Problem, Shown, invalid};
use self::meta::NameRule;
use crate::request::Target;
use crate::resources::ResourceType;
use crate::status::ApiError;

/// `fieldValidation`: what unknown fields do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    /// Dropped silently.
    Ignore,
    /// Dropped, each with a `Warning` header (the server's default).
    Warn,
    /// Refused.
    Strict,
}

impl FieldValidation {
    /// From the query; `options` names the verb's options kind for the error (`CreateOptions`, …).
    pub(crate) fn parse(value: Option<&str>, options: &str) -> Result<FieldValidation, ApiError> {
        match value.unwrap_or_default() {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            "Strict" => Ok(FieldValidation::Strict),
            other => {
                let errors = [FieldError {
                    path: Path::root("fieldValidation"),
                    problem: Problem::NotSupported {
                        value: Shown::text(other),
                        supported: &["", "Ignore", "Strict", "Warn"],
                    },
                }];
                Err(invalid(options, "meta.k8s.io", "", &errors))
            }
        }
    }
}

/// Apply without `fieldManager`.
pub(crate) fn field_manager_required() -> ApiError {
    let errors = [FieldError {
        path: Path::root("fieldManager"),
        problem: Problem::Required("is required for apply patch".to_owned()),
    }];
    invalid("PatchOptions", "meta.k8s.io", "", &errors)
}

/// How an object is being written.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Write<'a> {
    Create,
    /// The main resource, over `old`.
    Update(&'a Value),
    /// The `/status` subresource, over `old`.
    Status(&'a Value),
}

impl Write<'_> {
    fn old(&self) -> Option<&Value> {
        match self {
            Write::Create => None,
            Write::Update(old) | Write::Status(old) => Some(old),
        }
    }
}

fn unknown_texts(decoded: &Decoded) -> Vec<String> {
    decoded
        .unknown
        .iter()
        .map(|path| format!("unknown field {}", go_quote(&render(path))))
        .collect()
}

fn drop_unknown(object: &mut Value, decoded: &Decoded) {
    for path in &decoded.unknown {
        decode::remove(object, path);
    }
}

fn version_in(object: &Value, resource: &ResourceType) -> String {
    object
        .get("apiVersion")
        .and_then(Value::as_str)
        .map_or(resource.version, |v| v.rsplit('/').next().unwrap_or(v))
        .to_owned()
}

/// A create or update body: type errors and, with `Strict`, unknown fields are 400s; otherwise unknown fields
/// are dropped, and the warnings to send are returned.
pub(crate) fn decode_body(
    resource: &ResourceType,
    object: &mut Value,
    mode: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    let cannot = |detail: String| {
        ApiError::bad_request(format!(
            "{kind} in version {version} cannot be handled as a {kind}: {detail}",
            kind = resource.kind,
            version = go_quote(&version_in(object, resource)),
        ))
    };
    let decoded = decode::decode(resource, object).map_err(|e| cannot(e.message))?;
    let texts = unknown_texts(&decoded);
    if mode == FieldValidation::Strict && !texts.is_empty() {
        return Err(cannot(format!("strict decoding error: {}", texts.join(", "))));
    }
    drop_unknown(object, &decoded);
    Ok(if mode == FieldValidation::Warn {
        texts
    } else {
        Vec::new()
    })
}

/// A merge, JSON or strategic-merge patch's result: a type error or a strict unknown field is upstream's
/// 422 `patch` error (of no kind, naming no object, showing the patched object).
pub(crate) fn decode_patched(
    resource: &ResourceType,
    object: &mut Value,
    mode: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    let patch_error = |object: &Value, detail: String| {
        let errors = [FieldError {
            path: Path::root("patch"),
            problem: Problem::Invalid {
                value: Shown::text(&object.to_string()),
                detail,
            },
        }];
        invalid("", "", "", &errors)
    };
    let decoded = decode::decode(resource, object).map_err(|e| patch_error(object, e.message))?;
    let texts = unknown_texts(&decoded);
    if mode == FieldValidation::Strict && !texts.is_empty() {
        return Err(patch_error(
            object,
            format!("strict decoding error: {}", texts.join(", ")),
        ));
    }
    drop_unknown(object, &decoded);
    Ok(if mode == FieldValidation::Warn {
        texts
    } else {
        Vec::new()
    })
}

/// An applied configuration (server-side apply): a type error or an unknown field fails the typed
/// conversion, a 500 without a reason, whatever `fieldValidation` says.
pub(crate) fn decode_applied(
    resource: &ResourceType,
    target: &Target,
    object: &Value,
) -> Result<(), ApiError> {
    let failed = |detail: String| {
        ApiError::untyped(
            500,
            format!(
                "failed to create typed patch object ({}/{}; {}, Kind={}): {detail}",
                target.namespace.as_deref().unwrap_or_default(),
                target.name.as_deref().unwrap_or_default(),
                resource.api_version(),
                resource.kind
            ),
        )
    };
    let decoded = decode::decode(resource, object).map_err(|e| failed(e.message))?;
    match decoded.unknown.first() {
        Some(path) => Err(failed(format!(".{}: field not declared in schema", render(path)))),
        None => Ok(()),
    }
}

/// Validates `object` as `resource`'s kind for `write`; a 422 `Invalid` naming every problem.
pub(crate) fn validate(resource: &ResourceType, object: &Value, write: Write<'_>) -> Result<(), ApiError> {
    let mut errors = Errors::default();
    if let Some(old) = write.old() {
        meta::object_meta_update(object, old, &mut errors);
    }
    let status_only = matches!(write, Write::Status(_));
    match (resource.group, resource.kind) {
        ("", "Namespace") => meta::object_meta(object, NameRule::Label, true, &mut errors),
        ("", "Node") => {
            if !status_only {
                meta::object_meta(object, NameRule::Subdomain, true, &mut errors);
                core::node(object, &mut errors);
            }
            if let Some(old) = write.old() {
                core::node_update(object, old, &mut errors);
            }
        }
        ("", "Service") => {
            meta::object_meta(object, NameRule::Dns1035, true, &mut errors);
            core::service(object, &mut errors);
            match write {
                Write::Update(old) => core::service_update(object, old, &mut errors),
                Write::Status(_) => core::load_balancer_status(object, &mut errors),
                Write::Create => {}
            }
        }
        ("", "ConfigMap") => {
            meta::object_meta(object, NameRule::Subdomain, true, &mut errors);
            core::config_map(object, false, &mut errors);
        }
        ("", "Secret") => {
            meta::object_meta(object, NameRule::Subdomain, true, &mut errors);
            core::config_map(object, true, &mut errors);
        }
        ("", "Event") => {
            other::event(object, false, &mut errors);
            // Only the generic path-segment name check, and only when nothing else failed.
            if errors.is_empty() {
                meta::object_meta(object, NameRule::PathSegment, false, &mut errors);
            }
        }
        ("events.k8s.io", "Event") => {
            meta::object_meta(object, NameRule::Subdomain, true, &mut errors);
            other::event(object, true, &mut errors);
        }
        ("coordination.k8s.io", "Lease") => {
            meta::object_meta(object, NameRule::Subdomain, false, &mut errors);
            other::lease(object, &mut errors);
        }
        ("rbac.authorization.k8s.io", kind) => {
            meta::object_meta(object, NameRule::PathSegment, true, &mut errors);
            match kind {
                "Role" => other::role(object, true, &mut errors),
                "ClusterRole" => other::role(object, false, &mut errors),
                binding => {
                    other::binding(object, binding == "ClusterRoleBinding", &mut errors);
                    if let Some(old) = write.old() {
                        other::binding_update(object, old, &mut errors);
                    }
                }
            }
        }
        _ => meta::object_meta(object, NameRule::Subdomain, true, &mut errors),
    }
    // Upstream reports Events of either API as the core group's.
    let group = if resource.kind == "Event" {
        ""
    } else {
        resource.group
    };
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    errors.into_result(resource.kind, group, name)
}
