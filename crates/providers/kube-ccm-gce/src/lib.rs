//! The GCE cloud provider, on `google-cloud-compute-v1` (`--cloud-provider=gce`).
//!
//! Built so far: upstream's `gce.conf` ([`config`]), the Compute clients with Application Default
//! Credentials, an endpoint override, an explicit retry policy and timeouts ([`client`]), instances for
//! the node controllers, batched: one `instances.aggregatedList` answers up to 100 nodes ([`instances`]),
//! cluster routes ([`routes`]), external and internal load balancers ([`load_balancer`]), upstream's
//! flags ([`flags`]), and the pod CIDRs of instances' alias IP ranges for the framework's
//! `node-ipam-controller` ([`pod_cidrs`]).
//!
//! Compute errors map to the framework's: rate limits (HTTP 429, `RESOURCE_EXHAUSTED`, 403
//! `rateLimitExceeded`) to `CloudError::Throttled` after [`RATE_LIMITED_RETRY_AFTER`], after the
//! client's own retries, which pauses the process's budget; an operation's `QUOTA_EXCEEDED` to a retry.

use parking_lot::RwLock;
use std::sync::Arc;
use std::time::Duration;

use google_cloud_compute_v1::model;
use google_cloud_gax::error::Error as GaxError;
use google_cloud_gax::error::rpc::{Code, StatusDetails};
use kube_ccm_provider::{
    CloudError, CloudProvider, InitializeContext, InstancesV2, LeadingContext, LoadBalancer, PodCidrs,
    Refused, Routes,
};

pub mod client;
pub mod config;
pub mod flags;
pub mod instances;
pub mod load_balancer;
pub mod metadata;
pub mod pod_cidrs;
pub mod routes;

pub use config::CloudConfig;

/// `--cloud-provider=gce`.
pub const PROVIDER_NAME: &str = "gce";
/// How long a controller waits after the project's rate limit or quota refused a request.
pub const RATE_LIMITED_RETRY_AFTER: Duration = Duration::from_secs(10);

/// The provider.
pub struct GceProvider {
    config: CloudConfig,
    clients: client::Clients,
    /// The cluster ID for load balancers' shared names (read when leading starts, or at first use).
    cluster_id: RwLock<Option<String>>,
    /// The leading client, to read the cluster ID with.
    leading: RwLock<Option<kube::Client>>,
    /// `--cloud-provider-gce-lb-src-cidrs` (its default until [`CloudProvider::initialize`]).
    lb_source_ranges: RwLock<Vec<String>>,
    /// `--cloud-provider-gce-l7lb-src-cidrs`.
    l7_lb_source_ranges: RwLock<Vec<String>>,
}

impl std::fmt::Debug for GceProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GceProvider")
            .field("project", &self.config.project_id)
            .field("local_zone", &self.config.local_zone)
            .finish_non_exhaustive()
    }
}

/// Builds the provider from `--cloud-config` (`gce.conf`; required: it names the project and zone).
pub async fn factory(
    config: Option<Vec<u8>>,
) -> Result<Arc<dyn CloudProvider>, Box<dyn std::error::Error + Send + Sync>> {
    let text = match config {
        Some(bytes) => String::from_utf8(bytes).map_err(|_| "cloud-config: not UTF-8 text")?,
        None => String::new(),
    };
    let mut parsed = CloudConfig::parse(&text)?;
    for warning in &parsed.warnings {
        tracing::warn!("cloud-config {warning}");
    }
    if parsed.config.project_id.is_empty() || parsed.config.local_zone.is_empty() {
        metadata::fill(&mut parsed.config, &metadata::host()).await?;
    }
    Ok(Arc::new(GceProvider::new(parsed.config).await?))
}

impl GceProvider {
    /// A provider for `config` (builds its clients; with Application Default Credentials unless the
    /// endpoint is plain HTTP).
    ///
    /// `config` must be complete ([`CloudConfig::check`]; [`metadata::fill`] completes it).
    pub async fn new(config: CloudConfig) -> Result<GceProvider, Box<dyn std::error::Error + Send + Sync>> {
        config.check()?;
        let clients = client::Clients::new(&config).await?;
        Ok(GceProvider {
            config,
            clients,
            cluster_id: RwLock::new(None),
            leading: RwLock::new(None),
            lb_source_ranges: RwLock::new(default_ranges(flags::DEFAULT_LB_SOURCE_RANGES)),
            l7_lb_source_ranges: RwLock::new(default_ranges(flags::DEFAULT_L7_LB_SOURCE_RANGES)),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CloudConfig {
        &self.config
    }

    /// The cluster ID, read from the cluster once (with the leading client).
    pub(crate) async fn load_cluster_id(&self) -> Result<String, CloudError> {
        if let Some(id) = self.cluster_id.read().clone() {
            return Ok(id);
        }
        let client = self
            .leading
            .read()
            .clone()
            .ok_or_else(|| CloudError::provider("the cluster ID is read once this process leads"))?;
        let id = cluster_id(&client).await.map_err(|e| {
            CloudError::provider(format!("the cluster ID (ConfigMap kube-system/ingress-uid): {e}"))
        })?;
        tracing::info!(cluster_id = %id, "gce: cluster ID");
        self.set_cluster_id(&id);
        Ok(id)
    }

    /// The ranges opened to Google's L3/L4 proxies and health checkers
    /// (`--cloud-provider-gce-lb-src-cidrs`).
    pub fn load_balancer_source_ranges(&self) -> Vec<String> {
        self.lb_source_ranges.read().clone()
    }

    /// The ranges of Google's L7 proxies and health checkers (`--cloud-provider-gce-l7lb-src-cidrs`), for
    /// ingress controllers built on this provider.
    pub fn l7_load_balancer_source_ranges(&self) -> Vec<String> {
        self.l7_lb_source_ranges.read().clone()
    }

    /// Sets the cluster ID (as [`CloudProvider::start_leading`] does from the cluster), for tests and tools.
    pub fn set_cluster_id(&self, id: &str) {
        *self.cluster_id.write() = Some(id.to_owned());
    }
}

fn default_ranges(text: &str) -> Vec<String> {
    let items: Vec<&str> = text.split(',').collect();
    flags::source_ranges(&items).expect("the defaults are CIDRs")
}

/// The cluster ID in ConfigMap `kube-system/ingress-uid` (`provider-uid`, else `uid`), made with a random
/// 16-hex-digit ID under both keys when missing, as upstream's `getOrInitialize`.
pub async fn cluster_id(client: &kube::Client) -> Result<String, kube::Error> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "kube-system");
    let read = |map: &ConfigMap| {
        let data = map.data.as_ref()?;
        data.get("provider-uid")
            .or_else(|| data.get("uid"))
            .filter(|id| !id.is_empty())
            .cloned()
    };
    if let Some(id) = maps
        .get_opt(load_balancer::CLUSTER_ID_CONFIG_MAP)
        .await?
        .as_ref()
        .and_then(read)
    {
        return Ok(id);
    }
    let id: String = uuid::Uuid::new_v4()
        .simple()
        .to_string()
        .chars()
        .take(16)
        .collect();
    let map: ConfigMap = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(load_balancer::CLUSTER_ID_CONFIG_MAP.to_owned()),
            namespace: Some("kube-system".to_owned()),
            ..Default::default()
        },
        data: Some(
            [
                ("uid".to_owned(), id.clone()),
                ("provider-uid".to_owned(), id.clone()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    match maps.create(&kube::api::PostParams::default(), &map).await {
        Ok(_) => Ok(id),
        // Another process made it first: its ID wins.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let map = maps.get(load_balancer::CLUSTER_ID_CONFIG_MAP).await?;
            Ok(read(&map).unwrap_or(id))
        }
        Err(error) => Err(error),
    }
}

#[async_trait::async_trait]
impl CloudProvider for GceProvider {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    fn check_provider_id(&self, provider_id: &str) -> Result<(), Refused> {
        instances::parse_provider_id(provider_id)
            .map(drop)
            .ok_or_else(|| Refused::new("not of the form gce://<project>/<zone>/<instance>"))
    }

    /// Takes the provider's flags ([`flags`]): checked already, a flag the binary does not declare keeps
    /// its default.
    async fn initialize(&self, context: InitializeContext) -> Result<(), CloudError> {
        pod_cidrs::no_gke_features(&context.flags)
            .map_err(|refused| CloudError::provider(refused.to_string()))?;
        for (flag, ranges) in [
            (flags::LB_SOURCE_RANGES, &self.lb_source_ranges),
            (flags::L7_LB_SOURCE_RANGES, &self.l7_lb_source_ranges),
        ] {
            if let Some(value) = context.flags.get(flag) {
                let parsed = flags::source_ranges(value.items())
                    .map_err(|problem| CloudError::provider(format!("--{flag}: {problem}")))?;
                *ranges.write() = parsed;
            }
        }
        Ok(())
    }

    /// Reads (or makes) the cluster ID the load balancers' shared names carry. A failure is logged, not
    /// fatal: the nodes and routes need no cluster ID, and load balancers try again when they need it.
    async fn start_leading(&self, context: LeadingContext) -> Result<(), CloudError> {
        *self.leading.write() = Some(context.client);
        if let Err(error) = self.load_cluster_id().await {
            tracing::warn!(%error, "gce: the cluster ID is not read yet; load balancers will try again");
        }
        Ok(())
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn pod_cidrs(&self) -> Option<&dyn PodCidrs> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }

    /// Always true, as upstream: the cluster's identity lives in the cluster (names carry the cluster
    /// name), not in cloud tags.
    fn has_cluster_id(&self) -> bool {
        true
    }

    /// Compute's classic per-project quotas are 1,500 requests a minute for reads and for global
    /// mutations; 20 a second (1,200 a minute) leaves room for the project's other clients.
    fn default_request_rate(&self) -> Option<kube_ccm_provider::RequestRate> {
        Some(kube_ccm_provider::RequestRate {
            per_second: 20.0,
            burst: 100,
        })
    }
}

/// Whether Compute answered 404 (directly, or as a failed operation).
pub(crate) fn is_not_found(error: &GaxError) -> bool {
    error.http_status_code() == Some(404) || error.status().is_some_and(|s| s.code == Code::NotFound)
}

/// Whether Compute answered 409: the resource exists already.
pub(crate) fn is_conflict(error: &GaxError) -> bool {
    error.http_status_code() == Some(409) || error.status().is_some_and(|s| s.code == Code::AlreadyExists)
}

/// Whether the project's rate limit or a quota refused the request: 429 or `RESOURCE_EXHAUSTED`, or
/// Compute's 403 with the reason `rateLimitExceeded` (legacy `errors`, which the client reads into
/// `ErrorInfo` details only when there are no others), `userRateLimitExceeded`, or `RATE_LIMIT_EXCEEDED`
/// (an AIP-193 `ErrorInfo`).
fn is_rate_limited(error: &GaxError) -> bool {
    const REASONS: [&str; 3] = [
        "rateLimitExceeded",
        "userRateLimitExceeded",
        "RATE_LIMIT_EXCEEDED",
    ];
    if error.http_status_code() == Some(429)
        || error.status().is_some_and(|s| s.code == Code::ResourceExhausted)
    {
        return true;
    }
    if error.http_status_code() != Some(403) {
        return false;
    }
    let in_details = error.status().is_some_and(|status| {
        status.details.iter().any(|detail| {
            matches!(detail, StatusDetails::ErrorInfo(info) if REASONS.contains(&info.reason.as_str()))
        })
    });
    in_details
        || error.http_payload().is_some_and(|body| {
            let body = String::from_utf8_lossy(body);
            REASONS.iter().any(|reason| body.contains(reason))
        })
}

/// A Compute failure as the framework's error: rate limits become `Throttled` after
/// [`RATE_LIMITED_RETRY_AFTER`]; `what` says which request failed.
pub(crate) fn gce_error(what: &str, error: GaxError) -> CloudError {
    if is_rate_limited(&error) {
        return CloudError::Throttled {
            after: RATE_LIMITED_RETRY_AFTER,
            message: format!("{what}: {error}"),
        };
    }
    CloudError::provider(format!("{what}: {error}"))
}

/// A write's outcome: the request failed, or its operation finished with an error.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// The request (or a poll) failed.
    Request(GaxError),
    /// The operation is done, with this error.
    Failed {
        /// `httpErrorStatusCode`.
        http: Option<i32>,
        /// The first error's code (`QUOTA_EXCEEDED`, `RESOURCE_ALREADY_EXISTS`).
        code: String,
        /// What Compute said.
        message: String,
    },
}

impl WriteError {
    /// The result of awaiting an operation (the client's poller returns a failed operation as `Ok`).
    pub(crate) fn check(result: Result<model::Operation, GaxError>) -> Result<(), WriteError> {
        let operation = result.map_err(WriteError::Request)?;
        let first = operation.error.as_ref().and_then(|e| e.errors.first());
        if first.is_none() && operation.http_error_status_code.is_none_or(|s| s < 400) {
            return Ok(());
        }
        Err(WriteError::Failed {
            http: operation.http_error_status_code,
            code: first.and_then(|e| e.code.clone()).unwrap_or_default(),
            message: first
                .and_then(|e| e.message.clone())
                .or(operation.http_error_message)
                .unwrap_or_default(),
        })
    }

    /// The resource exists already (409).
    pub(crate) fn is_conflict(&self) -> bool {
        match self {
            WriteError::Request(e) => is_conflict(e),
            WriteError::Failed { http, code, .. } => *http == Some(409) || code.contains("ALREADY_EXISTS"),
        }
    }

    /// There is no such resource (404).
    pub(crate) fn is_not_found(&self) -> bool {
        match self {
            WriteError::Request(e) => is_not_found(e),
            WriteError::Failed { http, code, .. } => *http == Some(404) || code.contains("NOT_FOUND"),
        }
    }

    /// Another resource uses it (Compute's 400 `resourceInUseByAnotherResource`, "… is already being
    /// used by …"): a delete that must leave it.
    pub(crate) fn is_in_use(&self) -> bool {
        match self {
            WriteError::Request(e) => {
                e.http_payload()
                    .is_some_and(|b| String::from_utf8_lossy(b).contains("resourceInUseByAnotherResource"))
                    || e.to_string().contains("being used by")
            }
            WriteError::Failed { code, message, .. } => {
                code.contains("RESOURCE_IN_USE") || message.contains("being used by")
            }
        }
    }

    /// The framework's error for it; `what` names the request.
    pub(crate) fn into_cloud(self, what: &str) -> CloudError {
        match self {
            WriteError::Request(e) => gce_error(what, e),
            WriteError::Failed { http, code, message } => {
                let message = format!(
                    "{what}: operation failed: {code} {message} (HTTP {})",
                    http.unwrap_or_default()
                );
                if http == Some(429) || code == "RATE_LIMIT_EXCEEDED" {
                    CloudError::Throttled {
                        after: RATE_LIMITED_RETRY_AFTER,
                        message,
                    }
                } else if code == "QUOTA_EXCEEDED" {
                    // A resource quota, not the API's rate: this write waits, the others go on.
                    CloudError::Retry {
                        after: RATE_LIMITED_RETRY_AFTER,
                        message,
                    }
                } else {
                    CloudError::provider(message)
                }
            }
        }
    }
}

/// The last path component of a Compute URL (`…/zones/us-central1-a` → `us-central1-a`).
pub(crate) fn last_component(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}
