//! A fake cloud, usable from the real binary (`--cloud-provider=fake --cloud-config=FILE`).
//!
//! The cloud ([`FakeCloud`]) holds instances (provider ID, type, zone, region, addresses, and a state:
//! running, stopped or terminated), load balancers and routes, with latency, error-rate and hang-rate
//! knobs, and logs every change it applies with the caller's `User-Agent` (for the overlap audit).
//! Several controller-manager processes share one cloud through [`FakeCloudServer`]; a provider whose
//! cloud-config names an `endpoint` talks to it over HTTP, one that lists `instances` holds its own cloud
//! in-process. Tests and the demo change the cloud while it runs with [`AdminRequest`]s (stop or terminate
//! an instance, add one, change the knobs).
//!
//! Instance look-ups are batched natively (one call, one latency, for many nodes), like EC2's
//! DescribeInstances.

mod cloud;
mod config;
mod model;
mod protocol;
mod provider;
mod server;

pub use cloud::{FakeCloud, RateLimit};
pub use config::{ConfigError, FakeCloudConfig};
pub use model::{CloudWrite, FakeAddress, FakeInstance, FakeLoadBalancer, FakeRoute, InstanceState, Knobs};
pub use protocol::{AdminRequest, CloudRequest, CloudResponse, HostSet, NodeRef};
pub use provider::{FakeProvider, PROVIDER_NAME, THROTTLED_RETRY_AFTER, factory};
pub use server::{FakeCloudClient, FakeCloudServer};
