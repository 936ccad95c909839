//! Where each controller of a binary runs, for one component: the model behind `leader-migration plan`
//! and the controller manager's start-up.

use crate::config::MigrationConfig;
use crate::controller_name::{ControllerCatalog, ControllerName};
use crate::filter::{Filter, FilterResult};
use crate::selection::ControllerSelection;

/// Where a controller runs for one component: each case carries exactly what it needs, so a lock, its
/// Lease and an owner cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Under the component's main leader-election lock.
    Main {
        /// The main Lease (`--leader-elect-resource-name`).
        lease: String,
    },
    /// Under a migration lock.
    Migration {
        /// The migration Lease.
        lease: String,
    },
    /// Nowhere in this component: another component owns it.
    Elsewhere {
        /// The component that runs it.
        owner: String,
    },
    /// Nowhere: `--controllers` turns it off.
    Disabled,
}

impl Placement {
    /// The lock's name in `plan` output: `main`, `migration`, `none` or `disabled`.
    pub const fn lock_name(&self) -> &'static str {
        match self {
            Placement::Main { .. } => "main",
            Placement::Migration { .. } => "migration",
            Placement::Elsewhere { .. } => "none",
            Placement::Disabled => "disabled",
        }
    }

    /// The Lease it runs under, when it runs here.
    pub fn lease(&self) -> Option<&str> {
        match self {
            Placement::Main { lease } | Placement::Migration { lease } => Some(lease),
            Placement::Elsewhere { .. } | Placement::Disabled => None,
        }
    }

    /// The component that runs it instead, when another does.
    pub fn owner(&self) -> Option<&str> {
        match self {
            Placement::Elsewhere { owner } => Some(owner),
            _ => None,
        }
    }
}

/// One controller's placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// Canonical name.
    pub controller: ControllerName,
    /// Where it runs.
    pub placement: Placement,
}

/// What a placement depends on.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// This manager's component name, e.g. `cloud-controller-manager`.
    pub component: &'a str,
    /// Name of the main Lease (`--leader-elect-resource-name`).
    pub main_lease: &'a str,
    /// The migration configuration, or `None` when leader migration is off.
    pub migration: Option<&'a MigrationConfig>,
    /// `--controllers`.
    pub selection: &'a ControllerSelection,
    /// Every controller name the binary knows.
    pub catalog: &'a ControllerCatalog,
}

/// Places every controller the binary can run, in start order.
///
/// As upstream, the filter is applied first and `--controllers` second: a controller another component owns
/// is `Elsewhere` whatever `--controllers` says.
pub fn plan(input: PlanInput<'_>) -> Vec<Planned> {
    let filter = input
        .migration
        .map(|config| Filter::for_config(config, input.component, input.catalog));
    input
        .catalog
        .runnable()
        .map(|entry| {
            let result = filter
                .as_ref()
                .map_or(FilterResult::NonMigrated, |f| f.classify(entry.name.as_str()));
            let enabled = input.selection.is_enabled(entry);
            let placement = match result {
                FilterResult::Unowned { owner } => Placement::Elsewhere { owner },
                _ if !enabled => Placement::Disabled,
                FilterResult::NonMigrated => Placement::Main {
                    lease: input.main_lease.to_owned(),
                },
                FilterResult::Migrated { lease } => Placement::Migration { lease },
            };
            Planned {
                controller: entry.name,
                placement,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MigrationConfig;

    #[track_caller]
    fn check(
        component: &str,
        config_yaml: Option<&str>,
        controllers: &[&str],
        expected: &[(&str, &str, Option<&str>)],
    ) {
        let catalog = crate::controller_name::test_catalog();
        let config = config_yaml.map(|yaml| {
            MigrationConfig::load("t", yaml.as_bytes(), &catalog)
                .unwrap()
                .config
        });
        let selection = ControllerSelection::parse(controllers, &catalog).unwrap();
        let placements = plan(PlanInput {
            component,
            main_lease: component,
            migration: config.as_ref(),
            selection: &selection,
            catalog: &catalog,
        });
        let actual: Vec<(&str, &str, Option<&str>)> = placements
            .iter()
            .map(|p| {
                (
                    p.controller.as_str(),
                    p.placement.lock_name(),
                    p.placement.lease().or(p.placement.owner()),
                )
            })
            .collect();
        assert_eq!(actual, expected);
    }

    const TO_CCM: &str = "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: m\ncontrollerLeaders:\n  - {name: route, component: cloud-controller-manager}\n  - {name: service, component: cloud-controller-manager}\n  - {name: cloud-node-lifecycle, component: cloud-controller-manager}\n";

    #[test]
    fn migrated_controllers_run_under_the_migration_lease_in_their_owner() {
        check(
            "cloud-controller-manager",
            Some(TO_CCM),
            &["*"],
            &[
                ("cloud-node-controller", "main", Some("cloud-controller-manager")),
                ("cloud-node-lifecycle-controller", "migration", Some("m")),
                ("service-lb-controller", "migration", Some("m")),
                ("node-route-controller", "migration", Some("m")),
            ],
        );
    }

    #[test]
    fn other_components_see_them_as_owned_elsewhere_even_when_disabled() {
        check(
            "kube-controller-manager",
            Some(TO_CCM),
            &["*", "-route"],
            &[
                ("cloud-node-controller", "main", Some("kube-controller-manager")),
                (
                    "cloud-node-lifecycle-controller",
                    "none",
                    Some("cloud-controller-manager"),
                ),
                ("service-lb-controller", "none", Some("cloud-controller-manager")),
                ("node-route-controller", "none", Some("cloud-controller-manager")),
            ],
        );
    }

    #[test]
    fn without_migration_everything_enabled_runs_under_the_main_lock() {
        check(
            "cloud-controller-manager",
            None,
            &["*", "-service"],
            &[
                ("cloud-node-controller", "main", Some("cloud-controller-manager")),
                (
                    "cloud-node-lifecycle-controller",
                    "main",
                    Some("cloud-controller-manager"),
                ),
                ("service-lb-controller", "disabled", None),
                ("node-route-controller", "main", Some("cloud-controller-manager")),
            ],
        );
    }
}
