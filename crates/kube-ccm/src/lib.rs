//! Build a Kubernetes cloud-controller-manager for your cloud.
//!
//! Implement [`CloudProvider`] (and the parts of it your cloud has: [`InstancesV2`], [`LoadBalancer`],
//! [`Routes`]), register it, and call [`main`]: the result is a cloud-controller-manager with upstream's
//! controllers (node, node-lifecycle, service load balancers, routes), flags, Leases, Events, health checks
//! and metric names, leader election, and Kubernetes Leader Migration built in.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use kube_ccm::{CloudProvider, Registry};
//!
//! /// Your provider, built from the bytes of `--cloud-config` (if given).
//! async fn my_cloud(
//!     config: Option<Vec<u8>>,
//! ) -> Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>> {
//!     # unimplemented!("a client of your cloud, configured by {config:?}")
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     let mut registry = Registry::new(); // the framework's controllers
//!     // Your binary's name and version: in --help, --version, User-Agents and kubernetes_build_info.
//!     let named = registry.set_binary("mycloud-cloud-controller-manager", env!("CARGO_PKG_VERSION"));
//!     if let Err(error) = named.and_then(|()| registry.register_provider("mycloud", my_cloud)) {
//!         eprintln!("error: {error}");
//!         return std::process::ExitCode::FAILURE;
//!     }
//!     kube_ccm::main(registry) // flags, leader election and migration, serving, signals
//! }
//! ```
//!
//! A whole provider (instances, load balancers, routes, a controller and webhooks of its own) is
//! `examples/provider-example` in this framework's repository, built on this crate alone.
//!
//! In `Cargo.toml`, with the Kubernetes API version your binary speaks (exactly one of `earliest`,
//! `latest`, `v1_33` … `v1_37`; k8s-openapi's rule is that only the final binary picks it):
//!
//! ```toml
//! [dependencies]
//! kube-ccm = { version = "0.1", features = ["earliest"] }
//! ```
//!
//! The pieces, each its own crate of the `kube-ccm` family, are here under one name, with the versions of
//! [`kube`] and [`k8s_openapi`] their signatures use:
//!
//! - [`provider`] (`kube-ccm-provider`): the traits, their types and errors, well-known names.
//! - [`runtime`] (`kube-ccm-runtime`): the controller registry, the controllers, the manager.
//! - [`leadermigration`] (`kube-ccm-leadermigration`): configuration, validation, the elector.
//! - [`main`] (`kube-ccm-cli`): the command line the binary runs.
//! - Features `aws`, `gce`, `fake`: the bundled providers, as [`aws`], [`gce`] and [`fake`].

pub use kube_ccm_cli::main;
pub use kube_ccm_runtime::{RegistrationError, Registry};

pub use kube_ccm_provider::{
    CallContext, CloudError, CloudProvider, ClusterStack, InstanceMetadata, Instances, InstancesV2,
    LoadBalancer, LoadBalancerClasses, PodCidrs, PodCidrsError, Route, Routes, Zone, Zones,
};

/// `#[async_trait]`, as the traits are declared with it.
pub use async_trait::async_trait;

/// Leader Migration: configuration, validation, filter and elector (`kube-ccm-leadermigration`).
pub use kube_ccm_leadermigration as leadermigration;
/// The traits a cloud provider implements, their types and errors (`kube-ccm-provider`).
pub use kube_ccm_provider as provider;
/// The controllers, their registry and the manager that runs them (`kube-ccm-runtime`).
pub use kube_ccm_runtime as runtime;

/// The Kubernetes API types this framework's signatures use.
pub use k8s_openapi;
/// The Kubernetes client this framework's signatures use.
pub use kube;

/// Registers the bundled providers this crate was built with (features `fake`, `aws`, `gce`), with the
/// controllers and flags each brings; without those features, nothing.
pub fn register_bundled(registry: &mut Registry) -> Result<(), RegistrationError> {
    #[cfg(feature = "fake")]
    registry.register_provider(kube_ccm_fake::PROVIDER_NAME, kube_ccm_fake::factory)?;
    #[cfg(feature = "aws")]
    {
        registry.register_provider(kube_ccm_aws::PROVIDER_NAME, kube_ccm_aws::factory)?;
        for controller in kube_ccm_aws::controllers() {
            registry.register_controller(controller)?;
        }
    }
    #[cfg(feature = "gce")]
    {
        registry.register_provider(kube_ccm_gce::PROVIDER_NAME, kube_ccm_gce::factory)?;
        registry.register_provider_flags(kube_ccm_gce::PROVIDER_NAME, kube_ccm_gce::flags::FLAGS)?;
    }
    #[cfg(not(any(feature = "fake", feature = "aws", feature = "gce")))]
    let _ = registry;
    Ok(())
}

/// The AWS provider (`kube-ccm-aws`).
#[cfg(feature = "aws")]
pub use kube_ccm_aws as aws;
/// The fake cloud, for tests (`kube-ccm-fake`).
#[cfg(feature = "fake")]
pub use kube_ccm_fake as fake;
/// The GCE provider (`kube-ccm-gce`).
#[cfg(feature = "gce")]
pub use kube_ccm_gce as gce;
