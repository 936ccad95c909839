//! Controller names as types.
//!
//! Upstream keeps controller names as strings and resolves aliases only for `--controllers`. Its default
//! migration configuration has named `route-controller` and `service-controller` since 1.28 while the
//! controllers are called `node-route-controller` and `service-lb-controller`, so those two never migrate.
//! Here a name is resolved once, through a [`ControllerCatalog`], into a [`ControllerName`] that can only
//! hold a canonical name.
//!
//! A catalog starts as the controllers Kubernetes' controller managers have ([`ControllerCatalog::kubernetes`]):
//! names a leader-migration configuration shared with kube-controller-manager may use, none of them run
//! here. A binary then marks what it runs ([`ControllerCatalog::with_runnable`], from its controller
//! registry): a well-known name becomes runnable and keeps its aliases; a new name (a provider's own
//! controller) is added.
//!
//! Change policy (as upstream): canonical names are IDs. When one changes, the old name becomes an alias,
//! and aliases are never removed.

use std::collections::BTreeMap;
use std::fmt;

/// The controllers of Kubernetes' controller managers, as canonical name and the aliases upstream keeps.
///
/// First the cloud controllers (cloud-controller-manager's; kube-controller-manager ran the last four with
/// an in-tree cloud provider), then kube-controller-manager's own.
const KUBERNETES_CONTROLLERS: &[(&str, &[&str])] = &[
    ("cloud-node-controller", &["cloud-node"]),
    ("cloud-node-lifecycle-controller", &["cloud-node-lifecycle"]),
    // `service-controller` and `route-controller` are the names upstream's default migration
    // configuration has used since 1.28; accepting them makes that default mean what it says.
    ("service-lb-controller", &["service", "service-controller"]),
    ("node-route-controller", &["route", "route-controller"]),
    ("node-ipam-controller", &["nodeipam"]),
    ("serviceaccount-token-controller", &["serviceaccount-token"]),
    ("endpoints-controller", &["endpoint"]),
    ("endpointslice-controller", &["endpointslice"]),
    ("endpointslice-mirroring-controller", &["endpointslicemirroring"]),
    ("replicationcontroller-controller", &["replicationcontroller"]),
    ("pod-garbage-collector-controller", &["podgc"]),
    ("resourcequota-controller", &["resourcequota"]),
    ("namespace-controller", &["namespace"]),
    ("serviceaccount-controller", &["serviceaccount"]),
    ("garbage-collector-controller", &["garbagecollector"]),
    ("daemonset-controller", &["daemonset"]),
    ("job-controller", &["job"]),
    ("deployment-controller", &["deployment"]),
    ("replicaset-controller", &["replicaset"]),
    (
        "horizontal-pod-autoscaler-controller",
        &["horizontalpodautoscaling"],
    ),
    ("disruption-controller", &["disruption"]),
    ("statefulset-controller", &["statefulset"]),
    ("cronjob-controller", &["cronjob"]),
    ("certificatesigningrequest-signing-controller", &["csrsigning"]),
    (
        "certificatesigningrequest-approving-controller",
        &["csrapproving"],
    ),
    ("certificatesigningrequest-cleaner-controller", &["csrcleaner"]),
    ("ttl-controller", &["ttl"]),
    ("bootstrap-signer-controller", &["bootstrapsigner"]),
    ("token-cleaner-controller", &["tokencleaner"]),
    ("node-lifecycle-controller", &["nodelifecycle"]),
    ("taint-eviction-controller", &[]),
    ("persistentvolume-binder-controller", &["persistentvolume-binder"]),
    ("persistentvolume-attach-detach-controller", &["attachdetach"]),
    (
        "persistentvolume-expander-controller",
        &["persistentvolume-expander"],
    ),
    ("clusterrole-aggregation-controller", &["clusterrole-aggregation"]),
    ("persistentvolumeclaim-protection-controller", &["pvc-protection"]),
    ("persistentvolume-protection-controller", &["pv-protection"]),
    ("ttl-after-finished-controller", &["ttl-after-finished"]),
    (
        "root-ca-certificate-publisher-controller",
        &["root-ca-cert-publisher"],
    ),
    (
        "service-ca-certificate-publisher-controller",
        &["service-ca-cert-publisher"],
    ),
    ("ephemeral-volume-controller", &["ephemeral-volume"]),
    (
        "storageversion-garbage-collector-controller",
        &["storage-version-gc"],
    ),
    ("resourceclaim-controller", &["resource-claim-controller"]),
    (
        "legacy-serviceaccount-token-cleaner-controller",
        &["legacy-service-account-token-cleaner"],
    ),
    ("validatingadmissionpolicy-status-controller", &[]),
    ("service-cidr-controller", &[]),
    ("storage-version-migrator-controller", &[]),
];

/// A canonical controller name, obtained from a [`ControllerCatalog`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ControllerName(&'static str);

impl ControllerName {
    /// The canonical name.
    pub const fn as_str(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for ControllerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for ControllerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

/// A controller a binary runs, as its controller registry declares it to the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnableController {
    /// Canonical name, `^[a-z]([-a-z]*[a-z])?$` ending in `-controller` (upstream's naming rule).
    pub name: &'static str,
    /// More names that resolve to it (a well-known controller keeps its known aliases as well).
    pub aliases: &'static [&'static str],
    /// Whether `--controllers=*` leaves it off.
    pub disabled_by_default: bool,
    /// Whether the default leader-migration configuration migrates it (kube-controller-manager ran it
    /// with an in-tree cloud provider, so it moves during the migration).
    pub migrated_by_default: bool,
}

/// One known controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// The canonical name.
    pub name: ControllerName,
    /// Aliases that resolve to it.
    pub aliases: Vec<&'static str>,
    /// Whether `--controllers=*` leaves it off.
    pub disabled_by_default: bool,
    /// Whether the default leader-migration configuration migrates it.
    pub migrated_by_default: bool,
    /// Whether this binary runs it (otherwise it is only recognised in configurations).
    pub runnable: bool,
}

/// Why a controller cannot be added to a catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// The name or one of its aliases already names another controller, or this one twice.
    #[error("controller name {name:?} is already registered (by {existing})")]
    DuplicateName {
        /// The clashing name.
        name: String,
        /// The canonical name that already holds it.
        existing: String,
    },
    /// The name does not follow upstream's naming rule.
    #[error("controller name {name:?} must match ^[a-z]([-a-z]*[a-z])?$ and end in -controller")]
    InvalidName {
        /// The offending name.
        name: String,
    },
}

/// The universe of controller names one binary knows: the well-known ones, and which of them (plus the
/// binary's own) it runs.
#[derive(Debug, Clone)]
pub struct ControllerCatalog {
    entries: Vec<CatalogEntry>,
    by_name: BTreeMap<&'static str, usize>,
}

impl ControllerCatalog {
    /// The controllers of Kubernetes' controller managers, none of them runnable.
    pub fn kubernetes() -> Self {
        let mut catalog = ControllerCatalog {
            entries: Vec::new(),
            by_name: BTreeMap::new(),
        };
        for &(name, aliases) in KUBERNETES_CONTROLLERS {
            catalog.insert(CatalogEntry {
                name: ControllerName(name),
                aliases: aliases.to_vec(),
                disabled_by_default: false,
                migrated_by_default: false,
                runnable: false,
            });
        }
        catalog
    }

    /// A catalog of exactly these runnable entries; used by tests that port upstream's synthetic universes.
    pub fn from_entries(
        entries: impl IntoIterator<Item = (&'static str, &'static [&'static str], bool)>,
    ) -> Self {
        let mut catalog = ControllerCatalog {
            entries: Vec::new(),
            by_name: BTreeMap::new(),
        };
        for (name, aliases, disabled_by_default) in entries {
            catalog.insert(CatalogEntry {
                name: ControllerName(name),
                aliases: aliases.to_vec(),
                disabled_by_default,
                migrated_by_default: false,
                runnable: true,
            });
        }
        catalog
    }

    /// Marks a controller as run by this binary: a well-known one becomes runnable (its aliases kept, and
    /// `controller`'s added), a new one is added. Runnable controllers keep the order they are added in.
    pub fn with_runnable(mut self, controller: RunnableController) -> Result<Self, CatalogError> {
        if !is_valid_controller_name(controller.name) {
            return Err(CatalogError::InvalidName {
                name: controller.name.to_owned(),
            });
        }
        let known = self
            .resolve(controller.name)
            .filter(|entry| entry.name.as_str() == controller.name && !entry.runnable)
            .map(|entry| entry.name);
        for name in std::iter::once(controller.name).chain(controller.aliases.iter().copied()) {
            if let Some(existing) = self.resolve(name)
                && Some(existing.name) != known
            {
                return Err(CatalogError::DuplicateName {
                    name: name.to_owned(),
                    existing: existing.name.as_str().to_owned(),
                });
            }
        }
        let mut entry = match known {
            Some(name) => {
                let index = self.by_name[name.as_str()];
                let entry = self.entries.remove(index);
                self.reindex();
                entry
            }
            None => CatalogEntry {
                name: ControllerName(controller.name),
                aliases: Vec::new(),
                disabled_by_default: false,
                migrated_by_default: false,
                runnable: false,
            },
        };
        for alias in controller.aliases {
            if !entry.aliases.contains(alias) {
                entry.aliases.push(alias);
            }
        }
        entry.disabled_by_default = controller.disabled_by_default;
        entry.migrated_by_default = controller.migrated_by_default;
        entry.runnable = true;
        // Runnable entries come first, in the order they were added: that is the start order.
        let position = self.entries.iter().take_while(|e| e.runnable).count();
        self.entries.insert(position, entry);
        self.reindex();
        Ok(self)
    }

    fn insert(&mut self, entry: CatalogEntry) {
        self.entries.push(entry);
        self.reindex();
    }

    fn reindex(&mut self) {
        self.by_name.clear();
        for (index, entry) in self.entries.iter().enumerate() {
            self.by_name.insert(entry.name.as_str(), index);
            for alias in &entry.aliases {
                self.by_name.insert(alias, index);
            }
        }
    }

    /// Looks a name or alias up.
    pub fn resolve(&self, name: &str) -> Option<&CatalogEntry> {
        self.by_name.get(name).map(|&index| &self.entries[index])
    }

    /// Every entry: the runnable ones first, in start order.
    pub fn entries(&self) -> impl Iterator<Item = &CatalogEntry> {
        self.entries.iter()
    }

    /// The entries this binary runs, in start order.
    pub fn runnable(&self) -> impl Iterator<Item = &CatalogEntry> {
        self.entries.iter().filter(|e| e.runnable)
    }
}

/// Upstream's naming rule for controllers (`app/controllermanager_test.go`).
fn is_valid_controller_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let well_formed = !bytes.is_empty()
        && bytes.iter().all(|b| b.is_ascii_lowercase() || *b == b'-')
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1].is_ascii_lowercase();
    well_formed && name.ends_with("-controller")
}

/// The catalog of a binary that runs upstream's four cloud controllers, as the framework's built-in
/// registry does; for this crate's tests, which port upstream's tables.
#[cfg(test)]
pub(crate) fn test_catalog() -> ControllerCatalog {
    let runnable = |name, migrated_by_default| RunnableController {
        name,
        aliases: &[],
        disabled_by_default: false,
        migrated_by_default,
    };
    ControllerCatalog::kubernetes()
        .with_runnable(runnable("cloud-node-controller", false))
        .and_then(|c| c.with_runnable(runnable("cloud-node-lifecycle-controller", true)))
        .and_then(|c| c.with_runnable(runnable("service-lb-controller", true)))
        .and_then(|c| c.with_runnable(runnable("node-route-controller", true)))
        .expect("the built-in controllers fit the catalog")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_resolves(name: &str, expected: Option<&str>) {
        let catalog = test_catalog();
        assert_eq!(
            catalog.resolve(name).map(|e| e.name.as_str()),
            expected,
            "resolving {name:?}"
        );
    }

    #[test]
    fn canonical_names_resolve_to_themselves() {
        for entry in test_catalog().entries() {
            check_resolves(entry.name.as_str(), Some(entry.name.as_str()));
        }
    }

    #[test]
    fn upstream_aliases_resolve() {
        check_resolves("cloud-node", Some("cloud-node-controller"));
        check_resolves("cloud-node-lifecycle", Some("cloud-node-lifecycle-controller"));
        check_resolves("service", Some("service-lb-controller"));
        check_resolves("route", Some("node-route-controller"));
        check_resolves("nodeipam", Some("node-ipam-controller"));
    }

    #[test]
    fn stale_default_names_resolve() {
        check_resolves("service-controller", Some("service-lb-controller"));
        check_resolves("route-controller", Some("node-route-controller"));
    }

    #[test]
    fn well_known_names_are_recognised_but_run_only_when_a_binary_registers_them() {
        check_resolves("deployment", Some("deployment-controller"));
        check_resolves(
            "horizontalpodautoscaling",
            Some("horizontal-pod-autoscaler-controller"),
        );
        let catalog = test_catalog();
        assert!(!catalog.resolve("deployment-controller").unwrap().runnable);
        assert!(!catalog.resolve("nodeipam").unwrap().runnable);
        assert!(catalog.resolve("service").unwrap().runnable);
        assert!(
            !ControllerCatalog::kubernetes()
                .resolve("service")
                .unwrap()
                .runnable
        );
        let order: Vec<&str> = catalog.runnable().map(|e| e.name.as_str()).collect();
        assert_eq!(
            order,
            [
                "cloud-node-controller",
                "cloud-node-lifecycle-controller",
                "service-lb-controller",
                "node-route-controller"
            ]
        );
    }

    #[test]
    fn unknown_names_do_not_resolve() {
        check_resolves("grey-controller", None);
        check_resolves("Service", None);
        check_resolves("*", None);
        check_resolves("", None);
    }

    #[test]
    fn every_well_known_controller_follows_the_naming_rule() {
        for entry in ControllerCatalog::kubernetes().entries() {
            assert!(is_valid_controller_name(entry.name.as_str()), "{}", entry.name);
        }
    }

    #[test]
    fn a_binarys_own_controllers_are_added_and_clashes_refused() {
        const TAGGING: RunnableController = RunnableController {
            name: "tagging-controller",
            aliases: &["tagging"],
            disabled_by_default: true,
            migrated_by_default: false,
        };
        let catalog = test_catalog().with_runnable(TAGGING).unwrap();
        let entry = catalog.resolve("tagging").unwrap();
        assert_eq!(
            (entry.name.as_str(), entry.runnable, entry.disabled_by_default),
            ("tagging-controller", true, true)
        );
        assert_eq!(
            catalog.runnable().last().map(|e| e.name.as_str()),
            Some("tagging-controller"),
            "registration order is start order"
        );
        assert_eq!(
            catalog.with_runnable(TAGGING).unwrap_err(),
            CatalogError::DuplicateName {
                name: "tagging-controller".into(),
                existing: "tagging-controller".into()
            }
        );
        let clash = RunnableController {
            name: "my-controller",
            aliases: &["service"],
            ..TAGGING
        };
        assert!(matches!(
            test_catalog().with_runnable(clash),
            Err(CatalogError::DuplicateName { .. })
        ));
        let bad = RunnableController {
            name: "Tagging",
            ..TAGGING
        };
        assert!(matches!(
            test_catalog().with_runnable(bad),
            Err(CatalogError::InvalidName { .. })
        ));
    }

    #[test]
    fn a_well_known_controller_registered_here_keeps_its_aliases_and_gains_new_ones() {
        let ipam = RunnableController {
            name: "node-ipam-controller",
            aliases: &["cloud-node-ipam"],
            disabled_by_default: true,
            migrated_by_default: false,
        };
        let catalog = test_catalog().with_runnable(ipam).unwrap();
        for name in ["nodeipam", "cloud-node-ipam", "node-ipam-controller"] {
            let entry = catalog.resolve(name).unwrap();
            assert_eq!(entry.name.as_str(), "node-ipam-controller");
            assert!(entry.runnable && entry.disabled_by_default);
        }
    }
}
