//! What the manager needs to run, as plain data (the command line builds it).

use std::time::Duration;

use kube_ccm_leadermigration::scopes::LossPolicy;
use kube_ccm_leadermigration::{ControllerSelection, LeaseTimings, MigrationConfig};

use crate::client::ClientFactory;
use crate::{NodeDeletion, OrphanSweep};
use kube_ccm_provider::flags::FlagValues;
use kube_ccm_provider::{Cidr, RequestRate};

/// Settings of the controllers, as upstream's flags.
#[derive(Debug, Clone)]
pub struct ControllerSettings {
    /// `--cluster-name`.
    pub cluster_name: String,
    /// `--cluster-cidr`, parsed.
    pub cluster_cidrs: Vec<Cidr>,
    /// `--configure-cloud-routes`.
    pub configure_cloud_routes: bool,
    /// `--allocate-node-cidrs`: a provider's node-IPAM controller may allocate pod CIDRs.
    pub allocate_node_cidrs: bool,
    /// `--cidr-allocator-type` (upstream's `RangeAllocator`, `CloudAllocator`, …), for a provider's
    /// node-IPAM controller to check.
    pub cidr_allocator_type: String,
    /// `--node-monitor-period`: how often the lifecycle controller looks at NotReady nodes.
    pub node_monitor_period: Duration,
    /// `--node-deletion-*`: how certain the cloud's "gone" must be before the lifecycle controller
    /// deletes a node.
    pub node_deletion: NodeDeletion,
    /// `--load-balancer-orphan-*`: when the service controller deletes load balancers no service claims.
    pub load_balancer_sweep: OrphanSweep,
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
    /// `--concurrent-load-balancer-host-updates`: services whose load balancers' hosts a node-set change
    /// updates at once (syncs that ensure or delete stay within `concurrent_service_syncs`).
    pub concurrent_load_balancer_host_updates: u16,
    /// The longest a cloud call may take (its deadline is also never past the caller's lock).
    pub cloud_call_timeout: Duration,
    /// `--cloud-api-qps`: the requests a second the process's cloud budget allows (0: the provider's
    /// default, `CloudProvider::default_request_rate`; negative: no limit).
    pub cloud_api_qps: f64,
    /// `--cloud-api-burst`: the budget's burst (0: the provider's default, or the rate rounded up).
    pub cloud_api_burst: u32,
    /// The values of the flags the binary's controllers declare ([`kube_ccm_provider::flags`]).
    pub flags: FlagValues,
}

impl ControllerSettings {
    /// Upstream's defaults, except the concurrency ones (see the flags' help for why) and the node deletion's
    /// (upstream has no such settings, and deletes on the first "gone").
    pub fn defaults(cluster_name: &str) -> ControllerSettings {
        ControllerSettings {
            cluster_name: cluster_name.to_owned(),
            cluster_cidrs: Vec::new(),
            configure_cloud_routes: true,
            allocate_node_cidrs: false,
            cidr_allocator_type: "RangeAllocator".to_owned(),
            node_monitor_period: Duration::from_secs(5),
            node_deletion: NodeDeletion::default(),
            load_balancer_sweep: OrphanSweep::default(),
            node_status_update_frequency: Duration::from_secs(300),
            route_reconciliation_period: Duration::from_secs(10),
            concurrent_node_syncs: 128,
            concurrent_node_status_updates: 0,
            concurrent_service_syncs: 8,
            concurrent_load_balancer_host_updates: 64,
            cloud_call_timeout: Duration::from_secs(60),
            cloud_api_qps: 0.0,
            cloud_api_burst: 0,
            flags: FlagValues::default(),
        }
    }

    /// How long one unit of a controller's work (one sync) may run before the controller counts as stuck:
    /// ten cloud-call timeouts. A sync makes a handful of cloud and Kubernetes calls, each with its own
    /// deadline, so a sync running that long is not waiting on a call.
    pub fn stuck_after(&self) -> Duration {
        self.cloud_call_timeout.saturating_mul(10)
    }

    /// The process's cloud budget: `--cloud-api-qps` and `--cloud-api-burst` over the provider's default.
    pub fn request_rate(&self, provider_default: Option<RequestRate>) -> RequestRate {
        let per_second = match self.cloud_api_qps {
            q if q > 0.0 => q,
            q if q < 0.0 => 0.0,
            _ => provider_default.map_or(0.0, |r| r.per_second),
        };
        let burst = match (self.cloud_api_burst, provider_default) {
            (0, Some(default)) => default.burst,
            // A rate of its own with no burst: one second's worth.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped to u32's range
            (0, None) => per_second.ceil().clamp(1.0, f64::from(u32::MAX)) as u32,
            (burst, _) => burst,
        };
        RequestRate { per_second, burst }
    }
}

/// Leader election (`--leader-elect=true`), and leader migration, which only works with it (upstream).
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// `--leader-elect-resource-namespace`.
    pub namespace: String,
    /// `--leader-elect-resource-name`.
    pub main_lease: String,
    /// `--leader-elect-lease-duration`, `--leader-elect-renew-deadline`, `--leader-elect-retry-period`.
    pub timings: LeaseTimings,
    /// Release locks on shutdown.
    pub release_on_cancel: bool,
    /// What losing a lock does.
    pub on_loss: LossPolicy,
    /// `--warm-standby`: the shared caches the planned controllers declare they read
    /// ([`crate::ControllerDefinition::reads`]) start with the process, not when it first leads.
    pub warm_standby: bool,
    migration: Option<MigrationConfig>,
}

/// A migration Lease that is also the main Lease: one process would hold both for different controllers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--leader-migration-config: lease {0:?} is also --leader-elect-resource-name; they must differ")]
pub struct LeaseClash(pub String);

impl LeaderElectionConfig {
    /// Leader election on `main_lease` in `namespace`, without migration; locks are released on shutdown.
    pub fn new(namespace: &str, main_lease: &str, timings: LeaseTimings, on_loss: LossPolicy) -> Self {
        LeaderElectionConfig {
            namespace: namespace.to_owned(),
            main_lease: main_lease.to_owned(),
            timings,
            release_on_cancel: true,
            on_loss,
            warm_standby: false,
            migration: None,
        }
    }

    /// With leader migration: refused when a migration Lease is the main Lease.
    pub fn with_migration(mut self, migration: MigrationConfig) -> Result<Self, LeaseClash> {
        if let Some(lock) = migration.locks().iter().find(|l| l.lease_name == self.main_lease) {
            return Err(LeaseClash(lock.lease_name.clone()));
        }
        self.migration = Some(migration);
        Ok(self)
    }

    /// The leader-migration configuration, when migration is on.
    pub fn migration(&self) -> Option<&MigrationConfig> {
        self.migration.as_ref()
    }
}

/// Everything [`crate::Manager`] needs besides the provider and the controllers.
pub struct ManagerConfig {
    /// This manager's component name (`cloud-controller-manager`, or another when playing one).
    pub component: String,
    /// Builds clients (identity, `User-Agent`, QPS).
    pub clients: ClientFactory,
    /// `None`: `--leader-elect=false`: every enabled controller runs, without migration (upstream).
    pub leader_election: Option<LeaderElectionConfig>,
    /// `--controllers`, resolved against the registry's catalog.
    pub selection: ControllerSelection,
    /// Controller settings.
    pub controllers: ControllerSettings,
}
