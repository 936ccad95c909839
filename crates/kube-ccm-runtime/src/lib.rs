//! The cloud-controller-manager runtime: a [`kube_ccm_provider::CloudProvider`], a [`ControllerRegistry`] and
//! leader migration make a runnable [`Manager`].
//!
//! - [`Registry`]: what a binary can run: cloud providers by name and [`ControllerDefinition`]s. The
//!   framework's controllers (`cloud-node-controller`, `cloud-node-lifecycle-controller`,
//!   `service-lb-controller`, `node-route-controller`, `node-ipam-controller`) are registered through the
//!   same API as a provider's own.
//! - [`Manager`]: plans where each controller runs ([`Manager::plan`], with skip reasons), then runs them:
//!   without leader election all at once; with it, under the main and migration locks of
//!   [`kube_ccm_leadermigration::scopes`].
//! - [`ControllerContext`]: what a running controller gets: its own client (named in the `User-Agent`,
//!   rate-limited, fenced on its lock), the provider, the shared caches ([`Informer`] of [`CachedNode`]
//!   and of [`Compact`] services), Events and stop/started signals.
//! - [`Health`] and [`Metrics`]: what the serving endpoints expose.

mod batch;
mod binary;
mod cached;
mod cached_node;
mod client;
mod compact;
mod config;
mod context;
mod controllers;
mod events;
mod exposition;
mod health;
mod informers;
mod instances;
mod metrics;
mod plan;
mod process_metrics;
mod registry;
pub mod runner;
mod runtime;
pub mod service_accounts;
mod transport;
pub mod webhooks;
mod workqueue;
pub mod written;

pub use binary::Binary;
pub use cached::{Cached, Identity, Referable};
pub use cached_node::CachedNode;
pub use client::{ClientError, ClientFactory, Deadline, DeadlineExceeded, Fenced, Stopping};
pub use compact::Compact;
pub use config::{ControllerSettings, LeaderElectionConfig, LeaseClash, ManagerConfig};
pub use context::{ControllerContext, event_reference};
pub use controllers::{
    Backoff, CLOUD_ALLOCATOR, MAX_PER_SWEEP, NODE_IPAM_CONTROLLER, NodeDeletion, OrphanSweep, RANGE_ALLOCATOR,
};
pub use exposition::metric_reference;
pub use health::{Health, Verdict};
pub use informers::{Cache, Informer, SharedCache};
/// Flags a binary's own controllers add to the command line (as upstream's AWS manager adds `--tags`), declared
/// as providers declare theirs.
pub use kube_ccm_provider::flags::{Flag, FlagKind, FlagValue, FlagValues};
pub use kube_ccm_provider::{Cidr, CidrError};
pub use metrics::{BuildInfo, Metrics};
pub use plan::{PlannedController, plan_controllers, summarize};
pub use registry::{
    Capability, ControllerDefinition, ControllerRegistry, FlagsCheck, RegistrationError, Registry,
    SettingsCheck, SettingsPredicate,
};
pub use runner::{Action, Runner};
pub use runtime::{Manager, ManagerError};
pub use transport::{Fence, HTTP_SPAN_TARGET};
pub use workqueue::{WorkQueue, Working};
pub use written::Written;

/// The parsers of outside input that `fuzz/` drives, reached from there. Not an API: hidden, and free to
/// change.
#[doc(hidden)]
pub mod fuzzing {
    use k8s_openapi::api::core::v1::NodeAddress;

    /// The addresses a node gets from the cloud's and `alpha.kubernetes.io/provided-node-ip`, at
    /// initialisation or on a refresh: `Ok(None)` leaves them as they are; an error names the annotation.
    pub fn node_addresses(
        current: &[NodeAddress],
        cloud: &[NodeAddress],
        provided_ips: Option<&str>,
        initialization: bool,
    ) -> Result<Option<Vec<NodeAddress>>, String> {
        crate::controllers::node_addresses(current, cloud, provided_ips, initialization)
    }
}
