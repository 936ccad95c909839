//! The cloud's families, named after the provider, and the process's cloud budget as metrics.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kube_ccm_provider::{CallObserver, CloudError, Priority, RateBudget};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// `{request}`: a cloud API request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CloudLabels {
    pub(crate) request: String,
}

/// `{request, error}`: a failed cloud API request and how it failed (`throttled`, `timeout`, `cancelled`,
/// `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CloudErrorLabels {
    pub(crate) request: String,
    pub(crate) error: String,
}

/// How a cloud request failed, for `cloudprovider_<provider>_api_request_errors_total{error}`; `None` for
/// the answers that are not failures (an instance that does not exist, a feature the provider lacks, a load
/// balancer implemented elsewhere).
pub(crate) fn error_kind(error: &CloudError) -> Option<&'static str> {
    match error {
        CloudError::InstanceNotFound | CloudError::NotImplemented | CloudError::ImplementedElsewhere => None,
        CloudError::Throttled { .. } => Some("throttled"),
        CloudError::Retry { .. } => Some("retry"),
        CloudError::Timeout => Some("timeout"),
        CloudError::Cancelled => Some("cancelled"),
        // A kind added later counts as a failure until it is sorted here.
        _ => Some("error"),
    }
}

/// A batch call's outcome: its first failure, if any answer failed (see [`error_kind`]).
pub(crate) fn batch_outcome<T>(answers: &[Result<T, CloudError>]) -> Result<(), &CloudError> {
    match answers
        .iter()
        .filter_map(|answer| answer.as_ref().err())
        .find(|error| error_kind(error).is_some())
    {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// The cloud families, named after the provider (`cloudprovider_aws_api_request_duration_seconds`, as the
/// in-tree providers name theirs): every call of the framework to the provider, under the trait method's
/// name, and every request a provider reports with `CallContext::observe`.
pub(crate) struct CloudMetrics {
    pub(super) provider: OnceLock<String>,
    /// The process's budget for the cloud's API, shared by every call context the controllers make.
    pub(super) budget: OnceLock<Arc<RateBudget>>,
    duration: Family<CloudLabels, Histogram>,
    errors: Family<CloudErrorLabels, Counter>,
}

impl Default for CloudMetrics {
    fn default() -> Self {
        CloudMetrics {
            provider: OnceLock::new(),
            budget: OnceLock::new(),
            duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16))),
            errors: Family::default(),
        }
    }
}

impl std::fmt::Debug for CloudMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudMetrics")
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl CloudMetrics {
    /// The process's cloud budget, once the manager made it.
    pub(crate) fn budget(&self) -> Option<Arc<RateBudget>> {
        self.budget.get().cloned()
    }
}

impl CallObserver for CloudMetrics {
    fn observe(&self, request: &str, elapsed: Duration, outcome: Result<(), &CloudError>) {
        let labels = CloudLabels {
            request: request.to_owned(),
        };
        self.duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        if let Some(error) = outcome.err().and_then(error_kind) {
            self.errors
                .get_or_create(&CloudErrorLabels {
                    request: labels.request,
                    error: error.to_owned(),
                })
                .inc();
        }
    }
}

/// Encodes [`CloudMetrics`] under the provider's name, once it is known.
#[derive(Debug)]
pub(super) struct CloudCollector(pub(super) Arc<CloudMetrics>);

impl Collector for CloudCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(provider) = self.0.provider.get() else {
            return Ok(());
        };
        let duration = &self.0.duration;
        duration.encode(encoder.encode_descriptor(
            &format!("cloudprovider_{provider}_api_request_duration_seconds"),
            "Latency of a cloud API request, by request (the framework's calls by trait method, the provider's own requests as its API names them)",
            None,
            duration.metric_type(),
        )?)?;
        let errors = &self.0.errors;
        errors.encode(encoder.encode_descriptor(
            &format!("cloudprovider_{provider}_api_request_errors"),
            "Failed cloud API requests, by request and how they failed: throttled (the cloud's rate limit), retry (asked to try later), timeout, cancelled or error",
            None,
            errors.metric_type(),
        )?)?;
        if let Some(budget) = self.0.budget.get() {
            encode_budget(&mut encoder, provider, budget)?;
        }
        Ok(())
    }
}

/// The budget's families: tokens granted and time waited by priority, pauses for throttling.
fn encode_budget(
    encoder: &mut DescriptorEncoder<'_>,
    provider: &str,
    budget: &RateBudget,
) -> Result<(), std::fmt::Error> {
    let stats = budget.stats();
    let granted = Family::<PriorityLabels, Counter>::default();
    let waited = Family::<PriorityLabels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
    for (i, priority) in Priority::ALL.iter().enumerate() {
        let labels = PriorityLabels {
            priority: priority.as_str().to_owned(),
        };
        granted.get_or_create(&labels).inc_by(stats.granted[i]);
        waited
            .get_or_create(&labels)
            .inc_by(stats.waited[i].as_secs_f64());
    }
    granted.encode(encoder.encode_descriptor(
        &format!("cloudprovider_{provider}_api_budget_requests"),
        "Cloud API requests let through by the process's budget, by priority (initialise, reconcile, refresh)",
        None,
        granted.metric_type(),
    )?)?;
    waited.encode(encoder.encode_descriptor(
        &format!("cloudprovider_{provider}_api_budget_wait_seconds"),
        "Time cloud API requests waited for the process's budget (--cloud-api-qps, --cloud-api-burst), by priority",
        None,
        waited.metric_type(),
    )?)?;
    let pauses = Counter::<u64>::default();
    pauses.inc_by(stats.pauses);
    pauses.encode(encoder.encode_descriptor(
        &format!("cloudprovider_{provider}_api_budget_pauses"),
        "Times the cloud throttled a request and every request of the process paused for its retry delay",
        None,
        pauses.metric_type(),
    )?)?;
    Ok(())
}

/// A family's label: the budget's priority.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PriorityLabels {
    priority: String,
}
