//! The contract between the framework and a cloud: implement [`CloudProvider`] (and the capabilities your
//! cloud has) and the controller manager does the rest.
//!
//! - [`CloudProvider`]: identity, initialisation, and optional capability accessors. A controller whose
//!   capability is missing is *skipped with a reason*, which is different from *failed*.
//! - [`InstancesV2`] (or the older [`Instances`] with [`Zones`]), [`LoadBalancer`], [`Routes`], [`Clusters`]:
//!   the capabilities. Instance look-ups have batch forms with per-node defaults, so a cloud that can answer
//!   many nodes in one call (EC2's DescribeInstances) overrides one method.
//! - [`CallContext`]: every call's deadline (never past the caller's lock), cancellation and caller.
//! - [`CloudError`]: `NotImplemented`, `InstanceNotFound`, `ImplementedElsewhere`, `Retry { after }`,
//!   `Throttled { after }`, `Timeout`, `Cancelled`, and the provider's own errors.
//! - [`RateBudget`]: the process's share of the cloud's rate limit, a turn per request
//!   ([`CallContext::acquire`]), with priorities and a pause when the cloud throttles.
//! - [`ProviderRegistry`]: name → factory, built explicitly by the binary; unknown and duplicate names are
//!   errors.
//! - [`service`]: what a `type: LoadBalancer` service asks for (source ranges, local traffic, health
//!   check, class), read as upstream's service helpers read it, for every provider's load balancers.
//! - [`flags`]: flags a provider (or a provider's controller) adds to the manager's command line; their
//!   values reach the provider in [`InitializeContext::flags`].
//! - [`SharedCaches`]: the process's caches of nodes and services, handed to the provider at
//!   initialisation (upstream's `InformerUser`), so it never watches the same objects a second time.
//! - [`Cidr`]: IPv4 and IPv6 networks; [`PodCidrs`]: the pod CIDRs a cloud assigns its instances, for
//!   the node-IPAM controller's cloud allocator.
//! - [`names`]: well-known taints, labels, annotations and finalizers.
//! - [`gcfg`]: reading cloud-configs in upstream's INI dialect (the AWS and GCE providers' format).

mod budget;
mod caches;
mod cidr;
mod classes;
mod context;
mod error;
mod fence;
pub mod flags;
pub mod gcfg;
mod instances;
mod load_balancer;
pub mod names;
mod pod_cidrs;
mod provider;
mod registry;
mod routes;
pub mod service;

pub use budget::{BudgetStats, MAX_PAUSE, MIN_PER_SECOND, Priority, RateBudget};
pub use caches::{CacheEvent, FixedCaches, NoCaches, SharedCaches};
pub use cidr::{Cidr, CidrError};
pub use classes::{InvalidClass, LoadBalancerClasses};
pub use context::{CallContext, CallObserver, LockValidity};
pub use error::{CloudError, Refused};
pub use fence::FencedStream;
pub use instances::{DEFAULT_BATCH_CONCURRENCY, InstanceMetadata, Instances, InstancesV2};
pub use load_balancer::{
    ClusterLoadBalancer, LoadBalancer, default_load_balancer_name, is_default_load_balancer_name,
};
pub use pod_cidrs::{ClusterStack, PodCidrs, PodCidrsError};
pub use provider::{CloudProvider, Clusters, InitializeContext, LeadingContext, RequestRate, Zone, Zones};
pub use registry::{ProviderFactory, ProviderRegistry, ProviderRegistryError};
pub use routes::{Route, Routes};
