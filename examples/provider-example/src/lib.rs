//! An example cloud provider for the framework, small enough to read in one sitting: a cloud kept in one
//! JSON file ([`cloud`]), with instances, load balancers and routes, a provider-specific controller
//! ([`tagging`]) and an admission webhook ([`webhooks`]). Its binary is `example-cloud-controller-manager`; `docs/provider-authoring.md` walks
//! through it.

use std::path::PathBuf;
use std::sync::Arc;

use kube_ccm::provider::{CloudProvider, InstancesV2, LoadBalancer, PodCidrs, Routes};
use kube_ccm::runtime::{RegistrationError, Registry};
use serde::Deserialize;

pub mod cloud;
mod instances;
mod load_balancer;
mod routes;
pub mod tagging;
pub mod webhooks;

use cloud::FileCloud;

/// `--cloud-provider=example`.
pub const PROVIDER_NAME: &str = "example";

// ANCHOR: config
/// `--cloud-config`: JSON, `{"state": "/var/lib/example-cloud/state.json", "region": "example-1"}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The file the cloud is kept in.
    pub state: PathBuf,
    /// The region every zone belongs to.
    #[serde(default = "default_region")]
    pub region: String,
}

fn default_region() -> String {
    "example-1".to_owned()
}

impl Config {
    /// Parses `--cloud-config`; the error names the field and position.
    pub fn parse(bytes: &[u8]) -> Result<Config, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("--cloud-config: {e}"))
    }
}
// ANCHOR_END: config

// ANCHOR: provider
/// The provider: the cloud, and what the framework asks of it.
#[derive(Debug)]
pub struct ExampleCloud {
    cloud: FileCloud,
    region: String,
}

impl CloudProvider for ExampleCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    // Each capability the cloud has; a controller whose capability is missing is skipped with a reason.
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }

    fn pod_cidrs(&self) -> Option<&dyn PodCidrs> {
        Some(self)
    }
}
// ANCHOR_END: provider

// ANCHOR: register
/// Builds the provider from `--cloud-config` (required: it names the state file).
pub async fn factory(
    config: Option<Vec<u8>>,
) -> Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>> {
    let config =
        Config::parse(&config.ok_or("--cloud-config is required: it names the cloud's state file")?)?;
    if !config.state.is_file() {
        return Err(format!("--cloud-config: state {} is not a file", config.state.display()).into());
    }
    Ok(Arc::new(ExampleCloud {
        cloud: FileCloud::new(config.state),
        region: config.region,
    }))
}

/// Registers the provider, its controller and its webhook with a binary's registry.
pub fn register(registry: &mut Registry) -> Result<(), RegistrationError> {
    registry.register_provider(PROVIDER_NAME, factory)?;
    registry.register_controller(tagging::definition())?;
    registry.register_webhook(webhooks::definition())
}
// ANCHOR_END: register

impl ExampleCloud {
    fn provider_id(instance: &cloud::Instance) -> String {
        format!("{PROVIDER_NAME}://{}/{}", instance.zone, instance.id)
    }

    /// The instance a provider ID names (`example://<zone>/<id>`), or `None` for another scheme.
    fn instance_id(provider_id: &str) -> Option<&str> {
        provider_id.strip_prefix("example://")?.rsplit('/').next()
    }
}
