//! The SDK clients: credentials and region from the standard chains (environment, profile, web identity,
//! ECS, instance metadata), `RoleARN` assumed through STS, endpoints from `AWS_ENDPOINT_URL*` or the
//! cloud-config's `[ServiceOverride]`, explicit timeouts, and one HTTP/TLS stack (rustls on ring). The
//! EC2 and ELB clients send through the fenced connector (`connector.rs`); the credential chain's
//! own requests (STS, instance metadata) use the SDK's pooled client.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_ec2::config::interceptors::{
    BeforeTransmitInterceptorContextMut, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_http_client::tls;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::orchestrator::Metadata;

use crate::config::CloudConfig;
use crate::connector::FencedHttpClient;

/// Connecting gives up after this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One attempt of a request gives up after this long (the framework's call deadline may be shorter).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(20);
/// A request, with its retries, gives up after this long.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts per request (the SDK's standard retry mode: throttling and transient errors back off).
pub const MAX_ATTEMPTS: u32 = 3;

/// AWS requests sent, by `service:Operation` (every attempt counts: it is what the account's rate limit
/// sees).
#[derive(Debug, Default)]
pub struct RequestCounter {
    counts: Mutex<BTreeMap<String, u64>>,
}

impl RequestCounter {
    /// The counts so far.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts.lock().clone()
    }

    /// The sum of the counts.
    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }
}

/// The SDK interceptor that feeds a [`RequestCounter`].
#[derive(Debug, Clone)]
pub(crate) struct Counting(pub(crate) Arc<RequestCounter>);

impl Intercept for Counting {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let name = cfg.load::<Metadata>().map_or_else(
            || "unknown".to_owned(),
            |m| format!("{}:{}", m.service(), m.name()),
        );
        *self.0.counts.lock().entry(name).or_default() += 1;
        Ok(())
    }
}

/// The SDK interceptor that names the caller in each request: the `User-Agent` gets the calling
/// controller's own (`<component>/<version> (<os>/<arch>) <identity>/<controller>`, the one its Kubernetes
/// requests carry) appended, so CloudTrail's `userAgent` says which replica and controller made a change.
/// The header is not signed (SigV4 leaves `User-Agent` out), so it may change after signing.
#[derive(Debug, Clone)]
pub(crate) struct Attribution;

impl Intercept for Attribution {
    fn name(&self) -> &'static str {
        "CallerAttribution"
    }

    fn modify_before_transmit(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let cx = kube_ccm_provider::CallContext::current();
        let Some(caller) = cx
            .as_ref()
            .and_then(kube_ccm_provider::CallContext::caller_header)
        else {
            return Ok(());
        };
        let headers = context.request_mut().headers_mut();
        let agent = match headers.get("user-agent") {
            Some(sdk) => format!("{sdk} {caller}"),
            None => caller.to_owned(),
        };
        headers.insert("user-agent", agent);
        Ok(())
    }
}

/// The shared SDK configuration for `config`: its region (else the SDK's chain), credentials (the SDK's
/// chain, then `RoleARN` assumed), timeouts and retries.
pub async fn sdk_config(config: &CloudConfig) -> Result<SdkConfig, String> {
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(http)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                .operation_timeout(OPERATION_TIMEOUT)
                .build(),
        )
        .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS));
    let region = config.region();
    if !region.is_empty() {
        loader = loader.region(Region::new(region));
    }
    let base = loader.load().await;
    if base.region().is_none() {
        return Err(
            "cannot tell the AWS region: set Region (or Zone) in the cloud-config's [Global], or AWS_REGION"
                .into(),
        );
    }
    if config.role_arn.is_empty() {
        return Ok(base);
    }
    let mut assume = aws_config::sts::AssumeRoleProvider::builder(&config.role_arn)
        .session_name("cloud-controller-manager")
        .configure(&base);
    if !config.source_arn.is_empty() {
        tracing::warn!(
            "SourceARN is not passed to STS by this provider; the role's trust policy must not require it"
        );
    }
    assume = assume.region(base.region().cloned().expect("checked above"));
    let credentials = assume.build().await;
    Ok(base
        .into_builder()
        .credentials_provider(aws_credential_types::provider::SharedCredentialsProvider::new(
            credentials,
        ))
        .build())
}

/// An EC2 client on `sdk`, with the cloud-config's endpoint override for its region, `counter`, and the
/// fenced HTTP client `http`.
pub(crate) fn ec2(
    sdk: &SdkConfig,
    config: &CloudConfig,
    counter: &Arc<RequestCounter>,
    http: &FencedHttpClient,
) -> aws_sdk_ec2::Client {
    let mut builder = aws_sdk_ec2::config::Builder::from(sdk)
        .http_client(http.clone())
        .interceptor(Counting(counter.clone()))
        .interceptor(Attribution);
    let region = sdk.region().map(|r| r.as_ref().to_owned()).unwrap_or_default();
    if let Some(endpoint) = config.service_override("ec2", &region) {
        builder = builder.endpoint_url(&endpoint.url);
        if endpoint.signing_region != region {
            tracing::warn!(signing_region = %endpoint.signing_region, "[ServiceOverride] SigningRegion differs from Region: requests are signed for Region");
        }
    }
    aws_sdk_ec2::Client::from_conf(builder.build())
}

/// A classic ELB client on `sdk`, with the cloud-config's endpoint override (`elb` or
/// `elasticloadbalancing`), `counter`, and the fenced HTTP client `http`.
pub(crate) fn elb(
    sdk: &SdkConfig,
    config: &CloudConfig,
    counter: &Arc<RequestCounter>,
    http: &FencedHttpClient,
) -> aws_sdk_elasticloadbalancing::Client {
    let mut builder = aws_sdk_elasticloadbalancing::config::Builder::from(sdk)
        .http_client(http.clone())
        .interceptor(Counting(counter.clone()))
        .interceptor(Attribution);
    let region = sdk.region().map(|r| r.as_ref().to_owned()).unwrap_or_default();
    if let Some(endpoint) = config.service_override("elb", &region) {
        builder = builder.endpoint_url(&endpoint.url);
    }
    aws_sdk_elasticloadbalancing::Client::from_conf(builder.build())
}

/// An ELBv2 (NLB) client on `sdk`, with the cloud-config's endpoint override (`elbv2` or
/// `elasticloadbalancingv2`), `counter`, and the fenced HTTP client `http`.
pub(crate) fn elbv2(
    sdk: &SdkConfig,
    config: &CloudConfig,
    counter: &Arc<RequestCounter>,
    http: &FencedHttpClient,
) -> aws_sdk_elasticloadbalancingv2::Client {
    let mut builder = aws_sdk_elasticloadbalancingv2::config::Builder::from(sdk)
        .http_client(http.clone())
        .interceptor(Counting(counter.clone()))
        .interceptor(Attribution);
    let region = sdk.region().map(|r| r.as_ref().to_owned()).unwrap_or_default();
    if let Some(endpoint) = config.service_override("elbv2", &region) {
        builder = builder.endpoint_url(&endpoint.url);
    }
    aws_sdk_elasticloadbalancingv2::Client::from_conf(builder.build())
}
