//! `LeaderMigrationConfiguration`: the API types, reading, validation and the default.
//!
//! Reading goes bytes → [`Document`]s (one per YAML document, strict, with line numbers) →
//! [`MigrationConfig`] (validated, names resolved to canonical ones). Upstream's validation is kept
//! separately in [`upstream_errors`] so its exact behaviour stays testable next to ours.

mod decode;
mod default;
mod errors;
mod validate;

use std::fmt;

pub use self::decode::{Document, decode};
pub use self::default::DEFAULT_MIGRATION_LEASE;
pub use self::errors::{ConfigError, FieldError, FieldErrorKind, Problem, Severity};
pub use self::validate::upstream_errors;

use crate::controller_name::{ControllerCatalog, ControllerName};

/// API group of the configuration.
pub const GROUP: &str = "controllermanager.config.k8s.io";
/// The only kind in that group.
pub const KIND: &str = "LeaderMigrationConfiguration";
/// `resourceLock` value for Lease locks, the only kind client-go still has.
pub const LEASES: &str = "leases";
/// The wildcard component.
pub const ANY_COMPONENT: &str = "*";
/// Component name of kube-controller-manager.
pub const KUBE_CONTROLLER_MANAGER: &str = "kube-controller-manager";
/// Component name of cloud-controller-manager.
pub const CLOUD_CONTROLLER_MANAGER: &str = "cloud-controller-manager";

/// Versions of the configuration API that can be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVersion {
    /// `controllermanager.config.k8s.io/v1alpha1` (Kubernetes 1.21).
    V1Alpha1,
    /// `controllermanager.config.k8s.io/v1beta1` (1.22).
    V1Beta1,
    /// `controllermanager.config.k8s.io/v1` (1.24): no `resourceLock`, always Leases.
    V1,
}

impl ApiVersion {
    /// Every readable version, oldest first.
    pub const ALL: [ApiVersion; 3] = [ApiVersion::V1Alpha1, ApiVersion::V1Beta1, ApiVersion::V1];

    /// The full `apiVersion` string.
    pub const fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1Alpha1 => "controllermanager.config.k8s.io/v1alpha1",
            ApiVersion::V1Beta1 => "controllermanager.config.k8s.io/v1beta1",
            ApiVersion::V1 => "controllermanager.config.k8s.io/v1",
        }
    }

    fn parse(api_version: &str) -> Option<ApiVersion> {
        ApiVersion::ALL.into_iter().find(|v| v.as_str() == api_version)
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The internal (version-independent) form of one document, as upstream's internal type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderMigrationConfiguration {
    /// Name of the migration Lease.
    pub leader_name: String,
    /// `leases` (or, in old documents, `endpoints`). Always `leases` for v1.
    pub resource_lock: String,
    /// Which component runs each migrated controller.
    pub controller_leaders: Vec<ControllerLeaderConfiguration>,
}

/// One `controllerLeaders` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerLeaderConfiguration {
    /// Controller name, canonical or alias.
    pub name: String,
    /// Component that runs it, or `*` for whichever participates.
    pub component: String,
}

impl ControllerLeaderConfiguration {
    /// Shorthand for tests and defaults.
    pub fn new(name: &str, component: &str) -> Self {
        ControllerLeaderConfiguration {
            name: name.to_owned(),
            component: component.to_owned(),
        }
    }
}

/// Which component a migrated controller belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Component {
    /// `*`: any component that reads this configuration.
    Any,
    /// One component, e.g. `cloud-controller-manager`.
    Named(String),
}

impl Component {
    fn parse(component: &str) -> Component {
        if component == ANY_COMPONENT {
            Component::Any
        } else {
            Component::Named(component.to_owned())
        }
    }

    /// The string as written in a configuration.
    pub fn as_str(&self) -> &str {
        match self {
            Component::Any => ANY_COMPONENT,
            Component::Named(name) => name,
        }
    }

    /// Whether this component selector includes `component`.
    pub fn includes(&self, component: &str) -> bool {
        match self {
            Component::Any => true,
            Component::Named(name) => name == component,
        }
    }
}

/// A migrated controller and the component that runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigratedController {
    /// Canonical name.
    pub name: ControllerName,
    /// Owning component.
    pub component: Component,
}

/// One migration lock: a Lease and the controllers that run under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationLock {
    /// Name of the Lease.
    pub lease_name: String,
    /// The controllers it governs, in file order.
    pub controllers: Vec<MigratedController>,
}

/// A validated leader-migration configuration: one or more migration locks, with canonical names, unique
/// lease names and no controller in two locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationConfig {
    locks: Vec<MigrationLock>,
}

/// A configuration read from a file, with the warnings worth showing.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The validated configuration.
    pub config: MigrationConfig,
    /// Things that are allowed but probably wrong (for example an unknown component name).
    pub warnings: Vec<Problem>,
}

impl MigrationConfig {
    /// The built-in default for a binary with this catalog: its controllers that migrate by default,
    /// with component `*` (see `default` in the source for how it differs from upstream's).
    pub fn default_config(catalog: &ControllerCatalog) -> MigrationConfig {
        default::default_config(catalog)
    }

    /// A configuration of these locks, as given (used by tests and generators; not validated).
    pub fn from_locks(locks: Vec<MigrationLock>) -> MigrationConfig {
        MigrationConfig { locks }
    }

    /// Reads and validates a configuration file's bytes. `source_name` names the file in errors.
    pub fn load(
        source_name: &str,
        bytes: &[u8],
        catalog: &ControllerCatalog,
    ) -> Result<LoadedConfig, ConfigError> {
        let documents = decode(bytes).map_err(|problems| ConfigError::new(source_name, problems))?;
        validate::validate_documents(&documents, catalog)
            .map_err(|problems| ConfigError::new(source_name, problems))
    }

    /// The migration locks, in file order.
    pub fn locks(&self) -> &[MigrationLock] {
        &self.locks
    }

    /// The lock that governs `controller`, with the entry that names it.
    pub fn lock_for(&self, controller: ControllerName) -> Option<(&MigrationLock, &MigratedController)> {
        self.locks.iter().find_map(|lock| {
            lock.controllers
                .iter()
                .find(|c| c.name == controller)
                .map(|c| (lock, c))
        })
    }

    /// The configuration as v1 documents.
    pub fn to_documents(&self) -> Vec<LeaderMigrationConfiguration> {
        self.locks
            .iter()
            .map(|lock| LeaderMigrationConfiguration {
                leader_name: lock.lease_name.clone(),
                resource_lock: LEASES.to_owned(),
                controller_leaders: lock
                    .controllers
                    .iter()
                    .map(|c| ControllerLeaderConfiguration::new(c.name.as_str(), c.component.as_str()))
                    .collect(),
            })
            .collect()
    }

    /// The configuration as a YAML stream of v1 documents that [`MigrationConfig::load`] reads back.
    pub fn to_yaml(&self) -> String {
        let mut out = String::new();
        for (index, lock) in self.locks.iter().enumerate() {
            if index > 0 {
                out.push_str("---\n");
            }
            out.push_str(&format!("apiVersion: {}\nkind: {KIND}\n", ApiVersion::V1));
            out.push_str(&format!("leaderName: {}\n", yaml_string(&lock.lease_name)));
            if lock.controllers.is_empty() {
                out.push_str("controllerLeaders: []\n");
                continue;
            }
            out.push_str("controllerLeaders:\n");
            for controller in &lock.controllers {
                out.push_str(&format!(
                    "  - name: {}\n    component: {}\n",
                    yaml_string(controller.name.as_str()),
                    yaml_string(controller.component.as_str())
                ));
            }
        }
        out
    }

    /// The configuration as JSON: one v1 object per lock, in an array when there are several.
    pub fn to_json(&self) -> serde_json::Value {
        let documents: Vec<serde_json::Value> = self
            .locks
            .iter()
            .map(|lock| {
                serde_json::json!({
                    "apiVersion": ApiVersion::V1.as_str(),
                    "kind": KIND,
                    "leaderName": lock.lease_name,
                    "controllerLeaders": lock.controllers.iter().map(|c| serde_json::json!({
                        "name": c.name.as_str(),
                        "component": c.component.as_str(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        match <[serde_json::Value; 1]>::try_from(documents) {
            Ok([single]) => single,
            Err(many) => serde_json::Value::Array(many),
        }
    }
}

/// Writes a string as YAML: plain when that reads back as the same string, double-quoted otherwise.
fn yaml_string(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && value.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && !matches!(
            value,
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        );
    if plain {
        value.to_owned()
    } else {
        serde_json::Value::from(value).to_string()
    }
}
