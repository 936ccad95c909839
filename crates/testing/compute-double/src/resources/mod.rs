//! The double's state: resources by project, scope and name, stored as the JSON the model types give, and
//! the operations that change them.
//!
//! - [`collection`]: the kinds of resource served, each read and written through its model type.
//! - [`errors`]: Compute-shaped error answers.
//! - [`listing`]: list filters, pages and aggregated lists.
//! - [`operations`]: writes applied when their operation is done, and injected operation failures.

mod collection;
mod errors;
mod listing;
mod operations;
mod rules;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

pub use self::collection::Collection;
pub(crate) use self::collection::MEMBERS;
pub(crate) use self::errors::ApiError;
pub(crate) use self::listing::ListQuery;
pub(crate) use self::operations::OperationFault;
use self::operations::{Effect, Operation};
use crate::Fault;

/// `(collection, project, scope, name)`.
pub(crate) type Key = (Collection, String, String, String);

/// Everything the double holds.
#[derive(Debug)]
pub(crate) struct State {
    base: String,
    resources: BTreeMap<Key, Value>,
    operations: BTreeMap<(String, String, String), Operation>,
    next_id: u64,
    pub(crate) operation_polls: u32,
    pub(crate) faults: Vec<Fault>,
    pub(crate) operation_faults: Vec<OperationFault>,
    pub(crate) latency: Duration,
    pub(crate) log: Vec<String>,
    /// Every write request (not a `GET`) with its caller and answer.
    pub(crate) writes: Vec<crate::Write>,
    /// The metadata server's values, by path under `/computeMetadata/v1/`.
    pub(crate) metadata: BTreeMap<String, String>,
    /// `(project, zone)` of the zones that cannot be reached: their requests fail with 503 and an
    /// aggregated list leaves them out with a scope warning `UNREACHABLE`, as Compute's does.
    pub(crate) unreachable_zones: std::collections::BTreeSet<(String, String)>,
    /// The project's rate quota, when one is set.
    pub(crate) rate_limit: Option<kube_ccm_fake::RateLimit>,
    /// Requests refused for it.
    pub(crate) throttled: u64,
}

impl State {
    pub(crate) fn new(base: String) -> State {
        State {
            base,
            resources: BTreeMap::new(),
            operations: BTreeMap::new(),
            next_id: 1_000_000_000_000,
            operation_polls: 1,
            faults: Vec::new(),
            operation_faults: Vec::new(),
            latency: Duration::ZERO,
            log: Vec::new(),
            writes: Vec::new(),
            metadata: BTreeMap::new(),
            unreachable_zones: std::collections::BTreeSet::new(),
            rate_limit: None,
            throttled: 0,
        }
    }

    /// Whether `scope` (`zones/Z`, `regions/R`, `global`) of `project` cannot be reached.
    pub(crate) fn unreachable(&self, project: &str, scope: &str) -> bool {
        scope.strip_prefix("zones/").is_some_and(|zone| {
            self.unreachable_zones
                .contains(&(project.to_owned(), zone.to_owned()))
        })
    }

    /// A fresh number (for a fingerprint).
    pub(crate) fn next_seed(&mut self) -> u64 {
        self.id()
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn self_link(&self, project: &str, scope: &str, collection: &str, name: &str) -> String {
        format!(
            "{}/compute/v1/projects/{project}/{scope}/{collection}/{name}",
            self.base
        )
    }

    /// The scope's own link (`…/zones/Z`), for the `zone`/`region` fields.
    fn scope_link(&self, project: &str, scope: &str) -> String {
        format!("{}/compute/v1/projects/{project}/{scope}", self.base)
    }

    /// Fills the server's fields of a new resource.
    fn finish(&mut self, collection: Collection, project: &str, scope: &str, mut value: Value) -> Value {
        let name = value["name"].as_str().unwrap_or_default().to_owned();
        let id = self.id();
        let ipv6 = (collection == Collection::ForwardingRules)
            .then(|| self.ipv6_rule_address(project, scope, &value, id))
            .flatten();
        let object = value.as_object_mut().expect("resources are objects");
        object.entry("kind").or_insert_with(|| collection.kind().into());
        object.entry("id").or_insert_with(|| id.to_string().into());
        object
            .entry("creationTimestamp")
            .or_insert_with(|| "2026-01-01T00:00:00.000-08:00".into());
        let link = format!(
            "{}/compute/v1/projects/{project}/{scope}/{}/{name}",
            self.base,
            collection.path()
        );
        object.insert("selfLink".into(), link.into());
        let scope_link = self.scope_link(project, scope);
        match collection.scope_kind() {
            "zones" => {
                object.insert("zone".into(), scope_link.into());
            }
            "regions" => {
                object.insert("region".into(), scope_link.into());
            }
            _ => {}
        }
        let internal_rule = collection == Collection::ForwardingRules
            && object.get("loadBalancingScheme").and_then(Value::as_str) == Some("INTERNAL");
        if internal_rule && !object.contains_key("subnetwork") {
            // As Compute on an auto-mode network: the region's subnet.
            let subnet = format!(
                "{}/compute/v1/projects/{project}/{scope}/subnetworks/default",
                self.base
            );
            object.insert("subnetwork".into(), subnet.into());
        }
        match collection {
            Collection::Instances => {
                object.entry("status").or_insert_with(|| "RUNNING".into());
            }
            Collection::Addresses => {
                object.entry("status").or_insert_with(|| "RESERVED".into());
                if !object.contains_key("address") {
                    let n = id % 250 + 1;
                    let internal = object.get("addressType").and_then(Value::as_str) == Some("INTERNAL");
                    let ip = if internal {
                        format!("10.128.1.{n}")
                    } else {
                        format!("203.0.113.{n}")
                    };
                    object.insert("address".into(), ip.into());
                }
            }
            Collection::ForwardingRules if ipv6.is_some() => {
                object.insert("IPAddress".into(), ipv6.into());
            }
            Collection::ForwardingRules if !object.contains_key("IPAddress") => {
                let n = id % 250 + 1;
                let internal = object.get("loadBalancingScheme").and_then(Value::as_str) == Some("INTERNAL");
                let ip = if internal {
                    format!("10.128.2.{n}")
                } else {
                    format!("198.51.100.{n}")
                };
                object.insert("IPAddress".into(), ip.into());
            }
            Collection::BackendServices => {
                object.insert("fingerprint".into(), fingerprint(id).into());
            }
            Collection::InstanceGroups => {
                object.insert("size".into(), 0.into());
                object.insert("fingerprint".into(), fingerprint(id).into());
                object.insert(MEMBERS.into(), json!([]));
            }
            Collection::Routes => {
                object.entry("priority").or_insert_with(|| 1000.into());
            }
            _ => {}
        }
        value
    }

    pub(crate) fn put(&mut self, collection: Collection, project: &str, scope: &str, value: Value) {
        let value = collection.normalise(value).unwrap_or_else(|e| {
            panic!(
                "a {} put into the double is not model-shaped: {e}",
                collection.path()
            )
        });
        let value = self.finish(collection, project, scope, value);
        let name = value["name"].as_str().expect("a resource has a name").to_owned();
        self.resources
            .insert((collection, project.into(), scope.into(), name), value);
    }

    pub(crate) fn get(
        &self,
        collection: Collection,
        project: &str,
        scope: &str,
        name: &str,
    ) -> Option<Value> {
        self.resources
            .get(&(collection, project.into(), scope.into(), name.into()))
            .cloned()
            .map(|v| self.presented(collection, v))
    }

    /// A resource as an answer shows it: without what only the double keeps (an instance group's
    /// members), and a route whose next-hop instance is gone with Compute's `NEXT_HOP_INSTANCE_NOT_FOUND`
    /// warning.
    pub(super) fn presented(&self, collection: Collection, mut value: Value) -> Value {
        if let Some(object) = value.as_object_mut() {
            object.remove(MEMBERS);
        }
        if collection != Collection::Routes {
            return value;
        }
        let Some(hop) = value["nextHopInstance"].as_str() else {
            return value;
        };
        let path = hop.find("projects/").map_or(hop, |at| &hop[at..]);
        let parts: Vec<&str> = path.split('/').collect();
        let ["projects", project, "zones", zone, "instances", name] = parts.as_slice() else {
            return value;
        };
        let key = (
            Collection::Instances,
            project.to_string(),
            format!("zones/{zone}"),
            name.to_string(),
        );
        if !self.resources.contains_key(&key) {
            value["warnings"] = json!([{
                "code": "NEXT_HOP_INSTANCE_NOT_FOUND",
                "message": format!("Next hop instance '{path}' does not exist."),
            }]);
            return Collection::Routes
                .normalise(value)
                .expect("a route warning is model-shaped");
        }
        value
    }

    pub(crate) fn patch(
        &mut self,
        collection: Collection,
        project: &str,
        scope: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> bool {
        let Some(value) = self
            .resources
            .get_mut(&(collection, project.into(), scope.into(), name.into()))
        else {
            return false;
        };
        change(value);
        true
    }

    pub(crate) fn remove(
        &mut self,
        collection: Collection,
        project: &str,
        scope: &str,
        name: &str,
    ) -> Option<Value> {
        self.resources
            .remove(&(collection, project.into(), scope.into(), name.into()))
    }

    pub(crate) fn all(&self, collection: Collection, project: &str) -> Vec<Value> {
        self.resources
            .iter()
            .filter(|((c, p, _, _), _)| *c == collection && p == project)
            .map(|(_, v)| self.presented(collection, v.clone()))
            .collect()
    }

    /// Sets an instance group's members (`put` makes a group empty).
    pub(crate) fn set_members(&mut self, project: &str, scope: &str, name: &str, members: &[String]) {
        let key = (
            Collection::InstanceGroups,
            project.into(),
            scope.into(),
            name.into(),
        );
        if let Some(group) = self.resources.get_mut(&key) {
            group[MEMBERS] = members.into();
            group["size"] = members.len().into();
        }
    }

    /// The members (instance links) of an instance group.
    pub(crate) fn members(&self, project: &str, scope: &str, name: &str) -> Option<Vec<String>> {
        let group = self.resources.get(&(
            Collection::InstanceGroups,
            project.into(),
            scope.into(),
            name.into(),
        ))?;
        Some(links(&group[MEMBERS]).into_iter().map(str::to_owned).collect())
    }

    /// The fault for this request, if one is armed (and spends it).
    pub(crate) fn fault(&mut self, method: &http::Method, path: &str) -> Option<ApiError> {
        if self.rate_limit.as_mut().is_some_and(|limit| !limit.admit()) {
            self.throttled += 1;
            // Compute's answer to a project over its rate quota: 403, not 429.
            return Some(ApiError::rate_limited());
        }
        let fault = self.faults.iter_mut().find(|f| {
            f.times > 0 && f.method.as_ref().is_none_or(|m| m == method) && path.contains(&f.path_contains)
        })?;
        fault.times -= 1;
        let message = match fault.status {
            429 => "Rate Limit Exceeded".to_owned(),
            status => format!("injected failure ({status})"),
        };
        Some(ApiError::new(fault.status, &fault.reason, message))
    }

    /// An insert: checked now (409 when the name is taken), applied when its operation is done.
    pub(crate) fn insert(
        &mut self,
        collection: Collection,
        project: &str,
        scope: &str,
        body: Value,
        path: &str,
    ) -> Result<Value, ApiError> {
        let body = collection
            .normalise(body)
            .map_err(|e| ApiError::new(400, "parseError", format!("Invalid JSON payload received. {e}")))?;
        let Some(name) = body["name"].as_str().map(str::to_owned) else {
            return Err(ApiError::new(
                400,
                "required",
                "Required field 'resource.name' not specified",
            ));
        };
        if collection == Collection::ForwardingRules {
            self.check_rule(project, scope, &body)?;
        }
        let key = (collection, project.to_owned(), scope.to_owned(), name.clone());
        if self.resources.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "alreadyExists",
                format!(
                    "The resource '{}' already exists",
                    self.self_link(project, scope, collection.path(), &name)
                        .split("/compute/v1/")
                        .nth(1)
                        .unwrap_or_default()
                ),
            ));
        }
        let value = self.finish(collection, project, scope, body);
        let target = value["selfLink"].as_str().unwrap_or_default().to_owned();
        Ok(self.operation(project, scope, "insert", &target, Effect::Put(key, value), path))
    }

    /// A delete: 404 now when there is nothing, removed when its operation is done.
    pub(crate) fn delete(
        &mut self,
        collection: Collection,
        project: &str,
        scope: &str,
        name: &str,
        path: &str,
    ) -> Result<Value, ApiError> {
        let key = (collection, project.to_owned(), scope.to_owned(), name.to_owned());
        let Some(existing) = self.resources.get(&key) else {
            return Err(ApiError::not_found(&format!(
                "projects/{project}/{scope}/{}/{name}",
                collection.path()
            )));
        };
        let target = existing["selfLink"].as_str().unwrap_or_default().to_owned();
        // As Compute: what another resource uses cannot be deleted.
        if let Some(user) = self.user_of(collection, project, &target) {
            return Err(ApiError::new(
                400,
                "resourceInUseByAnotherResource",
                format!(
                    "The {} resource '{}' is already being used by '{}'",
                    collection.singular(),
                    link_path(&target),
                    link_path(&user)
                ),
            ));
        }
        Ok(self.operation(project, scope, "delete", &target, Effect::Remove(key), path))
    }

    /// The link of a resource that uses the `collection` resource at `target` (a target pool or backend
    /// service its health check, a forwarding rule its backend service, a backend service its instance
    /// group), if any.
    fn user_of(&self, collection: Collection, project: &str, target: &str) -> Option<String> {
        let (user, refers): (Collection, fn(&Value) -> Vec<&str>) = match collection {
            Collection::HttpHealthChecks => (Collection::TargetPools, |v| links(&v["healthChecks"])),
            Collection::HealthChecks => (Collection::BackendServices, |v| links(&v["healthChecks"])),
            Collection::BackendServices => (Collection::ForwardingRules, |v| {
                v["backendService"].as_str().into_iter().collect()
            }),
            Collection::InstanceGroups => (Collection::BackendServices, |v| {
                v["backends"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|b| b["group"].as_str())
                    .collect()
            }),
            _ => return None,
        };
        self.resources
            .iter()
            .find(|((c, p, _, _), value)| {
                *c == user && p == project && refers(value).into_iter().any(|l| same_link(l, target))
            })
            .map(|(_, value)| value["selfLink"].as_str().unwrap_or_default().to_owned())
    }

    /// A change to an existing resource (`addInstance`, `removeInstance`), applied when its operation is
    /// done.
    pub(crate) fn update(
        &mut self,
        key: Key,
        kind: &str,
        path: &str,
        change: impl FnOnce(&mut Value) -> Result<(), ApiError>,
    ) -> Result<Value, ApiError> {
        let (collection, project, scope, name) = key.clone();
        let Some(existing) = self.resources.get(&key) else {
            return Err(ApiError::not_found(&format!(
                "projects/{project}/{scope}/{}/{name}",
                collection.path()
            )));
        };
        let mut changed = existing.clone();
        change(&mut changed)?;
        let changed = collection
            .normalise(changed)
            .map_err(|e| ApiError::new(400, "invalid", e))?;
        let target = changed["selfLink"].as_str().unwrap_or_default().to_owned();
        Ok(self.operation(&project, &scope, kind, &target, Effect::Put(key, changed), path))
    }
}

/// The strings of a JSON array.
fn links(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// A resource's fingerprint: 12 base64 letters and digits (9 bytes), which read and write back the same
/// in either base64 alphabet.
pub(crate) fn fingerprint(seed: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut n = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..12)
        .map(|_| {
            let c = ALPHABET[(n % 62) as usize];
            n = n / 62 + 0x2545_F491_4F6C_DD1D;
            char::from(c)
        })
        .collect()
}

/// A link's `projects/…` path (links may be full URLs or partial).
fn link_path(link: &str) -> &str {
    link.find("projects/").map_or(link, |at| &link[at..])
}

fn same_link(a: &str, b: &str) -> bool {
    link_path(a) == link_path(b)
}
