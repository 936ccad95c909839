//! Controller names as types.
//!
//! Upstream keeps controller names as strings and resolves aliases only for `--controllers`. Its default
//! migration configuration has named `route-controller` and `service-controller` since 1.28 while the
//! controllers are called `node-route-controller` and `service-lb-controller`, so those two never migrate.
//! Here a name is resolved once, through a [`ControllerCatalog`], into a [`ControllerName`] that can only
//! hold a canonical name.
//!
//! Change policy (as upstream): canonical names are IDs. When one changes, the old name becomes an alias,
//! and aliases are never removed.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// The controllers this framework implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CloudController {
    /// Initialises nodes from the cloud and keeps their labels and addresses current.
    CloudNode,
    /// Deletes nodes whose instances are gone and taints shut-down ones.
    CloudNodeLifecycle,
    /// Ensures cloud load balancers for `type: LoadBalancer` services.
    ServiceLb,
    /// Creates cloud routes for node pod CIDRs.
    NodeRoute,
    /// Allocates node pod CIDRs from the cloud.
    NodeIpam,
}

impl CloudController {
    /// Every cloud controller, in start order.
    pub const ALL: [CloudController; 5] = [
        CloudController::CloudNode,
        CloudController::CloudNodeLifecycle,
        CloudController::ServiceLb,
        CloudController::NodeRoute,
        CloudController::NodeIpam,
    ];

    /// The canonical name: what logs, metrics, health checks and configs use.
    pub const fn as_str(self) -> &'static str {
        match self {
            CloudController::CloudNode => "cloud-node-controller",
            CloudController::CloudNodeLifecycle => "cloud-node-lifecycle-controller",
            CloudController::ServiceLb => "service-lb-controller",
            CloudController::NodeRoute => "node-route-controller",
            CloudController::NodeIpam => "node-ipam-controller",
        }
    }

    /// Older names still accepted in `--controllers` and in leader-migration configs.
    pub const fn aliases(self) -> &'static [&'static str] {
        match self {
            CloudController::CloudNode => &["cloud-node"],
            CloudController::CloudNodeLifecycle => &["cloud-node-lifecycle"],
            // `service-controller` and `route-controller` are the names upstream's default migration
            // configuration has used since 1.28; accepting them makes that default mean what it says.
            CloudController::ServiceLb => &["service", "service-controller"],
            CloudController::NodeRoute => &["route", "route-controller"],
            CloudController::NodeIpam => &["nodeipam"],
        }
    }

    /// Whether `--controllers=*` leaves this controller off.
    ///
    /// Node IPAM is provider specific: a provider that offers it registers it explicitly.
    pub const fn disabled_by_default(self) -> bool {
        matches!(self, CloudController::NodeIpam)
    }
}

impl fmt::Display for CloudController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is neither canonical nor an alias of a known controller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not in the list of known controllers")]
pub struct UnknownController {
    /// The name as it was written.
    pub name: String,
}

impl FromStr for CloudController {
    type Err = UnknownController;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        CloudController::ALL
            .into_iter()
            .find(|c| c.as_str() == name || c.aliases().contains(&name))
            .ok_or_else(|| UnknownController {
                name: name.to_owned(),
            })
    }
}

/// Controllers of kube-controller-manager, as canonical name and the aliases upstream keeps for it.
///
/// A leader-migration file is shared by both controller managers, so it may name these. Cloud
/// controllers that kube-controller-manager also ran (`service`, `route`, `cloud-node-lifecycle`,
/// `nodeipam`) are in [`CloudController`] and not repeated here.
const KUBE_CONTROLLER_MANAGER_CONTROLLERS: &[(&str, &[&str])] = &[
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

/// A canonical controller name, obtained from a [`ControllerCatalog`] or a [`CloudController`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ControllerName(&'static str);

impl ControllerName {
    /// The canonical name.
    pub const fn as_str(self) -> &'static str {
        self.0
    }

    /// The cloud controller this name denotes, if it is one.
    pub fn cloud_controller(self) -> Option<CloudController> {
        CloudController::ALL.into_iter().find(|c| c.as_str() == self.0)
    }
}

impl From<CloudController> for ControllerName {
    fn from(controller: CloudController) -> Self {
        ControllerName(controller.as_str())
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

/// A controller a provider crate adds to the framework (for example a tagging controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtraController {
    /// Canonical name, `^[a-z]([-a-z]*[a-z])?$` ending in `-controller` (upstream's naming rule).
    pub name: &'static str,
    /// Older names.
    pub aliases: &'static [&'static str],
    /// Whether `--controllers=*` leaves it off.
    pub disabled_by_default: bool,
}

/// Where a known controller runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerOrigin {
    /// Implemented by this framework.
    Cloud,
    /// Added by a provider crate.
    Provider,
    /// Only in kube-controller-manager: recognised in configs, never run by this binary.
    KubeControllerManager,
}

/// One known controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    /// The canonical name.
    pub name: ControllerName,
    /// Aliases that resolve to it.
    pub aliases: &'static [&'static str],
    /// Whether `--controllers=*` leaves it off.
    pub disabled_by_default: bool,
    /// Who runs it.
    pub origin: ControllerOrigin,
}

impl CatalogEntry {
    /// Whether this binary can run the controller.
    pub fn is_runnable(&self) -> bool {
        self.origin != ControllerOrigin::KubeControllerManager
    }
}

/// Why an extra controller cannot be added to a catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// The name or one of its aliases is already taken.
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

/// The universe of controller names one binary knows: its own controllers, provider extras, and the
/// controllers of kube-controller-manager (recognised in configs only).
#[derive(Debug, Clone)]
pub struct ControllerCatalog {
    entries: Vec<CatalogEntry>,
    by_name: BTreeMap<&'static str, usize>,
}

impl Default for ControllerCatalog {
    fn default() -> Self {
        Self::standard()
    }
}

impl ControllerCatalog {
    /// The framework's cloud controllers plus kube-controller-manager's names.
    pub fn standard() -> Self {
        let mut catalog = ControllerCatalog {
            entries: Vec::new(),
            by_name: BTreeMap::new(),
        };
        for controller in CloudController::ALL {
            catalog.insert(CatalogEntry {
                name: controller.into(),
                aliases: controller.aliases(),
                disabled_by_default: controller.disabled_by_default(),
                origin: ControllerOrigin::Cloud,
            });
        }
        for &(name, aliases) in KUBE_CONTROLLER_MANAGER_CONTROLLERS {
            catalog.insert(CatalogEntry {
                name: ControllerName(name),
                aliases,
                disabled_by_default: false,
                origin: ControllerOrigin::KubeControllerManager,
            });
        }
        catalog
    }

    /// A catalog of exactly these entries; used by tests that port upstream's synthetic universes.
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
                aliases,
                disabled_by_default,
                origin: ControllerOrigin::Cloud,
            });
        }
        catalog
    }

    /// Adds a provider's controller.
    pub fn with_extra(mut self, extra: ExtraController) -> Result<Self, CatalogError> {
        if !is_valid_controller_name(extra.name) {
            return Err(CatalogError::InvalidName {
                name: extra.name.to_owned(),
            });
        }
        for name in std::iter::once(extra.name).chain(extra.aliases.iter().copied()) {
            if let Some(existing) = self.resolve(name) {
                return Err(CatalogError::DuplicateName {
                    name: name.to_owned(),
                    existing: existing.name.as_str().to_owned(),
                });
            }
        }
        self.insert(CatalogEntry {
            name: ControllerName(extra.name),
            aliases: extra.aliases,
            disabled_by_default: extra.disabled_by_default,
            origin: ControllerOrigin::Provider,
        });
        Ok(self)
    }

    fn insert(&mut self, entry: CatalogEntry) {
        let index = self.entries.len();
        self.by_name.insert(entry.name.as_str(), index);
        for alias in entry.aliases {
            self.by_name.insert(alias, index);
        }
        self.entries.push(entry);
    }

    /// Looks a name or alias up.
    pub fn resolve(&self, name: &str) -> Option<&CatalogEntry> {
        self.by_name.get(name).map(|&index| &self.entries[index])
    }

    /// Every entry, in registration order.
    pub fn entries(&self) -> impl Iterator<Item = &CatalogEntry> {
        self.entries.iter()
    }

    /// The entries this binary can run, in start order.
    pub fn runnable(&self) -> impl Iterator<Item = &CatalogEntry> {
        self.entries.iter().filter(|e| e.is_runnable())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_resolves(name: &str, expected: Option<&str>) {
        let catalog = ControllerCatalog::standard();
        assert_eq!(
            catalog.resolve(name).map(|e| e.name.as_str()),
            expected,
            "resolving {name:?}"
        );
    }

    #[test]
    fn canonical_names_resolve_to_themselves() {
        for controller in CloudController::ALL {
            check_resolves(controller.as_str(), Some(controller.as_str()));
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
    fn kube_controller_manager_names_are_recognised_but_not_runnable() {
        check_resolves("deployment", Some("deployment-controller"));
        check_resolves(
            "horizontalpodautoscaling",
            Some("horizontal-pod-autoscaler-controller"),
        );
        let catalog = ControllerCatalog::standard();
        assert!(!catalog.resolve("deployment-controller").unwrap().is_runnable());
        assert!(catalog.resolve("service").unwrap().is_runnable());
    }

    #[test]
    fn unknown_names_do_not_resolve() {
        check_resolves("grey-controller", None);
        check_resolves("Service", None);
        check_resolves("*", None);
        check_resolves("", None);
    }

    #[test]
    fn every_runnable_controller_follows_the_naming_rule() {
        for entry in ControllerCatalog::standard().entries() {
            assert!(is_valid_controller_name(entry.name.as_str()), "{}", entry.name);
        }
    }

    #[test]
    fn cloud_controller_from_str_accepts_aliases_only_of_its_own() {
        assert_eq!("route".parse::<CloudController>(), Ok(CloudController::NodeRoute));
        assert_eq!(
            "deployment".parse::<CloudController>(),
            Err(UnknownController {
                name: "deployment".into()
            })
        );
        assert_eq!(
            UnknownController {
                name: "grey-controller".into()
            }
            .to_string(),
            "\"grey-controller\" is not in the list of known controllers"
        );
    }

    #[test]
    fn extra_controllers_are_registered_and_clashes_refused() {
        const TAGGING: ExtraController = ExtraController {
            name: "tagging-controller",
            aliases: &["tagging"],
            disabled_by_default: true,
        };
        let catalog = ControllerCatalog::standard().with_extra(TAGGING).unwrap();
        let entry = catalog.resolve("tagging").unwrap();
        assert_eq!(
            (entry.name.as_str(), entry.origin),
            ("tagging-controller", ControllerOrigin::Provider)
        );
        assert_eq!(
            catalog.with_extra(TAGGING).unwrap_err(),
            CatalogError::DuplicateName {
                name: "tagging-controller".into(),
                existing: "tagging-controller".into()
            }
        );
        let clash = ExtraController {
            name: "my-controller",
            aliases: &["service"],
            disabled_by_default: false,
        };
        assert!(matches!(
            ControllerCatalog::standard().with_extra(clash),
            Err(CatalogError::DuplicateName { .. })
        ));
        let bad = ExtraController {
            name: "Tagging",
            aliases: &[],
            disabled_by_default: false,
        };
        assert!(matches!(
            ControllerCatalog::standard().with_extra(bad),
            Err(CatalogError::InvalidName { .. })
        ));
    }
}
