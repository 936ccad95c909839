//! `--enable-leader-migration` and `--leader-migration-config`, as upstream's `LeaderMigrationOptions.ApplyTo`.
//!
//! Disabled: the file is not read, whatever the path (upstream). Enabled without a file: the default
//! configuration. Enabled with a file: read, decoded and validated; any problem is an error. Whether
//! migration is then *used* also needs `--leader-elect` (upstream's `leadermigration.Enabled`); the caller
//! decides that, after this has validated the file either way.

use std::path::Path;

use crate::config::{ConfigError, LoadedConfig, MigrationConfig};
use crate::controller_name::ControllerCatalog;

/// Why the leader-migration flags cannot be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationOptionsError {
    /// The file named by `--leader-migration-config` cannot be read.
    #[error("--leader-migration-config: cannot read {path}: {source}")]
    Read {
        /// The path as given.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid configuration.
    #[error("--leader-migration-config: {0}")]
    Invalid(#[from] ConfigError),
}

/// `--leader-elect-resource-lock` names a lock kind other than Leases while leader election is on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--leader-elect-resource-lock: resourceLock value must be \"leases\", not {value:?} (client-go has no other lock kinds)"
)]
pub struct ResourceLockError {
    /// The value given.
    pub value: String,
}

/// Upstream's leader-election option check: with `--leader-elect`, the lock must be `leases`.
pub fn validate_leader_elect_resource_lock(
    leader_elect: bool,
    resource_lock: &str,
) -> Result<(), ResourceLockError> {
    if leader_elect && resource_lock != crate::config::LEASES {
        return Err(ResourceLockError {
            value: resource_lock.to_owned(),
        });
    }
    Ok(())
}

/// Applies the two flags. `read` is only called when migration is enabled and a path is given.
pub fn apply_migration_options(
    enabled: bool,
    config_path: Option<&Path>,
    read: impl FnOnce(&Path) -> std::io::Result<Vec<u8>>,
    catalog: &ControllerCatalog,
) -> Result<Option<LoadedConfig>, MigrationOptionsError> {
    if !enabled {
        return Ok(None);
    }
    let Some(path) = config_path.filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(Some(LoadedConfig {
            config: MigrationConfig::default_config(catalog),
            warnings: Vec::new(),
        }));
    };
    let name = path.display().to_string();
    let bytes = read(path).map_err(|source| MigrationOptionsError::Read {
        path: name.clone(),
        source,
    })?;
    Ok(Some(MigrationConfig::load(&name, &bytes, catalog)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Component, MigratedController, MigrationLock};
    use crate::controller_name::test_catalog;

    const V1ALPHA1: &str =
        "apiVersion: controllermanager.config.k8s.io/v1alpha1\nkind: LeaderMigrationConfiguration\n";
    const V1BETA1: &str =
        "apiVersion: controllermanager.config.k8s.io/v1beta1\nkind: LeaderMigrationConfiguration\n";
    const V1: &str = "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\n";

    /// Applies `--enable-leader-migration` with `content` as the file (none: no `--leader-migration-config`).
    fn apply(content: Option<&str>) -> Result<Option<MigrationConfig>, MigrationOptionsError> {
        let path = content.map(|_| Path::new("/etc/leadermigration.conf"));
        let read = |_: &Path| Ok(content.unwrap_or_default().as_bytes().to_vec());
        Ok(
            apply_migration_options(true, path, read, &crate::controller_name::test_catalog())?
                .map(|loaded| loaded.config),
        )
    }

    #[track_caller]
    fn check(content: Option<&str>, expected: MigrationConfig) {
        assert_eq!(apply(content).unwrap(), Some(expected));
    }

    fn expected(lease: &str, controllers: &[(&str, &str)]) -> MigrationConfig {
        let controllers = controllers
            .iter()
            .map(|&(controller, component)| MigratedController {
                name: test_catalog().resolve(controller).unwrap().name,
                component: if component == "*" {
                    Component::Any
                } else {
                    Component::Named(component.into())
                },
            })
            .collect();
        MigrationConfig::from_locks(vec![MigrationLock {
            lease_name: lease.to_owned(),
            controllers,
        }])
    }

    #[test]
    fn a9_resource_lock_must_be_leases_when_electing() {
        let error = validate_leader_elect_resource_lock(true, "configmapsleases").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("resourceLock value must be \"leases\""),
            "{error}"
        );
        assert_eq!(validate_leader_elect_resource_lock(true, "leases"), Ok(()));
        assert_eq!(validate_leader_elect_resource_lock(false, "endpoints"), Ok(()));
    }

    // Upstream TestLeaderMigrationOptions (reference §8.3).

    #[test]
    fn o1_enabled_without_file_is_the_default() {
        check(None, MigrationConfig::default_config(&test_catalog()));
    }

    #[test]
    fn o2_o3_o4_each_version() {
        let body = "leaderName: test-leader-migration\ncontrollerLeaders: []\n";
        check(
            Some(&format!("{V1ALPHA1}{body}resourceLock: leases\n")),
            expected("test-leader-migration", &[]),
        );
        check(
            Some(&format!("{V1BETA1}{body}resourceLock: leases\n")),
            expected("test-leader-migration", &[]),
        );
        check(
            Some(&format!("{V1}{body}")),
            expected("test-leader-migration", &[]),
        );
    }

    #[test]
    fn o5_wildcard_leaders() {
        let content = format!(
            "{V1}leaderName: test-leader-migration\ncontrollerLeaders:\n  - name: route-controller\n    component: \"*\"\n  - name: service-controller\n    component: \"*\"\n  - name: cloud-node-lifecycle-controller\n    component: \"*\"\n  - name: node-ipam-controller\n    component: \"*\"\n"
        );
        check(
            Some(&content),
            expected(
                "test-leader-migration",
                &[
                    ("node-route-controller", "*"),
                    ("service-lb-controller", "*"),
                    ("cloud-node-lifecycle-controller", "*"),
                    ("node-ipam-controller", "*"),
                ],
            ),
        );
    }

    #[test]
    fn o6_named_components() {
        let ccm = "cloud-controller-manager";
        let content = format!(
            "{V1}leaderName: test-leader-migration\ncontrollerLeaders:\n  - name: route-controller\n    component: {ccm}\n  - name: service-controller\n    component: {ccm}\n  - name: cloud-node-lifecycle-controller\n    component: {ccm}\n  - name: node-ipam-controller\n    component: kube-controller-manager\n"
        );
        check(
            Some(&content),
            expected(
                "test-leader-migration",
                &[
                    ("node-route-controller", ccm),
                    ("service-lb-controller", ccm),
                    ("cloud-node-lifecycle-controller", ccm),
                    ("node-ipam-controller", "kube-controller-manager"),
                ],
            ),
        );
    }

    #[test]
    fn d6_disabled_never_reads_the_file() {
        let read = |_: &Path| -> std::io::Result<Vec<u8>> { panic!("the file must not be read") };
        let result = apply_migration_options(
            false,
            Some(Path::new("/nonexistent")),
            read,
            &crate::controller_name::test_catalog(),
        );
        assert!(matches!(result, Ok(None)));
    }

    #[test]
    fn d7_invalid_file_is_an_error_naming_the_flag_and_file() {
        let error = apply(Some(&format!("{V1}leaderName: \"\"\n"))).unwrap_err();
        assert_eq!(
            error.to_string(),
            "--leader-migration-config: /etc/leadermigration.conf:3: leaderName: Required value: leaderName must be set for LeaderMigrationConfiguration"
        );
    }

    #[test]
    fn unreadable_file_names_the_flag() {
        let read = |_: &Path| {
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "No such file or directory",
            ))
        };
        let error = apply_migration_options(
            true,
            Some(Path::new("/x")),
            read,
            &crate::controller_name::test_catalog(),
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "--leader-migration-config: cannot read /x: No such file or directory"
        );
    }
}
