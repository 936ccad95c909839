//! What the manager needs to run, as plain data (the command line builds it).

use std::time::Duration;

use leadermigration::scopes::LossPolicy;
use leadermigration::{ControllerCatalog, ControllerSelection, MigrationConfig};

use crate::cidr::Cidr;
use crate::client::ClientFactory;

/// Settings of the controllers, as upstream's flags.
#[derive(Debug, Clone)]
pub struct ControllerSettings {
    /// `--cluster-name`.
    pub cluster_name: String,
    /// `--cluster-cidr`, parsed.
    pub cluster_cidrs: Vec<Cidr>,
    /// `--configure-cloud-routes`.
    pub configure_cloud_routes: bool,
    /// `--node-monitor-period`: how often the lifecycle controller looks at NotReady nodes.
    pub node_monitor_period: Duration,
    /// `--node-status-update-frequency`: how often node addresses are refreshed.
    pub node_status_update_frequency: Duration,
    /// `--route-reconciliation-period`.
    pub route_reconciliation_period: Duration,
    /// `--concurrent-node-syncs`.
    pub concurrent_node_syncs: u16,
    /// `--concurrent-node-status-updates` (0: as `--concurrent-node-syncs`).
    pub concurrent_node_status_updates: u16,
    /// `--concurrent-service-syncs`.
    pub concurrent_service_syncs: u16,
}

impl ControllerSettings {
    /// Upstream's defaults, except the concurrency ones (see the flags' help for why).
    pub fn defaults(cluster_name: &str) -> ControllerSettings {
        ControllerSettings {
            cluster_name: cluster_name.to_owned(),
            cluster_cidrs: Vec::new(),
            configure_cloud_routes: true,
            node_monitor_period: Duration::from_secs(5),
            node_status_update_frequency: Duration::from_secs(300),
            route_reconciliation_period: Duration::from_secs(10),
            concurrent_node_syncs: 128,
            concurrent_node_status_updates: 0,
            concurrent_service_syncs: 8,
        }
    }
}

/// Leader election (`--leader-elect=true`).
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// `--leader-elect-resource-namespace`.
    pub namespace: String,
    /// `--leader-elect-resource-name`.
    pub main_lease: String,
    /// `--leader-elect-lease-duration`.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline`.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period`.
    pub retry_period: Duration,
    /// Release locks on shutdown.
    pub release_on_cancel: bool,
    /// What losing a lock does.
    pub on_loss: LossPolicy,
}

/// Everything [`crate::Manager`] needs.
pub struct ManagerConfig {
    /// This manager's component name (`cloud-controller-manager`, or another when playing one).
    pub component: String,
    /// Builds clients (identity, `User-Agent`, QPS).
    pub clients: ClientFactory,
    /// `None`: `--leader-elect=false`: every enabled controller runs, without migration.
    pub leader_election: Option<LeaderElectionConfig>,
    /// The validated leader-migration configuration, when migration is enabled.
    pub migration: Option<MigrationConfig>,
    /// `--controllers`.
    pub selection: ControllerSelection,
    /// Every controller name the binary knows.
    pub catalog: ControllerCatalog,
    /// Controller settings.
    pub controllers: ControllerSettings,
}
