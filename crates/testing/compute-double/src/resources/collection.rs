//! The kinds of resource the double serves, and their model types.

use google_cloud_compute_v1::model;
use serde_json::{Value, json};

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
    /// `global/healthChecks`.
    HealthChecks,
    /// `regions/R/backendServices`.
    BackendServices,
    /// `zones/Z/instanceGroups` (unmanaged); their members are kept in `MEMBERS`, never shown.
    InstanceGroups,
    /// `regions/R/subnetworks`: seeded by the test ([`crate::ComputeDouble::put`]), read only.
    Subnetworks,
}

/// The field of an instance group's stored JSON that holds its members' links (the model keeps unknown
/// fields; answers leave it out).
pub(crate) const MEMBERS: &str = "doubleMembers";

impl Collection {
    /// All of them.
    pub const ALL: [Collection; 11] = [
        Collection::Instances,
        Collection::Routes,
        Collection::Firewalls,
        Collection::HttpHealthChecks,
        Collection::TargetPools,
        Collection::ForwardingRules,
        Collection::Addresses,
        Collection::HealthChecks,
        Collection::BackendServices,
        Collection::InstanceGroups,
        Collection::Subnetworks,
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
            Collection::HealthChecks => "healthChecks",
            Collection::BackendServices => "backendServices",
            Collection::InstanceGroups => "instanceGroups",
            Collection::Subnetworks => "subnetworks",
        }
    }

    /// The collection named `path`.
    pub fn from_path(path: &str) -> Option<Collection> {
        Collection::ALL.into_iter().find(|c| c.path() == path)
    }

    /// Its name in Compute's "in use" messages (`http_health_check`).
    pub(crate) fn singular(self) -> &'static str {
        match self {
            Collection::Instances => "instance",
            Collection::Routes => "route",
            Collection::Firewalls => "firewall",
            Collection::HttpHealthChecks => "http_health_check",
            Collection::TargetPools => "target_pool",
            Collection::ForwardingRules => "forwarding_rule",
            Collection::Addresses => "address",
            Collection::HealthChecks => "health_check",
            Collection::BackendServices => "backend_service",
            Collection::InstanceGroups => "instance_group",
            Collection::Subnetworks => "subnetwork",
        }
    }

    /// Whether its resources come only from the test (no `insert` or `delete` is served).
    pub(crate) fn seeded_only(self) -> bool {
        matches!(self, Collection::Instances | Collection::Subnetworks)
    }

    /// The scope kind its resources live in: `zones`, `regions` or `global`.
    pub fn scope_kind(self) -> &'static str {
        match self {
            Collection::Instances | Collection::InstanceGroups => "zones",
            Collection::Routes
            | Collection::Firewalls
            | Collection::HttpHealthChecks
            | Collection::HealthChecks => "global",
            Collection::TargetPools
            | Collection::ForwardingRules
            | Collection::Addresses
            | Collection::BackendServices
            | Collection::Subnetworks => "regions",
        }
    }

    pub(super) fn kind(self) -> &'static str {
        match self {
            Collection::Instances => "compute#instance",
            Collection::Routes => "compute#route",
            Collection::Firewalls => "compute#firewall",
            Collection::HttpHealthChecks => "compute#httpHealthCheck",
            Collection::TargetPools => "compute#targetPool",
            Collection::ForwardingRules => "compute#forwardingRule",
            Collection::Addresses => "compute#address",
            Collection::HealthChecks => "compute#healthCheck",
            Collection::BackendServices => "compute#backendService",
            Collection::InstanceGroups => "compute#instanceGroup",
            Collection::Subnetworks => "compute#subnetwork",
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
            Collection::HealthChecks => through::<model::HealthCheck>(value),
            Collection::BackendServices => through::<model::BackendService>(value),
            Collection::InstanceGroups => through::<model::InstanceGroup>(value),
            Collection::Subnetworks => through::<model::Subnetwork>(value),
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
            Collection::HealthChecks => through::<model::HealthCheckList>(value),
            Collection::BackendServices => through::<model::BackendServiceList>(value),
            Collection::InstanceGroups => through::<model::InstanceGroupList>(value),
            Collection::Subnetworks => through::<model::SubnetworkList>(value),
        }
    }
}
