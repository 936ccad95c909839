//! The double's state: resources by project, scope and name, stored as the JSON the model types give, and
//! the operations that change them.

use std::collections::BTreeMap;
use std::time::Duration;

use google_cloud_compute_v1::model;
use serde_json::{Value, json};

use crate::Fault;

/// A kind of resource the double serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Collection {
    /// `zones/Z/instances`.
    Instances,
    /// `global/routes`.
    Routes,
    /// `global/firewalls`.
    Firewalls,
    /// `global/httpHealthChecks`.
    HttpHealthChecks,
    /// `regions/R/targetPools`.
    TargetPools,
    /// `regions/R/forwardingRules`.
    ForwardingRules,
    /// `regions/R/addresses`.
    Addresses,
}

impl Collection {
    /// All of them.
    pub const ALL: [Collection; 7] = [
        Collection::Instances,
        Collection::Routes,
        Collection::Firewalls,
        Collection::HttpHealthChecks,
        Collection::TargetPools,
        Collection::ForwardingRules,
        Collection::Addresses,
    ];

    /// The collection's name in URLs.
    pub fn path(self) -> &'static str {
        match self {
            Collection::Instances => "instances",
            Collection::Routes => "routes",
            Collection::Firewalls => "firewalls",
            Collection::HttpHealthChecks => "httpHealthChecks",
            Collection::TargetPools => "targetPools",
            Collection::ForwardingRules => "forwardingRules",
            Collection::Addresses => "addresses",
        }
    }

    /// The collection named `path`.
    pub fn from_path(path: &str) -> Option<Collection> {
        Collection::ALL.into_iter().find(|c| c.path() == path)
    }

    /// The scope kind its resources live in: `zones`, `regions` or `global`.
    pub fn scope_kind(self) -> &'static str {
        match self {
            Collection::Instances => "zones",
            Collection::Routes | Collection::Firewalls | Collection::HttpHealthChecks => "global",
            Collection::TargetPools | Collection::ForwardingRules | Collection::Addresses => "regions",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Collection::Instances => "compute#instance",
            Collection::Routes => "compute#route",
            Collection::Firewalls => "compute#firewall",
            Collection::HttpHealthChecks => "compute#httpHealthCheck",
            Collection::TargetPools => "compute#targetPool",
            Collection::ForwardingRules => "compute#forwardingRule",
            Collection::Addresses => "compute#address",
        }
    }

    /// `value` read as this collection's model type and written back: unknown shapes are rejected and
    /// what is returned is exactly what the model serialises.
    pub(crate) fn normalise(self, value: Value) -> Result<Value, String> {
        fn through<T: serde::de::DeserializeOwned + serde::Serialize>(value: Value) -> Result<Value, String> {
            let typed: T = serde_json::from_value(value).map_err(|e| e.to_string())?;
            serde_json::to_value(typed).map_err(|e| e.to_string())
        }
        match self {
            Collection::Instances => through::<model::Instance>(value),
            Collection::Routes => through::<model::Route>(value),
            Collection::Firewalls => through::<model::Firewall>(value),
            Collection::HttpHealthChecks => through::<model::HttpHealthCheck>(value),
            Collection::TargetPools => through::<model::TargetPool>(value),
            Collection::ForwardingRules => through::<model::ForwardingRule>(value),
            Collection::Addresses => through::<model::Address>(value),
        }
    }

    /// A list response (`items`, `nextPageToken`), through the model's list type.
    pub(crate) fn list(self, items: Vec<Value>, next: Option<String>, self_link: String) -> Value {
        fn through<T: serde::de::DeserializeOwned + serde::Serialize>(value: Value) -> Value {
            let typed: T = serde_json::from_value(value).expect("a list of model-shaped items");
            serde_json::to_value(typed).expect("a list serialises")
        }
        let kind = format!("{}List", self.kind());
        let value = json!({"kind": kind, "id": self_link, "selfLink": self_link, "items": items, "nextPageToken": next});
        match self {
            Collection::Instances => through::<model::InstanceList>(value),
            Collection::Routes => through::<model::RouteList>(value),
            Collection::Firewalls => through::<model::FirewallList>(value),
            Collection::HttpHealthChecks => through::<model::HttpHealthCheckList>(value),
            Collection::TargetPools => through::<model::TargetPoolList>(value),
            Collection::ForwardingRules => through::<model::ForwardingRuleList>(value),
            Collection::Addresses => through::<model::AddressList>(value),
        }
    }
}

/// `(collection, project, scope, name)`.
pub(crate) type Key = (Collection, String, String, String);

/// A page of `(scope, resource)` and the next page's token.
type Page = (Vec<(String, Value)>, Option<String>);

/// A write waiting for its operation to finish.
#[derive(Debug)]
enum Effect {
    Put(Key, Value),
    Remove(Key),
}

#[derive(Debug)]
struct Operation {
    /// The operation as last reported (model-shaped).
    value: Value,
    polls_left: u32,
    effect: Option<Effect>,
    failure: Option<(u16, String)>,
}

/// An operation failure to inject.
#[derive(Debug, Clone)]
pub(crate) struct OperationFault {
    pub(crate) path_contains: String,
    pub(crate) http_status: u16,
    pub(crate) code: String,
    pub(crate) times: u32,
}

/// An HTTP error answer: status, Compute's reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) reason: String,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    pub(crate) fn not_found(what: &str) -> ApiError {
        ApiError::new(404, "notFound", format!("The resource '{what}' was not found"))
    }

    /// Compute's error body (with the AIP-193 `status` too, which the Rust client reads).
    pub(crate) fn body(&self) -> Value {
        let status = match self.status {
            400 => "INVALID_ARGUMENT",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            409 => "ALREADY_EXISTS",
            429 => "RESOURCE_EXHAUSTED",
            503 => "UNAVAILABLE",
            _ => "INTERNAL",
        };
        json!({"error": {
            "code": self.status,
            "message": self.message,
            "status": status,
            "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
        }})
    }
}

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
}

/// A one-clause list filter.
struct Filter {
    field: String,
    matches: Box<dyn Fn(&str) -> bool + Send>,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filter")
            .field("field", &self.field)
            .finish_non_exhaustive()
    }
}

/// Parses `name eq "RE2"`, `name ne RE2`, `name = "x"`, `name != x` (Compute's own list-filter forms for
/// one field).
fn parse_filter(filter: &str) -> Result<Filter, ApiError> {
    let invalid = || {
        ApiError::new(
            400,
            "invalid",
            format!("Invalid value for field 'filter': '{filter}'."),
        )
    };
    let mut parts = filter.trim().splitn(3, char::is_whitespace);
    let (Some(field), Some(op), Some(literal)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(invalid());
    };
    let literal = literal.trim();
    let literal = literal
        .strip_prefix('"')
        .and_then(|l| l.strip_suffix('"'))
        .or_else(|| literal.strip_prefix('\'').and_then(|l| l.strip_suffix('\'')))
        .unwrap_or(literal)
        .to_owned();
    let matches: Box<dyn Fn(&str) -> bool + Send> = match op {
        "eq" | "ne" => {
            let re = regex::Regex::new(&format!("^(?:{literal})$")).map_err(|_| invalid())?;
            let negate = op == "ne";
            Box::new(move |v| re.is_match(v) != negate)
        }
        "=" => Box::new(move |v| v == literal),
        "!=" => Box::new(move |v| v != literal),
        _ => return Err(invalid()),
    };
    if !field.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(invalid());
    }
    Ok(Filter {
        field: field.to_owned(),
        matches,
    })
}

/// What a list request asks for.
#[derive(Debug, Default)]
pub(crate) struct ListQuery {
    pub(crate) filter: Option<String>,
    pub(crate) max_results: Option<String>,
    pub(crate) page_token: Option<String>,
}

impl ListQuery {
    fn page(&self) -> Result<(usize, usize), ApiError> {
        let max = match &self.max_results {
            None => 500,
            Some(m) => m
                .parse::<usize>()
                .ok()
                .filter(|m| (1..=500).contains(m))
                .ok_or_else(|| {
                    ApiError::new(
                        400,
                        "invalid",
                        format!("Invalid value for field 'maxResults': '{m}'. Must be between 0 and 500."),
                    )
                })?,
        };
        let start = match &self.page_token {
            None => 0,
            Some(t) if t.is_empty() => 0,
            Some(t) => t
                .strip_prefix("page-")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        400,
                        "invalid",
                        format!("Invalid value for field 'pageToken': '{t}'."),
                    )
                })?,
        };
        Ok((start, max))
    }
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
        }
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
        match collection {
            Collection::Instances => {
                object.entry("status").or_insert_with(|| "RUNNING".into());
            }
            Collection::Addresses => {
                object.entry("status").or_insert_with(|| "RESERVED".into());
                if !object.contains_key("address") {
                    let n = id % 250 + 1;
                    object.insert("address".into(), format!("203.0.113.{n}").into());
                }
            }
            Collection::ForwardingRules if !object.contains_key("IPAddress") => {
                let n = id % 250 + 1;
                object.insert("IPAddress".into(), format!("198.51.100.{n}").into());
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
            .map(|v| self.with_warnings(collection, v))
    }

    /// A route whose next-hop instance is gone carries Compute's `NEXT_HOP_INSTANCE_NOT_FOUND` warning.
    fn with_warnings(&self, collection: Collection, mut value: Value) -> Value {
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
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The fault for this request, if one is armed (and spends it).
    pub(crate) fn fault(&mut self, method: &http::Method, path: &str) -> Option<ApiError> {
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

    /// One page of `collection` in `scopes`, filtered.
    fn page(
        &self,
        collection: Collection,
        project: &str,
        scope: Option<&str>,
        query: &ListQuery,
    ) -> Result<Page, ApiError> {
        let filter = query
            .filter
            .as_deref()
            .filter(|f| !f.trim().is_empty())
            .map(parse_filter)
            .transpose()?;
        let (start, max) = query.page()?;
        let matching: Vec<(String, Value)> = self
            .resources
            .iter()
            .filter(|((c, p, s, _), _)| {
                *c == collection && p == project && scope.is_none_or(|scope| scope == s)
            })
            .filter(|(_, v)| {
                filter
                    .as_ref()
                    .is_none_or(|f| (f.matches)(v[&f.field].as_str().unwrap_or_default()))
            })
            .map(|((_, _, s, _), v)| (s.clone(), v.clone()))
            .collect();
        let next = (start + max < matching.len()).then(|| format!("page-{}", start + max));
        Ok((matching.into_iter().skip(start).take(max).collect(), next))
    }

    pub(crate) fn list(
        &self,
        collection: Collection,
        project: &str,
        scope: &str,
        query: &ListQuery,
    ) -> Result<Value, ApiError> {
        let (items, next) = self.page(collection, project, Some(scope), query)?;
        let link = format!(
            "{}/compute/v1/projects/{project}/{scope}/{}",
            self.base,
            collection.path()
        );
        let items = items
            .into_iter()
            .map(|(_, v)| self.with_warnings(collection, v))
            .collect();
        Ok(collection.list(items, next, link))
    }

    /// `aggregated/<collection>`: every zone's or region's resources, keyed `zones/Z` or `regions/R`.
    pub(crate) fn aggregated(
        &self,
        collection: Collection,
        project: &str,
        query: &ListQuery,
    ) -> Result<Value, ApiError> {
        fn through<T: serde::de::DeserializeOwned + serde::Serialize>(value: Value) -> Value {
            let typed: T = serde_json::from_value(value).expect("an aggregated list is model-shaped");
            serde_json::to_value(typed).expect("it serialises")
        }
        let (items, next) = self.page(collection, project, None, query)?;
        let mut scoped: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for (scope, value) in items {
            scoped.entry(scope).or_default().push(value);
        }
        let items: serde_json::Map<String, Value> = scoped
            .into_iter()
            .map(|(scope, resources)| (scope, json!({ collection.path(): resources })))
            .collect();
        let link = format!(
            "{}/compute/v1/projects/{project}/aggregated/{}",
            self.base,
            collection.path()
        );
        let value = json!({"kind": format!("{}AggregatedList", collection.kind()), "id": link, "selfLink": link, "items": items, "nextPageToken": next});
        Ok(match collection {
            Collection::Instances => through::<model::InstanceAggregatedList>(value),
            Collection::TargetPools => through::<model::TargetPoolAggregatedList>(value),
            Collection::ForwardingRules => through::<model::ForwardingRuleAggregatedList>(value),
            Collection::Addresses => through::<model::AddressAggregatedList>(value),
            _ => {
                return Err(ApiError::new(
                    404,
                    "notFound",
                    format!("aggregated/{} is not a collection", collection.path()),
                ));
            }
        })
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
        // As Compute: a health check a target pool uses cannot be deleted.
        if collection == Collection::HttpHealthChecks {
            let user = self.resources.iter().find(|((c, p, _, _), pool)| {
                *c == Collection::TargetPools
                    && p == project
                    && pool["healthChecks"].as_array().is_some_and(|checks| {
                        checks
                            .iter()
                            .any(|h| h.as_str().is_some_and(|h| same_link(h, &target)))
                    })
            });
            if let Some((_, pool)) = user {
                return Err(ApiError::new(
                    400,
                    "resourceInUseByAnotherResource",
                    format!(
                        "The http_health_check resource '{}' is already being used by '{}'",
                        link_path(&target),
                        link_path(pool["selfLink"].as_str().unwrap_or_default())
                    ),
                ));
            }
        }
        Ok(self.operation(project, scope, "delete", &target, Effect::Remove(key), path))
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

    fn operation(
        &mut self,
        project: &str,
        scope: &str,
        kind: &str,
        target: &str,
        effect: Effect,
        path: &str,
    ) -> Value {
        let id = self.id();
        let name = format!("operation-{id}");
        let failure = self
            .operation_faults
            .iter_mut()
            .find(|f| f.times > 0 && path.contains(&f.path_contains))
            .map(|f| {
                f.times -= 1;
                (f.http_status, f.code.clone())
            });
        let mut value = json!({
            "kind": "compute#operation",
            "id": id.to_string(),
            "name": name,
            "operationType": kind,
            "targetLink": target,
            "status": "PENDING",
            "progress": 0,
            "insertTime": "2026-01-01T00:00:00.000-08:00",
            "selfLink": self.self_link(project, scope, "operations", &name),
        });
        match scope.split_once('/') {
            Some(("zones", _)) => value["zone"] = self.scope_link(project, scope).into(),
            Some(("regions", _)) => value["region"] = self.scope_link(project, scope).into(),
            _ => {}
        }
        let mut operation = Operation {
            value,
            polls_left: self.operation_polls,
            effect: Some(effect),
            failure,
        };
        if operation.polls_left == 0 {
            self.complete(&mut operation);
        }
        let answer = operation_value(&operation.value);
        self.operations
            .insert((project.to_owned(), scope.to_owned(), name), operation);
        answer
    }

    fn complete(&mut self, operation: &mut Operation) {
        operation.value["status"] = "DONE".into();
        operation.value["progress"] = 100.into();
        operation.value["endTime"] = "2026-01-01T00:00:01.000-08:00".into();
        let effect = operation.effect.take();
        if let Some((status, code)) = &operation.failure {
            operation.value["httpErrorStatusCode"] = (*status).into();
            operation.value["httpErrorMessage"] = "injected operation failure".into();
            operation.value["error"] =
                json!({"errors": [{"code": code, "message": format!("injected {code}")}]});
            return;
        }
        match effect {
            Some(Effect::Put(key, value)) => {
                self.resources.insert(key, value);
            }
            Some(Effect::Remove(key)) => {
                self.resources.remove(&key);
            }
            None => {}
        }
    }

    /// An operation's state; each `get` (or `wait`) is one poll.
    pub(crate) fn poll(&mut self, project: &str, scope: &str, name: &str) -> Result<Value, ApiError> {
        let key = (project.to_owned(), scope.to_owned(), name.to_owned());
        let Some(mut operation) = self.operations.remove(&key) else {
            return Err(ApiError::not_found(&format!(
                "projects/{project}/{scope}/operations/{name}"
            )));
        };
        if operation.effect.is_some() {
            if operation.polls_left <= 1 {
                self.complete(&mut operation);
            } else {
                operation.polls_left -= 1;
                operation.value["status"] = "RUNNING".into();
                operation.value["progress"] = 50.into();
            }
        }
        let answer = operation_value(&operation.value);
        self.operations.insert(key, operation);
        Ok(answer)
    }
}

/// A link's `projects/…` path (links may be full URLs or partial).
fn link_path(link: &str) -> &str {
    link.find("projects/").map_or(link, |at| &link[at..])
}

fn same_link(a: &str, b: &str) -> bool {
    link_path(a) == link_path(b)
}

/// An operation, through the model type.
fn operation_value(value: &Value) -> Value {
    let typed: model::Operation =
        serde_json::from_value(value.clone()).expect("an operation is model-shaped");
    serde_json::to_value(typed).expect("it serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_of_one_clause() {
        let f = parse_filter("name eq \"(a-1|b-2)\"").unwrap();
        assert!((f.matches)("a-1") && (f.matches)("b-2") && !(f.matches)("a-10"));
        let f = parse_filter("name ne k8s-.*").unwrap();
        assert!(!(f.matches)("k8s-x") && (f.matches)("other"));
        let f = parse_filter("description = 'k8s-node-route'").unwrap();
        assert_eq!(f.field, "description");
        assert!((f.matches)("k8s-node-route") && !(f.matches)("k8s"));
        for bad in ["name", "name eq", "name ~ x", "name eq \"(\"", "a.b = x"] {
            let error = parse_filter(bad).unwrap_err();
            assert_eq!(error.status, 400, "{bad}");
        }
    }
}
