//! The framework's cloud controllers, registered as [`ControllerDefinition`]s like any provider's.
//!
//! A controller is either started or *skipped with a reason* (its capability is missing, or a setting
//! turns it off): its definition says what it needs, so `leader-migration plan` can show it.

mod backoff;
mod node;
mod node_addresses;

/// [`node_addresses::desired_addresses`], for `crate::fuzzing`.
pub(crate) fn node_addresses(
    current: &[k8s_openapi::api::core::v1::NodeAddress],
    cloud: &[k8s_openapi::api::core::v1::NodeAddress],
    provided_ips: Option<&str>,
    initialization: bool,
) -> Result<Option<Vec<k8s_openapi::api::core::v1::NodeAddress>>, String> {
    let moment = if initialization {
        node_addresses::Moment::Initialization
    } else {
        node_addresses::Moment::Refresh
    };
    node_addresses::desired_addresses(current, cloud, provided_ips, moment).map_err(|e| e.to_string())
}
mod node_ipam;
mod node_lifecycle;
mod periodic;
mod route;
mod service;

use crate::cached::Cached;

pub use backoff::Backoff;
pub use node_ipam::{CLOUD_ALLOCATOR, NODE_IPAM_CONTROLLER, RANGE_ALLOCATOR};
pub use node_lifecycle::NodeDeletion;
pub use service::{MAX_PER_SWEEP, OrphanSweep};

use crate::config::ControllerSettings;
use crate::informers::SharedCache;
use crate::registry::{Capability, ControllerDefinition, ControllerRegistry};

impl ControllerRegistry {
    /// The framework's controllers: `cloud-node-controller`, `cloud-node-lifecycle-controller`,
    /// `service-lb-controller`, `node-route-controller`, and `node-ipam-controller` (off unless named),
    /// registered through [`ControllerRegistry::register`] as any provider's.
    pub fn builtin() -> ControllerRegistry {
        let mut registry = ControllerRegistry::empty();
        for definition in builtin() {
            registry
                .register(definition)
                .expect("the built-in controllers have distinct, well-formed names");
        }
        registry
    }
}

impl Default for ControllerRegistry {
    /// The framework's controllers.
    fn default() -> Self {
        ControllerRegistry::builtin()
    }
}

/// The four controllers of upstream's cloud-controller-manager, in start order, and `node-ipam-controller`
/// (off unless named).
fn builtin() -> Vec<ControllerDefinition> {
    vec![
        ControllerDefinition::new("cloud-node-controller", node::run)
            .requires(Capability::Instances)
            .reads(&[SharedCache::Nodes])
            .service_account("node-controller"),
        ControllerDefinition::new("cloud-node-lifecycle-controller", node_lifecycle::run)
            .requires(Capability::Instances)
            .reads(&[SharedCache::Nodes])
            .migrated_by_default()
            .service_account("node-controller"),
        ControllerDefinition::new("service-lb-controller", service::run)
            .requires(Capability::LoadBalancers)
            .reads(&[SharedCache::Nodes, SharedCache::Services])
            .migrated_by_default()
            .event_reporter("service-controller")
            .service_account("service-controller"),
        ControllerDefinition::new("node-route-controller", route::run)
            .requires_settings(routes_configured)
            .reads(&[SharedCache::Nodes])
            .requires(Capability::Routes)
            .migrated_by_default()
            .event_reporter("route_controller")
            .service_account("route-controller"),
        node_ipam::definition(),
    ]
}

/// `--configure-cloud-routes` and a `--cluster-cidr` to configure them in.
fn routes_configured(settings: &ControllerSettings) -> Result<(), kube_ccm_provider::Refused> {
    if !settings.configure_cloud_routes {
        Err("--configure-cloud-routes is false".into())
    } else if settings.cluster_cidrs.is_empty() {
        // Upstream exits at start-up here; skipping keeps the other controllers running.
        Err("--cluster-cidr is not set (routes are configured for pod CIDRs inside it)".into())
    } else {
        Ok(())
    }
}

/// Seconds since the object was created (for upstream's delay histograms).
pub(crate) fn age_seconds<K: Cached>(object: &K) -> Option<f64> {
    let created = object.identity().created()?.0;
    let age = jiff::Timestamp::now().duration_since(created);
    Some(age.as_secs_f64().max(0.0))
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    #[test]
    fn the_builtins_declare_the_caches_a_warm_standby_fills() {
        // Each reads nodes, the service controller services too.
        let reads: Vec<&[SharedCache]> = builtin().iter().map(|d| d.cache_reads()).collect();
        let nodes = &[SharedCache::Nodes][..];
        assert_eq!(
            reads,
            [
                nodes,
                nodes,
                &[SharedCache::Nodes, SharedCache::Services][..],
                nodes,
                nodes
            ]
        );
    }
}
