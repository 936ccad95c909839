//! The provider itself.

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::{CloudError, InstancesV2, LoadBalancer, Routes};

/// What a provider gets when the manager starts.
#[derive(Clone)]
pub struct InitializeContext {
    /// A client for the provider's own use (its `User-Agent` names the provider).
    pub client: kube::Client,
    /// Fires at shutdown; background tasks the provider starts must end then.
    pub shutdown: CancellationToken,
}

/// A zone (deprecated: use [`crate::InstanceMetadata`]'s zone and region).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Zone {
    /// Zone, e.g. `us-east-1a`.
    pub failure_domain: String,
    /// Region.
    pub region: String,
}

/// Zone look-ups (deprecated upstream; kept for providers that still offer them).
#[async_trait]
pub trait Zones: Send + Sync {
    /// The zone of the machine this runs on.
    async fn zone(&self) -> Result<Zone, CloudError>;
    /// The zone of an instance by provider ID.
    async fn zone_by_provider_id(&self, provider_id: &str) -> Result<Zone, CloudError>;
    /// The zone of an instance by node name.
    async fn zone_by_node_name(&self, node_name: &str) -> Result<Zone, CloudError>;
}

/// Cluster listing (optional upstream capability).
#[async_trait]
pub trait Clusters: Send + Sync {
    /// Cluster names.
    async fn list_clusters(&self) -> Result<Vec<String>, CloudError>;
    /// The control-plane address of a cluster.
    async fn master(&self, cluster_name: &str) -> Result<String, CloudError>;
}

/// A cloud. Capabilities are optional: return `None` for what the cloud does not have, and the
/// controllers that need it are skipped with that reason.
#[async_trait]
pub trait CloudProvider: Send + Sync + 'static {
    /// The provider's name, also the scheme of its provider IDs (`<name>://…`).
    fn provider_name(&self) -> &str;

    /// Called once before any controller starts.
    async fn initialize(&self, _context: InitializeContext) -> Result<(), CloudError> {
        Ok(())
    }

    /// Instance look-ups; required by the cloud-node and cloud-node-lifecycle controllers.
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        None
    }

    /// Load balancers; required by the service-lb controller.
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        None
    }

    /// Routes; required by the node-route controller.
    fn routes(&self) -> Option<&dyn Routes> {
        None
    }

    /// Zones (deprecated).
    fn zones(&self) -> Option<&dyn Zones> {
        None
    }

    /// Clusters.
    fn clusters(&self) -> Option<&dyn Clusters> {
        None
    }

    /// Whether a cluster ID is required and set (checked at start-up unless `--allow-untagged-cloud`).
    fn has_cluster_id(&self) -> bool {
        true
    }
}
