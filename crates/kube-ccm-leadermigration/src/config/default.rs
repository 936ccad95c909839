//! The built-in configuration, used when migration is enabled without `--leader-migration-config`.
//!
//! Upstream has one default shared by both managers: lease `cloud-provider-extraction-migration`, Leases,
//! and three controllers with component `"*"`. Since Kubernetes 1.28 it names two of them
//! `route-controller` and `service-controller`, which match no controller, so only the node-lifecycle
//! controller actually migrates there. This default uses canonical names, so all three do. It lists the
//! binary's controllers that migrate by default (its registry says which): for the framework's built-ins,
//! upstream's three; a provider's own controller that kube-controller-manager ran too is listed as well.

use super::{Component, MigratedController, MigrationConfig, MigrationLock};
use crate::controller_name::ControllerCatalog;

/// Name of the default migration Lease (upstream's).
pub const DEFAULT_MIGRATION_LEASE: &str = "cloud-provider-extraction-migration";

pub(super) fn default_config(catalog: &ControllerCatalog) -> MigrationConfig {
    let controllers = catalog
        .runnable()
        .filter(|entry| entry.migrated_by_default)
        .map(|entry| MigratedController {
            name: entry.name,
            component: Component::Any,
        })
        .collect();
    MigrationConfig {
        locks: vec![MigrationLock {
            lease_name: DEFAULT_MIGRATION_LEASE.to_owned(),
            controllers,
        }],
    }
}

#[cfg(test)]
mod tests {
    use crate::config::MigrationConfig;
    use crate::controller_name::test_catalog;

    #[test]
    fn default_round_trips_through_yaml_and_json() {
        let catalog = test_catalog();
        let default = MigrationConfig::default_config(&catalog);
        let yaml = default.to_yaml();
        assert_eq!(
            yaml,
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: cloud-provider-extraction-migration\ncontrollerLeaders:\n  - name: cloud-node-lifecycle-controller\n    component: \"*\"\n  - name: service-lb-controller\n    component: \"*\"\n  - name: node-route-controller\n    component: \"*\"\n"
        );
        let loaded = MigrationConfig::load("default.yaml", yaml.as_bytes(), &catalog).unwrap();
        assert_eq!(loaded.config, default);
        assert!(loaded.warnings.is_empty());
        let json = serde_json::to_vec(&default.to_json()).unwrap();
        let loaded = MigrationConfig::load("default.json", &json, &catalog).unwrap();
        assert_eq!(loaded.config, default);
    }
}
