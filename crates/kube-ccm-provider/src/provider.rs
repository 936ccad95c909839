//! The provider itself.

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::flags::FlagValues;
use crate::{CallContext, CloudError, Instances, InstancesV2, LoadBalancer, PodCidrs, Refused, Routes};

/// What a provider gets when the manager starts, on every replica, before any election.
#[derive(Clone)]
pub struct InitializeContext {
    /// A client for the provider's own use (its `User-Agent` names the provider).
    pub client: kube::Client,
    /// Fires at shutdown.
    pub shutdown: CancellationToken,
    /// The values of the flags the binary's providers and controllers declare ([`crate::flags`]), each
    /// checked; a flag not given has its default.
    pub flags: FlagValues,
    /// The process's shared caches of nodes and services, to read instead of watching them again
    /// (upstream's `InformerUser`); they start when first asked, so read them while leading.
    pub caches: std::sync::Arc<dyn crate::SharedCaches>,
}

/// What a provider gets when this process starts leading (the main lock; at start-up without leader
/// election).
#[derive(Clone)]
pub struct LeadingContext {
    /// A client for the provider's own work while leading; its writes are fenced on the main lock.
    pub client: kube::Client,
    /// Fires when leadership ends (or at shutdown): background work started for it must end then.
    pub stop: CancellationToken,
}

/// A zone (deprecated: use [`crate::InstanceMetadata`]'s zone and region).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Zone {
    /// Zone, e.g. `us-east-1a`.
    pub failure_domain: String,
    /// Region.
    pub region: String,
}

/// Zone look-ups (deprecated upstream; used with [`Instances`], as upstream, for providers without
/// [`InstancesV2`]).
#[async_trait]
pub trait Zones: Send + Sync {
    /// The zone of the machine this runs on (no controller calls it, as upstream).
    async fn zone(&self, cx: &CallContext) -> Result<Zone, CloudError>;
    /// The zone of an instance by provider ID.
    async fn zone_by_provider_id(&self, cx: &CallContext, provider_id: &str) -> Result<Zone, CloudError>;
    /// The zone of an instance by node name.
    async fn zone_by_node_name(&self, cx: &CallContext, node_name: &str) -> Result<Zone, CloudError>;
}

/// Cluster listing (optional upstream capability; no controller uses it).
#[async_trait]
pub trait Clusters: Send + Sync {
    /// Cluster names.
    async fn list_clusters(&self, cx: &CallContext) -> Result<Vec<String>, CloudError>;
    /// The control-plane address of a cluster.
    async fn master(&self, cx: &CallContext, cluster_name: &str) -> Result<String, CloudError>;
}

/// A cloud. Capabilities are optional: return `None` for what the cloud does not have, and the
/// controllers that need it are skipped with that reason.
///
/// Life cycle: the factory builds the provider and [`CloudProvider::initialize`] runs on every replica
/// before any election (construction-time work only: configuration, clients). Work that must happen only
/// in the replica that leads — housekeeping loops, caches that drive cloud writes — starts in
/// [`CloudProvider::start_leading`] and ends when its `stop` fires. (Upstream calls `Initialize` after
/// winning leadership instead, again for each migration lock; here a provider gets one call per leadership
/// of the main lock.)
///
/// # Example
///
/// A cloud of instances only, held in a map (node name → zone); the controllers that need load balancers or
/// routes are skipped, saying why:
///
/// ```
/// use std::collections::BTreeMap;
/// use std::time::Duration;
///
/// use async_trait::async_trait;
/// use k8s_openapi::api::core::v1::Node;
/// use kube_ccm_provider::{CallContext, CloudError, CloudProvider, InstanceMetadata, InstancesV2};
///
/// struct Tiny {
///     running: BTreeMap<String, String>,
/// }
///
/// #[async_trait]
/// impl CloudProvider for Tiny {
///     fn provider_name(&self) -> &str {
///         "tiny"
///     }
///
///     fn instances_v2(&self) -> Option<&dyn InstancesV2> {
///         Some(self)
///     }
/// }
///
/// #[async_trait]
/// impl InstancesV2 for Tiny {
///     async fn instance_exists(&self, _cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
///         Ok(self.running.contains_key(node.metadata.name.as_deref().unwrap_or_default()))
///     }
///
///     async fn instance_shutdown(&self, _cx: &CallContext, _node: &Node) -> Result<bool, CloudError> {
///         Ok(false)
///     }
///
///     async fn instance_metadata(&self, _cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError> {
///         let name = node.metadata.name.clone().unwrap_or_default();
///         let zone = self.running.get(&name).ok_or(CloudError::InstanceNotFound)?;
///         Ok(InstanceMetadata {
///             provider_id: format!("tiny://{name}"),
///             zone: zone.clone(),
///             ..InstanceMetadata::default()
///         })
///     }
/// }
///
/// let cloud = Tiny { running: BTreeMap::from([("n1".to_owned(), "z1".to_owned())]) };
/// let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).unwrap();
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// let cx = CallContext::with_timeout(Duration::from_secs(5));
/// let instances = cloud.instances_v2().expect("Tiny has instances");
/// assert!(runtime.block_on(instances.instance_exists(&cx, &node)).unwrap());
/// let metadata = runtime.block_on(instances.instance_metadata(&cx, &node)).unwrap();
/// assert_eq!((metadata.provider_id.as_str(), metadata.zone.as_str()), ("tiny://n1", "z1"));
/// assert!(cloud.load_balancer().is_none() && cloud.check_provider_id("tiny://n1").is_ok());
/// ```
#[async_trait]
pub trait CloudProvider: std::any::Any + Send + Sync {
    /// The provider's name, also the scheme of its provider IDs (`<name>://…`).
    fn provider_name(&self) -> &str;

    /// Called once on every replica before any controller starts or any lock is contended for.
    async fn initialize(&self, _context: InitializeContext) -> Result<(), CloudError> {
        Ok(())
    }

    /// Called when this process starts leading (the main lock; at start-up without leader election),
    /// before the controllers under that lock start. Background work it starts must end when
    /// `context.stop` fires. An error stops this leadership as a lost lock does.
    async fn start_leading(&self, _context: LeadingContext) -> Result<(), CloudError> {
        Ok(())
    }

    /// Whether `provider_id` names one of this provider's instances; by default its scheme is the
    /// provider's name. The lifecycle controller never asks the cloud about, and so never deletes, a node
    /// whose provider ID another provider owns (upstream has no such guard).
    fn owns_provider_id(&self, provider_id: &str) -> bool {
        provider_id
            .split_once("://")
            .is_some_and(|(scheme, _)| scheme == self.provider_name())
    }

    /// Whether this provider can interpret `provider_id`, one it owns: `Err(why)` when it cannot. The
    /// lifecycle controller never asks the cloud about a node whose provider ID the provider cannot
    /// interpret, so such a node is never deleted nor treated as shut down (the look-up is an error: logged,
    /// a Warning Event `ProviderIDNotInterpretable`, the gauge `node_lifecycle_uninterpretable_provider_ids`),
    /// whatever the provider would have answered for it. By default an ID is interpretable when its scheme
    /// is the provider's name and something other than slashes follows `://`; a provider whose IDs have a
    /// stricter form says so here (AWS: an instance or Fargate ID; GCE: `gce://<project>/<zone>/<name>`).
    fn check_provider_id(&self, provider_id: &str) -> Result<(), Refused> {
        match provider_id.split_once("://") {
            Some((scheme, rest)) if scheme == self.provider_name() && !rest.trim_matches('/').is_empty() => {
                Ok(())
            }
            _ => Err(Refused::new(format!(
                "not of the form {}://<instance>",
                self.provider_name()
            ))),
        }
    }

    /// Instance look-ups; required (or [`CloudProvider::instances`]) by the cloud-node and
    /// cloud-node-lifecycle controllers.
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        None
    }

    /// The older instance look-ups, used only when [`CloudProvider::instances_v2`] is `None`.
    fn instances(&self) -> Option<&dyn Instances> {
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

    /// The pod CIDRs the cloud assigns its instances; required by `node-ipam-controller` with
    /// `--cidr-allocator-type=CloudAllocator` (its `RangeAllocator` needs nothing of the provider).
    fn pod_cidrs(&self) -> Option<&dyn PodCidrs> {
        None
    }

    /// Zones (deprecated; used with [`CloudProvider::instances`]).
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

    /// The request rate the process's [`RateBudget`](crate::RateBudget) allows this cloud by default (the
    /// cloud's published limit, with room for the account's other clients); `--cloud-api-qps` and
    /// `--cloud-api-burst` override it. `None` (the default): no limit, only the pause on throttling.
    fn default_request_rate(&self) -> Option<RequestRate> {
        None
    }
}

/// Requests per second and the burst above that rate ([`CloudProvider::default_request_rate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestRate {
    /// Requests per second on average.
    pub per_second: f64,
    /// Requests at once after a quiet spell.
    pub burst: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named;

    impl CloudProvider for Named {
        fn provider_name(&self) -> &str {
            "fake"
        }
    }

    #[test]
    fn by_default_an_id_is_interpretable_when_it_names_something_under_the_providers_scheme() {
        let check = |id: &str, ok: bool| {
            assert_eq!(Named.check_provider_id(id).is_ok(), ok, "{id:?}");
        };
        check("fake://node-1", true);
        check("fake:///zone/node-1", true);
        check("fake://", false);
        check("fake:///", false);
        check("fake://///", false);
        check("", false);
        check("node-1", false);
        check("gce://p/z/n", false);
        check("fakes://node-1", false);
        assert_eq!(
            Named.check_provider_id("x").unwrap_err().to_string(),
            "not of the form fake://<instance>"
        );
    }

    proptest::proptest! {
        /// An ID the default check lets through names something under the provider's scheme; anything
        /// else (empty, another provider's, garbage) is refused, so the lifecycle controller never asks
        /// about it and never deletes its node.
        #[test]
        fn the_default_check_lets_through_only_ids_under_the_providers_scheme(
            id in proptest::prop_oneof![
                proptest::string::string_regex(".{0,30}").unwrap(),
                proptest::string::string_regex("(fake|gce|aws|fakes)?:?/{0,4}[a-z0-9/-]{0,12}").unwrap(),
            ]
        ) {
            let rest = id.strip_prefix("fake://");
            let names_something = rest.is_some_and(|rest| rest.chars().any(|c| c != '/'));
            proptest::prop_assert_eq!(Named.check_provider_id(&id).is_ok(), names_something);
        }
    }
}
