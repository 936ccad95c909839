//! The Compute clients: Application Default Credentials (none for a plain-HTTP endpoint), the
//! `api-endpoint` override, and an explicit retry policy, attempt timeout and operation polling.
//!
//! Every request names its caller: `Attributed::attributed` gives it the calling controller's
//! `User-Agent` (`<component>/<version> (<os>/<arch>) <identity>/<controller>`, the one its Kubernetes
//! requests carry), so Cloud Audit Logs' `callerSuppliedUserAgent` says which replica and controller
//! made a change.
//!
//! The framework's deadline ([`kube_ccm_provider::CallContext`]) bounds every call as a whole; these bound
//! the client's own retries inside it.

use std::time::Duration;

use google_cloud_auth::credentials::{self, Credentials};
use google_cloud_compute_v1::client::{
    Addresses, Firewalls, ForwardingRules, HealthChecks, HttpHealthChecks, InstanceGroups, Instances,
    RegionBackendServices, Routes, Subnetworks, TargetPools,
};
use google_cloud_gax::exponential_backoff::ExponentialBackoffBuilder;
use google_cloud_gax::options::RequestOptionsBuilder;
use google_cloud_gax::retry_policy::{Aip194Strict, RetryPolicyExt};

use crate::config::CloudConfig;

/// One attempt of a request gives up after this long.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(20);
/// A request, with its retries, gives up after this long.
pub const RETRY_TIME_LIMIT: Duration = Duration::from_secs(60);
/// Attempts per request (transient errors only, as AIP-194: `UNAVAILABLE`).
pub const MAX_ATTEMPTS: u32 = 3;
/// The first wait before polling an operation again; it doubles up to [`POLL_MAX`].
pub const POLL_INITIAL: Duration = Duration::from_millis(200);
/// The longest wait between two polls of an operation.
pub const POLL_MAX: Duration = Duration::from_secs(2);

/// The clients the provider uses.
#[derive(Debug, Clone)]
pub struct Clients {
    /// `instances`.
    pub instances: Instances,
    /// `routes`.
    pub routes: Routes,
    /// `targetPools`.
    pub target_pools: TargetPools,
    /// `forwardingRules`.
    pub forwarding_rules: ForwardingRules,
    /// `firewalls`.
    pub firewalls: Firewalls,
    /// `httpHealthChecks`.
    pub http_health_checks: HttpHealthChecks,
    /// `addresses`.
    pub addresses: Addresses,
    /// `healthChecks` (global).
    pub health_checks: HealthChecks,
    /// `regionBackendServices`.
    pub backend_services: RegionBackendServices,
    /// `instanceGroups` (unmanaged).
    pub instance_groups: InstanceGroups,
    /// `subnetworks` (read only).
    pub subnetworks: Subnetworks,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client builder with the provider's endpoint, credentials and policies.
macro_rules! configured {
    ($client:ty, $config:expr, $credentials:expr) => {{
        let mut builder = <$client>::builder()
            .with_credentials($credentials.clone())
            .with_retry_policy(
                Aip194Strict
                    .with_attempt_limit(MAX_ATTEMPTS)
                    .with_time_limit(RETRY_TIME_LIMIT),
            )
            .with_attempt_timeout(ATTEMPT_TIMEOUT)
            .with_polling_backoff_policy(
                ExponentialBackoffBuilder::new()
                    .with_initial_delay(POLL_INITIAL)
                    .with_maximum_delay(POLL_MAX)
                    .build()?,
            );
        if let Some(endpoint) = $config.endpoint() {
            builder = builder.with_endpoint(endpoint);
        }
        builder.build().await?
    }};
}

impl Clients {
    /// Builds the clients for `config`.
    pub async fn new(config: &CloudConfig) -> Result<Clients, BoxError> {
        // The clients' TLS (rustls without a provider of its own) uses the process's: ring, as kube's.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let credentials: Credentials = if config.anonymous() {
            credentials::anonymous::Builder::new().build()
        } else {
            credentials::Builder::default()
                .build()
                .map_err(|e| format!("Application Default Credentials: {e}"))?
        };
        Ok(Clients {
            instances: configured!(Instances, config, credentials),
            routes: configured!(Routes, config, credentials),
            target_pools: configured!(TargetPools, config, credentials),
            forwarding_rules: configured!(ForwardingRules, config, credentials),
            firewalls: configured!(Firewalls, config, credentials),
            http_health_checks: configured!(HttpHealthChecks, config, credentials),
            addresses: configured!(Addresses, config, credentials),
            health_checks: configured!(HealthChecks, config, credentials),
            backend_services: configured!(RegionBackendServices, config, credentials),
            instance_groups: configured!(InstanceGroups, config, credentials),
            subnetworks: configured!(Subnetworks, config, credentials),
        })
    }
}

/// A request naming the cloud call it is part of ([`kube_ccm_provider::CallContext::current`]) in its
/// `User-Agent`; unchanged outside a call, or for a caller that is not a valid header value.
pub(crate) trait Attributed: RequestOptionsBuilder + Sized {
    /// This request, with the caller's `User-Agent`.
    fn attributed(self) -> Self {
        let cx = kube_ccm_provider::CallContext::current();
        match cx
            .as_ref()
            .and_then(kube_ccm_provider::CallContext::caller_header)
        {
            Some(caller) => self.with_user_agent(caller),
            None => self,
        }
    }
}

impl<B: RequestOptionsBuilder> Attributed for B {}

/// Waits for the calling controller's turn of the process's budget to send one request
/// ([`kube_ccm_provider::CallContext::acquire`]); at once outside a call. A listing takes one before each
/// request it sends (each page, each group of names), so a call of several requests is counted as
/// several; a write (its operation's polls included) is one turn, taken by the trait method.
pub(crate) async fn turn() -> Result<(), kube_ccm_provider::CloudError> {
    match kube_ccm_provider::CallContext::current() {
        Some(cx) => cx.acquire().await,
        None => Ok(()),
    }
}
