//! The AWS cloud provider, on the AWS SDK for Rust (`--cloud-provider=aws`).
//!
//! Built so far: upstream's INI cloud-config ([`config`]), the SDK clients with the standard credential
//! and region chains, endpoint overrides, timeouts and one TLS stack ([`client`]), EC2 instances for the
//! node controllers, batched: one `DescribeInstances` answers up to 200 nodes ([`instances`]), VPC
//! routes ([`routes`]), and classic ELBs and NLBs for LoadBalancer services ([`load_balancer`],
//! [`load_balancer::network`]), and upstream's tagging controller ([`tagging`], off unless named).
//!
//! AWS errors map to the framework's: throttling (`RequestLimitExceeded`, `Throttling…`) to
//! `CloudError::Throttled` after [`THROTTLED_RETRY_AFTER`], once the SDK's own back-off has run out, which
//! pauses the process's budget.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use kube_ccm_provider::{
    CloudError, CloudProvider, InitializeContext, InstancesV2, LeadingContext, LoadBalancer, Refused, Routes,
};
use tokio::sync::Mutex;

pub mod batch;
pub mod client;
pub mod config;
mod connector;
pub mod fargate;
pub mod instances;
pub mod load_balancer;
mod node_index;
pub mod routes;
pub mod tagging;
pub mod topology;

pub use client::RequestCounter;
pub use config::{CloudConfig, ConfigError};

/// `--cloud-provider=aws`.
pub const PROVIDER_NAME: &str = "aws";
/// How long a controller waits after the account's rate limit refused a request.
pub const THROTTLED_RETRY_AFTER: Duration = Duration::from_secs(10);

/// The provider.
pub struct AwsProvider {
    config: CloudConfig,
    region: String,
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancing::Client,
    elbv2: aws_sdk_elasticloadbalancingv2::Client,
    requests: Arc<RequestCounter>,
    zone_ids: Mutex<HashMap<String, String>>,
    route_table: Mutex<Option<String>>,
    describer: batch::Describer,
    topology: topology::Topology,
    nodes: Arc<node_index::NodeIndex>,
}

impl std::fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsProvider")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// The provider's own controllers, for a binary's controller registry: `tagging-controller`.
pub fn controllers() -> Vec<kube_ccm_runtime::ControllerDefinition> {
    vec![tagging::definition()]
}

/// Builds the provider from `--cloud-config` (upstream's INI; optional, as upstream).
pub async fn factory(
    config: Option<Vec<u8>>,
) -> Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>> {
    let text = String::from_utf8(config.unwrap_or_default()).map_err(|_| "cloud-config: not UTF-8 text")?;
    let parsed = CloudConfig::parse(&text)?;
    for warning in &parsed.warnings {
        tracing::warn!("cloud-config {warning}");
    }
    let sdk = client::sdk_config(&parsed.config).await?;
    Ok(Arc::new(AwsProvider::new(parsed.config, &sdk)))
}

impl AwsProvider {
    /// A provider for `config` on the SDK configuration `sdk` (which gives the region and credentials).
    pub fn new(config: CloudConfig, sdk: &aws_config::SdkConfig) -> AwsProvider {
        let requests = Arc::new(RequestCounter::default());
        let http = connector::FencedHttpClient::new();
        let ec2 = client::ec2(sdk, &config, &requests, &http);
        let elb = client::elb(sdk, &config, &requests, &http);
        let elbv2 = client::elbv2(sdk, &config, &requests, &http);
        let region = sdk.region().map(|r| r.as_ref().to_owned()).unwrap_or_default();
        let config_pattern = config.supported_topology_instance_type_pattern.clone();
        AwsProvider {
            config,
            region,
            ec2,
            elb,
            elbv2,
            requests,
            zone_ids: Mutex::new(HashMap::new()),
            route_table: Mutex::new(None),
            describer: batch::Describer::default(),
            topology: topology::Topology::new(&config_pattern)
                .expect("SupportedTopologyInstanceTypePattern is checked when the cloud-config is read"),
            nodes: Arc::default(),
        }
    }

    /// The AWS requests this provider has sent, by `service:Operation`.
    pub fn requests(&self) -> &Arc<RequestCounter> {
        &self.requests
    }

    /// The configuration.
    pub fn config(&self) -> &CloudConfig {
        &self.config
    }
}

#[async_trait]
impl CloudProvider for AwsProvider {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    /// Keeps the manager's shared caches (upstream's `SetInformers`), read while leading.
    async fn initialize(&self, context: InitializeContext) -> Result<(), CloudError> {
        self.nodes.set_caches(context.caches);
        Ok(())
    }

    /// Follows the node cache while leading: routes name their nodes as upstream names them.
    async fn start_leading(&self, context: LeadingContext) -> Result<(), CloudError> {
        self.nodes.follow(context.stop);
        Ok(())
    }

    fn check_provider_id(&self, provider_id: &str) -> Result<(), Refused> {
        instances::check_provider_id(provider_id)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }

    /// A cluster ID (`KubernetesClusterID` or `KubernetesClusterTag`) is required, as upstream, unless
    /// `--allow-untagged-cloud`: name-based look-ups only see this cluster's instances.
    fn has_cluster_id(&self) -> bool {
        !self.config.cluster_id().is_empty()
    }

    /// EC2's bucket for non-mutating requests (`Describe*`: 20 a second, 100 at once, per account and
    /// region), the requests a manager mostly sends; mutating ones have smaller buckets of their own, which
    /// the pause on `RequestLimitExceeded` covers.
    fn default_request_rate(&self) -> Option<kube_ccm_provider::RequestRate> {
        Some(kube_ccm_provider::RequestRate {
            per_second: 20.0,
            burst: 100,
        })
    }
}

/// The zone-ID label (`use1-az1`), as upstream.
pub const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";
/// EC2 takes at most this many values per filter.
pub(crate) const FILTER_VALUES: usize = 200;

/// An EC2 filter on `name` with `values` (at most [`FILTER_VALUES`]).
pub(crate) fn filter(name: &str, values: &[String]) -> aws_sdk_ec2::types::Filter {
    aws_sdk_ec2::types::Filter::builder()
        .name(name)
        .set_values(Some(values.to_vec()))
        .build()
}

/// An AWS failure (EC2, ELB) as the framework's error: throttling becomes `Throttled` after [`THROTTLED_RETRY_AFTER`].
pub(crate) fn aws_error<E, R>(error: SdkError<E, R>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    let code = error.code().unwrap_or_default().to_owned();
    let message = DisplayErrorContext(&error).to_string();
    if matches!(
        code.as_str(),
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "TooManyRequestsException"
    ) {
        return CloudError::Throttled {
            after: THROTTLED_RETRY_AFTER,
            message,
        };
    }
    CloudError::provider(message)
}
