//! The cloud-controller-manager runtime: a [`cloud_provider::CloudProvider`] plus leader migration make a
//! runnable [`Manager`].
//!
//! - [`Manager`]: plans where each controller runs ([`Manager::plan`], with skip reasons), then runs them:
//!   without leader election all at once; with it, under the main and migration locks of
//!   [`leadermigration::scopes`]. A controller that a lock governs writes through a client fenced on that
//!   lock.
//! - The controllers: `cloud-node-controller`, `cloud-node-lifecycle-controller`, `service-lb-controller`,
//!   `node-route-controller` (`node-ipam-controller` is known but has no implementation yet).
//! - [`ClientFactory`]: per-controller clients with `User-Agent` attribution and client-go's rate limits.
//! - [`Health`] and [`Metrics`]: what the serving endpoints expose.

mod batch;
mod cached_node;
mod cidr;
mod client;
mod compact;
mod config;
mod controllers;
mod health;
mod informers;
mod metrics;
mod runtime;

pub use cidr::{Cidr, CidrError};
pub use client::{ClientError, ClientFactory, Fence, Fenced};
pub use config::{ControllerSettings, LeaderElectionConfig, ManagerConfig};
pub use health::{Health, Verdict};
pub use metrics::Metrics;
pub use runtime::{Manager, ManagerError, PlannedController, summarize};
