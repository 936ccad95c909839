//! What a cloud call can fail with.

use std::time::Duration;

/// An error from a cloud provider.
#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    /// The provider does not implement this call; callers fall back where upstream does.
    #[error("unimplemented")]
    NotImplemented,
    /// The instance does not exist (not for stopped instances).
    #[error("instance not found")]
    InstanceNotFound,
    /// Something other than this provider implements it (for example another controller owns the load
    /// balancer); the caller treats the call as done. `EnsureLoadBalancerDeleted` must not return it.
    #[error("implemented by alternate to cloud provider")]
    ImplementedElsewhere,
    /// Try again after exactly this long, instead of backing off exponentially.
    #[error("retry after {after:?}: {message}")]
    Retry {
        /// When to try again.
        after: Duration,
        /// Why.
        message: String,
    },
    /// The call did not finish before its deadline (the framework abandoned it).
    #[error("the cloud call did not finish before its deadline")]
    Timeout,
    /// The caller gave up (its controller is stopping).
    #[error("the cloud call was cancelled")]
    Cancelled,
    /// The provider's own failure.
    #[error(transparent)]
    Provider(Box<dyn std::error::Error + Send + Sync>),
}

impl CloudError {
    /// Wraps a provider-specific error.
    pub fn provider(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> CloudError {
        CloudError::Provider(error.into())
    }
}
