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

    pub(super) fn kind(self) -> &'static str {
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
