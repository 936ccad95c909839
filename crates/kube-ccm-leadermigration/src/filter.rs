//! Which lock, if any, a controller runs under in one component.

use std::collections::HashMap;

use crate::config::{ANY_COMPONENT, LeaderMigrationConfiguration, MigrationConfig};
use crate::controller_name::ControllerCatalog;

/// Where a controller runs, for one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterResult {
    /// Under the migration lock held on this Lease.
    Migrated {
        /// Name of the migration Lease.
        lease: String,
    },
    /// Under the component's main lock: not part of any migration.
    NonMigrated,
    /// Not here: the configuration gives it to another component.
    Unowned {
        /// The component that runs it.
        owner: String,
    },
}

/// Classifies controller names for one component, as upstream's `LeaderMigrator.FilterFunc`, except that
/// names are compared after alias resolution.
#[derive(Debug, Clone)]
pub struct Filter {
    /// Canonical (or, when unknown, literal) name → (lease, owning component).
    entries: HashMap<String, (String, String)>,
    component: String,
    catalog: ControllerCatalog,
}

impl Filter {
    /// A filter over unvalidated documents, with upstream's semantics: a later entry for the same
    /// controller overwrites an earlier one; `*` is special only as a component.
    pub fn new(
        documents: &[LeaderMigrationConfiguration],
        component: &str,
        catalog: &ControllerCatalog,
    ) -> Filter {
        let mut entries = HashMap::new();
        for document in documents {
            for leader in &document.controller_leaders {
                let name = canonical(&leader.name, catalog);
                entries.insert(name, (document.leader_name.clone(), leader.component.clone()));
            }
        }
        Filter {
            entries,
            component: component.to_owned(),
            catalog: catalog.clone(),
        }
    }

    /// A filter over a validated configuration.
    pub fn for_config(config: &MigrationConfig, component: &str, catalog: &ControllerCatalog) -> Filter {
        Filter::new(&config.to_documents(), component, catalog)
    }

    /// The component this filter classifies for.
    pub fn component(&self) -> &str {
        &self.component
    }

    /// Where `controller` (canonical name or alias) runs for this component.
    pub fn classify(&self, controller: &str) -> FilterResult {
        match self.entries.get(&canonical(controller, &self.catalog)) {
            None => FilterResult::NonMigrated,
            Some((lease, owner)) if owner == &self.component || owner == ANY_COMPONENT => {
                FilterResult::Migrated { lease: lease.clone() }
            }
            Some((_, owner)) => FilterResult::Unowned { owner: owner.clone() },
        }
    }
}

fn canonical(name: &str, catalog: &ControllerCatalog) -> String {
    catalog
        .resolve(name)
        .map_or(name, |entry| entry.name.as_str())
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ControllerLeaderConfiguration;

    const KCM: &str = "kube-controller-manager";
    const CCM: &str = "cloud-controller-manager";

    fn fixture(component: &str) -> Vec<LeaderMigrationConfiguration> {
        vec![LeaderMigrationConfiguration {
            leader_name: "cloud-provider-extraction-migration".into(),
            resource_lock: "leases".into(),
            controller_leaders: [
                "route-controller",
                "service-controller",
                "cloud-node-lifecycle-controller",
            ]
            .into_iter()
            .map(|name| ControllerLeaderConfiguration::new(name, component))
            .collect(),
        }]
    }

    const M: &str = "M";
    const N: &str = "N";
    const U: &str = "U";

    /// One row of upstream's TestLeaderMigratorFilterFunc: (controller, expected) pairs.
    #[track_caller]
    fn check(config_component: &str, component: &str, expectations: &[(&str, &str)]) {
        let filter = Filter::new(
            &fixture(config_component),
            component,
            &crate::controller_name::test_catalog(),
        );
        for &(controller, expected) in expectations {
            let actual = match filter.classify(controller) {
                FilterResult::Migrated { lease } => {
                    assert_eq!(lease, "cloud-provider-extraction-migration");
                    M
                }
                FilterResult::NonMigrated => N,
                FilterResult::Unowned { owner } => {
                    assert_eq!(owner, config_component);
                    U
                }
            };
            assert_eq!(
                actual, expected,
                "{controller} in {component} with {config_component} config"
            );
        }
    }

    // Upstream TestLeaderMigratorFilterFunc (reference §8.4).
    const CLOUD: [&str; 3] = [
        "route-controller",
        "service-controller",
        "cloud-node-lifecycle-controller",
    ];

    #[test]
    fn f1_from_config_in_kcm() {
        check(
            KCM,
            KCM,
            &[
                ("deployment-controller", N),
                (CLOUD[0], M),
                (CLOUD[1], M),
                (CLOUD[2], M),
            ],
        );
    }

    #[test]
    fn f2_from_config_in_ccm() {
        check(
            KCM,
            CCM,
            &[("cloud-node", N), (CLOUD[0], U), (CLOUD[1], U), (CLOUD[2], U)],
        );
    }

    #[test]
    fn f3_to_config_in_kcm() {
        check(
            CCM,
            KCM,
            &[
                ("deployment-controller", N),
                (CLOUD[0], U),
                (CLOUD[1], U),
                (CLOUD[2], U),
            ],
        );
    }

    #[test]
    fn f4_to_config_in_ccm() {
        check(
            CCM,
            CCM,
            &[
                ("cloud-node-controller", N),
                (CLOUD[0], M),
                (CLOUD[1], M),
                (CLOUD[2], M),
            ],
        );
    }

    #[test]
    fn f5_wildcard_in_kcm() {
        check(
            "*",
            KCM,
            &[
                ("deployment-controller", N),
                (CLOUD[0], M),
                (CLOUD[1], M),
                (CLOUD[2], M),
            ],
        );
    }

    #[test]
    fn f6_wildcard_in_ccm() {
        check(
            "*",
            CCM,
            &[
                ("cloud-node-controller", N),
                (CLOUD[0], M),
                (CLOUD[1], M),
                (CLOUD[2], M),
            ],
        );
    }

    #[test]
    fn aliases_match_in_both_directions() {
        // The stale names in the config match the canonical names the manager asks about, and the reverse.
        check(
            CCM,
            CCM,
            &[
                ("node-route-controller", M),
                ("service-lb-controller", M),
                ("route", M),
                ("service", M),
            ],
        );
    }

    #[test]
    fn d5_later_entries_win() {
        let documents = vec![LeaderMigrationConfiguration {
            leader_name: "l".into(),
            resource_lock: "leases".into(),
            controller_leaders: vec![
                ControllerLeaderConfiguration::new("a", KCM),
                ControllerLeaderConfiguration::new("a", CCM),
            ],
        }];
        let catalog = crate::controller_name::test_catalog();
        assert_eq!(
            Filter::new(&documents, CCM, &catalog).classify("a"),
            FilterResult::Migrated { lease: "l".into() }
        );
        assert_eq!(
            Filter::new(&documents, KCM, &catalog).classify("a"),
            FilterResult::Unowned { owner: CCM.into() }
        );
    }

    #[test]
    fn d11_wildcard_name_matches_nothing_real() {
        let documents = vec![LeaderMigrationConfiguration {
            leader_name: "l".into(),
            resource_lock: "leases".into(),
            controller_leaders: vec![ControllerLeaderConfiguration::new("*", "*")],
        }];
        let filter = Filter::new(&documents, CCM, &crate::controller_name::test_catalog());
        assert_eq!(
            filter.classify("service-lb-controller"),
            FilterResult::NonMigrated
        );
    }

    #[test]
    fn several_locks_report_their_own_lease() {
        let mut documents = fixture(CCM);
        documents[0].controller_leaders.truncate(1);
        documents.push(LeaderMigrationConfiguration {
            leader_name: "second".into(),
            resource_lock: "leases".into(),
            controller_leaders: vec![ControllerLeaderConfiguration::new("service", CCM)],
        });
        let filter = Filter::new(&documents, CCM, &crate::controller_name::test_catalog());
        assert_eq!(
            filter.classify("service-lb-controller"),
            FilterResult::Migrated {
                lease: "second".into()
            }
        );
        assert_eq!(
            filter.classify("route"),
            FilterResult::Migrated {
                lease: "cloud-provider-extraction-migration".into()
            }
        );
    }
}
