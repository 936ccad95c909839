//! Kubernetes Leader Migration (KEP-2436): moving controllers between controller managers of an HA control
//! plane without any controller running in two processes at once.
//!
//! - [`ControllerCatalog`] and [`ControllerName`]: controller names as types, aliases resolved once.
//! - [`MigrationConfig`]: `LeaderMigrationConfiguration` read strictly (v1alpha1, v1beta1, v1; YAML or JSON;
//!   several documents for several migration locks), validated by upstream's rules and the ones upstream
//!   misses, with errors that name file, line and field.
//! - [`Filter`] and [`plan()`]: which lock each controller runs under, for one component.
//! - [`ControllerSelection`] parses `--controllers`.
//! - [`LeaseTimings`]: lease duration, renew deadline and retry period, valid by construction.
//! - [`user_agent`]: the `User-Agent` naming a request's process and controller (the overlap audit,
//!   test tooling in `crates/testing/ccm-audit`, reads it back).
//! - [`rbac`] generates the Roles both managers need for the migration Leases.
//! - [`status`]: where a migration stands, as conditions, from what the cluster shows.
//!
//! Everything in this list is pure: no I/O beyond the bytes it is given, no async runtime.
//!
//! With the `elector` feature (on by default), the part that talks to the API server:
//! - [`elector`]: a Lease elector that interoperates with client-go's `LeaseLock`.
//! - [`scopes`]: the main and migration lock scopes, with upstream's ordering.

mod config;
mod controller_name;
#[cfg(feature = "elector")]
pub mod elector;
mod filter;
mod options;
mod plan;
pub mod rbac;
#[cfg(feature = "elector")]
pub mod scopes;
mod selection;
pub mod status;
mod timings;
pub mod user_agent;

pub use config::{
    ANY_COMPONENT, ApiVersion, CLOUD_CONTROLLER_MANAGER, Component, ConfigError,
    ControllerLeaderConfiguration, DEFAULT_MIGRATION_LEASE, Document, FieldError, FieldErrorKind, GROUP,
    KIND, KUBE_CONTROLLER_MANAGER, LEASES, LeaderMigrationConfiguration, LoadedConfig, MigratedController,
    MigrationConfig, MigrationLock, Problem, Severity, decode, upstream_errors,
};
pub use controller_name::{
    CatalogEntry, CatalogError, ControllerCatalog, ControllerName, RunnableController,
};
pub use filter::{Filter, FilterResult};
pub use options::{
    MigrationOptionsError, ResourceLockError, apply_migration_options, validate_leader_elect_resource_lock,
};
pub use plan::{Placement, PlanInput, Planned, plan};
pub use selection::{ControllerSelection, SelectionError, is_controller_enabled};
pub use timings::{LeaseTimings, MAX_LEASE_DURATION, TimingsError};

#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use crate::{ControllerSelection, MigrationConfig};

    const HEADER: &str =
        "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\n";

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = MigrationConfig::load("fuzz", &bytes, &crate::controller_name::test_catalog());
        }

        #[test]
        fn yaml_like_text_never_panics(body in "([a-zA-Z:*&!|>{}\\[\\],\"' #-]|\n|\t|  ){0,200}") {
            let text = format!("{HEADER}{body}");
            let _ = MigrationConfig::load("fuzz", text.as_bytes(), &crate::controller_name::test_catalog());
        }

        /// `--controllers` values: resolved or refused with the flag named, never a panic.
        #[test]
        fn any_controllers_flag_is_resolved_or_refused(items in proptest::collection::vec(
            prop_oneof!["\\PC{0,30}", "-?[a-z*-]{0,30}", Just("*".to_owned()), Just("-*".to_owned())],
            0..6,
        )) {
            if let Err(error) = ControllerSelection::parse(&items, &crate::controller_name::test_catalog()) {
                prop_assert!(error.to_string().contains("--controllers"), "{}", error);
            }
        }

        #[test]
        fn errors_always_name_the_file(body in "[a-zA-Z:*{}\\[\\] \n-]{0,120}") {
            let text = format!("{HEADER}{body}");
            if let Err(error) = MigrationConfig::load("the-file.yaml", text.as_bytes(), &crate::controller_name::test_catalog()) {
                prop_assert!(!error.problems.is_empty());
                for line in error.to_string().lines().filter(|l| !l.starts_with("  ")) {
                    prop_assert!(line.starts_with("the-file.yaml"), "{line}");
                }
            }
        }
    }
}
